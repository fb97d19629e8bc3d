// Admission: the one door from every front-end (softmax.v1 unary and
// stream, KServe gRPC unary and stream, KServe HTTP) into the batcher.
// Every way a request enters or is refused is here, the same for every
// protocol:
//
//   Submit()     a validated InferenceRequest (inference_request.h; the
//                front-ends validate it through server/rpc/dispatch.h)
//                takes its in-flight ticket (Shutdown waits for it) and is
//                  1. refused UNAVAILABLE while draining (retry elsewhere);
//                  2. refused UNAVAILABLE when the memory budget is spent
//                     (--max_held_bytes), before anything is allocated;
//                  3. answered at once with its input (echo, --device=none);
//                  4. or enqueued: UNAVAILABLE when the queue is full.
//                A refused request keeps neither ticket nor budget. Its
//                Responder is called exactly once, whichever way it ends;
//                a refusal is held (below) when the Responder asks for it.
//                What an admitted request keeps (Admitted: its ticket and
//                its share of the budget) the caller keeps until its answer
//                is sent, or Submit until the Responder has run.
//   Enter()      a stream's message counts as in flight from its read,
//                before it reaches Submit (a chunk of a request still being
//                assembled), until its answer is written or dropped: its
//                Ticket, handed to Submit in Admitted (RAII; it cannot be
//                counted twice or forgotten).
//   Reserve()    a chunked request's share of the memory budget, taken for
//                its whole input and output as its first chunk arrives
//                (before anything is allocated for it): UNAVAILABLE when the
//                budget is spent, as Submit's step 2. Handed to Submit in
//                Admitted.budget, which then reserves nothing more; given
//                back once, when the last copy of the lease goes (a failed
//                assembly's at once).
//   AllocateStaging()  a backend's memory for an input that arrives in
//                parts; declined (empty) in echo mode or with no backend
//                that stages.
//   Draining     StartDraining refuses every new request, lets admitted
//                ones finish and ends open streams (registered with
//                RegisterStream) once nothing of theirs is in flight;
//                HoldRefusals / ReleaseHeldCalls keep refused calls whose
//                Responder has hold_refusals (gRPC unary: softmax.v1
//                Softmax, KServe ModelInfer) unanswered across
//                grpc::Server::Shutdown's GOAWAY. Streams answer refusals
//                in band, and KServe HTTP sends its 503 at once: no GOAWAY
//                can cancel it (server/server.h, drain step 6).
//
// Validation (shapes, dtypes, limits) is the front-ends' (server/rpc/), as
// is what goes on the wire; Admission knows no protocol. Before a request
// reaches Submit, a front-end may refuse it: UNAUTHENTICATED (no known
// token, server/rpc/auth.h), CANCELLED (the call ended before its message
// arrived, counted by the rapid-reset guard), NOT_FOUND (no such KServe
// model), INVALID_ARGUMENT (server/rpc/dispatch.h, validation.h). After it,
// the batcher may still end it DEADLINE_EXCEEDED or CANCELLED before
// compute, and a backend fault fails its batch INTERNAL.
//
// Thread-safety: thread-safe; any method from any thread.
#ifndef SOFTMAX_SERVER_SCHEDULING_ADMISSION_H_
#define SOFTMAX_SERVER_SCHEDULING_ADMISSION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/scheduling/backend.h"
#include "server/scheduling/inference_request.h"
#include "server/scheduling/memory_budget.h"

namespace softmax::server {

struct AdmissionOptions {
  // --device=none: every admitted request is answered with its input, at
  // once, on the caller's thread (timing all zero). Measures the transport.
  bool echo = false;
  // When set (--max_held_bytes), the bound on the tensor bytes requests hold
  // until answered. Must outlive the Admission.
  MemoryBudget* budget = nullptr;
};

class Batcher;

class Admission {
 public:
  // `batcher` may be null only when options.echo. Both it and the budget
  // must outlive this.
  Admission(const AdmissionOptions& options, Batcher* batcher);

  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // A request counted as in flight until the ticket is destroyed (or
  // Release()d). Movable, not copyable: one count per ticket.
  // (Submit takes one; a stream takes one at each read, see Enter above.)
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept : admission_(std::exchange(other.admission_, nullptr)) {}
    Ticket& operator=(Ticket&& other) noexcept {
      if (this != &other) {
        Release();
        admission_ = std::exchange(other.admission_, nullptr);
      }
      return *this;
    }
    ~Ticket() { Release(); }
    void Release() {
      if (admission_ != nullptr) std::exchange(admission_, nullptr)->Leave();
    }
    explicit operator bool() const { return admission_ != nullptr; }

   private:
    friend class Admission;
    explicit Ticket(Admission* admission) : admission_(admission) {}
    Admission* admission_ = nullptr;
  };
  Ticket Enter();

  // What an admitted request keeps until its answer is sent; destroying it
  // gives both back. A caller that keeps one passes it to Submit and
  // destroys it once the answer is on its way (after `responder.done`).
  struct Admitted {
    Ticket ticket;                       // in flight (see in_flight())
    std::shared_ptr<const void> budget;  // its share of the memory budget
  };

  // Admits `request` (steps 1-4 above) and answers it through `responder`
  // exactly once: with its outcome, possibly before Submit returns, or with
  // a refusal (UNAVAILABLE), held until ReleaseHeldCalls when
  // responder.hold_refusals and refusals are being held. REQUIRES:
  // request.tensor.valid (validated), and what request.input and
  // request.output point to lives until `responder.done` has run.
  // `admitted` (may be null: then Submit keeps both until the responder has
  // run) receives the request's ticket and its share of the budget, unless
  // it holds them already: a ticket taken at a stream's read (Enter), a
  // share reserved as a chunked request arrived; nothing more is taken
  // then. A refused request keeps nothing that Submit took.
  void Submit(InferenceRequest request, Responder responder, Admitted* admitted = nullptr);

  // Reserves `bytes` of the memory budget (Reserve above) until the
  // returned lease is destroyed; a null lease (OK) when there is no budget.
  // UNAVAILABLE naming --max_held_bytes when the budget is spent: nothing
  // is kept then.
  absl::StatusOr<std::shared_ptr<const void>> Reserve(int64_t bytes);

  // A backend's memory for an input that arrives in parts, to hand in as
  // the item's segment.staged; empty in echo mode or when no backend has any.
  StagingBuffer AllocateStaging(int64_t bytes) const;

  // Open streams, told to end on StartDraining. RegisterStream returns false
  // when draining has started: the stream must end at once.
  class Stream {
   public:
    virtual ~Stream() = default;
    // Starts ending the stream with UNAVAILABLE; true when the caller must
    // call FinishDrained (no request in flight), false when the stream
    // finishes by itself once its last response is written.
    virtual bool BeginDrain() = 0;
    virtual void FinishDrained() = 0;
  };
  bool RegisterStream(Stream* stream);
  void UnregisterStream(Stream* stream);

  // Lame duck: every new request is refused with UNAVAILABLE from now on,
  // requests already admitted run to completion, and open streams end as
  // soon as none of their requests is in flight (an idle one at once).
  // Irreversible.
  void StartDraining();
  bool draining() const { return draining_.load(std::memory_order_relaxed); }

  // The last step before grpc::Server::Shutdown: gRPC unary refusals from now on
  // are held (HoldRefusal) until ReleaseHeldCalls, which answers them. gRPC
  // cancels calls whose headers arrive between the start of Shutdown and
  // the client reading its GOAWAY; a closed-loop client whose refusal is
  // held sends nothing into that window. REQUIRES: StartDraining was called.
  void HoldRefusals();
  // True when a refused call must be held: `release` answers it later.
  // (Submit does this for a Responder with hold_refusals.)
  bool HoldRefusal(std::function<void()> release);
  void ReleaseHeldCalls();

  // Requests in flight (tickets alive).
  int in_flight() const { return in_flight_.load(std::memory_order_acquire); }
  // Waits until none is in flight, or until `deadline`; true when none is.
  bool WaitForInFlight(absl::Time deadline) const;

  bool echo() const { return options_.echo; }
  // May be null (no --max_held_bytes).
  MemoryBudget* budget() const { return options_.budget; }

 private:
  // Answers a refusal: held (see HoldRefusals) when `hold` and holding.
  void Refuse(const absl::Status& status, Responder responder);
  void Leave() { in_flight_.fetch_sub(1, std::memory_order_acq_rel); }

  const AdmissionOptions options_;
  Batcher* const batcher_;
  std::atomic<bool> draining_{false};
  // Changed twice per request by every gRPC thread, so an atomic: as a
  // mutex it took 40% of the gRPC threads' lock time, streamed on 2 cores.
  std::atomic<int> in_flight_{0};
  // Lock order: streams_mu_, then a stream's own lock.
  absl::Mutex streams_mu_;
  std::set<Stream*> streams_ ABSL_GUARDED_BY(streams_mu_);
  bool holding_ ABSL_GUARDED_BY(streams_mu_) = false;
  std::vector<std::function<void()>> held_ ABSL_GUARDED_BY(streams_mu_);
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_SCHEDULING_ADMISSION_H_
