#include "server/server_options.h"

#include "absl/strings/str_cat.h"
#include "server/device.h"
#include "server/logging/log.h"
#include "server/shm/shared_memory.h"

namespace softmax::server {
namespace {

absl::Status MustBePositive(const char* flag, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(flag, ": must be positive, got ", value));
}

absl::Status MustNotBeNegative(const char* flag, int64_t value) {
  if (value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(flag, ": must not be negative, got ", value));
}

absl::Status AgeInRange(const char* flag, int64_t seconds) {
  if (seconds >= 0 && seconds <= kMaxConnectionAgeS) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": 0 (no maximum) to ", kMaxConnectionAgeS, ", got ", seconds));
}

}  // namespace

absl::Status Validate(const ServerOptions& options) {
  if (absl::StatusOr<DeviceSpec> device = ParseDeviceSpec(options.device); !device.ok()) {
    return device.status();
  }
  if (absl::StatusOr<SharedMemoryMode> mode = ParseSharedMemoryMode(options.shared_memory);
      !mode.ok()) {
    return mode.status();
  }
  if (absl::StatusOr<logging::LogFormat> format = logging::ParseLogFormat(options.log_format);
      !format.ok()) {
    return format.status();
  }
  for (absl::Status status : {
           MustBePositive("--max_tensor_bytes", options.max_tensor_bytes),
           MustBePositive("--max_batch_rows", options.max_batch_rows),
           MustBePositive("--max_batch_bytes", options.max_batch_bytes),
           MustBePositive("--max_queued_requests", options.max_queued_requests),
           MustBePositive("--max_concurrent_streams", options.max_concurrent_streams),
           AgeInRange("--max_connection_age_s", options.max_connection_age_s),
           AgeInRange("--max_stream_age_s", options.max_stream_age_s),
           MustNotBeNegative("--max_queue_delay_us", options.max_queue_delay_us),
           MustNotBeNegative("--shutdown_grace_s", options.shutdown_grace_s),
           MustNotBeNegative("--access_log_one_in", options.access_log_one_in),
           MustNotBeNegative("SOFTMAX_TEST_INJECT_FAULT_AFTER_BATCHES",
                             options.inject_fault_after_batches),
       }) {
    if (!status.ok()) return status;
  }
  if (options.max_held_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_held_bytes: must be >= 0 (0: no bound), got ", options.max_held_bytes));
  }
  if (options.max_queue_delay_us > kMaxQueueDelayUs) {
    return absl::InvalidArgumentError(absl::StrCat("--max_queue_delay_us: at most ",
                                                   kMaxQueueDelayUs, " (an hour), got ",
                                                   options.max_queue_delay_us));
  }
  return absl::OkStatus();
}

}  // namespace softmax::server
