// The batcher over the scheduler and fake backends: batch formation (row and
// byte limits, the delay, idle dispatch), admission, drops, errors, answers
// (on slot threads or completion threads), lent outputs, staged inputs and
// top Ks (sized for the backend, no whole output unless asked).
#include "server/scheduling/batcher.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/scheduling/scheduler.h"
#include "server/testing/test_backends.h"

namespace softmax::server {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using testing::FakeBackend;
using testing::FakeBackendOptions;
using testing::kWait;
using testing::MakeItem;
using testing::RecordingObserver;
using testing::TestRequest;

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

FakeBackendOptions Fake(int slots, bool hold) {
  FakeBackendOptions options;
  options.slots = slots;
  options.hold = hold;
  return options;
}

constexpr microseconds kForever = std::chrono::seconds(100);

// Large batches, dispatched as soon as the backend is idle, answered by
// `completion_threads` threads when they are offloaded (the tests set when).
BatcherOptions CompletionThreadOptions(int completion_threads) {
  BatcherOptions options = Options(1 << 20, 1 << 30, kForever);
  options.dispatch_when_idle = true;
  options.completion_threads = completion_threads;
  return options;
}

// How long a test watches for something that must not happen.
constexpr absl::Duration kQuiet = absl::Milliseconds(50);

TEST(BatcherTest, RowLimitClosesBatches) {
  FakeBackend backend(Fake(1, /*hold=*/true));
  Scheduler scheduler({&backend});
  Batcher batcher(Options(10, 1 << 30, kForever), &scheduler);
  TestRequest r[5];
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[0], 4, 8)).ok());
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[1], 4, 8)).ok());
  EXPECT_FALSE(backend.WaitForBatches(1, kQuiet));         // 8 rows < 10: waits
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[2], 4, 8)).ok());  // 12 queued: ready
  ASSERT_TRUE(backend.WaitForBatches(1));
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[3], 4, 8)).ok());
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[4], 4, 8)).ok());
  // The one slot is busy: the next batch waits for it though 12 rows are queued.
  EXPECT_FALSE(backend.WaitForBatches(2, kQuiet));
  backend.ReleaseOne();
  ASSERT_TRUE(backend.WaitForBatches(2));
  backend.ReleaseOne();
  ASSERT_TRUE(r[3].Wait());
  // r[4] alone (4 rows) waits for the delay, which is long.
  EXPECT_FALSE(backend.WaitForBatches(3, kQuiet));
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
    ASSERT_TRUE(request.done.HasBeenNotified());  // Stop returned: all answered
    EXPECT_TRUE(request.status.ok()) << request.status;
    EXPECT_EQ(request.output, request.input);  // the backend wrote into the response
  }
  EXPECT_EQ(r[0].timing.batch_requests, 2);
  EXPECT_EQ(r[0].timing.batch_rows, 8);
  EXPECT_EQ(r[0].timing.compute_ns, 555);
  EXPECT_EQ(r[4].timing.batch_requests, 1);
  EXPECT_EQ(r[4].timing.batch_rows, 4);
  EXPECT_GE(r[4].timing.queue_ns, 100 * 1000 * 1000);  // it waited 2 x 50 ms above at least
  EXPECT_EQ(backend.violations(), 0);
}

TEST(BatcherTest, ByteLimitClosesBatches) {
  FakeBackend backend(Fake(1, /*hold=*/true));
  Scheduler scheduler({&backend});
  Batcher batcher(Options(1 << 30, 100, kForever), &scheduler);
  TestRequest r[3];
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[0], 1, 10)).ok());  // 40 bytes
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[1], 1, 10)).ok());  // 80
  EXPECT_FALSE(backend.WaitForBatches(1, kQuiet));
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[2], 1, 10)).ok());  // 120 >= 100
  ASSERT_TRUE(backend.WaitForBatches(1));
  EXPECT_EQ(backend.batches()[0].size(), 2u);  // a third would make 120 > 100
  backend.ReleaseOne();
  ASSERT_TRUE(r[1].Wait());
  std::thread stopper([&] { batcher.Stop(); });
  ASSERT_TRUE(backend.WaitForBatches(2));
  backend.ReleaseOne();
  stopper.join();
  ASSERT_EQ(backend.batch_count(), 2u);
  EXPECT_EQ(backend.batches()[1].size(), 1u);
  EXPECT_TRUE(r[2].status.ok());
}

TEST(BatcherTest, DelayClosesABatchOfOne) {
  FakeBackend backend;
  Scheduler scheduler({&backend});
  Batcher batcher(Options(1000, 1 << 30, milliseconds(30)), &scheduler);
  TestRequest r;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r, 2, 4)).ok());
  ASSERT_TRUE(r.Wait());
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(r.status.ok());
  EXPECT_GE(elapsed, milliseconds(30));
  EXPECT_GE(r.timing.queue_ns, 30 * 1000 * 1000);
  EXPECT_LT(r.timing.queue_ns, 10LL * 1000 * 1000 * 1000);
  EXPECT_EQ(r.timing.compute_ns, 1234);
  EXPECT_EQ(r.timing.kernel_ns, 1000);
  // The batch was stamped when it became ready, so the backend could time
  // its dispatch (at least 1 ns in the fake), and that reached the request.
  EXPECT_GT(r.timing.dispatch_ns, 0);
  EXPECT_LT(r.timing.dispatch_ns, 10LL * 1000 * 1000 * 1000);
  EXPECT_EQ(r.timing.batch_requests, 1);
}

TEST(BatcherTest, RequestsArrivingWithinTheDelayShareABatch) {
  FakeBackend backend;
  Scheduler scheduler({&backend});
  Batcher batcher(Options(1000, 1 << 30, milliseconds(500)), &scheduler);
  TestRequest r[4];
  for (TestRequest& request : r) ASSERT_TRUE(batcher.Enqueue(MakeItem(&request, 3, 4)).ok());
  for (TestRequest& request : r) ASSERT_TRUE(request.Wait());
  ASSERT_EQ(backend.batch_count(), 1u);
  EXPECT_EQ(r[3].timing.batch_requests, 4);
  EXPECT_EQ(r[3].timing.batch_rows, 12);
}

TEST(BatcherTest, OversizedRequestRunsAlone) {
  FakeBackend backend;
  Scheduler scheduler({&backend});
  Batcher batcher(Options(10, 1 << 30, kForever), &scheduler);
  TestRequest small, big, after;
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&small, 4, 2)).ok());
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&big, 50, 2)).ok());
  ASSERT_TRUE(big.Wait());
  ASSERT_TRUE(small.Wait());
  EXPECT_EQ(small.timing.batch_requests, 1);
  EXPECT_EQ(big.timing.batch_requests, 1);
  EXPECT_EQ(big.timing.batch_rows, 50);
  // A lone request over the byte limit also runs at once.
  FakeBackend backend2;
  Scheduler scheduler2({&backend2});
  Batcher bytes_batcher(Options(1 << 30, 64, kForever), &scheduler2);
  ASSERT_TRUE(bytes_batcher.Enqueue(MakeItem(&after, 1, 1000)).ok());
  ASSERT_TRUE(after.Wait());
  EXPECT_TRUE(after.status.ok());
  EXPECT_EQ(after.timing.batch_requests, 1);
}

TEST(BatcherTest, MixedSegmentsKeepTheirOwnParameters) {
  FakeBackend backend;
  Scheduler scheduler({&backend});
  Batcher batcher(Options(1000, 1 << 30, milliseconds(300)), &scheduler);
  TestRequest a, b, c;
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&a, 2, 100, DType::kFloat32, {1.0f, false})).ok());
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&b, 5, 3, DType::kFloat16, {0.5f, true})).ok());
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&c, 1, 7, DType::kBFloat16, {2.0f, false})).ok());
  for (TestRequest* r : {&a, &b, &c}) {
    ASSERT_TRUE(r->Wait());
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
  FakeBackend backend;
  RecordingObserver observer;
  Scheduler scheduler({&backend});
  Batcher batcher(Options(1000, 1 << 30, milliseconds(20)), &scheduler, &observer);
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
  for (TestRequest* r : {&expired, &cancelled, &live}) ASSERT_TRUE(r->Wait());
  EXPECT_EQ(expired.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(cancelled.status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(live.status.ok());
  EXPECT_TRUE(expired.output.empty());  // never computed
  EXPECT_EQ(expired.timing.batch_requests, 0);
  const auto batches = backend.batches();
  ASSERT_EQ(batches.size(), 1u);
  ASSERT_EQ(batches[0].size(), 1u);
  EXPECT_EQ(batches[0][0].input, live.input.data());
  EXPECT_EQ(live.timing.batch_requests, 1);
  EXPECT_EQ(observer.expired.load(), 1);
  EXPECT_EQ(observer.cancelled.load(), 1);
  batcher.Stop();
  EXPECT_EQ(observer.batches().size(), 1u);
}

TEST(BatcherTest, QueueFullIsUnavailableAndRetryable) {
  FakeBackend backend(Fake(1, /*hold=*/true));
  RecordingObserver observer;
  Scheduler scheduler({&backend});
  BatcherOptions options = Options(1 << 30, int64_t{1} << 40, kForever);
  options.max_queued_requests = 2;
  options.max_queued_bytes = 100;
  Batcher batcher(options, &scheduler, &observer);
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
  EXPECT_TRUE(r[0].status.ok());
  EXPECT_TRUE(r[1].status.ok());
  // Stopped: refused, retryable.
  EXPECT_EQ(batcher.Enqueue(MakeItem(&r[3], 1, 1)).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(r[3].done.HasBeenNotified());
}

TEST(BatcherTest, QueuedBytesBoundAdmission) {
  FakeBackend backend(Fake(1, /*hold=*/true));
  Scheduler scheduler({&backend});
  BatcherOptions options = Options(1 << 30, int64_t{1} << 40, kForever);
  options.max_queued_bytes = 100;
  Batcher batcher(options, &scheduler);
  TestRequest big, second;
  // An empty queue admits even a request larger than the byte bound.
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&big, 1, 50)).ok());  // 200 bytes
  EXPECT_EQ(batcher.Enqueue(MakeItem(&second, 1, 1)).code(), absl::StatusCode::kUnavailable);
  std::thread stopper([&] { batcher.Stop(); });
  ASSERT_TRUE(backend.WaitForBatches(1));
  backend.ReleaseOne();
  stopper.join();
  EXPECT_TRUE(big.status.ok());
  EXPECT_FALSE(second.done.HasBeenNotified());
}

TEST(BatcherTest, BackendErrorFailsEveryRequestOfTheBatch) {
  FakeBackend backend(Fake(1, /*hold=*/true));
  RecordingObserver observer;
  Scheduler scheduler({&backend});
  Batcher batcher(Options(2, 1 << 30, kForever), &scheduler, &observer);
  TestRequest a, b;
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&a, 1, 4)).ok());
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&b, 1, 4)).ok());
  ASSERT_TRUE(backend.WaitForBatches(1));
  backend.ReleaseOne(absl::InternalError("device fault"));
  for (TestRequest* r : {&a, &b}) {
    ASSERT_TRUE(r->Wait());
    EXPECT_EQ(r->status.code(), absl::StatusCode::kInternal);
    EXPECT_EQ(r->status.message(), "device fault");
  }
  batcher.Stop();
  const auto stats = observer.batches();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_FALSE(stats[0].ok);
  EXPECT_EQ(stats[0].requests, 2);
}

TEST(BatcherTest, PerSegmentStatusFailsOnlyThoseRequests) {
  FakeBackendOptions fake;
  fake.compute = [](int, Batch& batch, BatchResult& result) {
    testing::CopyInputsToOutputs(batch);
    result.segment_status.resize(batch.segments.size());
    result.segment_status[1] = absl::ResourceExhaustedError("does not fit");
  };
  FakeBackend backend(fake);
  Scheduler scheduler({&backend});
  Batcher batcher(Options(3, 1 << 30, kForever), &scheduler);
  TestRequest r[3];
  for (TestRequest& request : r) ASSERT_TRUE(batcher.Enqueue(MakeItem(&request, 1, 4)).ok());
  for (TestRequest& request : r) ASSERT_TRUE(request.Wait());
  EXPECT_TRUE(r[0].status.ok());
  EXPECT_EQ(r[1].status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(r[2].status.ok());
  EXPECT_EQ(r[2].output, r[2].input);
}

TEST(BatcherTest, PipelinesUpToTheSlots) {
  FakeBackend backend(Fake(2, /*hold=*/true));
  Scheduler scheduler({&backend});
  Batcher batcher(Options(1, 1 << 30, kForever), &scheduler);
  TestRequest r[3];
  for (TestRequest& request : r) ASSERT_TRUE(batcher.Enqueue(MakeItem(&request, 1, 4)).ok());
  ASSERT_TRUE(backend.WaitForHeld(2));
  EXPECT_FALSE(backend.WaitForBatches(3, kQuiet));
  EXPECT_EQ(backend.max_running(), 2);
  // On two slots, each on its own thread.
  const auto slots = backend.slots();
  EXPECT_EQ(std::set<int>(slots.begin(), slots.end()), (std::set<int>{0, 1}));
  const auto threads = backend.threads();
  EXPECT_NE(threads[0], threads[1]);
  backend.ReleaseOne();
  ASSERT_TRUE(backend.WaitForBatches(3));
  backend.ReleaseOne();
  backend.ReleaseOne();
  for (TestRequest& request : r) {
    ASSERT_TRUE(request.Wait());
    EXPECT_TRUE(request.status.ok());
  }
  EXPECT_EQ(backend.max_running(), 2);
  EXPECT_EQ(backend.violations(), 0);
}

TEST(BatcherTest, StopDrainsQueuedRequestsWithoutWaitingForTheDelay) {
  FakeBackend backend;
  Scheduler scheduler({&backend});
  Batcher batcher(Options(1 << 30, 1 << 30, kForever), &scheduler);
  TestRequest r[3];
  for (TestRequest& request : r) ASSERT_TRUE(batcher.Enqueue(MakeItem(&request, 2, 2)).ok());
  EXPECT_EQ(backend.batch_count(), 0u);
  const auto start = std::chrono::steady_clock::now();
  batcher.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));  // not 100 s
  for (TestRequest& request : r) {
    ASSERT_TRUE(request.done.HasBeenNotified());
    EXPECT_TRUE(request.status.ok());
  }
  EXPECT_EQ(backend.batch_count(), 1u);
  batcher.Stop();  // idempotent
}

// Producers on several threads; every request answered once, correctly,
// within the batch limits; with and without idle dispatch and a delay.
TEST(BatcherTest, ManyConcurrentProducersAllComplete) {
  for (const bool idle_dispatch : {false, true}) {
    FakeBackendOptions fake = Fake(2, false);
    fake.computes_in_place = idle_dispatch;
    FakeBackend backend(fake);
    Scheduler scheduler({&backend});
    BatcherOptions options = Options(64, 1 << 30, microseconds(200));
    options.dispatch_when_idle = idle_dispatch;
    Batcher batcher(options, &scheduler);
    constexpr int kThreads = 4;
    constexpr int kPerThread = 500;
    std::vector<std::unique_ptr<TestRequest>> requests;
    for (int i = 0; i < kThreads * kPerThread; ++i) {
      requests.push_back(std::make_unique<TestRequest>());
    }
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
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(requests[i]->Wait());
      ASSERT_TRUE(requests[i]->status.ok());
      ASSERT_EQ(requests[i]->output, expected[i]);
      ASSERT_LE(requests[i]->timing.batch_rows, 64);
    }
    batcher.Stop();
    size_t batched_requests = 0;
    for (const auto& batch : backend.batches()) batched_requests += batch.size();
    EXPECT_EQ(batched_requests, requests.size());
    EXPECT_LT(backend.batch_count(), requests.size());  // some were batched together
    for (const auto& request : requests) EXPECT_EQ(request->answers.load(), 1);
    EXPECT_EQ(backend.violations(), 0);
  }
}

TEST(BatcherTest, IdleBackendGetsALoneRequestAtOnceBusyOneLetsRequestsGather) {
  FakeBackend backend(Fake(2, /*hold=*/true));
  Scheduler scheduler({&backend});
  BatcherOptions options = Options(1000, 1 << 30, kForever);
  options.dispatch_when_idle = true;
  Batcher batcher(options, &scheduler);
  TestRequest r[4];
  // Nothing in flight: the first request is not kept waiting for the (very
  // long) delay.
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[0], 1, 4)).ok());
  ASSERT_TRUE(backend.WaitForHeld(1));
  // One batch in flight: a second slot is free, but the device is busy, so
  // the next requests gather instead of going one by one.
  for (int i = 1; i < 4; ++i) ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[i], 1, 4)).ok());
  EXPECT_FALSE(backend.WaitForBatches(2, kQuiet));
  // The device goes idle: everything gathered leaves as one batch.
  backend.ReleaseOne();
  ASSERT_TRUE(backend.WaitForBatches(2));
  backend.ReleaseOne();
  for (TestRequest& request : r) {
    ASSERT_TRUE(request.Wait());
    EXPECT_TRUE(request.status.ok()) << request.status;
    EXPECT_EQ(request.output, request.input);
  }
  const auto batches = backend.batches();
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].size(), 1u);
  EXPECT_EQ(batches[1].size(), 3u);
  EXPECT_LT(r[0].timing.queue_ns, 10LL * 1000 * 1000 * 1000);
  EXPECT_EQ(r[1].timing.batch_requests, 3);
}

TEST(BatcherTest, WithoutIdleDispatchALoneRequestWaitsForTheDelay) {
  FakeBackend backend;
  Scheduler scheduler({&backend});
  Batcher batcher(Options(1000, 1 << 30, kForever), &scheduler);
  TestRequest r;
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r, 1, 4)).ok());
  EXPECT_FALSE(backend.WaitForBatches(1, kQuiet));
  EXPECT_FALSE(r.done.HasBeenNotified());
  batcher.Stop();
  EXPECT_TRUE(r.done.HasBeenNotified());
  EXPECT_TRUE(r.status.ok());
}

// With no delay, every free slot takes a ready batch at once; with a delay
// and idle dispatch, a request arriving while a slot is busy waits for company.
TEST(BatcherTest, WithNoDelayEveryFreeSlotTakesAReadyBatch) {
  for (const bool no_delay : {true, false}) {
    SCOPED_TRACE(no_delay ? "no delay" : "delay");
    FakeBackend backend(Fake(2, /*hold=*/true));
    Scheduler scheduler({&backend});
    BatcherOptions options = Options(1000, 1 << 30, no_delay ? microseconds(0) : kForever);
    options.dispatch_when_idle = true;
    Batcher batcher(options, &scheduler);
    TestRequest a, b, c;
    ASSERT_TRUE(batcher.Enqueue(MakeItem(&a, 1, 4)).ok());
    ASSERT_TRUE(backend.WaitForHeld(1));  // idle: dispatched either way
    ASSERT_TRUE(batcher.Enqueue(MakeItem(&b, 1, 4)).ok());
    if (no_delay) {
      // A slot is free and nothing is worth waiting for: b runs there.
      ASSERT_TRUE(backend.WaitForHeld(2));
    } else {
      // The device is busy, so the request waits for company.
      EXPECT_FALSE(backend.WaitForBatches(2, kQuiet));
    }
    ASSERT_TRUE(batcher.Enqueue(MakeItem(&c, 1, 4)).ok());
    // Both slots taken (no delay), or still gathering: c is queued.
    EXPECT_FALSE(backend.WaitForBatches(no_delay ? 3 : 2, kQuiet));
    // The freed slot takes what is queued (with no delay; with one, because
    // the backend is now idle).
    backend.ReleaseOne();
    ASSERT_TRUE(backend.WaitForBatches(no_delay ? 3 : 2));
    if (!no_delay) {
      EXPECT_EQ(backend.batches()[1].size(), 2u);  // b and c together
    }
    backend.ReleaseOne();
    if (no_delay) backend.ReleaseOne();
    for (TestRequest* r : {&a, &b, &c}) {
      ASSERT_TRUE(r->Wait());
      EXPECT_TRUE(r->status.ok());
      EXPECT_EQ(r->output, r->input);
    }
    EXPECT_EQ(backend.max_running(), no_delay ? 2 : 1);
  }
}

// Batches run on the scheduler's slot threads, never on the thread that
// enqueues; and `done` is never called inside Enqueue, not even for a
// request dropped while the backend is idle.
TEST(BatcherTest, BatchesRunOnSlotThreadsNeverOnTheEnqueuingThread) {
  FakeBackend backend(Fake(2, /*hold=*/false));
  Scheduler scheduler({&backend});
  BatcherOptions options = Options(1000, 1 << 30, microseconds(0));
  options.dispatch_when_idle = true;
  options.completion_threads = 0;
  Batcher batcher(options, &scheduler);
  const std::thread::id here = std::this_thread::get_id();
  std::atomic<bool> inside_enqueue{false};
  std::atomic<int> answered_inside{0};
  constexpr int kRequests = 50;
  std::vector<std::unique_ptr<TestRequest>> requests;
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back(std::make_unique<TestRequest>());
    auto item = MakeItem(requests.back().get(), 1, 4);
    if (i % 10 == 3) item->is_cancelled = [] { return true; };
    auto answer = std::move(item->done);
    item->done = [&, answer = std::move(answer)](const absl::Status& status,
                                                  const RequestTiming& timing) {
      if (inside_enqueue.load() && std::this_thread::get_id() == here) answered_inside.fetch_add(1);
      answer(status, timing);
    };
    inside_enqueue = true;
    ASSERT_TRUE(batcher.Enqueue(std::move(item)).ok());
    inside_enqueue = false;
    // Every other request waits for its answer, so that many find the
    // backend idle.
    if (i % 2 == 0) {
      ASSERT_TRUE(requests.back()->Wait());
    }
  }
  for (auto& request : requests) ASSERT_TRUE(request->Wait());
  batcher.Stop();
  EXPECT_EQ(answered_inside.load(), 0);
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_NE(requests[i]->answered_on, here) << i;
    EXPECT_EQ(requests[i]->status.code(),
              i % 10 == 3 ? absl::StatusCode::kCancelled : absl::StatusCode::kOk);
  }
  const auto slot_threads = backend.slot_threads();
  ASSERT_EQ(slot_threads.size(), 2u);
  std::set<std::thread::id> slot_ids;
  for (const auto& [slot, id] : slot_threads) slot_ids.insert(id);
  EXPECT_EQ(slot_ids.count(here), 0u);
  for (const std::thread::id id : backend.threads()) {
    EXPECT_NE(id, here);
    EXPECT_EQ(slot_ids.count(id), 1u);
  }
  // Answered (no completion threads) on the slot thread that ran the batch,
  // or, dropped, on the slot thread that formed it.
  for (const auto& request : requests) EXPECT_EQ(slot_ids.count(request->answered_on), 1u);
  EXPECT_EQ(backend.violations(), 0);
}

// `done` runs with no batcher lock held: it may enqueue the next request
// (as a stream does when it resumes reading), here a chain of 50, each
// alone in its batch, on one slot.
TEST(BatcherTest, DoneMayEnqueueTheNextRequest) {
  FakeBackend backend;
  Scheduler scheduler({&backend});
  BatcherOptions options = Options(1, 1 << 30, microseconds(0));
  options.completion_threads = 0;
  Batcher batcher(options, &scheduler);
  constexpr int kRequests = 50;
  std::vector<TestRequest> requests(kRequests);
  std::function<void(int)> enqueue = [&](int i) {
    auto item = MakeItem(&requests[i], 1, 4);
    auto answer = std::move(item->done);
    item->done = [&, i, answer = std::move(answer)](const absl::Status& status,
                                                     const RequestTiming& timing) {
      if (i + 1 < kRequests) enqueue(i + 1);
      answer(status, timing);
    };
    ASSERT_TRUE(batcher.Enqueue(std::move(item)).ok());
  };
  enqueue(0);
  for (TestRequest& r : requests) {
    ASSERT_TRUE(r.Wait());
    EXPECT_TRUE(r.status.ok());
    EXPECT_EQ(r.output, r.input);
  }
  batcher.Stop();
  EXPECT_EQ(backend.batch_count(), static_cast<size_t>(kRequests));
  EXPECT_EQ(backend.max_running(), 1);
}

// Outputs take over their requests' input buffers (no allocation) only
// when every backend computes in place.
TEST(BatcherTest, OutputsTakeOverInputBuffersWhenEveryBackendComputesInPlace) {
  FakeBackendOptions in_place = Fake(1, false);
  in_place.computes_in_place = true;
  FakeBackend backend(in_place);
  Scheduler scheduler({&backend});
  ASSERT_TRUE(scheduler.ComputesInPlace());
  Batcher batcher(Options(1000, 1 << 30, milliseconds(50)), &scheduler);
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
    ASSERT_TRUE(r->Wait());
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

TEST(BatcherTest, OutputsAreFreshBuffersUnlessEveryBackendComputesInPlace) {
  // One backend that does not compute in place is enough to rule it out:
  // a batch may run on either.
  for (const bool other_in_place : {false, true}) {
    FakeBackendOptions a = Fake(1, false);
    a.name = "a";
    a.computes_in_place = other_in_place;
    FakeBackendOptions b = Fake(1, false);
    b.name = "b";
    b.computes_in_place = false;
    FakeBackend backend_a(a), backend_b(b);
    Scheduler scheduler({&backend_a, &backend_b});
    EXPECT_FALSE(scheduler.ComputesInPlace());
    Batcher batcher(Options(1000, 1 << 30, milliseconds(1)), &scheduler);
    TestRequest r;
    auto item = MakeItem(&r, 8, 64);
    item->input_buffer = &r.input;
    const char* const input_data = r.input.data();
    ASSERT_TRUE(batcher.Enqueue(std::move(item)).ok());
    ASSERT_TRUE(r.Wait());
    ASSERT_TRUE(r.status.ok());
    batcher.Stop();
    auto batches = backend_a.batches();
    for (const auto& batch : backend_b.batches()) batches.push_back(batch);
    ASSERT_EQ(batches.size(), 1u);
    EXPECT_NE(batches[0][0].output, batches[0][0].input);
    EXPECT_EQ(batches[0][0].input, input_data);
    EXPECT_EQ(r.input.size(), 8u * 64 * 4);
    EXPECT_EQ(r.output, r.input);
  }
}

TEST(BatcherTest, LargeBatchesAreAnsweredByCompletionThreadsAndTheSlotIsFreedAtOnce) {
  FakeBackend backend(Fake(1, /*hold=*/true));
  Scheduler scheduler({&backend});
  BatcherOptions options = CompletionThreadOptions(3);
  options.offload_completion_bytes = 1000;
  Batcher batcher(options, &scheduler);
  // Answering the large batch's requests is held up until `gate` opens, as
  // a slow serialisation of large responses would be.
  absl::Notification gate;
  std::vector<std::unique_ptr<TestRequest>> large(6);
  absl::Mutex threads_mu;
  std::vector<std::thread::id> answered_on;
  // Six requests of 1 KiB each: queued while nothing is in flight would
  // dispatch the first at once, so the backend is made busy first.
  TestRequest opener;
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&opener, 1, 4)).ok());
  ASSERT_TRUE(backend.WaitForHeld(1));
  for (auto& request : large) {
    request = std::make_unique<TestRequest>();
    auto item = MakeItem(request.get(), 1, 256);
    auto answer = std::move(item->done);
    item->done = [&, answer = std::move(answer)](const absl::Status& status,
                                                  const RequestTiming& timing) {
      {
        absl::MutexLock lock(&threads_mu);
        answered_on.push_back(std::this_thread::get_id());
      }
      gate.WaitForNotificationWithTimeout(kWait);
      answer(status, timing);
    };
    ASSERT_TRUE(batcher.Enqueue(std::move(item)).ok());
  }
  backend.ReleaseOne();  // the opener; the six leave as one 6 KiB batch
  ASSERT_TRUE(backend.WaitForHeld(1));
  ASSERT_EQ(backend.batch_count(), 2u);
  ASSERT_EQ(backend.batches()[1].size(), 6u);
  backend.ReleaseOne();
  // The slot is free although none of the six is answered yet: the next
  // request is computed while the six wait.
  TestRequest next;
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&next, 1, 4)).ok());
  ASSERT_TRUE(backend.WaitForBatches(3));
  backend.ReleaseOne();
  ASSERT_TRUE(next.Wait());
  EXPECT_TRUE(next.status.ok());
  for (auto& request : large) EXPECT_FALSE(request->done.HasBeenNotified());
  {
    // Each of the three groups is held at its first request, each on its
    // own completion thread.
    absl::MutexLock lock(&threads_mu);
    auto three_started = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(threads_mu) {
      return answered_on.size() >= 3;
    };
    ASSERT_TRUE(threads_mu.AwaitWithTimeout(absl::Condition(&three_started), kWait));
    EXPECT_EQ(answered_on.size(), 3u);
  }
  gate.Notify();
  for (auto& request : large) {
    ASSERT_TRUE(request->Wait());
    EXPECT_TRUE(request->status.ok());
    EXPECT_EQ(request->output, request->input);
    EXPECT_EQ(request->timing.batch_requests, 6);
  }
  const std::thread::id slot_thread = backend.slot_threads().at(0);
  EXPECT_EQ(opener.answered_on, slot_thread);  // small: answered on the slot's thread
  EXPECT_EQ(next.answered_on, slot_thread);
  absl::MutexLock lock(&threads_mu);
  ASSERT_EQ(answered_on.size(), 6u);
  std::vector<std::thread::id> distinct(answered_on.begin(), answered_on.begin() + 3);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  EXPECT_EQ(distinct.size(), 3u);  // 6 KiB in groups of at least 1000 bytes, 3 threads
  for (const std::thread::id id : answered_on) {
    EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_NE(id, slot_thread);
  }
}

TEST(BatcherTest, BatchesOfManySmallRequestsAreAnsweredByTheCompletionThreads) {
  FakeBackend backend(Fake(1, /*hold=*/true));
  Scheduler scheduler({&backend});
  BatcherOptions options = CompletionThreadOptions(2);
  options.offload_completion_bytes = int64_t{1} << 40;  // never by bytes
  options.offload_completion_requests = 4;
  Batcher batcher(options, &scheduler);
  auto enqueue = [&](std::vector<std::unique_ptr<TestRequest>>& requests) {
    for (auto& request : requests) {
      request = std::make_unique<TestRequest>();
      ASSERT_TRUE(batcher.Enqueue(MakeItem(request.get(), 1, 4)).ok());
    }
  };
  // The first request dispatches alone (idle backend); the next eight
  // gather behind it into one batch of 8 (2 groups of 4), then three more
  // into a batch below the threshold.
  std::vector<std::unique_ptr<TestRequest>> opener(1), many(8), few(3);
  enqueue(opener);
  ASSERT_TRUE(backend.WaitForHeld(1));
  enqueue(many);
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
      ASSERT_TRUE(request->Wait());
      EXPECT_TRUE(request->status.ok());
      EXPECT_EQ(request->output, request->input);
    }
  }
  const std::thread::id slot_thread = backend.slot_threads().at(0);
  // The opener and the batch of three: on the slot's thread; exactly the
  // batch of eight went to the completion threads.
  EXPECT_EQ(opener[0]->answered_on, slot_thread);
  for (auto& request : few) EXPECT_EQ(request->answered_on, slot_thread);
  std::set<std::thread::id> completion_threads;
  for (auto& request : many) {
    EXPECT_NE(request->answered_on, slot_thread);
    EXPECT_NE(request->answered_on, std::this_thread::get_id());
    completion_threads.insert(request->answered_on);
    EXPECT_EQ(request->timing.batch_requests, 8);
  }
  EXPECT_LE(completion_threads.size(), 2u);
}

TEST(BatcherTest, StopReturnsOnlyOnceLargeBatchesAreAnswered) {
  FakeBackend backend;
  Scheduler scheduler({&backend});
  BatcherOptions options = Options(1 << 20, 1 << 30, milliseconds(1));
  options.completion_threads = 2;
  options.offload_completion_bytes = 100;
  auto batcher = std::make_unique<Batcher>(options, &scheduler);
  TestRequest slow;
  absl::Notification answering;
  auto item = MakeItem(&slow, 4, 64);
  auto answer = std::move(item->done);
  item->done = [&answering, answer = std::move(answer)](const absl::Status& status,
                                                        const RequestTiming& timing) {
    answering.Notify();
    // A slow answer, on a completion thread.
    std::this_thread::sleep_for(milliseconds(100));
    answer(status, timing);
  };
  ASSERT_TRUE(batcher->Enqueue(std::move(item)).ok());
  ASSERT_TRUE(answering.WaitForNotificationWithTimeout(kWait));
  batcher->Stop();
  EXPECT_TRUE(slow.done.HasBeenNotified());
  EXPECT_TRUE(slow.status.ok());
  EXPECT_NE(slow.answered_on, backend.slot_threads().at(0));
  batcher.reset();
}

// Lends every output it may (OutputView) and fails the segments whose first
// input byte is 'F'; records whether each segment accepted a view.
TEST(BatcherTest, LentOutputsReachOnlyTheRequestsThatAcceptThemAndSucceeded) {
  absl::Mutex mu;
  std::vector<bool> accepted;  // per segment, in order
  FakeBackendOptions lending;
  lending.compute = [&](int, Batch& batch, BatchResult& result) {
    result.output_views.resize(batch.segments.size());
    result.segment_status.resize(batch.segments.size());
    for (size_t i = 0; i < batch.segments.size(); ++i) {
      const Segment& s = batch.segments[i];
      {
        absl::MutexLock lock(&mu);
        accepted.push_back(s.output_view_ok);
      }
      if (static_cast<const char*>(s.input)[0] == 'F') {
        result.segment_status[i] = absl::ResourceExhaustedError("no room");
      }
      if (s.output_view_ok) {
        auto kept = std::make_shared<std::string>(static_cast<const char*>(s.input),
                                                  static_cast<size_t>(s.bytes));
        result.output_views[i] = OutputView{kept->data(), s.bytes, kept};
      } else {
        std::memcpy(s.output, s.input, static_cast<size_t>(s.bytes));
      }
    }
  };
  FakeBackend backend(lending);
  Scheduler scheduler({&backend});
  Batcher batcher(Options(3, 1 << 30, kForever), &scheduler);
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
  for (TestRequest* r : {&a, &b, &c}) ASSERT_TRUE(r->Wait());
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(accepted, (std::vector<bool>{true, false, true}));
  }
  EXPECT_TRUE(a.status.ok());
  ASSERT_NE(a_view.data, nullptr);
  EXPECT_EQ(std::string(a_view.data, static_cast<size_t>(a_view.bytes)), a.input);
  EXPECT_NE(a_view.owner, nullptr);
  EXPECT_TRUE(b.status.ok());
  EXPECT_EQ(b.output, b.input);
  EXPECT_EQ(c.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(c_view.data, nullptr);
  EXPECT_EQ(c_view.owner, nullptr);
}

// A backend that stages every input it is offered into a buffer of its own
// and computes in place there (each byte complemented), lending nothing.
TEST(BatcherTest, StagedInputsAreComputedInPlaceAndAnsweredFromTheirBuffer) {
  absl::Mutex mu;
  std::vector<bool> in_place;
  FakeBackendOptions staging;
  staging.stage_inputs = true;
  staging.computes_in_place = true;
  staging.compute = [&](int, Batch& batch, BatchResult&) {
    {
      absl::MutexLock lock(&mu);
      for (const Segment& s : batch.segments) in_place.push_back(s.output == s.input);
    }
    testing::ComplementInputsIntoOutputs(batch);
  };
  FakeBackend backend(staging);
  Scheduler scheduler({&backend});
  Batcher batcher(Options(2, 1 << 30, kForever), &scheduler);
  TestRequest a, b;
  OutputView a_view;
  auto item_a = MakeItem(&a, 1, 4);
  item_a->input_buffer = &a.input;
  item_a->output_view = &a_view;
  const std::string a_input = a.input;
  auto item_b = MakeItem(&b, 1, 4);  // takes no view: not staged
  ASSERT_TRUE(batcher.Enqueue(std::move(item_a)).ok());
  EXPECT_TRUE(a.input.empty());  // staged at admission: the request's copy is freed
  ASSERT_TRUE(batcher.Enqueue(std::move(item_b)).ok());
  for (TestRequest* r : {&a, &b}) {
    ASSERT_TRUE(r->Wait());
    EXPECT_TRUE(r->status.ok()) << r->status;
  }
  EXPECT_EQ(backend.staged(), 1);
  {
    absl::MutexLock lock(&mu);
    // a in its staged buffer; b without an input buffer offered: a fresh output.
    EXPECT_EQ(in_place, (std::vector<bool>{true, false}));
  }
  ASSERT_NE(a_view.data, nullptr);
  ASSERT_EQ(a_view.bytes, static_cast<int64_t>(a_input.size()));
  for (size_t i = 0; i < a_input.size(); ++i) {
    ASSERT_EQ(a_view.data[i], static_cast<char>(~a_input[i])) << i;
  }
  EXPECT_TRUE(a.output.empty());
  ASSERT_EQ(b.output.size(), b.input.size());
  for (size_t i = 0; i < b.input.size(); ++i) {
    ASSERT_EQ(b.output[i], static_cast<char>(~b.input[i])) << i;
  }
}

TEST(BatcherTest, TopKIsSizedForTheBackendAndNoWholeOutputUnlessAsked) {
  absl::Mutex mu;
  std::vector<Segment> seen;
  std::thread::id slot_thread;
  FakeBackendOptions staging;
  staging.stage_inputs = true;
  staging.computes_in_place = true;
  staging.compute = [&](int, Batch& batch, BatchResult&) {
    {
      absl::MutexLock lock(&mu);
      for (const Segment& s : batch.segments) seen.push_back(s);
      slot_thread = std::this_thread::get_id();
    }
    // Each top K: values 0x5a bytes, indices 0, 1, ... per row.
    for (const Segment& s : batch.segments) {
      const int64_t count = s.shape.rows() * s.top_k;
      std::memset(s.top_k_values, 0x5a, static_cast<size_t>(count * ItemSize(s.dtype)));
      for (int64_t i = 0; i < count; ++i) s.top_k_indices[i] = i % s.top_k;
    }
    testing::ComplementInputsIntoOutputs(batch);
  };
  FakeBackend backend(staging);
  Scheduler scheduler({&backend});
  // 10 KB of inputs, 230 bytes of answers: answered on the slot's thread.
  BatcherOptions options = Options(64, 1 << 30, kForever);
  options.offload_completion_bytes = 1000;
  Batcher batcher(options, &scheduler);
  // a: the top 3 alone, staged (it offers a view); b: the top 2 and the
  // whole output, not staged.
  TestRequest a, b;
  OutputView a_view;
  TopKResult a_top_k, b_top_k;
  auto item_a = MakeItem(&a, 5, 1000, DType::kFloat16);
  item_a->input_buffer = &a.input;
  item_a->output_view = &a_view;
  item_a->segment.top_k = 3;
  item_a->segment.full_output = false;
  item_a->top_k = &a_top_k;
  auto item_b = MakeItem(&b, 2, 4);
  item_b->segment.top_k = 2;
  item_b->top_k = &b_top_k;
  ASSERT_TRUE(batcher.Enqueue(std::move(item_a)).ok());
  ASSERT_TRUE(batcher.Enqueue(std::move(item_b)).ok());
  batcher.Stop();
  for (TestRequest* r : {&a, &b}) {
    ASSERT_TRUE(r->Wait());
    EXPECT_TRUE(r->status.ok()) << r->status;
  }
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_EQ(seen[0].output, nullptr);
    EXPECT_FALSE(seen[0].output_view_ok);
    EXPECT_EQ(seen[0].top_k, 3);
    EXPECT_NE(seen[1].output, nullptr);
    EXPECT_TRUE(seen[1].full_output);
    EXPECT_EQ(a.answered_on, slot_thread);
    EXPECT_EQ(b.answered_on, slot_thread);
  }
  // Only the top K for a: no whole output, no view of its staged input.
  EXPECT_EQ(a_view.data, nullptr);
  EXPECT_TRUE(a.output.empty());
  EXPECT_EQ(a_top_k.values, std::string(5 * 3 * 2, '\x5a'));
  ASSERT_EQ(a_top_k.indices.size(), 5 * 3 * sizeof(int64_t));
  int64_t last = -1;
  std::memcpy(&last, a_top_k.indices.data() + 14 * sizeof(int64_t), sizeof(int64_t));
  EXPECT_EQ(last, 2);
  // b: both.
  EXPECT_EQ(b_top_k.values.size(), 2u * 2 * 4);
  EXPECT_EQ(b_top_k.indices.size(), 2u * 2 * sizeof(int64_t));
  ASSERT_EQ(b.output.size(), b.input.size());
  for (size_t i = 0; i < b.input.size(); ++i) {
    ASSERT_EQ(b.output[i], static_cast<char>(~b.input[i])) << i;
  }
}

}  // namespace
}  // namespace softmax::server
