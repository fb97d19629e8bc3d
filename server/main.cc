// softmax-server: parses flags into ServerOptions, validates them, and runs a
// Server (server/server.h) until a signal: SIGINT / SIGTERM drain and exit 0;
// a GPU fault exits 2; SIGHUP re-reads the tokens.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/malloc_tuning.h"
#include "server/logging/log.h"
#include "server/memory_trim.h"
#include "server/server.h"
#include "server/server_options.h"

namespace {
const softmax::server::ServerOptions kDefaults;
// Raised by the GPU backend's fault handler to wake the signal loop.
constexpr int kFaultSignal = SIGUSR1;
}  // namespace

ABSL_FLAG(std::string, grpc_address, kDefaults.grpc_address,
          "host:port for gRPC; port 0 picks a free port (the bound one is printed in the "
          "\"listening\" line)");
ABSL_FLAG(std::string, http_address, kDefaults.http_address,
          "host:port for the KServe v2 / Triton HTTP/REST API (/v2/...); empty disables; port 0 "
          "picks a free port");
ABSL_FLAG(std::string, metrics_address, kDefaults.metrics_address,
          "host:port for Prometheus /metrics; empty disables; port 0 picks a free port");
ABSL_FLAG(softmax::server::DeviceSpec, device, kDefaults.device,
          "auto (GPU 0 when usable, else the CPU; a GPU present but unusable is a warning and "
          "softmax_gpu_unusable) | cpu | cuda (= cuda:0; exits 1 when unusable) | cuda:N | "
          "cuda:N,M,... | cuda:all (one backend per GPU; batches go to the least-loaded one) | "
          "none (echo inputs, no compute: the transport's ceiling)");
ABSL_FLAG(int64_t, max_tensor_bytes, kDefaults.max_tensor_bytes,
          "largest input tensor in bytes; also sets gRPC's message limits");
ABSL_FLAG(int64_t, max_batch_rows, kDefaults.max_batch_rows,
          "a batch closes at this many rows (summed over its requests); larger batches "
          "amortise launches, smaller ones cut latency");
ABSL_FLAG(int64_t, max_batch_bytes, kDefaults.max_batch_bytes,
          "a batch closes at this many input bytes; bounds staging memory per batch");
ABSL_FLAG(softmax::server::MicrosecondsFlag, max_queue_delay_us, {kDefaults.max_queue_delay},
          "longest wait of the oldest queued request for company while the device is busy, in "
          "microseconds or with a unit (250us, 2ms), at most an hour; 0 forms a batch as soon as "
          "a slot is free (an idle device never waits)");
ABSL_FLAG(int64_t, max_queued_requests, kDefaults.max_queued_requests,
          "queued requests beyond which new ones get UNAVAILABLE (retryable)");
ABSL_FLAG(int64_t, max_held_bytes, kDefaults.max_held_bytes,
          "bound on the tensor bytes (input + output) that requests hold from admission until "
          "their response is sent, over every protocol; past it new requests get UNAVAILABLE. "
          "Half of it also bounds the queued input bytes, shared-memory tensors included. "
          "0 = no bound");
ABSL_FLAG(int, max_concurrent_streams, kDefaults.max_concurrent_streams,
          "calls one client connection may have open at once (HTTP/2 "
          "SETTINGS_MAX_CONCURRENT_STREAMS); bounds what one connection can hold");
ABSL_FLAG(softmax::server::SecondsFlag, max_connection_age_s, {kDefaults.max_connection_age},
          "opt-in connection rotation (seconds, or with a unit: 90m; at most 24 days), for callers that balance over the replicas themselves "
          "(round_robin over a headless Service): a gRPC connection older than this (+-10%) gets "
          "a GOAWAY, so such callers open their next calls on a new connection, to a replica "
          "added since if there is one; calls and streams open on the old one live on until they "
          "end. Its cost: a unary call racing the GOAWAY can be reset, uncomputed (callers "
          "without a retry policy see UNAVAILABLE). 0 = connections live as long as their "
          "callers keep them");
ABSL_FLAG(softmax::server::SecondsFlag, max_stream_age_s, {kDefaults.max_stream_age},
          "opt-in (seconds, or with a unit: 90m; at most 24 days): a SoftmaxStream or ModelStreamInfer older than this answers the messages it "
          "has read and ends with a retryable UNAVAILABLE, so that long streams move to replicas "
          "added since. Its cost: streaming clients that do not reopen (tritonclient, plain "
          "grpcio) fail there; the project's clients reopen and resend what had no answer. "
          "0 = a stream lives as long as its caller keeps it");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain (with --tls_key_file): gRPC and the HTTP endpoint then "
          "serve TLS only (HTTPS); empty = plaintext");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA certificates; when set, every gRPC and HTTP client must present a "
          "certificate signed by one of them (mutual TLS)");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "file of bearer tokens, one per line (# comments); when set, every call (gRPC and "
          "HTTP) must carry 'authorization: Bearer TOKEN' or fail UNAUTHENTICATED / HTTP 401 "
          "(health checks are exempt); re-read on SIGHUP");
ABSL_FLAG(bool, reflection, kDefaults.reflection,
          "serve gRPC server reflection (lets grpcurl list and describe the services)");
ABSL_FLAG(softmax::server::SharedMemoryMode, shared_memory, kDefaults.shared_memory,
          "Triton's shared-memory extensions on the KServe endpoints: off, system (POSIX "
          "shared memory) or all (also CUDA IPC memory). Any caller that reaches the port may "
          "then map any shared-memory key or IPC handle it can name");
ABSL_FLAG(softmax::server::SecondsFlag, shutdown_grace_s, {kDefaults.shutdown_grace},
          "seconds (or with a unit: 1500ms) in-flight RPCs get to finish after SIGINT/SIGTERM "
          "before they are cancelled");
ABSL_FLAG(softmax::server::logging::LogFormat, log_format, kDefaults.log_format,
          "text (timestamp, level letter, message, key=value) | json (one object per line: "
          "time, level, logger, msg and the line's fields), on stderr");
ABSL_FLAG(int64_t, access_log_one_in, kDefaults.access_log_one_in,
          "access log: one line (logger \"access\": method, code, bytes, latency_ms, peer) for "
          "one finished request in this many, stream messages counted singly; 0 = off, 1 = every "
          "request");
ABSL_FLAG(std::string, listening_file, "",
          "once every listener is up, write this JSON file (atomically: a temporary file "
          "renamed onto it): {grpc, http, metrics: the bound host:port, with the port the "
          "kernel picked for :0, or \"off\"; pid; version; revision}, for scripts that start "
          "the server on port 0; empty = none");
namespace softmax::server {
namespace {

ServerOptions OptionsFromFlags() {
  ServerOptions options;
  options.grpc_address = absl::GetFlag(FLAGS_grpc_address);
  options.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  options.http_address = absl::GetFlag(FLAGS_http_address);
  options.device = absl::GetFlag(FLAGS_device);
  options.max_tensor_bytes = absl::GetFlag(FLAGS_max_tensor_bytes);
  options.max_batch_rows = absl::GetFlag(FLAGS_max_batch_rows);
  options.max_batch_bytes = absl::GetFlag(FLAGS_max_batch_bytes);
  options.max_queue_delay = absl::GetFlag(FLAGS_max_queue_delay_us).value;
  options.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  options.max_held_bytes = absl::GetFlag(FLAGS_max_held_bytes);
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.max_connection_age = absl::GetFlag(FLAGS_max_connection_age_s).value;
  options.max_stream_age = absl::GetFlag(FLAGS_max_stream_age_s).value;
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  options.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  options.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  options.reflection = absl::GetFlag(FLAGS_reflection);
  options.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  options.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace_s).value;
  options.log_format = absl::GetFlag(FLAGS_log_format);
  options.access_log_one_in = absl::GetFlag(FLAGS_access_log_one_in);
  options.listening_file = absl::GetFlag(FLAGS_listening_file);
  options.server_version = SOFTMAX_VERSION;
  options.revision = SOFTMAX_GIT_REVISION;
  // Testing hooks, not an operator's decisions: environment variables.
  if (const char* inject = std::getenv("SOFTMAX_TEST_INJECT_FAULT_AFTER_BATCHES")) {
    options.inject_fault_after_batches = std::strtoll(inject, nullptr, 10);
  }
  if (const char* hold = std::getenv("SOFTMAX_TEST_NO_IDLE_DISPATCH")) {
    options.test_no_idle_dispatch = std::string(hold) == "1";
  }
  return options;
}

// Raises the soft open-file limit to the hard one: every connection is a
// file descriptor, and the common soft default (1,024) is exhausted by about
// a thousand idle clients. gRPC 1.51's listener stops accepting for good
// after accept4 fails with EMFILE, so the limit must not be reached.
void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == limit.rlim_max) return;
  const rlim_t soft = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    logging::LogWarning("cannot raise the open-file limit",
                        {{"soft_limit", static_cast<uint64_t>(soft)}});
  }
}

int Fail(const absl::Status& status) {
  logging::LogError(status.message());
  return 1;
}

int Run(const ServerOptions& options) {
  // First, so that every later line is in the chosen format.
  logging::LogOptions log_options;
  log_options.format = options.log_format;
  log_options.access_log_one_in = options.access_log_one_in;
  if (absl::Status configured = logging::ConfigureLogging(log_options); !configured.ok()) {
    return Fail(configured);
  }
  // The same checks as Server::Start's, before anything else is set up.
  if (absl::Status valid = Validate(options); !valid.ok()) return Fail(valid);
  RaiseOpenFileLimit();
  // Before any other thread starts allocating (glibc's malloc only: tcmalloc
  // needs no settings).
  if (!SOFTMAX_HAVE_TCMALLOC && !softmax::ApplyMallocTuning(softmax::MallocTuning())) {
    logging::LogWarning("glibc refused the malloc settings");
  }

  // Signals are taken by sigwait below; block them before any thread starts
  // so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, kFaultSignal);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  ServerHooks hooks;
  // A sticky GPU error (logged by the server) wakes the signal loop below,
  // which takes the server down with exit status 2.
  hooks.on_device_fault = [] { kill(getpid(), kFaultSignal); };
  Server server(options, hooks);
  if (absl::Status started = server.Start(); !started.ok()) return Fail(started);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  // SIGHUP: re-read the tokens, keep serving.
  while (signal_number == SIGHUP) {
    if (!options.auth_tokens_file.empty()) {
      const absl::Status reloaded = server.ReloadAuthTokens();
      if (reloaded.ok()) {
        logging::LogInfo("SIGHUP: tokens reloaded");
      } else {
        logging::LogError("SIGHUP: tokens not reloaded", {{"cause", reloaded.message()}});
      }
    }
    sigwait(&signals, &signal_number);
  }
  const bool fault = signal_number == kFaultSignal;
  if (fault) {
    // Requests in flight fail INTERNAL at once (the worker refuses them);
    // a short grace lets those answers reach their callers.
    logging::LogError("GPU fault; NOT_SERVING, exiting with status 2");
  } else {
    logging::LogInfo(absl::StrCat(signal_number == SIGINT ? "SIGINT" : "SIGTERM",
                                  " received; draining"),
                     {{"grace_s", absl::ToDoubleSeconds(options.shutdown_grace)}});
  }
  server.Drain();
  server.Wait();
  // A fault during a graceful drain still ends in the fault's exit status.
  return fault || server.device_faulted() ? 2 : 0;
}

}  // namespace
}  // namespace softmax::server

int main(int argc, char** argv) {
  // Debian builds Abseil without NDEBUG, which leaves the Mutex deadlock
  // detector on: every lock and unlock, gRPC's included, then updates a
  // process-wide lock graph under one global spinlock. A serving process
  // pays for that on every request; the tests keep it on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(
      "softmax / log-softmax over gRPC (softmax.v1.SoftmaxService).\n"
      "Usage: softmax-server [--flag=value ...] [--flagfile=FILE]\n"
      "  --flagfile reads one --flag=value per line (lines starting with # are comments);\n"
      "  --version prints the version, git revision and allocator; --helpfull adds Abseil's\n"
      "  own flags.");
  absl::FlagsUsageConfig usage;
  // --help lists the flags defined in this file: the server's own.
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "server/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.version_string = [] {
    return absl::StrCat("softmax-server " SOFTMAX_VERSION " (revision " SOFTMAX_GIT_REVISION
                        ", allocator ",
                        softmax::server::MemoryTrimmer::AllocatorName(), ")\n");
  };
  usage.normalize_filename = [](absl::string_view path) { return std::string(path); };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  return softmax::server::Run(softmax::server::OptionsFromFlags());
}
