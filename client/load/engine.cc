#include "client/load/engine.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/load/latency_histogram.h"
#include "client/load/http.h"
#include "client/load/http_loop.h"
#include "client/load/http_wire.h"
#include "client/load/payload.h"
#include "client/load/run_interface.h"
#include "client/load/stream.h"
#include "client/load/wire.h"
#include "client/tensor.h"
#include "softmax/v1/softmax.grpc.pb.h"

namespace softmax::client {
namespace {

using Clock = LoadClock;

// A status code outside 0..16 counts as UNKNOWN.
int ClampCode(int code) { return code >= 0 && code < kGrpcStatusCodes ? code : 2; }

// A channel with its own TCP connection. CreateChannel's channels share one
// connection when their arguments are equal (gRPC's global subchannel pool);
// a load test over C connections needs them separate, so each gets a local
// subchannel pool.
std::shared_ptr<grpc::Channel> CreateLoadChannel(const LoadOptions& options, int index) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(options.max_message_bytes);
  arguments.SetMaxSendMessageSize(options.max_message_bytes);
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  arguments.SetInt("softmax.load.connection", index);
  return grpc::CreateCustomChannel(options.target, grpc::InsecureChannelCredentials(), arguments);
}

// Counters of one connection. Callbacks of one connection run on any of
// gRPC's threads, so everything is a relaxed atomic.
struct ConnectionStats {
  LatencyHistogram latency;  // OK measured requests, nanoseconds
  std::atomic<int64_t> ok{0};
  std::array<std::atomic<int64_t>, kGrpcStatusCodes> errors{};
  std::atomic<int64_t> rows{0};
  std::atomic<int64_t> payload_bytes{0};
  std::atomic<int64_t> timed{0};  // OK responses whose timing was summed
  std::atomic<int64_t> batch_requests{0};
  std::atomic<int64_t> batch_rows{0};
  std::atomic<int64_t> queue_ns{0};
  std::atomic<int64_t> compute_ns{0};
  std::atomic<int64_t> kernel_ns{0};
  std::atomic<int64_t> dispatch_ns{0};
  std::atomic<int64_t> warmup_requests{0};
  std::atomic<int64_t> warmup_errors{0};
  std::atomic<int64_t> verified{0};
  std::atomic<int64_t> mismatches{0};
  std::atomic<int64_t> last_completion_ns{0};  // since the run's start
};

void AtomicMax(std::atomic<int64_t>* target, int64_t value) {
  int64_t current = target->load(std::memory_order_relaxed);
  while (value > current &&
         !target->compare_exchange_weak(current, value, std::memory_order_relaxed)) {
  }
}

// The status code of a finished call whose response arrived as `buffer`:
// the call's own when it failed, INTERNAL (as a typed stub reports it) when
// the response does not parse, else 0 with `response` filled. `kserve` is the
// scratch message of a ModelInfer answer, null for softmax.v1.
int ParsedOutcome(const grpc::Status& status, grpc::ByteBuffer* buffer,
                  inference::ModelInferResponse* kserve, v1::SoftmaxResponse* response) {
  if (!status.ok()) return static_cast<int>(status.error_code());
  const bool parsed = kserve != nullptr ? ParseKserveResponse(buffer, kserve, response)
                                        : ParseResponseReusingBuffers(buffer, response);
  if (!parsed) {
    return static_cast<int>(grpc::StatusCode::INTERNAL);
  }
  return 0;
}

// State shared by every call of one run: it paces the requests (Admit, the
// open-loop sender), runs the unary calls itself and the streams and HTTP
// connections through their transports, and accounts every answer.
class LoadRun final : public LoadRunInterface {
 public:
  // One of `stubs` (gRPC protocols) and `http` (kHttp) holds the connections.
  LoadRun(const LoadOptions& options, const LoadMonitor& monitor,
          std::vector<LoadPayload> payloads,
          std::vector<uint32_t> schedule,
          std::vector<std::unique_ptr<grpc::GenericStub>> stubs,
          std::vector<std::unique_ptr<HttpConnection>> http)
      : options_(options),
        monitor_(monitor),
        payloads_(std::move(payloads)),
        schedule_(std::move(schedule)),
        stubs_(std::move(stubs)),
        connections_(static_cast<int>(std::max(stubs_.size(), http.size()))),
        stats_(connections_) {
    if (!http.empty()) http_loop_ = std::make_unique<HttpLoadLoop>(this, std::move(http));
  }

  // Runs to completion; returns once every call has finished.
  void Execute();
  LoadReport Report() const;

  bool Admit(Clock::time_point intended, bool* measured) override {
    if (stopped_.load(std::memory_order_relaxed)) return false;
    if (StopRequested()) return Stop();
    if (intended < measure_begin_) {
      *measured = false;
      return true;
    }
    if (intended >= measure_end_) return Stop();
    if (options_.requests > 0 &&
        measured_sent_.fetch_add(1, std::memory_order_relaxed) >= options_.requests) {
      return Stop();
    }
    *measured = true;
    return true;
  }

  const LoadPayload* NextPayload() override {
    const uint64_t k = next_payload_.fetch_add(1, std::memory_order_relaxed);
    return &payloads_[schedule_[k % schedule_.size()]];
  }

  grpc::GenericStub* stub(int connection) { return stubs_[connection].get(); }
  bool kserve() const { return options_.protocol == LoadProtocol::kKserve; }
  const char* unary_method() const { return kserve() ? kKserveInferMethod : kSoftmaxMethod; }

  void PrepareUnaryContext(grpc::ClientContext* context) const {
    if (options_.timeout != absl::InfiniteDuration()) {
      context->set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
    }
  }

  void Complete(int connection, const LoadPayload& payload, Clock::time_point intended,
                bool measured, int code, const v1::SoftmaxResponse* response) override {
    const Clock::time_point now = Clock::now();
    ConnectionStats& stats = stats_[connection];
    code = ClampCode(code);
    if (code == 0 && options_.verify) {
      stats.verified.fetch_add(1, std::memory_order_relaxed);
      const std::string problem = payload.request.top_k() > 0
                                      ? CheckLoadTopK(payload, response->top_k())
                                      : CheckLoadOutput(payload, response->output());
      if (!problem.empty()) {
        stats.mismatches.fetch_add(1, std::memory_order_relaxed);
        std::lock_guard<std::mutex> lock(mismatch_mutex_);
        if (first_mismatch_.empty()) {
          first_mismatch_ = absl::StrCat("response for ", FormatShape(ShapeOf(payload.request.input())),
                                         " ", WireDTypeName(payload.request.input().dtype()),
                                         ": ", problem);
        }
      }
    }
    const int64_t latency_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - intended).count();
    if (code != 0) live_errors_.fetch_add(1, std::memory_order_relaxed);
    if (live_ != nullptr && code == 0) live_->Record(latency_ns);
    if (!measured) {
      stats.warmup_requests.fetch_add(1, std::memory_order_relaxed);
      if (code != 0) stats.warmup_errors.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (code != 0) {
      stats.errors[code].fetch_add(1, std::memory_order_relaxed);
    } else {
      stats.latency.Record(latency_ns);
      stats.ok.fetch_add(1, std::memory_order_relaxed);
      stats.rows.fetch_add(payload.rows, std::memory_order_relaxed);
      stats.payload_bytes.fetch_add(
          payload.tensor_bytes +
              static_cast<int64_t>(response->output().data().size() +
                                   response->top_k().values().data().size() +
                                   response->top_k().indices().size()),
          std::memory_order_relaxed);
      if (response->has_timing()) {
        const v1::Timing& timing = response->timing();
        stats.timed.fetch_add(1, std::memory_order_relaxed);
        stats.batch_requests.fetch_add(timing.batch_requests(), std::memory_order_relaxed);
        stats.batch_rows.fetch_add(timing.batch_rows(), std::memory_order_relaxed);
        stats.queue_ns.fetch_add(timing.queue_ns(), std::memory_order_relaxed);
        stats.compute_ns.fetch_add(timing.compute_ns(), std::memory_order_relaxed);
        stats.kernel_ns.fetch_add(timing.kernel_ns(), std::memory_order_relaxed);
        stats.dispatch_ns.fetch_add(timing.dispatch_ns(), std::memory_order_relaxed);
      }
    }
    AtomicMax(&stats.last_completion_ns,
              std::chrono::duration_cast<std::chrono::nanoseconds>(now - start_).count());
  }

  void StreamReopened(int64_t resent, bool lost) override {
    stream_reopens_.fetch_add(1, std::memory_order_relaxed);
    resent_requests_.fetch_add(resent, std::memory_order_relaxed);
    if (lost) {
      streams_lost_.fetch_add(1, std::memory_order_relaxed);
      resent_after_loss_.fetch_add(resent, std::memory_order_relaxed);
    }
  }

  void Abort(const std::string& why) override {
    {
      std::lock_guard<std::mutex> lock(mismatch_mutex_);
      if (ended_early_.empty()) ended_early_ = why;
    }
    Stop();
  }

  void RecordUnmatched(const std::string& request_id) override {
    stats_[0].mismatches.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mismatch_mutex_);
    if (first_mismatch_.empty()) {
      first_mismatch_ = absl::StrCat("stream response with unknown request_id \"", request_id, "\"");
    }
  }

  // A closed-loop slot, a stream or an HTTP connection's thread has finished.
  void UnitDone() override {
    std::lock_guard<std::mutex> lock(done_mutex_);
    --units_running_;
    done_cv_.notify_all();
  }

  // Open loop: a response message for a call, one a finished call gave
  // back when there is one (it keeps its output's buffer, see client/load/wire.h).
  std::unique_ptr<v1::SoftmaxResponse> TakeResponse() {
    std::lock_guard<std::mutex> lock(responses_mutex_);
    if (spare_responses_.empty()) return std::make_unique<v1::SoftmaxResponse>();
    std::unique_ptr<v1::SoftmaxResponse> response = std::move(spare_responses_.back());
    spare_responses_.pop_back();
    return response;
  }
  void ReturnResponse(std::unique_ptr<v1::SoftmaxResponse> response) {
    std::lock_guard<std::mutex> lock(responses_mutex_);
    spare_responses_.push_back(std::move(response));
  }

  // Requests sent (or queued on a stream or for an HTTP connection) and not
  // yet accounted.
  void CallStarted() override { outstanding_.fetch_add(1, std::memory_order_relaxed); }
  // The decrement happens under done_mutex_: once the waiter sees zero it may
  // destroy this object, so nothing may touch it after the lock is released.
  void CallFinished() override {
    std::lock_guard<std::mutex> lock(done_mutex_);
    if (outstanding_.fetch_sub(1, std::memory_order_relaxed) == 1 ||
        waiting_for_room_.load(std::memory_order_relaxed)) {
      done_cv_.notify_all();
    }
  }

 private:
  bool StopRequested() const {
    return monitor_.stop_requested != nullptr &&
           monitor_.stop_requested->load(std::memory_order_relaxed);
  }

  bool Stop() {
    stopped_.store(true, std::memory_order_relaxed);
    return false;
  }

  void RunOpenLoop(std::vector<std::unique_ptr<LoadStreamWorker>>* workers);
  void IssueOpenUnary(int connection, Clock::time_point intended, bool measured);

  // --protocol=http: its requests go through http_loop_ (client/load/http_loop.h).
  bool http() const { return http_loop_ != nullptr; }
  void WaitForUnits(std::vector<std::unique_ptr<LoadStreamWorker>>* workers);
  void ProgressLoop();

  const LoadOptions options_;
  const LoadMonitor& monitor_;
  const std::vector<LoadPayload> payloads_;
  const std::vector<uint32_t> schedule_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
  const int connections_;
  std::vector<ConnectionStats> stats_;

  Clock::time_point start_;
  Clock::time_point measure_begin_;
  Clock::time_point measure_end_;
  std::atomic<bool> stopped_{false};
  std::atomic<int64_t> measured_sent_{0};
  std::atomic<uint64_t> next_payload_{0};
  std::atomic<int64_t> outstanding_{0};
  std::atomic<bool> waiting_for_room_{false};
  std::atomic<int64_t> stream_reopens_{0};
  std::atomic<int64_t> resent_requests_{0};
  std::atomic<int64_t> streams_lost_{0};
  std::atomic<int64_t> resent_after_loss_{0};

  std::mutex done_mutex_;
  std::condition_variable done_cv_;
  int units_running_ = 0;  // GUARDED_BY(done_mutex_)
  bool finished_ = false;  // GUARDED_BY(done_mutex_); stops the progress thread

  // OK latencies of every phase since the last progress sample; null when
  // nobody watches.
  std::unique_ptr<LatencyHistogram> live_;
  std::atomic<int64_t> live_errors_{0};

  std::mutex responses_mutex_;
  // At most as many as calls were in flight at once.
  std::vector<std::unique_ptr<v1::SoftmaxResponse>> spare_responses_;  // GUARDED_BY(responses_mutex_)

  mutable std::mutex mismatch_mutex_;
  std::string first_mismatch_;  // GUARDED_BY(mismatch_mutex_)
  std::string ended_early_;     // GUARDED_BY(mismatch_mutex_); Abort's reason

  // --protocol=http only.
  std::unique_ptr<HttpLoadLoop> http_loop_;
};

// Closed loop, unary: one request in flight at a time; each completion
// sends the next until the run stops admitting.
class UnarySlot {
 public:
  UnarySlot(LoadRun* run, int connection) : run_(run), connection_(connection) {}

  void SendNext() {
    const Clock::time_point now = Clock::now();
    if (!run_->Admit(now, &measured_)) {
      run_->UnitDone();
      return;
    }
    payload_ = run_->NextPayload();
    intended_ = now;
    // The previous call's context is done with: its callback is running.
    context_ = std::make_unique<grpc::ClientContext>();
    run_->PrepareUnaryContext(context_.get());
    run_->stub(connection_)->UnaryCall(
        context_.get(), run_->unary_method(), grpc::StubOptions(), &payload_->prepared->message(),
        &response_buffer_, [this](grpc::Status status) {
          const int code = ParsedOutcome(status, &response_buffer_,
                                         run_->kserve() ? &kserve_response_ : nullptr, &response_);
          run_->Complete(connection_, *payload_, intended_, measured_, code,
                         code == 0 ? &response_ : nullptr);
          SendNext();
        });
  }

 private:
  LoadRun* const run_;
  const int connection_;
  std::unique_ptr<grpc::ClientContext> context_;
  grpc::ByteBuffer response_buffer_;
  v1::SoftmaxResponse response_;  // reused: keeps its output's buffer
  inference::ModelInferResponse kserve_response_;  // reused likewise (--protocol=kserve)
  const LoadPayload* payload_ = nullptr;
  Clock::time_point intended_;
  bool measured_ = false;
};

// Open loop, unary: one heap object per call, deleted by its own callback.
struct UnaryCall {
  grpc::ClientContext context;
  grpc::ByteBuffer response_buffer;
  std::unique_ptr<v1::SoftmaxResponse> response;  // from LoadRun::TakeResponse
  inference::ModelInferResponse kserve_response;   // --protocol=kserve
  const LoadPayload* payload = nullptr;
  Clock::time_point intended;
  bool measured = false;
  int connection = 0;
};

void LoadRun::IssueOpenUnary(int connection, Clock::time_point intended, bool measured) {
  auto* call = new UnaryCall;
  call->payload = NextPayload();
  call->intended = intended;
  call->measured = measured;
  call->connection = connection;
  call->response = TakeResponse();
  PrepareUnaryContext(&call->context);
  CallStarted();
  stub(connection)->UnaryCall(
      &call->context, unary_method(), grpc::StubOptions(), &call->payload->prepared->message(),
      &call->response_buffer, [this, call](grpc::Status status) {
        const int code = ParsedOutcome(status, &call->response_buffer,
                                       kserve() ? &call->kserve_response : nullptr,
                                       call->response.get());
        Complete(call->connection, *call->payload, call->intended, call->measured, code,
                 code == 0 ? call->response.get() : nullptr);
        ReturnResponse(std::move(call->response));
        delete call;  // the callback holds its own reference to the call
        CallFinished();
      });
}

void LoadRun::RunOpenLoop(std::vector<std::unique_ptr<LoadStreamWorker>>* workers) {
  std::mt19937_64 engine(options_.seed ^ 0x9e3779b97f4a7c15ull);
  std::exponential_distribution<double> poisson_gap(options_.rate);
  const int connections = connections_;
  Clock::time_point intended = start_;
  double poisson_seconds = 0.0;  // sum of the gaps so far
  uint64_t sequence = 0;  // requests sent so far
  while (true) {
    Clock::time_point now = Clock::now();
    if (intended > now) {
      std::this_thread::sleep_until(intended);
    }
    if (outstanding_.load(std::memory_order_relaxed) >= options_.max_outstanding) {
      // Too many in flight: wait for room. The intended times do not move,
      // so this wait shows up in the latency of the requests that follow.
      std::unique_lock<std::mutex> lock(done_mutex_);
      waiting_for_room_.store(true, std::memory_order_relaxed);
      done_cv_.wait_for(lock, std::chrono::milliseconds(10), [this] {
        return outstanding_.load(std::memory_order_relaxed) < options_.max_outstanding;
      });
      waiting_for_room_.store(false, std::memory_order_relaxed);
      if (outstanding_.load(std::memory_order_relaxed) >= options_.max_outstanding) {
        if (StopRequested()) break;
        continue;
      }
    }
    bool measured = false;
    if (!Admit(intended, &measured)) break;
    const int connection = static_cast<int>(sequence % connections);
    if (http()) {
      http_loop_->Queue(NextPayload(), intended, measured);
    } else if (workers->empty()) {
      IssueOpenUnary(connection, intended, measured);
    } else {
      (*workers)[connection]->Send(NextPayload(), intended, measured);
    }
    ++sequence;
    // Offsets from start_ are computed afresh (not accumulated) and rounded
    // to whole nanoseconds, so constant arrivals land exactly on k / rate.
    double offset_seconds;
    if (options_.arrival == Arrival::kPoisson) {
      poisson_seconds += poisson_gap(engine);
      offset_seconds = poisson_seconds;
    } else {
      offset_seconds = static_cast<double>(sequence) / options_.rate;
    }
    intended = start_ + std::chrono::nanoseconds(std::llround(offset_seconds * 1e9));
  }
  for (auto& worker : *workers) worker->Close();
  if (http()) http_loop_->Close();
}

void LoadRun::WaitForUnits(std::vector<std::unique_ptr<LoadStreamWorker>>* workers) {
  // Calls carry their own deadlines; streams do not, so if they have not
  // drained one timeout after sending stopped, they are cancelled.
  std::unique_lock<std::mutex> lock(done_mutex_);
  const auto all_done = [this] {
    return units_running_ == 0 && outstanding_.load(std::memory_order_relaxed) == 0;
  };
  bool cancelled = false;
  std::optional<Clock::time_point> stopped_at;
  while (!all_done()) {
    done_cv_.wait_for(lock, std::chrono::milliseconds(50), all_done);
    if (all_done() || cancelled || workers->empty()) continue;
    if (!stopped_.load(std::memory_order_relaxed)) continue;
    if (!stopped_at.has_value()) stopped_at = Clock::now();
    if (options_.timeout != absl::InfiniteDuration() &&
        Clock::now() > *stopped_at + absl::ToChronoNanoseconds(options_.timeout)) {
      for (auto& worker : *workers) worker->Cancel();
      cancelled = true;
    }
  }
}

void LoadRun::ProgressLoop() {
  LatencyHistogram interval;
  Clock::time_point last = Clock::now();
  const auto period = absl::ToChronoNanoseconds(monitor_.progress_interval);
  std::unique_lock<std::mutex> lock(done_mutex_);
  while (!finished_) {
    done_cv_.wait_for(lock, period, [this] { return finished_; });
    if (finished_) break;
    // Completions take done_mutex_; the callback runs without it.
    lock.unlock();
    const Clock::time_point now = Clock::now();
    interval.Reset();
    live_->TakeInto(&interval);
    LoadProgress progress;
    progress.elapsed_seconds = std::chrono::duration<double>(now - start_).count();
    progress.measuring = now >= measure_begin_;
    progress.requests_per_second = static_cast<double>(interval.count()) /
                                   std::chrono::duration<double>(now - last).count();
    progress.p50_ns = interval.ValueAtQuantile(0.5);
    progress.p99_ns = interval.ValueAtQuantile(0.99);
    progress.errors = live_errors_.load(std::memory_order_relaxed);
    last = now;
    monitor_.on_progress(progress);
    lock.lock();
  }
}

void LoadRun::Execute() {
  const int connections = connections_;
  std::thread progress;
  if (monitor_.on_progress) {
    live_ = std::make_unique<LatencyHistogram>();
  }
  start_ = Clock::now();
  measure_begin_ = start_ + absl::ToChronoNanoseconds(options_.warmup);
  measure_end_ = options_.duration == absl::InfiniteDuration()
                     ? Clock::time_point::max()
                     : measure_begin_ + absl::ToChronoNanoseconds(options_.duration);
  if (live_ != nullptr) progress = std::thread([this] { ProgressLoop(); });

  std::vector<std::unique_ptr<UnarySlot>> slots;
  std::vector<std::unique_ptr<LoadStreamWorker>> workers;
  const bool open_loop = options_.rate > 0;
  if (options_.stream) {
    for (int c = 0; c < connections; ++c) {
      // Closed loop: the concurrency split as evenly as possible.
      const int window = open_loop ? 0
                                   : options_.concurrency / connections +
                                         (c < options_.concurrency % connections ? 1 : 0);
      workers.push_back(
          std::make_unique<LoadStreamWorker>(this, stub(c), options_.protocol, c, window));
    }
    {
      std::lock_guard<std::mutex> lock(done_mutex_);
      units_running_ = connections;
    }
    for (auto& worker : workers) worker->Start();
  }
  if (http()) {
    {
      std::lock_guard<std::mutex> lock(done_mutex_);
      units_running_ = connections;
    }
    http_loop_->Start(open_loop ? 0 : options_.concurrency);
  }
  if (open_loop) {
    RunOpenLoop(&workers);
  } else if (!options_.stream && !http()) {
    {
      std::lock_guard<std::mutex> lock(done_mutex_);
      units_running_ = options_.concurrency;
    }
    for (int i = 0; i < options_.concurrency; ++i) {
      slots.push_back(std::make_unique<UnarySlot>(this, i % connections));
    }
    for (auto& slot : slots) slot->SendNext();
  }
  WaitForUnits(&workers);
  if (http()) http_loop_->Join();
  {
    std::lock_guard<std::mutex> lock(done_mutex_);
    finished_ = true;
    done_cv_.notify_all();
  }
  if (progress.joinable()) progress.join();
}

LoadReport LoadRun::Report() const {
  LoadReport report;
  report.options = options_;
  report.mode = options_.rate > 0 ? "open" : "closed";
  report.offered_rate = options_.rate;
  LatencyHistogram latency;
  int64_t last_completion_ns = 0;
  int64_t timed = 0, batch_requests = 0, batch_rows = 0, queue_ns = 0, compute_ns = 0;
  int64_t kernel_ns = 0, dispatch_ns = 0;
  for (const ConnectionStats& stats : stats_) {
    latency.Merge(stats.latency);
    report.ok += stats.ok.load();
    for (int code = 0; code < kGrpcStatusCodes; ++code) {
      report.errors_by_code[code] += stats.errors[code].load();
    }
    report.rows += stats.rows.load();
    report.payload_bytes += stats.payload_bytes.load();
    report.warmup_requests += stats.warmup_requests.load();
    report.warmup_errors += stats.warmup_errors.load();
    report.verified += stats.verified.load();
    report.mismatches += stats.mismatches.load();
    timed += stats.timed.load();
    batch_requests += stats.batch_requests.load();
    batch_rows += stats.batch_rows.load();
    queue_ns += stats.queue_ns.load();
    compute_ns += stats.compute_ns.load();
    kernel_ns += stats.kernel_ns.load();
    dispatch_ns += stats.dispatch_ns.load();
    last_completion_ns = std::max(last_completion_ns, stats.last_completion_ns.load());
  }
  for (int64_t n : report.errors_by_code) report.errors += n;
  report.requests = report.ok + report.errors;
  {
    std::lock_guard<std::mutex> lock(mismatch_mutex_);
    report.first_mismatch = first_mismatch_;
    report.ended_early = ended_early_;
  }
  report.stream_reopens = stream_reopens_.load();
  report.resent_requests = resent_requests_.load();
  report.streams_lost = streams_lost_.load();
  report.resent_after_loss = resent_after_loss_.load();
  const int64_t measure_begin_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(measure_begin_ - start_).count();
  if (report.requests > 0 && last_completion_ns > measure_begin_ns) {
    report.elapsed_seconds = static_cast<double>(last_completion_ns - measure_begin_ns) / 1e9;
    report.requests_per_second = static_cast<double>(report.requests) / report.elapsed_seconds;
    report.rows_per_second = static_cast<double>(report.rows) / report.elapsed_seconds;
    report.payload_gb_per_second =
        static_cast<double>(report.payload_bytes) / report.elapsed_seconds / 1e9;
  }
  report.latency.count = latency.count();
  report.latency.min = latency.min();
  report.latency.p50 = latency.ValueAtQuantile(0.5);
  report.latency.p90 = latency.ValueAtQuantile(0.9);
  report.latency.p99 = latency.ValueAtQuantile(0.99);
  report.latency.p999 = latency.ValueAtQuantile(0.999);
  report.latency.max = latency.max();
  report.latency.mean = latency.mean();
  if (timed > 0) {
    report.mean_batch_requests = static_cast<double>(batch_requests) / timed;
    report.mean_batch_rows = static_cast<double>(batch_rows) / timed;
    report.mean_queue_us = static_cast<double>(queue_ns) / timed / 1e3;
    report.mean_compute_us = static_cast<double>(compute_ns) / timed / 1e3;
    report.mean_kernel_us = static_cast<double>(kernel_ns) / timed / 1e3;
    report.mean_dispatch_us = static_cast<double>(dispatch_ns) / timed / 1e3;
  }
  return report;
}

}  // namespace

absl::StatusOr<LoadReport> RunLoad(const LoadOptions& requested, const LoadMonitor& monitor) {
  absl::Status valid = ValidateLoadOptions(requested);
  if (!valid.ok()) return valid;
  if (monitor.on_progress && (monitor.progress_interval <= absl::ZeroDuration() ||
                              monitor.progress_interval == absl::InfiniteDuration())) {
    return absl::InvalidArgumentError("progress_interval must be finite and > 0");
  }
  LoadOptions options = requested;
  // A closed loop cannot keep more connections busy than it has requests.
  if (options.rate == 0) options.connections = std::min(options.connections, options.concurrency);
  std::string http_base_url;
  if (options.protocol == LoadProtocol::kHttp) {
    absl::StatusOr<std::string> base_url = ParseHttpTarget(options.target);
    if (!base_url.ok()) return base_url.status();
    http_base_url = *std::move(base_url);
  }
  std::vector<uint32_t> schedule;
  absl::StatusOr<std::vector<LoadPayload>> payloads =
      BuildLoadPayloads(options, http_base_url, &schedule);
  if (!payloads.ok()) return payloads.status();

  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  std::vector<std::unique_ptr<HttpConnection>> http;
  const auto connect_deadline =
      std::chrono::system_clock::now() + absl::ToChronoNanoseconds(options.connect_timeout);
  for (int c = 0; c < options.connections && options.protocol == LoadProtocol::kHttp; ++c) {
    HttpConnectionOptions http_options;
    http_options.base_url = http_base_url;
    http_options.timeout = options.timeout;
    http_options.connect_deadline = absl::FromChrono(connect_deadline);
    http_options.connect_timeout = options.connect_timeout;
    http_options.max_response_bytes = options.max_message_bytes;
    absl::StatusOr<std::unique_ptr<HttpConnection>> connection =
        HttpConnection::Open(http_options);
    if (!connection.ok()) return connection.status();
    http.push_back(*std::move(connection));
  }
  for (int c = 0; c < options.connections && options.protocol != LoadProtocol::kHttp; ++c) {
    std::shared_ptr<grpc::Channel> channel = CreateLoadChannel(options, c);
    if (!channel->WaitForConnected(connect_deadline)) {
      return absl::UnavailableError(absl::StrCat("could not connect to ", options.target,
                                                 " within ",
                                                 absl::FormatDuration(options.connect_timeout)));
    }
    stubs.push_back(std::make_unique<grpc::GenericStub>(channel));
  }
  LoadRun run(options, monitor, *std::move(payloads), std::move(schedule), std::move(stubs),
              std::move(http));
  run.Execute();
  return run.Report();
}

}  // namespace softmax::client
