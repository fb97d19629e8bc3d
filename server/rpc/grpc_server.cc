#include "server/rpc/grpc_server.h"

#include <algorithm>
#include <climits>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpc/compression.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>

#include "absl/strings/str_cat.h"

namespace softmax::server {

absl::StatusOr<RunningServer> StartGrpcServer(const GrpcServerOptions& options,
                                              grpc::Service* service) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  const int64_t limit =
      std::min<int64_t>(INT_MAX, options.max_tensor_bytes + kMessageHeadroomBytes);
  RunningServer running;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, grpc::InsecureServerCredentials(), &running.port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(limit));
  builder.SetMaxSendMessageSize(static_cast<int>(limit));
  // gRPC sets SO_REUSEPORT by default on Linux, so a second server on an
  // occupied port would bind and share it; it must fail instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Hardening against slow and hostile clients (README, "Limits against
  // hostile clients").
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, kHandshakeTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, kMaxConnectionIdleMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  // Compression off: gRPC 1.51 inflates a whole message before it checks the
  // receive limit, so 254 KiB of gzip would become a 256 MiB allocation. A
  // compressed call is refused (UNIMPLEMENTED) before its message is read.
  builder.AddChannelArgument(GRPC_COMPRESSION_CHANNEL_ENABLED_ALGORITHMS_BITSET,
                             1 << GRPC_COMPRESS_NONE);
  if (options.transport_memory_bytes > 0) {
    grpc::ResourceQuota quota("softmax-server");
    quota.Resize(static_cast<size_t>(options.transport_memory_bytes));
    builder.SetResourceQuota(quota);
  }
  builder.RegisterService(service);
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    if (running.server != nullptr) running.server->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("grpc: cannot listen on ", options.address));
  }
  SetServing(running.server.get(), true);
  return running;
}

void SetServing(grpc::Server* server, bool serving) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", serving);
  health->SetServingStatus(kServiceName, serving);
}

}  // namespace softmax::server
