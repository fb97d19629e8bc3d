// Admission without any transport: every Submit answered exactly once, the
// memory budget reserved and given back (once) on every exit path, the
// drain order (refuse new, finish admitted, end streams), echo, staging
// declined, refusals held for the responders that ask, and the in-flight
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
  // Waits until the backend holds one batch, then lets it compute; false if
  // none came.
  bool ReleaseTheHeldBatch() {
    if (!testing::Await([&] { return backend.held() == 1; })) return false;
    backend.ReleaseOne();
    return true;
  }
  FakeBackend backend;
  Scheduler scheduler;
  Batcher batcher;
};

// A validated [kRows, kN] float32 request (a pattern) answered into
// `request`'s strings.
InferenceRequest Request(TestRequest* request) {
  request->input.assign(static_cast<size_t>(kBytes), '\0');
  for (size_t i = 0; i < request->input.size(); ++i) {
    request->input[i] = static_cast<char>(i * 7 + 1);
  }
  InferenceRequest submitted;
  submitted.dims = {kRows, kN};
  submitted.input.data = request->input.data();
  submitted.input.bytes = kBytes;
  submitted.output.buffer = &request->output;
  submitted.tensor.valid = true;
  submitted.tensor.axis = 1;
  submitted.tensor.shape = SoftmaxShape{kRows, kN, 1};
  submitted.tensor.elements = kRows * kN;
  submitted.tensor.bytes = kBytes;
  return submitted;
}

Responder Answer(TestRequest* request, bool hold_refusals = false) {
  return Responder{testing::RecordAnswer(request), hold_refusals};
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
  admission.Submit(Request(&request), Answer(&request));
  EXPECT_EQ(request.answers.load(), 0);
  EXPECT_EQ(budget.held(), 2 * kBytes);  // input and output, while computing
  ASSERT_TRUE(held.ReleaseTheHeldBatch());
  ASSERT_TRUE(request.Wait());
  EXPECT_TRUE(request.status.ok()) << request.status;
  EXPECT_TRUE(testing::Await([&] { return budget.held() == 0; }));
}

TEST(AdmissionTest, TheCallersShareIsKeptUntilItLetsGo) {
  Held held;
  MemoryBudget budget(10 * kBytes);
  Admission admission({false, &budget}, &held.batcher);
  TestRequest request;
  Admission::Admitted share;
  admission.Submit(Request(&request), Answer(&request), &share);
  ASSERT_NE(share.budget, nullptr);
  ASSERT_TRUE(held.ReleaseTheHeldBatch());
  ASSERT_TRUE(request.Wait());
  // Answered, not yet sent: still held.
  EXPECT_EQ(budget.held(), 2 * kBytes);
  share.budget.reset();
  EXPECT_EQ(budget.held(), 0);

  // A share reserved earlier (a chunked request's) is not reserved again.
  std::shared_ptr<const void> earlier = budget.TryReserve(3 * kBytes);
  Admission::Admitted kept;
  kept.budget = earlier;
  TestRequest second;
  admission.Submit(Request(&second), Answer(&second), &kept);
  EXPECT_EQ(budget.held(), 3 * kBytes);
  ASSERT_TRUE(held.ReleaseTheHeldBatch());
  ASSERT_TRUE(second.Wait());
  EXPECT_TRUE(second.status.ok()) << second.status;
}

// A chunked request's share (Reserve): refused when it would pass the
// budget, keeping nothing; handed to Submit, which reserves nothing more;
// given back exactly once, when its holder lets go (a second release would
// leave the budget below zero).
TEST(AdmissionTest, AReservationIsTakenOnceAndGivenBackOnce) {
  Held held;
  MemoryBudget budget(10 * kBytes);
  Admission admission({false, &budget}, &held.batcher);
  absl::StatusOr<std::shared_ptr<const void>> refused = admission.Reserve(11 * kBytes);
  ASSERT_TRUE(refused.ok());  // an empty budget admits one request of any size
  refused->reset();
  absl::StatusOr<std::shared_ptr<const void>> first = admission.Reserve(3 * kBytes);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_NE(*first, nullptr);
  EXPECT_EQ(budget.held(), 3 * kBytes);
  refused = admission.Reserve(8 * kBytes);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("--max_held_bytes"), std::string::npos);
  EXPECT_EQ(budget.held(), 3 * kBytes);

  // Queued on its reservation: nothing more is reserved, and its caller
  // keeps the share until the answer is sent.
  Admission::Admitted kept;
  kept.budget = *std::move(first);
  TestRequest queued;
  admission.Submit(Request(&queued), Answer(&queued), &kept);
  EXPECT_EQ(budget.held(), 3 * kBytes);
  ASSERT_TRUE(held.ReleaseTheHeldBatch());
  ASSERT_TRUE(queued.Wait());
  EXPECT_TRUE(queued.status.ok()) << queued.status;
  EXPECT_EQ(budget.held(), 3 * kBytes);
  kept = Admission::Admitted{};
  EXPECT_EQ(budget.held(), 0);

  // Without a budget: no share, never refused.
  Admission unbounded({false, nullptr}, &held.batcher);
  absl::StatusOr<std::shared_ptr<const void>> none = unbounded.Reserve(1 << 30);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
}

TEST(AdmissionTest, ASpentBudgetRefusesBeforeAnythingIsQueued) {
  Held held;
  MemoryBudget budget(3 * kBytes);
  Admission admission({false, &budget}, &held.batcher);
  TestRequest first, second;
  admission.Submit(Request(&first), Answer(&first));
  Admission::Admitted share;
  admission.Submit(Request(&second), Answer(&second), &share);
  // Answered once, at once, with the refusal; nothing of it kept.
  ASSERT_EQ(second.answers.load(), 1);
  EXPECT_EQ(second.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status.message().find("--max_held_bytes"), std::string::npos)
      << second.status;
  EXPECT_EQ(share.budget, nullptr);
  EXPECT_FALSE(share.ticket);
  EXPECT_EQ(budget.held(), 2 * kBytes);  // the first's only
  ASSERT_TRUE(held.ReleaseTheHeldBatch());
  ASSERT_TRUE(first.Wait());
  EXPECT_TRUE(testing::Await([&] { return budget.held() == 0; }));
}

TEST(AdmissionTest, AFullQueueKeepsNothingOfTheBudget) {
  Held held(/*max_queued_requests=*/1);
  MemoryBudget budget(100 * kBytes);
  Admission admission({false, &budget}, &held.batcher);
  TestRequest computing, queued, refused;
  admission.Submit(Request(&computing), Answer(&computing));
  ASSERT_TRUE(testing::Await([&] { return held.backend.held() == 1; }));
  admission.Submit(Request(&queued), Answer(&queued));
  Admission::Admitted share;
  admission.Submit(Request(&refused), Answer(&refused), &share);
  ASSERT_EQ(refused.answers.load(), 1);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kUnavailable) << refused.status;
  EXPECT_EQ(share.budget, nullptr);
  EXPECT_FALSE(share.ticket);
  // Neither kept nor given back twice: exactly the two admitted ones'.
  EXPECT_EQ(budget.held(), 4 * kBytes);
  held.backend.ReleaseOne();
  ASSERT_TRUE(held.ReleaseTheHeldBatch());
  ASSERT_TRUE(computing.Wait());
  ASSERT_TRUE(queued.Wait());
  EXPECT_TRUE(testing::Await([&] { return budget.held() == 0; }));
  EXPECT_EQ(refused.answers.load(), 1);
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
  admission.Submit(Request(&admitted), Answer(&admitted));
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
  admission.Submit(Request(&refused), Answer(&refused));
  ASSERT_EQ(refused.answers.load(), 1);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status.message().find("shutting down"), std::string::npos)
      << refused.status;
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
  InferenceRequest request = Request(&moved);
  const std::string input = moved.input;
  request.input.buffer = &moved.input;
  admission.Submit(std::move(request), Answer(&moved));
  ASSERT_EQ(moved.answers.load(), 1);  // before Submit returned
  EXPECT_TRUE(moved.status.ok());
  EXPECT_EQ(moved.output, input);
  EXPECT_TRUE(moved.input.empty());
  EXPECT_EQ(moved.timing.compute_ns, 0);
  // Copied: no string of its own.
  TestRequest copied;
  admission.Submit(Request(&copied), Answer(&copied));
  ASSERT_EQ(copied.answers.load(), 1);
  EXPECT_EQ(copied.output, copied.input);
  // Into a caller's region.
  TestRequest region;
  InferenceRequest into = Request(&region);
  std::string out(static_cast<size_t>(kBytes), 'x');
  into.output.region = out.data();
  into.output.region_bytes = kBytes;
  admission.Submit(std::move(into), Answer(&region));
  ASSERT_EQ(region.answers.load(), 1);
  EXPECT_EQ(out, region.input);
  EXPECT_TRUE(region.output.empty());
  // Staging is declined: nothing computes in place.
  EXPECT_EQ(admission.AllocateStaging(1 << 20).data, nullptr);
}

TEST(AdmissionTest, AnUnvalidatedRequestIsAnsweredInternalNotComputed) {
  Admission admission({/*echo=*/true, nullptr}, nullptr);
  TestRequest request;
  InferenceRequest unchecked = Request(&request);
  unchecked.tensor.valid = false;
  admission.Submit(std::move(unchecked), Answer(&request));
  ASSERT_EQ(request.answers.load(), 1);
  EXPECT_EQ(request.status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(request.output.empty());
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

// Submit's refusals are held for a Responder that asks (gRPC unary), and
// only while refusals are held; answered at once for one that does not
// (streams, HTTP); each exactly once.
TEST(AdmissionTest, SubmitHoldsTheRefusalsOfRespondersThatAsk) {
  Admission admission({/*echo=*/true, nullptr}, nullptr);
  admission.StartDraining();
  TestRequest before_hold;
  admission.Submit(Request(&before_hold), Answer(&before_hold, /*hold_refusals=*/true));
  ASSERT_EQ(before_hold.answers.load(), 1);  // not holding yet: at once
  EXPECT_EQ(before_hold.status.code(), absl::StatusCode::kUnavailable);

  admission.HoldRefusals();
  TestRequest unary, stream;
  admission.Submit(Request(&unary), Answer(&unary, /*hold_refusals=*/true));
  admission.Submit(Request(&stream), Answer(&stream, /*hold_refusals=*/false));
  EXPECT_EQ(unary.answers.load(), 0);
  ASSERT_EQ(stream.answers.load(), 1);
  EXPECT_EQ(stream.status.code(), absl::StatusCode::kUnavailable);
  admission.ReleaseHeldCalls();
  ASSERT_EQ(unary.answers.load(), 1);
  EXPECT_EQ(unary.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(unary.status.message().find("shutting down"), std::string::npos) << unary.status;
  EXPECT_TRUE(unary.output.empty());
}

// Submit takes the request's in-flight ticket: kept by the caller's
// Admitted until the answer is sent, or by Submit until the responder has
// run; given back on every exit path, refusals included, exactly once.
TEST(AdmissionTest, SubmitTakesTheTicketAndEveryExitGivesItBack) {
  Held held(/*max_queued_requests=*/1);
  MemoryBudget budget(6 * kBytes);
  Admission admission({false, &budget}, &held.batcher);
  // Computed, kept by the caller: in flight until it lets go.
  TestRequest computing;
  Admission::Admitted kept;
  admission.Submit(Request(&computing), Answer(&computing), &kept);
  EXPECT_TRUE(kept.ticket);
  EXPECT_EQ(admission.in_flight(), 1);
  ASSERT_TRUE(testing::Await([&] { return held.backend.held() == 1; }));
  // Queued, kept by Submit: in flight until answered.
  TestRequest queued;
  admission.Submit(Request(&queued), Answer(&queued));
  EXPECT_EQ(admission.in_flight(), 2);
  // Refused, queue full.
  TestRequest full;
  Admission::Admitted refused_full;
  admission.Submit(Request(&full), Answer(&full), &refused_full);
  ASSERT_EQ(full.answers.load(), 1);
  EXPECT_EQ(full.status.code(), absl::StatusCode::kUnavailable) << full.status;
  EXPECT_FALSE(refused_full.ticket);
  EXPECT_EQ(admission.in_flight(), 2);
  // Refused, budget spent.
  std::shared_ptr<const void> hog = budget.TryReserve(2 * kBytes);
  ASSERT_NE(hog, nullptr);
  TestRequest spent;
  Admission::Admitted refused_spent;
  admission.Submit(Request(&spent), Answer(&spent), &refused_spent);
  ASSERT_EQ(spent.answers.load(), 1);
  EXPECT_NE(spent.status.message().find("--max_held_bytes"), std::string::npos) << spent.status;
  EXPECT_FALSE(refused_spent.ticket);
  EXPECT_EQ(admission.in_flight(), 2);
  hog.reset();
  // Unvalidated: refused before anything is taken.
  TestRequest unchecked;
  InferenceRequest invalid = Request(&unchecked);
  invalid.tensor.valid = false;
  admission.Submit(std::move(invalid), Answer(&unchecked));
  ASSERT_EQ(unchecked.answers.load(), 1);
  EXPECT_EQ(admission.in_flight(), 2);

  held.backend.ReleaseOne();
  ASSERT_TRUE(computing.Wait());
  EXPECT_EQ(admission.in_flight(), 2);  // answered, not yet sent
  kept = Admission::Admitted();
  ASSERT_TRUE(held.ReleaseTheHeldBatch());
  ASSERT_TRUE(queued.Wait());
  EXPECT_TRUE(testing::Await([&] { return admission.in_flight() == 0; }));

  // Draining: refused, nothing taken.
  admission.StartDraining();
  TestRequest late;
  Admission::Admitted refused_late;
  admission.Submit(Request(&late), Answer(&late), &refused_late);
  ASSERT_EQ(late.answers.load(), 1);
  EXPECT_FALSE(refused_late.ticket);
  EXPECT_EQ(admission.in_flight(), 0);
  EXPECT_TRUE(testing::Await([&] { return budget.held() == 0; }));
}

TEST(AdmissionTest, EchoKeepsTheTicketOnlyForACallerThatAsks) {
  Admission admission({/*echo=*/true, nullptr}, nullptr);
  TestRequest alone;
  admission.Submit(Request(&alone), Answer(&alone));
  ASSERT_EQ(alone.answers.load(), 1);
  EXPECT_EQ(admission.in_flight(), 0);
  TestRequest kept;
  Admission::Admitted admitted;
  admission.Submit(Request(&kept), Answer(&kept), &admitted);
  ASSERT_EQ(kept.answers.load(), 1);
  EXPECT_EQ(admission.in_flight(), 1);  // until the answer is sent
  admitted.ticket.Release();
  EXPECT_EQ(admission.in_flight(), 0);
}

// A stream's message holds the ticket taken at its read: Submit takes no
// second one, and a refusal leaves it to the stream (in flight until its
// answer is written).
TEST(AdmissionTest, ATicketTakenAtTheReadIsNotTakenAgain) {
  Held held;
  Admission admission({false, nullptr}, &held.batcher);
  TestRequest request;
  Admission::Admitted entry;
  entry.ticket = admission.Enter();
  admission.Submit(Request(&request), Answer(&request), &entry);
  EXPECT_EQ(admission.in_flight(), 1);
  ASSERT_TRUE(held.ReleaseTheHeldBatch());
  ASSERT_TRUE(request.Wait());
  EXPECT_EQ(admission.in_flight(), 1);
  entry = Admission::Admitted();
  EXPECT_EQ(admission.in_flight(), 0);

  admission.StartDraining();
  TestRequest refused;
  Admission::Admitted read;
  read.ticket = admission.Enter();
  admission.Submit(Request(&refused), Answer(&refused), &read);
  ASSERT_EQ(refused.answers.load(), 1);
  EXPECT_TRUE(read.ticket);  // the stream's, until its error is written
  EXPECT_EQ(admission.in_flight(), 1);
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
