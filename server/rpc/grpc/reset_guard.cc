#include "server/rpc/grpc/reset_guard.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <grpcpp/server_context.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/logging/log.h"

namespace softmax::server {

std::string PeerName(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    return absl::StrCat("ipv4:", text, ":", ntohs(v4->sin_port));
  }
  if (address.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
    if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) {
      // gRPC names a v4-mapped peer of a dual-stack listener as IPv4.
      inet_ntop(AF_INET, &v6->sin6_addr.s6_addr[12], text, sizeof(text));
      return absl::StrCat("ipv4:", text, ":", ntohs(v6->sin6_port));
    }
    inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    return absl::StrCat("ipv6:[", text, "]:", ntohs(v6->sin6_port));
  }
  return "";
}

bool ShutdownPeerConnection(absl::string_view peer) {
  // Rare (an abusive connection), so a scan of the open descriptors does.
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return false;
  bool found = false;
  while (dirent* entry = readdir(fds)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(fds)) continue;
    if (PeerName(static_cast<int>(fd)) == peer) {
      // Not close(): the descriptor stays gRPC's, which sees the connection
      // end and frees its calls; with no linger, its close then resets the
      // connection rather than leave the peer writing into a closed window.
      const linger abort{1, 0};
      setsockopt(static_cast<int>(fd), SOL_SOCKET, SO_LINGER, &abort, sizeof(abort));
      shutdown(static_cast<int>(fd), SHUT_RDWR);
      found = true;
    }
  }
  closedir(fds);
  return found;
}

PrematureResetGuard::PrematureResetGuard(std::function<bool(absl::string_view)> close_peer)
    : close_peer_(close_peer ? std::move(close_peer) : ShutdownPeerConnection) {}

bool PrematureResetGuard::RecordPrematureReset(absl::string_view peer) {
  const auto now = std::chrono::steady_clock::now();
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(peers_.size()) >= kMaxTrackedPeers && !peers_.contains(peer)) {
      peers_.clear();
    }
    Counts& counts = peers_[peer];
    if (counts.resets == 0 || now - counts.window_start > kPrematureResetWindow) {
      counts.resets = 0;
      counts.window_start = now;
    }
    if (++counts.resets < kMaxPrematureResets) return false;
    // Over the limit: forget the peer (its connection goes) and close it
    // outside the lock.
    peers_.erase(peer);
    ++connections_closed_;
  }
  const bool closed = close_peer_(peer);
  logging::LogWarning("closing a connection that resets its calls before sending them "
                      "(HTTP/2 rapid reset)",
                      {{"peer", std::string(peer)},
                       {"resets", static_cast<int64_t>(kMaxPrematureResets)},
                       {"found", closed ? "yes" : "no"}});
  return true;
}

namespace {

class PrematureResetInterceptor final : public grpc::experimental::Interceptor {
 public:
  PrematureResetInterceptor(grpc::experimental::ServerRpcInfo* info, PrematureResetGuard* guard)
      : info_(info), guard_(guard) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using Hook = grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(Hook::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() != nullptr) {
      received_ = true;
    }
    // The call is over; whether it was cancelled is known from here on.
    if (methods->QueryInterceptionHookPoint(Hook::POST_RECV_CLOSE) && !received_ &&
        info_->server_context()->IsCancelled()) {
      guard_->RecordPrematureReset(info_->server_context()->peer());
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* const info_;
  PrematureResetGuard* const guard_;
  bool received_ = false;
};

class PrematureResetInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  PrematureResetInterceptorFactory(PrematureResetGuard* guard, std::vector<std::string> skipped)
      : guard_(guard), skipped_(std::move(skipped)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const absl::string_view method = info->method() != nullptr ? info->method() : "";
    for (const std::string& skipped : skipped_) {
      if (method == skipped) return nullptr;
    }
    return new PrematureResetInterceptor(info, guard_);
  }

 private:
  PrematureResetGuard* const guard_;
  const std::vector<std::string> skipped_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakePrematureResetInterceptorFactory(PrematureResetGuard* guard,
                                     std::vector<std::string> counted_by_handlers) {
  return std::make_unique<PrematureResetInterceptorFactory>(guard,
                                                            std::move(counted_by_handlers));
}

int64_t PrematureResetGuard::connections_closed() const {
  absl::MutexLock lock(&mu_);
  return connections_closed_;
}

}  // namespace softmax::server
