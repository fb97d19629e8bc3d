// softmax-client: sends tensors to softmax-server, checks its health, or
// offers it load. The first positional word selects the mode:
//   call    (the default) one request, random or from a .npy file; prints a
//           summary, optionally writes the result and checks it
//           (client/call_mode.h)
//   health  the gRPC health state of the server or of one service
//   load    closed- or open-loop load (client/load/mode.h,
//           client/load/engine.h); prints throughput and latency, optionally
//           writes JSON and CSV reports
// Flags are defined here and only here, and `softmax-client --help` lists
// them; each help text is the flag's documentation. Which modes a flag
// applies to is declared in kFlagModes, beside the flags: --help starts the
// flag's help with them ("[call, load] ..."), and setting it in another mode
// is a usage error. This file parses the flags into each mode's options
// struct and calls the mode. Exit codes: client/exit_codes.h.
#include <cstdlib>
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
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/call_mode.h"
#include "client/client.h"
#include "client/exit_codes.h"
#include "client/load/mode.h"
#include "client/load/options.h"
#include "client/tensor.h"
#include "common/malloc_tuning.h"

namespace softmax::client {
namespace {

// The modes, as bits of a flag's set of modes.
enum ModeBit : unsigned { kCallMode = 1u << 0, kHealthMode = 1u << 1, kLoadMode = 1u << 2 };
constexpr unsigned kEveryMode = kCallMode | kHealthMode | kLoadMode;

// Each mode's name, as the command line and --help spell it, in --help's order.
struct ModeName {
  ModeBit mode;
  const char* name;
};
constexpr ModeName kModeNames[] = {
    {kCallMode, "call"}, {kHealthMode, "health"}, {kLoadMode, "load"}};

struct FlagModes {
  const char* flag;
  unsigned modes;  // ModeBits
};

// Which modes each flag below applies to: one entry per flag, in the order
// they are defined. The only place a flag's modes are written; --help and
// CheckFlagsApplyTo read them from here. A flag missing here, or an entry
// naming no flag, stops main() before it parses anything.
constexpr FlagModes kFlagModes[] = {
    {"target", kEveryMode},
    {"timeout_ms", kEveryMode},
    {"max_message_bytes", kEveryMode},
    // The request.
    {"shape", kCallMode | kLoadMode},
    {"dtype", kCallMode | kLoadMode},
    {"axis", kCallMode | kLoadMode},
    {"temperature", kCallMode | kLoadMode},
    {"log", kCallMode | kLoadMode},
    {"stream", kCallMode | kLoadMode},
    {"chunk_bytes", kLoadMode},
    {"seed", kCallMode | kLoadMode},
    // call.
    {"input", kCallMode},
    {"output", kCallMode},
    {"request_id", kCallMode},
    {"wait_for_ready", kCallMode},
    {"check", kCallMode},
    {"top_k", kCallMode | kLoadMode},
    // health.
    {"service", kHealthMode},
    // load.
    {"concurrency", kLoadMode},
    {"rate", kLoadMode},
    {"protocol", kLoadMode},
    {"arrival", kLoadMode},
    {"max_outstanding", kLoadMode},
    {"connections", kLoadMode},
    {"duration", kLoadMode},
    {"requests", kLoadMode},
    {"warmup", kLoadMode},
    {"mix", kLoadMode},
    {"mix_file", kLoadMode},
    {"payloads_per_shape", kLoadMode},
    {"verify", kLoadMode},
    {"connect_timeout", kLoadMode},
    {"quiet", kLoadMode},
    {"json", kLoadMode},
    {"csv", kLoadMode},
    {"label", kLoadMode},
};

// The modes of `flag` from kFlagModes; 0 when it has no entry.
unsigned ModesOf(absl::string_view flag) {
  for (const FlagModes& entry : kFlagModes) {
    if (flag == entry.flag) return entry.modes;
  }
  return 0;
}

// `help` as --help shows it: led by the flag's modes ("[call, load] "),
// unless it applies to every mode.
std::string HelpWithModes(absl::string_view flag, absl::string_view help) {
  const unsigned modes = ModesOf(flag);
  if (modes == kEveryMode) return std::string(help);
  std::vector<absl::string_view> names;
  for (const ModeName& mode : kModeNames) {
    if ((modes & mode.mode) != 0) names.push_back(mode.name);
  }
  return absl::StrCat("[", absl::StrJoin(names, ", "), "] ", help);
}

}  // namespace
}  // namespace softmax::client

// A flag of this file: ABSL_FLAG, its help led by its modes from kFlagModes.
// (Abseil computes such a help text when --help asks for it.)
#define SOFTMAX_CLIENT_FLAG(type, name, default_value, help) \
  ABSL_FLAG(type, name, default_value, softmax::client::HelpWithModes(#name, help))

// Reaching the server.
SOFTMAX_CLIENT_FLAG(std::string, target, "localhost:50051",
                    "Server address (host:port or gRPC URI). load --protocol=http: the server's "
                    "HTTP port (its --http_address), as host:port or http://host:port.");
SOFTMAX_CLIENT_FLAG(int64_t, timeout_ms, 60000,
                    "Deadline of each call (load: of each request) in milliseconds; 0 = none.");
SOFTMAX_CLIENT_FLAG(int32_t, max_message_bytes, INT32_MAX,
                    "Client send/receive message size limit (load --protocol=http: the largest "
                    "response body accepted).");

// The request.
SOFTMAX_CLIENT_FLAG(std::string, shape, "2,1024",
                    "Shape of the random input tensor: dimensions separated by ',' or 'x', each "
                    "optionally ending in K (x1024) or M (x1048576), e.g. 2,1024 or 1x16M; empty "
                    "= a scalar. call: ignored with --input. load: the shape of every request, "
                    "unless --mix or --mix_file is given.");
SOFTMAX_CLIENT_FLAG(std::string, dtype, "",
                    "float32 | float16 | bfloat16. Random input: default float32. With --input: "
                    "default the file's type, else the file's values are rounded to this type.");
SOFTMAX_CLIENT_FLAG(int32_t, axis, -1, "Axis to normalise along; negative counts from the end.");
SOFTMAX_CLIENT_FLAG(float, temperature, 1.0f,
                    "output = softmax(input / temperature); finite, > 0.");
SOFTMAX_CLIENT_FLAG(bool, log, false, "Log-softmax instead of softmax.");
SOFTMAX_CLIENT_FLAG(bool, stream, false,
                    "Send on the SoftmaxStream RPC instead of unary Softmax (load: one stream "
                    "per connection, ModelStreamInfer with --protocol=kserve, reopened when the "
                    "server ends it with UNAVAILABLE and its unanswered requests sent again).");
SOFTMAX_CLIENT_FLAG(int64_t, chunk_bytes, 0,
                    "With --stream (softmax.v1): send each request's tensor in chunks of at most this many "
                    "bytes (softmax.proto's chunk_offset and more_chunks) and reassemble its "
                    "answer, which the server sends back in chunks as large; 0 = one message per "
                    "tensor.");
SOFTMAX_CLIENT_FLAG(uint64_t, seed, 42, "Seed of the random input tensors.");

// One request.
SOFTMAX_CLIENT_FLAG(std::string, input, "",
                    "Read the input tensor from this .npy file ('<f4', '<f2', '<f8', or '<u2' "
                    "holding bfloat16 bits) instead of making a random one.");
SOFTMAX_CLIENT_FLAG(std::string, output, "",
                    "Write the result to this .npy file: float32 '<f4', float16 '<f2', bfloat16 "
                    "as its raw bits in '<u2'.");
SOFTMAX_CLIENT_FLAG(std::string, request_id, "",
                    "request_id to send (default: softmax-client-<pid>).");
SOFTMAX_CLIENT_FLAG(bool, wait_for_ready, false,
                    "Wait for the server to become reachable instead of failing fast.");
SOFTMAX_CLIENT_FLAG(bool, check, false,
                    "Compare the result with a float64 reference computed here; exit 3 on "
                    "mismatch.");
SOFTMAX_CLIENT_FLAG(int64_t, top_k, 0,
                    "K > 0: ask only for the K largest values of each row along --axis and "
                    "their indices, and print the ranking (value@index, best first; equal "
                    "values lower index first). With --check (call) or --verify (load, "
                    "softmax.v1 only), each value is checked against the reference and no "
                    "left-out index may rank above the K-th.");

// Health.
SOFTMAX_CLIENT_FLAG(std::string, service, "",
                    "Service name to check (\"\" = whole server, or softmax.v1.SoftmaxService).");

// Load.
SOFTMAX_CLIENT_FLAG(int32_t, concurrency, 1,
                    "Closed loop: requests always in flight; each completion sends the next. "
                    "Ignored with --rate.");
SOFTMAX_CLIENT_FLAG(double, rate, 0,
                    "Open loop when > 0: requests per second, sent whether or not earlier ones "
                    "have finished; latency counts from each request's intended send time.");
SOFTMAX_CLIENT_FLAG(softmax::client::LoadProtocol, protocol,
                    softmax::client::LoadProtocol::kSoftmaxV1,
                    "The API to call, so that every protocol is driven by one client: softmax.v1 "
                    "(Softmax, or SoftmaxStream with --stream); kserve (the Open Inference "
                    "Protocol's gRPC ModelInfer on model softmax or log_softmax, or "
                    "ModelStreamInfer with --stream); "
                    "http (its HTTP/REST POST /v2/models/{model}/infer with binary tensor data "
                    "both ways; --target is the server's HTTP port; each of --connections "
                    "keep-alive HTTP/1.1 connections carries one request at a time, so a closed "
                    "loop keeps min(--concurrency, --connections) requests at the server and "
                    "callers beyond the connections wait, in order, for a free one, that wait "
                    "counted in their latency; no --stream).");
SOFTMAX_CLIENT_FLAG(softmax::client::Arrival, arrival, softmax::client::Arrival::kConstant,
                    "Open-loop spacing: constant (exactly 1/rate apart) or poisson (exponential "
                    "gaps).");
SOFTMAX_CLIENT_FLAG(int32_t, max_outstanding, 100000,
                    "Open loop: sending pauses at this many requests in flight (the pause shows "
                    "in latency); bounds client memory.");
SOFTMAX_CLIENT_FLAG(int32_t, connections, 1,
                    "Channels, each its own TCP connection; a closed loop uses at most "
                    "--concurrency of them (with --protocol=http, HTTP/1.1 connections: see "
                    "--protocol).");
SOFTMAX_CLIENT_FLAG(std::optional<absl::Duration>, duration, std::nullopt,
                    "Length of the measured phase, e.g. 10s or 500ms; default 10s, or no limit "
                    "when --requests is given. Sending stops at whichever limit comes first.");
SOFTMAX_CLIENT_FLAG(int64_t, requests, 0, "Measured requests to send; 0 = no limit.");
SOFTMAX_CLIENT_FLAG(absl::Duration, warmup, absl::Seconds(1),
                    "Leading phase whose requests are left out of the figures (still verified, "
                    "and counted as warmup_requests).");
SOFTMAX_CLIENT_FLAG(std::string, mix, "",
                    "A weighted payload mix instead of --shape/--dtype: comma-separated entries "
                    "DIMS:DTYPE[:WEIGHT], DIMS joined by 'x', e.g. "
                    "1x1024:float32:3,8x4096:float16:1 (weight default 1).");
SOFTMAX_CLIENT_FLAG(std::string, mix_file, "",
                    "A file of --mix entries, one per line, '#' comments; added to --mix.");
SOFTMAX_CLIENT_FLAG(int32_t, payloads_per_shape, 4,
                    "Distinct random tensors per mix entry, cycled through (one for entries of "
                    "more than 16 MiB).");
SOFTMAX_CLIENT_FLAG(bool, verify, false,
                    "Check every response against a float64 CPU reference; exit 1 on any "
                    "mismatched or failed request. Costs client CPU.");
SOFTMAX_CLIENT_FLAG(absl::Duration, connect_timeout, absl::Seconds(10),
                    "Give up (exit 1) when a connection is not up within this time.");
SOFTMAX_CLIENT_FLAG(bool, quiet, false,
                    "No live progress line on stderr (it is drawn only on a terminal anyway).");
SOFTMAX_CLIENT_FLAG(std::string, json, "", "Write the report to this file as one JSON object.");
SOFTMAX_CLIENT_FLAG(std::string, csv, "",
                    "Append the report to this CSV file as one row (a header first when the file "
                    "is new or empty).");
SOFTMAX_CLIENT_FLAG(std::string, label, "",
                    "Free text copied into the JSON and CSV reports, e.g. the server's device.");

namespace softmax::client {
namespace {

// Health mode: prints the server's (or `service`'s) health state; exit 0
// only when it is SERVING.
int RunHealthMode(const ChannelOptions& channel_options, const std::string& service,
                  absl::Duration timeout) {
  std::shared_ptr<grpc::Channel> channel = CreateChannel(channel_options);
  absl::StatusOr<HealthState> state = CheckHealth(channel, service, timeout);
  if (!state.ok()) return ExitWithStatus(kExitRpcFailed, state.status());
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

// Whether `flag` applies to `mode`, by kFlagModes.
bool FlagAppliesTo(const absl::CommandLineFlag& flag, ModeBit mode) {
  return (ModesOf(flag.Name()) & mode) != 0;
}

// Stops the program when kFlagModes and the flags of this file disagree: a
// flag without an entry, or an entry naming no flag of this file. A
// programming error, caught on every run before any flag is read.
void CheckFlagModesTable() {
  bool complete = true;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsClientFlag(*flag) && ModesOf(name) == 0) {
      std::cerr << "softmax-client: --" << name << " has no entry in kFlagModes\n";
      complete = false;
    }
  }
  for (const FlagModes& entry : kFlagModes) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(entry.flag);
    if (flag == nullptr || !IsClientFlag(*flag) || entry.modes == 0) {
      std::cerr << "softmax-client: kFlagModes names \"" << entry.flag
                << "\", no flag of client/main.cc, or gives it no mode\n";
      complete = false;
    }
  }
  if (!complete) std::abort();
}

// Whether the flag was set to something other than its default (this Abseil
// cannot tell whether a flag was given, only what it holds).
bool ChangedFromDefault(const absl::CommandLineFlag& flag) {
  return flag.CurrentValue() != flag.DefaultValue();
}

// INVALID_ARGUMENT naming a flag set (to other than its default) that `mode`
// would ignore, e.g. --concurrency=8 with call.
absl::Status CheckFlagsApplyTo(const ModeName& mode) {
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsClientFlag(*flag) && ChangedFromDefault(*flag) && !FlagAppliesTo(*flag, mode.mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " does not apply to ", mode.name, " (see --help)"));
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
  options.top_k = absl::GetFlag(FLAGS_top_k);
  if (absl::GetFlag(FLAGS_timeout_ms) < 0) {
    return absl::InvalidArgumentError("--timeout_ms must be >= 0");
  }
  options.timeout = TimeoutFromFlag();
  options.connect_timeout = absl::GetFlag(FLAGS_connect_timeout);
  options.label = absl::GetFlag(FLAGS_label);
  if (absl::Status valid = ValidateLoadOptions(options); !valid.ok()) return valid;
  return options;
}

// Call mode's options; INVALID_ARGUMENT for a shape or dtype that does not
// parse.
absl::StatusOr<CallModeOptions> CallModeOptionsFromFlags(const ChannelOptions& channel) {
  CallModeOptions options;
  options.channel = channel;
  options.call.timeout = TimeoutFromFlag();
  options.call.stream = absl::GetFlag(FLAGS_stream);
  options.call.wait_for_ready = absl::GetFlag(FLAGS_wait_for_ready);
  absl::StatusOr<std::vector<int64_t>> shape = ParseShape(absl::GetFlag(FLAGS_shape));
  if (!shape.ok()) return shape.status();
  options.shape = *shape;
  if (const std::string dtype = absl::GetFlag(FLAGS_dtype); !dtype.empty()) {
    absl::StatusOr<v1::DType> parsed = ParseDType(dtype);
    if (!parsed.ok()) return parsed.status();
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
  options.top_k = absl::GetFlag(FLAGS_top_k);
  return options;
}

// The mode named `word`; null for none.
const ModeName* FindMode(absl::string_view word) {
  for (const ModeName& mode : kModeNames) {
    if (word == mode.name) return &mode;
  }
  return nullptr;
}

}  // namespace
}  // namespace softmax::client

int main(int argc, char** argv) {
  using namespace softmax::client;
  CheckFlagModesTable();
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
  const std::string word = positional.size() > 1 ? positional[1] : "call";
  if (positional.size() > 2) {
    std::cerr << "softmax-client: unexpected argument \"" << positional[2] << "\"\n";
    return kExitUsage;
  }
  const ModeName* mode = FindMode(word);
  if (mode == nullptr) {
    std::cerr << "softmax-client: unknown mode \"" << word
              << "\" (want call, health or load)\n";
    return kExitUsage;
  }
  if (absl::Status applies = CheckFlagsApplyTo(*mode); !applies.ok()) {
    return ExitWithStatus(kExitUsage, applies);
  }

  ChannelOptions channel;
  channel.target = absl::GetFlag(FLAGS_target);
  channel.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);

  switch (mode->mode) {
    case kHealthMode:
      return RunHealthMode(channel, absl::GetFlag(FLAGS_service), TimeoutFromFlag());
    case kLoadMode: {
      absl::StatusOr<LoadOptions> options = LoadOptionsFromFlags();
      if (!options.ok()) return ExitWithStatus(kExitUsage, options.status());
      LoadModeOutputs outputs;
      outputs.json_path = absl::GetFlag(FLAGS_json);
      outputs.csv_path = absl::GetFlag(FLAGS_csv);
      outputs.quiet = absl::GetFlag(FLAGS_quiet);
      // The server's defaults (common/malloc_tuning.h): a load generator that
      // maps fresh pages for every large message would measure its own page
      // faults, not the server.
      softmax::ApplyMallocTuning(softmax::MallocTuning{});
      return RunLoadMode(*options, outputs);
    }
    case kCallMode:
      break;
  }
  absl::StatusOr<CallModeOptions> options = CallModeOptionsFromFlags(channel);
  if (!options.ok()) return ExitWithStatus(kExitUsage, options.status());
  return RunCallMode(*options);
}
