// Tests of the load engine against an in-process SoftmaxService that
// computes with the CPU row routine (or echoes its input, to prove verify
// catches wrong answers).
#include "client/load/engine.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/time/clock.h"
#include "client/tensor.h"
#include "gtest/gtest.h"
#include "common/stream_end.h"
#include "kernels/cpu_softmax.h"
#include "softmax/v1/softmax.grpc.pb.h"

namespace softmax::client {
namespace {

// How the fake's streams end on their own, as softmax-server's do at their
// maximum age (every request read is answered, then UNAVAILABLE) or as a
// reset does (the last request read is lost, or half its answer).
struct StreamEnding {
  int after_requests = 0;  // 0: a stream ends only when the client half-closes
  grpc::StatusCode code = grpc::StatusCode::UNAVAILABLE;
  bool drop_last = false;         // the last request read gets no answer
  bool half_answer_last = false;  // it gets the first of its two answer chunks only
  // The end carries softmax-server's trailer (common/stream_end.h), as its
  // maximum age does; without it the client takes the end for a reset.
  bool says_why = false;
};

// Answers like softmax-server with batches of one, or echoes the input. On
// streams a request sent in chunks is answered in two chunks.
class FakeSoftmaxService final : public v1::SoftmaxService::Service {
 public:
  explicit FakeSoftmaxService(bool echo, StreamEnding ending = StreamEnding())
      : echo_(echo), ending_(ending) {}

  grpc::Status Softmax(grpc::ServerContext*, const v1::SoftmaxRequest* request,
                       v1::SoftmaxResponse* response) override {
    Answer(*request, response);
    return grpc::Status::OK;
  }

  grpc::Status SoftmaxStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::SoftmaxResponse, v1::SoftmaxRequest>* stream) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++streams_;
    }
    std::map<std::string, v1::SoftmaxRequest> assembling;
    int complete = 0;
    v1::SoftmaxRequest message;
    while (stream->Read(&message)) {
      const std::string id = message.request_id();
      v1::SoftmaxRequest& whole = assembling[id];
      const bool chunked = message.more_chunks() || message.chunk_offset() > 0;
      if (message.chunk_offset() == 0) {
        whole = message;
      } else {
        whole.mutable_input()->mutable_data()->append(message.input().data());
        whole.set_more_chunks(message.more_chunks());
      }
      if (whole.more_chunks()) continue;
      const v1::SoftmaxRequest request = std::move(whole);
      assembling.erase(id);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++requests_read_;
      }
      const bool last = ending_.after_requests > 0 && ++complete == ending_.after_requests;
      if (last && ending_.drop_last) return Ending(context);
      v1::SoftmaxResponse response;
      Answer(request, &response);
      if (!chunked) {
        if (!stream->Write(response)) break;
      } else {
        // Two chunks: the first carries everything but the second half.
        const std::string data = response.output().data();
        const size_t half = data.size() / 2;
        v1::SoftmaxResponse first = response;
        first.mutable_output()->set_data(data.substr(0, half));
        first.set_more_chunks(true);
        if (!stream->Write(first)) break;
        if (last && ending_.half_answer_last) return Ending(context);
        v1::SoftmaxResponse second;
        second.set_request_id(id);
        second.mutable_output()->set_data(data.substr(half));
        second.set_chunk_offset(static_cast<int64_t>(half));
        if (!stream->Write(second)) break;
      }
      if (last) return Ending(context);
    }
    return grpc::Status::OK;
  }

  int streams() {
    std::lock_guard<std::mutex> lock(mutex_);
    return streams_;
  }
  int requests_read() {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_read_;
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

  grpc::Status Ending(grpc::ServerContext* context) const {
    if (ending_.says_why) context->AddTrailingMetadata(kStreamEndKey, kStreamEndMaxAge);
    return grpc::Status(ending_.code, "stream reached the server's maximum age; reopen it");
  }

  const bool echo_;
  const StreamEnding ending_;
  std::mutex mutex_;
  std::map<int, int> requests_by_dtype_;
  int streams_ = 0;
  int requests_read_ = 0;
};

class LoadTest : public ::testing::Test {
 protected:
  void StartServer(bool echo, StreamEnding ending = StreamEnding()) {
    service_ = std::make_unique<FakeSoftmaxService>(echo, ending);
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
    options.warmup = absl::ZeroDuration();
    options.shapes = *ParseLoadMix("1x64:float32:1,3x100:fp16:2,2x50:bf16:1");
    options.verify = true;
    return options;
  }

  // BaseOptions for exactly `requests` measured requests, with no time limit.
  LoadOptions CountedOptions(int64_t requests) {
    LoadOptions options = BaseOptions();
    options.requests = requests;
    options.duration = absl::InfiniteDuration();
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
  LoadOptions options = CountedOptions(400);
  options.concurrency = 8;
  options.connections = 2;
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
  LoadOptions options = CountedOptions(300);
  options.stream = true;
  options.concurrency = 6;
  options.connections = 3;
  options.log = true;
  options.temperature = 0.5f;
  absl::StatusOr<LoadReport> report = RunLoad(options);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectConsistent(*report);
  EXPECT_EQ(report->ok, 300);
  EXPECT_EQ(report->errors, 0);
  EXPECT_EQ(report->mismatches, 0) << report->first_mismatch;
}

// Streams the server ends with UNAVAILABLE are reopened, and exactly what
// they left unanswered is sent again: every request is answered once.
TEST_F(LoadTest, ClosedLoopStreamReopensAndResendsWhatWasUnanswered) {
  StreamEnding ending;
  ending.after_requests = 40;
  ending.drop_last = true;  // so every end leaves at least one unanswered
  StartServer(/*echo=*/false, ending);
  LoadOptions options = CountedOptions(600);
  options.stream = true;
  options.concurrency = 6;
  options.connections = 2;
  absl::StatusOr<LoadReport> report = RunLoad(options);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectConsistent(*report);
  EXPECT_EQ(report->ok, 600);
  EXPECT_EQ(report->errors, 0);
  EXPECT_EQ(report->verified, 600);
  // A duplicate answer would arrive for an id no longer in flight.
  EXPECT_EQ(report->mismatches, 0) << report->first_mismatch;
  EXPECT_EQ(report->ended_early, "");
  // 600 requests over two connections' streams of 39 answers each (the
  // last two of them end with the run, not the server).
  EXPECT_GE(report->stream_reopens, 600 / 39 - 2);
  EXPECT_EQ(report->stream_reopens, service_->streams() - 2);
  EXPECT_GE(report->resent_requests, report->stream_reopens);
  // Each dropped request was read once more than it was answered: ends
  // without the server's trailer are reported as lost, with what they resent.
  EXPECT_EQ(service_->requests_read(), 600 + report->stream_reopens);
  EXPECT_EQ(report->streams_lost, report->stream_reopens);
  EXPECT_EQ(report->resent_after_loss, report->resent_requests);
}

TEST_F(LoadTest, ChunkedStreamDropsAHalfReceivedAnswerAndResendsItWhole) {
  StreamEnding ending;
  ending.after_requests = 10;
  ending.half_answer_last = true;
  StartServer(/*echo=*/false, ending);
  LoadOptions options = CountedOptions(100);
  options.stream = true;
  options.chunk_bytes = 100;  // every payload is several chunks
  options.concurrency = 3;
  absl::StatusOr<LoadReport> report = RunLoad(options);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectConsistent(*report);
  EXPECT_EQ(report->ok, 100);
  EXPECT_EQ(report->errors, 0);
  EXPECT_EQ(report->mismatches, 0) << report->first_mismatch;
  EXPECT_GE(report->stream_reopens, 100 / 10);
  EXPECT_GE(report->resent_requests, report->stream_reopens);
  EXPECT_EQ(service_->requests_read(), 100 + report->stream_reopens);
}

TEST_F(LoadTest, OpenLoopStreamRunsItsWholeDurationAcrossReopens) {
  StreamEnding ending;
  ending.after_requests = 50;
  ending.says_why = true;
  StartServer(/*echo=*/false, ending);
  LoadOptions options = BaseOptions();
  options.rate = 1000;
  options.stream = true;
  options.connections = 2;
  options.duration = absl::Milliseconds(600);
  absl::StatusOr<LoadReport> report = RunLoad(options);
  ASSERT_TRUE(report.ok()) << report.status();
  ExpectConsistent(*report);
  // Constant arrivals: exactly rate * duration intended send times.
  EXPECT_EQ(report->requests, 600);
  EXPECT_EQ(report->errors, 0);
  EXPECT_EQ(report->mismatches, 0) << report->first_mismatch;
  EXPECT_GE(report->stream_reopens, 600 / 50 - 2);
  EXPECT_EQ(service_->requests_read(), 600);
  // Every end said the server ended it: nothing resent was computed.
  EXPECT_EQ(report->streams_lost, 0);
  EXPECT_EQ(report->resent_after_loss, 0);
}

TEST_F(LoadTest, OpenLoopChunkedStreamHalfClosesAfterItsLastAnswer) {
  // The last answer's last chunk is read without a full parse; the stream
  // must still half-close then, not wait for the run to cancel it.
  StartServer(/*echo=*/false);
  LoadOptions options = BaseOptions();
  options.rate = 500;
  options.stream = true;
  options.chunk_bytes = 100;
  options.duration = absl::Milliseconds(300);
  options.timeout = absl::Seconds(30);
  const absl::Time start = absl::Now();
  absl::StatusOr<LoadReport> report = RunLoad(options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(report->requests, 150);
  EXPECT_EQ(report->errors, 0);
  EXPECT_EQ(report->mismatches, 0) << report->first_mismatch;
}

TEST_F(LoadTest, StreamEndingWithAnotherCodeStopsTheRunAndSaysWhy) {
  StreamEnding ending;
  ending.after_requests = 20;
  ending.code = grpc::StatusCode::INTERNAL;
  StartServer(/*echo=*/false, ending);
  LoadOptions options = BaseOptions();
  options.stream = true;
  options.concurrency = 4;
  options.duration = absl::Seconds(60);
  const absl::Time start = absl::Now();
  absl::StatusOr<LoadReport> report = RunLoad(options);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  ExpectConsistent(*report);
  EXPECT_EQ(report->stream_reopens, 0);
  EXPECT_NE(report->ended_early.find("ended with INTERNAL"), std::string::npos)
      << report->ended_early;
  EXPECT_GT(report->errors_by_code[static_cast<int>(grpc::StatusCode::INTERNAL)], 0);
}

TEST_F(LoadTest, MoreConnectionsThanConcurrencyStillFinishes) {
  StartServer(/*echo=*/false);
  for (bool stream : {false, true}) {
    LoadOptions options = CountedOptions(30);
    options.stream = stream;
    options.concurrency = 1;
    options.connections = 4;
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
  LoadOptions options = CountedOptions(20);
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
  options.shapes = {LoadShape{{1, 8}}};
  options.connect_timeout = absl::Milliseconds(300);
  absl::StatusOr<LoadReport> report = RunLoad(options);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(LoadTest, StopRequestedEndsTheRunAndStillReports) {
  StartServer(/*echo=*/false);
  LoadOptions options = BaseOptions();
  options.concurrency = 4;
  options.duration = absl::Seconds(60);
  std::atomic<bool> stop{false};
  LoadMonitor monitor;
  monitor.stop_requested = &stop;
  std::thread stopper([&stop] {
    absl::SleepFor(absl::Milliseconds(300));
    stop.store(true);
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<LoadReport> report = RunLoad(options, monitor);
  stopper.join();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  ExpectConsistent(*report);
  EXPECT_GT(report->ok, 0);
  EXPECT_EQ(report->errors, 0);
  EXPECT_EQ(report->mismatches, 0) << report->first_mismatch;
}

TEST_F(LoadTest, ProgressIsSampledThroughBothPhases) {
  StartServer(/*echo=*/false);
  LoadOptions options = BaseOptions();
  options.concurrency = 2;
  options.warmup = absl::Milliseconds(200);
  options.duration = absl::Milliseconds(600);
  std::mutex mutex;
  std::vector<LoadProgress> samples;
  LoadMonitor monitor;
  monitor.progress_interval = absl::Milliseconds(50);
  monitor.on_progress = [&](const LoadProgress& progress) {
    std::lock_guard<std::mutex> lock(mutex);
    samples.push_back(progress);
  };
  absl::StatusOr<LoadReport> report = RunLoad(options, monitor);
  ASSERT_TRUE(report.ok()) << report.status();
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_GE(samples.size(), 5u);
  EXPECT_FALSE(samples.front().measuring);
  EXPECT_TRUE(samples.back().measuring);
  for (size_t i = 1; i < samples.size(); ++i) {
    EXPECT_GT(samples[i].elapsed_seconds, samples[i - 1].elapsed_seconds);
  }
  const bool any_traffic = std::any_of(samples.begin(), samples.end(), [](const LoadProgress& p) {
    return p.requests_per_second > 0 && p.p50_ns > 0 && p.p50_ns <= p.p99_ns;
  });
  EXPECT_TRUE(any_traffic);
}

TEST_F(LoadTest, RejectsOptionsItCannotRun) {
  StartServer(/*echo=*/false);
  LoadOptions options = BaseOptions();
  options.shapes.clear();
  EXPECT_EQ(RunLoad(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = BaseOptions();
  options.axis = 2;  // every entry of the mix is two-dimensional
  EXPECT_EQ(RunLoad(options).status().code(), absl::StatusCode::kInvalidArgument);
  LoadMonitor monitor;
  monitor.on_progress = [](const LoadProgress&) {};
  monitor.progress_interval = absl::ZeroDuration();
  EXPECT_EQ(RunLoad(BaseOptions(), monitor).status().code(), absl::StatusCode::kInvalidArgument);
  options = BaseOptions();
  options.concurrency = 0;
  absl::Status status = RunLoad(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("--concurrency"), absl::string_view::npos) << status;
}

}  // namespace
}  // namespace softmax::client
