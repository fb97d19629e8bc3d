// The server's logs: timestamped, levelled lines on stderr through spdlog,
// as text or as one JSON object per line (--log_format), and the optional
// access log: one line per finished request, one request in N
// (--access_log_one_in).
//
//   text:  2026-12-01T00:06:15.123456Z I softmax-server: listening grpc=0.0.0.0:50051 ...
//          2026-12-01T00:06:15.200001Z I access: method=Softmax code=OK bytes=2048 ...
//   json:  {"time":"2026-12-01T00:06:15.123456Z","level":"info","logger":"softmax-server",
//           "msg":"listening","grpc":"0.0.0.0:50051",...}
//
// A line is a message and fields (key, value): text writes them logfmt-style
// after the message (key=value, the value quoted when it holds a space, a
// quote or an equals sign), JSON as members beside "msg". Keys are fixed
// identifiers chosen at the call site.
//
// Thread-safety: ConfigureLogging once from main() before other threads
// start; everything else from any thread (each line is written whole).
// Before ConfigureLogging, lines go out as text.
#ifndef SOFTMAX_SERVER_LOGGING_LOG_H_
#define SOFTMAX_SERVER_LOGGING_LOG_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace softmax::server::logging {

enum class LogFormat {
  kText,  // for people: timestamp, level letter, source, message, key=value
  kJson,  // for log pipelines (Loki, Elasticsearch, Cloud Logging): one object a line
};

// "text" or "json"; INVALID_ARGUMENT naming --log_format otherwise.
absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view text);

struct LogOptions {
  LogFormat format = LogFormat::kText;
  // Access log: one finished request in this many is logged; 0 = none,
  // 1 = every request.
  int64_t access_log_one_in = 0;
};

// Sets the format and the access log. REQUIRES: called before other threads
// log; INVALID_ARGUMENT when access_log_one_in is negative.
absl::Status ConfigureLogging(const LogOptions& options);

// One field of a line: a string value (quoted in JSON) or a number.
class LogField {
 public:
  LogField(absl::string_view key, absl::string_view value)
      : key_(key), value_(value), quoted_(true) {}
  LogField(absl::string_view key, const char* value) : LogField(key, absl::string_view(value)) {}
  LogField(absl::string_view key, const std::string& value)
      : LogField(key, absl::string_view(value)) {}
  template <typename Number,
            typename = std::enable_if_t<std::is_arithmetic_v<Number> &&
                                        !std::is_same_v<Number, bool>>>
  LogField(absl::string_view key, Number value)
      : key_(key), value_(absl::StrCat(value)), quoted_(false) {}
  LogField(absl::string_view key, bool value)
      : key_(key), value_(value ? "true" : "false"), quoted_(false) {}

  absl::string_view key() const { return key_; }
  absl::string_view value() const { return value_; }
  bool quoted() const { return quoted_; }

 private:
  absl::string_view key_;
  std::string value_;
  bool quoted_;
};

using LogFields = std::initializer_list<LogField>;

void LogInfo(absl::string_view message, LogFields fields = {});
void LogWarning(absl::string_view message, LogFields fields = {});
void LogError(absl::string_view message, LogFields fields = {});

// True when the access log is on: lets a front-end skip gathering what only
// the access log needs.
bool AccessLogEnabled();

// One finished request (or stream message), as the request metrics count
// them: `method` as softmax_requests_total's label, `code` the gRPC code
// (for HTTP, the one its status was mapped from), `bytes` the data moved
// (input + output), `seconds` from receipt to response. Logs one call in N
// (--access_log_one_in); `peer` is asked only for a call that is logged.
void LogAccess(absl::string_view method, absl::StatusCode code, int64_t bytes, double seconds,
               absl::FunctionRef<std::string()> peer);

// What a line's payload looks like in `format` (the part after the source:
// text "message k=v ...", JSON "\"msg\":...,\"k\":v"); for the tests.
std::string RenderPayload(LogFormat format, absl::string_view message, LogFields fields);

}  // namespace softmax::server::logging

#endif  // SOFTMAX_SERVER_LOGGING_LOG_H_
