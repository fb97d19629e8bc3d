// What a `softmax-client load` run measured, and its renderings: the text
// report printed at the end, the live progress line, one JSON object (written
// with nlohmann-json) and one CSV row. The JSON field names and CSV columns
// are read by bench/service/run.py, bench/service/breakdown.py,
// bench/batching/run.py and tests/test_load.py; renaming one breaks them.
//
// Thread-safety: plain values and pure functions, safe to call concurrently;
// WriteLoadReportJson and AppendLoadReportCsv write the file system (two
// appends to one CSV file at once may interleave).
#ifndef SOFTMAX_CLIENT_LOAD_REPORT_H_
#define SOFTMAX_CLIENT_LOAD_REPORT_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "client/load/options.h"

namespace softmax::client {

// gRPC status codes 0 (OK) .. 16 (UNAUTHENTICATED).
inline constexpr int kGrpcStatusCodes = 17;

// "UNAVAILABLE" for 14; "UNKNOWN" for a code outside 0..16.
const char* GrpcStatusCodeName(int code);

// Latency figures in nanoseconds.
struct LatencySummary {
  uint64_t count = 0;
  int64_t min = 0, p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;
  double mean = 0.0;
};

// What one run measured. Counts cover the measured phase unless named warmup_*.
struct LoadReport {
  LoadOptions options;       // as run (connections capped at concurrency)
  std::string mode;          // "closed" or "open"
  int64_t requests = 0;      // measured requests that finished (ok + errors)
  int64_t ok = 0;
  // Errors by gRPC status code (index = code). For streams a per-request
  // `error` counts under its code as well.
  std::array<int64_t, kGrpcStatusCodes> errors_by_code{};
  int64_t errors = 0;        // sum of errors_by_code
  int64_t warmup_requests = 0;
  int64_t warmup_errors = 0;
  int64_t verified = 0;      // responses compared with the reference (all phases)
  int64_t mismatches = 0;    // responses with at least one element out of tolerance
  std::string first_mismatch;  // what was wrong with the first one
  // --stream: gRPC streams reopened after the server ended them with
  // UNAVAILABLE (maximum age, drain, reset), and the requests they left
  // unanswered that were written again on the new ones (each still counted
  // once above).
  int64_t stream_reopens = 0;
  int64_t resent_requests = 0;
  // Of those, the streams the transport lost (a connection reset: an
  // UNAVAILABLE the server did not end the stream with), and the requests
  // resent after them: the server may have computed some of these already,
  // their answers lost with the connection, so it computes them twice. After
  // the server's own ends (age, drain) nothing resent was computed.
  int64_t streams_lost = 0;
  int64_t resent_after_loss = 0;
  // Why the run stopped before its end, empty when it ran its course (or was
  // stopped by the caller).
  std::string ended_early;
  double elapsed_seconds = 0.0;  // measured phase: its start to the last completion
  double offered_rate = 0.0;     // open loop: requests/s asked for
  double requests_per_second = 0.0;
  double rows_per_second = 0.0;
  // (request + response tensor bytes) per second of OK requests, in 1e9 B/s.
  double payload_gb_per_second = 0.0;
  int64_t rows = 0;
  int64_t payload_bytes = 0;
  LatencySummary latency;    // OK measured requests only
  // Means over OK responses of the server's `timing`.
  double mean_batch_requests = 0.0;
  double mean_batch_rows = 0.0;
  double mean_queue_us = 0.0;
  double mean_compute_us = 0.0;
  double mean_kernel_us = 0.0;    // of the compute, the GPU kernels' time
  double mean_dispatch_us = 0.0;  // submit to the start of the compute
};

// One sample of a run in progress, taken about once a second.
struct LoadProgress {
  double elapsed_seconds = 0.0;  // since the run started (warm-up included)
  bool measuring = false;        // false during the warm-up
  double requests_per_second = 0.0;  // OK requests since the previous sample
  int64_t p50_ns = 0;                // of those requests
  int64_t p99_ns = 0;
  int64_t errors = 0;  // failed requests since the run started
};

// The human-readable final report, several lines.
std::string FormatLoadReport(const LoadReport& report);

// The progress line, without a line end: meant to be redrawn in place
// after a '\r'.
std::string FormatLoadProgress(const LoadProgress& progress);

// The report as one JSON object (latencies in microseconds), pretty-printed
// with a final newline.
std::string LoadReportJson(const LoadReport& report);

// CSV header line and the report's row (same columns), each with a newline.
// A label holding a comma, quote or line break is quoted.
std::string LoadReportCsvHeader();
std::string LoadReportCsvRow(const LoadReport& report);

// Writes LoadReportJson to `path`, replacing the file. INTERNAL (naming the
// path) when it cannot be written.
absl::Status WriteLoadReportJson(const std::string& path, const LoadReport& report);

// Appends the report's CSV row to `path`, preceded by the header when the file
// is new or empty. INTERNAL (naming the path) when it cannot be written.
absl::Status AppendLoadReportCsv(const std::string& path, const LoadReport& report);

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_LOAD_REPORT_H_
