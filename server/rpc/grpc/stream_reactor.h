// StreamReactor: a bidirectional stream of independent requests, one
// response each, in the order they finish. It serves both protocols'
// streams (softmax.v1's SoftmaxStream, KServe's ModelStreamInfer); what a
// message is and how it is answered comes from a Handler.
//
// A handler may take a message into an earlier one (a chunk of a request
// sent in chunks: no answer of its own) and answer a request with several
// messages (its output in chunks), written back to back.
//
// Flow: each message read is started at once (the batcher batches it with
// other callers' requests) and the next read is posted, until
// `max_pending` responses are outstanding; then reading pauses until a
// write completes. Responses are serialised on the thread that finished
// them and written one at a time; while more wait behind one, it is written
// with gRPC's buffer hint, so that the responses that queued up during a
// write leave in one socket write (the last of them, without the hint,
// flushes them all).
//
// Lifetime: gRPC calls OnDone only after Finish, and Finish is called only
// once reads are done and no response is pending, so no completion can
// reach a deleted reactor. A client that goes away (cancel, failed write)
// stops the reading; what is still in flight completes and is dropped.
//
// Draining (Admission::StartDraining): the stream finishes with
// UNAVAILABLE once nothing of it is in flight, whether or not the client
// has finished writing; a message read after that is dropped unanswered.
//
// Rapid reset (FrontEnd::reset_guard): a stream cancelled before its first
// message is counted here, once, as the unary handlers count theirs: when
// its first read fails on a cancelled call (OnCancel alone comes through
// gRPC's executor, late: floods went on for 71-79k pairs), or when it was
// cancelled before the reactor existed. A server interceptor did it before
// and cost a stream 0.69x of its req/s on the H200 (an extra trip through
// gRPC's executor for every read and write).
//
// Age (FrontEnd::max_stream_age): the first message read once the
// stream is that old, at a message boundary (no chunked request half read),
// is its last; once it is answered the stream finishes with UNAVAILABLE,
// telling the client to reopen it (--max_stream_age_s, opt-in). Messages
// never read were not computed.
//
// Either end (age, drain) carries the trailer common/stream_end.h names:
// every message read was answered, none unread was computed.
//
// A Handler provides:
//   using Entry = ...;  // one message; has grpc::ByteBuffer incoming, outgoing
//                       // and Admission::Admitted admitted, whose ticket is
//                       // taken at its read (in flight until its answer is
//                       // written or dropped) and handed to Submit
//   std::unique_ptr<Entry> NewEntry();
//   // Starts `entry` (its message read into `incoming`): calls `done`
//   // exactly once with the outcome, possibly before it returns.
//   void Start(Entry* entry, std::function<bool()> is_cancelled,
//              std::function<void(const absl::Status&)> done);
//   // Writes the answer to `entry` for `status` into `outgoing` (in band
//   // for an error) and records it; false when the message has no answer of
//   // its own (a chunk taken into another message's request). Any thread.
//   bool Answer(Entry& entry, const absl::Status& status);
//   // After `outgoing` was written: refills it with the next message of the
//   // same answer and returns true, or returns false when there is none. An
//   // answer's messages are written back to back.
//   bool NextOutgoing(Entry& entry);
//   // No message will be read any more: calls `done` of every message the
//   // handler holds unanswered (chunked requests being assembled). Called
//   // once, on the read path, before the stream may finish.
//   void ReadsDone();
//   // True when no message is held half assembled (the stream may stop
//   // reading here without failing a request).
//   bool AtMessageBoundary() const;
#ifndef SOFTMAX_SERVER_RPC_GRPC_STREAM_REACTOR_H_
#define SOFTMAX_SERVER_RPC_GRPC_STREAM_REACTOR_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <utility>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/stream_end.h"
#include "server/rpc/front_end.h"
#include "server/rpc/grpc/status_util.h"
#include "server/scheduling/admission.h"

namespace softmax::server {

template <typename Handler>
class StreamReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                            public Admission::Stream {
 public:
  using Entry = typename Handler::Entry;

  // A stream refused at once (`refusal` not OK: unauthenticated) is
  // finished with that status without reading.
  StreamReactor(const FrontEnd& front_end, grpc::CallbackServerContext* context,
                const absl::Status& refusal, Handler handler)
      : admission_(front_end.admission),
        reset_guard_(front_end.reset_guard),
        context_(context),
        max_pending_(std::max(1, front_end.max_stream_pending)),
        handler_(std::move(handler)),
        end_of_life_(front_end.max_stream_age.count() > 0
                         ? std::chrono::steady_clock::now() + front_end.max_stream_age
                         : std::chrono::steady_clock::time_point::max()) {
    if (context_->IsCancelled()) CountPrematureReset();
    if (!refusal.ok()) {
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      Finish(ToGrpcStatus(refusal));
      return;
    }
    if (!admission_->RegisterStream(this)) {
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
        draining_ = true;
      }
      FinishStream();
      return;
    }
    registered_ = true;
    StartNextRead();
  }

  bool BeginDrain() override {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    return ShouldFinishLocked();
  }
  void FinishDrained() override { FinishStream(); }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      // Finished by a drain while this read was outstanding.
      if (finished_) return;
    }
    if (!ok) {
      if (!got_message_.load(std::memory_order_relaxed) && context_->IsCancelled()) {
        CountPrematureReset();
      }
      if (EndReads()) FinishStream();
      return;
    }
    got_message_.store(true, std::memory_order_relaxed);
    reading_->admitted.ticket = admission_->Enter();
    {
      absl::MutexLock lock(&mu_);
      ++pending_;
    }
    Entry* raw = reading_.release();  // owned by the completion from here on
    handler_.Start(
        raw,
        [this] { return cancelled_.load(std::memory_order_relaxed) || context_->IsCancelled(); },
        [this, raw](const absl::Status& outcome) { Complete(std::unique_ptr<Entry>(raw), outcome); });

    bool read_more = false;
    bool end_reads = false;
    const bool aged = std::chrono::steady_clock::now() >= end_of_life_ &&
                      handler_.AtMessageBoundary();
    {
      absl::MutexLock lock(&mu_);
      if (write_failed_ || cancelled_.load(std::memory_order_relaxed)) {
        // The client is gone. OnCancel / a failed OnWriteDone may have run
        // while Start did, before a pause existed for them to see: stop
        // reading here, or nothing would ever mark the reads done.
        end_reads = true;
      } else if (aged) {
        aged_out_ = true;
        end_reads = true;
      } else if (pending_ >= max_pending_) {
        read_paused_ = true;
      } else {
        read_more = true;
      }
    }
    if (read_more) StartNextRead();
    if (end_reads && EndReads()) FinishStream();
  }

  void OnWriteDone(bool ok) override {
    Entry* next = nullptr;
    grpc::WriteOptions options;
    bool resume_reading = false;
    bool end_reads = false;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (ok && handler_.NextOutgoing(*writing_)) {
        next = writing_.get();  // the same answer's next message
      }
    }
    if (next != nullptr) {
      StartWrite(&next->outgoing);
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      writing_.reset();
      --pending_;
      if (!ok) {
        // The client is gone; nothing more can be written.
        write_failed_ = true;
        pending_ -= static_cast<int>(write_queue_.size());
        write_queue_.clear();
      }
      next = NextWriteLocked(options);
      if (read_paused_ && !write_failed_ && pending_ < max_pending_) {
        read_paused_ = false;
        resume_reading = true;
      } else if (read_paused_ && write_failed_) {
        read_paused_ = false;
        end_reads = true;
      }
      finish = ShouldFinishLocked();
    }
    if (next != nullptr) StartWrite(&next->outgoing, options);
    if (resume_reading) StartNextRead();
    // Nothing is held unanswered when the stream could already finish.
    if (end_reads) finish = EndReads() || finish;
    if (finish) FinishStream();
  }

  void OnCancel() override {
    cancelled_.store(true, std::memory_order_relaxed);
    if (!got_message_.load(std::memory_order_relaxed)) CountPrematureReset();
    bool end_reads = false;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (read_paused_) {
        // No read is outstanding, so no OnReadDone(false) will come.
        read_paused_ = false;
        end_reads = true;
      }
      finish = ShouldFinishLocked();
    }
    if (end_reads) finish = EndReads() || finish;
    if (finish) FinishStream();
  }

  void OnDone() override {
    if (registered_) admission_->UnregisterStream(this);
    delete this;
  }

 private:
  // Counts this stream, once, as reset before its first message.
  void CountPrematureReset() {
    if (reset_guard_ != nullptr && !reset_counted_.exchange(true, std::memory_order_relaxed)) {
      reset_guard_->RecordPrematureReset(context_->peer());
    }
  }

  void StartNextRead() {
    reading_ = handler_.NewEntry();
    StartRead(&reading_->incoming);
  }

  // Reads are over for good (no read outstanding): the handler answers what
  // it holds, then the stream may finish. True when the caller must call
  // FinishStream.
  bool EndReads() {
    handler_.ReadsDone();
    absl::MutexLock lock(&mu_);
    reads_done_ = true;
    return ShouldFinishLocked();
  }

  // Answers `entry` and queues the answer for writing.
  void Complete(std::unique_ptr<Entry> entry, const absl::Status& status) {
    const bool answered = handler_.Answer(*entry, status);
    Entry* next = nullptr;
    grpc::WriteOptions options;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (write_failed_ || !answered) {
        --pending_;  // (the entry and its ticket go at the end of this call)
      } else {
        write_queue_.push_back(std::move(entry));
        next = NextWriteLocked(options);
      }
      finish = ShouldFinishLocked();
    }
    if (next != nullptr) StartWrite(&next->outgoing, options);
    if (finish) FinishStream();
  }

  // The next response to write, when no write is in flight. While others
  // wait behind it, `options` gets the buffer hint: gRPC then holds the
  // message (up to its write buffer, 64 KiB) and completes the write at
  // once, and the next unhinted one takes all of them to the socket. No
  // message is held for long: the last of the queue goes unhinted.
  Entry* NextWriteLocked(grpc::WriteOptions& options) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ != nullptr || write_queue_.empty() || write_failed_) return nullptr;
    writing_ = std::move(write_queue_.front());
    write_queue_.pop_front();
    if (!write_queue_.empty()) options.set_buffer_hint();
    return writing_.get();
  }

  bool ShouldFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || pending_ != 0 || (!reads_done_ && !draining_)) return false;
    finished_ = true;
    ended_by_drain_ = !reads_done_;
    return true;
  }

  // REQUIRES: ShouldFinishLocked returned true (once per stream).
  void FinishStream() {
    bool by_drain = false;
    bool aged_out = false;
    {
      absl::MutexLock lock(&mu_);
      by_drain = ended_by_drain_ || !reads_done_;
      aged_out = aged_out_;
    }
    if (cancelled_.load()) {
      Finish(grpc::Status::CANCELLED);
    } else if (aged_out) {
      context_->AddTrailingMetadata(kStreamEndKey, kStreamEndMaxAge);
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "stream reached the server's maximum age; reopen it (messages "
                          "without an answer were not read, nor computed)"));
    } else if (by_drain) {
      context_->AddTrailingMetadata(kStreamEndKey, kStreamEndDraining);
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "server is shutting down; retry on another replica"));
    } else {
      Finish(grpc::Status::OK);
    }
  }

  Admission* const admission_;
  PrematureResetGuard* const reset_guard_;  // may be null
  grpc::CallbackServerContext* const context_;
  const int max_pending_;
  Handler handler_;
  bool registered_ = false;  // with the admission, for draining
  // From then on the stream reads no more (see "Age" above); max(): never.
  const std::chrono::steady_clock::time_point end_of_life_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> got_message_{false};  // a message was read: no premature reset
  std::atomic<bool> reset_counted_{false};
  std::unique_ptr<Entry> reading_;  // touched only by whoever owns the next read

  absl::Mutex mu_;
  // Responses not yet written: in the batcher, queued, or being written;
  // each one's Entry holds its Admission ticket.
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::unique_ptr<Entry>> write_queue_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Entry> writing_ ABSL_GUARDED_BY(mu_);
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_by_drain_ ABSL_GUARDED_BY(mu_) = false;
  bool aged_out_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_GRPC_STREAM_REACTOR_H_
