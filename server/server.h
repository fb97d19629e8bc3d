// Server: everything softmax-server serves, wired from a ServerOptions, and
// the order it stops in. main.cc turns flags into options and signals into
// calls of Start, Drain and Wait; the tests (server_test.cc) run it in
// process.
//
// What Start wires, in order: the heap trimmer; the backends (--device) and
// their warm-up softmax and log-softmax, checked against the reference before
// anything listens; the metrics; the scheduler and the batcher; the token
// check; the memory budget; Admission, the one door into the batcher, and the
// FrontEnd every protocol shares; softmax.v1 (SoftmaxServiceImpl);
// the KServe v2 gRPC service and shared-memory regions; then the listeners
// (server/listener.h), started in order: /metrics, the gRPC server (health
// SERVING from here), the KServe HTTP endpoint; then the "listening" line and
// the listening file (server/listening_file.h).
//
// The drain (Drain, then Wait), step by step. Each step is a DrainStep,
// reported to ServerHooks::after_drain_step once done:
//   1. kNotServing: health NOT_SERVING for every service, softmax_serving 0,
//      so that balancers stop sending while calls are still answered.
//   2. kRefusing: Admission::StartDraining: new requests, on every
//      front-end, get a retryable UNAVAILABLE (the lame duck); idle streams
//      end UNAVAILABLE, busy ones once their last response is written.
//   3. kQueueFlushed: Batcher::Stop: what was queued is computed at once,
//      without the batching delay, and answered.
//   4. kLameDuckOver: kLameDuck (500 ms) waited out, "lame duck over;
//      closing the listeners" logged; every listener's StopAccepting, in
//      reverse order: /metrics and the HTTP endpoint start stopping, each on
//      a thread of its own (about a second each); gRPC keeps its port.
//   5. kRequestsAnswered: every accepted request answered, or the grace
//      deadline (--shutdown_grace_s after step 4; 5 s after a device fault)
//      passed, which is logged as a warning.
//   6. kRefusalsHeld: Admission::HoldRefusals: a gRPC unary call
//      (softmax.v1 Softmax, KServe ModelInfer) refused from here is held,
//      not answered, so that a closed-loop caller sends nothing into the
//      window where gRPC would cancel it. KServe HTTP holds none: it has no
//      such window (its refusal is a 503 the caller reads whole), and its
//      endpoint has been stopping since step 4.
//   7. kShutdownStarted: after kCloseLinger (callers read their last
//      responses), every listener's Shutdown, in reverse order:
//      grpc::Server::Shutdown starts on a thread of its own (it
//      sends the GOAWAY; it closes the idle connections
//      kCloseIdleConnectionsAfter after step 8 is due, or at the grace
//      deadline when some request is still in flight), and
//      kHoldRefusalsAfterShutdown passes.
//   8. kHeldCallsReleased: Admission::ReleaseHeldCalls: the held
//      calls are answered UNAVAILABLE. Drain returns here.
//   Wait then waits for every listener (Listener::Wait, in reverse order:
//   HTTP, gRPC, /metrics), and logs "stopped".
//
// Ownership: the Server owns everything it wires (backends, metrics,
// batcher, services, listeners) and the threads of its drain; what its
// accessors hand out lives as long as it does. Destroying it destroys them
// in the reverse order of Start, so that each outlives what uses it.
//
// Thread-safety: Start, then Drain, from one thread (Drain may run on
// another thread than Start did, once Start has returned); Wait from any
// thread, once; the accessors from any thread once Start returned OK. The
// signal mask of the thread calling Start is what every thread of the
// server inherits (softmax-server blocks its signals before).
#ifndef SOFTMAX_SERVER_SERVER_H_
#define SOFTMAX_SERVER_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "server/device.h"
#include "server/listener.h"
#include "server/memory_trim.h"
#include "server/metrics/metrics.h"
#include "server/rpc/auth.h"
#include "server/rpc/front_end.h"
#include "server/rpc/grpc/grpc_server.h"
#include "server/rpc/grpc/kserve_grpc.h"
#include "server/rpc/grpc/reset_guard.h"
#include "server/rpc/grpc/service.h"
#include "server/rpc/http/kserve_http.h"
#include "server/rpc/kserve.h"
#include "server/scheduling/admission.h"
#include "server/scheduling/batcher.h"
#include "server/scheduling/memory_budget.h"
#include "server/scheduling/scheduler.h"
#include "server/server_options.h"
#include "server/shm/shared_memory.h"

namespace softmax::server {

// The steps of Drain, in their order (see the top of this file).
enum class DrainStep {
  kNotServing,
  kRefusing,
  kQueueFlushed,
  kLameDuckOver,
  kRequestsAnswered,
  kRefusalsHeld,
  kShutdownStarted,
  kHeldCallsReleased,
};

// What the program around the server is told, and a seam for tests. Each
// may be empty.
struct ServerHooks {
  // Called once, on the faulting backend's thread, when a GPU hits a sticky
  // error (after "fatal GPU error" is logged and device_faulted() is set):
  // softmax-server raises its fault signal here to wake its signal loop.
  // Must not block.
  std::function<void()> on_device_fault;
  // Called on the draining thread as each step of Drain is done, before the
  // next starts; the drain waits while it runs. For tests, which look at
  // the server between steps; softmax-server sets none.
  std::function<void(DrainStep)> after_drain_step;
  // Makes the backends instead of --device (CreateBackends), from the
  // options Start would give them; Start then warms them up and serves on
  // them as on its own. For tests, which hand in a backend that answers
  // wrong or records what it ran; softmax-server sets none.
  std::function<absl::StatusOr<BackendChoice>(const BackendOptions&)> create_backends;
};

class Server {
 public:
  // Keeps `options` and `hooks`; starts nothing.
  explicit Server(ServerOptions options, ServerHooks hooks = {});
  // Drains and waits (Drain, then Wait) if Start succeeded and that was not
  // done yet; otherwise stops whatever a failed Start had brought up.
  ~Server();

  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Brings everything up (see the top of this file) and listens; health is
  // SERVING once it returns OK. Errors are the failing part's own status,
  // for the caller to report: Validate(options)'s INVALID_ARGUMENT first,
  // then INVALID_ARGUMENT for TLS files it cannot use,
  // FAILED_PRECONDITION for a GPU asked for and absent, INTERNAL for a
  // failed warm-up softmax, UNAVAILABLE for an address that cannot be bound,
  // FAILED_PRECONDITION for a --listening_file it cannot write.
  // The server is then unusable (destroy it).
  // REQUIRES: called once.
  absl::Status Start();

  // Runs steps 1 to 8 of the drain (see the top of this file) and returns
  // once the held calls are answered; Wait finishes the rest. A second call
  // returns at once. REQUIRES: Start returned OK.
  void Drain();

  // Blocks until Drain (from any thread) has run, then until the gRPC
  // server, /metrics and the HTTP endpoint have stopped; logs "stopped".
  // Every RPC has finished when it returns. REQUIRES: Start returned OK;
  // called at most once.
  void Wait();

  // Re-reads --auth_tokens_file (SIGHUP). FAILED_PRECONDITION when the
  // server has no tokens file; the file's own error when it cannot be read,
  // and then the previous tokens stay.
  absl::Status ReloadAuthTokens();

  // True once a GPU has hit a sticky error (the process should exit 2).
  bool device_faulted() const { return device_faulted_.load(); }
  // The bound gRPC port (0 before Start).
  int grpc_port() const { return grpc_ != nullptr ? grpc_->port() : 0; }
  // The bound host:port of the HTTP endpoint and of /metrics; "off" when
  // not served.
  std::string http_address() const;
  std::string metrics_address() const;
  // The metrics every request is recorded in; null without
  // --metrics_address.
  Metrics* metrics() const { return metrics_.get(); }

 private:
  void AfterStep(DrainStep step);

  const ServerOptions options_;
  const ServerHooks hooks_;

  // Members in the order they are built; destroyed in reverse, so that each
  // outlives what uses it. Set by the backends' fault handler: before them.
  std::atomic<bool> device_faulted_{false};
  std::unique_ptr<MemoryTrimmer> memory_trimmer_;
  BackendChoice choice_;
  // Destroyed before the backends its scrapes read.
  std::unique_ptr<Metrics> metrics_;
  // The scheduler runs the backends' slots; the batcher feeds it.
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<TokenAuthenticator> authenticator_;
  std::unique_ptr<MemoryBudget> budget_;
  std::unique_ptr<Admission> admission_;
  PrematureResetGuard reset_guard_;
  FrontEnd front_end_;
  std::unique_ptr<SoftmaxServiceImpl> service_;
  kserve::ModelStatistics kserve_statistics_;
  std::unique_ptr<DeviceMemoryMapper> memory_mapper_;
  std::unique_ptr<SharedMemoryManager> shared_memory_;
  std::unique_ptr<KServeGrpcService> kserve_service_;
  // The transports, in the order they start: /metrics (without
  // --metrics_address, none), gRPC, HTTP (without --http_address, none).
  // Drain and Wait drive them through the Listener calls only, in reverse;
  // each stops on threads of its own, joined by its Wait.
  std::vector<std::unique_ptr<Listener>> listeners_;
  // Into listeners_: health and the bound port are gRPC's own; the
  // addresses for the listening line (null: "off").
  GrpcListener* grpc_ = nullptr;
  Listener* http_ = nullptr;
  Listener* metrics_exposer_ = nullptr;

  absl::Notification drained_;  // Drain has run steps 1 to 8

  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // Start returned OK
  bool draining_ ABSL_GUARDED_BY(mu_) = false;  // Drain was called
  bool waited_ ABSL_GUARDED_BY(mu_) = false;    // Wait was called
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_SERVER_H_
