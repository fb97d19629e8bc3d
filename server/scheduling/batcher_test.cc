#include "server/batcher.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace softmax::server {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// What the fake backends compute: each segment's output is its input.
void CopyInputsToOutputs(const Batch& batch) {
  for (const Segment& s : batch.segments) {
    // In place (outputs_reuse_inputs) the output already holds the input.
    if (s.bytes > 0 && s.output != s.input) {
      std::memcpy(s.output, s.input, static_cast<size_t>(s.bytes));
    }
  }
}

// A backend that records what it is given, copies each segment's input to
// its output, and either completes at once or holds batches until released.
class FakeBackend final : public Backend {
 public:
  FakeBackend(int max_in_flight, bool hold) : max_in_flight_(max_in_flight), hold_(hold) {}

  std::string Describe() const override { return "fake"; }
  int MaxBatchesInFlight() const override { return max_in_flight_; }

  void Submit(std::unique_ptr<Batch> batch, Done done) override {
    CopyInputsToOutputs(*batch);
    {
      absl::MutexLock lock(&mu_);
      batches_.push_back(batch->segments);
      submit_threads_.push_back(std::this_thread::get_id());
      ++outstanding_;
      max_outstanding_ = std::max(max_outstanding_, outstanding_);
      if (hold_) {
        held_.emplace_back(std::move(batch), std::move(done));
        return;
      }
      --outstanding_;
    }
    BatchResult result;
    result.compute_ns = 1234;
    result.kernel_ns = 1000;
    // What a backend measures: the batcher stamped the submit.
    if (batch->submitted != std::chrono::steady_clock::time_point{}) {
      result.dispatch_ns = std::max<int64_t>(
          1, std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::steady_clock::now() - batch->submitted)
                 .count());
    }
    done(std::move(batch), std::move(result));
  }

  // Completes the oldest held batch with `status` on the calling thread.
  void ReleaseOne(absl::Status status = absl::OkStatus()) {
    std::unique_ptr<Batch> batch;
    Done done;
    {
      absl::MutexLock lock(&mu_);
      ASSERT_FALSE(held_.empty());
      batch = std::move(held_.front().first);
      done = std::move(held_.front().second);
      held_.pop_front();
      --outstanding_;
    }
    BatchResult result;
    result.status = std::move(status);
    result.compute_ns = 555;
    done(std::move(batch), std::move(result));
  }

  // Waits until `count` batches have been submitted; false on timeout.
  bool WaitForBatches(size_t count, absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return batches_.size() >= count;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

  std::vector<std::vector<Segment>> batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  int max_outstanding() {
    absl::MutexLock lock(&mu_);
    return max_outstanding_;
  }
  std::vector<std::thread::id> submit_threads() {
    absl::MutexLock lock(&mu_);
    return submit_threads_;
  }

 private:
  const int max_in_flight_;
  const bool hold_;
  absl::Mutex mu_;
  std::vector<std::vector<Segment>> batches_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread::id> submit_threads_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<std::unique_ptr<Batch>, Done>> held_ ABSL_GUARDED_BY(mu_);
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  int max_outstanding_ ABSL_GUARDED_BY(mu_) = 0;
};

class CountingObserver final : public BatcherObserver {
 public:
  void OnBatchCompleted(const BatchStats& stats) override { ++batches; }
  void OnRequestDropped(absl::StatusCode code) override {
    if (code == absl::StatusCode::kCancelled) ++cancelled;
    if (code == absl::StatusCode::kDeadlineExceeded) ++expired;
  }
  void OnRequestRejected() override { ++rejected; }
  std::atomic<int> batches{0}, cancelled{0}, expired{0}, rejected{0};
};

// One request's storage and outcome.
struct TestRequest {
  std::string input;
  std::string output;
  absl::Status status = absl::UnknownError("not completed");
  RequestTiming timing;
  absl::Notification done;
};

std::unique_ptr<WorkItem> MakeItem(TestRequest* request, int64_t rows, int64_t n,
                                   DType dtype = DType::kFloat32,
                                   SoftmaxOptions options = SoftmaxOptions()) {
  request->input.assign(static_cast<size_t>(rows * n * ItemSize(dtype)), '\0');
  for (size_t i = 0; i < request->input.size(); ++i) request->input[i] = static_cast<char>(i * 7);
  auto item = std::make_unique<WorkItem>();
  item->segment.input = request->input.data();
  item->segment.bytes = static_cast<int64_t>(request->input.size());
  item->segment.dtype = dtype;
  item->segment.shape = SoftmaxShape{rows, n, 1};
  item->segment.options = options;
  item->output = &request->output;
  item->done = [request](const absl::Status& status, const RequestTiming& timing) {
    ASSERT_FALSE(request->done.HasBeenNotified()) << "done called twice";
    request->status = status;
    request->timing = timing;
    request->done.Notify();
  };
  return item;
}

// The size and delay rules alone: dispatch_when_idle off, unless a test
// turns it on.
BatcherOptions Options(int64_t rows, int64_t bytes, microseconds delay) {
  BatcherOptions options;
  options.max_batch_rows = rows;
  options.max_batch_bytes = bytes;
  options.max_queue_delay = delay;
  options.dispatch_when_idle = false;
  return options;
}

constexpr microseconds kForever = std::chrono::seconds(100);

TEST(BatcherTest, RowLimitClosesBatches) {
  FakeBackend backend(1, /*hold=*/true);
  Batcher batcher(Options(10, 1 << 30, kForever), &backend);
  TestRequest r[5];
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[0], 4, 8)).ok());
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[1], 4, 8)).ok());
  EXPECT_FALSE(backend.WaitForBatches(1, absl::Milliseconds(50)));  // 8 rows < 10: waits
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[2], 4, 8)).ok());         // 12 queued: ready
  ASSERT_TRUE(backend.WaitForBatches(1));
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[3], 4, 8)).ok());
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[4], 4, 8)).ok());
  // One batch in flight: the next waits for it even though 12 rows are queued.
  EXPECT_FALSE(backend.WaitForBatches(2, absl::Milliseconds(50)));
  backend.ReleaseOne();
  ASSERT_TRUE(backend.WaitForBatches(2));
  backend.ReleaseOne();
  // r[4] alone (4 rows) waits for the delay, which is long.
  EXPECT_FALSE(backend.WaitForBatches(3, absl::Milliseconds(50)));
  std::thread stopper([&] { batcher.Stop(); });  // Stop flushes without waiting
  ASSERT_TRUE(backend.WaitForBatches(3));
  backend.ReleaseOne();
  stopper.join();

  const auto batches = backend.batches();
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].size(), 2u);
  EXPECT_EQ(batches[1].size(), 2u);
  EXPECT_EQ(batches[2].size(), 1u);
  EXPECT_EQ(batches[0][0].input, r[0].input.data());
  EXPECT_EQ(batches[1][0].input, r[2].input.data());
  EXPECT_EQ(batches[2][0].input, r[4].input.data());
  for (TestRequest& request : r) {
    ASSERT_TRUE(request.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_TRUE(request.status.ok()) << request.status;
    EXPECT_EQ(request.output, request.input);  // the backend wrote into the response
  }
  EXPECT_EQ(r[0].timing.batch_requests, 2);
  EXPECT_EQ(r[0].timing.batch_rows, 8);
  EXPECT_EQ(r[0].timing.compute_ns, 555);
  EXPECT_EQ(r[4].timing.batch_requests, 1);
  EXPECT_EQ(r[4].timing.batch_rows, 4);
  EXPECT_GE(r[4].timing.queue_ns, 100 * 1000 * 1000);  // it waited the 3 x 50 ms above
}

TEST(BatcherTest, ByteLimitClosesBatches) {
  FakeBackend backend(1, /*hold=*/true);
  Batcher batcher(Options(1 << 30, 100, kForever), &backend);
  TestRequest r[3];
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[0], 1, 10)).ok());  // 40 bytes
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[1], 1, 10)).ok());  // 80
  EXPECT_FALSE(backend.WaitForBatches(1, absl::Milliseconds(50)));
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[2], 1, 10)).ok());  // 120 >= 100
  ASSERT_TRUE(backend.WaitForBatches(1));
  const auto batches = backend.batches();
  EXPECT_EQ(batches[0].size(), 2u);  // a third would make 120 > 100
  backend.ReleaseOne();
  std::thread stopper([&] { batcher.Stop(); });
  ASSERT_TRUE(backend.WaitForBatches(2));
  backend.ReleaseOne();
  stopper.join();
  EXPECT_EQ(backend.batches()[1].size(), 1u);
}

TEST(BatcherTest, DelayClosesABatchOfOne) {
  FakeBackend backend(1, /*hold=*/false);
  Batcher batcher(Options(1000, 1 << 30, milliseconds(30)), &backend);
  TestRequest r;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r, 2, 4)).ok());
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(r.status.ok());
  EXPECT_GE(elapsed, milliseconds(30));
  EXPECT_GE(r.timing.queue_ns, 30 * 1000 * 1000);
  EXPECT_LT(r.timing.queue_ns, 5LL * 1000 * 1000 * 1000);
  EXPECT_EQ(r.timing.compute_ns, 1234);
  EXPECT_EQ(r.timing.kernel_ns, 1000);
  // The batch was stamped at its submit, so the backend could time its
  // dispatch (at least 1 ns in the fake), and that reached the request.
  EXPECT_GT(r.timing.dispatch_ns, 0);
  EXPECT_LT(r.timing.dispatch_ns, 5LL * 1000 * 1000 * 1000);
  EXPECT_EQ(r.timing.batch_requests, 1);
}

TEST(BatcherTest, RequestsArrivingWithinTheDelayShareABatch) {
  FakeBackend backend(1, /*hold=*/false);
  Batcher batcher(Options(1000, 1 << 30, milliseconds(200)), &backend);
  TestRequest r[4];
  for (TestRequest& request : r) ASSERT_TRUE(batcher.Enqueue(MakeItem(&request, 3, 4)).ok());
  for (TestRequest& request : r) {
    ASSERT_TRUE(request.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  ASSERT_EQ(backend.batches().size(), 1u);
  EXPECT_EQ(r[3].timing.batch_requests, 4);
  EXPECT_EQ(r[3].timing.batch_rows, 12);
}

TEST(BatcherTest, OversizedRequestRunsAlone) {
  FakeBackend backend(1, /*hold=*/false);
  Batcher batcher(Options(10, 1 << 30, kForever), &backend);
  TestRequest small, big, after;
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&small, 4, 2)).ok());
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&big, 50, 2)).ok());
  ASSERT_TRUE(big.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(small.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(small.timing.batch_requests, 1);
  EXPECT_EQ(big.timing.batch_requests, 1);
  EXPECT_EQ(big.timing.batch_rows, 50);
  // A lone request over the byte limit also runs at once.
  FakeBackend backend2(1, false);
  Batcher bytes_batcher(Options(1 << 30, 64, kForever), &backend2);
  ASSERT_TRUE(bytes_batcher.Enqueue(MakeItem(&after, 1, 1000)).ok());
  ASSERT_TRUE(after.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(after.status.ok());
}

TEST(BatcherTest, MixedSegmentsKeepTheirOwnParameters) {
  FakeBackend backend(1, /*hold=*/false);
  Batcher batcher(Options(1000, 1 << 30, milliseconds(100)), &backend);
  TestRequest a, b, c;
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&a, 2, 100, DType::kFloat32, {1.0f, false})).ok());
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&b, 5, 3, DType::kFloat16, {0.5f, true})).ok());
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&c, 1, 7, DType::kBFloat16, {2.0f, false})).ok());
  for (TestRequest* r : {&a, &b, &c}) {
    ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_TRUE(r->status.ok());
    EXPECT_EQ(r->output, r->input);
  }
  const auto batches = backend.batches();
  ASSERT_EQ(batches.size(), 1u);
  ASSERT_EQ(batches[0].size(), 3u);
  EXPECT_EQ(batches[0][0].dtype, DType::kFloat32);
  EXPECT_EQ(batches[0][1].dtype, DType::kFloat16);
  EXPECT_EQ(batches[0][1].options.temperature, 0.5f);
  EXPECT_TRUE(batches[0][1].options.log);
  EXPECT_EQ(batches[0][1].shape.n, 3);
  EXPECT_EQ(batches[0][1].bytes, 5 * 3 * 2);
  EXPECT_EQ(batches[0][2].dtype, DType::kBFloat16);
  EXPECT_EQ(batches[0][2].output, c.output.data());
  EXPECT_EQ(a.timing.batch_rows, 8);
  EXPECT_EQ(a.timing.batch_requests, 3);
}

TEST(BatcherTest, ExpiredAndCancelledRequestsAreDroppedBeforeCompute) {
  FakeBackend backend(1, /*hold=*/false);
  CountingObserver observer;
  Batcher batcher(Options(1000, 1 << 30, milliseconds(20)), &backend, &observer);
  TestRequest expired, cancelled, live;
  auto item = MakeItem(&expired, 1, 4);
  item->deadline = std::chrono::system_clock::now() + milliseconds(1);
  ASSERT_TRUE(batcher.Enqueue(std::move(item)).ok());
  item = MakeItem(&cancelled, 1, 4);
  item->is_cancelled = [] { return true; };
  ASSERT_TRUE(batcher.Enqueue(std::move(item)).ok());
  item = MakeItem(&live, 1, 4);
  item->deadline = std::chrono::system_clock::now() + std::chrono::seconds(60);
  item->is_cancelled = [] { return false; };
  ASSERT_TRUE(batcher.Enqueue(std::move(item)).ok());
  for (TestRequest* r : {&expired, &cancelled, &live}) {
    ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  EXPECT_EQ(expired.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(cancelled.status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(live.status.ok());
  EXPECT_TRUE(expired.output.empty());  // never computed
  const auto batches = backend.batches();
  ASSERT_EQ(batches.size(), 1u);
  ASSERT_EQ(batches[0].size(), 1u);
  EXPECT_EQ(batches[0][0].input, live.input.data());
  EXPECT_EQ(live.timing.batch_requests, 1);
  EXPECT_EQ(observer.expired.load(), 1);
  EXPECT_EQ(observer.cancelled.load(), 1);
  batcher.Stop();
  EXPECT_EQ(observer.batches.load(), 1);
}

TEST(BatcherTest, QueueFullIsUnavailableAndRetryable) {
  FakeBackend backend(1, /*hold=*/true);
  CountingObserver observer;
  BatcherOptions options = Options(1 << 30, int64_t{1} << 40, kForever);
  options.max_queued_requests = 2;
  options.max_queued_bytes = 100;
  Batcher batcher(options, &backend, &observer);
  TestRequest r[4];
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[0], 1, 10)).ok());  // 40 bytes
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[1], 1, 10)).ok());  // 80 bytes, 2 requests
  absl::Status full = batcher.Enqueue(MakeItem(&r[2], 1, 1));
  EXPECT_EQ(full.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(full.message().find("retry"), absl::string_view::npos) << full.message();
  EXPECT_FALSE(r[2].done.HasBeenNotified());
  EXPECT_EQ(observer.rejected.load(), 1);
  std::thread stopper([&] { batcher.Stop(); });
  ASSERT_TRUE(backend.WaitForBatches(1));
  backend.ReleaseOne();
  stopper.join();
  EXPECT_EQ(batcher.Enqueue(MakeItem(&r[3], 1, 1)).code(), absl::StatusCode::kUnavailable);
}

TEST(BatcherTest, QueuedBytesBoundAdmission) {
  FakeBackend backend(1, /*hold=*/true);
  BatcherOptions options = Options(1 << 30, int64_t{1} << 40, kForever);
  options.max_queued_bytes = 100;
  Batcher batcher(options, &backend);
  TestRequest big, second;
  // An empty queue admits even a request larger than the byte bound.
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&big, 1, 50)).ok());  // 200 bytes
  EXPECT_EQ(batcher.Enqueue(MakeItem(&second, 1, 1)).code(), absl::StatusCode::kUnavailable);
  std::thread stopper([&] { batcher.Stop(); });
  ASSERT_TRUE(backend.WaitForBatches(1));
  backend.ReleaseOne();
  stopper.join();
  EXPECT_TRUE(big.status.ok());
}

TEST(BatcherTest, BackendErrorFailsEveryRequestOfTheBatch) {
  FakeBackend backend(1, /*hold=*/true);
  CountingObserver observer;
  Batcher batcher(Options(2, 1 << 30, kForever), &backend, &observer);
  TestRequest a, b;
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&a, 1, 4)).ok());
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&b, 1, 4)).ok());
  ASSERT_TRUE(backend.WaitForBatches(1));
  backend.ReleaseOne(absl::InternalError("device fault"));
  for (TestRequest* r : {&a, &b}) {
    ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_EQ(r->status.code(), absl::StatusCode::kInternal);
  }
}

TEST(BatcherTest, PipelinesUpToTheBackendsInFlightLimit) {
  FakeBackend backend(2, /*hold=*/true);
  Batcher batcher(Options(1, 1 << 30, kForever), &backend);
  TestRequest r[3];
  for (TestRequest& request : r) ASSERT_TRUE(batcher.Enqueue(MakeItem(&request, 1, 4)).ok());
  ASSERT_TRUE(backend.WaitForBatches(2));
  EXPECT_FALSE(backend.WaitForBatches(3, absl::Milliseconds(50)));
  EXPECT_EQ(backend.max_outstanding(), 2);
  backend.ReleaseOne();
  ASSERT_TRUE(backend.WaitForBatches(3));
  backend.ReleaseOne();
  backend.ReleaseOne();
  for (TestRequest& request : r) {
    ASSERT_TRUE(request.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_TRUE(request.status.ok());
  }
}

TEST(BatcherTest, StopDrainsQueuedRequestsWithoutWaitingForTheDelay) {
  FakeBackend backend(1, /*hold=*/false);
  Batcher batcher(Options(1 << 30, 1 << 30, kForever), &backend);
  TestRequest r[3];
  for (TestRequest& request : r) ASSERT_TRUE(batcher.Enqueue(MakeItem(&request, 2, 2)).ok());
  const auto start = std::chrono::steady_clock::now();
  batcher.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  for (TestRequest& request : r) {
    ASSERT_TRUE(request.done.HasBeenNotified());
    EXPECT_TRUE(request.status.ok());
  }
  batcher.Stop();  // idempotent
}

TEST(BatcherTest, ManyConcurrentProducersAllComplete) {
  FakeBackend backend(2, /*hold=*/false);
  Batcher batcher(Options(64, 1 << 30, microseconds(200)), &backend);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 500;
  std::vector<std::unique_ptr<TestRequest>> requests;
  for (int i = 0; i < kThreads * kPerThread; ++i) requests.push_back(std::make_unique<TestRequest>());
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        TestRequest* request = requests[t * kPerThread + i].get();
        ASSERT_TRUE(batcher.Enqueue(MakeItem(request, 1 + i % 5, 8)).ok());
      }
    });
  }
  for (auto& producer : producers) producer.join();
  int64_t batched_requests = 0;
  for (auto& request : requests) {
    ASSERT_TRUE(request->done.WaitForNotificationWithTimeout(absl::Seconds(20)));
    ASSERT_TRUE(request->status.ok());
    ASSERT_EQ(request->output, request->input);
    ASSERT_LE(request->timing.batch_rows, 64);
  }
  for (const auto& batch : backend.batches()) batched_requests += batch.size();
  EXPECT_EQ(batched_requests, kThreads * kPerThread);
  EXPECT_LT(backend.batches().size(), static_cast<size_t>(kThreads * kPerThread));
}

TEST(BatcherTest, IdleBackendGetsALoneRequestAtOnceBusyOneLetsRequestsGather) {
  FakeBackend backend(2, /*hold=*/true);
  BatcherOptions options = Options(1000, 1 << 30, kForever);
  options.dispatch_when_idle = true;
  Batcher batcher(options, &backend);
  TestRequest r[4];
  // Nothing in flight: the first request is not kept waiting for the (very
  // long) delay.
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[0], 1, 4)).ok());
  ASSERT_TRUE(backend.WaitForBatches(1));
  // One batch in flight: a second slot is free, but the device is busy, so
  // the next requests gather instead of going one by one.
  for (int i = 1; i < 4; ++i) ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[i], 1, 4)).ok());
  EXPECT_FALSE(backend.WaitForBatches(2, absl::Milliseconds(50)));
  // The device goes idle: everything gathered leaves as one batch.
  backend.ReleaseOne();
  ASSERT_TRUE(backend.WaitForBatches(2));
  backend.ReleaseOne();
  const auto batches = backend.batches();
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].size(), 1u);
  EXPECT_EQ(batches[1].size(), 3u);
  for (TestRequest& request : r) {
    ASSERT_TRUE(request.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_TRUE(request.status.ok()) << request.status;
    EXPECT_EQ(request.output, request.input);
  }
  EXPECT_LT(r[0].timing.queue_ns, 5LL * 1000 * 1000 * 1000);
  EXPECT_EQ(r[1].timing.batch_requests, 3);
}

TEST(BatcherTest, WithoutIdleDispatchALoneRequestWaitsForTheDelay) {
  FakeBackend backend(1, /*hold=*/false);
  Batcher batcher(Options(1000, 1 << 30, kForever), &backend);
  TestRequest r;
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r, 1, 4)).ok());
  EXPECT_FALSE(backend.WaitForBatches(1, absl::Milliseconds(50)));
  batcher.Stop();
  EXPECT_TRUE(r.done.HasBeenNotified());
}

TEST(BatcherTest, OutputsTakeOverInputBuffersWhenTheBackendComputesInPlace) {
  FakeBackend backend(1, /*hold=*/false);
  BatcherOptions options = Options(1000, 1 << 30, milliseconds(20));
  options.outputs_reuse_inputs = true;
  Batcher batcher(options, &backend);
  // A large tensor, one small enough for the string's inline storage, and
  // one whose offered buffer does not match its segment (not taken over).
  TestRequest big, tiny, mismatched;
  std::string mismatched_buffer = "not the input";
  auto big_item = MakeItem(&big, 64, 1024);
  auto tiny_item = MakeItem(&tiny, 1, 1);
  auto mismatched_item = MakeItem(&mismatched, 2, 8);
  big_item->input_buffer = &big.input;
  tiny_item->input_buffer = &tiny.input;
  mismatched_item->input_buffer = &mismatched_buffer;
  const std::string big_bytes = big.input;
  const std::string tiny_bytes = tiny.input;
  const char* const big_data = big.input.data();
  ASSERT_TRUE(batcher.Enqueue(std::move(big_item)).ok());
  ASSERT_TRUE(batcher.Enqueue(std::move(tiny_item)).ok());
  ASSERT_TRUE(batcher.Enqueue(std::move(mismatched_item)).ok());
  for (TestRequest* r : {&big, &tiny, &mismatched}) {
    ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_TRUE(r->status.ok()) << r->status;
  }
  const auto batches = backend.batches();
  ASSERT_EQ(batches.size(), 1u);
  ASSERT_EQ(batches[0].size(), 3u);
  // The big request's response owns its input's very buffer: computed in
  // place, nothing allocated.
  EXPECT_EQ(big.output.data(), big_data);
  EXPECT_EQ(batches[0][0].input, big_data);
  EXPECT_EQ(batches[0][0].output, big_data);
  EXPECT_TRUE(big.input.empty());
  EXPECT_EQ(big.output, big_bytes);
  EXPECT_EQ(batches[0][1].input, batches[0][1].output);
  EXPECT_EQ(batches[0][1].output, tiny.output.data());
  EXPECT_EQ(tiny.output, tiny_bytes);
  // Not its input's buffer: a fresh output, the input left alone.
  EXPECT_NE(batches[0][2].output, batches[0][2].input);
  EXPECT_EQ(batches[0][2].input, mismatched.input.data());
  EXPECT_EQ(mismatched.output, mismatched.input);
  EXPECT_EQ(mismatched_buffer, "not the input");
}

TEST(BatcherTest, OutputsAreFreshBuffersUnlessTheBackendComputesInPlace) {
  FakeBackend backend(1, /*hold=*/false);
  Batcher batcher(Options(1000, 1 << 30, milliseconds(1)), &backend);
  TestRequest r;
  auto item = MakeItem(&r, 8, 64);
  item->input_buffer = &r.input;
  ASSERT_TRUE(batcher.Enqueue(std::move(item)).ok());
  ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(r.status.ok());
  ASSERT_EQ(backend.batches().size(), 1u);
  EXPECT_NE(backend.batches()[0][0].output, backend.batches()[0][0].input);
  EXPECT_EQ(r.input.size(), 8u * 64 * 4);
  EXPECT_EQ(r.output, r.input);
}

TEST(BatcherTest, IdleDispatchSubmitsFromTheEnqueuingThread) {
  FakeBackend backend(2, /*hold=*/true);
  BatcherOptions options = Options(1000, 1 << 30, kForever);
  options.dispatch_when_idle = true;
  Batcher batcher(options, &backend);
  TestRequest first, cancelled;
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&first, 1, 4)).ok());
  // Submitted before Enqueue returned, by this thread: no hand-off.
  ASSERT_EQ(backend.batches().size(), 1u);
  EXPECT_EQ(backend.submit_threads()[0], std::this_thread::get_id());
  backend.ReleaseOne();
  ASSERT_TRUE(first.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(first.status.ok());
  // Idle again: a request already cancelled is answered at once, here.
  auto item = MakeItem(&cancelled, 1, 4);
  item->is_cancelled = [] { return true; };
  ASSERT_TRUE(batcher.Enqueue(std::move(item)).ok());
  EXPECT_TRUE(cancelled.done.HasBeenNotified());
  EXPECT_EQ(cancelled.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(backend.batches().size(), 1u);
}

TEST(BatcherTest, WithNoDelayTheEnqueuingThreadFillsEveryFreeSlot) {
  for (const bool no_delay : {true, false}) {
    FakeBackend backend(2, /*hold=*/true);
    BatcherOptions options = Options(1000, 1 << 30, no_delay ? microseconds(0) : kForever);
    options.dispatch_when_idle = true;
    Batcher batcher(options, &backend);
    TestRequest a, b, c;
    ASSERT_TRUE(batcher.Enqueue(MakeItem(&a, 1, 4)).ok());
    ASSERT_EQ(backend.batches().size(), 1u);  // idle: submitted here either way
    ASSERT_TRUE(batcher.Enqueue(MakeItem(&b, 1, 4)).ok());
    if (no_delay) {
      // A slot is free and nothing is worth waiting for: submitted here too.
      ASSERT_EQ(backend.batches().size(), 2u);
      EXPECT_EQ(backend.submit_threads()[1], std::this_thread::get_id());
    } else {
      // The device is busy, so the request waits for company.
      EXPECT_EQ(backend.batches().size(), 1u);
    }
    ASSERT_TRUE(batcher.Enqueue(MakeItem(&c, 1, 4)).ok());
    // Both slots taken (no delay), or still gathering: c is queued.
    EXPECT_EQ(backend.batches().size(), no_delay ? 2u : 1u);
    // Completed on this thread, which refills the freed slot with what is
    // queued before ReleaseOne returns (with no delay; or with one, because
    // the backend is now idle and dispatch_when_idle), waking no one.
    backend.ReleaseOne();
    EXPECT_EQ(backend.batches().size(), no_delay ? 3u : 2u);
    EXPECT_EQ(backend.submit_threads().back(), std::this_thread::get_id());
    if (!no_delay) {
      EXPECT_EQ(backend.batches()[1].size(), 2u);  // b and c together
    }
    backend.ReleaseOne();
    if (no_delay) backend.ReleaseOne();
    for (TestRequest* r : {&a, &b, &c}) {
      ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
      EXPECT_TRUE(r->status.ok());
      EXPECT_EQ(r->output, r->input);
    }
  }
}

// A backend that runs each batch on the submitting thread, inside Submit
// (as the GPU backend does with a lone small batch), while another request
// arrives during the compute.
class InlineBackend final : public Backend {
 public:
  std::string Describe() const override { return "inline"; }
  int MaxBatchesInFlight() const override { return 1; }
  void Submit(std::unique_ptr<Batch> batch, Done done) override {
    int depth = 0;
    {
      absl::MutexLock lock(&mu_);
      depth = ++depth_by_thread_[std::this_thread::get_id()];
      max_depth_ = std::max(max_depth_, depth);
      ++batches_;
    }
    if (arrive_) arrive_();
    CopyInputsToOutputs(*batch);
    done(std::move(batch), BatchResult());
    absl::MutexLock lock(&mu_);
    --depth_by_thread_[std::this_thread::get_id()];
  }
  void set_arrive(std::function<void()> arrive) { arrive_ = std::move(arrive); }
  int max_depth() {
    absl::MutexLock lock(&mu_);
    return max_depth_;
  }
  int batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }

 private:
  std::function<void()> arrive_;
  absl::Mutex mu_;
  std::map<std::thread::id, int> depth_by_thread_ ABSL_GUARDED_BY(mu_);
  int max_depth_ ABSL_GUARDED_BY(mu_) = 0;
  int batches_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(BatcherTest, ABatchCompletedInsideSubmitDoesNotLaunchTheNextNested) {
  // Each compute sees the next request arrive, so every completion finds a
  // ready batch queued. Formed from inside that completion, the next launch
  // would nest in the previous one (Submit -> done -> Submit ...), one level
  // per request, on one thread; it must go to the batch former instead.
  InlineBackend backend;
  BatcherOptions options = Options(1, 1 << 30, microseconds(0));
  options.completion_threads = 0;
  Batcher batcher(options, &backend);
  constexpr int kRequests = 50;
  std::vector<TestRequest> requests(kRequests);
  std::atomic<int> next{1};
  backend.set_arrive([&] {
    const int i = next.fetch_add(1);
    if (i < kRequests) {
      ASSERT_TRUE(batcher.Enqueue(MakeItem(&requests[i], 1, 4)).ok());
    }
  });
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&requests[0], 1, 4)).ok());
  for (TestRequest& r : requests) {
    ASSERT_TRUE(r.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_TRUE(r.status.ok());
    EXPECT_EQ(r.output, r.input);
  }
  EXPECT_EQ(backend.batches(), kRequests);
  EXPECT_EQ(backend.max_depth(), 1);
}

TEST(BatcherTest, ManyConcurrentProducersAllCompleteWithIdleDispatch) {
  FakeBackend backend(2, /*hold=*/false);
  BatcherOptions options = Options(64, 1 << 30, microseconds(200));
  options.dispatch_when_idle = true;
  options.outputs_reuse_inputs = true;
  Batcher batcher(options, &backend);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 500;
  std::vector<std::unique_ptr<TestRequest>> requests;
  for (int i = 0; i < kThreads * kPerThread; ++i) requests.push_back(std::make_unique<TestRequest>());
  std::vector<std::string> expected(requests.size());
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int index = t * kPerThread + i;
        TestRequest* request = requests[index].get();
        auto item = MakeItem(request, 1 + i % 5, 8);
        item->input_buffer = &request->input;
        expected[index] = request->input;
        ASSERT_TRUE(batcher.Enqueue(std::move(item)).ok());
      }
    });
  }
  for (auto& producer : producers) producer.join();
  int64_t batched_requests = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(requests[i]->done.WaitForNotificationWithTimeout(absl::Seconds(20)));
    ASSERT_TRUE(requests[i]->status.ok());
    ASSERT_EQ(requests[i]->output, expected[i]);
    ASSERT_LE(requests[i]->timing.batch_rows, 64);
  }
  for (const auto& batch : backend.batches()) batched_requests += batch.size();
  EXPECT_EQ(batched_requests, kThreads * kPerThread);
  batcher.Stop();
}

TEST(BatcherTest, LargeBatchesAreAnsweredOffTheBackendThreadWhichIsFreedAtOnce) {
  FakeBackend backend(1, /*hold=*/true);
  BatcherOptions options = Options(1 << 20, 1 << 30, kForever);
  options.dispatch_when_idle = true;
  options.completion_threads = 3;
  options.offload_completion_bytes = 1000;
  Batcher batcher(options, &backend);
  // Answering the first batch's requests is held up until `gate` opens, as a
  // slow serialisation of large responses would be.
  absl::Notification gate;
  std::vector<std::unique_ptr<TestRequest>> first(6);
  absl::Mutex threads_mu;
  std::vector<std::thread::id> answered_on;
  // Six requests of 1 KiB each: queued while nothing is in flight would
  // dispatch the first at once, so the backend is made busy first.
  TestRequest opener;
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&opener, 1, 4)).ok());
  ASSERT_TRUE(backend.WaitForBatches(1));
  for (auto& request : first) {
    request = std::make_unique<TestRequest>();
    auto item = MakeItem(request.get(), 1, 256);
    auto answer = std::move(item->done);
    item->done = [&, answer = std::move(answer)](const absl::Status& status,
                                                  const RequestTiming& timing) {
      {
        absl::MutexLock lock(&threads_mu);
        answered_on.push_back(std::this_thread::get_id());
      }
      gate.WaitForNotificationWithTimeout(absl::Seconds(10));
      answer(status, timing);
    };
    ASSERT_TRUE(batcher.Enqueue(std::move(item)).ok());
  }
  backend.ReleaseOne();  // the opener; the six leave as one 6 KiB batch
  ASSERT_TRUE(backend.WaitForBatches(2));
  ASSERT_EQ(backend.batches()[1].size(), 6u);
  backend.ReleaseOne();  // returns although none of the six is answered yet
  EXPECT_FALSE(first[0]->done.HasBeenNotified());
  // The backend is free: the next request is computed while the six wait.
  TestRequest next;
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&next, 1, 4)).ok());
  ASSERT_TRUE(backend.WaitForBatches(3, absl::Seconds(5)));
  backend.ReleaseOne();
  ASSERT_TRUE(next.done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  {
    // Each of the three groups is held at its first request, each on its
    // own completion thread.
    absl::MutexLock lock(&threads_mu);
    auto three_started = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(threads_mu) {
      return answered_on.size() >= 3;
    };
    ASSERT_TRUE(threads_mu.AwaitWithTimeout(absl::Condition(&three_started), absl::Seconds(10)));
    EXPECT_EQ(answered_on.size(), 3u);
  }
  gate.Notify();
  for (auto& request : first) {
    ASSERT_TRUE(request->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_TRUE(request->status.ok());
    EXPECT_EQ(request->output, request->input);
    EXPECT_EQ(request->timing.batch_requests, 6);
  }
  absl::MutexLock lock(&threads_mu);
  ASSERT_EQ(answered_on.size(), 6u);
  std::vector<std::thread::id> distinct(answered_on.begin(), answered_on.begin() + 3);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  EXPECT_EQ(distinct.size(), 3u);  // 6 KiB in groups of at least 1000 bytes, 3 threads
  for (const std::thread::id id : distinct) EXPECT_NE(id, std::this_thread::get_id());
}

TEST(BatcherTest, BatchesOfManySmallRequestsAreAnsweredByTheCompletionThreads) {
  FakeBackend backend(1, /*hold=*/true);
  BatcherOptions options = Options(1 << 20, 1 << 30, kForever);
  options.dispatch_when_idle = true;
  options.completion_threads = 2;
  options.offload_completion_bytes = int64_t{1} << 40;  // never by bytes
  options.offload_completion_requests = 4;
  Batcher batcher(options, &backend);
  absl::Mutex threads_mu;
  std::vector<std::thread::id> answered_on;
  auto enqueue = [&](std::vector<std::unique_ptr<TestRequest>>& requests) {
    for (auto& request : requests) {
      request = std::make_unique<TestRequest>();
      auto item = MakeItem(request.get(), 1, 4);
      auto answer = std::move(item->done);
      item->done = [&, answer = std::move(answer)](const absl::Status& status,
                                                    const RequestTiming& timing) {
        {
          absl::MutexLock lock(&threads_mu);
          answered_on.push_back(std::this_thread::get_id());
        }
        answer(status, timing);
      };
      ASSERT_TRUE(batcher.Enqueue(std::move(item)).ok());
    }
  };
  // The first request dispatches alone (idle backend); the next eight
  // gather behind it into one batch of 8 (2 groups of 4), then three more
  // into a batch below the threshold.
  std::vector<std::unique_ptr<TestRequest>> opener(1), many(8), few(3);
  enqueue(opener);
  ASSERT_TRUE(backend.WaitForBatches(1));
  enqueue(many);
  // Released from this thread, so a batch answered "on the backend's
  // thread" is answered on this one.
  backend.ReleaseOne();
  ASSERT_TRUE(backend.WaitForBatches(2));
  ASSERT_EQ(backend.batches()[1].size(), 8u);
  enqueue(few);
  backend.ReleaseOne();
  ASSERT_TRUE(backend.WaitForBatches(3));
  ASSERT_EQ(backend.batches()[2].size(), 3u);
  backend.ReleaseOne();
  for (auto* group : {&opener, &many, &few}) {
    for (auto& request : *group) {
      ASSERT_TRUE(request->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
      EXPECT_TRUE(request->status.ok());
      EXPECT_EQ(request->output, request->input);
    }
  }
  absl::MutexLock lock(&threads_mu);
  ASSERT_EQ(answered_on.size(), 12u);
  const std::thread::id here = std::this_thread::get_id();
  // The opener and the batch of three: on the releasing (backend) thread.
  EXPECT_EQ(answered_on.front(), here);
  int elsewhere = 0;
  for (const std::thread::id id : answered_on) elsewhere += id != here;
  EXPECT_EQ(elsewhere, 8);  // exactly the batch of eight went to the completion threads
  for (auto& request : many) EXPECT_EQ(request->timing.batch_requests, 8);
}

TEST(BatcherTest, StopReturnsOnlyOnceLargeBatchesAreAnswered) {
  FakeBackend backend(1, /*hold=*/false);
  BatcherOptions options = Options(1 << 20, 1 << 30, milliseconds(1));
  options.completion_threads = 2;
  options.offload_completion_bytes = 100;
  auto batcher = std::make_unique<Batcher>(options, &backend);
  TestRequest slow;
  auto item = MakeItem(&slow, 4, 64);
  auto answer = std::move(item->done);
  item->done = [answer = std::move(answer)](const absl::Status& status,
                                            const RequestTiming& timing) {
    std::this_thread::sleep_for(milliseconds(100));
    answer(status, timing);
  };
  ASSERT_TRUE(batcher->Enqueue(std::move(item)).ok());
  ASSERT_TRUE(backend.WaitForBatches(1));
  batcher->Stop();
  EXPECT_TRUE(slow.done.HasBeenNotified());
  EXPECT_TRUE(slow.status.ok());
  batcher.reset();
}

// Lends every output it may (OutputView) and fails the segments whose first
// input byte is 'F'; records whether each segment accepted a view.
class LendingBackend final : public Backend {
 public:
  std::string Describe() const override { return "lending"; }
  void Submit(std::unique_ptr<Batch> batch, Done done) override {
    BatchResult result;
    result.output_views.resize(batch->segments.size());
    result.segment_status.resize(batch->segments.size());
    for (size_t i = 0; i < batch->segments.size(); ++i) {
      const Segment& s = batch->segments[i];
      accepted.push_back(s.output_view_ok);
      if (static_cast<const char*>(s.input)[0] == 'F') {
        result.segment_status[i] = absl::ResourceExhaustedError("no room");
      }
      if (s.output_view_ok) {
        auto kept = std::make_shared<std::string>(static_cast<const char*>(s.input),
                                                  static_cast<size_t>(s.bytes));
        result.output_views[i] = OutputView{kept->data(), s.bytes, kept};
      }
    }
    done(std::move(batch), std::move(result));
  }
  std::vector<bool> accepted;  // per segment, in submission order
};

TEST(BatcherTest, LentOutputsReachOnlyTheRequestsThatAcceptThemAndSucceeded) {
  LendingBackend backend;
  Batcher batcher(Options(3, 1 << 30, kForever), &backend);
  TestRequest a, b, c;
  OutputView a_view, c_view;
  auto item_a = MakeItem(&a, 1, 4);
  item_a->output_view = &a_view;
  auto item_b = MakeItem(&b, 1, 4);  // takes no view
  auto item_c = MakeItem(&c, 1, 4);
  c.input[0] = 'F';
  item_c->output_view = &c_view;
  ASSERT_TRUE(batcher.Enqueue(std::move(item_a)).ok());
  ASSERT_TRUE(batcher.Enqueue(std::move(item_b)).ok());
  ASSERT_TRUE(batcher.Enqueue(std::move(item_c)).ok());
  for (TestRequest* r : {&a, &b, &c}) {
    ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  EXPECT_EQ(backend.accepted, (std::vector<bool>{true, false, true}));
  EXPECT_TRUE(a.status.ok());
  ASSERT_NE(a_view.data, nullptr);
  EXPECT_EQ(std::string(a_view.data, static_cast<size_t>(a_view.bytes)), a.input);
  EXPECT_NE(a_view.owner, nullptr);
  EXPECT_TRUE(b.status.ok());
  EXPECT_EQ(c.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(c_view.data, nullptr);
  EXPECT_EQ(c_view.owner, nullptr);
}

// Stages every input it is offered into a buffer of its own, computes in
// place there (each byte complemented) and lends nothing.
class StagingInputsBackend final : public Backend {
 public:
  std::string Describe() const override { return "staging inputs"; }
  bool StageInput(Segment& segment) override {
    auto buffer = std::make_shared<std::string>(static_cast<const char*>(segment.input),
                                                static_cast<size_t>(segment.bytes));
    segment.input = buffer->data();
    segment.staged = buffer;
    ++staged;
    return true;
  }
  void Submit(std::unique_ptr<Batch> batch, Done done) override {
    for (const Segment& s : batch->segments) {
      in_place.push_back(s.output == s.input);
      const char* in = static_cast<const char*>(s.input);
      char* out = static_cast<char*>(s.output);
      for (int64_t i = 0; i < s.bytes; ++i) out[i] = static_cast<char>(~in[i]);
    }
    done(std::move(batch), BatchResult());
  }
  int staged = 0;
  std::vector<bool> in_place;
};

TEST(BatcherTest, StagedInputsAreComputedInPlaceAndAnsweredFromTheirBuffer) {
  StagingInputsBackend backend;
  BatcherOptions options = Options(2, 1 << 30, kForever);
  options.outputs_reuse_inputs = true;
  Batcher batcher(options, &backend);
  TestRequest a, b;
  OutputView a_view;
  auto item_a = MakeItem(&a, 1, 4);
  item_a->input_buffer = &a.input;
  item_a->output_view = &a_view;
  const std::string a_input = a.input;
  auto item_b = MakeItem(&b, 1, 4);  // takes no view: not staged, copied as before
  ASSERT_TRUE(batcher.Enqueue(std::move(item_a)).ok());
  EXPECT_TRUE(a.input.empty());  // staged at admission: the request's copy is freed
  ASSERT_TRUE(batcher.Enqueue(std::move(item_b)).ok());
  for (TestRequest* r : {&a, &b}) {
    ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_TRUE(r->status.ok()) << r->status;
  }
  EXPECT_EQ(backend.staged, 1);
  EXPECT_EQ(backend.in_place, (std::vector<bool>{true, false}));
  ASSERT_NE(a_view.data, nullptr);
  ASSERT_EQ(a_view.bytes, static_cast<int64_t>(a_input.size()));
  for (size_t i = 0; i < a_input.size(); ++i) {
    ASSERT_EQ(a_view.data[i], static_cast<char>(~a_input[i])) << i;
  }
  EXPECT_TRUE(a.output.empty());
  ASSERT_EQ(b.output.size(), b.input.size());
  for (size_t i = 0; i < b.input.size(); ++i) ASSERT_EQ(b.output[i], static_cast<char>(~b.input[i]));
}

}  // namespace
}  // namespace softmax::server
