// The KServe v2 gRPC front-end's conversions: a ModelInferRequest as gRPC
// hands it over, into the InferenceRequest that is submitted (dispatch.h),
// and the answer back into a ModelInferResponse's bytes. KServeGrpcService
// (kserve_grpc.h) serves them; wire_fuzzer.cc feeds them arbitrary bytes.
#ifndef SOFTMAX_SERVER_RPC_GRPC_KSERVE_INFER_H_
#define SOFTMAX_SERVER_RPC_GRPC_KSERVE_INFER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "inference/grpc_service.pb.h"
#include "server/rpc/kserve.h"
#include "server/rpc/tensor_buffer_pool.h"
#include "server/scheduling/admission.h"
#include "server/scheduling/inference_request.h"
#include "server/rpc/request_record.h"
#include "server/shm/shared_memory.h"

namespace softmax::server {

// One inference request on its way through the scheduler: what it was
// read as, and what its answer is written into.
struct InferCall {
  ~InferCall() {
    if (buffers == nullptr) return;
    buffers->Give(std::move(parts.input_data));
    buffers->Give(std::move(output));
  }
  // Where its large tensor buffers go back to (the service's pool).
  std::shared_ptr<TensorBufferPool> buffers;
  // What it leaves behind once answered (its model once known, its input
  // bytes, the batcher's timing); the stream's sets its method.
  RequestRecord record{RpcMethod::kModelInfer};
  // The request as read: its id, shape and input bytes (the submitted
  // request's input is a view of parts.input_data).
  kserve::InferRequestParts parts;
  DType dtype = DType::kFloat32;
  bool top_k = false;  // answered by its top K (parameter top_k, classification)
  // The answer: the output (in `output`, or lent in `view`), the top K.
  std::string output;
  OutputView view;
  TopKResult top_k_result;
  inference::ModelInferRequest message;  // the unary call's parsed request
  // The answer's outputs (kserve::AnswerOutputs).
  std::vector<kserve::AnswerOutput> outputs = {kserve::AnswerOutput::kOutput};
  // What keeps the shared-memory regions mapped.
  std::vector<std::shared_ptr<const void>> leases;
  // Where the top K goes in shared memory, when it does.
  kserve::TopKRegions top_k_regions;
  // Its in-flight ticket and share of the memory budget (Admission::Submit).
  Admission::Admitted admitted;
  grpc::CallbackServerContext* context = nullptr;  // the call's; for the access log
};

// Turns `request` (whose raw contents are taken) into `*out`, answered into
// `call` and with its tensors' regions in `shared_memory` (may be null)
// bound. Errors name KServe's fields.
absl::Status PrepareInfer(inference::ModelInferRequest* request,
                          const SharedMemoryManager* shared_memory, InferCall* call,
                          InferenceRequest* out);

// Fills `out` with the answer of an OK `call` but its output bytes, which
// are returned: a view of the lent output, or (view.data null) moved into
// out's raw_output_contents.
OutputView FillInferResponse(InferCall* call, inference::ModelInferResponse* out);

// Serialises `response` into `out`, as a ModelStreamInferResponse's
// infer_response when `in_stream`. With a view, its bytes follow as the
// last raw_output_contents entry, referenced and not copied (a repeated
// field may come anywhere in a message); the view's owner is released with
// the buffer's last reference.
absl::Status SerializeInferResponse(inference::ModelInferResponse* response, OutputView view,
                                    bool in_stream, grpc::ByteBuffer* out);

// Parses a ModelInferRequest out of `buffer` (consumed). A large message's
// first raw_input_contents entry lands in a buffer from `pool` (may be
// null): a repeated field keeps its cleared elements, with their capacity,
// for the parser to reuse. 2-core host, 64 MiB echo: 34,000 page faults
// per request without it.
absl::Status ParseInferRequest(grpc::ByteBuffer* buffer, TensorBufferPool* pool,
                               inference::ModelInferRequest* request);

// A message's bytes in `out` (ModelInferResponse, ModelStreamInferResponse).
template <typename Message>
absl::Status SerializeMessage(const Message& message, grpc::ByteBuffer* out) {
  bool own_buffer = false;
  const grpc::Status status =
      grpc::SerializationTraits<Message>::Serialize(message, out, &own_buffer);
  if (status.ok()) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("cannot serialise the response: ", status.error_message()));
}

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_GRPC_KSERVE_INFER_H_
