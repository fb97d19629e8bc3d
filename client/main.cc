// softmax-client: sends tensors to softmax-server, checks its health, or
// offers it load. The first positional word selects the mode:
//   call    (the default) one request, random or from a .npy file; prints a
//           summary, optionally writes the result and checks it
//   health  the gRPC health state of the server or of one service
//   load    closed- or open-loop load (client/load_engine.h); prints
//           throughput and latency, optionally writes JSON and CSV reports
// Flags are defined here and only here, and `softmax-client --help` lists
// them; each help text is the flag's documentation, and one that starts with
// "[modes]" names the modes it applies to (setting it in another mode is a
// usage error). Each mode receives a plain options struct.
//
// Exit codes: 0 success; 1 the RPC failed (its status code and message are
// printed), or for health the server is not SERVING, or for load the run could
// not be made, a report could not be written, or --verify found a failed or
// mismatched response; 2 bad usage or unreadable input; 3 call's --check found
// elements outside the tolerance. (Abseil's parser exits 1 by itself on an
// unknown flag or a value of the wrong type.)
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/load_engine.h"
#include "client/load_options.h"
#include "client/load_report.h"
#include "client/npy.h"
#include "client/summary.h"
#include "client/tensor.h"
#include "common/malloc_tuning.h"

// Every mode.
ABSL_FLAG(std::string, target, "localhost:50051",
          "Server address (host:port or gRPC URI). load --protocol=http: the server's HTTP port "
          "(its --http_address), as host:port or http://host:port.");
ABSL_FLAG(int64_t, timeout_ms, 60000,
          "Deadline of each call (load: of each request) in milliseconds; 0 = none.");
ABSL_FLAG(int32_t, max_message_bytes, INT32_MAX,
          "Client send/receive message size limit (load --protocol=http: the largest response "
          "body accepted).");

// The request: call and load.
ABSL_FLAG(std::string, shape, "2,1024",
          "[call, load] Shape of the random input tensor: dimensions separated by ',' or 'x', "
          "each optionally ending in K (x1024) or M (x1048576), e.g. 2,1024 or 1x16M; empty = "
          "a scalar. call: ignored with --input. load: the shape of every request, unless "
          "--mix or --mix_file is given.");
ABSL_FLAG(std::string, dtype, "",
          "[call, load] float32 | float16 | bfloat16. Random input: default float32. With "
          "--input: default the file's type, else the file's values are rounded to this type.");
ABSL_FLAG(int32_t, axis, -1,
          "[call, load] Axis to normalise along; negative counts from the end.");
ABSL_FLAG(float, temperature, 1.0f,
          "[call, load] output = softmax(input / temperature); finite, > 0.");
ABSL_FLAG(bool, log, false, "[call, load] Log-softmax instead of softmax.");
ABSL_FLAG(bool, stream, false,
          "[call, load] Send on the SoftmaxStream RPC instead of unary Softmax (load: one "
          "stream per connection).");
ABSL_FLAG(int64_t, chunk_bytes, 0,
          "[load] With --stream: send each request's tensor in chunks of at most this many "
          "bytes (softmax.proto's chunk_offset and more_chunks) and reassemble its answer, "
          "which the server sends back in chunks as large; 0 = one message per tensor.");
ABSL_FLAG(uint64_t, seed, 42, "[call, load] Seed of the random input tensors.");

// call only.
ABSL_FLAG(std::string, input, "",
          "[call] Read the input tensor from this .npy file ('<f4', '<f2', '<f8', or '<u2' "
          "holding bfloat16 bits) instead of making a random one.");
ABSL_FLAG(std::string, output, "",
          "[call] Write the result to this .npy file: float32 '<f4', float16 '<f2', bfloat16 as "
          "its raw bits in '<u2'.");
ABSL_FLAG(std::string, request_id, "",
          "[call] request_id to send (default: softmax-client-<pid>).");
ABSL_FLAG(bool, wait_for_ready, false,
          "[call] Wait for the server to become reachable instead of failing fast.");
ABSL_FLAG(bool, check, false,
          "[call] Compare the result with a float64 reference computed here; exit 3 on "
          "mismatch.");

// health only.
ABSL_FLAG(std::string, service, "",
          "[health] Service name to check (\"\" = whole server, or softmax.v1.SoftmaxService).");

// load only.
ABSL_FLAG(int32_t, concurrency, 1,
          "[load] Closed loop: requests always in flight; each completion sends the next. "
          "Ignored with --rate.");
ABSL_FLAG(double, rate, 0,
          "[load] Open loop when > 0: requests per second, sent whether or not earlier ones "
          "have finished; latency counts from each request's intended send time.");
ABSL_FLAG(softmax::client::LoadProtocol, protocol, softmax::client::LoadProtocol::kSoftmaxV1,
          "[load] The API to call, so that every protocol is driven by one client: softmax.v1 "
          "(Softmax, or SoftmaxStream with --stream); kserve (the Open Inference Protocol's "
          "gRPC ModelInfer on model softmax or log_softmax; unary only); http (its HTTP/REST "
          "POST /v2/models/{model}/infer with binary tensor data both ways; --target is the "
          "server's HTTP port; each of --connections keep-alive HTTP/1.1 connections carries "
          "one request at a time, so a closed loop keeps min(--concurrency, --connections) "
          "requests at the server and callers beyond the connections wait, in order, for a "
          "free one, that wait counted in their latency; no --stream).");
ABSL_FLAG(softmax::client::Arrival, arrival, softmax::client::Arrival::kConstant,
          "[load] Open-loop spacing: constant (exactly 1/rate apart) or poisson (exponential "
          "gaps).");
ABSL_FLAG(int32_t, max_outstanding, 100000,
          "[load] Open loop: sending pauses at this many requests in flight (the pause shows "
          "in latency); bounds client memory.");
ABSL_FLAG(int32_t, connections, 1,
          "[load] Channels, each its own TCP connection; a closed loop uses at most "
          "--concurrency of them (with --protocol=http, HTTP/1.1 connections: see "
          "--protocol).");
ABSL_FLAG(std::optional<absl::Duration>, duration, std::nullopt,
          "[load] Length of the measured phase, e.g. 10s or 500ms; default 10s, or no limit "
          "when --requests is given. Sending stops at whichever limit comes first.");
ABSL_FLAG(int64_t, requests, 0, "[load] Measured requests to send; 0 = no limit.");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(1),
          "[load] Leading phase whose requests are left out of the figures (still verified, "
          "and counted as warmup_requests).");
ABSL_FLAG(std::string, mix, "",
          "[load] A weighted payload mix instead of --shape/--dtype: comma-separated entries "
          "DIMS:DTYPE[:WEIGHT], DIMS joined by 'x', e.g. 1x1024:float32:3,8x4096:float16:1 "
          "(weight default 1).");
ABSL_FLAG(std::string, mix_file, "",
          "[load] A file of --mix entries, one per line, '#' comments; added to --mix.");
ABSL_FLAG(int32_t, payloads_per_shape, 4,
          "[load] Distinct random tensors per mix entry, cycled through (one for entries of "
          "more than 16 MiB).");
ABSL_FLAG(bool, verify, false,
          "[load] Check every response against a float64 CPU reference; exit 1 on any "
          "mismatched or failed request. Costs client CPU.");
ABSL_FLAG(absl::Duration, connect_timeout, absl::Seconds(10),
          "[load] Give up (exit 1) when a connection is not up within this time.");
ABSL_FLAG(bool, quiet, false,
          "[load] No live progress line on stderr (it is drawn only on a terminal anyway).");
ABSL_FLAG(std::string, json, "", "[load] Write the report to this file as one JSON object.");
ABSL_FLAG(std::string, csv, "",
          "[load] Append the report to this CSV file as one row (a header first when the file "
          "is new or empty).");
ABSL_FLAG(std::string, label, "",
          "[load] Free text copied into the JSON and CSV reports, e.g. the server's device.");

namespace softmax::client {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitRpcFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitCheckFailed = 3;

// Everything one-shot mode needs, filled from the flags.
struct CallModeOptions {
  ChannelOptions channel;
  CallOptions call;
  std::vector<int64_t> shape;            // random input shape
  std::optional<v1::DType> dtype;        // unset: float32 or the file's type
  int axis = -1;
  float temperature = 1.0f;
  bool log = false;
  std::string input_path;                // empty: random input
  std::string output_path;               // empty: no file written
  std::string request_id;
  uint64_t seed = 42;
  bool check = false;
};

int Fail(int exit_code, const absl::Status& status) {
  std::cerr << "softmax-client: " << absl::StatusCodeToString(status.code()) << ": "
            << status.message() << "\n";
  return exit_code;
}

int RunCall(const CallModeOptions& options) {
  v1::SoftmaxRequest request;
  request.set_request_id(options.request_id);
  if (options.input_path.empty()) {
    RandomTensorOptions random;
    random.shape = options.shape;
    random.dtype = options.dtype.value_or(v1::DTYPE_FLOAT32);
    random.seed = options.seed;
    absl::StatusOr<v1::Tensor> tensor = MakeRandomTensor(random);
    if (!tensor.ok()) return Fail(kExitUsage, tensor.status());
    *request.mutable_input() = *std::move(tensor);
  } else {
    absl::StatusOr<NpyArray> array = ReadNpyFile(options.input_path);
    if (!array.ok()) return Fail(kExitUsage, array.status());
    absl::StatusOr<v1::Tensor> tensor = TensorFromNpy(*array, options.dtype);
    if (!tensor.ok()) return Fail(kExitUsage, tensor.status());
    *request.mutable_input() = *std::move(tensor);
  }
  request.set_axis(options.axis);
  request.set_temperature(options.temperature);
  request.set_log(options.log);

  const v1::Tensor& input = request.input();
  std::cout << "input:      " << FormatShape(ShapeOf(input)) << " " << WireDTypeName(input.dtype())
            << " axis " << options.axis << " temperature " << options.temperature
            << (options.log ? " log" : "") << (options.call.stream ? " (stream)" : "") << "\n";

  std::shared_ptr<grpc::Channel> channel = CreateChannel(options.channel);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::SoftmaxResponse> response = CallSoftmax(channel, request, options.call);
  const absl::Duration round_trip = absl::Now() - start;
  if (!response.ok()) return Fail(kExitRpcFailed, response.status());

  // The server validated the request, so the axis is in range here; a client
  // that lets a bad axis through still prints a summary of the flat output.
  absl::StatusOr<SoftmaxShape> view = ShapeAlongAxis(ShapeOf(input), options.axis);
  if (!view.ok()) return Fail(kExitUsage, view.status());
  if (absl::Status bytes = CheckTensorBytes(response->output()); !bytes.ok()) {
    return Fail(kExitRpcFailed, absl::DataLossError(absl::StrCat(
                                    "server returned a malformed output: ", bytes.message())));
  }
  if (response->output().dtype() != input.dtype() ||
      ShapeOf(response->output()) != ShapeOf(input)) {
    return Fail(kExitRpcFailed, absl::DataLossError("output dtype or shape differs from input"));
  }
  std::cout << FormatSummary(*response, *view, options.log, round_trip);

  if (!options.output_path.empty()) {
    absl::Status written = WriteNpyFile(options.output_path, NpyFromTensor(response->output()));
    if (!written.ok()) return Fail(kExitUsage, written);
    std::cout << "wrote:      " << options.output_path
              << (response->output().dtype() == v1::DTYPE_BFLOAT16
                      ? " ('<u2' holding bfloat16 bits)"
                      : "")
              << "\n";
  }

  if (options.check) {
    SoftmaxOptions softmax_options;
    softmax_options.temperature = options.temperature;
    softmax_options.log = options.log;
    const Comparison comparison =
        CompareWithReference(input, response->output(), *view, softmax_options);
    std::cout << "check:      " << comparison.mismatches << " of " << comparison.elements
              << " elements outside |y-ref| <= 1e-6 + "
              << RelativeTolerance(input.dtype()) << "*|ref|; max abs error "
              << comparison.max_abs_error << "\n";
    if (comparison.mismatches > 0) {
      std::cerr << "softmax-client: check failed at element " << comparison.first_mismatch
                << ": expected " << comparison.first_expected << ", got "
                << comparison.first_actual << "\n";
      return kExitCheckFailed;
    }
  }
  return kExitOk;
}

int RunHealth(const ChannelOptions& channel_options, const std::string& service,
              absl::Duration timeout) {
  std::shared_ptr<grpc::Channel> channel = CreateChannel(channel_options);
  absl::StatusOr<HealthState> state = CheckHealth(channel, service, timeout);
  if (!state.ok()) return Fail(kExitRpcFailed, state.status());
  std::cout << HealthStateName(*state) << "\n";
  return *state == HealthState::kServing ? kExitOk : kExitRpcFailed;
}

absl::Duration TimeoutFromFlag() {
  const int64_t ms = absl::GetFlag(FLAGS_timeout_ms);
  return ms > 0 ? absl::Milliseconds(ms) : absl::InfiniteDuration();
}

// A flag defined in this file, as opposed to Abseil's own (--help, --flagfile).
bool IsClientFlag(const absl::CommandLineFlag& flag) {
  return absl::EndsWith(flag.Filename(), "client/main.cc");
}

// Whether `flag` applies to `mode`: its help text's leading "[call, load]"
// lists the modes; a flag without the list applies to every mode.
bool FlagAppliesTo(const absl::CommandLineFlag& flag, absl::string_view mode) {
  const std::string help = flag.Help();
  absl::string_view modes = help;
  if (!absl::ConsumePrefix(&modes, "[")) return true;
  modes = modes.substr(0, modes.find(']'));
  for (absl::string_view listed : absl::StrSplit(modes, ", ")) {
    if (listed == mode) return true;
  }
  return false;
}

// Whether the flag was set to something other than its default (this Abseil
// cannot tell whether a flag was given, only what it holds).
bool ChangedFromDefault(const absl::CommandLineFlag& flag) {
  return flag.CurrentValue() != flag.DefaultValue();
}

// INVALID_ARGUMENT naming a flag set (to other than its default) that `mode`
// would ignore, e.g. --concurrency=8 with call.
absl::Status CheckFlagsApplyTo(absl::string_view mode) {
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsClientFlag(*flag) && ChangedFromDefault(*flag) && !FlagAppliesTo(*flag, mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " does not apply to ", mode, " (see --help)"));
    }
  }
  return absl::OkStatus();
}

bool ChangedFromDefault(absl::string_view name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag != nullptr && ChangedFromDefault(*flag);
}

// The payload mix: --mix and --mix_file, or else --shape and --dtype.
absl::StatusOr<std::vector<LoadShape>> LoadShapesFromFlags() {
  std::vector<LoadShape> shapes;
  if (const std::string mix = absl::GetFlag(FLAGS_mix); !mix.empty()) {
    absl::StatusOr<std::vector<LoadShape>> parsed = ParseLoadMix(mix);
    if (!parsed.ok()) return parsed.status();
    shapes = *std::move(parsed);
  }
  if (const std::string path = absl::GetFlag(FLAGS_mix_file); !path.empty()) {
    absl::StatusOr<std::vector<LoadShape>> read = ReadLoadMixFile(path);
    if (!read.ok()) return read.status();
    shapes.insert(shapes.end(), read->begin(), read->end());
  }
  if (!shapes.empty()) {
    if (ChangedFromDefault("shape") || ChangedFromDefault("dtype")) {
      return absl::InvalidArgumentError(
          "--shape and --dtype do not combine with --mix or --mix_file (give the dtype in "
          "each mix entry)");
    }
    return shapes;
  }
  const std::string shape_text = absl::GetFlag(FLAGS_shape);
  if (absl::StrContains(shape_text, ':')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shape=", shape_text, ": a dtype or weight belongs in --mix, e.g. --mix=", shape_text));
  }
  LoadShape shape;
  absl::StatusOr<std::vector<int64_t>> dims = ParseShape(shape_text);
  if (!dims.ok()) return dims.status();
  shape.dims = *std::move(dims);
  if (const std::string dtype = absl::GetFlag(FLAGS_dtype); !dtype.empty()) {
    absl::StatusOr<v1::DType> parsed = ParseDType(dtype);
    if (!parsed.ok()) return parsed.status();
    shape.dtype = *parsed;
  }
  if (absl::StatusOr<int64_t> elements = ElementCount(shape.dims); !elements.ok()) {
    return elements.status();
  }
  return std::vector<LoadShape>{shape};
}

// Measured phase without --duration.
constexpr absl::Duration kDefaultLoadDuration = absl::Seconds(10);

absl::StatusOr<LoadOptions> LoadOptionsFromFlags() {
  LoadOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.connections = absl::GetFlag(FLAGS_connections);
  options.concurrency = absl::GetFlag(FLAGS_concurrency);
  options.rate = absl::GetFlag(FLAGS_rate);
  options.arrival = absl::GetFlag(FLAGS_arrival);
  options.max_outstanding = absl::GetFlag(FLAGS_max_outstanding);
  options.requests = absl::GetFlag(FLAGS_requests);
  options.duration = absl::GetFlag(FLAGS_duration).value_or(
      options.requests > 0 ? absl::InfiniteDuration() : kDefaultLoadDuration);
  options.warmup = absl::GetFlag(FLAGS_warmup);
  options.stream = absl::GetFlag(FLAGS_stream);
  options.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  options.protocol = absl::GetFlag(FLAGS_protocol);
  absl::StatusOr<std::vector<LoadShape>> shapes = LoadShapesFromFlags();
  if (!shapes.ok()) return shapes.status();
  options.shapes = *std::move(shapes);
  options.payloads_per_shape = absl::GetFlag(FLAGS_payloads_per_shape);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.axis = absl::GetFlag(FLAGS_axis);
  options.temperature = absl::GetFlag(FLAGS_temperature);
  options.log = absl::GetFlag(FLAGS_log);
  options.verify = absl::GetFlag(FLAGS_verify);
  if (absl::GetFlag(FLAGS_timeout_ms) < 0) {
    return absl::InvalidArgumentError("--timeout_ms must be >= 0");
  }
  options.timeout = TimeoutFromFlag();
  options.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  options.label = absl::GetFlag(FLAGS_label);
  if (absl::Status valid = ValidateLoadOptions(options); !valid.ok()) return valid;
  return options;
}

// Set by SIGINT and SIGTERM while a load runs: stop sending, drain, report.
std::atomic<bool> g_stop_requested{false};

void RequestStop(int) { g_stop_requested.store(true, std::memory_order_relaxed); }

int RunLoadMode(const LoadOptions& options, const std::string& json_path,
                const std::string& csv_path, bool quiet) {
  LoadMonitor monitor;
  monitor.stop_requested = &g_stop_requested;
  const bool show_progress = !quiet && isatty(STDERR_FILENO);
  if (show_progress) {
    monitor.on_progress = [](const LoadProgress& progress) {
      std::fprintf(stderr, "\r%s   ", FormatLoadProgress(progress).c_str());
      std::fflush(stderr);
    };
  }
  g_stop_requested.store(false);
  const auto previous_int = std::signal(SIGINT, RequestStop);
  const auto previous_term = std::signal(SIGTERM, RequestStop);
  absl::StatusOr<LoadReport> report = RunLoad(options, monitor);
  std::signal(SIGINT, previous_int);
  std::signal(SIGTERM, previous_term);
  if (show_progress) {
    std::fprintf(stderr, "\r%100s\r", "");
    std::fflush(stderr);
  }
  if (!report.ok()) return Fail(kExitRpcFailed, report.status());
  std::cout << FormatLoadReport(*report) << std::flush;

  int exit_code = kExitOk;
  if (!json_path.empty()) {
    if (absl::Status written = WriteLoadReportJson(json_path, *report); !written.ok()) {
      exit_code = Fail(kExitRpcFailed, written);
    }
  }
  if (!csv_path.empty()) {
    if (absl::Status written = AppendLoadReportCsv(csv_path, *report); !written.ok()) {
      exit_code = Fail(kExitRpcFailed, written);
    }
  }
  if (options.verify) {
    const int64_t failed = report->errors + report->warmup_errors;
    if (report->mismatches > 0 || failed > 0 || report->verified == 0) {
      std::cerr << "softmax-client: verify failed: " << report->mismatches << " mismatched, "
                << failed << " failed, " << report->verified << " checked\n";
      exit_code = kExitRpcFailed;
    }
  }
  return exit_code;
}

}  // namespace
}  // namespace softmax::client

int main(int argc, char** argv) {
  using namespace softmax::client;
  // Debian's Abseil keeps the Mutex deadlock detector on (no NDEBUG): every
  // lock, gRPC's included, would update one process-wide graph. The load
  // mode's figures are the server's, not that bookkeeping's.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(
      "sends tensors to softmax-server, checks its health, or offers it load.\n"
      "  softmax-client [call] --target=HOST:PORT [--shape=2,1024 | --input=x.npy] ...\n"
      "      one request; prints a summary of the result\n"
      "  softmax-client health --target=HOST:PORT [--service=NAME]\n"
      "      prints the health state; exit 0 only when SERVING\n"
      "  softmax-client load --target=HOST:PORT [--concurrency=N | --rate=R]\n"
      "      [--shape=1x1024 --dtype=float32 | --mix=1x1024:float32:3,8x4096:float16:1] ...\n"
      "      offers load; prints throughput and latency, writes --json / --csv\n"
      "A flag whose help starts with [modes] applies to those modes only.");
  // --help lists the flags of this file (absl matches the binary's name by default).
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "client/main.cc");
  };
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  const std::string mode = positional.size() > 1 ? positional[1] : "call";
  if (positional.size() > 2) {
    std::cerr << "softmax-client: unexpected argument \"" << positional[2] << "\"\n";
    return kExitUsage;
  }
  if (mode != "call" && mode != "health" && mode != "load") {
    std::cerr << "softmax-client: unknown mode \"" << mode
              << "\" (want call, health or load)\n";
    return kExitUsage;
  }
  if (absl::Status applies = CheckFlagsApplyTo(mode); !applies.ok()) {
    return Fail(kExitUsage, applies);
  }

  ChannelOptions channel;
  channel.target = absl::GetFlag(FLAGS_target);
  channel.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);

  if (mode == "health") {
    return RunHealth(channel, absl::GetFlag(FLAGS_service), TimeoutFromFlag());
  }
  if (mode == "load") {
    absl::StatusOr<LoadOptions> options = LoadOptionsFromFlags();
    if (!options.ok()) return Fail(kExitUsage, options.status());
    // The server's defaults (common/malloc_tuning.h): a load generator that
    // maps fresh pages for every large message would measure its own page
    // faults, not the server.
    softmax::ApplyMallocTuning(softmax::MallocTuning{});
    return RunLoadMode(*options, absl::GetFlag(FLAGS_json), absl::GetFlag(FLAGS_csv),
                       absl::GetFlag(FLAGS_quiet));
  }

  CallModeOptions options;
  options.channel = channel;
  options.call.timeout = TimeoutFromFlag();
  options.call.stream = absl::GetFlag(FLAGS_stream);
  options.call.wait_for_ready = absl::GetFlag(FLAGS_wait_for_ready);
  absl::StatusOr<std::vector<int64_t>> shape = ParseShape(absl::GetFlag(FLAGS_shape));
  if (!shape.ok()) return Fail(kExitUsage, shape.status());
  options.shape = *shape;
  if (const std::string dtype = absl::GetFlag(FLAGS_dtype); !dtype.empty()) {
    absl::StatusOr<softmax::v1::DType> parsed = ParseDType(dtype);
    if (!parsed.ok()) return Fail(kExitUsage, parsed.status());
    options.dtype = *parsed;
  }
  options.axis = absl::GetFlag(FLAGS_axis);
  options.temperature = absl::GetFlag(FLAGS_temperature);
  options.log = absl::GetFlag(FLAGS_log);
  options.input_path = absl::GetFlag(FLAGS_input);
  options.output_path = absl::GetFlag(FLAGS_output);
  options.request_id = absl::GetFlag(FLAGS_request_id);
  if (options.request_id.empty()) {
    options.request_id = absl::StrCat("softmax-client-", static_cast<long>(getpid()));
  }
  options.seed = absl::GetFlag(FLAGS_seed);
  options.check = absl::GetFlag(FLAGS_check);
  return RunCall(options);
}
