// softmax.v1.SoftmaxService on the gRPC callback API. Reactors only parse,
// validate and enqueue; the batcher's completion threads finish the RPCs.
//
// Unary `Softmax`: errors are gRPC statuses. `SoftmaxStream`: reads
// continuously; every request's response (or per-request `error`) is written
// in completion order, one write in flight at a time; the stream finishes OK
// after the client's writes-done once every response is written. A stream
// stops reading while `max_stream_pending` of its responses are unwritten
// (flow control against clients that write without reading). A big tensor
// may come in chunks (softmax.proto: chunk_offset, more_chunks): assembled
// per request_id (server/rpc/chunk_assembler.h), computed whole, and
// answered in chunks that reference the output instead of copying it.
//
// Both methods take and give raw byte buffers (server/rpc/wire.h): requests are
// parsed here, and a response may reference its output where the backend
// left it (OutputView) instead of a copy. On the wire nothing differs.
//
// Thread-safety: gRPC calls the service from its own threads.
#ifndef SOFTMAX_SERVER_RPC_SERVICE_H_
#define SOFTMAX_SERVER_RPC_SERVICE_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/scheduling/batcher.h"
#include "server/metrics/metrics.h"
#include "server/rpc/auth.h"
#include "server/rpc/memory_budget.h"
#include "server/rpc/reset_guard.h"
#include "server/rpc/tensor_buffer_pool.h"
#include "server/rpc/validation.h"
#include "softmax/v1/softmax.grpc.pb.h"

namespace softmax::server {

// Tensors a request keeps outside its messages (shared-memory regions,
// server/shm/): the input is read from `input` instead of
// request.input().data(), the output written into `output` instead of the
// response. Both stay valid until the request is answered.
struct ExternalTensors {
  const char* input = nullptr;  // null: the input is in the request
  int64_t input_bytes = 0;
  MemoryKind input_memory = MemoryKind::kHost;
  int input_device = -1;
  char* output = nullptr;  // null: the output goes into the response
  int64_t output_bytes = 0;
  MemoryKind output_memory = MemoryKind::kHost;
  int output_device = -1;
  // With `input`: the input is in a backend's staging (AllocateStaging),
  // kept alive by this, and is computed there without another copy; the
  // answer is then a view of that memory, so Dispatch needs a `view`.
  std::shared_ptr<const void> input_staged;
};

// Gives a finished call's large strings back to `pool`.
void RecycleBuffers(TensorBufferPool* pool, v1::SoftmaxRequest* request,
                    v1::SoftmaxResponse* response);

// An output left in the response's own string (echo, CPU backend) is sent
// by reference when it is large, as views are, instead of being copied into
// a newly allocated message buffer: a no-op when `view` already holds one.
void LendLargeOutput(const std::shared_ptr<TensorBufferPool>& pool,
                     v1::SoftmaxResponse* response, OutputView* view);

struct ServiceOptions {
  RequestLimits limits;
  // --device=none: answer every valid request with its input, straight from
  // the reactor (timing all zero). Measures the transport alone.
  bool echo = false;
  // Responses a stream may have unwritten (queued, computing or waiting to be
  // written) before it stops reading more requests.
  int max_stream_pending = 1024;
  // A stream open longer than this stops reading, answers what it has read
  // and ends with UNAVAILABLE ("reopen"), so that a long-lived stream moves
  // to a new connection (and perhaps a new replica) like a unary caller
  // does after the connection's max age. Messages the client sent that were
  // not read are not computed and may be sent again. 0: streams live on.
  std::chrono::milliseconds max_stream_age{0};
  // When set (--auth_tokens_file), every call must carry one of its tokens,
  // else it fails UNAUTHENTICATED. Must outlive the service.
  const TokenAuthenticator* authenticator = nullptr;
  // When set (--max_held_bytes), the bound on the tensor bytes requests hold
  // until answered. Must outlive the service.
  MemoryBudget* budget = nullptr;
};

// Both methods on the callback API, with raw byte buffers (see above).
using RawSoftmaxService = v1::SoftmaxService::WithRawCallbackMethod_Softmax<
    v1::SoftmaxService::WithRawCallbackMethod_SoftmaxStream<v1::SoftmaxService::Service>>;

class SoftmaxServiceImpl final : public RawSoftmaxService {
 public:
  // `batcher` may be null only when options.echo; `metrics` may be null.
  // Both must outlive the gRPC server this service is registered with.
  SoftmaxServiceImpl(const ServiceOptions& options, Batcher* batcher, Metrics* metrics);

  grpc::ServerUnaryReactor* Softmax(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* SoftmaxStream(
      grpc::CallbackServerContext* context) override;

  // Validates `*request` and starts it. Returns an error (done not called)
  // for a bad request or a full queue; otherwise `done` is called exactly
  // once with the outcome, possibly before Dispatch returns. On success
  // `response` holds request_id, output and timing. Both messages must live
  // until `done` has run. Once accepted, the request's input data may be
  // moved into the response's output (the batcher's outputs_reuse_inputs):
  // callers must not read request->input().data() after an OK return.
  // `view` (may be null) receives the output instead of the response when
  // the backend lends it (see WorkItem::output_view); it must live as long.
  // `external` (may be null) places the input or output outside the
  // messages; a region too small for the output is INVALID_ARGUMENT.
  // `held` receives the request's share of the memory budget: the caller
  // keeps it until the response is sent (null: it is given back once `done`
  // has run). UNAVAILABLE when the budget is spent. When `*held` is already
  // set, it is the request's share reserved earlier (a chunked request's,
  // from its first chunk on) and nothing more is reserved.
  absl::Status Dispatch(v1::SoftmaxRequest* request, v1::SoftmaxResponse* response,
                        OutputView* view,
                        std::chrono::system_clock::time_point deadline,
                        std::function<bool()> is_cancelled,
                        std::function<void(const absl::Status&)> done,
                        const ExternalTensors* external = nullptr,
                        std::shared_ptr<const void>* held = nullptr);

  // Lame duck: from now on every new request (unary or on a stream) is
  // refused with UNAVAILABLE, so callers retry elsewhere, while requests
  // already accepted run to completion. Open streams are finished with
  // UNAVAILABLE as soon as none of their requests is in flight (an idle one
  // at once), so they do not hold the exit. Call before
  // grpc::Server::Shutdown, which would answer calls it accepted but never
  // dispatched with CANCELLED (not retryable). Any thread; irreversible.
  void StartDraining();

  // The last step before grpc::Server::Shutdown: unary calls refused from
  // now on are held (not answered) until ReleaseHeldCalls. gRPC cancels
  // every call whose headers arrive between the start of Shutdown and the
  // client reading its GOAWAY; a client that waits for its previous answer
  // before calling again (closed loop) sends nothing into that window while
  // its refusal is held. REQUIRES: StartDraining was called.
  void HoldRefusals();
  // Answers the held calls with UNAVAILABLE. Call once Shutdown has sent
  // its GOAWAY (Shutdown waits for them: call it from another thread).
  void ReleaseHeldCalls();

  // Waits until no request is in flight (every accepted request's response
  // written), or until `deadline`; true when none is. Used on shutdown after
  // StartDraining: grpc::Server::Shutdown closes each connection as soon as
  // its last call ends, and closing a socket with unread input sends a TCP
  // reset that makes the peer discard responses it has not read yet. So the
  // server first waits here, then lingers briefly, then shuts down. An open
  // stream with nothing in flight does not count.
  bool WaitForRequestsInFlight(absl::Time deadline);

  // Requests accepted and not yet answered (unary calls, stream messages).
  int requests_in_flight();

  // Bookkeeping for the above, called by the reactors. Any thread.
  void RequestsStarted(int count);
  void RequestsEnded(int count);

  Metrics* metrics() const { return metrics_; }
  const RequestLimits& limits() const { return options_.limits; }
  std::chrono::milliseconds max_stream_age() const { return options_.max_stream_age; }
  // May be null (no --max_held_bytes).
  MemoryBudget* budget() const { return options_.budget; }
  // Where the calls' large tensor buffers come from and go back to.
  const std::shared_ptr<TensorBufferPool>& buffers() const { return buffers_; }
  // A backend's memory for an input that arrives in parts
  // (Backend::AllocateStaging), to dispatch as ExternalTensors::staged;
  // empty when no backend has any (the echo, the CPU). Any thread.
  StagingBuffer AllocateStaging(int64_t bytes) const {
    return options_.echo || batcher_ == nullptr ? StagingBuffer{}
                                                : batcher_->AllocateStaging(bytes);
  }

  // OK when tokens are off or `context` carries a known one; else
  // UNAUTHENTICATED. For the other front-ends on the same tokens.
  absl::Status Authenticate(const grpc::ServerContextBase& context) const {
    return options_.authenticator != nullptr ? options_.authenticator->Check(context)
                                             : absl::OkStatus();
  }
  const TokenAuthenticator* authenticator() const { return options_.authenticator; }

  // Open streams, for StartDraining. Called by the stream reactors.
  // Register returns false when draining has started: the stream must end.
  class Drainable {
   public:
    virtual ~Drainable() = default;
    // Starts ending the stream with UNAVAILABLE; true when the caller must
    // call FinishDrained (no request in flight), false when the stream
    // finishes by itself once its last response is written.
    virtual bool BeginDrain() = 0;
    virtual void FinishDrained() = 0;
  };
  bool RegisterStream(Drainable* stream);
  void UnregisterStream(Drainable* stream);
  // Whether a refused unary call must be held (HoldRefusals); when true,
  // `release` will be called with the refusal by ReleaseHeldCalls.
  bool HoldRefusal(std::function<void()> release);
  bool draining() const { return draining_.load(std::memory_order_relaxed); }
  // Calls reset before their message arrived, counted per connection; a
  // rapid-reset connection is shut down (reset_guard.h). Any thread.
  PrematureResetGuard& reset_guard() { return reset_guard_; }

 private:
  const ServiceOptions options_;
  Batcher* const batcher_;
  Metrics* const metrics_;
  const std::shared_ptr<TensorBufferPool> buffers_;
  std::atomic<bool> draining_{false};
  PrematureResetGuard reset_guard_;
  // Changed twice per request by every gRPC thread, so an atomic: as a
  // mutex it took 40% of the gRPC threads' lock time, streamed on 2 cores.
  std::atomic<int> requests_in_flight_{0};
  // Lock order: streams_mu_, then a stream's own lock.
  absl::Mutex streams_mu_;
  std::set<Drainable*> streams_ ABSL_GUARDED_BY(streams_mu_);
  bool holding_ ABSL_GUARDED_BY(streams_mu_) = false;
  std::vector<std::function<void()>> held_ ABSL_GUARDED_BY(streams_mu_);
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_SERVICE_H_
