#include "server/rpc/validation.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace softmax::server {
namespace {

// a * b for non-negative a, b; false on int64 overflow.
bool MultiplyChecked(int64_t a, int64_t b, int64_t* product) {
  return !__builtin_mul_overflow(a, b, product);
}

absl::StatusOr<DType> ParseDType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return DType::kFloat32;
    case v1::DTYPE_FLOAT16: return DType::kFloat16;
    case v1::DTYPE_BFLOAT16: return DType::kBFloat16;
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError(
          "input.dtype: must be set (DTYPE_FLOAT32, DTYPE_FLOAT16 or DTYPE_BFLOAT16)");
    default: break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("input.dtype: unknown value ", static_cast<int>(dtype)));
}

}  // namespace

bool IsValidUtf8(absl::string_view text) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int extra = 0;
    uint32_t code = 0;
    uint32_t min = 0;
    if ((c & 0xE0) == 0xC0) {
      extra = 1, code = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, code = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, code = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (n - i <= static_cast<size_t>(extra)) return false;
    for (int k = 1; k <= extra; ++k) {
      const unsigned char next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      code = (code << 6) | (next & 0x3F);
    }
    if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

absl::StatusOr<int64_t> CountElements(absl::Span<const int64_t> dims) {
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input.shape[", i, "]: dimension must be >= 0, got ", dims[i]));
    }
  }
  // A zero dimension anywhere makes the tensor empty, whatever the others
  // are ([2^62, 2^62, 0] is as valid as [0, 2^62, 2^62], as in torch).
  for (int64_t dim : dims) {
    if (dim == 0) return int64_t{0};
  }
  int64_t count = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (!MultiplyChecked(count, dims[i], &count)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input.shape: element count overflows int64 at input.shape[", i, "]"));
    }
  }
  return count;
}

absl::StatusOr<int> NormalizeAxis(int64_t axis, int rank) {
  const int64_t extent = rank == 0 ? 1 : rank;
  if (axis < -extent || axis >= extent) {
    return absl::InvalidArgumentError(absl::StrCat(
        "axis: ", axis, " is out of range for a tensor of rank ", rank, " (expected [",
        -extent, ", ", extent - 1, "])"));
  }
  return static_cast<int>(axis < 0 ? axis + extent : axis);
}

absl::StatusOr<ParsedRequest> ParseRequestHeader(const v1::SoftmaxRequest& request,
                                                 const RequestLimits& limits) {
  ParsedRequest parsed;
  const v1::Tensor& input = request.input();

  if (request.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request_id: ", request.request_id().size(), " bytes; at most ", kMaxRequestIdBytes));
  }
  if (!IsValidUtf8(request.request_id())) {
    return absl::InvalidArgumentError("request_id: not valid UTF-8");
  }

  absl::StatusOr<DType> dtype = ParseDType(input.dtype());
  if (!dtype.ok()) return dtype.status();
  parsed.dtype = *dtype;

  parsed.dims.assign(input.shape().begin(), input.shape().end());
  if (parsed.dims.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError("input.shape: too many dimensions");
  }
  const int rank = static_cast<int>(parsed.dims.size());
  absl::StatusOr<int64_t> elements = CountElements(parsed.dims);
  if (!elements.ok()) return elements.status();
  parsed.elements = *elements;

  const int64_t item_size = ItemSize(parsed.dtype);
  if (!MultiplyChecked(parsed.elements, item_size, &parsed.bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input.shape: ", parsed.elements, " elements of ", DTypeName(parsed.dtype),
        " overflow int64 bytes"));
  }
  if (parsed.bytes > limits.max_tensor_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input: tensor of ", parsed.bytes, " bytes exceeds the server's limit of ",
        limits.max_tensor_bytes, " bytes (--max_tensor_bytes)"));
  }

  absl::StatusOr<int> axis = NormalizeAxis(request.has_axis() ? request.axis() : -1, rank);
  if (!axis.ok()) return axis.status();
  parsed.axis = *axis;

  if (request.has_temperature()) {
    const float t = request.temperature();
    if (!std::isfinite(t) || t <= 0.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat("temperature: must be finite and > 0, got ", t));
    }
    parsed.options.temperature = t;
  }
  parsed.options.log = request.log();

  // After the shape: a scalar's axis has length 1.
  const int64_t axis_length = rank == 0 ? 1 : parsed.dims[parsed.axis];
  if (request.top_k() < 0 || request.top_k() > axis_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "top_k: must be in [0, ", axis_length,
        "] (0: the whole output; at most the length of axis ", parsed.axis, "), got ",
        request.top_k()));
  }
  parsed.top_k = request.top_k();
  parsed.full_output = request.full_output();

  if (parsed.elements == 0) {
    // outer * inner may overflow when the axis itself is 0; nothing to compute.
    parsed.shape = SoftmaxShape{0, rank == 0 ? 1 : parsed.dims[parsed.axis], 1};
  } else if (rank > 0) {
    int64_t outer = 1;
    int64_t inner = 1;
    for (int i = 0; i < parsed.axis; ++i) outer *= parsed.dims[i];
    for (int i = parsed.axis + 1; i < rank; ++i) inner *= parsed.dims[i];
    parsed.shape = SoftmaxShape{outer, parsed.dims[parsed.axis], inner};
  }  // else: a scalar is one row of length 1, the default SoftmaxShape.
  return parsed;
}

absl::StatusOr<ParsedRequest> ParseRequest(const v1::SoftmaxRequest& request,
                                           const RequestLimits& limits,
                                           std::optional<absl::string_view> data) {
  absl::StatusOr<ParsedRequest> parsed = ParseRequestHeader(request, limits);
  if (!parsed.ok()) return parsed;
  const absl::string_view bytes = data.value_or(absl::string_view(request.input().data()));
  const int64_t got = static_cast<int64_t>(bytes.size());
  if (got != parsed->bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input.data: expected ", parsed->bytes, " bytes (", parsed->elements, " elements of ",
        DTypeName(parsed->dtype), "), got ", got));
  }
  parsed->data = bytes;
  return parsed;
}

}  // namespace softmax::server
