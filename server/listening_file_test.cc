#include "server/listening_file.h"

#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace softmax::server {
namespace {

std::string Read(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

ListeningInfo Info() {
  ListeningInfo info;
  info.grpc = "127.0.0.1:41251";
  info.http = "off";
  info.metrics = "[::1]:9464";
  info.pid = 4321;
  info.version = "0.1.0";
  info.revision = "a\"b\\c\n";
  return info;
}

TEST(ListeningFileTest, JsonNamesEveryFieldAndEscapesStrings) {
  EXPECT_EQ(ListeningJson(Info()),
            "{\"grpc\": \"127.0.0.1:41251\", \"http\": \"off\", \"metrics\": \"[::1]:9464\", "
            "\"pid\": 4321, \"version\": \"0.1.0\", \"revision\": \"a\\\"b\\\\c\\u000a\"}\n");
}

TEST(ListeningFileTest, ReplacesThePathWholeAndLeavesNoTemporaryFile) {
  const std::string path = ::testing::TempDir() + "/listening_file_test.json";
  { std::ofstream(path) << "an older server's, much longer than the new one's text"; }
  ASSERT_TRUE(WriteListeningFile(path, Info()).ok());
  EXPECT_EQ(Read(path), ListeningJson(Info()));
  EXPECT_FALSE(std::ifstream(path + ".tmp.4321").good());
}

TEST(ListeningFileTest, AFolderThatDoesNotExistIsAnErrorNamingThePath) {
  const std::string path = ::testing::TempDir() + "/no/such/folder/listening.json";
  const absl::Status status = WriteListeningFile(path, Info());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find(path), absl::string_view::npos) << status;
}

}  // namespace
}  // namespace softmax::server
