#include "client/load_engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "client/latency_histogram.h"
#include "client/load_http.h"
#include "client/load_http_wire.h"
#include "client/load_wire.h"
#include "client/summary.h"
#include "client/tensor.h"
#include "kernels/cpu_softmax.h"
#include "kernels/dtype.h"
#include "softmax/v1/softmax.grpc.pb.h"

namespace softmax::client {
namespace {

using Clock = std::chrono::steady_clock;

// A status code outside 0..16 counts as UNKNOWN.
int ClampCode(int code) { return code >= 0 && code < kGrpcStatusCodes ? code : 2; }

// Random tensors larger than this are built once per shape, not
// payloads_per_shape times.
constexpr int64_t kLargePayloadBytes = int64_t{16} << 20;
// Entries in the precomputed payload schedule.
constexpr int kScheduleLength = 1000;

// One prebuilt request and what the checks and counters need to know about it.
// Payloads are immutable once built and shared by every call of the run.
struct Payload {
  // request_id left empty; the input's data is cleared once serialised into
  // `prepared` (gRPC) or `http`, which is what calls send.
  v1::SoftmaxRequest request;
  std::unique_ptr<const PreparedRequest> prepared;
  // With options.chunk_bytes: the request's chunks, sent instead of `prepared`.
  std::vector<std::unique_ptr<const PreparedRequest>> chunks;
  std::unique_ptr<const HttpPreparedRequest> http;
  SoftmaxShape view;           // [outer, n, inner] along the request's axis
  int64_t rows = 0;
  int64_t tensor_bytes = 0;    // input data bytes (the output has as many)
  std::vector<double> expected;  // ReferenceSoftmax of the input; with options.verify only
};

// Builds the payloads of every mix entry and fills `schedule` with indices
// into them, in the order requests send them. `http_base_url` is
// ParseHttpTarget's, with --protocol=http only. INVALID_ARGUMENT when an
// entry does not fit the axis or is too large to build.
absl::StatusOr<std::vector<Payload>> BuildPayloads(const LoadOptions& options,
                                                   const std::string& http_base_url,
                                                   std::vector<uint32_t>* schedule) {
  const std::vector<LoadShape>& shapes = options.shapes;
  std::vector<Payload> payloads;
  std::vector<std::pair<size_t, size_t>> ranges;  // per shape: [first payload, count)
  uint64_t seed = options.seed;
  for (const LoadShape& shape : shapes) {
    absl::StatusOr<SoftmaxShape> view = ShapeAlongAxis(shape.dims, options.axis);
    if (!view.ok()) return view.status();
    absl::StatusOr<int64_t> elements = ElementCount(shape.dims);
    if (!elements.ok()) return elements.status();
    const int64_t bytes = *elements * WireItemSize(shape.dtype);
    const int copies = bytes > kLargePayloadBytes ? 1 : std::max(1, options.payloads_per_shape);
    ranges.emplace_back(payloads.size(), copies);
    for (int c = 0; c < copies; ++c) {
      RandomTensorOptions random;
      random.shape = shape.dims;
      random.dtype = shape.dtype;
      random.seed = seed++;
      absl::StatusOr<v1::Tensor> tensor = MakeRandomTensor(random);
      if (!tensor.ok()) return tensor.status();
      Payload payload;
      *payload.request.mutable_input() = *std::move(tensor);
      if (options.axis != -1) payload.request.set_axis(options.axis);
      if (options.temperature != 1.0f) payload.request.set_temperature(options.temperature);
      payload.request.set_log(options.log);
      payload.view = *view;
      payload.rows = view->rows();
      payload.tensor_bytes = bytes;
      if (options.verify) {
        payload.expected.resize(static_cast<size_t>(*elements));
        SoftmaxOptions softmax_options;
        softmax_options.temperature = options.temperature;
        softmax_options.log = options.log;
        ReferenceSoftmax(payload.request.input().data().data(),
                         static_cast<DType>(shape.dtype), *view, softmax_options,
                         payload.expected.data());
      }
      switch (options.protocol) {
        case LoadProtocol::kSoftmaxV1:
          if (options.chunk_bytes > 0) {
            payload.chunks = PrepareChunks(payload.request, options.chunk_bytes);
          } else {
            payload.prepared = std::make_unique<const PreparedRequest>(payload.request);
          }
          break;
        case LoadProtocol::kKserve:
          payload.prepared = std::make_unique<const PreparedRequest>(
              KserveRequestOf(payload.request).SerializeAsString());
          break;
        case LoadProtocol::kHttp:
          payload.http = std::make_unique<const HttpPreparedRequest>(
              http_base_url, HttpInferRequestOf(payload.request));
          break;
      }
      std::string().swap(*payload.request.mutable_input()->mutable_data());
      payloads.push_back(std::move(payload));
    }
  }
  // Smooth weighted round-robin: each shape appears in proportion to its
  // weight, evenly interleaved; within a shape its copies are cycled.
  double total_weight = 0;
  for (const LoadShape& shape : shapes) total_weight += shape.weight;
  std::vector<double> credit(shapes.size(), 0.0);
  std::vector<size_t> uses(shapes.size(), 0);
  schedule->clear();
  for (int step = 0; step < kScheduleLength; ++step) {
    size_t best = 0;
    for (size_t s = 0; s < shapes.size(); ++s) {
      credit[s] += shapes[s].weight;
      if (credit[s] > credit[best]) best = s;
    }
    credit[best] -= total_weight;
    const auto [first, count] = ranges[best];
    schedule->push_back(static_cast<uint32_t>(first + uses[best]++ % count));
  }
  return payloads;
}

// Compares a response tensor with the payload's precomputed reference, using
// the same per-element rule and tolerances as the one-shot client's check.
// Returns an empty string when it matches, else what is wrong.
std::string CheckOutput(const Payload& payload, const v1::Tensor& output) {
  const v1::Tensor& input = payload.request.input();
  if (output.dtype() != input.dtype()) {
    return absl::StrCat("dtype ", WireDTypeName(output.dtype()), " instead of ",
                        WireDTypeName(input.dtype()));
  }
  if (ShapeOf(output) != ShapeOf(input)) {
    return absl::StrCat("shape ", FormatShape(ShapeOf(output)), " instead of ",
                        FormatShape(ShapeOf(input)));
  }
  if (static_cast<int64_t>(output.data().size()) != payload.tensor_bytes) {
    return absl::StrCat(output.data().size(), " data bytes instead of ", payload.tensor_bytes);
  }
  const DType dtype = static_cast<DType>(output.dtype());
  const int64_t elements = static_cast<int64_t>(payload.expected.size());
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < elements; ++i) {
    const double want = payload.expected[i];
    const double got = LoadAsFloat(output.data().data(), dtype, i);
    const bool ok = WithinReferenceTolerance(got, want, dtype);
    if (!ok && bad++ == 0) {
      first = absl::StrFormat("element %d is %.9g, reference %.9g", i, got, want);
    }
  }
  if (bad == 0) return "";
  return absl::StrCat(bad, " of ", elements, " elements out of tolerance; first: ", first);
}

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

class StreamWorker;

// State shared by every call of one run.
class LoadRun {
 public:
  // One of `stubs` (gRPC protocols) and `http` (kHttp) holds the connections.
  LoadRun(const LoadOptions& options, const LoadMonitor& monitor, std::vector<Payload> payloads,
          std::vector<uint32_t> schedule,
          std::vector<std::unique_ptr<grpc::GenericStub>> stubs,
          std::vector<std::unique_ptr<HttpConnection>> http)
      : options_(options),
        monitor_(monitor),
        payloads_(std::move(payloads)),
        schedule_(std::move(schedule)),
        stubs_(std::move(stubs)),
        http_(std::move(http)),
        connections_(static_cast<int>(std::max(stubs_.size(), http_.size()))),
        stats_(connections_) {}

  // Runs to completion; returns once every call has finished.
  void Execute();
  LoadReport Report() const;

  // Decides whether a request intended for `intended` is sent; sets
  // `*measured` when it belongs to the measured phase. Once it says no, it
  // says no to every later request.
  bool Admit(Clock::time_point intended, bool* measured) {
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

  const Payload* NextPayload() {
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

  // Accounts one finished request. `response` is set for OK answers only.
  void Complete(int connection, const Payload& payload, Clock::time_point intended,
                bool measured, int code, const v1::SoftmaxResponse* response) {
    const Clock::time_point now = Clock::now();
    ConnectionStats& stats = stats_[connection];
    code = ClampCode(code);
    if (code == 0 && options_.verify) {
      stats.verified.fetch_add(1, std::memory_order_relaxed);
      const std::string problem = CheckOutput(payload, response->output());
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
          payload.tensor_bytes + static_cast<int64_t>(response->output().data().size()),
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

  // A stream answered with a request_id it was never sent.
  void RecordUnmatched(const std::string& request_id) {
    stats_[0].mismatches.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mismatch_mutex_);
    if (first_mismatch_.empty()) {
      first_mismatch_ = absl::StrCat("stream response with unknown request_id \"", request_id, "\"");
    }
  }

  // A closed-loop slot, a stream or the open-loop sender has finished.
  void UnitDone() {
    std::lock_guard<std::mutex> lock(done_mutex_);
    --units_running_;
    done_cv_.notify_all();
  }

  // Open loop: a response message for a call, one a finished call gave
  // back when there is one (it keeps its output's buffer, see load_wire.h).
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

  // Requests sent (or queued on a stream) and not yet accounted.
  void CallStarted() { outstanding_.fetch_add(1, std::memory_order_relaxed); }
  // The decrement happens under done_mutex_: once the waiter sees zero it may
  // destroy this object, so nothing may touch it after the lock is released.
  void CallFinished() {
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

  void RunOpenLoop(std::vector<std::unique_ptr<StreamWorker>>* workers);
  void IssueOpenUnary(int connection, Clock::time_point intended, bool measured);

  // --protocol=http. Every request waits in one queue, oldest first, for the
  // next free connection; each connection's thread (HttpConnectionLoop)
  // takes one, sends it, waits for its answer, accounts it and takes the
  // next. Closed loop: each of the `concurrency` callers queues its next
  // request (intended now) when its last one is answered, so callers beyond
  // the connections wait in the queue and the wait counts in their latency.
  // Open loop: the sender queues requests at their intended times.
  bool http() const { return options_.protocol == LoadProtocol::kHttp; }
  void QueueHttp(const Payload* payload, Clock::time_point intended, bool measured);
  // Closed loop: a caller sends its next request, or stops for good.
  void NextHttpCallerRequest();
  void CloseHttpQueue();
  void HttpConnectionLoop(int connection);
  void WaitForUnits(std::vector<std::unique_ptr<StreamWorker>>* workers);
  void ProgressLoop();

  const LoadOptions options_;
  const LoadMonitor& monitor_;
  const std::vector<Payload> payloads_;
  const std::vector<uint32_t> schedule_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs_;
  std::vector<std::unique_ptr<HttpConnection>> http_;
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

  struct QueuedHttpRequest {
    const Payload* payload = nullptr;
    Clock::time_point intended;
    bool measured = false;
  };
  std::mutex http_mutex_;
  std::condition_variable http_cv_;
  std::deque<QueuedHttpRequest> http_queue_;  // GUARDED_BY(http_mutex_)
  bool http_queue_closed_ = false;            // GUARDED_BY(http_mutex_); nothing more comes
  int http_callers_ = 0;                      // GUARDED_BY(http_mutex_); closed loop, still sending
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
  const Payload* payload_ = nullptr;
  Clock::time_point intended_;
  bool measured_ = false;
};

// Open loop, unary: one heap object per call, deleted by its own callback.
struct UnaryCall {
  grpc::ClientContext context;
  grpc::ByteBuffer response_buffer;
  std::unique_ptr<v1::SoftmaxResponse> response;  // from LoadRun::TakeResponse
  inference::ModelInferResponse kserve_response;   // --protocol=kserve
  const Payload* payload = nullptr;
  Clock::time_point intended;
  bool measured = false;
  int connection = 0;
};

// One SoftmaxStream per connection. Requests queue for the single write
// outstanding at a time that gRPC allows; responses are matched to requests
// by request_id (they may arrive in any order). In the closed loop each
// response sends the next request on the same stream (`window` in flight);
// in the open loop the sender thread calls Send. The stream half-closes once
// it is told to close and nothing is pending or in flight.
class StreamWorker final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamWorker(LoadRun* run, int connection, int window)
      : run_(run), connection_(connection), window_(window) {}

  void Start() {
    run_->stub(connection_)->PrepareBidiStreamingCall(&context_, kSoftmaxStreamMethod,
                                                      grpc::StubOptions(), this);
    StartRead(&read_buffer_);
    StartCall();
    for (int i = 0; i < window_; ++i) SendNextClosedLoop();
  }

  void Send(const Payload* payload, Clock::time_point intended, bool measured) {
    std::lock_guard<std::mutex> lock(mutex_);
    run_->CallStarted();
    pending_.push_back(InFlight{payload, intended, measured});
    MaybeWriteLocked();
  }

  // No more requests will be sent; finish once the in-flight ones answered.
  void Close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
    MaybeWriteLocked();
  }

  void Cancel() { context_.TryCancel(); }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mutex_);
    writing_ = false;
    if (!ok) {
      // The stream is broken; OnDone accounts what is left.
      broken_ = true;
      return;
    }
    MaybeWriteLocked();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream is ending; OnDone follows
    ChunkView chunk;
    if (!assembling_.empty() && ReadLaterChunk(read_buffer_, kResponseChunkFields, &chunk)) {
      // A later chunk of an answer being assembled: its data is appended
      // from the message as it lies, without parsing it first.
      uint64_t id = 0;
      auto it =
          absl::SimpleAtoi(chunk.request_id, &id) ? assembling_.find(id) : assembling_.end();
      InFlight call;
      bool found = false;
      if (it != assembling_.end()) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto entry = in_flight_.find(id);
        if (entry != in_flight_.end()) {
          call = entry->second;
          found = true;
        }
      }
      if (found) {
        const bool appended = AppendLaterChunk(chunk, it->second.get());
        const bool more = chunk.more_chunks;
        chunk = ChunkView{};  // its references to the buffer's slices
        read_buffer_.Clear();
        if (!appended || !more) {
          FinishAnswer(id, call, appended ? 0 : static_cast<int>(grpc::StatusCode::INTERNAL),
                       it->second.get());
        }
        ReadNext();
        return;
      }
    }
    if (!ParseResponseReusingBuffers(&read_buffer_, &read_)) {
      // As a typed stream would: the call ends, and OnDone fails whatever
      // is in flight.
      context_.TryCancel();
      return;
    }
    InFlight call;
    bool found = false;
    uint64_t id = 0;
    if (absl::SimpleAtoi(read_.request_id(), &id)) {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = in_flight_.find(id);
      if (it != in_flight_.end()) {
        call = it->second;
        found = true;
      }
    }
    const v1::SoftmaxResponse* answer = &read_;
    int code = read_.has_error() ? read_.error().code() : 0;
    bool whole = true;
    if (found && code == 0 && !call.payload->chunks.empty()) {
      // A chunk of the answer: appended until the last one arrives.
      std::unique_ptr<v1::SoftmaxResponse>& assembled = assembling_[id];
      if (assembled == nullptr) assembled = TakeSpare();
      if (!AppendResponseChunk(&read_, call.payload->tensor_bytes, assembled.get())) {
        code = static_cast<int>(grpc::StatusCode::INTERNAL);
      } else {
        whole = !read_.more_chunks();
      }
      answer = assembled.get();
    }
    if (!found) {
      run_->RecordUnmatched(read_.request_id());
    } else if (whole) {
      FinishAnswer(id, call, code, answer);
    }
    ReadNext();
  }

  void OnDone(const grpc::Status& status) override {
    // Whatever was never answered failed with the stream's status.
    const int code = status.ok() ? static_cast<int>(grpc::StatusCode::INTERNAL)
                                 : static_cast<int>(status.error_code());
    std::vector<InFlight> lost;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& entry : in_flight_) lost.push_back(entry.second);
      lost.insert(lost.end(), pending_.begin(), pending_.end());
      in_flight_.clear();
      pending_.clear();
    }
    for (const InFlight& call : lost) {
      run_->Complete(connection_, *call.payload, call.intended, call.measured, code, nullptr);
      run_->CallFinished();
    }
    run_->UnitDone();
  }

 private:
  struct InFlight {
    const Payload* payload = nullptr;
    Clock::time_point intended;
    bool measured = false;
  };

  // The answer to `id` is complete, or failed with `code`: accounted, and
  // the next request goes out.
  void FinishAnswer(uint64_t id, const InFlight& call, int code,
                    const v1::SoftmaxResponse* answer) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_flight_.erase(id);
    }
    run_->Complete(connection_, *call.payload, call.intended, call.measured, code,
                   code == 0 ? answer : nullptr);
    if (auto it = assembling_.find(id); it != assembling_.end()) {
      spare_.push_back(std::move(it->second));
      assembling_.erase(it);
    }
    run_->CallFinished();
    if (window_ > 0) SendNextClosedLoop();
  }

  void ReadNext() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      MaybeWriteLocked();
    }
    StartRead(&read_buffer_);
  }

  void SendNextClosedLoop() {
    const Clock::time_point now = Clock::now();
    bool measured = false;
    if (!run_->Admit(now, &measured)) {
      Close();
      return;
    }
    Send(run_->NextPayload(), now, measured);
  }

  // A response message that keeps its output's buffer (read path only).
  std::unique_ptr<v1::SoftmaxResponse> TakeSpare() {
    if (spare_.empty()) return std::make_unique<v1::SoftmaxResponse>();
    std::unique_ptr<v1::SoftmaxResponse> response = std::move(spare_.back());
    spare_.pop_back();
    return response;
  }

  // REQUIRES: mutex_ held.
  void MaybeWriteLocked() {
    if (writing_ || writes_done_ || broken_) return;
    if (sending_ != nullptr) {
      // The next chunk of a request, before any other request's.
      write_ = sending_->chunks[next_chunk_]->WithRequestId(sending_id_);
      if (++next_chunk_ == sending_->chunks.size()) sending_ = nullptr;
      writing_ = true;
      StartWrite(&write_);
      return;
    }
    if (!pending_.empty()) {
      const InFlight call = pending_.front();
      pending_.pop_front();
      const uint64_t id = next_id_++;
      // The payload's bytes are shared by every stream (by reference); this
      // write adds its request_id and lives until OnWriteDone.
      const Payload* payload = call.payload;
      if (payload->chunks.empty()) {
        write_ = payload->prepared->WithRequestId(absl::StrCat(id));
      } else {
        sending_id_ = absl::StrCat(id);
        write_ = payload->chunks[0]->WithRequestId(sending_id_);
        if (payload->chunks.size() > 1) {
          sending_ = payload;
          next_chunk_ = 1;
        }
      }
      in_flight_.emplace(id, call);
      writing_ = true;
      StartWrite(&write_);
      return;
    }
    if (closing_ && in_flight_.empty()) {
      writes_done_ = true;
      StartWritesDone();
    }
  }

  LoadRun* const run_;
  const int connection_;
  const int window_;  // closed loop: requests in flight; 0 in the open loop
  grpc::ClientContext context_;
  grpc::ByteBuffer read_buffer_;
  v1::SoftmaxResponse read_;    // reused: keeps its output's buffer
  grpc::ByteBuffer write_;      // GUARDED_BY(mutex_) while writing_
  // --chunk_bytes: answers being reassembled by request id, and finished
  // ones kept for their buffers. Touched by the read path only.
  std::unordered_map<uint64_t, std::unique_ptr<v1::SoftmaxResponse>> assembling_;
  std::vector<std::unique_ptr<v1::SoftmaxResponse>> spare_;

  std::mutex mutex_;
  std::deque<InFlight> pending_;                     // GUARDED_BY(mutex_)
  std::unordered_map<uint64_t, InFlight> in_flight_;  // GUARDED_BY(mutex_)
  uint64_t next_id_ = 0;                             // GUARDED_BY(mutex_)
  // A chunked request whose later chunks are still to be written.
  const Payload* sending_ = nullptr;                 // GUARDED_BY(mutex_)
  size_t next_chunk_ = 0;                            // GUARDED_BY(mutex_)
  std::string sending_id_;                           // GUARDED_BY(mutex_)
  bool writing_ = false;                             // GUARDED_BY(mutex_)
  bool closing_ = false;                             // GUARDED_BY(mutex_)
  bool writes_done_ = false;                         // GUARDED_BY(mutex_)
  bool broken_ = false;                              // GUARDED_BY(mutex_)
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

void LoadRun::QueueHttp(const Payload* payload, Clock::time_point intended, bool measured) {
  CallStarted();
  {
    std::lock_guard<std::mutex> lock(http_mutex_);
    http_queue_.push_back(QueuedHttpRequest{payload, intended, measured});
  }
  http_cv_.notify_one();
}

void LoadRun::NextHttpCallerRequest() {
  const Clock::time_point now = Clock::now();
  bool measured = false;
  if (Admit(now, &measured)) {
    QueueHttp(NextPayload(), now, measured);
    return;
  }
  std::lock_guard<std::mutex> lock(http_mutex_);
  if (--http_callers_ == 0) {
    http_queue_closed_ = true;
    http_cv_.notify_all();
  }
}

void LoadRun::CloseHttpQueue() {
  std::lock_guard<std::mutex> lock(http_mutex_);
  http_queue_closed_ = true;
  http_cv_.notify_all();
}

void LoadRun::HttpConnectionLoop(int connection) {
  v1::SoftmaxResponse response;  // reused: keeps its output's buffer
  std::string error;
  const bool closed_loop = options_.rate == 0;
  while (true) {
    QueuedHttpRequest request;
    {
      std::unique_lock<std::mutex> lock(http_mutex_);
      http_cv_.wait(lock, [this] { return !http_queue_.empty() || http_queue_closed_; });
      if (http_queue_.empty()) break;
      request = http_queue_.front();
      http_queue_.pop_front();
    }
    const int code = http_[connection]->Post(*request.payload->http, &response, &error);
    Complete(connection, *request.payload, request.intended, request.measured, code,
             code == 0 ? &response : nullptr);
    // The caller's next request is queued before this one is counted out, so
    // the count of outstanding requests reaches zero only at the end.
    if (closed_loop) NextHttpCallerRequest();
    CallFinished();
  }
  UnitDone();
}

void LoadRun::RunOpenLoop(std::vector<std::unique_ptr<StreamWorker>>* workers) {
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
      QueueHttp(NextPayload(), intended, measured);
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
  if (http()) CloseHttpQueue();
}

void LoadRun::WaitForUnits(std::vector<std::unique_ptr<StreamWorker>>* workers) {
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
  std::vector<std::unique_ptr<StreamWorker>> workers;
  const bool open_loop = options_.rate > 0;
  if (options_.stream) {
    for (int c = 0; c < connections; ++c) {
      // Closed loop: the concurrency split as evenly as possible.
      const int window = open_loop ? 0
                                   : options_.concurrency / connections +
                                         (c < options_.concurrency % connections ? 1 : 0);
      workers.push_back(std::make_unique<StreamWorker>(this, c, window));
    }
    {
      std::lock_guard<std::mutex> lock(done_mutex_);
      units_running_ = connections;
    }
    for (auto& worker : workers) worker->Start();
  }
  std::vector<std::thread> http_threads;
  if (http()) {
    {
      std::lock_guard<std::mutex> lock(done_mutex_);
      units_running_ = connections;
    }
    for (int c = 0; c < connections; ++c) {
      http_threads.emplace_back([this, c] { HttpConnectionLoop(c); });
    }
    if (!open_loop) {
      {
        std::lock_guard<std::mutex> lock(http_mutex_);
        http_callers_ = options_.concurrency;
      }
      for (int i = 0; i < options_.concurrency; ++i) NextHttpCallerRequest();
    }
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
  for (std::thread& thread : http_threads) thread.join();
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
  }
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
  absl::StatusOr<std::vector<Payload>> payloads =
      BuildPayloads(options, http_base_url, &schedule);
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
