// Everything softmax-server is configured with, one field per flag. main.cc
// fills it from the command line and hands it to Server (server/server.h);
// nothing else reads flags. Validate checks what every field must be, for
// softmax-server and for code that embeds a Server alike. What each flag means is written once, in its
// help text in main.cc (`softmax-server --help`); the measured tuning values
// that are no flags are named constants beside the code they tune
// (scheduler.cc, batcher.h, cuda_backend.h, common/malloc_tuning.h; the
// drain's in server.cc), and what follows from a flag (the queue's byte
// bound from --max_held_bytes) is derived in server.cc.
#ifndef SOFTMAX_SERVER_SERVER_OPTIONS_H_
#define SOFTMAX_SERVER_SERVER_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/device.h"
#include "server/logging/log.h"
#include "server/shm/shared_memory.h"

namespace softmax::server {

// An hour: longer batching delays are a mistake, and bounding them keeps the
// batcher's time arithmetic far from overflow.
inline constexpr absl::Duration kMaxQueueDelay = absl::Hours(1);
// gRPC takes the connection age in int milliseconds: about 24 days at most.
inline constexpr absl::Duration kMaxConnectionAge = absl::Hours(24 * 24);

// A duration flag whose name ends in its unit (--shutdown_grace_s,
// --max_queue_delay_us): a bare integer counts that unit, as the name says
// ("5"), and a number with its own unit is read as absl::ParseDuration reads
// it ("1.5s", "250ms", "2m"). Printed back as a count of the unit when it is
// whole, otherwise with its own unit. kUnitNanos: the unit in nanoseconds.
template <int64_t kUnitNanos>
struct DurationFlag {
  absl::Duration value;
};
using SecondsFlag = DurationFlag<int64_t{1000} * 1000 * 1000>;
using MicrosecondsFlag = DurationFlag<1000>;

template <int64_t kUnitNanos>
bool AbslParseFlag(absl::string_view text, DurationFlag<kUnitNanos>* flag, std::string* error) {
  int64_t count = 0;
  if (absl::SimpleAtoi(text, &count)) {
    flag->value = absl::Nanoseconds(kUnitNanos) * count;
    return true;
  }
  if (absl::ParseDuration(text, &flag->value)) return true;
  *error = "expected a whole number of the unit the flag's name ends in, or a number with "
           "its unit (1.5s, 250ms, 2m)";
  return false;
}

template <int64_t kUnitNanos>
std::string AbslUnparseFlag(DurationFlag<kUnitNanos> flag) {
  absl::Duration remainder;
  const int64_t count = absl::IDivDuration(flag.value, absl::Nanoseconds(kUnitNanos), &remainder);
  if (remainder == absl::ZeroDuration() && flag.value != absl::InfiniteDuration() &&
      flag.value != -absl::InfiniteDuration()) {
    return absl::StrCat(count);
  }
  return absl::FormatDuration(flag.value);
}

// --device, --shared_memory and --log_format as flag types: a bad value fails
// at parse, with the error of ParseDeviceSpec, ParseSharedMemoryMode or
// ParseLogFormat.
bool AbslParseFlag(absl::string_view text, DeviceSpec* spec, std::string* error);
std::string AbslUnparseFlag(const DeviceSpec& spec);
bool AbslParseFlag(absl::string_view text, SharedMemoryMode* mode, std::string* error);
std::string AbslUnparseFlag(SharedMemoryMode mode);

struct ServerOptions {
  std::string grpc_address = "0.0.0.0:50051";
  std::string metrics_address = "0.0.0.0:9464";
  std::string http_address = "0.0.0.0:8000";
  DeviceSpec device;  // auto
  int64_t max_tensor_bytes = int64_t{1} << 30;
  int64_t max_batch_rows = 8192;
  int64_t max_batch_bytes = int64_t{64} << 20;
  absl::Duration max_queue_delay = absl::ZeroDuration();
  int64_t max_queued_requests = 8192;
  int64_t max_held_bytes = int64_t{8} << 30;
  int max_concurrent_streams = 1024;
  absl::Duration max_connection_age = absl::ZeroDuration();  // none
  absl::Duration max_stream_age = absl::ZeroDuration();      // none
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  std::string auth_tokens_file;
  bool reflection = true;
  SharedMemoryMode shared_memory = SharedMemoryMode::kAll;
  absl::Duration shutdown_grace = absl::Seconds(30);
  logging::LogFormat log_format = logging::LogFormat::kText;
  int64_t access_log_one_in = 0;
  std::string listening_file;
  // Testing only, from SOFTMAX_TEST_INJECT_FAULT_AFTER_BATCHES: the GPU
  // backends provoke a real sticky fault after this many batches (0 = never).
  int64_t inject_fault_after_batches = 0;
  // Testing only, from SOFTMAX_TEST_NO_IDLE_DISPATCH=1: an idle device waits
  // --max_queue_delay_us for company like a busy one, so that end-to-end
  // tests can hold requests in the queue (BatcherOptions::dispatch_when_idle).
  bool test_no_idle_dispatch = false;
  // Not a flag: the version the KServe endpoints report in their server
  // metadata; softmax-server passes its own (SOFTMAX_VERSION).
  std::string server_version = "unknown";
  // Not a flag: the source revision the listening file reports; softmax-server
  // passes its own (SOFTMAX_GIT_REVISION).
  std::string revision = "unknown";
};

// OK when `options` can be served; otherwise INVALID_ARGUMENT naming the
// first flag out of range or unreadable ("--max_batch_rows: must be
// positive, got 0"). Server::Start calls it first; softmax-server's main
// before it configures anything. Files and addresses are checked where they
// are used (Start), not here.
absl::Status Validate(const ServerOptions& options);

}  // namespace softmax::server

namespace softmax::server::logging {
// --log_format as a flag type (beside LogFormat, where lookup finds them).
bool AbslParseFlag(absl::string_view text, LogFormat* format, std::string* error);
std::string AbslUnparseFlag(LogFormat format);
}  // namespace softmax::server::logging

#endif  // SOFTMAX_SERVER_SERVER_OPTIONS_H_
