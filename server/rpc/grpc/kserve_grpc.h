// inference.GRPCInferenceService (the Open Inference Protocol over gRPC,
// with Triton's extensions) on the gRPC callback API, served on the same
// port as softmax.v1. Inference goes through Dispatch (dispatch.h):
// one validation, one drain and one Batcher for every protocol.
//
// Served: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata,
// ModelInfer, ModelStreamInfer, ModelConfig, ModelStatistics and the system
// and CUDA shared-memory extensions (server/shm/). Every other RPC of the
// service answers UNIMPLEMENTED naming it. Outputs are sent as
// raw_output_contents, as Triton's gRPC endpoint does, unless the request
// puts them in a shared-memory region.
//
// With bearer tokens (--auth_tokens_file), every method but ServerLive,
// ServerReady and ModelReady needs one (UNAUTHENTICATED otherwise); a
// stream is refused when it opens, and each of its requests is checked.
//
// ModelStreamInfer reads continuously and writes each response (or its
// error_message; the stream goes on) in completion order, one write at a
// time; it stops reading while `max_stream_pending` responses are unwritten.
//
// Thread-safety: gRPC calls the service from its own threads.
#ifndef SOFTMAX_SERVER_RPC_GRPC_KSERVE_GRPC_H_
#define SOFTMAX_SERVER_RPC_GRPC_KSERVE_GRPC_H_

#include <string>

#include <grpcpp/grpcpp.h>

#include "inference/grpc_service.grpc.pb.h"
#include "server/rpc/kserve.h"
#include "server/rpc/front_end.h"

namespace softmax::server {

// Every method on the callback API (none synchronous). ModelInfer and
// ModelStreamInfer take and give raw byte buffers, as softmax.v1 does
// (wire.h): a response references an output the backend lent (OutputView,
// pinned memory on the GPU) instead of copying it.
namespace kserve_grpc_internal {
using G = inference::GRPCInferenceService;
using Base =
    G::WithRawCallbackMethod_ModelInfer<
    G::WithRawCallbackMethod_ModelStreamInfer<
    G::WithCallbackMethod_ServerLive<
    G::WithCallbackMethod_ServerReady<
    G::WithCallbackMethod_ModelReady<
    G::WithCallbackMethod_ServerMetadata<
    G::WithCallbackMethod_ModelMetadata<
    G::WithCallbackMethod_ModelConfig<
    G::WithCallbackMethod_ModelStatistics<
    G::WithCallbackMethod_RepositoryIndex<
    G::WithCallbackMethod_RepositoryModelLoad<
    G::WithCallbackMethod_RepositoryModelUnload<
    G::WithCallbackMethod_SystemSharedMemoryStatus<
    G::WithCallbackMethod_SystemSharedMemoryRegister<
    G::WithCallbackMethod_SystemSharedMemoryUnregister<
    G::WithCallbackMethod_CudaSharedMemoryStatus<
    G::WithCallbackMethod_CudaSharedMemoryRegister<
    G::WithCallbackMethod_CudaSharedMemoryUnregister<
    G::WithCallbackMethod_TraceSetting<
    G::WithCallbackMethod_LogSettings<
    G::Service>>>>>>>>>>>>>>>>>>>>;
}  // namespace kserve_grpc_internal
using KServeGrpcBase = kserve_grpc_internal::Base;

class KServeGrpcService final : public KServeGrpcBase {
 public:
  // `front_end`'s pointees (admission, metrics, tokens) and `statistics`
  // must outlive the gRPC server this is registered with; `shared_memory`
  // (may be null: the extensions answer UNIMPLEMENTED) too.
  KServeGrpcService(const FrontEnd& front_end, kserve::ModelStatistics* statistics,
                    std::string server_version, SharedMemoryManager* shared_memory = nullptr);

// Declares the served unary RPC `rpc` of inference.GRPCInferenceService
// (request inference::rpc##Request, response inference::rpc##Response).
#define SOFTMAX_KSERVE_UNARY(rpc)                                                  \
  grpc::ServerUnaryReactor* rpc(grpc::CallbackServerContext* context,              \
                                const inference::rpc##Request* request,            \
                                inference::rpc##Response* response) override
  SOFTMAX_KSERVE_UNARY(ServerLive);
  SOFTMAX_KSERVE_UNARY(ServerReady);
  SOFTMAX_KSERVE_UNARY(ModelReady);
  SOFTMAX_KSERVE_UNARY(ServerMetadata);
  SOFTMAX_KSERVE_UNARY(ModelMetadata);
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ModelStreamInfer(
      grpc::CallbackServerContext* context) override;
  SOFTMAX_KSERVE_UNARY(ModelConfig);
  SOFTMAX_KSERVE_UNARY(ModelStatistics);

#define SOFTMAX_KSERVE_UNIMPLEMENTED(rpc)                                              \
  grpc::ServerUnaryReactor* rpc(grpc::CallbackServerContext* context,                  \
                                const inference::rpc##Request*, inference::rpc##Response*) \
      override {                                                                       \
    return Unimplemented(context, #rpc);                                               \
  }
  SOFTMAX_KSERVE_UNIMPLEMENTED(RepositoryIndex)
  SOFTMAX_KSERVE_UNIMPLEMENTED(RepositoryModelLoad)
  SOFTMAX_KSERVE_UNIMPLEMENTED(RepositoryModelUnload)
  SOFTMAX_KSERVE_UNIMPLEMENTED(TraceSetting)
  SOFTMAX_KSERVE_UNIMPLEMENTED(LogSettings)
#undef SOFTMAX_KSERVE_UNIMPLEMENTED

  // The shared-memory extensions (shared_memory.h).
  SOFTMAX_KSERVE_UNARY(SystemSharedMemoryStatus);
  SOFTMAX_KSERVE_UNARY(SystemSharedMemoryRegister);
  SOFTMAX_KSERVE_UNARY(SystemSharedMemoryUnregister);
  SOFTMAX_KSERVE_UNARY(CudaSharedMemoryStatus);
  SOFTMAX_KSERVE_UNARY(CudaSharedMemoryRegister);
  SOFTMAX_KSERVE_UNARY(CudaSharedMemoryUnregister);
#undef SOFTMAX_KSERVE_UNARY

  const FrontEnd& front_end() const { return front_end_; }
  const SharedMemoryManager* shared_memory() const { return shared_memory_; }
  kserve::ModelStatistics* statistics() const { return statistics_; }

 private:
  // UNAUTHENTICATED without a known token (as every method but the health
  // ones: ServerLive, ServerReady, ModelReady), else UNIMPLEMENTED.
  grpc::ServerUnaryReactor* Unimplemented(grpc::CallbackServerContext* context,
                                          const char* rpc);

  const FrontEnd front_end_;
  kserve::ModelStatistics* const statistics_;
  const std::string server_version_;
  SharedMemoryManager* const shared_memory_;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_GRPC_KSERVE_GRPC_H_
