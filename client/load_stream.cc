#include "client/load_stream.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/load_wire.h"
#include "common/chunk_wire.h"

namespace softmax::client {

LoadStreamWorker::LoadStreamWorker(LoadRunInterface* run, grpc::GenericStub* stub, int connection,
                                   int window)
    : run_(run), stub_(stub), connection_(connection), window_(window) {}

void LoadStreamWorker::Start() {
  stub_->PrepareBidiStreamingCall(&context_, kSoftmaxStreamMethod, grpc::StubOptions(), this);
  StartRead(&read_buffer_);
  StartCall();
  for (int i = 0; i < window_; ++i) SendNextClosedLoop();
}

void LoadStreamWorker::Send(const LoadPayload* payload, LoadClock::time_point intended,
                            bool measured) {
  std::lock_guard<std::mutex> lock(mutex_);
  run_->CallStarted();
  pending_.push_back(InFlight{payload, intended, measured});
  MaybeWriteLocked();
}

void LoadStreamWorker::Close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closing_ = true;
  MaybeWriteLocked();
}

void LoadStreamWorker::Cancel() { context_.TryCancel(); }

void LoadStreamWorker::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mutex_);
  writing_ = false;
  if (!ok) {
    // The stream is broken; OnDone accounts what is left.
    broken_ = true;
    return;
  }
  MaybeWriteLocked();
}

void LoadStreamWorker::OnReadDone(bool ok) {
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

void LoadStreamWorker::OnDone(const grpc::Status& status) {
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

void LoadStreamWorker::FinishAnswer(uint64_t id, const InFlight& call, int code,
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

void LoadStreamWorker::ReadNext() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    MaybeWriteLocked();
  }
  StartRead(&read_buffer_);
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

}  // namespace softmax::client
