// The gRPC front-ends on a free loopback port, for unit tests: an Admission
// over a batcher (null: echo), their FrontEnd, the softmax.v1 and KServe
// services, the server and a channel to it.
//
// Thread-safety: build and destroy on one thread; the members are
// thread-safe as documented in their own headers.
#ifndef SOFTMAX_SERVER_RPC_GRPC_TEST_SERVER_H_
#define SOFTMAX_SERVER_RPC_GRPC_TEST_SERVER_H_

#include <chrono>
#include <cstdint>
#include <memory>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "server/rpc/front_end.h"
#include "server/rpc/grpc/grpc_server.h"
#include "server/rpc/grpc/kserve_grpc.h"
#include "server/rpc/grpc/service.h"
#include "server/scheduling/admission.h"

namespace softmax::server::testing {

struct TestGrpcServer {
  // `batcher` (null: echo) and `metrics` (may be null) must outlive this.
  TestGrpcServer(Batcher* batcher, Metrics* metrics, int64_t max_tensor_bytes,
                 int max_stream_pending) {
    AdmissionOptions admission_options;
    admission_options.echo = batcher == nullptr;
    admission = std::make_unique<Admission>(admission_options, batcher);
    front_end.admission = admission.get();
    front_end.metrics = metrics;
    front_end.limits.max_tensor_bytes = max_tensor_bytes;
    front_end.max_stream_pending = max_stream_pending;
    softmax = std::make_unique<SoftmaxServiceImpl>(front_end);
    kserve = std::make_unique<KServeGrpcService>(front_end, &statistics, "test");
    GrpcServerOptions grpc_options;
    grpc_options.address = "127.0.0.1:0";
    grpc_options.max_tensor_bytes = max_tensor_bytes;
    grpc_options.additional_services.push_back(kserve.get());
    absl::StatusOr<RunningServer> started = StartGrpcServer(grpc_options, softmax.get());
    EXPECT_TRUE(started.ok()) << started.status();
    server = std::move(started->server);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", started->port),
                                        grpc::InsecureChannelCredentials(), args);
  }
  // Shuts the server down, letting calls in flight finish.
  ~TestGrpcServer() {
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
    server->Wait();
  }

  std::unique_ptr<Admission> admission;
  FrontEnd front_end;
  kserve::ModelStatistics statistics;
  std::unique_ptr<SoftmaxServiceImpl> softmax;
  std::unique_ptr<KServeGrpcService> kserve;
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<grpc::Channel> channel;
};

}  // namespace softmax::server::testing

#endif  // SOFTMAX_SERVER_RPC_GRPC_TEST_SERVER_H_
