#include "client/load/stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/load/report.h"
#include "client/load/wire.h"
#include "common/chunk_wire.h"
#include "common/stream_end.h"

namespace softmax::client {

// One gRPC stream of a worker. It holds itself (`self`) from its start until
// OnDone, the last reaction gRPC runs, so the worker may drop it at any time;
// Cancel holds it as well while it cancels. OnDone lets it go before the
// worker may end (UnitDone): the run drops its channels once every worker
// ended, and a call that outlives its channel's completion queue aborts the
// process in gRPC 1.51 (1 run in 25 with reopens did, at exit).
class LoadStreamWorker::Attempt final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit Attempt(LoadStreamWorker* worker) : worker_(worker) {}

  void OnWriteDone(bool ok) override { worker_->OnWriteDone(ok); }
  void OnReadDone(bool ok) override {
    if (ok) {
      worker_->OnRead(&read_buffer, this);
    } else {
      // The stream is ending; OnDone follows.
      worker_->OnReadEnded(this);
    }
  }
  void OnDone(const grpc::Status& status) override {
    LoadStreamWorker* worker = worker_;
    const grpc::Status ended = status;  // `status` lives in the call
    const bool had_answer = answered;
    const bool by_server = context.GetServerTrailingMetadata().count(kStreamEndKey) > 0;
    self.reset();
    // The worker drops its own reference before it may end: nothing of this
    // object is touched from here on.
    worker->OnAttemptDone(ended, had_answer, by_server);
  }

  grpc::ClientContext context;
  grpc::ByteBuffer read_buffer;  // read path only
  bool answered = false;         // read path only: an answer matched a request
  std::shared_ptr<Attempt> self;

 private:
  LoadStreamWorker* const worker_;
};

LoadStreamWorker::LoadStreamWorker(LoadRunInterface* run, grpc::GenericStub* stub,
                                   LoadProtocol protocol, int connection, int window)
    : run_(run),
      stub_(stub),
      kserve_(protocol == LoadProtocol::kKserve),
      connection_(connection),
      window_(window) {}

LoadStreamWorker::~LoadStreamWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  reopen_wake_.notify_all();
  if (!reopener_.joinable()) return;
  // The run may drop the worker from the UnitDone that the reopener itself
  // called last; it touches nothing after that.
  if (reopener_.get_id() == std::this_thread::get_id()) {
    reopener_.detach();
  } else {
    reopener_.join();
  }
}

void LoadStreamWorker::Start() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    OpenLocked();
  }
  for (int i = 0; i < window_; ++i) SendNextClosedLoop();
}

void LoadStreamWorker::Send(const LoadPayload* payload, LoadClock::time_point intended,
                            bool measured) {
  run_->CallStarted();
  QueueOrFail(StreamRequest{payload, intended, measured});
}

void LoadStreamWorker::QueueOrFail(const StreamRequest& request) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!ended_) {
      ledger_.Queue(request);
      MaybeWriteLocked();
      return;
    }
  }
  // The worker ended for good (and stopped the run): only the open loop's
  // sender can still be here, on the run's own thread.
  run_->Complete(connection_, *request.payload, request.intended, request.measured,
                 static_cast<int>(grpc::StatusCode::UNAVAILABLE), nullptr);
  run_->CallFinished();
}

void LoadStreamWorker::Close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closing_ = true;
  MaybeWriteLocked();
}

void LoadStreamWorker::Cancel() {
  std::shared_ptr<Attempt> attempt;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled_ = true;
    attempt = attempt_;
  }
  // A reopen waiting for its time ends the worker instead.
  reopen_wake_.notify_all();
  // Outside the lock: it may run a reaction that takes it.
  if (attempt != nullptr) attempt->context.TryCancel();
}

void LoadStreamWorker::ReopenLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    reopen_wake_.wait(lock, [this] { return stopping_ || reopen_at_.has_value(); });
    if (stopping_) return;
    while (!stopping_ && !cancelled_ && LoadClock::now() < *reopen_at_) {
      reopen_wake_.wait_until(lock, *reopen_at_);
    }
    if (stopping_) return;
    reopen_at_.reset();
    if (!cancelled_ && !(closing_ && ledger_.empty())) {
      OpenLocked();
      const int64_t resent = reopen_resent_;
      const bool lost = reopen_lost_;
      lock.unlock();
      run_->StreamReopened(resent, lost);
      lock.lock();
      continue;
    }
    ended_ = true;
    std::vector<StreamRequest> left = ledger_.TakeAll();
    lock.unlock();
    // The last thing this thread does: the run may drop the worker at once.
    EndForGood(std::move(left), static_cast<int>(grpc::StatusCode::CANCELLED), "");
    return;
  }
}

void LoadStreamWorker::OpenLocked() {
  auto attempt = std::make_shared<Attempt>(this);
  attempt->self = attempt;
  attempt_ = attempt;
  writing_ = false;
  writes_done_ = false;
  broken_ = false;
  sending_ = nullptr;
  read_failure_.clear();
  stub_->PrepareBidiStreamingCall(&attempt->context,
                                  kserve_ ? kKserveStreamInferMethod : kSoftmaxStreamMethod,
                                  grpc::StubOptions(), attempt.get());
  attempt->StartRead(&attempt->read_buffer);
  MaybeWriteLocked();
  attempt->StartCall();
}

void LoadStreamWorker::OnReadEnded(Attempt* attempt) {
  // gRPC runs OnDone after it has destroyed the call's stream object, so no
  // write may start once the last read failed: a write started by the sender
  // thread between the two would run on a finished call and complete on
  // memory the call has freed (UBSan caught it: a CallbackWithSuccessTag on
  // an object with an invalid vptr). The read reaction holds the stream
  // alive until it returns, and writes start under mutex_, so every write
  // either started before this or sees broken_.
  std::lock_guard<std::mutex> lock(mutex_);
  if (attempt_.get() == attempt) broken_ = true;
}

void LoadStreamWorker::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mutex_);
  writing_ = false;
  if (!ok) {
    // The stream is broken; OnAttemptDone takes what is left.
    broken_ = true;
    return;
  }
  MaybeWriteLocked();
}

bool LoadStreamWorker::FindInFlight(uint64_t id, StreamRequest* request) {
  std::lock_guard<std::mutex> lock(mutex_);
  const StreamRequest* found = ledger_.Find(id);
  if (found == nullptr) return false;
  *request = *found;
  return true;
}

void LoadStreamWorker::OnRead(grpc::ByteBuffer* buffer, Attempt* attempt) {
  ChunkView chunk;
  if (!assembling_.empty() && ReadLaterChunk(*buffer, kResponseChunkFields, &chunk)) {
    // A later chunk of an answer being assembled: its data is appended
    // from the message as it lies, without parsing it first.
    uint64_t id = 0;
    auto it =
        absl::SimpleAtoi(chunk.request_id, &id) ? assembling_.find(id) : assembling_.end();
    StreamRequest call;
    if (it != assembling_.end() && FindInFlight(id, &call)) {
      const bool appended = AppendLaterChunk(chunk, it->second.get());
      const bool more = chunk.more_chunks;
      chunk = ChunkView{};  // its references to the buffer's slices
      buffer->Clear();
      if (!appended || !more) {
        attempt->answered = true;
        FinishAnswer(id, appended ? 0 : static_cast<int>(grpc::StatusCode::INTERNAL),
                     it->second.get());
      }
      ReadNext(attempt);
      return;
    }
  }
  const bool parsed = kserve_ ? ParseKserveStreamResponse(buffer, &kserve_read_, &read_)
                              : ParseResponseReusingBuffers(buffer, &read_);
  if (!parsed) {
    // As a typed stream would: the call ends, and so does the worker.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      read_failure_ = absl::StrCat("the stream on connection ", connection_,
                                   " answered a message that does not parse as ",
                                   kserve_ ? "a ModelStreamInferResponse with an output"
                                           : "a SoftmaxResponse");
      // No read follows this one: nothing may be written either
      // (OnReadEnded).
      broken_ = true;
    }
    attempt->context.TryCancel();
    return;
  }
  StreamRequest call;
  uint64_t id = 0;
  const bool found = absl::SimpleAtoi(read_.request_id(), &id) && FindInFlight(id, &call);
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
    attempt->answered = true;
    FinishAnswer(id, code, answer);
  }
  ReadNext(attempt);
}

void LoadStreamWorker::ReadNext(Attempt* attempt) {
  {
    // An answer may be what a half-close waited for (open loop, closing).
    std::lock_guard<std::mutex> lock(mutex_);
    MaybeWriteLocked();
  }
  attempt->StartRead(&attempt->read_buffer);
}

void LoadStreamWorker::FinishAnswer(uint64_t id, int code, const v1::SoftmaxResponse* answer) {
  StreamRequest call;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!ledger_.Answer(id, &call)) return;  // the read path found it just before
    unanswered_since_.reset();
    backoff_ = std::chrono::milliseconds(0);
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

void LoadStreamWorker::DropAssembling() {
  for (auto& [id, answer] : assembling_) spare_.push_back(std::move(answer));
  assembling_.clear();
}

void LoadStreamWorker::OnAttemptDone(const grpc::Status& status, bool answered,
                                     bool ended_by_server) {
  // Every reaction of the stream has run: the read path is free.
  DropAssembling();
  std::vector<StreamRequest> failed;
  int code = static_cast<int>(status.error_code());
  std::string why;
  bool reopen = false;
  int64_t reopen_now = -1;  // reopened from this reaction: the requests sent again
  // Lost by the transport (an UNAVAILABLE the server did not end the stream
  // with, common/stream_end.h): what it left unanswered may have been computed.
  const bool lost = !ended_by_server;
  std::shared_ptr<Attempt> ended_attempt;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ended_attempt = std::move(attempt_);
    writing_ = false;
    sending_ = nullptr;  // a chunked request half written goes again whole
    const bool nothing_left = closing_ && ledger_.empty();
    const auto now = LoadClock::now();
    if (nothing_left) {
      // Finished, or ended (age, drain) just as it had nothing more to do.
    } else if (cancelled_) {
      // The run gave up waiting for this stream; it counts what fails.
      if (status.ok()) code = static_cast<int>(grpc::StatusCode::CANCELLED);
    } else if (!read_failure_.empty()) {
      code = static_cast<int>(grpc::StatusCode::INTERNAL);
      why = read_failure_;
    } else if (status.ok()) {
      code = static_cast<int>(grpc::StatusCode::INTERNAL);
      why = absl::StrCat("the stream on connection ", connection_, " ended OK with ",
                         ledger_.in_flight(), " request(s) unanswered");
    } else if (status.error_code() != grpc::StatusCode::UNAVAILABLE) {
      why = absl::StrCat("the stream on connection ", connection_, " ended with ",
                         GrpcStatusCodeName(code), ": ", status.error_message());
    } else {
      // UNAVAILABLE: the server ended it (age, drain) or it was lost (reset,
      // replica gone). What it left unanswered goes on the next one.
      if (!answered && !ledger_.empty() && !unanswered_since_.has_value()) {
        unanswered_since_ = now;
      }
      if (unanswered_since_.has_value() && now - *unanswered_since_ > kStreamReopenPatience) {
        why = absl::StrCat("the stream on connection ", connection_, " got no answer for ",
                           kStreamReopenPatience.count(), " s of reopening: UNAVAILABLE: ",
                           status.error_message());
      } else {
        reopen = true;
      }
    }
    if (reopen) {
      const int64_t resent = ledger_.RequeueInFlight();
      const auto delay = backoff_;
      backoff_ = std::min<std::chrono::milliseconds>(
          kStreamReopenBackoffMax, std::max(kStreamReopenBackoffInitial, backoff_ * 2));
      if (delay.count() == 0) {
        // The first reopen after an answer: at once, from this reaction.
        OpenLocked();
        reopen_now = resent;
      } else {
        reopen_at_ = now + delay;
        reopen_resent_ = resent;
        reopen_lost_ = lost;
        if (!reopener_.joinable()) reopener_ = std::thread([this] { ReopenLoop(); });
        reopen_wake_.notify_all();
      }
    } else {
      ended_ = true;
      failed = ledger_.TakeAll();
    }
  }
  // The stream that ended goes (its call with it) before the worker may end.
  ended_attempt.reset();
  if (reopen) {
    if (reopen_now >= 0) run_->StreamReopened(reopen_now, lost);
    return;
  }
  EndForGood(std::move(failed), code, why);
}

void LoadStreamWorker::EndForGood(std::vector<StreamRequest> failed, int code,
                                  const std::string& why) {
  if (!why.empty()) run_->Abort(why);
  for (const StreamRequest& call : failed) {
    run_->Complete(connection_, *call.payload, call.intended, call.measured, code, nullptr);
    run_->CallFinished();
  }
  run_->UnitDone();
}

void LoadStreamWorker::SendNextClosedLoop() {
  const LoadClock::time_point now = LoadClock::now();
  bool measured = false;
  if (!run_->Admit(now, &measured)) {
    Close();
    return;
  }
  Send(run_->NextPayload(), now, measured);
}

std::unique_ptr<v1::SoftmaxResponse> LoadStreamWorker::TakeSpare() {
  if (spare_.empty()) return std::make_unique<v1::SoftmaxResponse>();
  std::unique_ptr<v1::SoftmaxResponse> response = std::move(spare_.back());
  spare_.pop_back();
  return response;
}

void LoadStreamWorker::MaybeWriteLocked() {
  if (attempt_ == nullptr || writing_ || writes_done_ || broken_) return;
  if (sending_ != nullptr) {
    // The next chunk of a request, before any other request's.
    write_ = sending_->chunks[next_chunk_]->WithRequestId(sending_id_);
    if (++next_chunk_ == sending_->chunks.size()) sending_ = nullptr;
    writing_ = true;
    attempt_->StartWrite(&write_);
    return;
  }
  if (ledger_.HasQueued()) {
    StreamRequest call;
    const uint64_t id = ledger_.TakeNext(&call);
    // The payload's bytes are shared by every stream (by reference); this
    // write adds its id and lives until OnWriteDone.
    const LoadPayload* payload = call.payload;
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
    writing_ = true;
    attempt_->StartWrite(&write_);
    return;
  }
  if (closing_ && ledger_.empty()) {
    writes_done_ = true;
    attempt_->StartWritesDone();
  }
}

}  // namespace softmax::client
