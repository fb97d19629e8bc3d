#include "server/logging/log.h"

#include <atomic>
#include <memory>
#include <utility>

#include <spdlog/logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace softmax::server::logging {
namespace {

constexpr char kServerSource[] = "softmax-server";
constexpr char kAccessSource[] = "access";

// Both patterns write UTC with microseconds; %n is the source (logger name),
// %v the payload RenderPayload made.
constexpr char kTextPattern[] = "%Y-%m-%dT%H:%M:%S.%fZ %L %n: %v";
constexpr char kJsonPattern[] =
    "{\"time\":\"%Y-%m-%dT%H:%M:%S.%fZ\",\"level\":\"%l\",\"logger\":\"%n\",%v}";

struct Loggers {
  LogFormat format;
  std::shared_ptr<spdlog::logger> server;
  std::shared_ptr<spdlog::logger> access;
  // The set this one replaced, kept alive and reachable (see `current`).
  std::unique_ptr<Loggers> replaced;
};

std::shared_ptr<spdlog::logger> MakeLogger(const char* source,
                                           const std::shared_ptr<spdlog::sinks::sink>& sink,
                                           LogFormat format) {
  auto logger = std::make_shared<spdlog::logger>(source, sink);
  logger->set_formatter(std::make_unique<spdlog::pattern_formatter>(
      format == LogFormat::kJson ? kJsonPattern : kTextPattern, spdlog::pattern_time_type::utc,
      // A payload never holds a newline of its own (RenderPayload escapes them).
      "\n"));
  logger->set_level(spdlog::level::info);
  // stderr lines are read by supervisors and tests as they come.
  logger->flush_on(spdlog::level::info);
  return logger;
}

Loggers* MakeLoggers(LogFormat format) {
  // One sink, so the two sources' lines never interleave mid-line.
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  return new Loggers{format, MakeLogger(kServerSource, sink, format),
                     MakeLogger(kAccessSource, sink, format), nullptr};
}

// Written by ConfigureLogging before other threads start (see log.h); the
// previous set is kept alive, since a line may be on its way through it, and
// owned by its successor, so that nothing is lost track of (one set per
// ConfigureLogging call: once in a server).
std::atomic<Loggers*> current{nullptr};
std::atomic<int64_t> access_one_in{0};
std::atomic<uint64_t> access_calls{0};

Loggers& Current() {
  Loggers* loggers = current.load(std::memory_order_acquire);
  if (loggers != nullptr) return *loggers;
  Loggers* made = MakeLoggers(LogFormat::kText);
  if (current.compare_exchange_strong(loggers, made, std::memory_order_acq_rel)) return *made;
  delete made;
  return *loggers;
}

// JSON's two-character escape of `c`, or null where it has none.
const char* ShortEscape(char c) {
  switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: return nullptr;
  }
}

void AppendJsonString(std::string* out, absl::string_view text) {
  out->push_back('"');
  for (const char c : text) {
    if (const char* escape = ShortEscape(c)) {
      out->append(escape);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      static constexpr char kHex[] = "0123456789abcdef";
      out->append("\\u00");
      out->push_back(kHex[(c >> 4) & 0xf]);
      out->push_back(kHex[c & 0xf]);
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

// logfmt: bare when the value is a plain token, else quoted like JSON.
void AppendTextValue(std::string* out, absl::string_view value) {
  bool plain = !value.empty();
  for (const char c : value) {
    if (c == ' ' || c == '"' || c == '=' || static_cast<unsigned char>(c) < 0x20) plain = false;
  }
  if (plain) {
    out->append(value.data(), value.size());
  } else {
    AppendJsonString(out, value);
  }
}

void Log(spdlog::logger& logger, LogFormat format, spdlog::level::level_enum level,
         absl::string_view message, LogFields fields) {
  if (!logger.should_log(level)) return;
  const std::string payload = RenderPayload(format, message, fields);
  logger.log(level, spdlog::string_view_t(payload.data(), payload.size()));
}

}  // namespace

absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view text) {
  if (text == "text") return LogFormat::kText;
  if (text == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("--log_format: expected text or json, got \"", text, "\""));
}

absl::Status ConfigureLogging(const LogOptions& options) {
  if (options.access_log_one_in < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--access_log_one_in: must not be negative, got ", options.access_log_one_in));
  }
  // The previous set stays allocated: see `current`.
  Loggers* made = MakeLoggers(options.format);
  made->replaced.reset(current.load(std::memory_order_acquire));
  current.store(made, std::memory_order_release);
  access_one_in.store(options.access_log_one_in, std::memory_order_relaxed);
  return absl::OkStatus();
}

std::string RenderPayload(LogFormat format, absl::string_view message, LogFields fields) {
  std::string out;
  if (format == LogFormat::kText) {
    out.append(message.data(), message.size());
    for (const LogField& field : fields) {
      if (!out.empty()) out.push_back(' ');
      out.append(field.key().data(), field.key().size());
      out.push_back('=');
      AppendTextValue(&out, field.value());
    }
    // One line per record, whatever the message holds.
    for (char& c : out) {
      if (c == '\n') c = ' ';
    }
    return out;
  }
  bool first = true;
  auto member = [&](absl::string_view key) {
    if (!first) out.push_back(',');
    first = false;
    AppendJsonString(&out, key);
    out.push_back(':');
  };
  if (!message.empty()) {
    member("msg");
    AppendJsonString(&out, message);
  }
  for (const LogField& field : fields) {
    member(field.key());
    if (field.quoted()) {
      AppendJsonString(&out, field.value());
    } else {
      // Numbers as numbers; JSON has no inf or nan, so those become strings.
      const absl::string_view value = field.value();
      const bool finite = value.find_first_of("ni") == absl::string_view::npos;
      if (finite) {
        out.append(value.data(), value.size());
      } else {
        AppendJsonString(&out, value);
      }
    }
  }
  return out;
}

void LogInfo(absl::string_view message, LogFields fields) {
  Loggers& loggers = Current();
  Log(*loggers.server, loggers.format, spdlog::level::info, message, fields);
}

void LogWarning(absl::string_view message, LogFields fields) {
  Loggers& loggers = Current();
  Log(*loggers.server, loggers.format, spdlog::level::warn, message, fields);
}

void LogError(absl::string_view message, LogFields fields) {
  Loggers& loggers = Current();
  Log(*loggers.server, loggers.format, spdlog::level::err, message, fields);
}

bool AccessLogEnabled() { return access_one_in.load(std::memory_order_relaxed) > 0; }

void LogAccess(absl::string_view method, absl::StatusCode code, int64_t bytes, double seconds,
               absl::FunctionRef<std::string()> peer) {
  const int64_t one_in = access_one_in.load(std::memory_order_relaxed);
  if (one_in <= 0) return;
  if (one_in > 1 &&
      access_calls.fetch_add(1, std::memory_order_relaxed) % static_cast<uint64_t>(one_in) != 0) {
    return;
  }
  Loggers& loggers = Current();
  Log(*loggers.access, loggers.format, spdlog::level::info, "",
      {{"method", method},
       {"code", absl::StatusCodeToString(code)},
       {"bytes", bytes},
       {"latency_ms", seconds * 1e3},
       {"peer", peer()}});
}

}  // namespace softmax::server::logging
