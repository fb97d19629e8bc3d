// softmax.v1 (proto/softmax/v1/softmax.proto) as one front-end among
// others: its SoftmaxRequest as an InferenceRequest, and the answer back
// into its SoftmaxResponse. The gRPC service (grpc/service.h) and the wire
// fuzzer use it; the KServe front-ends never do.
//
// Thread-safety: pure functions; each call's messages belong to that call.
#ifndef SOFTMAX_SERVER_RPC_SOFTMAX_V1_H_
#define SOFTMAX_SERVER_RPC_SOFTMAX_V1_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/rpc/tensor_buffer_pool.h"
#include "server/rpc/validation.h"
#include "server/scheduling/inference_request.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::server {

// softmax.v1's names for the fields validation names.
inline constexpr FieldNames kSoftmaxV1Fields{};

// The DType of a v1::DType; INVALID_ARGUMENT naming input.dtype when unset
// or unknown.
absl::StatusOr<DType> FromV1DType(v1::DType dtype);

// Builds `*out` from `*request`: its input is a view of request's data
// (which the answer may take over: callers must not read request's data
// after submitting), answered into `response`'s output, `view` (may be
// null) and `top_k`. Every pointee must live until the request is answered.
// Starts `response` with what it takes from the request: request_id, the
// output's dtype and shape (when the whole output was asked for) and the
// top K's dtype (when one was). INVALID_ARGUMENT naming input.dtype for a
// dtype not served.
absl::Status FromSoftmaxV1(v1::SoftmaxRequest* request, v1::SoftmaxResponse* response,
                           OutputView* view, TopKResult* top_k, InferenceRequest* out);

// The fields of `request` but its data and answer (for a chunked request's
// first chunk, checked by ValidateHeader before its data arrives).
absl::Status HeaderFromSoftmaxV1(const v1::SoftmaxRequest& request, InferenceRequest* out);

// Completes `response`, started by FromSoftmaxV1, of an answered OK request
// without reading the request (it runs on the answering thread): the output
// dropped when only a top K was asked for, timing, and the top K moved out
// of `top_k`.
void FinishSoftmaxV1Response(const RequestTiming& timing, TopKResult* top_k,
                             v1::SoftmaxResponse* response);

// Gives a finished call's large strings back to `pool`.
void RecycleBuffers(TensorBufferPool* pool, v1::SoftmaxRequest* request,
                    v1::SoftmaxResponse* response);

// An output left in the response's own string (echo, CPU backend) is sent
// by reference when it is large, as views are, instead of being copied into
// a newly allocated message buffer: a no-op when `view` already holds one.
void LendLargeOutput(const std::shared_ptr<TensorBufferPool>& pool,
                     v1::SoftmaxResponse* response, OutputView* view);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_SOFTMAX_V1_H_
