// The dynamic batcher: admits validated requests into a bounded queue, forms
// batches that mix dtypes, row lengths, ops and temperatures, and answers
// their requests. Which thread computes a batch is the scheduler's decision
// (scheduler.h, which also tells a batch's whole route).
//
// Formation rules (BatcherOptions): a batch is ready when the queue holds
// max_batch_rows rows or max_batch_bytes bytes, when its oldest request has
// waited max_queue_delay, or (dispatch_when_idle) at once when no batch is
// in flight; it takes requests in arrival order while they fit. So an idle
// server answers a lone request without waiting for company, and a busy one
// lets requests gather while the device works. A request larger than a batch
// on its own runs alone. Requests whose RPC was cancelled, or whose deadline
// passed, are dropped before compute and completed with CANCELLED /
// DEADLINE_EXCEEDED.
//
// Thread-safety: Enqueue may be called from any thread (gRPC reactors); it
// never blocks on compute. TakeBatch and Complete are called by the
// scheduler's slot threads. With a max_queue_delay, one timer thread tells
// the scheduler when the oldest request's delay has passed.
#ifndef SOFTMAX_SERVER_SCHEDULING_BATCHER_H_
#define SOFTMAX_SERVER_SCHEDULING_BATCHER_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/scheduling/backend.h"
#include "server/scheduling/inference_request.h"
#include "server/scheduling/scheduler.h"

namespace softmax::server {

// Defaults are softmax-server's. max_batch_rows, max_batch_bytes,
// max_queue_delay and max_queued_requests follow its flags; max_queued_bytes
// is half of its --max_held_bytes; dispatch_when_idle is always on there.
struct BatcherOptions {
  // A batch closes at this many rows (summed over its requests). Larger
  // batches amortise launch and transfer overheads; smaller ones cut latency.
  int64_t max_batch_rows = 8192;
  // A batch closes at this many input bytes. Bounds staging memory per batch.
  int64_t max_batch_bytes = int64_t{64} << 20;
  // Longest time the oldest queued request waits for company before its batch
  // is formed anyway. 0 forms a batch as soon as the backend can take one
  // (requests then gather only while every stream is busy).
  std::chrono::microseconds max_queue_delay{0};
  // Form a batch as soon as a request is queued while the backend has no
  // batch in flight, instead of waiting max_queue_delay for company: nothing
  // is gained by waiting on an idle device. While a batch is in flight,
  // requests gather until it completes, the delay passes or the batch is full.
  // Off, every request waits for the delay or a full batch: tests use that to
  // hold requests in the queue (SOFTMAX_TEST_NO_IDLE_DISPATCH for the server).
  bool dispatch_when_idle = true;
  // Admission bounds: beyond these the request is refused with UNAVAILABLE
  // (retryable) instead of queueing without limit.
  int64_t max_queued_requests = 8192;
  int64_t max_queued_bytes = int64_t{4} << 30;
  // Threads that answer the requests of large batches. Answering a request
  // serialises and sends its output; for a batch of many megabytes that
  // takes longer than the compute, so batches of offload_completion_bytes
  // or more are answered here, in parallel, and the slot's thread (and the
  // batch's place in flight) is free for the next batch at once. Smaller
  // batches are answered on the slot's thread, with no hand-off. 0 answers
  // every batch on the slot's thread. Four threads and 1 MiB: 64 x 32000
  // bfloat16 at 16 / 64 / 256 callers went from 730 / 646 / 642 to
  // 976 / 924 / 886 requests/s on the H200 host; 16 threads were no faster.
  // Bytes answered: whole outputs plus top Ks (a top K alone is small).
  int completion_threads = 4;
  int64_t offload_completion_bytes = int64_t{1} << 20;
  // Batches of at least this many requests are answered by the completion
  // threads too, whatever their bytes: each answer queues a gRPC write
  // (several microseconds of the answering thread), so a batch of a hundred
  // small requests would otherwise hold the slot's thread for far longer
  // than the GPU needed for it (streamed 1 x 1024 float32 at 256 callers:
  // 163,444 requests/s against 136,427 without). 0 = by bytes only.
  int offload_completion_requests = 32;
};

// One request as the batcher sees it, private to the scheduling layer:
// Admission makes one of each admitted InferenceRequest (front-ends never
// see it). The creator fills every field but `enqueued`; everything
// pointed to must stay valid until `done` has run.
struct WorkItem {
  Segment segment;               // segment.output is set by the batcher
  std::string* output = nullptr; // resized to segment.bytes before compute
  // Optional: the string segment.input points into, which the batcher may
  // move into `output` (Backend::ComputesInPlace); it is empty afterwards. Only used when it holds exactly segment.bytes bytes starting
  // at segment.input. Freed (left empty) when the backend stages the input
  // (Backend::StageInput) as the request is admitted.
  std::string* input_buffer = nullptr;
  // Optional: where a backend's OutputView of this request's output goes
  // (BatchResult::output_views). When set before `done` runs with OK, the
  // output is there and `*output` holds nothing of it. Null: the output is
  // always written into `*output`.
  OutputView* output_view = nullptr;
  // Required with segment.top_k: where the backend's top K goes; the
  // batcher sizes its values and indices before compute (its dims are the
  // creator's). With !segment.full_output, `*output`, `output_view` and
  // `fixed_output` are left untouched.
  TopKResult* top_k = nullptr;
  // Optional: where the output goes (a shared-memory region of at least
  // segment.bytes) instead of `*output`, which is then left untouched.
  void* fixed_output = nullptr;
  // Past this point the request is dropped before compute.
  std::chrono::system_clock::time_point deadline =
      std::chrono::system_clock::time_point::max();
  // Polled (from a slot's thread) just before compute; may be empty.
  std::function<bool()> is_cancelled;
  // Called exactly once, never while a batcher lock is held, on a slot's or
  // a completion thread (never inside Enqueue). OK means `*output` holds the
  // result.
  std::function<void(const absl::Status&, const RequestTiming&)> done;
  // Optional: what the request holds while it lives (its share of the
  // memory budget, Admission), given back when the item is destroyed, after
  // `done` has run.
  std::shared_ptr<const void> lease;

  std::chrono::steady_clock::time_point enqueued;  // set by Enqueue
  int64_t queue_ns = 0;  // set by the batcher when its batch is submitted
};

// Per-batch figures for metrics.
struct BatchStats {
  int backend = 0;  // index into the scheduler's backends
  int requests = 0;
  int64_t rows = 0;
  int64_t bytes = 0;
  int64_t compute_ns = 0;
  int64_t kernel_ns = 0;     // see BatchResult
  int64_t kernel_bytes = 0;  // bytes read + written by the kernels
  int launches = 0;
  bool ok = true;
};

// Receives batcher events (metrics). Methods may be called from any thread
// and must be cheap.
class BatcherObserver {
 public:
  virtual ~BatcherObserver() = default;
  virtual void OnBatchCompleted(const BatchStats& stats) {}
  // A queued request dropped before compute (CANCELLED or DEADLINE_EXCEEDED).
  virtual void OnRequestDropped(absl::StatusCode code) {}
  // A request refused at admission because the queue was full.
  virtual void OnRequestRejected() {}
  // Called with the batcher's lock held: must not call back into the batcher.
  virtual void OnQueueDepth(int64_t requests, int64_t bytes) {}
};

class Batcher final : public BatchSource {
 public:
  // `scheduler` and `observer` (may be null) must outlive the batcher.
  // Starts the scheduler's slot threads on this batcher (Scheduler::Start).
  Batcher(const BatcherOptions& options, Scheduler* scheduler,
          BatcherObserver* observer = nullptr);
  // Stops (see Stop).
  ~Batcher() override;

  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Admits `item`. OK: `item->done` will be called exactly once, later, from
  // another thread, and `item` is moved from. UNAVAILABLE when the queue is
  // full or the batcher is stopping: `item` stays the caller's, `done` is
  // not called, and the caller reports the returned status.
  absl::Status Enqueue(std::unique_ptr<WorkItem>&& item);

  // Memory of one of the backends for an input that its caller writes
  // there as it arrives (Backend::AllocateStaging); empty when none has it.
  // Any thread.
  StagingBuffer AllocateStaging(int64_t bytes) { return scheduler_->AllocateStaging(bytes); }

  // Refuses new requests, computes everything already queued without waiting
  // for the delay, waits until every request is answered, then stops the
  // scheduler's threads. Idempotent.
  void Stop();

  const BatcherOptions& options() const { return options_; }

  // BatchSource, for the scheduler's slot threads.
  std::unique_ptr<Batch> TakeBatch() override;
  void Complete(std::unique_ptr<Batch> batch, BatchResult result, int backend) override;

 private:
  using Dropped = std::pair<std::unique_ptr<WorkItem>, absl::Status>;

  // The delay timer: tells the scheduler when the oldest request's
  // max_queue_delay has passed (only with a delay).
  void TimerLoop();
  // Moves the next batch off the queue (arrival order, while requests fit;
  // cancelled and expired ones go to `dropped`) and counts it in flight.
  // Null when nothing live was queued.
  std::unique_ptr<Batch> TakeBatchLocked(std::vector<Dropped>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when a batch should be formed now.
  bool ReadyLocked(std::chrono::steady_clock::time_point now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when a batch is ready and a free slot has no wake-up on its way to
  // it yet: the caller then tells the scheduler, after releasing the lock.
  bool ShouldNotifyLocked(std::chrono::steady_clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A batch has been answered: frees its place in flight.
  void ReleaseSlot();
  // A completion thread: answers the requests of groups in completions_.
  void CompletionLoop();

  // Requests of one large batch answered together by a completion thread.
  struct CompletionGroup {
    std::vector<std::pair<std::unique_ptr<WorkItem>, absl::Status>> items;
    RequestTiming timing;  // the batch's; queue_ns is set per request
  };

  const BatcherOptions options_;
  Scheduler* const scheduler_;
  BatcherObserver* const observer_;
  const int max_in_flight_;
  const bool outputs_reuse_inputs_;
  const bool has_timer_;  // max_queue_delay > 0: timer_ runs

  absl::Mutex mu_;
  absl::CondVar cv_;  // the timer's and Stop's
  std::deque<std::unique_ptr<WorkItem>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_rows_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Batches taken by slot threads and not yet answered.
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Notify calls not yet followed by a TakeBatch, and since when the first
  // of them has waited (a batch's dispatch wait starts there).
  int wakes_pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point notified_at_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Groups of requests handed to the completion threads, not yet answered.
  std::deque<CompletionGroup> completions_ ABSL_GUARDED_BY(mu_);
  int completing_ ABSL_GUARDED_BY(mu_) = 0;
  bool completion_stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar completion_cv_;
  std::vector<std::thread> completion_threads_;

  absl::Mutex stop_mu_;  // serialises Stop() callers around the join
  std::thread timer_;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_SCHEDULING_BATCHER_H_
