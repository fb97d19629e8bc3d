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

absl::StatusOr<int64_t> CountElements(absl::Span<const int64_t> dims,
                                      absl::string_view shape) {
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          shape, "[", i, "]: dimension must be >= 0, got ", dims[i]));
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
          shape, ": element count overflows int64 at ", shape, "[", i, "]"));
    }
  }
  return count;
}

absl::StatusOr<int> NormalizeAxis(int64_t axis, int rank, absl::string_view field) {
  const int64_t extent = rank == 0 ? 1 : rank;
  if (axis < -extent || axis >= extent) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", axis, " is out of range for a tensor of rank ", rank, " (expected [",
        -extent, ", ", extent - 1, "])"));
  }
  return static_cast<int>(axis < 0 ? axis + extent : axis);
}

absl::Status ValidateHeader(InferenceRequest* request, const RequestLimits& limits,
                            const FieldNames& names) {
  ValidatedTensor& parsed = request->tensor;
  parsed = ValidatedTensor{};
  if (request->id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        names.id, ": ", request->id.size(), " bytes; at most ", kMaxRequestIdBytes));
  }
  if (!IsValidUtf8(request->id)) {
    return absl::InvalidArgumentError(absl::StrCat(names.id, ": not valid UTF-8"));
  }

  const std::vector<int64_t>& dims = request->dims;
  if (dims.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(names.shape, ": too many dimensions"));
  }
  const int rank = static_cast<int>(dims.size());
  absl::StatusOr<int64_t> elements = CountElements(dims, names.shape);
  if (!elements.ok()) return elements.status();
  parsed.elements = *elements;

  const int64_t item_size = ItemSize(request->dtype);
  if (!MultiplyChecked(parsed.elements, item_size, &parsed.bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        names.shape, ": ", parsed.elements, " elements of ", DTypeName(request->dtype),
        " overflow int64 bytes"));
  }
  if (parsed.bytes > limits.max_tensor_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        names.input, ": tensor of ", parsed.bytes, " bytes exceeds the server's limit of ",
        limits.max_tensor_bytes, " bytes (--max_tensor_bytes)"));
  }

  absl::StatusOr<int> axis = NormalizeAxis(request->axis, rank, names.axis);
  if (!axis.ok()) return axis.status();
  parsed.axis = *axis;

  if (request->temperature.has_value()) {
    // Checked as given, then narrowed: what the kernels compute with.
    const double t = *request->temperature;
    if (!std::isfinite(t) || t <= 0.0) {
      return absl::InvalidArgumentError(
          absl::StrCat(names.temperature, ": must be finite and > 0, got ", t));
    }
    parsed.options.temperature = static_cast<float>(t);
  }
  parsed.options.log = request->log;

  // After the shape: a scalar's axis has length 1.
  const int64_t axis_length = rank == 0 ? 1 : dims[parsed.axis];
  if (request->top_k < 0 || request->top_k > axis_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        names.top_k, ": must be in [0, ", axis_length,
        "] (0: the whole output; at most the length of axis ", parsed.axis, "), got ",
        request->top_k));
  }

  if (parsed.elements == 0) {
    // outer * inner may overflow when the axis itself is 0; nothing to compute.
    parsed.shape = SoftmaxShape{0, rank == 0 ? 1 : dims[parsed.axis], 1};
  } else if (rank > 0) {
    int64_t outer = 1;
    int64_t inner = 1;
    for (int i = 0; i < parsed.axis; ++i) outer *= dims[i];
    for (int i = parsed.axis + 1; i < rank; ++i) inner *= dims[i];
    parsed.shape = SoftmaxShape{outer, dims[parsed.axis], inner};
  }  // else: a scalar is one row of length 1, the default SoftmaxShape.
  return absl::OkStatus();
}

absl::Status ValidateRequest(InferenceRequest* request, const RequestLimits& limits,
                             const FieldNames& names) {
  if (absl::Status header = ValidateHeader(request, limits, names); !header.ok()) return header;
  ValidatedTensor& parsed = request->tensor;
  if (request->input.bytes != parsed.bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        names.data, ": expected ", parsed.bytes, " bytes (", parsed.elements, " elements of ",
        DTypeName(request->dtype), "), got ", request->input.bytes));
  }
  const OutputSink& output = request->output;
  if (output.region != nullptr && request->top_k != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        names.top_k,
        ": a top K is not written into a shared-memory output region; leave the region "
        "out (the answer comes in the response) or ask for the whole output"));
  }
  if (output.region != nullptr && output.region_bytes < parsed.bytes) {
    return absl::InvalidArgumentError(absl::StrCat(names.output_region, ": ", output.region_bytes,
                                                   " bytes, smaller than the output's ",
                                                   parsed.bytes, " bytes"));
  }
  parsed.valid = true;
  return absl::OkStatus();
}

}  // namespace softmax::server
