// softmax-server: parses flags into ServerOptions and wires the metrics,
// backend, batcher, service and gRPC server together. SIGINT/SIGTERM drain
// and exit 0.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/batcher.h"
#include "server/device.h"
#include "server/grpc_server.h"
#include "server/metrics.h"
#include "server/server_options.h"
#include "server/service.h"

namespace {
const softmax::server::ServerOptions kDefaults;
// Raised by the GPU backend's fault handler to wake the signal loop.
constexpr int kFaultSignal = SIGUSR1;
// An hour: longer batching delays are a mistake, and bounding them keeps the
// batcher's time arithmetic far from overflow.
// More answering threads than this only add contention on the transport.
constexpr int kMaxCompletionThreads = 256;
constexpr int64_t kMaxQueueDelayUs = int64_t{3600} * 1000 * 1000;
// Pause between the last response and closing the connections, so callers
// read their responses before the close (see WaitForRequestsInFlight).
constexpr std::chrono::milliseconds kCloseLinger(200);
}  // namespace

ABSL_FLAG(std::string, grpc_address, kDefaults.grpc_address,
          "host:port for gRPC; port 0 picks a free port");
ABSL_FLAG(std::string, metrics_address, kDefaults.metrics_address,
          "host:port for Prometheus /metrics; empty disables; port 0 picks a free port");
ABSL_FLAG(std::string, device, kDefaults.device,
          "auto | cpu | cuda | cuda:N | none (echo inputs, no compute)");
ABSL_FLAG(int64_t, max_tensor_bytes, kDefaults.max_tensor_bytes,
          "largest input tensor in bytes; also sets gRPC message limits");
ABSL_FLAG(int64_t, max_batch_rows, kDefaults.max_batch_rows, "a batch closes at this many rows");
ABSL_FLAG(int64_t, max_batch_bytes, kDefaults.max_batch_bytes,
          "a batch closes at this many input bytes");
ABSL_FLAG(int64_t, max_queue_delay_us, kDefaults.max_queue_delay_us,
          "longest wait of the oldest queued request before its batch is formed");
ABSL_FLAG(bool, dispatch_when_idle, kDefaults.dispatch_when_idle,
          "form a batch at once when the device has none in flight; requests wait for "
          "company (up to --max_queue_delay_us) only while it is busy");
ABSL_FLAG(int64_t, max_queued_requests, kDefaults.max_queued_requests,
          "queued requests beyond which new ones get UNAVAILABLE");
ABSL_FLAG(int64_t, max_queued_bytes, kDefaults.max_queued_bytes,
          "queued input bytes beyond which new requests get UNAVAILABLE");
ABSL_FLAG(int, completion_threads, kDefaults.completion_threads,
          "threads that answer the requests of large batches in parallel; 0 = answer every "
          "batch on the backend's thread");
ABSL_FLAG(int64_t, offload_completion_bytes, kDefaults.offload_completion_bytes,
          "batches of at least this many input bytes are answered by the completion threads");
ABSL_FLAG(int64_t, offload_completion_requests, kDefaults.offload_completion_requests,
          "batches of at least this many requests are answered by the completion threads; "
          "0 = by bytes only");
ABSL_FLAG(int, cpu_threads, kDefaults.cpu_threads, "CPU backend threads; 0 = all cores");
ABSL_FLAG(int, cuda_streams, kDefaults.cuda_streams,
          "GPU backend: batches in flight, each on its own CUDA stream");
ABSL_FLAG(bool, cuda_blocking_sync, kDefaults.cuda_blocking_sync,
          "GPU backend: sleep on each batch's CUDA event (after --cuda_spin_us of polling) "
          "instead of spinning until it completes");
ABSL_FLAG(int64_t, cuda_spin_us, kDefaults.cuda_spin_us,
          "GPU backend, with --cuda_blocking_sync: microseconds each batch's completion is "
          "polled before the stream's thread sleeps on it");
ABSL_FLAG(int64_t, cuda_idle_spin_us, kDefaults.cuda_idle_spin_us,
          "GPU backend: microseconds a stream's thread polls for the next batch after one "
          "before it sleeps (0 = sleep at once)");
ABSL_FLAG(int, cuda_idle_spin_threads, kDefaults.cuda_idle_spin_threads,
          "GPU backend: at most this many stream threads poll for the next batch at once "
          "(see --cuda_idle_spin_us)");
ABSL_FLAG(int64_t, cuda_inline_max_bytes, kDefaults.cuda_inline_max_bytes,
          "GPU backend: a batch of at most this many bytes that finds the GPU idle runs on "
          "the thread that submits it instead of a stream's thread (0 = never)");
ABSL_FLAG(bool, cuda_inline_when_busy, kDefaults.cuda_inline_when_busy,
          "GPU backend: batches within --cuda_inline_max_bytes run on the submitting thread "
          "also while other streams are busy, as long as one is free");
ABSL_FLAG(int64_t, cuda_zero_copy_max_bytes, kDefaults.cuda_zero_copy_max_bytes,
          "GPU backend: batches of at most this many input bytes skip the host<->device "
          "copies (the kernels read and write pinned host memory directly); 0 = always copy");
ABSL_FLAG(int64_t, cuda_pinned_responses_max_bytes, kDefaults.cuda_pinned_responses_max_bytes,
          "GPU backend: pinned host memory that responses not yet sent may hold; responses "
          "of at least --cuda_pinned_response_min_bytes are sent from the pinned memory their "
          "batch was computed into, without a copy, and their inputs are copied into pinned "
          "memory as they are admitted, while within it; 0 = always copy");
ABSL_FLAG(int64_t, cuda_pinned_response_min_bytes, kDefaults.cuda_pinned_response_min_bytes,
          "GPU backend: smallest response sent from pinned memory (smaller ones are copied)");
ABSL_FLAG(int64_t, cuda_memory_limit_bytes, kDefaults.cuda_memory_limit_bytes,
          "GPU backend: device memory it may hold, staging included; 0 = no cap");
ABSL_FLAG(int64_t, inject_fault_after_batches, kDefaults.inject_fault_after_batches,
          "testing only: make the GPU fault for real after this many batches (0 = never)");
ABSL_FLAG(int64_t, malloc_mmap_threshold_bytes, kDefaults.malloc.mmap_threshold_bytes,
          "glibc malloc: allocations up to this size (at most 33554432) come from the heap, "
          "where freed memory is reused, instead of a fresh mmap each; 0 = glibc's default");
ABSL_FLAG(int64_t, malloc_trim_threshold_bytes, kDefaults.malloc.trim_threshold_bytes,
          "glibc malloc: free heap memory is returned to the system only beyond this much "
          "(at most 2147483647); 0 = glibc's default");
ABSL_FLAG(int, lame_duck_ms, kDefaults.lame_duck_ms,
          "after SIGINT/SIGTERM, milliseconds spent refusing new requests with UNAVAILABLE "
          "before the listener closes");
ABSL_FLAG(int, shutdown_grace_s, kDefaults.shutdown_grace_s,
          "seconds in-flight RPCs get to finish after SIGINT/SIGTERM");

namespace softmax::server {
namespace {

ServerOptions OptionsFromFlags() {
  ServerOptions options;
  options.grpc_address = absl::GetFlag(FLAGS_grpc_address);
  options.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  options.device = absl::GetFlag(FLAGS_device);
  options.max_tensor_bytes = absl::GetFlag(FLAGS_max_tensor_bytes);
  options.max_batch_rows = absl::GetFlag(FLAGS_max_batch_rows);
  options.max_batch_bytes = absl::GetFlag(FLAGS_max_batch_bytes);
  options.max_queue_delay_us = absl::GetFlag(FLAGS_max_queue_delay_us);
  options.dispatch_when_idle = absl::GetFlag(FLAGS_dispatch_when_idle);
  options.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  options.max_queued_bytes = absl::GetFlag(FLAGS_max_queued_bytes);
  options.completion_threads = absl::GetFlag(FLAGS_completion_threads);
  options.offload_completion_bytes = absl::GetFlag(FLAGS_offload_completion_bytes);
  options.offload_completion_requests = absl::GetFlag(FLAGS_offload_completion_requests);
  options.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  options.lame_duck_ms = absl::GetFlag(FLAGS_lame_duck_ms);
  options.shutdown_grace_s = absl::GetFlag(FLAGS_shutdown_grace_s);
  options.cuda_streams = absl::GetFlag(FLAGS_cuda_streams);
  options.cuda_blocking_sync = absl::GetFlag(FLAGS_cuda_blocking_sync);
  options.cuda_spin_us = absl::GetFlag(FLAGS_cuda_spin_us);
  options.cuda_idle_spin_us = absl::GetFlag(FLAGS_cuda_idle_spin_us);
  options.cuda_idle_spin_threads = absl::GetFlag(FLAGS_cuda_idle_spin_threads);
  options.cuda_inline_max_bytes = absl::GetFlag(FLAGS_cuda_inline_max_bytes);
  options.cuda_zero_copy_max_bytes = absl::GetFlag(FLAGS_cuda_zero_copy_max_bytes);
  options.cuda_inline_when_busy = absl::GetFlag(FLAGS_cuda_inline_when_busy);
  options.cuda_pinned_responses_max_bytes = absl::GetFlag(FLAGS_cuda_pinned_responses_max_bytes);
  options.cuda_pinned_response_min_bytes = absl::GetFlag(FLAGS_cuda_pinned_response_min_bytes);
  options.cuda_memory_limit_bytes = absl::GetFlag(FLAGS_cuda_memory_limit_bytes);
  options.inject_fault_after_batches = absl::GetFlag(FLAGS_inject_fault_after_batches);
  options.malloc.mmap_threshold_bytes = absl::GetFlag(FLAGS_malloc_mmap_threshold_bytes);
  options.malloc.trim_threshold_bytes = absl::GetFlag(FLAGS_malloc_trim_threshold_bytes);
  return options;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "softmax-server: error: %s\n", std::string(status.message()).c_str());
  return 1;
}

int Run(const ServerOptions& options) {
  if (options.max_tensor_bytes <= 0 || options.max_batch_rows <= 0 ||
      options.max_batch_bytes <= 0 || options.max_queue_delay_us < 0 ||
      options.max_queued_requests <= 0 || options.max_queued_bytes <= 0 ||
      options.cpu_threads < 0 || options.lame_duck_ms < 0 || options.shutdown_grace_s < 0 ||
      options.cuda_streams < 1 || options.inject_fault_after_batches < 0 ||
      options.cuda_memory_limit_bytes < 0 || options.cuda_spin_us < 0 ||
      options.cuda_idle_spin_us < 0 || options.cuda_idle_spin_threads < 1 ||
      options.cuda_inline_max_bytes < 0 || options.cuda_zero_copy_max_bytes < 0 ||
      options.cuda_pinned_responses_max_bytes < 0 || options.cuda_pinned_response_min_bytes < 0 ||
      options.completion_threads < 0 ||
      options.offload_completion_bytes <= 0 || options.offload_completion_requests < 0) {
    return Fail(absl::InvalidArgumentError(
        "limits must be positive (--max_queue_delay_us, --cpu_threads, --lame_duck_ms, "
        "--shutdown_grace_s, --cuda_spin_us, --cuda_idle_spin_us, --cuda_inline_max_bytes, "
        "--cuda_zero_copy_max_bytes, --cuda_pinned_responses_max_bytes, "
        "--cuda_pinned_response_min_bytes, --completion_threads and "
        "--offload_completion_requests may be 0)"));
  }
  if (options.completion_threads > kMaxCompletionThreads) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--completion_threads: at most ", kMaxCompletionThreads, ", got ",
        options.completion_threads)));
  }
  if (options.max_queue_delay_us > kMaxQueueDelayUs) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--max_queue_delay_us: at most ", kMaxQueueDelayUs, " (an hour), got ",
        options.max_queue_delay_us)));
  }
  if (!ValidMallocTuning(options.malloc)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--malloc_mmap_threshold_bytes must be 0 to ", kMaxMmapThresholdBytes,
        " and --malloc_trim_threshold_bytes 0 to ", INT_MAX, "; got ",
        options.malloc.mmap_threshold_bytes, " and ", options.malloc.trim_threshold_bytes)));
  }
  absl::StatusOr<DeviceSpec> spec = ParseDeviceSpec(options.device);
  if (!spec.ok()) return Fail(spec.status());
  // Before any other thread starts allocating.
  if (!ApplyMallocTuning(options.malloc)) {
    std::fprintf(stderr, "softmax-server: warning: glibc refused the --malloc_* settings\n");
  }

  // Signals are taken by sigwait below; block them before any thread starts
  // so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, kFaultSignal);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  BackendOptions backend_options;
  backend_options.cpu.threads = options.cpu_threads;
  backend_options.cuda.slots = options.cuda_streams;
  backend_options.cuda.blocking_sync = options.cuda_blocking_sync;
  backend_options.cuda.spin_us = options.cuda_spin_us;
  backend_options.cuda.idle_spin_us = options.cuda_idle_spin_us;
  backend_options.cuda.idle_spin_threads = options.cuda_idle_spin_threads;
  backend_options.cuda.inline_max_bytes = options.cuda_inline_max_bytes;
  backend_options.cuda.zero_copy_max_bytes = options.cuda_zero_copy_max_bytes;
  backend_options.cuda.pinned_responses_max_bytes = options.cuda_pinned_responses_max_bytes;
  backend_options.cuda.pinned_response_min_bytes = options.cuda_pinned_response_min_bytes;
  backend_options.cuda.inline_when_busy = options.cuda_inline_when_busy;
  backend_options.cuda.memory_limit_bytes = options.cuda_memory_limit_bytes;
  backend_options.cuda.max_staging_bytes = options.max_batch_bytes;
  backend_options.cuda.inject_fault_after_batches = options.inject_fault_after_batches;
  // A sticky GPU error: log it and wake the signal loop below, which takes
  // the server down with a non-zero exit so its supervisor restarts it.
  // Declared before the backend, so it outlives the handler that sets it.
  static std::atomic<bool> device_faulted{false};
  backend_options.on_fault = [](const absl::Status& status) {
    device_faulted.store(true);
    std::fprintf(stderr, "softmax-server: fatal GPU error: %s\n",
                 std::string(status.message()).c_str());
    kill(getpid(), kFaultSignal);
  };
  absl::StatusOr<BackendChoice> choice = CreateBackend(*spec, backend_options);
  if (!choice.ok()) return Fail(choice.status());
  std::fprintf(stderr, "softmax-server: device=%s %s\n", choice->device.c_str(),
               choice->description.c_str());

  // No --metrics_address: no Metrics object, so nothing is recorded at all.
  // Declared after `choice`: destroyed before the backend its scrapes read.
  std::unique_ptr<Metrics> metrics;
  if (!options.metrics_address.empty()) {
    absl::StatusOr<std::unique_ptr<Metrics>> created = Metrics::Create(options.metrics_address);
    if (!created.ok()) return Fail(created.status());
    metrics = std::move(*created);
    metrics->SetBackend(choice->device, choice->backend.get());
    metrics->SetQueueCapacity(options.max_queued_requests, options.max_queued_bytes);
  }

  std::unique_ptr<Batcher> batcher;
  if (choice->backend != nullptr) {
    BatcherOptions batcher_options;
    batcher_options.max_batch_rows = options.max_batch_rows;
    batcher_options.max_batch_bytes = options.max_batch_bytes;
    batcher_options.max_queue_delay = std::chrono::microseconds(options.max_queue_delay_us);
    batcher_options.dispatch_when_idle = options.dispatch_when_idle;
    // The GPU backend packs every input of a batch into its staging before
    // it writes any output, so responses can take over the requests' input
    // buffers (no allocation, page faults or zero fill per response).
    batcher_options.outputs_reuse_inputs = DeviceWorker::kComputesInPlace &&
                                           absl::StartsWith(choice->device, "cuda");
    batcher_options.completion_threads = options.completion_threads;
    batcher_options.offload_completion_bytes = options.offload_completion_bytes;
    batcher_options.offload_completion_requests =
        static_cast<int>(std::min<int64_t>(options.offload_completion_requests, 1 << 30));
    batcher_options.max_queued_requests = options.max_queued_requests;
    batcher_options.max_queued_bytes = options.max_queued_bytes;
    batcher = std::make_unique<Batcher>(batcher_options, choice->backend.get(), metrics.get());
  }

  ServiceOptions service_options;
  service_options.limits.max_tensor_bytes = options.max_tensor_bytes;
  service_options.echo = choice->backend == nullptr;
  SoftmaxServiceImpl service(service_options, batcher.get(), metrics.get());

  GrpcServerOptions grpc_options;
  grpc_options.address = options.grpc_address;
  grpc_options.max_tensor_bytes = options.max_tensor_bytes;
  absl::StatusOr<RunningServer> server = StartGrpcServer(grpc_options, &service);
  if (!server.ok()) return Fail(server.status());

  const size_t colon = options.grpc_address.rfind(':');
  const std::string grpc_host =
      colon == std::string::npos ? options.grpc_address : options.grpc_address.substr(0, colon);
  if (metrics != nullptr) metrics->SetServing(true);
  std::fprintf(stderr, "softmax-server: listening grpc=%s:%d metrics=%s\n", grpc_host.c_str(),
               server->port, metrics != nullptr ? metrics->BoundAddress().c_str() : "off");
  std::fflush(stderr);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  const bool fault = signal_number == kFaultSignal;
  if (fault) {
    // Requests in flight fail INTERNAL at once (the worker refuses them);
    // a short grace lets those answers reach their callers.
    std::fprintf(stderr, "softmax-server: GPU fault; NOT_SERVING, exiting with status 2\n");
  } else {
    std::fprintf(stderr, "softmax-server: %s received; draining (up to %d s)\n",
                 signal_number == SIGINT ? "SIGINT" : "SIGTERM", options.shutdown_grace_s);
  }

  // Health first, so balancers stop sending; refuse new requests with a
  // retryable UNAVAILABLE for the lame-duck period; then stop accepting and
  // let the RPCs in flight finish (the batcher keeps running for them).
  SetServing(server->server.get(), false);
  if (metrics != nullptr) metrics->SetServing(false);
  service.StartDraining();
  // What is already queued is computed now, without waiting out the batching
  // delay; Stop() returns once the backend has answered all of it.
  if (batcher != nullptr) batcher->Stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(options.lame_duck_ms));
  // Let every accepted request be answered, then give the callers a moment
  // to read their last responses before the connections close (see
  // SoftmaxServiceImpl::WaitForRequestsInFlight).
  const absl::Time grace_end = absl::Now() + absl::Seconds(fault ? 5 : options.shutdown_grace_s);
  if (!service.WaitForRequestsInFlight(grace_end)) {
    std::fprintf(stderr, "softmax-server: %d request(s) still in flight at the grace deadline\n",
                 service.requests_in_flight());
  }
  std::this_thread::sleep_for(kCloseLinger);
  // Open streams with nothing in flight get what is left of the grace period
  // to end; then gRPC cancels them.
  server->server->Shutdown(absl::ToChronoTime(grace_end));
  server->server->Wait();
  std::fprintf(stderr, "softmax-server: stopped\n");
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
      "softmax-server: softmax / log-softmax over gRPC (softmax.v1.SoftmaxService).\n"
      "Usage: softmax-server [--grpc_address=0.0.0.0:50051] [--device=auto] ...");
  absl::ParseCommandLine(argc, argv);
  return softmax::server::Run(softmax::server::OptionsFromFlags());
}
