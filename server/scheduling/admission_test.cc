// Admission without any transport: the memory budget reserved and given
// back on every exit path, the drain order (refuse new, finish admitted,
// end streams), echo, staging declined, held refusals, and the in-flight
// ticket under concurrency.
#include "server/scheduling/admission.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "server/scheduling/batcher.h"
#include "server/scheduling/scheduler.h"
#include "server/testing/test_backends.h"

namespace softmax::server {
namespace {

using testing::FakeBackend;
using testing::FakeBackendOptions;
using testing::MakeItem;
using testing::TestRequest;

constexpr int64_t kRows = 2, kN = 8;
constexpr int64_t kBytes = kRows * kN * 4;  // float32

// A batcher on one FakeBackend that holds every batch until released.
struct Held {
  explicit Held(int64_t max_queued_requests = 8192)
      : backend([] {
          FakeBackendOptions options;
          options.name = "adm";
          options.hold = true;
          return options;
        }()),
        scheduler({&backend}),
        batcher(
            [&] {
              BatcherOptions options;
              options.max_batch_rows = 1;
              options.max_queue_delay = std::chrono::microseconds(0);
              options.max_queued_requests = max_queued_requests;
              options.completion_threads = 0;
              return options;
            }(),
            &scheduler) {}
  ~Held() {
    while (backend.held() > 0) backend.ReleaseOne();
    batcher.Stop();
  }
  FakeBackend backend;
  Scheduler scheduler;
  Batcher batcher;
};

AdmissionRequest Request(TestRequest* request, int64_t held_bytes = 2 * kBytes) {
  AdmissionRequest admitted;
  admitted.item = MakeItem(request, kRows, kN);
  admitted.held_bytes = held_bytes;
  return admitted;
}

class Stream final : public Admission::Stream {
 public:
  explicit Stream(bool idle) : idle_(idle) {}
  bool BeginDrain() override {
    ++begun;
    return idle_;
  }
  void FinishDrained() override { ++finished; }
  std::atomic<int> begun{0}, finished{0};

 private:
  const bool idle_;
};

TEST(AdmissionTest, BudgetIsGivenBackOnceTheRequestIsAnswered) {
  Held held;
  MemoryBudget budget(10 * kBytes);
  Admission admission({/*echo=*/false, &budget}, &held.batcher);
  TestRequest request;
  ASSERT_TRUE(admission.Admit(Request(&request)).ok());
  EXPECT_EQ(budget.held(), 2 * kBytes);  // input and output, while computing
  ASSERT_TRUE(testing::Await([&] { return held.backend.held() == 1; }));
  held.backend.ReleaseOne();
  ASSERT_TRUE(request.Wait());
  EXPECT_TRUE(request.status.ok()) << request.status;
  EXPECT_TRUE(testing::Await([&] { return budget.held() == 0; }));
}

TEST(AdmissionTest, TheCallersShareIsKeptUntilItLetsGo) {
  Held held;
  MemoryBudget budget(10 * kBytes);
  Admission admission({false, &budget}, &held.batcher);
  TestRequest request;
  std::shared_ptr<const void> share;
  ASSERT_TRUE(admission.Admit(Request(&request), &share).ok());
  ASSERT_NE(share, nullptr);
  ASSERT_TRUE(testing::Await([&] { return held.backend.held() == 1; }));
  held.backend.ReleaseOne();
  ASSERT_TRUE(request.Wait());
  // Answered, not yet sent: still held.
  EXPECT_EQ(budget.held(), 2 * kBytes);
  share.reset();
  EXPECT_EQ(budget.held(), 0);

  // A share reserved earlier (a chunked request's) is not reserved again.
  std::shared_ptr<const void> earlier = budget.TryReserve(3 * kBytes);
  std::shared_ptr<const void> kept = earlier;
  TestRequest second;
  ASSERT_TRUE(admission.Admit(Request(&second), &kept).ok());
  EXPECT_EQ(budget.held(), 3 * kBytes);
  ASSERT_TRUE(testing::Await([&] { return held.backend.held() == 1; }));
  held.backend.ReleaseOne();
  ASSERT_TRUE(second.Wait());
}

TEST(AdmissionTest, ASpentBudgetRefusesBeforeAnythingIsQueued) {
  Held held;
  MemoryBudget budget(3 * kBytes);
  Admission admission({false, &budget}, &held.batcher);
  TestRequest first, second;
  ASSERT_TRUE(admission.Admit(Request(&first)).ok());
  std::shared_ptr<const void> share;
  const absl::Status refused = admission.Admit(Request(&second), &share);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.message().find("--max_held_bytes"), std::string::npos) << refused;
  EXPECT_EQ(share, nullptr);
  EXPECT_EQ(budget.held(), 2 * kBytes);  // the first's only
  EXPECT_EQ(second.answers.load(), 0);
  ASSERT_TRUE(testing::Await([&] { return held.backend.held() == 1; }));
  held.backend.ReleaseOne();
  ASSERT_TRUE(first.Wait());
  EXPECT_TRUE(testing::Await([&] { return budget.held() == 0; }));
}

TEST(AdmissionTest, AFullQueueKeepsNothingOfTheBudget) {
  Held held(/*max_queued_requests=*/1);
  MemoryBudget budget(100 * kBytes);
  Admission admission({false, &budget}, &held.batcher);
  TestRequest computing, queued, refused;
  ASSERT_TRUE(admission.Admit(Request(&computing)).ok());
  ASSERT_TRUE(testing::Await([&] { return held.backend.held() == 1; }));
  ASSERT_TRUE(admission.Admit(Request(&queued)).ok());
  std::shared_ptr<const void> share;
  const absl::Status full = admission.Admit(Request(&refused), &share);
  EXPECT_EQ(full.code(), absl::StatusCode::kUnavailable) << full;
  EXPECT_EQ(share, nullptr);
  EXPECT_EQ(budget.held(), 4 * kBytes);
  EXPECT_EQ(refused.answers.load(), 0);
  held.backend.ReleaseOne();
  ASSERT_TRUE(testing::Await([&] { return held.backend.held() == 1; }));
  held.backend.ReleaseOne();
  ASSERT_TRUE(computing.Wait());
  ASSERT_TRUE(queued.Wait());
  EXPECT_TRUE(testing::Await([&] { return budget.held() == 0; }));
}

TEST(AdmissionTest, DrainRefusesNewFinishesAdmittedAndEndsStreams) {
  Held held;
  MemoryBudget budget(100 * kBytes);
  Admission admission({false, &budget}, &held.batcher);
  Stream busy(/*idle=*/false), idle(/*idle=*/true);
  ASSERT_TRUE(admission.RegisterStream(&busy));
  ASSERT_TRUE(admission.RegisterStream(&idle));

  Admission::Ticket ticket = admission.Enter();
  TestRequest admitted;
  ASSERT_TRUE(admission.Admit(Request(&admitted)).ok());
  ASSERT_TRUE(testing::Await([&] { return held.backend.held() == 1; }));

  admission.StartDraining();
  EXPECT_TRUE(admission.draining());
  // The streams are told, and only the idle one is finished by the drain.
  EXPECT_EQ(busy.begun.load(), 1);
  EXPECT_EQ(busy.finished.load(), 0);
  EXPECT_EQ(idle.begun.load(), 1);
  EXPECT_EQ(idle.finished.load(), 1);
  Stream late(true);
  EXPECT_FALSE(admission.RegisterStream(&late));
  // New requests are refused, retryably, and reserve nothing.
  TestRequest refused;
  const absl::Status status = admission.Admit(Request(&refused));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("shutting down"), std::string::npos) << status;
  EXPECT_EQ(budget.held(), 2 * kBytes);
  // The admitted one is still computed and answered.
  EXPECT_FALSE(admission.WaitForInFlight(absl::Now() + absl::Milliseconds(20)));
  held.backend.ReleaseOne();
  ASSERT_TRUE(admitted.Wait());
  EXPECT_TRUE(admitted.status.ok()) << admitted.status;
  ticket.Release();
  EXPECT_TRUE(admission.WaitForInFlight(absl::Now() + absl::Seconds(10)));
  admission.UnregisterStream(&busy);
  admission.UnregisterStream(&idle);
}

TEST(AdmissionTest, EchoAnswersAtOnceWithTheInputMovedOrCopied) {
  Admission admission({/*echo=*/true, nullptr}, nullptr);
  // Moved: the input string is the output's now.
  TestRequest moved;
  AdmissionRequest request = Request(&moved);
  const std::string input = moved.input;
  request.input_string = &moved.input;
  ASSERT_TRUE(admission.Admit(std::move(request)).ok());
  ASSERT_EQ(moved.answers.load(), 1);  // before Admit returned
  EXPECT_TRUE(moved.status.ok());
  EXPECT_EQ(moved.output, input);
  EXPECT_TRUE(moved.input.empty());
  EXPECT_EQ(moved.timing.compute_ns, 0);
  // Copied: no string of its own.
  TestRequest copied;
  ASSERT_TRUE(admission.Admit(Request(&copied)).ok());
  EXPECT_EQ(copied.output, copied.input);
  // Into a caller's region.
  TestRequest region;
  AdmissionRequest into = Request(&region);
  std::string out(static_cast<size_t>(kBytes), 'x');
  into.item->fixed_output = out.data();
  ASSERT_TRUE(admission.Admit(std::move(into)).ok());
  EXPECT_EQ(out, region.input);
  EXPECT_TRUE(region.output.empty());
  // Staging is declined: nothing computes in place.
  EXPECT_EQ(admission.AllocateStaging(1 << 20).data, nullptr);
}

TEST(AdmissionTest, StagingIsDeclinedWithoutABackendThatStages) {
  Held held;
  Admission admission({false, nullptr}, &held.batcher);
  EXPECT_EQ(admission.AllocateStaging(1 << 20).data, nullptr);
}

TEST(AdmissionTest, RefusalsAreHeldOnlyBetweenHoldAndRelease) {
  Admission admission({true, nullptr}, nullptr);
  int answered = 0;
  EXPECT_FALSE(admission.HoldRefusal([&] { ++answered; }));
  admission.StartDraining();
  admission.HoldRefusals();
  EXPECT_TRUE(admission.HoldRefusal([&] { ++answered; }));
  EXPECT_TRUE(admission.HoldRefusal([&] { ++answered; }));
  EXPECT_EQ(answered, 0);
  admission.ReleaseHeldCalls();
  EXPECT_EQ(answered, 2);
  EXPECT_FALSE(admission.HoldRefusal([&] { ++answered; }));
  admission.ReleaseHeldCalls();
  EXPECT_EQ(answered, 2);
}

TEST(AdmissionTest, TicketsCountOnceUnderConcurrency) {
  Admission admission({true, nullptr}, nullptr);
  constexpr int kThreads = 8, kRounds = 20000;
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < kRounds; ++i) {
        Admission::Ticket a = admission.Enter();
        Admission::Ticket b = std::move(a);  // moved: still one count
        Admission::Ticket c;
        c = std::move(b);
        Admission::Ticket& same = c;
        c = std::move(same);  // self-move keeps it
        if (!c) ADD_FAILURE() << "a self-moved ticket lost its count";
        if (i % 2 == 0) c.Release();
        c.Release();  // twice: a no-op
      }
    });
  }
  Admission::Ticket outside = admission.Enter();
  go = true;
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(admission.in_flight(), 1);
  EXPECT_FALSE(admission.WaitForInFlight(absl::Now() + absl::Milliseconds(5)));
  { Admission::Ticket gone = std::move(outside); }
  EXPECT_EQ(admission.in_flight(), 0);
  EXPECT_TRUE(admission.WaitForInFlight(absl::Now()));
}

}  // namespace
}  // namespace softmax::server
