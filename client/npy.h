// NumPy .npy files (format versions 1.0, 2.0 and 3.0) for softmax-client's
// --input/--output, and their conversion to and from softmax.v1.Tensor.
//
// Element types on disk:
//   '<f4' <-> float32, '<f2' <-> float16 (bit-exact both ways).
//   '<u2' <-> bfloat16 as its raw 16 bits. NumPy has no bfloat16, so a
//         bfloat16 tensor is written as uint16 holding the bits (the high half
//         of a float32); read it back in NumPy with
//         (np.load(p).astype(np.uint32) << 16).view(np.float32).
//         Widening it to float32 on disk would hide the dtype and double the
//         size, so we never do that silently.
//   '<f8' -> read only: rounded to the requested dtype (float32 by default),
//         because np.save of a plain NumPy array gives float64.
// Fortran-ordered and big-endian arrays are refused with a message that says
// how to convert them.
//
// Thread-safety: pure functions apart from the file I/O they name.
#ifndef SOFTMAX_CLIENT_NPY_H_
#define SOFTMAX_CLIENT_NPY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::client {

// One C-ordered array as stored in a .npy file.
struct NpyArray {
  std::string descr;            // NumPy dtype string, e.g. "<f4"
  std::vector<int64_t> shape;   // empty for a 0-d array
  std::string data;             // row-major element bytes
};

// Parses the bytes of a .npy file. INVALID_ARGUMENT for anything malformed,
// Fortran-ordered, or whose data size does not match descr and shape.
absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes);

// The bytes of a .npy file (version 1.0, or 2.0 when the header needs it).
// REQUIRES: array.descr is a little-endian or byte-order-free NumPy dtype.
std::string SerializeNpy(const NpyArray& array);

// File wrappers around ParseNpy / SerializeNpy. NOT_FOUND or
// PERMISSION_DENIED style failures come back as the matching status.
absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path);
absl::Status WriteNpyFile(const std::string& path, const NpyArray& array);

// The tensor to send for `array`. With `dtype` unset the file's own type is
// kept ('<f8' becomes float32); with it set, float data is rounded to it.
// '<u2' is only accepted as bfloat16 bits. INVALID_ARGUMENT for other descrs.
absl::StatusOr<v1::Tensor> TensorFromNpy(const NpyArray& array,
                                         std::optional<v1::DType> dtype = std::nullopt);

// The array to save for `tensor` ('<f4', '<f2' or '<u2' as described above).
// REQUIRES: CheckTensorBytes(tensor).ok().
NpyArray NpyFromTensor(const v1::Tensor& tensor);

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_NPY_H_
