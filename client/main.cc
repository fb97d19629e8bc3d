// softmax-client: sends tensors to softmax-server.
//
//   softmax-client [call] [--target=localhost:50051] [--shape=2,1024]
//       [--dtype=float32|float16|bfloat16] [--axis=-1] [--temperature=1] [--log]
//       [--input=x.npy] [--output=y.npy] [--stream] [--request_id=ID]
//       [--timeout_ms=60000] [--check]
//   softmax-client health [--target=...] [--service=NAME]
//
// The first positional word selects the mode ("call", the default, sends one
// tensor). Flags are defined here and only here; each mode receives a plain
// options struct. Exit codes: 0 success; 1 the RPC failed (its status code and
// message are printed) or, for health, the server is not SERVING; 2 bad usage
// or unreadable input; 3 --check found elements outside the tolerance.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/load.h"
#include "client/npy.h"
#include "client/summary.h"
#include "client/tensor.h"
#include "common/malloc_tuning.h"

ABSL_FLAG(std::string, target, "localhost:50051", "Server address (host:port or gRPC URI).");
ABSL_FLAG(std::string, shape, "2,1024",
          "Shape of the random input tensor, comma separated; empty = scalar. Ignored with "
          "--input.");
ABSL_FLAG(std::string, dtype, "",
          "float32 | float16 | bfloat16. Random input: default float32. With --input: "
          "default the file's type, else the file's values are rounded to this type.");
ABSL_FLAG(int32_t, axis, -1, "Axis to normalise along; negative counts from the end.");
ABSL_FLAG(float, temperature, 1.0f, "output = softmax(input / temperature); finite, > 0.");
ABSL_FLAG(bool, log, false, "Log-softmax instead of softmax.");
ABSL_FLAG(std::string, input, "",
          "Read the input tensor from this .npy file ('<f4', '<f2', '<f8', or '<u2' holding "
          "bfloat16 bits) instead of making a random one.");
ABSL_FLAG(std::string, output, "",
          "Write the result to this .npy file: float32 '<f4', float16 '<f2', bfloat16 as its "
          "raw bits in '<u2'.");
ABSL_FLAG(bool, stream, false, "Send the request on the SoftmaxStream RPC instead of unary.");
ABSL_FLAG(std::string, request_id, "", "request_id to send (default: softmax-client-<pid>).");
ABSL_FLAG(int64_t, timeout_ms, 60000, "Call deadline in milliseconds; 0 = none.");
ABSL_FLAG(bool, wait_for_ready, false,
          "Wait for the server to become reachable instead of failing fast.");
ABSL_FLAG(uint64_t, seed, 42, "Seed of the random input.");
ABSL_FLAG(bool, check, false,
          "Compare the result with a float64 reference computed here; exit 3 on mismatch.");
ABSL_FLAG(int32_t, max_message_bytes, INT32_MAX, "Client send/receive message size limit.");
ABSL_FLAG(std::string, service, "",
          "health mode: service name to check (\"\" = whole server, or "
          "softmax.v1.SoftmaxService).");

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

}  // namespace
}  // namespace softmax::client

int main(int argc, char** argv) {
  using namespace softmax::client;
  // Debian's Abseil keeps the Mutex deadlock detector on (no NDEBUG): every
  // lock, gRPC's included, would update one process-wide graph. The load
  // mode's figures are the server's, not that bookkeeping's.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // `load` takes its own arguments (its --shape is a repeatable mix entry, not
  // the one-shot flag), so it is dispatched before the flags are parsed.
  if (argc > 1 && std::string(argv[1]) == "load") {
    // The server's defaults (common/malloc_tuning.h): a load generator that
    // maps fresh pages for every large message would measure its own page
    // faults, not the server.
    softmax::ApplyMallocTuning(softmax::MallocTuning{});
    return RunLoadCommand(std::vector<std::string>(argv + 2, argv + argc));
  }
  absl::SetProgramUsageMessage(
      "sends tensors to softmax-server.\n"
      "  softmax-client [call] --target=HOST:PORT [--shape=2,1024 | --input=x.npy] ...\n"
      "  softmax-client health --target=HOST:PORT [--service=NAME]");
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

  ChannelOptions channel;
  channel.target = absl::GetFlag(FLAGS_target);
  channel.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);

  if (mode == "health") {
    return RunHealth(channel, absl::GetFlag(FLAGS_service), TimeoutFromFlag());
  }
  if (mode != "call") {
    std::cerr << "softmax-client: unknown mode \"" << mode << "\" (want call or health)\n";
    return kExitUsage;
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
