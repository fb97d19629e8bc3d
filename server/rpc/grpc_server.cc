#include "server/rpc/grpc_server.h"

#include <algorithm>
#include <climits>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

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
