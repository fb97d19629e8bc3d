// Bearer-token authentication of every front-end's calls: the
// tokens come from a file (one per line; blank lines and lines starting
// with # are ignored) and can be reloaded while serving (SIGHUP). A call
// must carry `authorization: Bearer <token>` with one of them; tokens are
// compared in constant time. Health and reflection are not checked. The
// transports hand over the header's value (gRPC: server/rpc/grpc/authenticate.h).
//
// Thread-safety: every method may be called from any thread.
#ifndef SOFTMAX_SERVER_RPC_AUTH_H_
#define SOFTMAX_SERVER_RPC_AUTH_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace softmax::server {

// True when `a` and `b` are equal; takes the same time for any two strings
// of the same length, whatever their contents.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

class TokenAuthenticator {
 public:
  // Reads `path`. INVALID_ARGUMENT when it cannot be read or holds no token.
  static absl::StatusOr<std::unique_ptr<TokenAuthenticator>> FromFile(const std::string& path);

  // Re-reads the file; on failure the tokens in use stay and the error is
  // returned.
  absl::Status Reload();

  // OK when `authorization` (the header's value) is `Bearer <known token>`.
  absl::Status CheckHeader(absl::string_view authorization) const;

 private:
  explicit TokenAuthenticator(std::string path) : path_(std::move(path)) {}

  const std::string path_;
  mutable absl::Mutex mu_;
  std::vector<std::string> tokens_ ABSL_GUARDED_BY(mu_);
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_AUTH_H_
