// Tests of the load generator against an in-process SoftmaxService that
// computes with the CPU row routine (or echoes its input, to prove --verify
// catches wrong answers), plus argument parsing and report formats.
#include "client/load.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_split.h"
#include "client/tensor.h"
#include "gtest/gtest.h"
#include "kernels/cpu_softmax.h"
#include "softmax/v1/softmax.grpc.pb.h"

namespace softmax::client {
namespace {

// Answers like softmax-server with batches of one, or echoes the input.
class FakeSoftmaxService final : public v1::SoftmaxService::Service {
 public:
  explicit FakeSoftmaxService(bool echo) : echo_(echo) {}

  grpc::Status Softmax(grpc::ServerContext*, const v1::SoftmaxRequest* request,
                       v1::SoftmaxResponse* response) override {
    Answer(*request, response);
    return grpc::Status::OK;
  }

  grpc::Status SoftmaxStream(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::SoftmaxResponse, v1::SoftmaxRequest>* stream) override {
    v1::SoftmaxRequest request;
    while (stream->Read(&request)) {
      v1::SoftmaxResponse response;
      Answer(request, &response);
      if (!stream->Write(response)) break;
    }
    return grpc::Status::OK;
  }

  std::map<int, int> requests_by_dtype() {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_by_dtype_;
  }

 private:
  void Answer(const v1::SoftmaxRequest& request, v1::SoftmaxResponse* response) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++requests_by_dtype_[request.input().dtype()];
    }
    response->set_request_id(request.request_id());
    *response->mutable_output() = request.input();
    const SoftmaxShape view =
        *ShapeAlongAxis(ShapeOf(request.input()), request.has_axis() ? request.axis() : -1);
    if (!echo_) {
      SoftmaxOptions options;
      options.temperature = request.has_temperature() ? request.temperature() : 1.0f;
      options.log = request.log();
      CpuSoftmaxRows(request.input().data().data(), response->mutable_output()->mutable_data()->data(),
                     static_cast<DType>(request.input().dtype()), view, options, 0, view.rows());
    }
    response->mutable_timing()->set_batch_requests(1);
    response->mutable_timing()->set_batch_rows(view.rows());
  }

  const bool echo_;
  std::mutex mutex_;
  std::map<int, int> requests_by_dtype_;
};

class LoadTest : public ::testing::Test {
 protected:
  void StartServer(bool echo) {
    service_ = std::make_unique<FakeSoftmaxService>(echo);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.SetMaxReceiveMessageSize(64 << 20);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    target_ = "127.0.0.1:" + std::to_string(port);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  LoadOptions BaseOptions() {
    LoadOptions options;
    options.target = target_;
    options.progress = false;
    options.warmup = absl::ZeroDuration();
    options.shapes = {*ParseLoadShape("1x64:float32:1"), *ParseLoadShape("3x100:fp16:2"),
                      *ParseLoadShape("2x50:bf16:1")};
    options.verify = true;
    return options;
  }

  std::unique_ptr<FakeSoftmaxService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
};

void ExpectConsistent(const LoadReport& report) {
  int64_t errors = 0;
  for (int64_t n : report.errors_by_code) errors += n;
  EXPECT_EQ(report.errors, errors);
  EXPECT_EQ(report.requests, report.ok + report.errors);
  EXPECT_EQ(report.latency.count, static_cast<uint64_t>(report.ok));
  EXPECT_LE(report.latency.min, report.latency.p50);
  EXPECT_LE(report.latency.p50, report.latency.p90);
  EXPECT_LE(report.latency.p90, report.latency.p99);
  EXPECT_LE(report.latency.p99, report.latency.p999);
  EXPECT_LE(report.latency.p999, report.latency.max);
  if (report.ok > 0) {
    EXPECT_GT(report.latency.p50, 0);
    EXPECT_GT(report.elapsed_seconds, 0.0);
    EXPECT_NEAR(report.requests_per_second * report.elapsed_seconds,
                static_cast<double>(report.requests), 1e-6 * report.requests);
  }
}

TEST_F(LoadTest, ClosedLoopUnaryFollowsTheWeightsAndVerifies) {
  StartServer(/*echo=*/false);
  LoadOptions options = BaseOptions();
  options.concurrency = 8;
  options.connections = 2;
  options.requests = 400;
  options.duration = absl::InfiniteDuration();
  absl::StatusOr<LoadReport> report = RunLoad(options);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectConsistent(*report);
  EXPECT_EQ(report->requests, 400);
  EXPECT_EQ(report->ok, 400);
  EXPECT_EQ(report->verified, 400);
  EXPECT_EQ(report->mismatches, 0) << report->first_mismatch;
  // Weights 1:2:1 over the first 400 schedule entries, exactly.
  const std::map<int, int> seen = service_->requests_by_dtype();
  EXPECT_EQ(seen.at(v1::DTYPE_FLOAT32), 100);
  EXPECT_EQ(seen.at(v1::DTYPE_FLOAT16), 200);
  EXPECT_EQ(seen.at(v1::DTYPE_BFLOAT16), 100);
  EXPECT_EQ(report->rows, 100 * 1 + 200 * 3 + 100 * 2);
  // Each request carries its bytes there and back.
  EXPECT_EQ(report->payload_bytes, 2 * (100 * 64 * 4 + 200 * 300 * 2 + 100 * 100 * 2));
  EXPECT_DOUBLE_EQ(report->mean_batch_requests, 1.0);
}

TEST_F(LoadTest, ClosedLoopStreamVerifies) {
  StartServer(/*echo=*/false);
  LoadOptions options = BaseOptions();
  options.stream = true;
  options.concurrency = 6;
  options.connections = 3;
  options.requests = 300;
  options.duration = absl::InfiniteDuration();
  options.log = true;
  options.temperature = 0.5f;
  absl::StatusOr<LoadReport> report = RunLoad(options);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectConsistent(*report);
  EXPECT_EQ(report->ok, 300);
  EXPECT_EQ(report->errors, 0);
  EXPECT_EQ(report->mismatches, 0) << report->first_mismatch;
}

TEST_F(LoadTest, MoreConnectionsThanConcurrencyStillFinishes) {
  StartServer(/*echo=*/false);
  for (bool stream : {false, true}) {
    LoadOptions options = BaseOptions();
    options.stream = stream;
    options.concurrency = 1;
    options.connections = 4;
    options.requests = 30;
    options.duration = absl::InfiniteDuration();
    absl::StatusOr<LoadReport> report = RunLoad(options);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->ok, 30) << "stream=" << stream;
    EXPECT_EQ(report->options.connections, 1);
  }
}

TEST_F(LoadTest, OpenLoopOffersTheRate) {
  StartServer(/*echo=*/false);
  LoadOptions options = BaseOptions();
  options.rate = 400;
  options.connections = 2;
  options.warmup = absl::Milliseconds(100);
  options.duration = absl::Milliseconds(500);
  absl::StatusOr<LoadReport> report = RunLoad(options);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectConsistent(*report);
  // Constant arrivals: exactly rate * duration intended send times.
  EXPECT_EQ(report->requests, 200);
  EXPECT_EQ(report->warmup_requests, 40);
  EXPECT_EQ(report->errors, 0);
  EXPECT_EQ(report->mismatches, 0) << report->first_mismatch;
  EXPECT_EQ(report->mode, "open");
}

TEST_F(LoadTest, OpenLoopPoissonStream) {
  StartServer(/*echo=*/false);
  LoadOptions options = BaseOptions();
  options.rate = 1000;
  options.arrival = Arrival::kPoisson;
  options.stream = true;
  options.connections = 2;
  options.duration = absl::Milliseconds(500);
  absl::StatusOr<LoadReport> report = RunLoad(options);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectConsistent(*report);
  // 500 expected; a Poisson count has standard deviation sqrt(500) ~ 22.
  EXPECT_GT(report->requests, 380);
  EXPECT_LT(report->requests, 620);
  EXPECT_EQ(report->errors, 0);
  EXPECT_EQ(report->mismatches, 0) << report->first_mismatch;
}

TEST_F(LoadTest, VerifyCatchesAnEchoingServer) {
  StartServer(/*echo=*/true);
  LoadOptions options = BaseOptions();
  options.requests = 20;
  options.duration = absl::InfiniteDuration();
  absl::StatusOr<LoadReport> report = RunLoad(options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->ok, 20);
  EXPECT_EQ(report->mismatches, 20);
  EXPECT_NE(report->first_mismatch.find("out of tolerance"), std::string::npos)
      << report->first_mismatch;
}

TEST_F(LoadTest, UnreachableServerIsUnavailable) {
  LoadOptions options;
  options.target = "127.0.0.1:1";  // nothing listens on port 1
  options.progress = false;
  options.connect_timeout = absl::Milliseconds(300);
  absl::StatusOr<LoadReport> report = RunLoad(options);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kUnavailable);
}

TEST(LoadShapeTest, ParsesDimsDtypeAndWeight) {
  absl::StatusOr<LoadShape> shape = ParseLoadShape("8x4096:fp16:2.5");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->dims, (std::vector<int64_t>{8, 4096}));
  EXPECT_EQ(shape->dtype, v1::DTYPE_FLOAT16);
  EXPECT_EQ(shape->weight, 2.5);

  shape = ParseLoadShape("1x16M");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->dims, (std::vector<int64_t>{1, 16 << 20}));
  EXPECT_EQ(shape->dtype, v1::DTYPE_FLOAT32);
  EXPECT_EQ(shape->weight, 1.0);

  shape = ParseLoadShape("2x3x4K:bfloat16");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->dims, (std::vector<int64_t>{2, 3, 4096}));
  EXPECT_EQ(shape->dtype, v1::DTYPE_BFLOAT16);
}

TEST(LoadShapeTest, RejectsMalformedEntries) {
  for (const char* bad : {"", "1xa", "1x-3", "1x8:float64", "1x8:fp32:0", "1x8:fp32:-1",
                          "1x8:fp32:1:extra", "1x8:fp32:w"}) {
    EXPECT_EQ(ParseLoadShape(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(LoadShapeTest, ReadsAShapeFile) {
  const std::string path = ::testing::TempDir() + "/load_shapes.txt";
  {
    std::ofstream file(path);
    file << "# the production mix\n"
         << "1x1024:float32:8   # most calls\n"
         << "\n"
         << "  64x32000:bf16:1\n";
  }
  absl::StatusOr<std::vector<LoadShape>> shapes = ReadLoadShapeFile(path);
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  ASSERT_EQ(shapes->size(), 2u);
  EXPECT_EQ((*shapes)[0].weight, 8.0);
  EXPECT_EQ((*shapes)[1].dims, (std::vector<int64_t>{64, 32000}));
  EXPECT_EQ((*shapes)[1].dtype, v1::DTYPE_BFLOAT16);

  {
    std::ofstream file(path);
    file << "1x1024\n1x:fp32\n";
  }
  shapes = ReadLoadShapeFile(path);
  EXPECT_EQ(shapes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shapes.status().message().find(":2:"), absl::string_view::npos)
      << shapes.status();
}

TEST(LoadArgsTest, ParsesEveryKindOfArgument) {
  absl::StatusOr<LoadOptions> options = ParseLoadArgs(
      {"--target=h:1", "--connections", "4", "--concurrency=64", "--stream", "--verify=false",
       "--shape=1x1024:fp32:3", "--shape=8x4096:fp16", "--duration=2.5", "--warmup=250ms",
       "--timeout_ms=0", "--json=/tmp/r.json", "--csv", "/tmp/r.csv", "--label=none", "--quiet",
       "--log", "--temperature=2", "--axis=0", "--seed=9", "--payloads_per_shape=2"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->target, "h:1");
  EXPECT_EQ(options->connections, 4);
  EXPECT_EQ(options->concurrency, 64);
  EXPECT_TRUE(options->stream);
  EXPECT_FALSE(options->verify);
  ASSERT_EQ(options->shapes.size(), 2u);
  EXPECT_EQ(options->shapes[0].weight, 3.0);
  EXPECT_EQ(options->shapes[1].dtype, v1::DTYPE_FLOAT16);
  EXPECT_EQ(options->duration, absl::Milliseconds(2500));
  EXPECT_EQ(options->warmup, absl::Milliseconds(250));
  EXPECT_EQ(options->timeout, absl::InfiniteDuration());
  EXPECT_EQ(options->json_path, "/tmp/r.json");
  EXPECT_EQ(options->csv_path, "/tmp/r.csv");
  EXPECT_EQ(options->label, "none");
  EXPECT_FALSE(options->progress);
  EXPECT_TRUE(options->log);
  EXPECT_EQ(options->temperature, 2.0f);
  EXPECT_EQ(options->axis, 0);
  EXPECT_EQ(options->seed, 9u);
  EXPECT_EQ(options->payloads_per_shape, 2);
  EXPECT_EQ(options->rate, 0.0);
}

TEST(LoadArgsTest, RequestsAloneMeansNoTimeLimit) {
  absl::StatusOr<LoadOptions> options = ParseLoadArgs({"--requests=100"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->duration, absl::InfiniteDuration());
  options = ParseLoadArgs({"--requests=100", "--duration=3s"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->duration, absl::Seconds(3));
  options = ParseLoadArgs({"--rate=5000", "--arrival=poisson"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->arrival, Arrival::kPoisson);
  EXPECT_EQ(options->duration, absl::Seconds(10));
}

TEST(LoadArgsTest, RejectsBadArguments) {
  const std::vector<std::vector<std::string>> cases = {
      {"--bogus=1"},       {"--concurrency=0"},  {"--connections=-1"}, {"--rate=-5"},
      {"--arrival=burst"}, {"--duration=0"},     {"--duration=abc"},   {"--shape=1xq"},
      {"--concurrency"},   {"positional"},       {"--stream=maybe"},   {"--temperature=0"},
      {"--shapes_file=/nonexistent/shapes.txt"}};
  for (const auto& args : cases) {
    EXPECT_FALSE(ParseLoadArgs(args).ok()) << args[0];
  }
  bool help = false;
  EXPECT_TRUE(ParseLoadArgs({"--help"}, &help).ok());
  EXPECT_TRUE(help);
}

TEST(LoadReportTest, CsvRowMatchesHeaderAndJsonHasTheFigures) {
  LoadReport report;
  report.options.label = "cpu, fast";
  report.options.shapes = {*ParseLoadShape("1x1024"), *ParseLoadShape("8x4096:fp16:2")};
  report.mode = "closed";
  report.requests = 10;
  report.ok = 9;
  report.errors = 1;
  report.errors_by_code[14] = 1;
  report.latency.p50 = 1500;
  const std::string header = LoadReportCsvHeader();
  const std::string row = LoadReportCsvRow(report);
  // The label has a comma, so it is quoted; count columns outside quotes.
  const auto columns = [](const std::string& line) {
    int count = 1;
    bool quoted = false;
    for (char c : line) {
      if (c == '"') quoted = !quoted;
      if (c == ',' && !quoted) ++count;
    }
    return count;
  };
  EXPECT_EQ(columns(header), columns(row));
  EXPECT_EQ(row.rfind("\"cpu, fast\",closed,", 0), 0u) << row;
  const std::string json = LoadReportJson(report);
  EXPECT_NE(json.find("\"errors_by_code\": {\"UNAVAILABLE\": 1}"), std::string::npos) << json;
  EXPECT_NE(json.find("\"p50\": 1.5"), std::string::npos) << json;
  EXPECT_NE(json.find("\"shapes\": [\"1x1024:float32:1\", \"8x4096:float16:2\"]"),
            std::string::npos)
      << json;
}

}  // namespace
}  // namespace softmax::client
