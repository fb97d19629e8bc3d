// The service over a real gRPC channel on a free loopback port, with the
// CPU backend behind the batcher.
#include "server/rpc/grpc/service.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_softmax.h"
#include "server/cpu/cpu_backend.h"
#include "server/metrics/metrics.h"
#include "server/rpc/grpc/grpc_server.h"
#include "server/rpc/grpc/test_server.h"
#include "server/testing/v1_messages.h"
#include "server/scheduling/batcher.h"
#include "server/scheduling/scheduler.h"
#include "server/testing/test_backends.h"

namespace softmax::server {
namespace {

// Computes as the GPU backend does: every input of the batch is copied out
// (staged) before any output is written, so segments may be in place.
// Counts the segments that were. With `lend`, also as the GPU backend lends
// outputs: those of segments that accept a view stay in the backend's own
// buffer, which the responses reference; counts the buffers still alive.
class StagingBackend final : public Backend {
 public:
  std::string Describe() const override { return "staging"; }
  std::string Name() const override { return "staging"; }
  bool ComputesInPlace() const override { return true; }
  BatchResult Execute(int slot, Batch& batch) override {
    std::vector<std::string> staged;
    for (const Segment& s : batch.segments) {
      staged.emplace_back(static_cast<const char*>(s.input), static_cast<size_t>(s.bytes));
    }
    BatchResult result;
    for (size_t i = 0; i < batch.segments.size(); ++i) {
      const Segment& s = batch.segments[i];
      segments.fetch_add(1);
      if (s.output == s.input) in_place.fetch_add(1);
      void* output = s.output;
      std::shared_ptr<std::string> kept;
      if (lend && s.output_view_ok) {
        kept = std::shared_ptr<std::string>(
            new std::string(static_cast<size_t>(s.bytes), '\0'), [this](std::string* buffer) {
              delete buffer;
              lent_alive.fetch_sub(1);
            });
        lent_alive.fetch_add(1);
        lent.fetch_add(1);
        output = kept->data();
        result.output_views.resize(batch.segments.size());
        result.output_views[i] = OutputView{kept->data(), s.bytes, kept};
      }
      CpuSoftmaxRows(staged[i].data(), output, s.dtype, s.shape, s.options, 0, s.shape.rows());
    }
    result.compute_ns = 1;
    return result;
  }
  // With `stage`, as the GPU backend stages: memory of its own for inputs
  // that arrive in chunks, counted while alive.
  StagingBuffer AllocateStaging(int64_t bytes) override {
    if (!stage) return {};
    auto* buffer = new std::string(static_cast<size_t>(bytes), '\0');
    staged.fetch_add(1);
    staged_alive.fetch_add(1);
    StagingBuffer staging;
    staging.data = buffer->data();
    staging.bytes = bytes;
    staging.owner = std::shared_ptr<const void>(buffer, [this](const std::string* b) {
      delete b;
      staged_alive.fetch_sub(1);
    });
    return staging;
  }
  bool lend = false;
  bool stage = false;
  std::atomic<int> staged{0};        // staging buffers given out
  std::atomic<int> staged_alive{0};  // of which not yet released
  std::atomic<int> segments{0};
  std::atomic<int> in_place{0};
  std::atomic<int> lent{0};        // outputs lent
  std::atomic<int> lent_alive{0};  // lent buffers not yet released
};

// Forwards to the metrics and counts the requests the batcher has queued
// (OnQueueDepth comes under the batcher's lock, with a deeper queue after each
// enqueue and a shallower one after each batch is taken): a request counted
// here has passed admission, while Admission::in_flight also counts one that
// has only entered it.
class EnqueueCounter final : public BatcherObserver {
 public:
  explicit EnqueueCounter(BatcherObserver* next) : next_(next) {}
  void OnBatchCompleted(const BatchStats& stats) override { next_->OnBatchCompleted(stats); }
  void OnRequestDropped(absl::StatusCode code) override { next_->OnRequestDropped(code); }
  void OnRequestRejected() override { next_->OnRequestRejected(); }
  void OnQueueDepth(int64_t requests, int64_t bytes) override {
    if (requests > depth_) enqueued_.fetch_add(requests - depth_);
    depth_ = requests;
    next_->OnQueueDepth(requests, bytes);
  }
  int64_t enqueued() const { return enqueued_.load(); }

 private:
  BatcherObserver* const next_;
  int64_t depth_ = 0;  // under the batcher's lock
  std::atomic<int64_t> enqueued_{0};
};

struct Harness {
  // A delay of a millisecond or more is there to hold requests in the queue,
  // so those harnesses batch by the delay alone (no dispatch when idle).
  // `in_place`: a StagingBackend, which computes in place as the GPU does.
  explicit Harness(bool echo = false, std::chrono::microseconds delay = std::chrono::microseconds(100),
                   bool in_place = false, int64_t max_tensor_bytes = 1 << 20) {
    metrics = std::move(*Metrics::Create(""));
    if (!echo) {
      BatcherOptions batcher_options;
      batcher_options.max_queue_delay = delay;
      batcher_options.dispatch_when_idle = delay < std::chrono::milliseconds(1);
      if (in_place) {
        auto staging_backend = std::make_unique<StagingBackend>();
        staging = staging_backend.get();
        backend = std::move(staging_backend);
      } else {
        backend = std::make_unique<CpuBackend>(CpuBackendOptions{2, 4096});
      }
      metrics->SetBackends({backend.get()});
      scheduler = std::make_unique<Scheduler>(std::vector<Backend*>{backend.get()});
      enqueue_counter = std::make_unique<EnqueueCounter>(metrics.get());
      batcher = std::make_unique<Batcher>(batcher_options, scheduler.get(), enqueue_counter.get());
    }
    front_ends = std::make_unique<testing::TestGrpcServer>(
        batcher.get(), metrics.get(), max_tensor_bytes,
        /*max_stream_pending=*/8);  // small, so tests exercise read pausing
    admission = front_ends->admission.get();
    service = front_ends->softmax.get();
    server = front_ends->server.get();
    channel = front_ends->channel;
    stub = v1::SoftmaxService::NewStub(channel);
  }
  ~Harness() {
    // The batcher first: what it still holds is answered while the front-ends
    // (and the admission whose tickets those requests hold) are alive.
    if (batcher) batcher->Stop();
    front_ends.reset();
  }

  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<Backend> backend;
  StagingBackend* staging = nullptr;  // when in_place
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<EnqueueCounter> enqueue_counter;  // the batcher's observer
  std::unique_ptr<Batcher> batcher;
  std::unique_ptr<testing::TestGrpcServer> front_ends;
  Admission* admission = nullptr;
  SoftmaxServiceImpl* service = nullptr;
  grpc::Server* server = nullptr;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::SoftmaxService::Stub> stub;
};

using testing::ExpectCorrect;
using testing::RandomRequest;

// One unary Softmax call, which must end OK.
void CallOk(Harness& harness, const v1::SoftmaxRequest& request, v1::SoftmaxResponse* response) {
  grpc::ClientContext context;
  const grpc::Status status = harness.stub->Softmax(&context, request, response);
  ASSERT_TRUE(status.ok()) << status.error_message();
}

// Writes `requests` on one stream (from another thread, so that writes and
// reads overlap) and returns the responses in the order they came; the
// stream must end OK.
std::vector<v1::SoftmaxResponse> RunStream(Harness& harness,
                                           const std::vector<v1::SoftmaxRequest>& requests) {
  grpc::ClientContext context;
  auto stream = harness.stub->SoftmaxStream(&context);
  std::thread writer([&] {
    for (const auto& request : requests) EXPECT_TRUE(stream->Write(request));
    stream->WritesDone();
  });
  std::vector<v1::SoftmaxResponse> responses;
  v1::SoftmaxResponse response;
  while (stream->Read(&response)) responses.push_back(response);
  writer.join();
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  return responses;
}

TEST(ServiceTest, UnaryComputesSoftmaxAlongAnyAxis) {
  Harness harness;
  for (int axis : {0, 1, -1}) {
    const v1::SoftmaxRequest request = RandomRequest("u", {3, 17, 5}, axis, 7 + axis);
    v1::SoftmaxResponse response;
    ASSERT_NO_FATAL_FAILURE(CallOk(harness, request, &response));
    ExpectCorrect(request, response);
    EXPECT_GE(response.timing().batch_requests(), 1);
    EXPECT_GE(response.timing().batch_rows(), 15);
    EXPECT_GT(response.timing().compute_ns(), 0);
    // The CPU backend reports its compute as its kernels' time.
    EXPECT_EQ(response.timing().kernel_ns(), response.timing().compute_ns());
  }
  // The batches were counted under the backend's device label.
  double batches = 0;
  for (const auto& family : harness.metrics->Collect()) {
    if (family.name != "softmax_batches_total") continue;
    for (const auto& metric : family.metric) {
      std::map<std::string, std::string> labels;
      for (const auto& label : metric.label) labels[label.name] = label.value;
      EXPECT_EQ(labels["device"], "cpu");
      if (labels["outcome"] == "ok") batches += metric.counter.value;
    }
  }
  EXPECT_GE(batches, 3);
}

TEST(ServiceTest, UnaryBadRequestIsInvalidArgumentNamingTheField) {
  Harness harness;
  v1::SoftmaxRequest request = RandomRequest("bad", {4, 4}, -1, 1);
  request.mutable_input()->mutable_data()->resize(10);
  v1::SoftmaxResponse response;
  grpc::ClientContext context;
  grpc::Status status = harness.stub->Softmax(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("input.data"), std::string::npos);

  request = RandomRequest("bad", {4, 4}, 2, 1);
  grpc::ClientContext context2;
  status = harness.stub->Softmax(&context2, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("axis"), std::string::npos);
}

TEST(ServiceTest, OversizedMessageIsResourceExhausted) {
  Harness harness;
  // 2 MiB of data against a 1 MiB tensor limit (+ headroom).
  const v1::SoftmaxRequest request = RandomRequest("big", {512, 1024}, -1, 3);
  v1::SoftmaxResponse response;
  grpc::ClientContext context;
  const grpc::Status status = harness.stub->Softmax(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST(ServiceTest, StreamAnswersEveryRequestAndReportsBadOnesInline) {
  Harness harness;
  constexpr int kRequests = 40;  // more than max_stream_pending
  std::vector<v1::SoftmaxRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    v1::SoftmaxRequest request = RandomRequest(absl::StrCat("s", i), {2 + i % 3, 33}, -1, 100 + i);
    if (i % 7 == 3) request.mutable_input()->set_dtype(v1::DTYPE_UNSPECIFIED);
    requests.push_back(request);
  }
  std::vector<bool> seen(kRequests, false);
  int answered = 0;
  for (const v1::SoftmaxResponse& response : RunStream(harness, requests)) {
    const int index = std::stoi(response.request_id().substr(1));
    ASSERT_FALSE(seen[index]) << "duplicate response " << index;
    seen[index] = true;
    ++answered;
    if (index % 7 == 3) {
      EXPECT_EQ(response.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      EXPECT_NE(response.error().message().find("input.dtype"), std::string::npos);
      EXPECT_TRUE(response.output().data().empty());
    } else {
      EXPECT_EQ(response.error().code(), 0);
      ExpectCorrect(requests[index], response);
    }
  }
  EXPECT_EQ(answered, kRequests);
}

TEST(ServiceTest, StreamDeliversEveryAnswerWhileTheClientKeepsTheStreamOpen) {
  // The 2 ms delay answers each round's 8 requests as one batch, so 7
  // answers queue behind a write and go out with gRPC's buffer hint. A
  // hinted message that nothing flushes would sit in gRPC's buffer until
  // more traffic came: the reads below would then hit the deadline.
  Harness harness(false, std::chrono::milliseconds(2));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream = harness.stub->SoftmaxStream(&context);
  constexpr int kRounds = 20;
  constexpr int kPerRound = 8;  // max_stream_pending: the most a stream holds
  for (int round = 0; round < kRounds; ++round) {
    std::vector<v1::SoftmaxRequest> requests;
    for (int i = 0; i < kPerRound; ++i) {
      requests.push_back(RandomRequest(absl::StrCat(i), {1 + i % 3, 16}, -1, round * kPerRound + i));
      ASSERT_TRUE(stream->Write(requests.back()));
    }
    std::vector<bool> seen(kPerRound, false);
    for (int i = 0; i < kPerRound; ++i) {
      v1::SoftmaxResponse response;
      ASSERT_TRUE(stream->Read(&response)) << "round " << round << ": " << i << " of " << kPerRound
                                           << " answers came";
      const int index = std::stoi(response.request_id());
      ASSERT_FALSE(seen[index]) << "duplicate response " << index;
      seen[index] = true;
      ExpectCorrect(requests[index], response);
    }
  }
  ASSERT_TRUE(stream->WritesDone());
  v1::SoftmaxResponse extra;
  EXPECT_FALSE(stream->Read(&extra));
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST(ServiceTest, ClientCancellingMidStreamLeavesTheServerHealthy) {
  // A long delay keeps requests queued when the client vanishes.
  Harness harness(false, std::chrono::milliseconds(200));
  for (int round = 0; round < 3; ++round) {
    grpc::ClientContext context;
    auto stream = harness.stub->SoftmaxStream(&context);
    for (int i = 0; i < 20; ++i) {
      if (!stream->Write(RandomRequest("c", {4, 64}, -1, i))) break;
    }
    context.TryCancel();
    stream->Finish();
  }
  // Unary calls still work afterwards.
  const v1::SoftmaxRequest request = RandomRequest("after", {2, 8}, -1, 9);
  v1::SoftmaxResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(harness.stub->Softmax(&context, request, &response).ok());
  ExpectCorrect(request, response);
}

TEST(ServiceTest, StreamsOfVanishedClientsAllFinishSoShutdownIsPrompt) {
  // Clients vanish while their streams are paused (8 pending) and while
  // requests are being dispatched. Every stream reactor must still finish:
  // gRPC's Shutdown waits for them, so a stuck one would hold it to its
  // deadline.
  Harness harness(false, std::chrono::milliseconds(20));
  for (int round = 0; round < 30; ++round) {
    grpc::ClientContext context;
    auto stream = harness.stub->SoftmaxStream(&context);
    for (int i = 0; i < 12 + round % 5; ++i) {
      if (!stream->Write(RandomRequest("v", {2, 32}, -1, i))) break;
    }
    if (round % 2 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(round % 7));
    context.TryCancel();
    stream->Finish();
  }
  const auto start = std::chrono::steady_clock::now();
  harness.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(20));
  harness.server->Wait();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(ServiceTest, EchoModeReturnsInputWithZeroTiming) {
  Harness harness(/*echo=*/true);
  const v1::SoftmaxRequest request = RandomRequest("e", {3, 5}, -1, 4);
  v1::SoftmaxResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(harness.stub->Softmax(&context, request, &response).ok());
  EXPECT_EQ(response.request_id(), "e");
  EXPECT_EQ(response.output().data(), request.input().data());
  EXPECT_EQ(response.timing().compute_ns(), 0);
  EXPECT_EQ(response.timing().batch_requests(), 0);
  // Still validated.
  v1::SoftmaxRequest bad = request;
  bad.set_temperature(-1.0f);
  grpc::ClientContext context2;
  const grpc::Status status = harness.stub->Softmax(&context2, bad, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("temperature"), std::string::npos);
}

TEST(ServiceTest, ShutdownFinishesRequestsInFlight) {
  auto harness = std::make_unique<Harness>(false, std::chrono::milliseconds(300));
  constexpr int kCalls = 8;
  std::vector<v1::SoftmaxRequest> requests;
  std::vector<v1::SoftmaxResponse> responses(kCalls);
  std::vector<grpc::Status> statuses(kCalls);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCalls; ++i) requests.push_back(RandomRequest("d", {2, 16}, -1, i));
  for (int i = 0; i < kCalls; ++i) {
    callers.emplace_back([&, i] {
      grpc::ClientContext context;
      statuses[i] = harness->stub->Softmax(&context, requests[i], &responses[i]);
    });
  }
  // Wait until every call is in the service (they wait in the batcher for
  // the 300 ms delay), so Shutdown finds them in flight.
  const auto in_service = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (harness->admission->in_flight() < kCalls &&
         std::chrono::steady_clock::now() < in_service) {
    std::this_thread::yield();
  }
  ASSERT_EQ(harness->admission->in_flight(), kCalls);
  SetServing(harness->server, false);
  harness->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  for (auto& caller : callers) caller.join();
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << i << ": " << statuses[i].error_message();
    ExpectCorrect(requests[i], responses[i]);
  }
  harness.reset();
}

TEST(ServiceTest, DrainingRefusesNewRequestsAndWaitsForThoseInFlight) {
  Harness harness(false, std::chrono::milliseconds(300));
  EXPECT_EQ(harness.admission->in_flight(), 0);
  // Two requests wait in the batcher: one unary, one on a stream.
  const v1::SoftmaxRequest unary_request = RandomRequest("u", {2, 16}, -1, 1);
  v1::SoftmaxResponse unary_response;
  grpc::Status unary_status;
  std::thread unary([&] {
    grpc::ClientContext context;
    unary_status = harness.stub->Softmax(&context, unary_request, &unary_response);
  });
  grpc::ClientContext stream_context;
  auto stream = harness.stub->SoftmaxStream(&stream_context);
  const v1::SoftmaxRequest stream_request = RandomRequest("s", {3, 8}, -1, 2);
  ASSERT_TRUE(stream->Write(stream_request));
  // Both queued, so past admission (in_flight alone also counts a request
  // that has entered admission but not passed it, which draining refuses:
  // seen once under AddressSanitizer on 2 cores).
  const auto start = std::chrono::steady_clock::now();
  while (harness.enqueue_counter->enqueued() < 2 &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(harness.enqueue_counter->enqueued(), 2);
  ASSERT_EQ(harness.admission->in_flight(), 2);

  harness.admission->StartDraining();
  // New requests are refused with a retryable status, on both methods.
  v1::SoftmaxResponse refused;
  grpc::ClientContext refused_context;
  const grpc::Status refused_status =
      harness.stub->Softmax(&refused_context, RandomRequest("r", {1, 4}, -1, 3), &refused);
  EXPECT_EQ(refused_status.error_code(), grpc::StatusCode::UNAVAILABLE);
  ASSERT_TRUE(stream->Write(RandomRequest("r2", {1, 4}, -1, 4)));

  EXPECT_TRUE(harness.admission->WaitForInFlight(absl::Now() + absl::Seconds(10)));
  unary.join();
  ASSERT_TRUE(unary_status.ok()) << unary_status.error_message();
  ExpectCorrect(unary_request, unary_response);
  v1::SoftmaxResponse response;
  std::map<std::string, v1::SoftmaxResponse> by_id;
  while (stream->Read(&response)) by_id[response.request_id()] = response;
  // Once its request in flight is answered, the draining server ends the
  // stream with UNAVAILABLE, although the client never half-closed it.
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  ASSERT_EQ(by_id.count("s"), 1u);
  ExpectCorrect(stream_request, by_id["s"]);
  // r2 was refused, or dropped when it arrived after the stream had ended.
  if (by_id.count("r2") != 0) {
    EXPECT_EQ(by_id["r2"].error().code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE));
  }
  EXPECT_EQ(harness.admission->in_flight(), 0);
}

TEST(ServiceTest, InPlaceBackendComputesIntoTheRequestsOwnBuffers) {
  Harness harness(false, std::chrono::microseconds(100), /*in_place=*/true);
  int sent = 0;
  for (int axis : {0, 1, -1}) {
    const v1::SoftmaxRequest request = RandomRequest("u", {3, 17, 5}, axis, 70 + axis);
    v1::SoftmaxResponse response;
    ASSERT_NO_FATAL_FAILURE(CallOk(harness, request, &response));
    ExpectCorrect(request, response);
    ++sent;
  }
  // On a stream too, with sizes on both sides of std::string's inline buffer.
  std::vector<v1::SoftmaxRequest> requests;
  for (int i = 0; i < 12; ++i) {
    requests.push_back(RandomRequest(absl::StrCat("s", i), {1 + i % 2, 1 + (i * 37) % 300}, -1, i));
  }
  int answered = 0;
  for (const v1::SoftmaxResponse& response : RunStream(harness, requests)) {
    const int index = std::stoi(response.request_id().substr(1));
    EXPECT_EQ(response.error().code(), 0) << response.error().message();
    ExpectCorrect(requests[index], response);
    ++answered;
  }
  EXPECT_EQ(answered, 12);
  sent += answered;
  EXPECT_EQ(harness.staging->segments.load(), sent);
  EXPECT_EQ(harness.staging->in_place.load(), sent);
}

// Responses that reference outputs the backend lent (OutputView) carry the
// same bytes as copied ones, unary and streamed, mixed with failed requests,
// and every lent buffer is released once its response is sent.
TEST(ServiceTest, LentOutputsAreSentWithoutACopyAndReleasedAfterwards) {
  Harness harness(false, std::chrono::microseconds(100), /*in_place=*/true);
  harness.staging->lend = true;
  int sent = 0;
  for (int axis : {0, -1}) {
    const v1::SoftmaxRequest request = RandomRequest("u", {3, 170, 5}, axis, 90 + axis);
    v1::SoftmaxResponse response;
    ASSERT_NO_FATAL_FAILURE(CallOk(harness, request, &response));
    ExpectCorrect(request, response);
    EXPECT_GT(response.timing().compute_ns(), 0);
    ++sent;
  }
  constexpr int kRequests = 30;
  std::vector<v1::SoftmaxRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    v1::SoftmaxRequest request =
        RandomRequest(absl::StrCat("s", i), {1 + i % 3, 1 + (i * 997) % 20000}, -1, 200 + i);
    if (i % 5 == 2) request.mutable_input()->set_dtype(v1::DTYPE_UNSPECIFIED);
    requests.push_back(request);
  }
  int answered = 0;
  for (const v1::SoftmaxResponse& response : RunStream(harness, requests)) {
    const int index = std::stoi(response.request_id().substr(1));
    if (index % 5 == 2) {
      EXPECT_EQ(response.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      EXPECT_TRUE(response.output().data().empty());
    } else {
      EXPECT_EQ(response.error().code(), 0) << response.error().message();
      ExpectCorrect(requests[index], response);
      ++sent;
    }
    ++answered;
  }
  EXPECT_EQ(answered, kRequests);
  EXPECT_EQ(harness.staging->lent.load(), sent);
  // gRPC drops its references once the responses are on the wire.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (harness.staging->lent_alive.load() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(harness.staging->lent_alive.load(), 0);
}

// A tensor sent in chunks is assembled straight into the backend's staging
// (AllocateStaging) and computed in place there; the answer, in chunks, is
// the softmax of the whole; a tensor that fails mid-way gives its staging
// back; every staging buffer is released once the responses are sent.
TEST(ServiceTest, ChunkedTensorsAreAssembledInTheBackendsStaging) {
  Harness harness(false, std::chrono::microseconds(100), /*in_place=*/true);
  harness.staging->stage = true;
  const v1::SoftmaxRequest whole = RandomRequest("big", {2, 5000}, -1, 31);
  const std::string& data = whole.input().data();  // 40,000 bytes
  constexpr size_t kChunk = 16384;
  std::vector<v1::SoftmaxRequest> chunks;
  for (size_t offset = 0; offset < data.size(); offset += kChunk) {
    v1::SoftmaxRequest chunk;
    if (offset == 0) {
      chunk = whole;
    } else {
      chunk.set_request_id(whole.request_id());
      chunk.set_chunk_offset(static_cast<int64_t>(offset));
    }
    chunk.mutable_input()->set_data(data.substr(offset, kChunk));
    chunk.set_more_chunks(offset + kChunk < data.size());
    chunks.push_back(std::move(chunk));
  }
  // A second tensor whose second chunk leaves a gap: one error, no leak.
  v1::SoftmaxRequest broken = RandomRequest("gap", {1, 5000}, -1, 32);
  broken.mutable_input()->mutable_data()->resize(kChunk);
  broken.set_more_chunks(true);
  v1::SoftmaxRequest after_gap;
  after_gap.set_request_id("gap");
  after_gap.set_chunk_offset(kChunk + 4);
  after_gap.mutable_input()->set_data(std::string(100, '\1'));
  after_gap.set_more_chunks(true);
  chunks.insert(chunks.begin() + 1, {broken, after_gap});

  v1::SoftmaxResponse assembled;
  int errors = 0;
  for (const v1::SoftmaxResponse& response : RunStream(harness, chunks)) {
    if (response.request_id() == "gap") {
      EXPECT_EQ(response.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      ++errors;
      continue;
    }
    ASSERT_EQ(response.error().code(), 0) << response.error().message();
    ASSERT_EQ(response.chunk_offset(),
              static_cast<int64_t>(assembled.output().data().size()));
    if (response.chunk_offset() == 0) {
      assembled = response;
    } else {
      assembled.mutable_output()->mutable_data()->append(response.output().data());
    }
  }
  EXPECT_EQ(errors, 1);
  ExpectCorrect(whole, assembled);
  EXPECT_EQ(harness.staging->staged.load(), 2);
  EXPECT_EQ(harness.staging->in_place.load(), 1);
  EXPECT_TRUE(testing::Await([&] { return harness.staging->staged_alive.load() == 0; }));
}

// Bytes that are no SoftmaxRequest at all: INVALID_ARGUMENT for a unary call;
// on a stream, that request's error response while the stream goes on.
TEST(ServiceTest, UnparsableRequestBytesAreInvalidArgument) {
  Harness harness;
  grpc::GenericStub generic(harness.channel);
  const std::string garbage = "\x12\xff\xff\xff\xff\x0f";  // field 2 longer than the message
  {
    grpc::ClientContext context;
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer reply;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    generic.UnaryCall(&context, "/softmax.v1.SoftmaxService/Softmax", grpc::StubOptions(), &request,
                      &reply, [&](grpc::Status s) {
                        std::lock_guard<std::mutex> lock(mu);
                        status = std::move(s);
                        done = true;
                        cv.notify_all();
                      });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_NE(status.error_message().find("SoftmaxRequest"), std::string::npos);
    // protobuf gives no reason: the message names what it refuses instead.
    EXPECT_NE(status.error_message().find("wire format"), std::string::npos)
        << status.error_message();
  }
  {
    grpc::ClientContext context;
    grpc::CompletionQueue cq;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
        generic.PrepareCall(&context, "/softmax.v1.SoftmaxService/SoftmaxStream", &cq);
    void* tag = nullptr;
    bool ok = false;
    auto step = [&](int expected) {
      ASSERT_TRUE(cq.Next(&tag, &ok));
      EXPECT_EQ(tag, reinterpret_cast<void*>(expected));
    };
    call->StartCall(reinterpret_cast<void*>(1));
    step(1);
    grpc::Slice bad(garbage);
    grpc::ByteBuffer bad_buffer(&bad, 1);
    call->Write(bad_buffer, reinterpret_cast<void*>(2));
    step(2);
    const v1::SoftmaxRequest good = RandomRequest("g", {2, 9}, -1, 5);
    grpc::ByteBuffer good_buffer;
    bool own = false;
    ASSERT_TRUE(grpc::SerializationTraits<v1::SoftmaxRequest>::Serialize(good, &good_buffer, &own).ok());
    call->Write(good_buffer, reinterpret_cast<void*>(3));
    step(3);
    call->WritesDone(reinterpret_cast<void*>(4));
    step(4);
    std::map<std::string, v1::SoftmaxResponse> by_id;
    for (int i = 0; i < 2; ++i) {
      grpc::ByteBuffer reply;
      call->Read(&reply, reinterpret_cast<void*>(5));
      step(5);
      ASSERT_TRUE(ok);
      v1::SoftmaxResponse response;
      ASSERT_TRUE(grpc::SerializationTraits<v1::SoftmaxResponse>::Deserialize(&reply, &response).ok());
      by_id[response.request_id()] = response;
    }
    EXPECT_EQ(by_id[""].error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
    ExpectCorrect(good, by_id["g"]);
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(6));
    step(6);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
}

// Tensors past TensorBufferPool::kMinPooledBytes are parsed into pooled
// buffers and answered by reference: the echo and the CPU backend return
// the right bytes, unary and streamed, and afterwards the pool holds the
// buffers for the next calls, no more than those calls took out.
TEST(ServiceTest, LargeTensorsTravelThroughPooledBuffers) {
  constexpr int64_t kColumns = (TensorBufferPool::kMinPooledBytes + (1 << 20)) / 4;  // 17 MiB
  for (const bool echo : {true, false}) {
    SCOPED_TRACE(echo ? "echo" : "cpu");
    Harness harness(echo, std::chrono::microseconds(100), /*in_place=*/false,
                    /*max_tensor_bytes=*/int64_t{64} << 20);
    const v1::SoftmaxRequest request = RandomRequest("big", {1, kColumns}, -1, 5);
    for (int call = 0; call < 3; ++call) {
      v1::SoftmaxResponse response;
      ASSERT_NO_FATAL_FAILURE(CallOk(harness, request, &response));
      if (echo) {
        EXPECT_TRUE(response.output().data() == request.input().data());
      } else {
        ExpectCorrect(request, response);
      }
    }
    std::vector<v1::SoftmaxRequest> requests;
    for (int i = 0; i < 2; ++i) {
      requests.push_back(RandomRequest(absl::StrCat("s", i), {1, kColumns}, -1, 10 + i));
    }
    const std::vector<v1::SoftmaxResponse> responses = RunStream(harness, requests);
    ASSERT_EQ(responses.size(), 2u);
    for (const v1::SoftmaxResponse& response : responses) {
      const int index = std::stoi(response.request_id().substr(1));
      EXPECT_EQ(response.error().code(), 0) << response.error().message();
      if (echo) {
        EXPECT_TRUE(response.output().data() == requests[index].input().data());
      } else {
        ExpectCorrect(requests[index], response);
      }
    }
    // gRPC releases the responses' buffers once they are on the wire.
    TensorBufferPool& pool = *harness.service->front_end().buffers;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (pool.idle_buffers() == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_GE(pool.idle_buffers(), 1u);
    EXPECT_LE(pool.idle_buffers(), 2u);  // at most two calls were in flight at once
  }
}

}  // namespace
}  // namespace softmax::server
