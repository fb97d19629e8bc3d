// Building and reading softmax.v1.Tensor messages on the client side: dtype and
// shape parsing, random normal tensors, conversion to and from float, and the
// [outer, n, inner] view of a tensor along an axis.
//
// Thread-safety: pure functions; safe to call concurrently.
#ifndef SOFTMAX_CLIENT_TENSOR_H_
#define SOFTMAX_CLIENT_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cpu_softmax.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::client {

// "float32" | "float16" | "bfloat16" (also "fp32", "fp16", "bf16", "f32",
// "f16", "half") -> wire dtype. Anything else is INVALID_ARGUMENT.
absl::StatusOr<v1::DType> ParseDType(absl::string_view name);

// Wire dtype -> "float32" | "float16" | "bfloat16" | "unspecified".
const char* WireDTypeName(v1::DType dtype);

// Bytes per element of a specified dtype; 0 for DTYPE_UNSPECIFIED.
int WireItemSize(v1::DType dtype);

// "2,1024" or "2x1024" -> {2, 1024}. The empty string is a scalar (no
// dimensions). Every dimension is a non-negative integer, optionally ending in
// K (x 1024) or M (x 1048576): "1x16M" -> {1, 16777216}. INVALID_ARGUMENT
// otherwise, or when a dimension overflows int64.
absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view text);

// "[2, 1024]"; "[]" for a scalar.
std::string FormatShape(const std::vector<int64_t>& shape);

// Product of the dimensions (1 for a scalar). INVALID_ARGUMENT when a
// dimension is negative or the product overflows int64.
absl::StatusOr<int64_t> ElementCount(const std::vector<int64_t>& shape);

// Shape of a tensor message as a vector.
std::vector<int64_t> ShapeOf(const v1::Tensor& tensor);

// What a random tensor is made of.
struct RandomTensorOptions {
  std::vector<int64_t> shape = {2, 1024};    // dimensions, outermost first
  v1::DType dtype = v1::DTYPE_FLOAT32;        // element type on the wire
  float mean = 0.0f;                          // of the normal distribution
  float stddev = 1.0f;                        // of the normal distribution
  uint64_t seed = 42;                         // same seed, same tensor
  // Refuses to allocate more than this many data bytes (a typo guard).
  int64_t max_bytes = int64_t{4} << 30;
};

// A tensor of independent normal samples, rounded to `dtype`.
absl::StatusOr<v1::Tensor> MakeRandomTensor(const RandomTensorOptions& options);

// Every element widened to float. REQUIRES: the tensor's byte count matches
// its shape and dtype (see CheckTensorBytes).
std::vector<float> TensorToFloats(const v1::Tensor& tensor);

// A tensor of `dtype` holding `values` rounded to nearest even.
// REQUIRES: values.size() == product of shape.
v1::Tensor TensorFromFloats(const std::vector<float>& values, const std::vector<int64_t>& shape,
                            v1::DType dtype);

// OK when the dtype is specified, no dimension is negative and data holds
// exactly prod(shape) * itemsize bytes; otherwise INVALID_ARGUMENT.
absl::Status CheckTensorBytes(const v1::Tensor& tensor);

// The [outer, n, inner] view of `shape` along `axis` (negative counts from the
// end; a scalar behaves as shape [1] for axis 0 or -1). INVALID_ARGUMENT when
// the axis is out of range.
absl::StatusOr<SoftmaxShape> ShapeAlongAxis(const std::vector<int64_t>& shape, int axis);

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_TENSOR_H_
