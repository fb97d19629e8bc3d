// Tests of the load reports: the JSON object (parsed back with nlohmann-json,
// field by field, since bench/ and tests/ read these names), the CSV row
// against its header, the text report and the progress line.
#include "client/load/report.h"

#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"

namespace softmax::client {
namespace {

LoadReport SampleReport() {
  LoadReport report;
  report.options.label = "cpu, \"fast\"";
  report.options.target = "127.0.0.1:5";
  report.options.connections = 2;
  report.options.concurrency = 16;
  report.options.duration = absl::Seconds(2);
  report.options.warmup = absl::Milliseconds(500);
  report.options.shapes = {LoadShape{{1, 1024}}, LoadShape{{8, 4096}, v1::DTYPE_FLOAT16, 2}};
  report.mode = "closed";
  report.requests = 10;
  report.ok = 9;
  report.errors = 1;
  report.errors_by_code[14] = 1;
  report.warmup_requests = 3;
  report.elapsed_seconds = 2.0;
  report.requests_per_second = 5.0;
  report.rows = 90;
  report.rows_per_second = 45.0;
  report.payload_bytes = 123456;
  report.payload_gb_per_second = 6.1728e-05;
  report.latency.count = 9;
  report.latency.min = 1000;
  report.latency.p50 = 1500;
  report.latency.p90 = 2000;
  report.latency.p99 = 2500;
  report.latency.p999 = 2600;
  report.latency.max = 3000;
  report.latency.mean = 1700.0;
  report.mean_batch_requests = 1.5;
  report.mean_queue_us = 12.5;
  return report;
}

// Splits one CSV line, honouring quotes ("" inside quotes is one quote).
std::vector<std::string> CsvFields(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '\n' && !quoted) break;
    if (c == '"') {
      if (quoted && i + 1 < line.size() && line[i + 1] == '"') {
        fields.back() += '"';
        ++i;
      } else {
        quoted = !quoted;
      }
    } else if (c == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  return fields;
}

TEST(LoadReportJsonTest, HasEveryFieldTheBenchmarksRead) {
  const nlohmann::json json = nlohmann::json::parse(LoadReportJson(SampleReport()));
  EXPECT_EQ(json["label"], "cpu, \"fast\"");
  EXPECT_EQ(json["target"], "127.0.0.1:5");
  EXPECT_EQ(json["mode"], "closed");
  EXPECT_EQ(json["stream"], false);
  EXPECT_EQ(json["protocol"], "softmax.v1");
  EXPECT_EQ(json["connections"], 2);
  EXPECT_EQ(json["concurrency"], 16);
  EXPECT_EQ(json["arrival"], "constant");
  EXPECT_EQ(json["duration_s"], 2.0);
  EXPECT_EQ(json["warmup_s"], 0.5);
  EXPECT_EQ(json["shapes"], nlohmann::json({"1x1024:float32:1", "8x4096:float16:2"}));
  EXPECT_EQ(json["requests"], 10);
  EXPECT_EQ(json["ok"], 9);
  EXPECT_EQ(json["errors"], 1);
  EXPECT_EQ(json["errors_by_code"], nlohmann::json({{"UNAVAILABLE", 1}}));
  EXPECT_EQ(json["warmup_requests"], 3);
  EXPECT_EQ(json["warmup_errors"], 0);
  EXPECT_EQ(json["verified"], 0);
  EXPECT_EQ(json["mismatches"], 0);
  EXPECT_EQ(json["first_mismatch"], "");
  EXPECT_EQ(json["stream_reopens"], 0);
  EXPECT_EQ(json["resent_requests"], 0);
  EXPECT_EQ(json["streams_lost"], 0);
  EXPECT_EQ(json["resent_after_loss"], 0);
  EXPECT_EQ(json["ended_early"], "");
  EXPECT_EQ(json["elapsed_s"], 2.0);
  EXPECT_EQ(json["requests_per_s"], 5.0);
  EXPECT_EQ(json["rows"], 90);
  EXPECT_EQ(json["rows_per_s"], 45.0);
  EXPECT_EQ(json["payload_bytes"], 123456);
  EXPECT_DOUBLE_EQ(json["payload_gb_per_s"].get<double>(), 6.1728e-05);
  const nlohmann::json& latency = json["latency_us"];
  EXPECT_EQ(latency["count"], 9);
  EXPECT_EQ(latency["min"], 1.0);
  EXPECT_EQ(latency["mean"], 1.7);
  EXPECT_EQ(latency["p50"], 1.5);
  EXPECT_EQ(latency["p90"], 2.0);
  EXPECT_EQ(latency["p99"], 2.5);
  EXPECT_EQ(latency["p99.9"], 2.6);
  EXPECT_EQ(latency["max"], 3.0);
  const nlohmann::json& batch = json["batch"];
  EXPECT_EQ(batch["mean_requests"], 1.5);
  EXPECT_EQ(batch["mean_rows"], 0.0);
  EXPECT_EQ(batch["mean_queue_us"], 12.5);
  for (const char* key : {"mean_compute_us", "mean_kernel_us", "mean_dispatch_us"}) {
    EXPECT_TRUE(batch.contains(key)) << key;
  }
  EXPECT_EQ(json.size(), 35u) << json.dump();
}

TEST(LoadReportJsonTest, OpenLoopAndUnlimitedDurationAndOddText) {
  LoadReport report = SampleReport();
  report.mode = "open";
  report.offered_rate = 300;
  report.options.arrival = Arrival::kPoisson;
  report.options.duration = absl::InfiniteDuration();
  report.first_mismatch = "bad \xff byte\n";
  report.requests_per_second = std::numeric_limits<double>::infinity();
  const nlohmann::json json = nlohmann::json::parse(LoadReportJson(report));
  EXPECT_EQ(json["concurrency"], 0);
  EXPECT_EQ(json["offered_rate"], 300.0);
  EXPECT_EQ(json["arrival"], "poisson");
  EXPECT_EQ(json["duration_s"], 0.0);
  EXPECT_TRUE(json["requests_per_s"].is_null());
  EXPECT_EQ(json["first_mismatch"], "bad \xef\xbf\xbd byte\n");
}

TEST(LoadReportCsvTest, RowMatchesHeaderColumnByColumn) {
  const std::vector<std::string> header = CsvFields(LoadReportCsvHeader());
  const std::vector<std::string> row = CsvFields(LoadReportCsvRow(SampleReport()));
  ASSERT_EQ(header.size(), row.size());
  const auto column = [&](const std::string& name) {
    for (size_t i = 0; i < header.size(); ++i) {
      if (header[i] == name) return row[i];
    }
    ADD_FAILURE() << "no column " << name;
    return std::string();
  };
  EXPECT_EQ(column("label"), "cpu, \"fast\"");
  EXPECT_EQ(column("mode"), "closed");
  EXPECT_EQ(column("stream"), "0");
  EXPECT_EQ(column("concurrency"), "16");
  EXPECT_EQ(column("shapes"), "1x1024:float32:1;8x4096:float16:2");
  EXPECT_EQ(column("requests"), "10");
  EXPECT_EQ(column("errors"), "1");
  EXPECT_EQ(column("requests_per_s"), "5");
  EXPECT_EQ(column("p50_us"), "1.5");
  EXPECT_EQ(column("p999_us"), "2.6");
  EXPECT_EQ(column("mean_batch_requests"), "1.5");
}

TEST(LoadReportFileTest, JsonReplacesAndCsvAppendsWithOneHeader) {
  const std::string json_path = ::testing::TempDir() + "/load_report.json";
  const std::string csv_path = ::testing::TempDir() + "/load_report.csv";
  std::remove(csv_path.c_str());
  {
    std::ofstream stale(json_path);
    stale << "stale text that is longer than nothing";
  }
  ASSERT_TRUE(WriteLoadReportJson(json_path, SampleReport()).ok());
  std::ifstream json_file(json_path);
  EXPECT_EQ(nlohmann::json::parse(json_file)["requests"], 10);

  LoadReport second = SampleReport();
  second.options.label = "gpu";
  ASSERT_TRUE(AppendLoadReportCsv(csv_path, SampleReport()).ok());
  ASSERT_TRUE(AppendLoadReportCsv(csv_path, second).ok());
  std::ifstream csv_file(csv_path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv_file, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0] + "\n", LoadReportCsvHeader());
  EXPECT_EQ(CsvFields(lines[2])[0], "gpu");

  EXPECT_EQ(WriteLoadReportJson("/nonexistent-dir/r.json", SampleReport()).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(AppendLoadReportCsv("/nonexistent-dir/r.csv", SampleReport()).code(),
            absl::StatusCode::kInternal);
}

TEST(LoadReportTextTest, PrintsTheFiguresAndTheErrorCodes) {
  const std::string text = FormatLoadReport(SampleReport());
  EXPECT_NE(text.find("closed loop, concurrency 16 over 2 connection(s)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("payloads:     1x1024:float32:1 8x4096:float16:2"), std::string::npos)
      << text;
  EXPECT_NE(text.find("  UNAVAILABLE: 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("p90 0.002"), std::string::npos) << text;
  EXPECT_NE(text.find("max 0.003"), std::string::npos) << text;
  EXPECT_EQ(text.find("verify:"), std::string::npos) << text;
  EXPECT_EQ(text.find("streams:"), std::string::npos) << text;
  EXPECT_EQ(text.find("ended early:"), std::string::npos) << text;
}

TEST(LoadReportTextTest, StreamReopensAndAnEarlyEndAreShown) {
  LoadReport report = SampleReport();
  report.options.stream = true;
  report.options.protocol = LoadProtocol::kKserve;
  report.stream_reopens = 4;
  report.resent_requests = 17;
  report.ended_early = "the stream on connection 1 got no answer";
  const std::string text = FormatLoadReport(report);
  EXPECT_NE(text.find("(kserve ModelStreamInfer, stream)"), std::string::npos) << text;
  EXPECT_NE(text.find("streams:      4 reopened, 17 request(s) resent\n"), std::string::npos)
      << text;
  report.streams_lost = 1;
  report.resent_after_loss = 3;
  EXPECT_NE(FormatLoadReport(report).find(
                "streams:      4 reopened, 17 request(s) resent; 1 lost by the transport, 3 "
                "request(s) resent after that (some may have been computed twice)\n"),
            std::string::npos)
      << FormatLoadReport(report);
  EXPECT_NE(text.find("ended early:  the stream on connection 1 got no answer\n"),
            std::string::npos)
      << text;
  const nlohmann::json json = nlohmann::json::parse(LoadReportJson(report));
  EXPECT_EQ(json["stream_reopens"], 4);
  EXPECT_EQ(json["resent_requests"], 17);
  EXPECT_EQ(json["streams_lost"], 1);
  EXPECT_EQ(json["resent_after_loss"], 3);
  EXPECT_EQ(json["ended_early"], "the stream on connection 1 got no answer");
}

TEST(LoadReportTextTest, ProgressLineShowsThePhase) {
  LoadProgress progress;
  progress.elapsed_seconds = 1.25;
  progress.requests_per_second = 1234;
  progress.p50_ns = 2500000;
  progress.p99_ns = 7000000;
  progress.errors = 3;
  std::string line = FormatLoadProgress(progress);
  EXPECT_NE(line.find("warm-up"), std::string::npos) << line;
  EXPECT_NE(line.find("1234 req/s"), std::string::npos) << line;
  EXPECT_NE(line.find("p99     7.000 ms"), std::string::npos) << line;
  EXPECT_NE(line.find("errors 3"), std::string::npos) << line;
  progress.measuring = true;
  line = FormatLoadProgress(progress);
  EXPECT_NE(line.find("measuring"), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
}

TEST(GrpcStatusCodeNameTest, NamesEveryCode) {
  EXPECT_STREQ(GrpcStatusCodeName(0), "OK");
  EXPECT_STREQ(GrpcStatusCodeName(4), "DEADLINE_EXCEEDED");
  EXPECT_STREQ(GrpcStatusCodeName(16), "UNAUTHENTICATED");
  EXPECT_STREQ(GrpcStatusCodeName(17), "UNKNOWN");
  EXPECT_STREQ(GrpcStatusCodeName(-1), "UNKNOWN");
}

}  // namespace
}  // namespace softmax::client
