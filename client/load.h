// `softmax-client load`: a load generator for softmax-server.
//
// Two ways to offer load:
//   closed loop  `--concurrency N` requests always in flight, spread over
//                `--connections C` channels; each completion sends the next.
//   open loop    `--rate R` requests per second, evenly spaced or Poisson,
//                sent whether or not earlier ones have finished. Latency is
//                measured from each request's intended send time, so time a
//                request spends waiting behind a slow server (or a slow
//                client) is counted instead of hidden.
// Calls use gRPC's callback API (unary) or one ClientBidiReactor per
// connection (--stream), so hundreds of requests in flight need no thread each.
//
// Payloads are built before the run (a few random tensors per --shape entry,
// chosen by weight from a precomputed schedule), so the hot path generates no
// random data. Latencies go into LatencyHistograms (one per connection, merged
// for the report); no per-request records are kept.
//
// Thread-safety: RunLoad may be called from any thread; it owns every object
// it creates and returns after all calls have finished.
#ifndef SOFTMAX_CLIENT_LOAD_H_
#define SOFTMAX_CLIENT_LOAD_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::client {

// One entry of the shape/dtype mix: "1x1024:float32:3" is a [1, 1024]
// float32 tensor sent with weight 3. Dtype and weight are optional
// ("8x4096:fp16", "1x1024"); the default dtype is float32, the default weight 1.
struct LoadShape {
  std::vector<int64_t> dims;
  v1::DType dtype = v1::DTYPE_FLOAT32;
  double weight = 1.0;  // relative frequency; > 0
};

// Parses one "DIMSxDIMS[:DTYPE[:WEIGHT]]" entry. INVALID_ARGUMENT on error.
absl::StatusOr<LoadShape> ParseLoadShape(absl::string_view text);

// Reads a shape mix file: one entry per line as above; blank lines and text
// after '#' are ignored. INVALID_ARGUMENT (naming the line) on error.
absl::StatusOr<std::vector<LoadShape>> ReadLoadShapeFile(const std::string& path);

enum class Arrival {
  kConstant,  // requests exactly 1/rate apart
  kPoisson,   // exponential gaps with mean 1/rate (independent arrivals)
};

// Everything that defines a load run. `softmax-client load --help` lists the
// matching command-line arguments.
struct LoadOptions {
  std::string target = "localhost:50051";
  // Channels, each with its own TCP connection. More connections spread the
  // client's and server's per-connection work over more threads; one is what
  // a single well-behaved caller uses. A closed loop uses at most
  // `concurrency` of them.
  int connections = 1;
  // Closed loop: requests in flight at all times. Ignored when rate > 0.
  int concurrency = 1;
  // Open loop when > 0: requests per second offered regardless of progress.
  double rate = 0.0;
  Arrival arrival = Arrival::kConstant;
  // Open loop: at most this many requests in flight; when reached, sending
  // pauses (the intended times keep running, so the wait shows in latency).
  // Bounds client memory when the server cannot keep up.
  int max_outstanding = 100000;
  // Measured phase length; the run stops sending when either limit is hit.
  // Without --requests the default is 10 s; with --requests alone, unlimited.
  absl::Duration duration = absl::Seconds(10);
  // Measured requests to send; 0 = no limit.
  int64_t requests = 0;
  // Requests sent during this leading interval are excluded from the figures
  // (still verified and still counted under "warmup").
  absl::Duration warmup = absl::Seconds(1);
  // true: SoftmaxStream, one stream per connection; false: unary Softmax.
  bool stream = false;
  // The payload mix; empty means a single 1x1024 float32 entry.
  std::vector<LoadShape> shapes;
  // Distinct random tensors built per shape (cycled through). Shapes of more
  // than 16 MiB get one, to bound client memory.
  int payloads_per_shape = 4;
  uint64_t seed = 1;
  // Request fields sent with every payload.
  int axis = -1;
  float temperature = 1.0f;
  bool log = false;
  // Check every response against the float64 CPU reference (precomputed per
  // payload) with |y - ref| <= 1e-6 + rtol * |ref|. Costs client CPU.
  bool verify = false;
  // Per-call deadline; absl::InfiniteDuration() for none.
  absl::Duration timeout = absl::Seconds(60);
  // How long to wait for the first connection before giving up.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Live progress line on stderr; only honoured when stderr is a terminal.
  bool progress = true;
  // Reports to write after the run; empty = none. CSV appends one row to an
  // existing file (the header is written only to an empty or new file).
  std::string json_path;
  std::string csv_path;
  // Free text copied into the JSON and CSV reports (e.g. the server's device).
  std::string label;
};

// Parses the arguments after "load" (e.g. {"--concurrency=16", "--stream"};
// "--name value" also works). Unknown arguments are INVALID_ARGUMENT.
// `help` (optional) is set when --help was given; the options are then default.
absl::StatusOr<LoadOptions> ParseLoadArgs(const std::vector<std::string>& args,
                                          bool* help = nullptr);

// The --help text of `softmax-client load`.
std::string LoadUsage();

// Latency figures in nanoseconds.
struct LatencySummary {
  uint64_t count = 0;
  int64_t min = 0, p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;
  double mean = 0.0;
};

// What one run measured. Counts cover the measured phase unless named warmup_*.
struct LoadReport {
  LoadOptions options;
  std::string mode;          // "closed" or "open"
  int64_t requests = 0;      // measured requests that finished (ok + errors)
  int64_t ok = 0;
  // Errors by gRPC status code (index = code, 0..16). For streams a
  // per-request `error` counts under its code as well.
  std::array<int64_t, 17> errors_by_code{};
  int64_t errors = 0;        // sum of errors_by_code
  int64_t warmup_requests = 0;
  int64_t warmup_errors = 0;
  int64_t verified = 0;      // responses compared with the reference (all phases)
  int64_t mismatches = 0;    // responses with at least one element out of tolerance
  std::string first_mismatch;  // description of the first one
  double elapsed_seconds = 0.0;  // measured phase: its start to the last completion
  double offered_rate = 0.0;     // open loop: requests/s asked for
  double requests_per_second = 0.0;
  double rows_per_second = 0.0;
  // (request + response tensor bytes) per second of OK requests, in 1e9 B/s.
  double payload_gb_per_second = 0.0;
  int64_t rows = 0;
  int64_t payload_bytes = 0;
  LatencySummary latency;    // OK requests only
  // Means over OK responses of the server's `timing`.
  double mean_batch_requests = 0.0;
  double mean_batch_rows = 0.0;
  double mean_queue_us = 0.0;
  double mean_compute_us = 0.0;
  double mean_kernel_us = 0.0;    // of the compute, the GPU kernels' time
  double mean_dispatch_us = 0.0;  // submit to the start of the compute
};

// Runs the load described by `options` and returns the report. Fails
// (UNAVAILABLE) when the server cannot be reached within connect_timeout, or
// INVALID_ARGUMENT for options that cannot be run; errors of individual calls
// are counted in the report, not returned.
absl::StatusOr<LoadReport> RunLoad(const LoadOptions& options);

// The human-readable final report.
std::string FormatLoadReport(const LoadReport& report);
// The report as one JSON object (latency in microseconds).
std::string LoadReportJson(const LoadReport& report);
// CSV header line and the report's row (same columns), each with a newline.
std::string LoadReportCsvHeader();
std::string LoadReportCsvRow(const LoadReport& report);

// `softmax-client load ARGS...`: parses, runs, prints the report, writes
// --json/--csv. Returns the process exit code: 0 on success; 1 when the run
// could not be made, or when --verify is set and any response failed or
// mismatched; 2 for bad arguments. `args` excludes the program and "load".
int RunLoadCommand(const std::vector<std::string>& args);

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_LOAD_H_
