#include "server/server.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/listening_file.h"
#include "server/logging/log.h"
#include "server/rpc/http/civetweb_tls.h"

namespace softmax::server {
namespace {

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
// Once every request is answered and the held refusals are released,
// Shutdown waits this long for the idle connections to go before it closes
// them (cancelling what is left): gRPC 1.51 otherwise waits until each
// client closes its own after the GOAWAY (grpcio: about 4.5 s). Counted from
// when the release is due, not from Shutdown's start, so that the released
// refusals keep this long to be written after the hold.
constexpr std::chrono::milliseconds kCloseIdleConnectionsAfter(300);
// The grace after a device fault, instead of --shutdown_grace_s: requests in
// flight then fail INTERNAL at once, and this lets those answers reach
// their callers.
constexpr absl::Duration kFaultGrace = absl::Seconds(5);
// How often the heaps' free pages go back to the system (server/memory_trim.h).
// Returning 435 MiB free in 16 heaps took 281 ms on a busy 2-core host, 0.1 ms
// when nothing had been freed since; pages used again fault back in once per
// period, against the many messages that reuse them within it.
const absl::Duration kMemoryTrimPeriod = absl::Seconds(10);

// The bound on the input bytes waiting in the batcher's queue: half of
// --max_held_bytes (4 GiB by default). A queued request holds its input and
// its output in that budget, so only requests with a tensor in shared memory,
// which the budget does not count, can reach this bound first. No held bound
// (0): none on the queue either.
int64_t MaxQueuedBytes(int64_t max_held_bytes) {
  if (max_held_bytes <= 0) return std::numeric_limits<int64_t>::max();
  return std::max<int64_t>(1, max_held_bytes / 2);
}

}  // namespace

Server::Server(ServerOptions options, ServerHooks hooks)
    : options_(std::move(options)), hooks_(std::move(hooks)) {}

Server::~Server() {
  bool started = false;
  bool waited = false;
  {
    absl::MutexLock lock(&mu_);
    started = started_;
    waited = waited_;
  }
  if (!started) return;  // the members stop what a failed Start brought up
  Drain();
  if (!waited) Wait();
}

absl::Status Server::Start() {
  if (absl::Status valid = Validate(options_); !valid.ok()) return valid;
  memory_trimmer_ = std::make_unique<MemoryTrimmer>(kMemoryTrimPeriod);

  // A sticky GPU error: log it and tell the program (softmax-server's
  // signal loop), which takes the server down with a non-zero exit so that
  // its supervisor restarts it.
  const BackendOptions backend_options =
      BackendOptionsFor(options_, [this](const absl::Status& status) {
        device_faulted_.store(true);
        logging::LogError("fatal GPU error", {{"cause", status.message()}});
        if (hooks_.on_device_fault) hooks_.on_device_fault();
      });
  absl::StatusOr<BackendChoice> choice = hooks_.create_backends
                                             ? hooks_.create_backends(backend_options)
                                             : CreateBackends(options_.device, backend_options);
  if (!choice.ok()) return choice.status();
  choice_ = std::move(*choice);
  if (choice_.unusable != GpuUnusableCause::kNone) {
    logging::LogWarning("--device=auto serves on the CPU: a GPU is present but unusable",
                        {{"cause", CauseName(choice_.unusable)},
                         {"detail", choice_.unusable_detail}});
  }
  logging::LogInfo(absl::StrCat("device=", choice_.device, " ", choice_.description));
  if (choice_.cuda_devices.size() > 1) {
    if (choice_.plans_difference.empty()) {
      logging::LogInfo(
          "GPU launch plans identical: a request's answer has the same bits on every GPU",
          {{"device", choice_.device}});
    } else {
      logging::LogWarning(
          "GPU launch plans differ: a request's answer may have other bits on another GPU",
          {{"device", choice_.device}, {"detail", choice_.plans_difference}});
    }
  }
  std::vector<Backend*> backends;
  std::vector<const Backend*> observed;
  for (const std::unique_ptr<Backend>& backend : choice_.backends) {
    backends.push_back(backend.get());
    observed.push_back(backend.get());
  }

  // Readiness tells the truth: nothing listens (so no probe passes, and no
  // health check reports SERVING) until every device has computed a checked
  // softmax and log-softmax, not even /metrics.
  for (Backend* backend : backends) {
    if (absl::Status warm = WarmUp(*backend); !warm.ok()) return warm;
    logging::LogInfo("warm-up softmax checked", {{"backend", backend->Name()}});
  }

  // No --metrics_address: no Metrics object, so nothing is recorded at all.
  const int64_t max_queued_bytes = MaxQueuedBytes(options_.max_held_bytes);
  if (!options_.metrics_address.empty()) {
    absl::StatusOr<std::unique_ptr<Metrics>> created = Metrics::Create("");
    if (!created.ok()) return created.status();
    metrics_ = std::move(*created);
    metrics_->SetBackends(observed);
    metrics_->SetQueueCapacity(options_.max_queued_requests, max_queued_bytes);
    if (choice_.unusable != GpuUnusableCause::kNone) {
      metrics_->SetGpuUnusable(CauseName(choice_.unusable));
    }
    if (!choice_.cuda_devices.empty()) {
      metrics_->SetGpuPlansIdentical(choice_.plans_difference.empty());
    }
  }

  if (!backends.empty()) {
    scheduler_ = std::make_unique<Scheduler>(backends);
    BatcherOptions batcher_options;
    batcher_options.max_batch_rows = options_.max_batch_rows;
    batcher_options.max_batch_bytes = options_.max_batch_bytes;
    batcher_options.max_queue_delay = absl::ToChronoMicroseconds(options_.max_queue_delay);
    batcher_options.dispatch_when_idle = !options_.test_no_idle_dispatch;
    batcher_options.max_queued_requests = options_.max_queued_requests;
    batcher_options.max_queued_bytes = max_queued_bytes;
    batcher_ = std::make_unique<Batcher>(batcher_options, scheduler_.get(), metrics_.get());
  }

  if (!options_.auth_tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenAuthenticator>> created =
        TokenAuthenticator::FromFile(options_.auth_tokens_file);
    if (!created.ok()) return created.status();
    authenticator_ = std::move(*created);
  }

  budget_ = std::make_unique<MemoryBudget>(
      options_.max_held_bytes, [metrics = metrics_.get()](int64_t held) {
        if (metrics != nullptr) metrics->SetHeldBytes(held);
      });
  if (metrics_ != nullptr) metrics_->SetHeldBytesLimit(options_.max_held_bytes);
  // The one door into the batcher for every protocol.
  AdmissionOptions admission_options;
  admission_options.echo = backends.empty();
  admission_options.budget = budget_.get();
  admission_ = std::make_unique<Admission>(admission_options, batcher_.get());
  front_end_.admission = admission_.get();
  front_end_.metrics = metrics_.get();
  front_end_.authenticator = authenticator_.get();
  front_end_.reset_guard = &reset_guard_;
  front_end_.limits.max_tensor_bytes = options_.max_tensor_bytes;
  front_end_.max_stream_age = absl::ToChronoMilliseconds(options_.max_stream_age);
  service_ = std::make_unique<SoftmaxServiceImpl>(front_end_);

  // The Open Inference Protocol (KServe v2): gRPC beside softmax.v1, HTTP on
  // its own port; both dispatch through `admission_`, into the one batcher.
  memory_mapper_ = CreateDeviceMemoryMapper(choice_.cuda_devices);
  shared_memory_ = std::make_unique<SharedMemoryManager>(
      options_.shared_memory, memory_mapper_.get(),
      [metrics = metrics_.get()](SharedMemoryKind kind, int64_t regions, int64_t bytes) {
        if (metrics != nullptr) metrics->SetSharedMemory(SharedMemoryKindName(kind), regions, bytes);
      });
  kserve_service_ = std::make_unique<KServeGrpcService>(
      front_end_, &kserve_statistics_, options_.server_version, shared_memory_.get());

  GrpcServerOptions grpc_options;
  grpc_options.address = options_.grpc_address;
  grpc_options.max_tensor_bytes = options_.max_tensor_bytes;
  grpc_options.additional_services.push_back(kserve_service_.get());
  grpc_options.max_concurrent_streams = options_.max_concurrent_streams;
  grpc_options.max_connection_age_ms = absl::ToInt64Milliseconds(options_.max_connection_age);
  grpc_options.reset_guard = &reset_guard_;
  grpc_options.tls_cert_file = options_.tls_cert_file;
  grpc_options.tls_key_file = options_.tls_key_file;
  grpc_options.tls_client_ca_file = options_.tls_client_ca_file;
  grpc_options.reflection = options_.reflection;
  // What the transport may buffer: the queue's bytes plus a few messages in
  // reading at their largest (the queue bound is checked after a message is
  // read, so this is the bound on reading, not on queueing). No memory bound,
  // no quota.
  if (options_.max_held_bytes > 0) {
    grpc_options.transport_memory_bytes =
        max_queued_bytes + 4 * (options_.max_tensor_bytes + kMessageHeadroomBytes);
  }
  // Both endpoints take the TLS files; a misfit (say, a key that is not the
  // certificate's) is named here rather than as gRPC's bare bind failure.
  if (!options_.tls_cert_file.empty() && !options_.tls_key_file.empty()) {
    const absl::Status tls = CheckTlsFiles(
        {options_.tls_cert_file, options_.tls_key_file, options_.tls_client_ca_file});
    if (!tls.ok()) return tls;
  }
  // The listeners, in the order they start (they stop in reverse): /metrics,
  // gRPC (health SERVING from here), then the KServe HTTP endpoint.
  if (metrics_ != nullptr) {
    listeners_.push_back(
        std::make_unique<MetricsExposer>(metrics_.get(), options_.metrics_address));
    metrics_exposer_ = listeners_.back().get();
  }
  auto grpc = std::make_unique<GrpcListener>(std::move(grpc_options), service_.get());
  grpc_ = grpc.get();
  listeners_.push_back(std::move(grpc));
  if (!options_.http_address.empty()) {
    HttpServerOptions http_options;
    http_options.address = options_.http_address;
    http_options.server_version = options_.server_version;
    http_options.shared_memory = shared_memory_.get();
    http_options.tls = {options_.tls_cert_file, options_.tls_key_file,
                        options_.tls_client_ca_file};
    listeners_.push_back(
        std::make_unique<KServeHttpServer>(http_options, front_end_, &kserve_statistics_));
    http_ = listeners_.back().get();
  }
  for (const std::unique_ptr<Listener>& listener : listeners_) {
    if (absl::Status started = listener->Start(); !started.ok()) return started;
  }

  if (metrics_ != nullptr) metrics_->SetServing(true);
  const std::string grpc_address = grpc_->BoundAddress();
  logging::LogInfo("listening", {{"grpc", grpc_address},
                                 {"http", http_address()},
                                 {"metrics", metrics_address()}});
  if (!options_.listening_file.empty()) {
    ListeningInfo info{grpc_address, http_address(), metrics_address(),
                       static_cast<int64_t>(getpid()), options_.server_version,
                       options_.revision};
    if (absl::Status written = WriteListeningFile(options_.listening_file, info);
        !written.ok()) {
      return written;
    }
  }
  absl::MutexLock lock(&mu_);
  started_ = true;
  return absl::OkStatus();
}

void Server::Drain() {
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return;
    draining_ = true;
  }
  // After a device fault, requests in flight fail INTERNAL at once: the
  // short grace is enough for those answers.
  const bool fault = device_faulted_.load();

  // Health first, so balancers stop sending; refuse new requests with a
  // retryable UNAVAILABLE for the lame-duck period; then stop accepting and
  // let the RPCs in flight finish (the batcher keeps running for them).
  grpc_->SetServing(false);
  if (metrics_ != nullptr) metrics_->SetServing(false);
  AfterStep(DrainStep::kNotServing);
  admission_->StartDraining();
  AfterStep(DrainStep::kRefusing);
  // What is already queued is computed now, without waiting out the batching
  // delay; Stop() returns once the backend has answered all of it.
  if (batcher_ != nullptr) batcher_->Stop();
  AfterStep(DrainStep::kQueueFlushed);
  std::this_thread::sleep_for(kLameDuck);
  // Logged, so that the lame duck's length can be read off the server's own
  // clock (tests/test_shutdown.py), whatever the rest of the drain takes.
  logging::LogInfo("lame duck over; closing the listeners");
  // The lame duck is over: every listener stops accepting, in reverse order.
  // /metrics and the HTTP endpoint stop now (each stop takes about a second,
  // spent beside the rest of the shutdown; the batcher has answered every
  // HTTP request it admitted); gRPC keeps its port until its Shutdown below.
  for (auto it = listeners_.rbegin(); it != listeners_.rend(); ++it) (*it)->StopAccepting();
  AfterStep(DrainStep::kLameDuckOver);
  // Let every accepted request be answered, then give the callers a moment
  // to read their last responses before the connections close (see
  // Admission::WaitForInFlight).
  const absl::Time grace_end =
      absl::Now() + (fault ? kFaultGrace : options_.shutdown_grace);
  const bool all_answered = admission_->WaitForInFlight(grace_end);
  if (!all_answered) {
    logging::LogWarning("requests still in flight at the grace deadline",
                        {{"requests", admission_->in_flight()}});
  }
  AfterStep(DrainStep::kRequestsAnswered);
  // Streams ended when their last request was answered (StartDraining).
  // Refusals are held from here across the start of Shutdown, so closed-loop
  // callers have nothing on its way when gRPC would cancel it (HoldRefusals);
  // anything still open gets what is left of the grace period, then gRPC
  // cancels it.
  admission_->HoldRefusals();
  AfterStep(DrainStep::kRefusalsHeld);
  std::this_thread::sleep_for(kCloseLinger);
  const absl::Time close_by =
      all_answered
          ? std::min(grace_end, absl::Now() + absl::FromChrono(kHoldRefusalsAfterShutdown +
                                                               kCloseIdleConnectionsAfter))
          : grace_end;
  // gRPC's Shutdown sends the GOAWAY; the others are stopping already.
  for (auto it = listeners_.rbegin(); it != listeners_.rend(); ++it) (*it)->Shutdown(close_by);
  std::this_thread::sleep_for(kHoldRefusalsAfterShutdown);
  AfterStep(DrainStep::kShutdownStarted);
  admission_->ReleaseHeldCalls();
  AfterStep(DrainStep::kHeldCallsReleased);
  drained_.Notify();
}

void Server::Wait() {
  {
    absl::MutexLock lock(&mu_);
    waited_ = true;
  }
  drained_.WaitForNotification();
  for (auto it = listeners_.rbegin(); it != listeners_.rend(); ++it) (*it)->Wait();
  logging::LogInfo("stopped");
}

absl::Status Server::ReloadAuthTokens() {
  if (authenticator_ == nullptr) {
    return absl::FailedPreconditionError("no --auth_tokens_file to reload");
  }
  return authenticator_->Reload();
}

std::string Server::http_address() const {
  return http_ != nullptr ? http_->BoundAddress() : "off";
}

std::string Server::metrics_address() const {
  return metrics_exposer_ != nullptr ? metrics_exposer_->BoundAddress() : "off";
}

void Server::AfterStep(DrainStep step) {
  if (hooks_.after_drain_step) hooks_.after_drain_step(step);
}

}  // namespace softmax::server
