// The bearer-token check (server/rpc/auth.h) on a gRPC call's metadata.
//
// Thread-safety: pure function over thread-safe state.
#ifndef SOFTMAX_SERVER_RPC_GRPC_AUTHENTICATE_H_
#define SOFTMAX_SERVER_RPC_GRPC_AUTHENTICATE_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/rpc/auth.h"

namespace softmax::server {

// OK when `authenticator` is null (tokens off) or `context` carries
// `authorization: Bearer <token>` with one of its tokens; else
// UNAUTHENTICATED.
inline absl::Status Authenticate(const TokenAuthenticator* authenticator,
                                 const grpc::ServerContextBase& context) {
  if (authenticator == nullptr) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find("authorization");
  // No header reads as an empty one: "missing" either way.
  return authenticator->CheckHeader(found == metadata.end()
                                        ? absl::string_view()
                                        : absl::string_view(found->second.data(),
                                                            found->second.size()));
}

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_GRPC_AUTHENTICATE_H_
