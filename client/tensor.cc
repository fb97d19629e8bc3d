#include "client/tensor.h"

#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/dtype.h"

namespace softmax::client {

absl::StatusOr<v1::DType> ParseDType(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(name));
  if (lower == "float32" || lower == "fp32" || lower == "f32" || lower == "float") {
    return v1::DTYPE_FLOAT32;
  }
  if (lower == "float16" || lower == "fp16" || lower == "f16" || lower == "half") {
    return v1::DTYPE_FLOAT16;
  }
  if (lower == "bfloat16" || lower == "bf16") return v1::DTYPE_BFLOAT16;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype: unknown \"", name, "\" (want float32, float16 or bfloat16)"));
}

const char* WireDTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return "float32";
    case v1::DTYPE_FLOAT16: return "float16";
    case v1::DTYPE_BFLOAT16: return "bfloat16";
    default: return "unspecified";
  }
}

int WireItemSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return 4;
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16: return 2;
    default: return 0;
  }
}

namespace {

// "1024", "16K" (x 1024), "16M" (x 1048576); false when not a non-negative
// integer or when the scaled value overflows int64.
bool ParseDimension(absl::string_view text, int64_t* value) {
  int64_t scale = 1;
  if (absl::ConsumeSuffix(&text, "K") || absl::ConsumeSuffix(&text, "k")) {
    scale = int64_t{1} << 10;
  } else if (absl::ConsumeSuffix(&text, "M") || absl::ConsumeSuffix(&text, "m")) {
    scale = int64_t{1} << 20;
  }
  int64_t base = 0;
  if (!absl::SimpleAtoi(text, &base) || base < 0) return false;
  if (base > INT64_MAX / scale) return false;
  *value = base * scale;
  return true;
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view text) {
  std::vector<int64_t> shape;
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return shape;
  for (absl::string_view part : absl::StrSplit(text, absl::ByAnyChar(",x"))) {
    int64_t dim = 0;
    if (!ParseDimension(absl::StripAsciiWhitespace(part), &dim)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape: \"", part, "\" is not a non-negative integer (K and M suffixes allowed) in \"",
          text, "\""));
    }
    shape.push_back(dim);
  }
  return shape;
}

std::string FormatShape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<int64_t> ElementCount(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t dim = shape[i];
    if (dim < 0) {
      return absl::InvalidArgumentError(absl::StrCat("shape[", i, "] = ", dim, " is negative"));
    }
    if (dim == 0) return 0;  // a zero dimension wins over any overflow
    if (count > INT64_MAX / dim) overflow = true;
    if (!overflow) count *= dim;
  }
  if (overflow) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", FormatShape(shape), ": element count overflows int64"));
  }
  return count;
}

std::vector<int64_t> ShapeOf(const v1::Tensor& tensor) {
  return std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end());
}

absl::StatusOr<v1::Tensor> MakeRandomTensor(const RandomTensorOptions& options) {
  const int item_size = WireItemSize(options.dtype);
  if (item_size == 0) return absl::InvalidArgumentError("dtype: unspecified");
  absl::StatusOr<int64_t> count = ElementCount(options.shape);
  if (!count.ok()) return count.status();
  if (*count > options.max_bytes / item_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", FormatShape(options.shape), " of ", WireDTypeName(options.dtype),
                     " needs ", *count, " elements; more than the ", options.max_bytes,
                     "-byte limit"));
  }
  std::mt19937_64 engine(options.seed);
  std::normal_distribution<float> normal(options.mean, options.stddev);
  v1::Tensor tensor;
  tensor.set_dtype(options.dtype);
  for (int64_t dim : options.shape) tensor.add_shape(dim);
  std::string* data = tensor.mutable_data();
  data->resize(static_cast<size_t>(*count) * item_size);
  const DType dtype = static_cast<DType>(options.dtype);
  for (int64_t i = 0; i < *count; ++i) StoreFromFloat(data->data(), dtype, i, normal(engine));
  return tensor;
}

std::vector<float> TensorToFloats(const v1::Tensor& tensor) {
  const int item_size = WireItemSize(tensor.dtype());
  if (item_size == 0) return {};
  const int64_t count = static_cast<int64_t>(tensor.data().size()) / item_size;
  std::vector<float> values(count);
  const DType dtype = static_cast<DType>(tensor.dtype());
  for (int64_t i = 0; i < count; ++i) values[i] = LoadAsFloat(tensor.data().data(), dtype, i);
  return values;
}

v1::Tensor TensorFromFloats(const std::vector<float>& values, const std::vector<int64_t>& shape,
                            v1::DType dtype) {
  v1::Tensor tensor;
  tensor.set_dtype(dtype);
  for (int64_t dim : shape) tensor.add_shape(dim);
  std::string* data = tensor.mutable_data();
  data->resize(values.size() * WireItemSize(dtype));
  const DType kernel_dtype = static_cast<DType>(dtype);
  for (size_t i = 0; i < values.size(); ++i) {
    StoreFromFloat(data->data(), kernel_dtype, static_cast<int64_t>(i), values[i]);
  }
  return tensor;
}

absl::Status CheckTensorBytes(const v1::Tensor& tensor) {
  const int item_size = WireItemSize(tensor.dtype());
  if (item_size == 0) return absl::InvalidArgumentError("dtype: unspecified");
  absl::StatusOr<int64_t> count = ElementCount(ShapeOf(tensor));
  if (!count.ok()) return count.status();
  if (*count > INT64_MAX / item_size ||
      static_cast<int64_t>(tensor.data().size()) != *count * item_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data: ", tensor.data().size(), " bytes, but shape ", FormatShape(ShapeOf(tensor)),
        " of ", WireDTypeName(tensor.dtype()), " needs ", *count, " x ", item_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<SoftmaxShape> ShapeAlongAxis(const std::vector<int64_t>& shape, int axis) {
  const int rank = static_cast<int>(shape.size());
  const int effective_rank = rank == 0 ? 1 : rank;
  const int normalized = axis < 0 ? axis + effective_rank : axis;
  if (normalized < 0 || normalized >= effective_rank) {
    return absl::InvalidArgumentError(absl::StrCat("axis ", axis, " is out of range for shape ",
                                                   FormatShape(shape)));
  }
  absl::StatusOr<int64_t> count = ElementCount(shape);
  if (!count.ok()) return count.status();
  SoftmaxShape view;
  if (rank == 0) return view;  // {1, 1, 1}
  if (*count == 0) {
    // Empty: no rows. Products of the other dimensions could overflow here.
    view.outer = 0;
    view.n = shape[normalized];
    view.inner = 0;
    return view;
  }
  for (int d = 0; d < normalized; ++d) view.outer *= shape[d];
  view.n = shape[normalized];
  for (int d = normalized + 1; d < rank; ++d) view.inner *= shape[d];
  return view;
}

}  // namespace softmax::client
