// softmax-server: parses flags into ServerOptions and wires the backends,
// metrics, scheduler, batcher, service and gRPC server together. SIGINT /
// SIGTERM drain and exit 0; a GPU fault exits 2.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/malloc_tuning.h"
#include "server/device.h"
#include "server/logging/log.h"
#include "server/memory_trim.h"
#include "server/metrics/metrics.h"
#include "server/rpc/auth.h"
#include "server/rpc/http/civetweb_tls.h"
#include "server/rpc/grpc/grpc_server.h"
#include "server/rpc/grpc/kserve_grpc.h"
#include "server/rpc/http/kserve_http.h"
#include "server/rpc/front_end.h"
#include "server/rpc/grpc/reset_guard.h"
#include "server/rpc/grpc/service.h"
#include "server/scheduling/admission.h"
#include "server/scheduling/batcher.h"
#include "server/scheduling/scheduler.h"
#include "server/server_options.h"

namespace {
const softmax::server::ServerOptions kDefaults;
// Raised by the GPU backend's fault handler to wake the signal loop.
constexpr int kFaultSignal = SIGUSR1;
// An hour: longer batching delays are a mistake, and bounding them keeps the
// batcher's time arithmetic far from overflow.
constexpr int64_t kMaxQueueDelayUs = int64_t{3600} * 1000 * 1000;
// gRPC takes the connection age in int milliseconds: about 24 days at most.
constexpr int64_t kMaxConnectionAgeS = int64_t{24} * 24 * 3600;
// The lame duck: from SIGINT/SIGTERM, new requests are refused with a
// retryable UNAVAILABLE (health NOT_SERVING) for this long before the
// listener may close. No measurement chose 500 ms: it is the value the drain
// was built and tested with (tests/test_shutdown.py); it needs only to
// outlast a refusal's round trip, and every restart waits it out.
constexpr std::chrono::milliseconds kLameDuck(500);
// Pause between the last response and closing the connections, so callers
// read their responses before the close (see Admission::WaitForInFlight).
constexpr std::chrono::milliseconds kCloseLinger(200);
// How long refusals are held once Shutdown has started (see
// Admission::HoldRefusals): Shutdown sends its GOAWAY at once, and
// loopback clients read it well within this.
constexpr std::chrono::milliseconds kHoldRefusalsAfterShutdown(100);
// Once every request is answered, Shutdown waits this long for the idle
// connections to go before it closes them: gRPC 1.51 otherwise waits until
// each client closes its own after the GOAWAY (grpcio: about 4.5 s).
constexpr std::chrono::milliseconds kCloseIdleConnectionsAfter(300);
// How often the heaps' free pages go back to the system (server/memory_trim.h).
// Returning 435 MiB free in 16 heaps took 281 ms on a busy 2-core host, 0.1 ms
// when nothing had been freed since; pages used again fault back in once per
// period, against the many messages that reuse them within it.
const absl::Duration kMemoryTrimPeriod = absl::Seconds(10);
}  // namespace

ABSL_FLAG(std::string, grpc_address, kDefaults.grpc_address,
          "host:port for gRPC; port 0 picks a free port (the bound one is printed in the "
          "\"listening\" line)");
ABSL_FLAG(std::string, http_address, kDefaults.http_address,
          "host:port for the KServe v2 / Triton HTTP/REST API (/v2/...); empty disables; port 0 "
          "picks a free port");
ABSL_FLAG(std::string, metrics_address, kDefaults.metrics_address,
          "host:port for Prometheus /metrics; empty disables; port 0 picks a free port");
ABSL_FLAG(std::string, device, kDefaults.device,
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
ABSL_FLAG(int64_t, max_queue_delay_us, kDefaults.max_queue_delay_us,
          "longest wait of the oldest queued request for company while the device is busy; "
          "0 forms a batch as soon as a slot is free (an idle device never waits)");
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
ABSL_FLAG(int64_t, max_connection_age_s, kDefaults.max_connection_age_s,
          "a gRPC connection older than this (+-10%) gets a GOAWAY and a stream a retryable "
          "UNAVAILABLE once its read messages are answered, so callers reconnect and spread over "
          "replicas added since (a balancer or round_robin over a headless Service); the age "
          "bounds how long a new replica waits for its share. 0 = connections live forever");
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
ABSL_FLAG(std::string, shared_memory, kDefaults.shared_memory,
          "Triton's shared-memory extensions on the KServe endpoints: off, system (POSIX "
          "shared memory) or all (also CUDA IPC memory). Any caller that reaches the port may "
          "then map any shared-memory key or IPC handle it can name");
ABSL_FLAG(int, shutdown_grace_s, kDefaults.shutdown_grace_s,
          "seconds in-flight RPCs get to finish after SIGINT/SIGTERM before they are cancelled");
ABSL_FLAG(std::string, log_format, kDefaults.log_format,
          "text (timestamp, level letter, message, key=value) | json (one object per line: "
          "time, level, logger, msg and the line's fields), on stderr");
ABSL_FLAG(int64_t, access_log_one_in, kDefaults.access_log_one_in,
          "access log: one line (logger \"access\": method, code, bytes, latency_ms, peer) for "
          "one finished request in this many, stream messages counted singly; 0 = off, 1 = every "
          "request");
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
  options.max_queue_delay_us = absl::GetFlag(FLAGS_max_queue_delay_us);
  options.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  options.max_held_bytes = absl::GetFlag(FLAGS_max_held_bytes);
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.max_connection_age_s = absl::GetFlag(FLAGS_max_connection_age_s);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  options.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  options.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  options.reflection = absl::GetFlag(FLAGS_reflection);
  options.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  options.shutdown_grace_s = absl::GetFlag(FLAGS_shutdown_grace_s);
  options.log_format = absl::GetFlag(FLAGS_log_format);
  options.access_log_one_in = absl::GetFlag(FLAGS_access_log_one_in);
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

// The bound on the input bytes waiting in the batcher's queue: half of
// --max_held_bytes (4 GiB by default). A queued request holds its input and
// its output in that budget, so only requests with a tensor in shared memory,
// which the budget does not count, can reach this bound first. No held bound
// (0): none on the queue either.
int64_t MaxQueuedBytes(int64_t max_held_bytes) {
  if (max_held_bytes <= 0) return std::numeric_limits<int64_t>::max();
  return std::max<int64_t>(1, max_held_bytes / 2);
}

int Fail(const absl::Status& status) {
  logging::LogError(status.message());
  return 1;
}

int Run(const ServerOptions& options) {
  // First, so that every later line is in the chosen format.
  absl::StatusOr<logging::LogFormat> log_format = logging::ParseLogFormat(options.log_format);
  if (!log_format.ok()) return Fail(log_format.status());
  logging::LogOptions log_options;
  log_options.format = *log_format;
  log_options.access_log_one_in = options.access_log_one_in;
  if (absl::Status configured = logging::ConfigureLogging(log_options); !configured.ok()) {
    return Fail(configured);
  }
  if (options.max_tensor_bytes <= 0 || options.max_batch_rows <= 0 ||
      options.max_batch_bytes <= 0 || options.max_queued_requests <= 0 ||
      options.max_concurrent_streams <= 0) {
    return Fail(absl::InvalidArgumentError(
        "--max_tensor_bytes, --max_batch_rows, --max_batch_bytes, --max_queued_requests "
        "and --max_concurrent_streams must be positive"));
  }
  if (options.max_connection_age_s < 0 || options.max_connection_age_s > kMaxConnectionAgeS) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--max_connection_age_s: 0 (no maximum) to ", kMaxConnectionAgeS, ", got ",
        options.max_connection_age_s)));
  }
  if (options.max_held_bytes < 0) {
    return Fail(absl::InvalidArgumentError("--max_held_bytes: must be >= 0 (0: no bound)"));
  }
  if (options.max_queue_delay_us < 0 || options.shutdown_grace_s < 0 ||
      options.inject_fault_after_batches < 0) {
    return Fail(absl::InvalidArgumentError(
        "--max_queue_delay_us, --shutdown_grace_s and SOFTMAX_TEST_INJECT_FAULT_AFTER_BATCHES "
        "must not be negative"));
  }
  if (options.max_queue_delay_us > kMaxQueueDelayUs) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--max_queue_delay_us: at most ", kMaxQueueDelayUs, " (an hour), got ",
        options.max_queue_delay_us)));
  }
  absl::StatusOr<DeviceSpec> spec = ParseDeviceSpec(options.device);
  if (!spec.ok()) return Fail(spec.status());
  absl::StatusOr<SharedMemoryMode> shared_memory_mode =
      ParseSharedMemoryMode(options.shared_memory);
  if (!shared_memory_mode.ok()) return Fail(shared_memory_mode.status());
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
  MemoryTrimmer memory_trimmer(kMemoryTrimPeriod);

  // The CPU backend takes every core the process may run on, and a GPU
  // backend as much device memory as it needs (their options' defaults).
  BackendOptions backend_options;
  backend_options.cuda.max_staging_bytes = options.max_batch_bytes;
  backend_options.cuda.inject_fault_after_batches = options.inject_fault_after_batches;
  // A sticky GPU error: log it and wake the signal loop below, which takes
  // the server down with a non-zero exit so its supervisor restarts it.
  // Declared before the backend, so it outlives the handler that sets it.
  static std::atomic<bool> device_faulted{false};
  backend_options.on_fault = [](const absl::Status& status) {
    device_faulted.store(true);
    logging::LogError("fatal GPU error", {{"cause", status.message()}});
    kill(getpid(), kFaultSignal);
  };
  absl::StatusOr<BackendChoice> choice = CreateBackends(*spec, backend_options);
  if (!choice.ok()) return Fail(choice.status());
  if (choice->unusable != GpuUnusableCause::kNone) {
    logging::LogWarning("--device=auto serves on the CPU: a GPU is present but unusable",
                        {{"cause", CauseName(choice->unusable)},
                         {"detail", choice->unusable_detail}});
  }
  logging::LogInfo(absl::StrCat("device=", choice->device, " ", choice->description));
  std::vector<Backend*> backends;
  std::vector<const Backend*> observed;
  for (const std::unique_ptr<Backend>& backend : choice->backends) {
    backends.push_back(backend.get());
    observed.push_back(backend.get());
  }

  // No --metrics_address: no Metrics object, so nothing is recorded at all.
  // Declared after `choice`: destroyed before the backends its scrapes read.
  std::unique_ptr<Metrics> metrics;
  const int64_t max_queued_bytes = MaxQueuedBytes(options.max_held_bytes);
  if (!options.metrics_address.empty()) {
    absl::StatusOr<std::unique_ptr<Metrics>> created = Metrics::Create(options.metrics_address);
    if (!created.ok()) return Fail(created.status());
    metrics = std::move(*created);
    metrics->SetBackends(observed);
    metrics->SetQueueCapacity(options.max_queued_requests, max_queued_bytes);
    if (choice->unusable != GpuUnusableCause::kNone) {
      metrics->SetGpuUnusable(CauseName(choice->unusable));
    }
  }

  // Readiness tells the truth: nothing listens (so no probe passes, and no
  // health check reports SERVING) until every device has computed a checked
  // softmax.
  for (Backend* backend : backends) {
    if (absl::Status warm = WarmUp(*backend); !warm.ok()) return Fail(warm);
    logging::LogInfo("warm-up softmax checked", {{"backend", backend->Name()}});
  }

  // The scheduler runs the backends' slots; the batcher feeds it. Declared
  // after the backends and the metrics, so both outlive their threads.
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Batcher> batcher;
  if (!backends.empty()) {
    scheduler = std::make_unique<Scheduler>(backends);
    BatcherOptions batcher_options;
    batcher_options.max_batch_rows = options.max_batch_rows;
    batcher_options.max_batch_bytes = options.max_batch_bytes;
    batcher_options.max_queue_delay = std::chrono::microseconds(options.max_queue_delay_us);
    batcher_options.dispatch_when_idle = !options.test_no_idle_dispatch;
    batcher_options.max_queued_requests = options.max_queued_requests;
    batcher_options.max_queued_bytes = max_queued_bytes;
    batcher = std::make_unique<Batcher>(batcher_options, scheduler.get(), metrics.get());
  }

  std::unique_ptr<TokenAuthenticator> authenticator;
  if (!options.auth_tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenAuthenticator>> created =
        TokenAuthenticator::FromFile(options.auth_tokens_file);
    if (!created.ok()) return Fail(created.status());
    authenticator = std::move(*created);
  }

  MemoryBudget budget(options.max_held_bytes, [metrics = metrics.get()](int64_t held) {
    if (metrics != nullptr) metrics->SetHeldBytes(held);
  });
  if (metrics != nullptr) metrics->SetHeldBytesLimit(options.max_held_bytes);
  // The one door into the batcher for every protocol.
  AdmissionOptions admission_options;
  admission_options.echo = backends.empty();
  admission_options.budget = &budget;
  Admission admission(admission_options, batcher.get());
  PrematureResetGuard reset_guard;
  FrontEnd front_end;
  front_end.admission = &admission;
  front_end.metrics = metrics.get();
  front_end.authenticator = authenticator.get();
  front_end.reset_guard = &reset_guard;
  front_end.limits.max_tensor_bytes = options.max_tensor_bytes;
  front_end.max_stream_age = std::chrono::seconds(options.max_connection_age_s);
  SoftmaxServiceImpl service(front_end);

  // The Open Inference Protocol (KServe v2): gRPC beside softmax.v1, HTTP on
  // its own port; both dispatch through `admission`, into the one batcher.
  kserve::ModelStatistics kserve_statistics;
  std::unique_ptr<DeviceMemoryMapper> memory_mapper =
      CreateDeviceMemoryMapper(choice->cuda_devices);
  SharedMemoryManager shared_memory(
      *shared_memory_mode, memory_mapper.get(),
      [metrics = metrics.get()](SharedMemoryKind kind, int64_t regions, int64_t bytes) {
        if (metrics != nullptr) metrics->SetSharedMemory(SharedMemoryKindName(kind), regions, bytes);
      });
  KServeGrpcService kserve_service(front_end, &kserve_statistics, SOFTMAX_VERSION,
                                   &shared_memory);

  GrpcServerOptions grpc_options;
  grpc_options.address = options.grpc_address;
  grpc_options.max_tensor_bytes = options.max_tensor_bytes;
  grpc_options.additional_services.push_back(&kserve_service);
  grpc_options.max_concurrent_streams = options.max_concurrent_streams;
  grpc_options.max_connection_age_ms = options.max_connection_age_s * 1000;
  grpc_options.reset_guard = &reset_guard;
  grpc_options.tls_cert_file = options.tls_cert_file;
  grpc_options.tls_key_file = options.tls_key_file;
  grpc_options.tls_client_ca_file = options.tls_client_ca_file;
  grpc_options.reflection = options.reflection;
  // What the transport may buffer: the queue's bytes plus a few messages in
  // reading at their largest (the queue bound is checked after a message is
  // read, so this is the bound on reading, not on queueing). No memory bound,
  // no quota.
  if (options.max_held_bytes > 0) {
    grpc_options.transport_memory_bytes =
        max_queued_bytes + 4 * (options.max_tensor_bytes + kMessageHeadroomBytes);
  }
  // Both endpoints take the TLS files; a misfit (say, a key that is not the
  // certificate's) is named here rather than as gRPC's bare bind failure.
  if (!options.tls_cert_file.empty() && !options.tls_key_file.empty()) {
    const absl::Status tls = CheckTlsFiles(
        {options.tls_cert_file, options.tls_key_file, options.tls_client_ca_file});
    if (!tls.ok()) return Fail(tls);
  }
  absl::StatusOr<RunningServer> server = StartGrpcServer(grpc_options, &service);
  if (!server.ok()) return Fail(server.status());

  std::unique_ptr<KServeHttpServer> http;
  if (!options.http_address.empty()) {
    HttpServerOptions http_options;
    http_options.address = options.http_address;
    http_options.server_version = SOFTMAX_VERSION;
    http_options.shared_memory = &shared_memory;
    http_options.tls = {options.tls_cert_file, options.tls_key_file, options.tls_client_ca_file};
    absl::StatusOr<std::unique_ptr<KServeHttpServer>> started =
        KServeHttpServer::Start(http_options, front_end, &kserve_statistics);
    if (!started.ok()) return Fail(started.status());
    http = std::move(*started);
  }

  const size_t colon = options.grpc_address.rfind(':');
  const std::string grpc_host =
      colon == std::string::npos ? options.grpc_address : options.grpc_address.substr(0, colon);
  if (metrics != nullptr) metrics->SetServing(true);
  logging::LogInfo("listening",
                   {{"grpc", absl::StrCat(grpc_host, ":", server->port)},
                    {"http", http != nullptr ? http->BoundAddress() : "off"},
                    {"metrics", metrics != nullptr ? metrics->BoundAddress() : "off"}});

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  // SIGHUP: re-read the tokens, keep serving.
  while (signal_number == SIGHUP) {
    if (authenticator != nullptr) {
      const absl::Status reloaded = authenticator->Reload();
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
                     {{"grace_s", options.shutdown_grace_s}});
  }

  // Health first, so balancers stop sending; refuse new requests with a
  // retryable UNAVAILABLE for the lame-duck period; then stop accepting and
  // let the RPCs in flight finish (the batcher keeps running for them).
  SetServing(server->server.get(), false);
  if (metrics != nullptr) metrics->SetServing(false);
  admission.StartDraining();
  // What is already queued is computed now, without waiting out the batching
  // delay; Stop() returns once the backend has answered all of it.
  if (batcher != nullptr) batcher->Stop();
  std::this_thread::sleep_for(kLameDuck);
  // Logged, so that the lame duck's length can be read off the server's own
  // clock (tests/test_shutdown.py), whatever the rest of the drain takes.
  logging::LogInfo("lame duck over; closing the listeners");
  // The lame duck is over: /metrics and the HTTP endpoint go too (each stop
  // takes about a second, spent beside the rest of the shutdown; the batcher
  // has answered every HTTP request it admitted).
  std::thread stop_metrics([&metrics] {
    if (metrics != nullptr) metrics->StopExposer();
  });
  std::thread stop_http([&http] {
    if (http != nullptr) http->Stop();
  });
  // Let every accepted request be answered, then give the callers a moment
  // to read their last responses before the connections close (see
  // Admission::WaitForInFlight).
  const absl::Time grace_end = absl::Now() + absl::Seconds(fault ? 5 : options.shutdown_grace_s);
  const bool all_answered = admission.WaitForInFlight(grace_end);
  if (!all_answered) {
    logging::LogWarning("requests still in flight at the grace deadline",
                        {{"requests", admission.in_flight()}});
  }
  // Streams ended when their last request was answered (StartDraining).
  // Refusals are held from here across the start of Shutdown, so closed-loop
  // callers have nothing on its way when gRPC would cancel it (HoldRefusals);
  // anything still open gets what is left of the grace period, then gRPC
  // cancels it.
  admission.HoldRefusals();
  std::this_thread::sleep_for(kCloseLinger);
  const absl::Time close_by = all_answered
                                 ? std::min(grace_end, absl::Now() + absl::FromChrono(
                                                                        kCloseIdleConnectionsAfter))
                                 : grace_end;
  std::thread shutdown([&server, close_by] {
    server->server->Shutdown(absl::ToChronoTime(close_by));
  });
  std::this_thread::sleep_for(kHoldRefusalsAfterShutdown);
  admission.ReleaseHeldCalls();
  shutdown.join();
  server->server->Wait();
  stop_metrics.join();
  stop_http.join();
  logging::LogInfo("stopped");
  // A fault during a graceful drain still ends in the fault's exit status.
  return fault || device_faulted.load() ? 2 : 0;
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
