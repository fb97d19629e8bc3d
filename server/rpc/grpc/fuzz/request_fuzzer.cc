// libFuzzer target: arbitrary bytes as a SoftmaxRequest, through validation
// and, when valid, through the CPU row routine. Checks the invariants the
// backends rely on: an accepted request's bytes match its shape, its rows
// cover exactly its elements, and computing it touches only its buffers
// (AddressSanitizer) without undefined behaviour (UBSan).
//
// Build (clang, see server/fuzz/README.md):
//   CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DSOFTMAX_BUILD_FUZZERS=ON \
//       -DSOFTMAX_ENABLE_CUDA=OFF -DSOFTMAX_BUILD_TESTS=OFF
//   cmake --build build-fuzz --target request_fuzzer
//   build-fuzz/bin/request_fuzzer -max_total_time=120 server/fuzz/corpus
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cpu_softmax.h"
#include "server/rpc/softmax_v1.h"
#include "server/rpc/validation.h"
#include "softmax/v1/softmax.pb.h"

namespace {

// Small limits keep every accepted request cheap to compute.
constexpr int64_t kMaxTensorBytes = 1 << 16;

void Check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  softmax::v1::SoftmaxRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  softmax::server::RequestLimits limits;
  limits.max_tensor_bytes = kMaxTensorBytes;
  softmax::server::InferenceRequest submitted;
  absl::Status status = softmax::server::HeaderFromSoftmaxV1(request, &submitted);
  submitted.input.data = request.input().data().data();
  submitted.input.bytes = static_cast<int64_t>(request.input().data().size());
  if (status.ok()) {
    status = softmax::server::ValidateRequest(&submitted, limits,
                                              softmax::server::kSoftmaxV1Fields);
  }
  if (!status.ok()) {
    // Every refusal is a client error that names what is wrong.
    Check(status.code() == absl::StatusCode::kInvalidArgument);
    Check(!status.message().empty());
    return 0;
  }
  const softmax::server::ValidatedTensor& p = submitted.tensor;
  Check(p.valid);
  Check(p.bytes == static_cast<int64_t>(request.input().data().size()));
  Check(p.bytes <= kMaxTensorBytes);
  Check(p.bytes == p.elements * softmax::ItemSize(submitted.dtype));
  Check(p.shape.rows() * p.shape.n == p.elements || p.elements == 0);
  std::string output(static_cast<size_t>(p.bytes), '\0');
  softmax::CpuSoftmaxRows(request.input().data().data(), output.data(), submitted.dtype, p.shape,
                          p.options, 0, p.elements == 0 ? 0 : p.shape.rows());
  return 0;
}
