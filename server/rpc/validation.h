// Request validation: checks an InferenceRequest (server/scheduling/
// inference_request.h), whichever front-end built it, and fills its
// ValidatedTensor for Admission. Free functions, testable without gRPC.
//
// Every failure is INVALID_ARGUMENT with a message that names the offending
// field in the words of the request's own protocol (FieldNames: softmax.v1's
// `request_id`, `input.shape[i]`, `input.data`, `axis`, `temperature`,
// `top_k`, ...; KServe's `id`, `inputs[0].shape[i]`, `raw_input_contents[0]`,
// `parameters.axis`, ...).
//
// Thread-safety: pure functions.
#ifndef SOFTMAX_SERVER_RPC_VALIDATION_H_
#define SOFTMAX_SERVER_RPC_VALIDATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/cpu_softmax.h"
#include "kernels/dtype.h"
#include "server/scheduling/inference_request.h"

namespace softmax::server {

// Longest request_id accepted, in bytes. It is echoed on every response and
// logged by callers; 256 holds any UUID, trace id or key a caller uses.
inline constexpr size_t kMaxRequestIdBytes = 256;

// True when `text` is well-formed UTF-8 (no overlong forms, no surrogates,
// nothing above U+10FFFF), as protobuf requires of a string field.
bool IsValidUtf8(absl::string_view text);

// Limits applied to every request.
struct RequestLimits {
  // Largest tensor (input data bytes) accepted. Matches --max_tensor_bytes.
  int64_t max_tensor_bytes = int64_t{1} << 30;
};

// What a protocol calls the fields validation names: softmax.v1's by
// default. `data` names where the input's bytes came from, which may differ
// per request (KServe: raw_input_contents[0], inputs[0].contents...).
struct FieldNames {
  absl::string_view id = "request_id";
  absl::string_view input = "input";        // the tensor as a whole
  absl::string_view shape = "input.shape";  // and shape[i]
  absl::string_view data = "input.data";
  absl::string_view axis = "axis";
  absl::string_view temperature = "temperature";
  absl::string_view top_k = "top_k";
  absl::string_view output_region = "output.region";
};

// Product of `dims`; INVALID_ARGUMENT naming `shape`[i] for a negative
// dimension, or `shape` when the product overflows int64. An empty span
// (a scalar) has one element.
absl::StatusOr<int64_t> CountElements(absl::Span<const int64_t> dims,
                                      absl::string_view shape = "input.shape");

// Maps `axis` (negative counts from the end) onto [0, rank); INVALID_ARGUMENT
// naming `field` otherwise. A scalar (rank 0) accepts -1 and 0, as torch does
// for 0-d tensors, and yields 0.
absl::StatusOr<int> NormalizeAxis(int64_t axis, int rank, absl::string_view field = "axis");

// Full validation of `*request` against `limits`: its id, shape, the input's
// byte count (request->input.bytes), axis, temperature, top_k and output
// region. On success request->tensor is filled (valid) and the request is
// ready to submit; on error it is unchanged but for request->tensor.
absl::Status ValidateRequest(InferenceRequest* request, const RequestLimits& limits,
                             const FieldNames& names);

// ValidateRequest without the input's data: every check but the data's
// size, for the first chunk of a chunked request, whose data arrives later.
// request->tensor.bytes is then the size the data must have; `valid` stays
// false until ValidateRequest has seen the data.
absl::Status ValidateHeader(InferenceRequest* request, const RequestLimits& limits,
                            const FieldNames& names);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_VALIDATION_H_
