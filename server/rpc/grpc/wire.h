// The service's messages on the wire. The service takes requests and gives
// responses as raw gRPC byte buffers, so that a response can reference its
// output where the backend computed it (OutputView, pinned host memory on the
// GPU) rather than copying it into the message and copying it again to
// serialise it: for a response of megabytes those two copies cost more host
// time than its whole GPU round trip.
//
// Thread-safety: pure functions.
#ifndef SOFTMAX_SERVER_RPC_GRPC_WIRE_H_
#define SOFTMAX_SERVER_RPC_GRPC_WIRE_H_

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/rpc/tensor_buffer_pool.h"
#include "server/scheduling/backend.h"

// softmax.v1's messages (softmax/v1/softmax.pb.h), declared only: the
// KServe front-end uses SetHeadAndView without softmax.v1's generated code.
namespace softmax::v1 {
class SoftmaxRequest;
class SoftmaxResponse;
}  // namespace softmax::v1

namespace softmax::server {

// INVALID_ARGUMENT: the request's bytes are not a `type` message. `problem`
// says why; protobuf's parser gives no reason for proto3 messages, so an
// empty one names what it refuses.
absl::Status UnparsableMessage(absl::string_view type, absl::string_view problem);

// Parses a softmax.v1.SoftmaxRequest out of `buffer` (consumed: it is left
// empty) into `request`, which must be newly constructed. A tensor of
// TensorBufferPool::kMinPooledBytes or more is parsed into a buffer taken
// from `pool` (may be null), which the caller gives back once the call is
// done. INVALID_ARGUMENT when the bytes are not such a message.
absl::Status ParseRequestMessage(grpc::ByteBuffer* buffer, TensorBufferPool* pool,
                                 v1::SoftmaxRequest* request);

// Makes `out` the serialised `head` followed by the view's bytes, referenced
// and not copied; the view's owner is released with the buffer's last
// reference (once gRPC has sent it).
void SetHeadAndView(grpc::Slice head, OutputView view, grpc::ByteBuffer* out);

// Serialises `response` into `out`. Without a view (view.data null) this is
// protobuf's own serialisation. With one, the output's data is the view's
// bytes, referenced and not copied: the buffer holds the message without its
// output data, then a second `output` field holding only `data`, which
// every protobuf parser merges into the first (a message field that occurs
// twice is merged). The view's owner is released when gRPC releases the
// buffer's last reference. `response`'s output data is cleared first (it
// holds nothing of the result when there is a view).
absl::Status SerializeResponse(v1::SoftmaxResponse* response, OutputView view,
                               grpc::ByteBuffer* out);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_GRPC_WIRE_H_
