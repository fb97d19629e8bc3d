#include "server/rpc/service.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <atomic>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/chunk_wire.h"
#include "server/logging/log.h"
#include "server/rpc/chunk_assembler.h"
#include "server/rpc/status_util.h"
#include "server/rpc/stream_reactor.h"
#include "server/rpc/wire.h"

namespace softmax::server {

void RecycleBuffers(TensorBufferPool* pool, v1::SoftmaxRequest* request,
                    v1::SoftmaxResponse* response) {
  if (request->has_input()) pool->Give(std::move(*request->mutable_input()->mutable_data()));
  if (response->has_output()) pool->Give(std::move(*response->mutable_output()->mutable_data()));
}

void LendLargeOutput(const std::shared_ptr<TensorBufferPool>& pool,
                     v1::SoftmaxResponse* response, OutputView* view) {
  if (view->data != nullptr || !response->has_output() ||
      response->output().data().size() < TensorBufferPool::kMinPooledBytes) {
    return;
  }
  *view = TensorBufferPool::LendAsView(pool, std::move(*response->mutable_output()->mutable_data()));
  response->mutable_output()->clear_data();
}

namespace {

using SteadyClock = std::chrono::steady_clock;

// Idle capacity the service keeps for large tensors (TensorBufferPool): the
// buffers of eight 64 MiB calls, twice what 4 callers of 64 MiB tensors hold
// (one each on the echo and the CUDA backend). With the pool, H200, 4 such
// callers: 6.5 GB/s of payload on the echo, 5.9 on CUDA; without, 1.3 / 1.6.
constexpr size_t kIdleTensorBufferBytes = size_t{512} << 20;

double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

void SetTiming(const RequestTiming& timing, v1::SoftmaxResponse* response) {
  v1::Timing* out = response->mutable_timing();
  out->set_queue_ns(timing.queue_ns);
  out->set_compute_ns(timing.compute_ns);
  out->set_batch_requests(timing.batch_requests);
  out->set_batch_rows(timing.batch_rows);
  out->set_kernel_ns(timing.kernel_ns);
  out->set_dispatch_ns(timing.dispatch_ns);
}

// Unary call: finished from whichever thread completes the request.
// Counts a unary call as a request in flight, from the reactor's
// construction to its deletion in OnDone.
class CallCounter {
 public:
  explicit CallCounter(SoftmaxServiceImpl* service) : service_(service) {
    service_->RequestsStarted(1);
  }
  ~CallCounter() { service_->RequestsEnded(1); }
  CallCounter(const CallCounter&) = delete;
  CallCounter& operator=(const CallCounter&) = delete;

 private:
  SoftmaxServiceImpl* const service_;
};

// The call owns its request and response messages; `response_buffer` is
// gRPC's, sent on an OK finish.
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  UnaryCall(SoftmaxServiceImpl* service, Metrics* metrics, grpc::ByteBuffer* response_buffer,
            grpc::CallbackServerContext* context)
      : counter_(service),
        buffers_(service->buffers()),
        metrics_(metrics),
        context_(context),
        response_buffer_(response_buffer),
        start_(SteadyClock::now()) {}

  v1::SoftmaxRequest& request() { return request_; }
  v1::SoftmaxResponse& response() { return response_; }
  OutputView& view() { return view_; }
  // The request's share of the memory budget, given back once it is sent.
  std::shared_ptr<const void>* held() { return &held_; }
  // The request's input data size (its output is as large), for the metrics.
  void set_data_bytes(int64_t bytes) { data_bytes_ = bytes; }

  void Complete(const absl::Status& status) {
    if (metrics_ != nullptr) {
      metrics_->RecordRequest(RpcMethod::kSoftmax, status.code(), SecondsSince(start_),
                              2 * data_bytes_);
    }
    logging::LogAccess("Softmax", status.code(), 2 * data_bytes_, SecondsSince(start_),
                       [this] { return context_->peer(); });
    absl::Status outcome = status;
    if (outcome.ok()) {
      LendLargeOutput(buffers_, &response_, &view_);
      outcome = SerializeResponse(&response_, std::move(view_), response_buffer_);
    }
    Finish(ToGrpcStatus(outcome));  // may delete this (OnDone) before returning
  }

  void OnDone() override {
    RecycleBuffers(buffers_.get(), &request_, &response_);
    delete this;
  }

 private:
  CallCounter counter_;
  const std::shared_ptr<TensorBufferPool> buffers_;
  Metrics* const metrics_;
  grpc::CallbackServerContext* const context_;  // valid until OnDone
  grpc::ByteBuffer* const response_buffer_;
  const SteadyClock::time_point start_;
  int64_t data_bytes_ = 0;
  v1::SoftmaxRequest request_;
  v1::SoftmaxResponse response_;
  OutputView view_;
  std::shared_ptr<const void> held_;
};

// SoftmaxStream's messages, for StreamReactor: a SoftmaxRequest in, a
// SoftmaxResponse out, errors in band (SoftmaxResponse.error). A chunked
// request (proto: chunk_offset, more_chunks) is assembled by a
// ChunkAssembler into its first chunk's entry, which is then dispatched as a
// whole request and answered in chunks; the entries of its later chunks get
// no message of their own.
class SoftmaxStreamHandler {
 public:
  struct Entry {
    explicit Entry(std::shared_ptr<TensorBufferPool> pool) : buffers(std::move(pool)) {}
    ~Entry() { RecycleBuffers(buffers.get(), &request, &response); }
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;

    const std::shared_ptr<TensorBufferPool> buffers;
    grpc::ByteBuffer incoming;  // the request as read
    v1::SoftmaxRequest request;
    v1::SoftmaxResponse response;
    OutputView view;            // the output, when the backend lent it
    grpc::ByteBuffer outgoing;  // the response as written (its first chunk)
    std::deque<grpc::ByteBuffer> more_outgoing;  // its later chunks, in order
    SteadyClock::time_point start;
    int64_t data_bytes = 0;  // the request's input bytes, as received
    std::shared_ptr<const void> held;  // its share of the memory budget
    // A chunked request's: the output's chunk size; 0 for one message.
    int64_t response_chunk_bytes = 0;
    bool absorbed = false;  // a chunk taken into another entry: no answer
  };

  SoftmaxStreamHandler(SoftmaxServiceImpl* service, grpc::CallbackServerContext* context)
      : service_(service),
        context_(context),
        assembler_(std::make_unique<ChunkAssembler<Started>>(
            service->limits(), service->budget(), service->buffers().get(),
            [service](int64_t bytes) { return service->AllocateStaging(bytes); })) {}

  std::unique_ptr<Entry> NewEntry() { return std::make_unique<Entry>(service_->buffers()); }

  void Start(Entry* entry, std::function<bool()> is_cancelled,
             std::function<void(const absl::Status&)> done) {
    entry->start = SteadyClock::now();
    Started started{entry, std::move(is_cancelled), std::move(done)};
    // A later chunk of a tensor being assembled is copied from the message
    // as it lies, without parsing it into entry->request first.
    if (assembler_->assembling() > 0) {
      ChunkView chunk;
      if (ReadLaterChunk(entry->incoming, kRequestChunkFields, &chunk)) {
        std::optional<ChunkAssembler<Started>::Step> step = assembler_->OfferLater(chunk);
        if (step.has_value()) {
          entry->data_bytes = chunk.data_bytes;
          chunk = ChunkView{};
          entry->incoming.Clear();
          Handle(std::move(started), *std::move(step));
          return;
        }
      }
    }
    const absl::Status parsed =
        ParseRequestMessage(&entry->incoming, service_->buffers().get(), &entry->request);
    // Read before Dispatch, which may move the input bytes into the output.
    entry->data_bytes = static_cast<int64_t>(entry->request.input().data().size());
    if (!parsed.ok()) {
      started.done(parsed);
      return;
    }
    // (Offer may keep `started`, moved out: a first chunk.)
    ChunkAssembler<Started>::Step step = assembler_->Offer(&entry->request, &started);
    Handle(std::move(started), std::move(step));
  }

  // The stream's reads ended: tensors still being assembled fail.
  void ReadsDone() {
    for (ChunkAssembler<Started>::Step& step : assembler_->End()) step.owner->done(step.error);
  }
  bool AtMessageBoundary() const { return assembler_->assembling() == 0; }

  // Serialises the finished response of `entry`; false for a chunk that
  // has no response of its own. Any thread.
  bool Answer(Entry& entry, const absl::Status& status) {
    if (entry.absorbed) return false;
    if (!status.ok()) {
      entry.view = OutputView{};
      SetError(entry, status);
    } else if (entry.response_chunk_bytes > 0) {
      if (absl::Status chunked = SerializeChunks(entry); chunked.ok()) {
        Record(entry, status);
        return true;
      } else {
        entry.view = OutputView{};
        entry.more_outgoing.clear();
        SetError(entry, chunked);
      }
    } else {
      LendLargeOutput(entry.buffers, &entry.response, &entry.view);
    }
    if (absl::Status serialized =
            SerializeResponse(&entry.response, std::move(entry.view), &entry.outgoing);
        !serialized.ok()) {
      SetError(entry, serialized);
      SerializeResponse(&entry.response, OutputView{}, &entry.outgoing).IgnoreError();
    }
    Record(entry, status);
    return true;
  }

  // Moves the next chunk of `entry`'s answer into `outgoing`; false when
  // every message of it has been handed out.
  bool NextOutgoing(Entry& entry) {
    if (entry.more_outgoing.empty()) return false;
    entry.outgoing.Swap(&entry.more_outgoing.front());
    entry.more_outgoing.pop_front();
    return true;
  }

 private:
  // A response chunk below this is raised to it: it bounds the messages one
  // tensor's answer takes (16,384 for 1 GiB), whatever the caller's chunks.
  static constexpr int64_t kMinResponseChunkBytes = int64_t{64} << 10;

  // A message read and started, as the assembler keeps a first chunk.
  struct Started {
    Entry* entry;  // owned by `done`'s completion
    std::function<bool()> is_cancelled;
    std::function<void(const absl::Status&)> done;
  };

  // Carries out what the assembler made of the message of `started`.
  void Handle(Started started, ChunkAssembler<Started>::Step step) {
    using Kind = ChunkAssembler<Started>::Kind;
    switch (step.kind) {
      case Kind::kWhole:
        Dispatch(std::move(started));
        return;
      case Kind::kStarted:
        return;  // kept by the assembler until its last chunk
      case Kind::kAppended:
      case Kind::kDropped:
        Absorb(std::move(started));
        return;
      case Kind::kComplete: {
        Absorb(std::move(started));
        Entry* whole = step.owner->entry;
        whole->response_chunk_bytes = std::max(step.largest_chunk, kMinResponseChunkBytes);
        whole->held = std::move(step.lease);
        if (step.staged.data != nullptr) {
          whole->data_bytes = step.staged.bytes;
          ExternalTensors staged;
          staged.input = step.staged.data;
          staged.input_bytes = step.staged.bytes;
          staged.input_staged = std::move(step.staged.owner);
          Dispatch(*std::move(step.owner), &staged);
        } else {
          whole->data_bytes = static_cast<int64_t>(whole->request.input().data().size());
          Dispatch(*std::move(step.owner));
        }
        return;
      }
      case Kind::kFailed:
        if (step.owner.has_value()) {
          Absorb(std::move(started));
          step.owner->done(step.error);
        } else {
          started.done(step.error);
        }
        return;
    }
  }

  void Dispatch(Started started, const ExternalTensors* external = nullptr) {
    Entry* entry = started.entry;
    const absl::Status status =
        service_->Dispatch(&entry->request, &entry->response, &entry->view,
                           context_->deadline(), std::move(started.is_cancelled), started.done,
                           external, &entry->held);
    if (!status.ok()) started.done(status);
  }

  // A chunk taken into another request's entry: its own entry ends unanswered.
  static void Absorb(Started started) {
    started.entry->absorbed = true;
    started.done(absl::OkStatus());
  }

  // Splits `entry`'s output into messages of response_chunk_bytes, each
  // referencing its part of the output (one buffer, lent by the backend or
  // moved out of the response) instead of copying it.
  static absl::Status SerializeChunks(Entry& entry) {
    OutputView whole = std::move(entry.view);
    if (whole.data == nullptr) {
      whole = TensorBufferPool::LendAsView(entry.buffers,
                                           std::move(*entry.response.mutable_output()->mutable_data()));
    }
    entry.response.mutable_output()->clear_data();
    const int64_t chunk = entry.response_chunk_bytes;
    int64_t offset = 0;
    do {
      const int64_t bytes = std::min(chunk, whole.bytes - offset);
      v1::SoftmaxResponse later;
      v1::SoftmaxResponse& message = offset == 0 ? entry.response : later;
      if (offset != 0) message.set_request_id(entry.response.request_id());
      message.set_chunk_offset(offset);
      message.set_more_chunks(offset + bytes < whole.bytes);
      OutputView part;
      if (bytes > 0) part = OutputView{whole.data + offset, bytes, whole.owner};
      grpc::ByteBuffer* out = &entry.outgoing;
      if (offset != 0) out = &entry.more_outgoing.emplace_back();
      if (absl::Status status = SerializeResponse(&message, std::move(part), out); !status.ok()) {
        return status;
      }
      offset += bytes;
    } while (offset < whole.bytes);
    return absl::OkStatus();
  }

  void Record(const Entry& entry, const absl::Status& status) {
    if (service_->metrics() != nullptr) {
      service_->metrics()->RecordRequest(RpcMethod::kSoftmaxStream, status.code(),
                                         SecondsSince(entry.start), 2 * entry.data_bytes);
    }
    logging::LogAccess("SoftmaxStream", status.code(), 2 * entry.data_bytes,
                       SecondsSince(entry.start), [this] { return context_->peer(); });
  }

  // The per-request error response for `status`.
  static void SetError(Entry& entry, const absl::Status& status) {
    v1::SoftmaxResponse& response = entry.response;
    response.clear_output();
    response.clear_timing();
    response.clear_chunk_offset();
    response.clear_more_chunks();
    // An invalid request_id is not echoed: clients could not parse it.
    const std::string& id = entry.request.request_id();
    if (id.size() <= kMaxRequestIdBytes && IsValidUtf8(id)) {
      response.set_request_id(id);
    } else {
      response.clear_request_id();
    }
    response.mutable_error()->set_code(static_cast<int>(status.code()));
    response.mutable_error()->set_message(std::string(status.message()));
  }

  SoftmaxServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  // Touched only by the stream's read path (Start, ReadsDone).
  std::unique_ptr<ChunkAssembler<Started>> assembler_;
};

}  // namespace

SoftmaxServiceImpl::SoftmaxServiceImpl(const ServiceOptions& options, Batcher* batcher,
                                       Metrics* metrics)
    : options_(options),
      batcher_(batcher),
      metrics_(metrics),
      buffers_(std::make_shared<TensorBufferPool>(kIdleTensorBufferBytes)) {}

absl::Status SoftmaxServiceImpl::Dispatch(v1::SoftmaxRequest* request,
                                          v1::SoftmaxResponse* response, OutputView* view,
                                          std::chrono::system_clock::time_point deadline,
                                          std::function<bool()> is_cancelled,
                                          std::function<void(const absl::Status&)> done,
                                          const ExternalTensors* external,
                                          std::shared_ptr<const void>* held) {
  if (draining_.load(std::memory_order_relaxed)) {
    return absl::UnavailableError("server is shutting down; retry on another replica");
  }
  const ExternalTensors none;
  const ExternalTensors& ext = external != nullptr ? *external : none;
  std::optional<absl::string_view> external_input;
  if (ext.input != nullptr) external_input = absl::string_view(ext.input, ext.input_bytes);
  absl::StatusOr<ParsedRequest> parsed = ParseRequest(*request, options_.limits, external_input);
  if (!parsed.ok()) return parsed.status();
  if (ext.output != nullptr && ext.output_bytes < parsed->bytes) {
    return absl::InvalidArgumentError(absl::StrCat("output.region: ", ext.output_bytes,
                                                   " bytes, smaller than the output's ",
                                                   parsed->bytes, " bytes"));
  }
  // The input and the output, each unless it is in a caller's region.
  std::shared_ptr<const void> lease;
  if (options_.budget != nullptr && (held == nullptr || *held == nullptr)) {
    const int64_t bytes =
        (ext.input != nullptr ? 0 : parsed->bytes) + (ext.output != nullptr ? 0 : parsed->bytes);
    lease = options_.budget->TryReserve(bytes);
    if (lease == nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "server memory budget spent: requests hold ", options_.budget->held(),
          " bytes and this one needs ", bytes, " more (--max_held_bytes=",
          options_.budget->limit(), "); retry with backoff"));
    }
    if (held != nullptr) {
      *held = lease;
      lease.reset();
    }
  }

  response->set_request_id(request->request_id());
  v1::Tensor* output = response->mutable_output();
  output->set_dtype(request->input().dtype());
  output->mutable_shape()->CopyFrom(request->input().shape());

  if (options_.echo || batcher_ == nullptr) {
    // (No GPU here, so no region is in device memory.)
    if (ext.output != nullptr) {
      std::memmove(ext.output, parsed->data.data(), static_cast<size_t>(parsed->bytes));
    } else if (ext.input != nullptr) {
      output->set_data(parsed->data.data(), parsed->data.size());
    } else {
      // Moved, not copied: the input is not read again (see the contract).
      output->mutable_data()->swap(*request->mutable_input()->mutable_data());
    }
    SetTiming(RequestTiming{}, response);
    done(absl::OkStatus());
    return absl::OkStatus();
  }

  auto item = std::make_unique<WorkItem>();
  item->segment.input = parsed->data.data();
  item->segment.bytes = parsed->bytes;
  item->segment.dtype = parsed->dtype;
  item->segment.shape = parsed->shape;
  item->segment.options = parsed->options;
  item->output = output->mutable_data();
  // A pooled input stays with the request until the call is done and goes
  // back to the pool, instead of being freed by the batcher once staged.
  std::string* input = request->mutable_input()->mutable_data();
  item->input_buffer = input->capacity() >= TensorBufferPool::kMinPooledBytes ? nullptr : input;
  item->output_view = view;
  if (ext.input != nullptr) {
    item->input_buffer = nullptr;
    item->segment.input_memory = ext.input_memory;
    item->segment.input_device = ext.input_device;
    item->segment.staged = ext.input_staged;
  }
  if (ext.output != nullptr) {
    item->fixed_output = ext.output;
    item->output_view = nullptr;
    item->segment.output_memory = ext.output_memory;
    item->segment.output_device = ext.output_device;
  }
  item->deadline = deadline;
  item->is_cancelled = std::move(is_cancelled);
  item->done = [response, metrics = metrics_, done = std::move(done),
                lease = std::move(lease)](const absl::Status& status,
                                          const RequestTiming& timing) {
    if (metrics != nullptr) metrics->RecordRequestTiming(timing);
    if (status.ok()) SetTiming(timing, response);
    done(status);
  };
  return batcher_->Enqueue(std::move(item));
}

grpc::ServerUnaryReactor* SoftmaxServiceImpl::Softmax(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  auto* call = new UnaryCall(this, metrics_, response, context);
  // gRPC hands the request as const, but the buffer is the call's (its
  // message holder's, destroyed after OnDone) and gRPC does not read it
  // again once this handler has it: parsing consumes it.
  // gRPC runs this handler even when the call ended (cancelled, reset or
  // past its deadline) before its message fully arrived; it then hands an
  // invalid buffer. That is no fault of the request's content: CANCELLED,
  // not INVALID_ARGUMENT, so the error figures do not blame the caller.
  absl::Status status =
      options_.authenticator != nullptr ? options_.authenticator->Check(*context)
                                        : absl::OkStatus();
  if (!request->Valid()) reset_guard_.RecordPrematureReset(context->peer());
  if (status.ok()) {
    status = !request->Valid()
          ? absl::CancelledError("the call ended before its request message arrived")
          : ParseRequestMessage(const_cast<grpc::ByteBuffer*>(request), buffers_.get(),
                                &call->request());
  }
  call->set_data_bytes(static_cast<int64_t>(call->request().input().data().size()));
  if (status.ok() && IsChunk(call->request())) {
    status = absl::InvalidArgumentError(
        "chunk_offset, more_chunks: chunked requests are for SoftmaxStream only");
  }
  if (status.ok()) {
    status = Dispatch(
        &call->request(), &call->response(), &call->view(), context->deadline(),
        [context] { return context->IsCancelled(); },
        [call](const absl::Status& outcome) { call->Complete(outcome); }, nullptr,
        call->held());
  }
  if (!status.ok()) {
    if (status.code() == absl::StatusCode::kUnavailable && draining() &&
        HoldRefusal([call, status] { call->Complete(status); })) {
      return call;
    }
    call->Complete(status);
  }
  return call;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
SoftmaxServiceImpl::SoftmaxStream(grpc::CallbackServerContext* context) {
  absl::Status refusal;
  if (options_.authenticator != nullptr) refusal = options_.authenticator->Check(*context);
  return new StreamReactor<SoftmaxStreamHandler>(this, context, options_.max_stream_pending,
                                                 refusal, SoftmaxStreamHandler(this, context));
}

}  // namespace softmax::server

namespace softmax::server {

void SoftmaxServiceImpl::RequestsStarted(int count) {
  requests_in_flight_.fetch_add(count, std::memory_order_relaxed);
}

void SoftmaxServiceImpl::RequestsEnded(int count) {
  requests_in_flight_.fetch_sub(count, std::memory_order_acq_rel);
}

int SoftmaxServiceImpl::requests_in_flight() {
  return requests_in_flight_.load(std::memory_order_acquire);
}

void SoftmaxServiceImpl::StartDraining() {
  std::vector<Drainable*> idle;
  {
    absl::MutexLock lock(&streams_mu_);
    draining_.store(true);
    for (Drainable* stream : streams_) {
      if (stream->BeginDrain()) idle.push_back(stream);
    }
  }
  // Outside streams_mu_: a finished stream's OnDone takes it. The streams
  // cannot be gone yet: only Finish leads to OnDone.
  for (Drainable* stream : idle) stream->FinishDrained();
}

bool SoftmaxServiceImpl::RegisterStream(Drainable* stream) {
  absl::MutexLock lock(&streams_mu_);
  if (draining_.load()) return false;
  streams_.insert(stream);
  return true;
}

void SoftmaxServiceImpl::UnregisterStream(Drainable* stream) {
  absl::MutexLock lock(&streams_mu_);
  streams_.erase(stream);
}

void SoftmaxServiceImpl::HoldRefusals() {
  absl::MutexLock lock(&streams_mu_);
  holding_ = true;
}

bool SoftmaxServiceImpl::HoldRefusal(std::function<void()> release) {
  absl::MutexLock lock(&streams_mu_);
  if (!holding_) return false;
  held_.push_back(std::move(release));
  return true;
}

void SoftmaxServiceImpl::ReleaseHeldCalls() {
  std::vector<std::function<void()>> held;
  {
    absl::MutexLock lock(&streams_mu_);
    holding_ = false;
    held.swap(held_);
  }
  for (std::function<void()>& release : held) release();
}

bool SoftmaxServiceImpl::WaitForRequestsInFlight(absl::Time deadline) {
  // Polled: it runs once, at shutdown, and keeps the count a lone atomic
  // that no request has to lock.
  constexpr absl::Duration kPoll = absl::Milliseconds(1);
  while (requests_in_flight() != 0) {
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    absl::SleepFor(std::min(kPoll, deadline - now));
  }
  return true;
}

}  // namespace softmax::server
