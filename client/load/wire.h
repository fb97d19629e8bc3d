// The load engine's messages on the wire, without the per-call allocations
// that made large tensors slow.
//
// A typed stub serialises every request into a newly allocated buffer and
// parses every response into a new message. For a 64 MiB tensor each of
// those is a block above glibc's largest mmap threshold (32 MiB): a fresh
// mapping, 16,384 page faults with the kernel zeroing every page, and an
// unmap, and protobuf's parser grows such a string by reserving 50 MB and
// then doubling. On a 2-core host that fault work was a quarter of the load
// client's CPU time at 64 MiB. So the engine sends each payload's bytes, serialised once, by
// reference (PreparedRequest), and parses responses into messages it keeps
// (ParseResponseReusingBuffers), whose output strings keep their capacity.
//
// Thread-safety: a PreparedRequest is immutable once built and may be used
// from any number of threads; ParseResponseReusingBuffers is a pure function
// of its arguments.
#ifndef SOFTMAX_CLIENT_LOAD_WIRE_H_
#define SOFTMAX_CLIENT_LOAD_WIRE_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "common/chunk_wire.h"
#include "absl/strings/string_view.h"
#include "inference/grpc_service.pb.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::client {

// Full method names, for a generic stub.
inline constexpr char kSoftmaxMethod[] = "/softmax.v1.SoftmaxService/Softmax";
inline constexpr char kSoftmaxStreamMethod[] = "/softmax.v1.SoftmaxService/SoftmaxStream";
inline constexpr char kKserveInferMethod[] = "/inference.GRPCInferenceService/ModelInfer";
inline constexpr char kKserveStreamInferMethod[] =
    "/inference.GRPCInferenceService/ModelStreamInfer";

// The Open Inference Protocol's name of `dtype` (FP32, FP16, BF16), and the
// dtype of such a name (DTYPE_UNSPECIFIED for any other); both protocols
// (gRPC and HTTP) use them.
const char* KserveDatatype(v1::DType dtype);
v1::DType DTypeOfKserveDatatype(absl::string_view datatype);

// The Open Inference Protocol request equivalent to `request`: model
// "softmax" or "log_softmax", its input as INPUT's raw_input_contents, axis
// and temperature as parameters when they differ from the defaults.
inference::ModelInferRequest KserveRequestOf(const v1::SoftmaxRequest& request);

// A SoftmaxRequest serialised once. Not copyable or movable: the messages it
// hands out reference its bytes, so it must outlive every call sending them.
class PreparedRequest {
 public:
  // REQUIRES: request.request_id() is empty.
  explicit PreparedRequest(const v1::SoftmaxRequest& request);
  // REQUIRES: request.id() is empty.
  explicit PreparedRequest(const inference::ModelInferRequest& request);
  // Any message, already serialised. WithRequestId is for SoftmaxRequests only.
  explicit PreparedRequest(std::string bytes);
  PreparedRequest(const PreparedRequest&) = delete;
  PreparedRequest& operator=(const PreparedRequest&) = delete;

  // The request as it is (unary calls). gRPC copies a ByteBuffer by
  // reference, so any number of calls may send it at once.
  const grpc::ByteBuffer& message() const { return message_; }
  // The request with its id set (streams): SoftmaxRequest.request_id, or
  // ModelInferRequest.id for a request built from one. A small new slice
  // with the id field, then this object's bytes by reference: a field's
  // position in a message does not matter to protobuf.
  grpc::ByteBuffer WithRequestId(absl::string_view request_id) const;
  size_t size() const { return bytes_.size(); }

 private:
  PreparedRequest(std::string bytes, uint32_t id_field);

  const std::string bytes_;
  const uint32_t id_field_;  // the field number WithRequestId sets
  grpc::ByteBuffer message_;
};

// `request` as the messages of a chunked request (softmax.proto's
// chunk_offset and more_chunks), each holding at most `chunk_bytes` of the
// input's data: the first carries everything else, the later ones only their
// data, offset and more_chunks. One message when the data fits one chunk.
// REQUIRES: request.request_id() is empty, chunk_bytes > 0.
std::vector<std::unique_ptr<const PreparedRequest>> PrepareChunks(const v1::SoftmaxRequest& request,
                                                                  int64_t chunk_bytes);

// Adds one message of a chunked answer (`chunk`, parsed) to `whole`. The
// first (chunk_offset 0) replaces everything in `whole` but the capacity of
// its output's data string, which is reserved to at least `expected_bytes`;
// later ones append their data. false when the chunk does not continue
// `whole` (its offset is not the bytes so far).
bool AppendResponseChunk(v1::SoftmaxResponse* chunk, int64_t expected_bytes,
                         v1::SoftmaxResponse* whole);

// The same for a later chunk read without a full parse (ReadLaterChunk,
// common/chunk_wire.h): its data is appended from where it lies. false when
// it does not continue `whole`.
bool AppendLaterChunk(const ChunkView& chunk, v1::SoftmaxResponse* whole);

// Parses a SoftmaxResponse out of `buffer` (consumed) into `response`, which
// is reset first except for the capacity of its output's data string, which
// the parse fills instead of allocating. false when the bytes are not a
// SoftmaxResponse.
bool ParseResponseReusingBuffers(grpc::ByteBuffer* buffer, v1::SoftmaxResponse* response);

// Parses a ModelInferResponse out of `buffer` (consumed) into `scratch`, then
// moves its first output into `response` as a softmax.v1 output (dtype, shape,
// data swapped in, so both strings keep their capacity across calls). false
// when the bytes do not parse or hold no output of a known datatype with raw
// contents.
bool ParseKserveResponse(grpc::ByteBuffer* buffer, inference::ModelInferResponse* scratch,
                         v1::SoftmaxResponse* response);

// The same for a ModelStreamInfer answer, whose infer_response id becomes
// `response`'s request_id. An in-band error (error_message) becomes
// `response`'s error, with code UNKNOWN: the protocol carries none. false
// when the bytes do not parse, or an answer without an error holds no output
// of a known datatype with raw contents.
bool ParseKserveStreamResponse(grpc::ByteBuffer* buffer,
                               inference::ModelStreamInferResponse* scratch,
                               v1::SoftmaxResponse* response);

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_LOAD_WIRE_H_
