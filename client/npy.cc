#include "client/npy.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/tensor.h"
#include "kernels/dtype.h"

namespace softmax::client {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("npy: ", what));
}

// Bytes per element for the descrs we accept; 0 otherwise.
int DescrItemSize(absl::string_view descr) {
  if (descr == "<f4") return 4;
  if (descr == "<f2" || descr == "<u2") return 2;
  if (descr == "<f8") return 8;
  return 0;
}

// Returns the text after `'key':` (either quote style) in a header dict, or
// nullopt when the key is absent.
std::optional<absl::string_view> ValueOf(absl::string_view header, absl::string_view key) {
  for (const char quote : {'\'', '"'}) {
    const std::string needle = absl::StrCat(std::string(1, quote), key, std::string(1, quote));
    const size_t at = header.find(needle);
    if (at == absl::string_view::npos) continue;
    absl::string_view rest = header.substr(at + needle.size());
    rest = absl::StripLeadingAsciiWhitespace(rest);
    if (!absl::ConsumePrefix(&rest, ":")) return std::nullopt;
    return absl::StripLeadingAsciiWhitespace(rest);
  }
  return std::nullopt;
}

uint32_t ReadLittleEndian(absl::string_view bytes, size_t offset, int width) {
  uint32_t value = 0;
  for (int i = width - 1; i >= 0; --i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[offset + i]);
  }
  return value;
}

std::string PythonShape(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "()";
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    absl::StrAppend(&text, i ? ", " : "", shape[i]);
  }
  absl::StrAppend(&text, shape.size() == 1 ? ",)" : ")");
  return text;
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes) {
  if (bytes.size() < kMagicSize + 4 || bytes.substr(0, kMagicSize) != absl::string_view(kMagic, kMagicSize)) {
    return Malformed("not a .npy file (bad magic)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_offset = 0;
  size_t header_size = 0;
  if (major == 1) {
    header_size = ReadLittleEndian(bytes, 8, 2);
    header_offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return Malformed("truncated header");
    header_size = ReadLittleEndian(bytes, 8, 4);
    header_offset = 12;
  } else {
    return Malformed(absl::StrCat("unsupported format version ", major));
  }
  if (header_offset + header_size > bytes.size()) return Malformed("truncated header");
  const absl::string_view header = bytes.substr(header_offset, header_size);

  NpyArray array;
  std::optional<absl::string_view> descr = ValueOf(header, "descr");
  if (!descr || descr->empty() || (descr->front() != '\'' && descr->front() != '"')) {
    return Malformed("header has no 'descr' string");
  }
  const size_t descr_end = descr->find(descr->front(), 1);
  if (descr_end == absl::string_view::npos) return Malformed("unterminated 'descr'");
  array.descr = std::string(descr->substr(1, descr_end - 1));
  if (array.descr == "=f4" || array.descr == "|f4") array.descr = "<f4";  // host order is little
  if (array.descr == "=f2" || array.descr == "|f2") array.descr = "<f2";
  if (array.descr == "=u2") array.descr = "<u2";
  if (array.descr == "=f8") array.descr = "<f8";
  const int item_size = DescrItemSize(array.descr);
  if (item_size == 0) {
    return Malformed(absl::StrCat(
        "dtype '", array.descr,
        "' is not supported (want '<f4', '<f2', '<u2' for bfloat16 bits, or '<f8'; "
        "convert with arr.astype(np.float32))"));
  }

  std::optional<absl::string_view> fortran = ValueOf(header, "fortran_order");
  if (!fortran) return Malformed("header has no 'fortran_order'");
  if (absl::StartsWith(*fortran, "True")) {
    return Malformed("Fortran-ordered arrays are not supported; save np.ascontiguousarray(arr)");
  }
  if (!absl::StartsWith(*fortran, "False")) return Malformed("bad 'fortran_order'");

  std::optional<absl::string_view> shape_text = ValueOf(header, "shape");
  if (!shape_text || !absl::StartsWith(*shape_text, "(")) return Malformed("header has no 'shape' tuple");
  const size_t close = shape_text->find(')');
  if (close == absl::string_view::npos) return Malformed("unterminated 'shape'");
  for (absl::string_view part : absl::StrSplit(shape_text->substr(1, close - 1), ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (part.empty()) continue;  // "(5,)" and "()"
    if (absl::ConsumeSuffix(&part, "L")) {}  // Python 2 longs
    int64_t dim = 0;
    if (!absl::SimpleAtoi(part, &dim) || dim < 0) {
      return Malformed(absl::StrCat("bad dimension \"", part, "\" in 'shape'"));
    }
    array.shape.push_back(dim);
  }
  absl::StatusOr<int64_t> count = ElementCount(array.shape);
  if (!count.ok()) return Malformed(count.status().message());
  const size_t data_offset = header_offset + header_size;
  const size_t data_size = bytes.size() - data_offset;
  if (*count > static_cast<int64_t>(bytes.size() / item_size) ||
      static_cast<size_t>(*count) * item_size != data_size) {
    return Malformed(absl::StrCat("data is ", data_size, " bytes; shape ",
                                  PythonShape(array.shape), " of '", array.descr, "' needs ",
                                  *count, " x ", item_size));
  }
  array.data = std::string(bytes.substr(data_offset));
  return array;
}

std::string SerializeNpy(const NpyArray& array) {
  std::string header = absl::StrCat("{'descr': '", array.descr,
                                    "', 'fortran_order': False, 'shape': ",
                                    PythonShape(array.shape), ", }");
  // Pad with spaces and a final newline so the data starts 64-byte aligned.
  const bool version2 = kMagicSize + 2 + 2 + header.size() + 1 > 65535;
  const size_t prefix = kMagicSize + 2 + (version2 ? 4 : 2);
  const size_t total = prefix + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');

  std::string bytes(kMagic, kMagicSize);
  bytes.push_back(static_cast<char>(version2 ? 2 : 1));
  bytes.push_back(0);
  const uint32_t size = static_cast<uint32_t>(header.size());
  for (int i = 0; i < (version2 ? 4 : 2); ++i) bytes.push_back(static_cast<char>((size >> (8 * i)) & 0xff));
  bytes += header;
  bytes += array.data;
  return bytes;
}

absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    const int error = errno;
    const std::string message = absl::StrCat(path, ": ", std::strerror(error));
    return error == ENOENT ? absl::NotFoundError(message) : absl::PermissionDeniedError(message);
  }
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  absl::StatusOr<NpyArray> array = ParseNpy(contents.str());
  if (!array.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", array.status().message()));
  }
  return array;
}

absl::Status WriteNpyFile(const std::string& path, const NpyArray& array) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  const std::string bytes = SerializeNpy(array);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

absl::StatusOr<v1::Tensor> TensorFromNpy(const NpyArray& array, std::optional<v1::DType> dtype) {
  v1::Tensor tensor;
  for (int64_t dim : array.shape) tensor.add_shape(dim);
  if (array.descr == "<u2") {
    if (dtype && *dtype != v1::DTYPE_BFLOAT16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "npy: a '<u2' array holds raw bfloat16 bits; it cannot be sent as ",
          WireDTypeName(*dtype)));
    }
    tensor.set_dtype(v1::DTYPE_BFLOAT16);
    tensor.set_data(array.data);
    return tensor;
  }
  v1::DType file_dtype = v1::DTYPE_FLOAT32;
  if (array.descr == "<f2") file_dtype = v1::DTYPE_FLOAT16;
  if (array.descr != "<f4" && array.descr != "<f2" && array.descr != "<f8") {
    return absl::InvalidArgumentError(absl::StrCat("npy: dtype '", array.descr, "' is not supported"));
  }
  const v1::DType target = dtype.value_or(file_dtype);
  if (array.descr != "<f8" && target == file_dtype) {
    tensor.set_dtype(target);
    tensor.set_data(array.data);
    return tensor;
  }
  // Round each element to the target type.
  const int in_size = DescrItemSize(array.descr);
  const size_t count = array.data.size() / in_size;
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) {
    const char* element = array.data.data() + i * in_size;
    if (in_size == 8) {
      double value;
      std::memcpy(&value, element, 8);
      values[i] = static_cast<float>(value);  // one rounding for float32 targets
    } else {
      values[i] = LoadAsFloat(element, static_cast<DType>(file_dtype), 0);
    }
  }
  return TensorFromFloats(values, array.shape, target);
}

NpyArray NpyFromTensor(const v1::Tensor& tensor) {
  NpyArray array;
  array.shape = ShapeOf(tensor);
  array.data = tensor.data();
  switch (tensor.dtype()) {
    case v1::DTYPE_FLOAT16: array.descr = "<f2"; break;
    case v1::DTYPE_BFLOAT16: array.descr = "<u2"; break;
    default: array.descr = "<f4"; break;
  }
  return array;
}

}  // namespace softmax::client
