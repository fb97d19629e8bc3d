#include "server/server_options.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace softmax::server {
namespace {

// An AbslParseFlag by a parser returning absl::StatusOr<T>: its error's
// message is the flag's.
template <typename T, typename Parse>
bool ParseInto(Parse parse, absl::string_view text, T* value, std::string* error) {
  absl::StatusOr<T> parsed = parse(text);
  if (!parsed.ok()) {
    *error = std::string(parsed.status().message());
    return false;
  }
  *value = *std::move(parsed);
  return true;
}

absl::Status MustBePositive(const char* flag, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(flag, ": must be positive, got ", value));
}

absl::Status MustNotBeNegative(const char* flag, int64_t value) {
  if (value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(flag, ": must not be negative, got ", value));
}

absl::Status MustNotBeNegative(const char* flag, absl::Duration value) {
  if (value >= absl::ZeroDuration()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": must not be negative, got ", absl::FormatDuration(value)));
}

absl::Status AgeInRange(const char* flag, absl::Duration age) {
  if (age >= absl::ZeroDuration() && age <= kMaxConnectionAge) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      flag, ": 0 (no maximum) to ", absl::ToInt64Seconds(kMaxConnectionAge), ", got ",
      AbslUnparseFlag(SecondsFlag{age})));
}

// A DeviceSpec built by hand (not parsed) may name a GPU twice or below 0.
absl::Status CheckDevice(const DeviceSpec& spec) {
  std::vector<int> seen;
  for (int index : spec.indices) {
    if (index < 0 || std::find(seen.begin(), seen.end(), index) != seen.end()) {
      return ParseDeviceSpec(AbslUnparseFlag(spec)).status();
    }
    seen.push_back(index);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Validate(const ServerOptions& options) {
  for (absl::Status status : {
           CheckDevice(options.device),
           MustBePositive("--max_tensor_bytes", options.max_tensor_bytes),
           MustBePositive("--max_batch_rows", options.max_batch_rows),
           MustBePositive("--max_batch_bytes", options.max_batch_bytes),
           MustBePositive("--max_queued_requests", options.max_queued_requests),
           MustBePositive("--max_concurrent_streams", options.max_concurrent_streams),
           AgeInRange("--max_connection_age_s", options.max_connection_age),
           AgeInRange("--max_stream_age_s", options.max_stream_age),
           MustNotBeNegative("--max_queue_delay_us", options.max_queue_delay),
           MustNotBeNegative("--shutdown_grace_s", options.shutdown_grace),
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
  if (options.max_queue_delay > kMaxQueueDelay) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_queue_delay_us: at most ", absl::ToInt64Microseconds(kMaxQueueDelay),
        " (an hour), got ", AbslUnparseFlag(MicrosecondsFlag{options.max_queue_delay})));
  }
  return absl::OkStatus();
}

bool AbslParseFlag(absl::string_view text, DeviceSpec* spec, std::string* error) {
  return ParseInto(ParseDeviceSpec, text, spec, error);
}

std::string AbslUnparseFlag(const DeviceSpec& spec) {
  switch (spec.kind) {
    case DeviceSpec::Kind::kAuto:
      return "auto";
    case DeviceSpec::Kind::kCpu:
      return "cpu";
    case DeviceSpec::Kind::kNone:
      return "none";
    case DeviceSpec::Kind::kCuda:
      break;
  }
  return spec.indices.empty() ? "cuda:all" : absl::StrCat("cuda:", absl::StrJoin(spec.indices, ","));
}

bool AbslParseFlag(absl::string_view text, SharedMemoryMode* mode, std::string* error) {
  return ParseInto(ParseSharedMemoryMode, text, mode, error);
}

std::string AbslUnparseFlag(SharedMemoryMode mode) {
  switch (mode) {
    case SharedMemoryMode::kOff:
      return "off";
    case SharedMemoryMode::kSystem:
      return "system";
    case SharedMemoryMode::kAll:
      break;
  }
  return "all";
}

}  // namespace softmax::server

namespace softmax::server::logging {

bool AbslParseFlag(absl::string_view text, LogFormat* format, std::string* error) {
  return ParseInto(ParseLogFormat, text, format, error);
}

std::string AbslUnparseFlag(LogFormat format) {
  return format == LogFormat::kJson ? "json" : "text";
}

}  // namespace softmax::server::logging
