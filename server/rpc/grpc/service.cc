#include "server/rpc/grpc/service.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <atomic>
#include <chrono>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/chunk_wire.h"
#include "server/logging/log.h"
#include "server/metrics/metrics.h"
#include "server/rpc/grpc/authenticate.h"
#include "server/rpc/grpc/chunk_assembler.h"
#include "server/rpc/grpc/reset_guard.h"
#include "server/rpc/grpc/status_util.h"
#include "server/rpc/grpc/stream_reactor.h"
#include "server/rpc/grpc/wire.h"
#include "server/rpc/request_record.h"
#include "server/rpc/softmax_v1.h"

namespace softmax::server {

namespace {

// Unary call: finished from whichever thread completes the request, and
// counted as in flight (its ticket, Admission::Submit's) until OnDone.
// The call owns its request and response messages; `response_buffer` is
// gRPC's, sent on an OK finish.
class UnaryCall final : public grpc::ServerUnaryReactor {
 public:
  UnaryCall(const FrontEnd& front_end, grpc::ByteBuffer* response_buffer,
            grpc::CallbackServerContext* context)
      : buffers_(front_end.buffers),
        metrics_(front_end.metrics),
        context_(context),
        response_buffer_(response_buffer),
        record_(RpcMethod::kSoftmax) {}

  v1::SoftmaxRequest& request() { return request_; }
  v1::SoftmaxResponse& response() { return response_; }
  OutputView& view() { return view_; }
  TopKResult& top_k() { return top_k_; }
  // Its ticket and share of the memory budget, given back once it is sent.
  Admission::Admitted* admitted() { return &admitted_; }
  // The request's input data size (its output is as large), for the metrics.
  void set_data_bytes(int64_t bytes) { record_.data_bytes = bytes; }

  void Complete(const absl::Status& status, const RequestTiming& timing = RequestTiming{}) {
    if (status.ok()) FinishSoftmaxV1Response(timing, &top_k_, &response_);
    WriteRequestRecord(record_, status, {metrics_, nullptr},
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
  const std::shared_ptr<TensorBufferPool> buffers_;
  Metrics* const metrics_;
  grpc::CallbackServerContext* const context_;  // valid until OnDone
  grpc::ByteBuffer* const response_buffer_;
  RequestRecord record_;  // its start and input bytes
  v1::SoftmaxRequest request_;
  v1::SoftmaxResponse response_;
  OutputView view_;
  TopKResult top_k_;
  Admission::Admitted admitted_;
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
    TopKResult top_k;           // the top K, when asked for
    grpc::ByteBuffer outgoing;  // the response as written (its first chunk)
    std::deque<grpc::ByteBuffer> more_outgoing;  // its later chunks, in order
    // Its start and input bytes as received (a chunk's, until it is whole).
    RequestRecord record{RpcMethod::kSoftmaxStream};
    // In flight from its read until answered (StreamReactor): its ticket,
    // and its share of the memory budget (Submit's, or its chunks').
    Admission::Admitted admitted;
    // A chunked request's: the output's chunk size; 0 for one message.
    int64_t response_chunk_bytes = 0;
    bool absorbed = false;  // a chunk taken into another entry: no answer
  };

  SoftmaxStreamHandler(const FrontEnd& front_end, grpc::CallbackServerContext* context)
      : front_end_(front_end),
        context_(context),
        assembler_(std::make_unique<ChunkAssembler<Started>>(
            front_end.limits,
            [admission = front_end.admission](int64_t bytes) { return admission->Reserve(bytes); },
            front_end.buffers.get(),
            [admission = front_end.admission](int64_t bytes) {
              return admission->AllocateStaging(bytes);
            })) {}

  std::unique_ptr<Entry> NewEntry() { return std::make_unique<Entry>(front_end_.buffers); }

  void Start(Entry* entry, std::function<bool()> is_cancelled,
             std::function<void(const absl::Status&)> done) {
    entry->record.start = std::chrono::steady_clock::now();
    Started started{entry, std::move(is_cancelled), std::move(done)};
    // A later chunk of a tensor being assembled is copied from the message
    // as it lies, without parsing it into entry->request first.
    if (assembler_->assembling() > 0) {
      ChunkView chunk;
      if (ReadLaterChunk(entry->incoming, kRequestChunkFields, &chunk)) {
        std::optional<ChunkAssembler<Started>::Step> step = assembler_->OfferLater(chunk);
        if (step.has_value()) {
          entry->record.data_bytes = chunk.data_bytes;
          chunk = ChunkView{};
          entry->incoming.Clear();
          Handle(std::move(started), *std::move(step));
          return;
        }
      }
    }
    const absl::Status parsed =
        ParseRequestMessage(&entry->incoming, front_end_.buffers.get(), &entry->request);
    // Read before Dispatch, which may move the input bytes into the output.
    entry->record.data_bytes = static_cast<int64_t>(entry->request.input().data().size());
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
    } else if (entry.response_chunk_bytes > 0 && entry.response.has_output()) {
      // A top K without full_output is one message, however its input came.
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
        whole->admitted.budget = std::move(step.lease);
        if (step.staged.data != nullptr) {
          whole->record.data_bytes = step.staged.bytes;
          InputTensor staged;
          staged.data = step.staged.data;
          staged.bytes = step.staged.bytes;
          staged.external = true;  // its budget was reserved as it arrived
          staged.staged = std::move(step.staged.owner);
          Dispatch(*std::move(step.owner), &staged);
        } else {
          whole->record.data_bytes = static_cast<int64_t>(whole->request.input().data().size());
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

  // Submits the request of `started` (its input in `staged` when it was
  // assembled in a backend's staging).
  void Dispatch(Started started, InputTensor* staged = nullptr) {
    Entry* entry = started.entry;
    InferenceRequest request;
    if (absl::Status built = FromSoftmaxV1(&entry->request, &entry->response, &entry->view,
                                           &entry->top_k, &request);
        !built.ok()) {
      started.done(built);
      return;
    }
    if (staged != nullptr) request.input = std::move(*staged);
    request.deadline = context_->deadline();
    request.is_cancelled = std::move(started.is_cancelled);
    Responder responder;
    responder.done = [entry, done = std::move(started.done)](const absl::Status& status,
                                                             const RequestTiming& timing) {
      if (status.ok()) {
        FinishSoftmaxV1Response(timing, &entry->top_k, &entry->response);
      }
      done(status);
    };
    Submit(front_end_, std::move(request), kSoftmaxV1Fields, std::move(responder), &entry->admitted);
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
    WriteRequestRecord(entry.record, status, {front_end_.metrics, nullptr},
                       [this] { return context_->peer(); });
  }

  // The per-request error response for `status`.
  static void SetError(Entry& entry, const absl::Status& status) {
    v1::SoftmaxResponse& response = entry.response;
    response.clear_output();
    response.clear_top_k();
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

  const FrontEnd& front_end_;  // the service's, which outlives its streams
  grpc::CallbackServerContext* const context_;
  // Touched only by the stream's read path (Start, ReadsDone).
  std::unique_ptr<ChunkAssembler<Started>> assembler_;
};

}  // namespace

grpc::ServerUnaryReactor* SoftmaxServiceImpl::Softmax(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  auto* call = new UnaryCall(front_end_, response, context);
  // gRPC hands the request as const, but the buffer is the call's (its
  // message holder's, destroyed after OnDone) and gRPC does not read it
  // again once this handler has it: parsing consumes it.
  // gRPC runs this handler even when the call ended (cancelled, reset or
  // past its deadline) before its message fully arrived; it then hands an
  // invalid buffer. That is no fault of the request's content: CANCELLED,
  // not INVALID_ARGUMENT, so the error figures do not blame the caller.
  absl::Status status = Authenticate(front_end_.authenticator, *context);
  if (!request->Valid() && front_end_.reset_guard != nullptr) {
    front_end_.reset_guard->RecordPrematureReset(context->peer());
  }
  if (status.ok()) {
    status = !request->Valid()
          ? absl::CancelledError("the call ended before its request message arrived")
          : ParseRequestMessage(const_cast<grpc::ByteBuffer*>(request),
                                front_end_.buffers.get(), &call->request());
  }
  call->set_data_bytes(static_cast<int64_t>(call->request().input().data().size()));
  if (status.ok() && IsChunk(call->request())) {
    status = absl::InvalidArgumentError(
        "chunk_offset, more_chunks: chunked requests are for SoftmaxStream only");
  }
  InferenceRequest submitted;
  if (status.ok()) {
    status = FromSoftmaxV1(&call->request(), &call->response(), &call->view(), &call->top_k(),
                           &submitted);
  }
  if (!status.ok()) {
    call->Complete(status);
    return call;
  }
  submitted.deadline = context->deadline();
  submitted.is_cancelled = [context] { return context->IsCancelled(); };
  // A refusal while draining is held across Shutdown's GOAWAY, as every
  // gRPC unary call's (Admission::Submit, Responder::hold_refusals).
  Submit(front_end_, std::move(submitted), kSoftmaxV1Fields,
         Responder{[call](const absl::Status& outcome,
                          const RequestTiming& timing) { call->Complete(outcome, timing); },
                   /*hold_refusals=*/true},
         call->admitted());
  return call;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
SoftmaxServiceImpl::SoftmaxStream(grpc::CallbackServerContext* context) {
  return new StreamReactor<SoftmaxStreamHandler>(front_end_, context,
                                                 Authenticate(front_end_.authenticator, *context),
                                                 SoftmaxStreamHandler(front_end_, context));
}

}  // namespace softmax::server
