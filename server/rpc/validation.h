// Request validation: turns a wire SoftmaxRequest into a checked, parsed view
// the batcher and backends can use without further checks. Free functions, so
// they are testable without gRPC.
//
// Every failure is INVALID_ARGUMENT with a message that names the offending
// field (`request_id`, `input.dtype`, `input.shape[i]`, `input.shape`, `input.data`, `axis`,
// `temperature`, `top_k`).
//
// Thread-safety: pure functions.
#ifndef SOFTMAX_SERVER_RPC_VALIDATION_H_
#define SOFTMAX_SERVER_RPC_VALIDATION_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/cpu_softmax.h"
#include "kernels/dtype.h"
#include "softmax/v1/softmax.pb.h"

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

// A validated request. `data` points into the request message, which must
// outlive this view.
struct ParsedRequest {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> dims;  // the input's shape, unchanged
  int axis = 0;               // normalised to [0, rank) (0 for a scalar)
  // The problem as [outer, n, inner]. For a tensor with no elements, outer is
  // 0 and inner 1, so rows() == 0 and no row is ever computed.
  SoftmaxShape shape;
  SoftmaxOptions options;
  int64_t elements = 0;
  int64_t bytes = 0;  // elements * ItemSize(dtype) == data.size()
  // top_k of the request: 0 for the whole output, else 1..shape.n.
  int64_t top_k = 0;
  bool full_output = false;  // with top_k: the whole output too
  absl::string_view data;
};

// Product of `dims`; INVALID_ARGUMENT naming `input.shape[i]` for a negative
// dimension, or `input.shape` when the product overflows int64. An empty span
// (a scalar) has one element.
absl::StatusOr<int64_t> CountElements(absl::Span<const int64_t> dims);

// Maps `axis` (negative counts from the end) onto [0, rank). A scalar (rank 0)
// accepts -1 and 0, as torch does for 0-d tensors, and yields 0.
absl::StatusOr<int> NormalizeAxis(int64_t axis, int rank);

// Full validation of one request against `limits`. On success the returned
// view is ready to enqueue; it borrows `request`'s input bytes.
// `data`, when given, is the input's bytes instead of input.data() (a
// shared-memory region's; only its size is read here).
absl::StatusOr<ParsedRequest> ParseRequest(const v1::SoftmaxRequest& request,
                                           const RequestLimits& limits,
                                           std::optional<absl::string_view> data = std::nullopt);

// ParseRequest without the input's data: every check but the data's size,
// for the first chunk of a chunked request, whose data arrives later. The
// view's `data` is empty and `bytes` is the size the data must have.
absl::StatusOr<ParsedRequest> ParseRequestHeader(const v1::SoftmaxRequest& request,
                                                 const RequestLimits& limits);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_VALIDATION_H_
