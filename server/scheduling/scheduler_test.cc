// The scheduler: one thread per slot of every backend, batches placed on
// the least-loaded backend, no Notify lost, capabilities combined over the
// backends, staging in turn, and a clean stop.
#include "server/scheduling/scheduler.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "server/scheduling/batcher.h"
#include "server/testing/test_backends.h"

namespace softmax::server {
namespace {

using std::chrono::microseconds;
using testing::AwaitThreadsAsleep;
using testing::FakeBackend;
using testing::FakeBackendOptions;
using testing::MakeItem;
using testing::RecordingObserver;
using testing::TestRequest;
using testing::ThreadsNamed;

FakeBackendOptions Fake(const std::string& name, int slots, bool hold) {
  FakeBackendOptions options;
  options.name = name;
  options.slots = slots;
  options.hold = hold;
  return options;
}

// Every request a batch of its own, formed as soon as a slot is free.
BatcherOptions OnePerBatch() {
  BatcherOptions options;
  options.max_batch_rows = 1;
  options.max_queue_delay = microseconds(0);
  options.dispatch_when_idle = false;
  options.completion_threads = 0;
  return options;
}

// Which of `backends` ran the request whose input is `request`'s; -1: none.
int RanOn(const std::vector<const FakeBackend*>& backends, const TestRequest& request) {
  for (size_t b = 0; b < backends.size(); ++b) {
    for (const auto& batch : backends[b]->batches()) {
      for (const Segment& s : batch) {
        if (s.input == request.input.data() || s.output == request.output.data()) {
          return static_cast<int>(b);
        }
      }
    }
  }
  return -1;
}

TEST(SchedulerTest, SlotsAndCapabilitiesCombineOverTheBackends) {
  FakeBackendOptions a = Fake("a", 2, false);
  FakeBackendOptions b = Fake("b", 3, false);
  FakeBackendOptions c = Fake("c", 0, false);  // counts as one slot
  a.computes_in_place = true;
  b.computes_in_place = true;
  FakeBackend backend_a(a), backend_b(b), backend_c(c);
  {
    Scheduler both({&backend_a, &backend_b});
    EXPECT_EQ(both.slots(), 5);
    EXPECT_TRUE(both.ComputesInPlace());
    ASSERT_EQ(both.backends().size(), 2u);
    EXPECT_EQ(both.backends()[1], &backend_b);
  }
  {
    // In place only when every backend computes in place.
    Scheduler mixed({&backend_a, &backend_c});
    EXPECT_EQ(mixed.slots(), 3);
    EXPECT_FALSE(mixed.ComputesInPlace());
    Scheduler one({&backend_c});
    EXPECT_FALSE(one.ComputesInPlace());
  }
}

// One thread per slot, named after its backend, each slot entered once on
// its own thread; Stop joins them all while they are idle, and is idempotent.
TEST(SchedulerTest, RunsOneNamedThreadPerSlotAndStopJoinsThemWhenIdle) {
  FakeBackend gpu(Fake("cuda:7", 3, false));
  FakeBackend cpu(Fake("cpu7", 1, false));
  auto scheduler = std::make_unique<Scheduler>(std::vector<Backend*>{&gpu, &cpu});
  auto batcher = std::make_unique<Batcher>(OnePerBatch(), scheduler.get());
  ASSERT_TRUE(AwaitThreadsAsleep("sm-cuda7-s", 3));
  ASSERT_TRUE(AwaitThreadsAsleep("sm-cpu7-s", 1));
  std::set<std::string> names;
  for (const auto& thread : ThreadsNamed("sm-cuda7-s")) names.insert(thread.first);
  for (const auto& thread : ThreadsNamed("sm-cpu7-s")) names.insert(thread.first);
  EXPECT_EQ(names, (std::set<std::string>{"sm-cuda7-s0", "sm-cuda7-s1", "sm-cuda7-s2",
                                          "sm-cpu7-s0"}));
  EXPECT_EQ(gpu.slot_threads().size(), 3u);
  EXPECT_EQ(cpu.slot_threads().size(), 1u);
  // Some work, then idle again (the threads poll for a while, then sleep).
  std::vector<std::unique_ptr<TestRequest>> requests;
  for (int i = 0; i < 20; ++i) {
    requests.push_back(std::make_unique<TestRequest>());
    ASSERT_TRUE(batcher->Enqueue(MakeItem(requests.back().get(), 1, 4)).ok());
  }
  for (auto& request : requests) ASSERT_TRUE(request->Wait());
  const auto start = std::chrono::steady_clock::now();
  batcher->Stop();  // stops the scheduler too
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_TRUE(testing::AwaitNoThreadsNamed("sm-cuda7-s"));
  EXPECT_TRUE(testing::AwaitNoThreadsNamed("sm-cpu7-s"));
  scheduler->Stop();  // idempotent
  batcher.reset();
  scheduler.reset();
  EXPECT_EQ(gpu.violations(), 0);
  EXPECT_EQ(cpu.violations(), 0);
  EXPECT_EQ(gpu.batch_count() + cpu.batch_count(), 20u);
}

// A Scheduler on a source of its own (no batcher): Stop right after Start,
// with every thread idle, returns promptly and leaves no thread behind.
TEST(SchedulerTest, StopRightAfterStartJoinsCleanly) {
  class EmptySource final : public BatchSource {
   public:
    std::unique_ptr<Batch> TakeBatch() override {
      ++looks;
      return nullptr;
    }
    void Complete(std::unique_ptr<Batch>, BatchResult, int) override { ++completed; }
    std::atomic<int> looks{0};
    std::atomic<int> completed{0};
  } source;
  FakeBackend a(Fake("idle-a", 2, false)), b(Fake("idle-b", 2, false));
  Scheduler scheduler({&a, &b});
  scheduler.Start(&source);
  // Notifies with nothing ready: looked for, nothing run.
  for (int i = 0; i < 10; ++i) scheduler.Notify();
  ASSERT_TRUE(testing::Await([&] { return source.looks.load() >= 4; }));
  const auto start = std::chrono::steady_clock::now();
  scheduler.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_TRUE(testing::AwaitNoThreadsNamed("sm-idle-"));
  EXPECT_EQ(source.completed.load(), 0);
  EXPECT_EQ(a.batch_count() + b.batch_count(), 0u);
  scheduler.Stop();
}

// With two backends of two slots each, a batch goes to a waiting thread of
// the backend with the fewest busy slots: held batches alternate between
// them, and every slot of both is used when enough batches are ready.
TEST(SchedulerTest, BatchesGoToTheLeastLoadedBackendAndFillEverySlot) {
  FakeBackend a(Fake("ll-a", 2, true)), b(Fake("ll-b", 2, true));
  const std::vector<const FakeBackend*> backends = {&a, &b};
  Scheduler scheduler({&a, &b});
  RecordingObserver observer;
  Batcher batcher(OnePerBatch(), &scheduler, &observer);
  // Every slot thread parked (none polls: none has run a batch yet).
  ASSERT_TRUE(AwaitThreadsAsleep("sm-ll-", 4));
  TestRequest r[5];
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[0], 1, 4)).ok());
  ASSERT_TRUE(testing::Await([&] { return a.held() + b.held() == 1; }));
  const int first = RanOn(backends, r[0]);
  ASSERT_GE(first, 0);
  // The thread that took it is held in Execute; the others parked again.
  ASSERT_TRUE(AwaitThreadsAsleep("sm-ll-", 4));
  // One busy slot on `first`, none on the other: the other takes the next.
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[1], 1, 4)).ok());
  ASSERT_TRUE(testing::Await([&] { return a.held() + b.held() == 2; }));
  EXPECT_EQ(RanOn(backends, r[1]), 1 - first);
  EXPECT_EQ(a.held(), 1);
  EXPECT_EQ(b.held(), 1);
  // Two more fill the last free slot of each backend; a fifth waits.
  ASSERT_TRUE(AwaitThreadsAsleep("sm-ll-", 4));
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[2], 1, 4)).ok());
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[3], 1, 4)).ok());
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&r[4], 1, 4)).ok());
  ASSERT_TRUE(a.WaitForHeld(2));
  ASSERT_TRUE(b.WaitForHeld(2));
  EXPECT_FALSE(testing::Await([&] { return a.batch_count() + b.batch_count() > 4; },
                              absl::Milliseconds(50)));
  // Every slot of both backends runs one batch, on its own thread.
  for (const FakeBackend* backend : backends) {
    const auto slots = backend->slots();
    EXPECT_EQ(std::set<int>(slots.begin(), slots.end()), (std::set<int>{0, 1}));
    const auto threads = backend->threads();
    EXPECT_EQ(std::set<std::thread::id>(threads.begin(), threads.end()).size(), 2u);
  }
  // A slot freed on `b`: the fifth runs there.
  b.ReleaseOne();
  ASSERT_TRUE(b.WaitForBatches(3));
  EXPECT_EQ(RanOn(backends, r[4]), 1);
  for (int i = 0; i < 2; ++i) a.ReleaseOne();
  for (int i = 0; i < 2; ++i) b.ReleaseOne();
  for (TestRequest& request : r) {
    ASSERT_TRUE(request.Wait());
    EXPECT_TRUE(request.status.ok());
    EXPECT_EQ(request.output, request.input);
  }
  batcher.Stop();
  // BatchStats::backend names the backend that ran each batch: the counts
  // agree with the fake backends' own records.
  std::map<int, int> by_backend;
  for (const BatchStats& stats : observer.batches()) ++by_backend[stats.backend];
  EXPECT_EQ(by_backend[0], static_cast<int>(a.batch_count()));
  EXPECT_EQ(by_backend[1], static_cast<int>(b.batch_count()));
  EXPECT_EQ(a.batch_count(), 2u);
  EXPECT_EQ(b.batch_count(), 3u);
  EXPECT_EQ(a.violations(), 0);
  EXPECT_EQ(b.violations(), 0);
}

// BatchStats::backend is the index, in the scheduler's order, of the
// backend that ran the batch: batches of distinct sizes are placed on known
// backends (one held on each) and their stats checked one by one.
TEST(SchedulerTest, BatchStatsNameTheBackendThatRanTheBatch) {
  FakeBackend a(Fake("bs-a", 1, true)), b(Fake("bs-b", 1, true));
  const std::vector<const FakeBackend*> backends = {&a, &b};
  Scheduler scheduler({&a, &b});
  RecordingObserver observer;
  BatcherOptions options = OnePerBatch();
  options.max_batch_rows = 100;
  Batcher batcher(options, &scheduler, &observer);
  TestRequest three, five;
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&three, 3, 4)).ok());
  ASSERT_TRUE(testing::Await([&] { return a.held() + b.held() == 1; }));
  // One slot each: the other backend is the only one free.
  ASSERT_TRUE(batcher.Enqueue(MakeItem(&five, 5, 4)).ok());
  ASSERT_TRUE(a.WaitForHeld(1));
  ASSERT_TRUE(b.WaitForHeld(1));
  const int three_on = RanOn(backends, three);
  const int five_on = RanOn(backends, five);
  ASSERT_GE(three_on, 0);
  EXPECT_EQ(five_on, 1 - three_on);
  a.ReleaseOne();
  b.ReleaseOne();
  ASSERT_TRUE(three.Wait());
  ASSERT_TRUE(five.Wait());
  batcher.Stop();
  const auto stats = observer.batches();
  ASSERT_EQ(stats.size(), 2u);
  for (const BatchStats& s : stats) {
    ASSERT_TRUE(s.rows == 3 || s.rows == 5) << s.rows;
    EXPECT_EQ(s.backend, s.rows == 3 ? three_on : five_on) << "rows " << s.rows;
    EXPECT_EQ(s.requests, 1);
    EXPECT_TRUE(s.ok);
  }
}

// Many producers, two backends of two slots, and no delay: every request is
// answered exactly once, correctly, whatever the interleaving of Notify
// with the slot threads' polling and sleeping. Also with a delay (the timer
// thread notifies) and with idle dispatch.
TEST(SchedulerTest, NotifyLosesNoBatchUnderManyConcurrentProducers) {
  struct Config {
    microseconds delay;
    bool idle_dispatch;
    int64_t rows;
  };
  for (const Config config : {Config{microseconds(0), false, 1}, Config{microseconds(0), true, 8},
                              Config{microseconds(100), true, 16}}) {
    SCOPED_TRACE(::testing::Message() << "delay " << config.delay.count() << " us, idle dispatch "
                                      << config.idle_dispatch << ", rows " << config.rows);
    FakeBackend a(Fake("st-a", 2, false)), b(Fake("st-b", 2, false));
    Scheduler scheduler({&a, &b});
    RecordingObserver observer;
    BatcherOptions options;
    options.max_batch_rows = config.rows;
    options.max_queue_delay = config.delay;
    options.dispatch_when_idle = config.idle_dispatch;
    options.completion_threads = 2;
    options.offload_completion_requests = 4;
    Batcher batcher(options, &scheduler, &observer);
    constexpr int kThreads = 6;
    constexpr int kPerThread = 1000;
    std::vector<std::unique_ptr<TestRequest>> requests;
    for (int i = 0; i < kThreads * kPerThread; ++i) {
      requests.push_back(std::make_unique<TestRequest>());
    }
    std::vector<std::thread> producers;
    for (int t = 0; t < kThreads; ++t) {
      producers.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          TestRequest* request = requests[t * kPerThread + i].get();
          ASSERT_TRUE(batcher.Enqueue(MakeItem(request, 1, 1 + i % 7)).ok());
          // Now and then a pause, so that slot threads go idle, poll and sleep.
          if (i % 97 == 0) std::this_thread::sleep_for(microseconds(300 + t * 200));
        }
      });
    }
    for (auto& producer : producers) producer.join();
    for (auto& request : requests) {
      ASSERT_TRUE(request->Wait()) << "a request was never answered";
      ASSERT_TRUE(request->status.ok());
      ASSERT_EQ(request->output, request->input);
    }
    batcher.Stop();
    size_t computed = 0;
    for (const FakeBackend* backend : {&a, &b}) {
      for (const auto& batch : backend->batches()) computed += batch.size();
      EXPECT_EQ(backend->violations(), 0);
    }
    EXPECT_EQ(computed, requests.size());
    for (const auto& request : requests) EXPECT_EQ(request->answers.load(), 1);
    int64_t observed = 0;
    std::map<int, size_t> by_backend;
    for (const BatchStats& stats : observer.batches()) {
      observed += stats.requests;
      ++by_backend[stats.backend];
    }
    EXPECT_EQ(observed, static_cast<int64_t>(requests.size()));
    EXPECT_EQ(by_backend[0], a.batch_count());
    EXPECT_EQ(by_backend[1], b.batch_count());
    EXPECT_LE(a.max_running(), 2);
    EXPECT_LE(b.max_running(), 2);
  }
}

// StageInput goes to the backends in turn; a backend that declines leaves
// the segment as it was.
TEST(SchedulerTest, StageInputRotatesOverTheBackends) {
  FakeBackendOptions a = Fake("sg-a", 1, false);
  FakeBackendOptions b = Fake("sg-b", 1, false);
  a.stage_inputs = true;
  b.stage_inputs = true;
  FakeBackend backend_a(a), backend_b(b);
  Scheduler scheduler({&backend_a, &backend_b});
  std::string data(64, 'x');
  for (int i = 0; i < 6; ++i) {
    Segment segment;
    segment.input = data.data();
    segment.bytes = static_cast<int64_t>(data.size());
    ASSERT_TRUE(scheduler.StageInput(segment));
    ASSERT_NE(segment.staged, nullptr);
    EXPECT_NE(segment.input, data.data());
    EXPECT_EQ(std::string(static_cast<const char*>(segment.input), data.size()), data);
    // In turn: a, b, a, b...
    EXPECT_EQ(backend_a.staged(), i / 2 + 1) << i;
    EXPECT_EQ(backend_b.staged(), (i + 1) / 2) << i;
  }
  FakeBackend declines(Fake("sg-c", 1, false));
  Scheduler declining({&declines});
  Segment segment;
  segment.input = data.data();
  segment.bytes = static_cast<int64_t>(data.size());
  EXPECT_FALSE(declining.StageInput(segment));
  EXPECT_EQ(segment.input, data.data());
  EXPECT_EQ(segment.staged, nullptr);

  // Through the batcher: requests that accept a view are staged at
  // admission, by each backend in turn.
  Batcher batcher(OnePerBatch(), &scheduler);
  TestRequest r[4];
  OutputView views[4];
  for (int i = 0; i < 4; ++i) {
    auto item = MakeItem(&r[i], 1, 4);
    item->output_view = &views[i];
    ASSERT_TRUE(batcher.Enqueue(std::move(item)).ok());
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(r[i].Wait());
    EXPECT_TRUE(r[i].status.ok());
    // Answered from the staged buffer, computed in place there.
    ASSERT_NE(views[i].data, nullptr);
    EXPECT_EQ(std::string(views[i].data, static_cast<size_t>(views[i].bytes)), r[i].input);
  }
  EXPECT_EQ(backend_a.staged(), 5);
  EXPECT_EQ(backend_b.staged(), 5);
}

}  // namespace
}  // namespace softmax::server
