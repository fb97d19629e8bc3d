// Listener: one transport's port (the gRPC server, the KServe HTTP endpoint,
// the /metrics exposer) with the lifecycle every transport shares, after
// envoy's listeners. Server holds its listeners in one list, starts them in
// order and stops them in reverse, through these four calls only; a new
// transport plugs in by implementing them.
//
//   Start          binds the port and serves; the bound address is then
//                  BoundAddress().
//   StopAccepting  the port takes no new connections. A transport whose
//                  library cannot close its port alone (gRPC) keeps
//                  accepting until Shutdown; one whose stop is a single
//                  blocking call (civetweb) starts that call here, on a
//                  thread of its own.
//   Shutdown       starts ending what is still open and returns at once;
//                  what is open at `deadline` is cut.
//   Wait           blocks until the listener has stopped: every handler has
//                  returned.
//
// Contract: Start once; then StopAccepting, Shutdown and Wait at most once
// each, in that order (Shutdown implies StopAccepting). Destroying a
// listener stops it (at once, if Shutdown was not called) and waits.
//
// Thread-safety: the lifecycle calls from one thread at a time;
// BoundAddress from any thread once Start returned OK.
#ifndef SOFTMAX_SERVER_LISTENER_H_
#define SOFTMAX_SERVER_LISTENER_H_

#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace softmax::server {

class Listener {
 public:
  virtual ~Listener() = default;

  // What the listener serves, for logs: "grpc", "http", "metrics".
  virtual const char* name() const = 0;
  // UNAVAILABLE when the address cannot be bound; the transport's own
  // INVALID_ARGUMENT for a configuration it cannot use (TLS files).
  virtual absl::Status Start() = 0;
  // host:port bound (the port the kernel picked for :0).
  virtual std::string BoundAddress() const = 0;
  virtual void StopAccepting() = 0;
  virtual void Shutdown(absl::Time deadline) = 0;
  virtual void Wait() = 0;
};

// A listener whose stop is one blocking call (civetweb's, which closes the
// port, lets the handlers running return, then returns): StopAccepting runs
// Stop on a thread of its own, Shutdown adds nothing (there is no deadline
// to give such a call), Wait joins the thread. The subclass's destructor
// must call JoinStop() and then Stop() before its members go.
class StoppedByOneCall : public Listener {
 public:
  void StopAccepting() override {
    if (stopping_) return;
    stopping_ = true;
    stop_ = std::thread([this] { Stop(); });
  }
  void Shutdown(absl::Time /*deadline*/) override { StopAccepting(); }
  void Wait() override { JoinStop(); }

 protected:
  // Stops serving and returns once stopped; idempotent.
  virtual void Stop() = 0;
  void JoinStop() {
    if (stop_.joinable()) stop_.join();
  }

 private:
  bool stopping_ = false;
  std::thread stop_;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_LISTENER_H_
