#include "server/cuda/cuda_status.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace softmax::server {
namespace {
constexpr char kCudaErrorPayload[] = "softmax.cuda_error";
}  // namespace

bool IsStickyCudaError(cudaError_t error) {
  switch (error) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDevicesUnavailable:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

absl::Status CudaStatus(cudaError_t error, const char* expression, const char* file, int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  // Reset the per-thread last error so a later check does not see this one
  // again; a sticky error stays regardless.
  if (!IsStickyCudaError(error)) cudaGetLastError();
  const std::string message =
      absl::StrCat(expression, " failed: ", cudaGetErrorName(error), " (",
                   cudaGetErrorString(error), ") at ", file, ":", line);
  absl::Status status = error == cudaErrorMemoryAllocation
                            ? absl::ResourceExhaustedError(message)
                            : absl::InternalError(message);
  status.SetPayload(kCudaErrorPayload, absl::Cord(absl::StrCat(static_cast<int>(error))));
  return status;
}

cudaError_t CudaErrorOf(const absl::Status& status) {
  const absl::optional<absl::Cord> payload = status.GetPayload(kCudaErrorPayload);
  int value = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &value)) return cudaSuccess;
  return static_cast<cudaError_t>(value);
}

}  // namespace softmax::server
