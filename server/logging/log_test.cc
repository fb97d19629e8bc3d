#include "server/logging/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace softmax::server::logging {
namespace {

// Everything written to stderr while it lives, as lines.
class CapturedStderr {
 public:
  CapturedStderr() {
    std::fflush(stderr);
    saved_ = dup(STDERR_FILENO);
    path_ = ::testing::TempDir() + "log_test_stderr_XXXXXX";
    const int fd = mkstemp(path_.data());
    dup2(fd, STDERR_FILENO);
    close(fd);
  }
  ~CapturedStderr() { Restore(); }

  std::vector<std::string> Lines() {
    Restore();
    std::ifstream in(path_);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

 private:
  void Restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, STDERR_FILENO);
    close(saved_);
    saved_ = -1;
  }
  int saved_ = -1;
  std::string path_;
};

nlohmann::json ParsePayload(const std::string& payload) {
  return nlohmann::json::parse("{" + payload + "}");
}

TEST(LogTest, ParsesTheFormats) {
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  for (const char* bad : {"", "JSON", "logfmt"}) {
    absl::StatusOr<LogFormat> format = ParseLogFormat(bad);
    ASSERT_FALSE(format.ok()) << bad;
    EXPECT_EQ(format.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(format.status().message().find("--log_format"), absl::string_view::npos);
  }
  LogOptions negative;
  negative.access_log_one_in = -1;
  EXPECT_EQ(ConfigureLogging(negative).code(), absl::StatusCode::kInvalidArgument);
}

TEST(LogTest, TextIsMessageThenKeyValuesQuotedWhereNeeded) {
  EXPECT_EQ(RenderPayload(LogFormat::kText, "listening",
                          {{"grpc", "0.0.0.0:50051"}, {"port", 8000}, {"tls", false}}),
            "listening grpc=0.0.0.0:50051 port=8000 tls=false");
  EXPECT_EQ(RenderPayload(LogFormat::kText, "x", {{"cause", "a \"b\" c=d"}, {"empty", ""}}),
            "x cause=\"a \\\"b\\\" c=d\" empty=\"\"");
  // A record is one line, whatever its message holds.
  EXPECT_EQ(RenderPayload(LogFormat::kText, "two\nlines", {}), "two lines");
  EXPECT_EQ(RenderPayload(LogFormat::kText, "", {{"method", "Softmax"}}), "method=Softmax");
}

TEST(LogTest, JsonMembersKeepTheirTypesAndEscapes) {
  const std::string payload = RenderPayload(
      LogFormat::kJson, "a \"quoted\"\nmessage\t\x01",
      {{"bytes", int64_t{1} << 40}, {"latency_ms", 0.25}, {"peer", "ipv4:127.0.0.1:5"},
       {"ok", true}, {"inf", 1.0 / 0.0}});
  const nlohmann::json object = ParsePayload(payload);
  EXPECT_EQ(object["msg"], "a \"quoted\"\nmessage\t\x01");
  EXPECT_EQ(object["bytes"], int64_t{1} << 40);
  EXPECT_DOUBLE_EQ(object["latency_ms"].get<double>(), 0.25);
  EXPECT_EQ(object["peer"], "ipv4:127.0.0.1:5");
  EXPECT_EQ(object["ok"], true);
  EXPECT_EQ(object["inf"], "inf");  // JSON has no infinity
  EXPECT_EQ(payload.find('\n'), std::string::npos);
  EXPECT_FALSE(ParsePayload(RenderPayload(LogFormat::kJson, "", {{"k", 1}})).contains("msg"));
}

TEST(LogTest, LinesCarryTimestampLevelAndSource) {
  std::vector<std::string> lines;
  {
    CapturedStderr captured;
    ASSERT_TRUE(ConfigureLogging({LogFormat::kText, 0}).ok());
    LogInfo("listening", {{"grpc", "127.0.0.1:1"}});
    LogWarning("careful");
    ASSERT_TRUE(ConfigureLogging({LogFormat::kJson, 0}).ok());
    LogError("broken", {{"cause", "x"}});
    lines = captured.Lines();
  }
  ASSERT_EQ(lines.size(), 3u);
  const std::string stamp = R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)";
  EXPECT_TRUE(std::regex_match(lines[0],
                               std::regex(stamp + " I softmax-server: listening grpc=127.0.0.1:1")))
      << lines[0];
  EXPECT_TRUE(std::regex_match(lines[1], std::regex(stamp + " W softmax-server: careful")))
      << lines[1];
  const nlohmann::json error = nlohmann::json::parse(lines[2]);
  EXPECT_EQ(error["level"], "error");
  EXPECT_EQ(error["logger"], "softmax-server");
  EXPECT_EQ(error["msg"], "broken");
  EXPECT_EQ(error["cause"], "x");
  EXPECT_TRUE(std::regex_match(error["time"].get<std::string>(), std::regex(stamp)));
}

TEST(LogTest, AccessLogWritesOneRequestInNAndAsksThePeerOnlyThen) {
  int peers_asked = 0;
  auto peer = [&] {
    ++peers_asked;
    return std::string("ipv4:10.0.0.1:4242");
  };
  std::vector<std::string> lines;
  {
    CapturedStderr captured;
    ASSERT_TRUE(ConfigureLogging({LogFormat::kJson, 0}).ok());
    EXPECT_FALSE(AccessLogEnabled());
    LogAccess("Softmax", absl::StatusCode::kOk, 64, 0.001, peer);
    EXPECT_EQ(peers_asked, 0);
    ASSERT_TRUE(ConfigureLogging({LogFormat::kJson, 3}).ok());
    EXPECT_TRUE(AccessLogEnabled());
    for (int i = 0; i < 9; ++i) {
      LogAccess("ModelInfer", absl::StatusCode::kInvalidArgument, 2048, 0.0025, peer);
    }
    lines = captured.Lines();
  }
  ASSERT_TRUE(ConfigureLogging({LogFormat::kText, 0}).ok());
  EXPECT_EQ(peers_asked, 3);
  ASSERT_EQ(lines.size(), 3u);
  const nlohmann::json line = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(line["logger"], "access");
  EXPECT_EQ(line["level"], "info");
  EXPECT_EQ(line["method"], "ModelInfer");
  EXPECT_EQ(line["code"], "INVALID_ARGUMENT");
  EXPECT_EQ(line["bytes"], 2048);
  EXPECT_DOUBLE_EQ(line["latency_ms"].get<double>(), 2.5);
  EXPECT_EQ(line["peer"], "ipv4:10.0.0.1:4242");
  EXPECT_FALSE(line.contains("msg"));
}

}  // namespace
}  // namespace softmax::server::logging
