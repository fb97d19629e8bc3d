// PrematureResetGuard: the replica's own defence against the HTTP/2 rapid
// reset (CVE-2023-44487), which gRPC 1.51 lacks: a client that opens calls
// and resets them before their message arrives makes the server set up a
// call for each (about 7 KiB here, more on a many-core host) faster than its
// callback threads retire them: 100,000 pairs on one loopback connection
// reached 1.8 GiB on a 2-core host (1.95 GB on a 16-core one).
//
// A front-end reports each call that ended before its request message
// arrived (Record). A peer (one connection: gRPC names it by its address and
// port) with kMaxPrematureResets of them within kPrematureResetWindow has its
// connection shut down, as Envoy's premature-reset limit does: gRPC then
// fails what is left on it and frees every call at once. Well-behaved
// clients send the message right behind the headers and never come close.
//
// Thread-safety: Record may be called from any thread. Only calls that were
// reset take the lock; nothing is counted for a call that arrived whole.
#ifndef SOFTMAX_SERVER_RPC_GRPC_RESET_GUARD_H_
#define SOFTMAX_SERVER_RPC_GRPC_RESET_GUARD_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <grpcpp/support/server_interceptor.h>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace softmax::server {

// Envoy's overload.premature_reset_total_stream_count default is 500 per
// connection; 1,000 within 10 s leaves room for a client whose deadlines all
// expire at once; it kept the backlog within 128 MiB of the start (2-core host).
inline constexpr int kMaxPrematureResets = 1000;
inline constexpr std::chrono::seconds kPrematureResetWindow(10);
// Peers remembered at once; past it the counts start over (an attacker with
// that many connections at once is the accept limit's business).
inline constexpr int kMaxTrackedPeers = 4096;

class PrematureResetGuard {
 public:
  // `close_peer` shuts the connection of a gRPC peer ("ipv4:1.2.3.4:5678")
  // down; true when it found it. Default: ShutdownPeerConnection.
  explicit PrematureResetGuard(std::function<bool(absl::string_view peer)> close_peer = {});

  // A call from `peer` ended before its request message arrived. Returns
  // true when this call took the peer over the limit (its connection was
  // then shut down, or was already gone).
  bool RecordPrematureReset(absl::string_view peer);

  // Connections shut down so far.
  int64_t connections_closed() const;

 private:
  struct Counts {
    int resets = 0;
    std::chrono::steady_clock::time_point window_start;
  };
  const std::function<bool(absl::string_view)> close_peer_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Counts> peers_ ABSL_GUARDED_BY(mu_);
  int64_t connections_closed_ ABSL_GUARDED_BY(mu_) = 0;
};

// Counts the premature resets of the methods whose handlers do not see them
// (the typed ones, and methods no service has) into `guard`, which must
// outlive the server: a call cancelled before its request message arrived.
// The raw hot methods (`counted_by_handlers`, full names) count their own and
// get no interceptor, so that they pay nothing per call.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakePrematureResetInterceptorFactory(PrematureResetGuard* guard,
                                     std::vector<std::string> counted_by_handlers);

// The connected socket of this process whose remote end is `peer`, in
// gRPC's naming ("ipv4:127.0.0.1:5678", "ipv6:[::1]:5678"), shut down for
// reading and writing; false when no such socket is open.
bool ShutdownPeerConnection(absl::string_view peer);

// gRPC's name of a socket's remote end, "" when it has none.
std::string PeerName(int fd);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_GRPC_RESET_GUARD_H_
