#include "server/rpc/grpc/grpc_server.h"

#include <algorithm>
#include <climits>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpc/compression.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/resource_quota.h>

#include "absl/strings/str_cat.h"

namespace softmax::server {

namespace {

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
    const GrpcServerOptions& options) {
  if (options.tls_cert_file.empty() && options.tls_key_file.empty()) {
    if (!options.tls_client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca_file needs --tls_cert_file and --tls_key_file");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert_file and --tls_key_file go together");
  }
  absl::StatusOr<std::string> cert = ReadFile("--tls_cert_file", options.tls_cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile("--tls_key_file", options.tls_key_file);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!options.tls_client_ca_file.empty()) {
    absl::StatusOr<std::string> ca =
        ReadFile("--tls_client_ca_file", options.tls_client_ca_file);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

// Linking gRPC's reflection library registers its plugin with every
// ServerBuilder; this option takes it out again.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& plugin) {
                                    return plugin->name() == "proto_server_reflection";
                                  }),
                   plugins->end());
  }
};

}  // namespace

absl::StatusOr<RunningServer> StartGrpcServer(const GrpcServerOptions& options,
                                              grpc::Service* service) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeCredentials(options);
  if (!credentials.ok()) return credentials.status();
  grpc::EnableDefaultHealthCheckService(true);
  if (options.reflection) grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  const int64_t limit =
      std::min<int64_t>(INT_MAX, options.max_tensor_bytes + kMessageHeadroomBytes);
  RunningServer running;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, *credentials, &running.port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(limit));
  builder.SetMaxSendMessageSize(static_cast<int>(limit));
  // gRPC sets SO_REUSEPORT by default on Linux, so a second server on an
  // occupied port would bind and share it; it must fail instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Hardening against slow and hostile clients (docs/security-and-limits.md,
  // "Limits against hostile clients").
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, kHandshakeTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, kMaxConnectionIdleMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  if (options.max_connection_age_ms > 0) {
    builder.AddChannelArgument(
        GRPC_ARG_MAX_CONNECTION_AGE_MS,
        static_cast<int>(std::min<int64_t>(INT_MAX, options.max_connection_age_ms)));
    // No grace bound (INT_MAX: unlimited): a stream open on an aged
    // connection lives on until its caller or its own age ends it.
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, INT_MAX);
  }
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
  if (options.reset_guard != nullptr) {
    // The hot methods (unary and streams of both protocols) count their own
    // (FrontEnd::reset_guard) and pay for no interceptor: on a stream it
    // cost 0.69x of the req/s (H200, 1x1024 float32, 256 callers, 3 rounds).
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(MakePrematureResetInterceptorFactory(
        options.reset_guard,
        {"/softmax.v1.SoftmaxService/Softmax", "/inference.GRPCInferenceService/ModelInfer",
         "/softmax.v1.SoftmaxService/SoftmaxStream",
         "/inference.GRPCInferenceService/ModelStreamInfer"}));
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  builder.RegisterService(service);
  for (grpc::Service* additional : options.additional_services) builder.RegisterService(additional);
  if (!options.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    if (running.server != nullptr) running.server->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("grpc: cannot listen on ", options.address));
  }
  SetServing(running.server.get(), true);
  return running;
}

GrpcListener::GrpcListener(GrpcServerOptions options, grpc::Service* service)
    : options_(std::move(options)), service_(service) {}

GrpcListener::~GrpcListener() {
  if (shutdown_.joinable()) shutdown_.join();
  if (running_.server != nullptr) {
    running_.server->Shutdown();  // returns at once when already shut down
    running_.server->Wait();
  }
}

absl::Status GrpcListener::Start() {
  absl::StatusOr<RunningServer> started = StartGrpcServer(options_, service_);
  if (!started.ok()) return started.status();
  running_ = std::move(*started);
  return absl::OkStatus();
}

std::string GrpcListener::BoundAddress() const {
  const size_t colon = options_.address.rfind(':');
  const std::string host =
      colon == std::string::npos ? options_.address : options_.address.substr(0, colon);
  return absl::StrCat(host, ":", running_.port);
}

void GrpcListener::Shutdown(absl::Time deadline) {
  if (shutdown_.joinable()) return;
  shutdown_ = std::thread([this, deadline] {
    running_.server->Shutdown(absl::ToChronoTime(deadline));
  });
}

void GrpcListener::Wait() {
  if (shutdown_.joinable()) shutdown_.join();
  running_.server->Wait();
}

void GrpcListener::SetServing(bool serving) {
  softmax::server::SetServing(running_.server.get(), serving);
}

void SetServing(grpc::Server* server, bool serving) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", serving);
  health->SetServingStatus(kServiceName, serving);
  health->SetServingStatus(kInferenceServiceName, serving);
}

}  // namespace softmax::server
