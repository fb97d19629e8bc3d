#include "server/scheduling/batcher.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/thread_name.h"

namespace softmax::server {
namespace {

using SteadyClock = std::chrono::steady_clock;

int64_t Nanos(SteadyClock::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

}  // namespace

Batch::Batch() = default;
Batch::~Batch() = default;
Batch::Batch(Batch&&) noexcept = default;
Batch& Batch::operator=(Batch&&) noexcept = default;

Batcher::Batcher(const BatcherOptions& options, Scheduler* scheduler,
                 BatcherObserver* observer)
    : options_(options),
      scheduler_(scheduler),
      observer_(observer),
      max_in_flight_(std::max(1, scheduler->slots())),
      outputs_reuse_inputs_(scheduler->ComputesInPlace()),
      has_timer_(options.max_queue_delay.count() > 0) {
  for (int i = 0; i < options_.completion_threads; ++i) {
    completion_threads_.emplace_back([this, i] {
      NameThisThread(absl::StrCat("sm-complete-", i));
      CompletionLoop();
    });
  }
  if (has_timer_) {
    timer_ = std::thread([this] {
      NameThisThread("sm-batch-timer");
      TimerLoop();
    });
  }
  scheduler_->Start(this);
}

Batcher::~Batcher() { Stop(); }

absl::Status Batcher::Enqueue(std::unique_ptr<WorkItem>&& item) {
  if (item->output_view != nullptr && item->fixed_output == nullptr) {
    item->segment.output_view_ok = true;
    // Copied into a backend's own memory here, on the caller's thread (see
    // Backend::StageInput); the request's copy is not needed any more. An
    // input in shared memory is read where it is.
    // (An input staged by its caller, Backend::AllocateStaging, already is.)
    if (item->segment.staged == nullptr && item->segment.input_memory == MemoryKind::kHost &&
        scheduler_->StageInput(item->segment) && item->input_buffer != nullptr) {
      std::string().swap(*item->input_buffer);
      item->input_buffer = nullptr;
    }
  }
  const SteadyClock::time_point now = SteadyClock::now();
  item->enqueued = now;
  const int64_t bytes = item->segment.bytes;
  bool notify = false;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      return absl::UnavailableError("server is shutting down; retry on another replica");
    }
    const bool too_many = static_cast<int64_t>(queue_.size()) >= options_.max_queued_requests;
    // An empty queue always admits, so a request may be as large as the
    // tensor limit even when that exceeds max_queued_bytes.
    const bool too_large = !queue_.empty() && queued_bytes_ + bytes > options_.max_queued_bytes;
    if (too_many || too_large) {
      if (observer_ != nullptr) observer_->OnRequestRejected();
      return absl::UnavailableError(absl::StrCat(
          "server overloaded: request queue full (", queue_.size(), " requests, ",
          queued_bytes_, " bytes queued; limits ", options_.max_queued_requests, " requests, ",
          options_.max_queued_bytes, " bytes); retry with backoff"));
    }
    const bool was_empty = queue_.empty();
    queued_rows_ += item->segment.shape.rows();
    queued_bytes_ += bytes;
    queue_.push_back(std::move(item));
    // Reported under the lock so that the last value set is the current one.
    if (observer_ != nullptr) observer_->OnQueueDepth(queue_.size(), queued_bytes_);
    notify = ShouldNotifyLocked(now);
    // A first request starts the timer's wait for its delay.
    if (!notify && was_empty && has_timer_) cv_.Signal();
  }
  if (notify) scheduler_->Notify();
  return absl::OkStatus();
}

void Batcher::Stop() {
  absl::MutexLock stop_lock(&stop_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  if (timer_.joinable()) timer_.join();
  // What is queued is ready now (ReadyLocked); the slot threads take it
  // batch by batch. Nudged every millisecond: Stop is rare, and this keeps
  // it independent of which thread was told last.
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty() && in_flight_ == 0 && completing_ == 0) {
        completion_stop_ = true;
        completion_cv_.SignalAll();
        break;
      }
      if (queue_.empty()) {
        cv_.WaitWithTimeout(&mu_, absl::Milliseconds(1));
        continue;
      }
    }
    scheduler_->Notify();
    absl::MutexLock lock(&mu_);
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(1));
  }
  for (std::thread& thread : completion_threads_) {
    if (thread.joinable()) thread.join();
  }
  scheduler_->Stop();
}

bool Batcher::ShouldNotifyLocked(SteadyClock::time_point now) {
  // One wake-up per free slot at most: each woken thread takes every request
  // that fits, and the rest of the free slots each get one of their own, so
  // that small batches pipeline over the slots as they did when the
  // receiving thread handed each its own batch.
  if (in_flight_ + wakes_pending_ >= max_in_flight_ || !ReadyLocked(now)) return false;
  if (wakes_pending_ == 0) notified_at_ = now;
  ++wakes_pending_;
  return true;
}

void Batcher::TimerLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const SteadyClock::time_point now = SteadyClock::now();
    if (wakes_pending_ == 0 && ShouldNotifyLocked(now)) {
      mu_.Unlock();
      scheduler_->Notify();
      mu_.Lock();
      continue;
    }
    if (!queue_.empty() && wakes_pending_ == 0 && in_flight_ < max_in_flight_) {
      const auto due = queue_.front()->enqueued + options_.max_queue_delay;
      if (due > now) {
        cv_.WaitWithTimeout(&mu_, absl::Nanoseconds(Nanos(due - now)));
        continue;
      }
    }
    // Nothing queued, a slot already told, or none free: wait for a change
    // (a first request, a batch taken or answered).
    cv_.Wait(&mu_);
  }
}

bool Batcher::ReadyLocked(SteadyClock::time_point now) const {
  if (queue_.empty()) return false;
  if (stopping_) return true;
  if (queued_rows_ >= options_.max_batch_rows || queued_bytes_ >= options_.max_batch_bytes) {
    return true;
  }
  if (options_.dispatch_when_idle && in_flight_ == 0) return true;
  return now - queue_.front()->enqueued >= options_.max_queue_delay;
}

std::unique_ptr<Batch> Batcher::TakeBatchLocked(std::vector<Dropped>* dropped) {
  auto batch = std::make_unique<Batch>();
  // Take requests in arrival order while they fit; drop dead ones.
  const auto wall_now = std::chrono::system_clock::now();
  while (!queue_.empty()) {
    WorkItem& head = *queue_.front();
    const int64_t rows = head.segment.shape.rows();
    const int64_t bytes = head.segment.bytes;
    absl::Status drop;
    // The deadline first: gRPC cancels a call whose deadline passed, so a
    // request past its deadline usually reads as cancelled too.
    if (wall_now >= head.deadline) {
      drop = absl::DeadlineExceededError("deadline passed while the request was queued");
    } else if (head.is_cancelled && head.is_cancelled()) {
      drop = absl::CancelledError("request cancelled while queued");
    } else if (!batch->items.empty() && (batch->rows + rows > options_.max_batch_rows ||
                                         batch->bytes + bytes > options_.max_batch_bytes)) {
      break;
    }
    queued_rows_ -= rows;
    queued_bytes_ -= bytes;
    if (!drop.ok()) {
      dropped->emplace_back(std::move(queue_.front()), std::move(drop));
    } else {
      batch->rows += rows;
      batch->bytes += bytes;
      batch->items.push_back(std::move(queue_.front()));
    }
    queue_.pop_front();
    // A request larger than a batch by itself closes its batch at once.
    if (batch->rows >= options_.max_batch_rows || batch->bytes >= options_.max_batch_bytes) {
      break;
    }
  }
  if (observer_ != nullptr) observer_->OnQueueDepth(queue_.size(), queued_bytes_);
  if (batch->items.empty()) return nullptr;
  ++in_flight_;
  return batch;
}

std::unique_ptr<Batch> Batcher::TakeBatch() {
  std::unique_ptr<Batch> batch;
  std::vector<Dropped> dropped;
  bool more = false;
  SteadyClock::time_point ready_since;
  {
    absl::MutexLock lock(&mu_);
    const SteadyClock::time_point now = SteadyClock::now();
    ready_since = wakes_pending_ > 0 ? notified_at_ : now;
    // Every Notify is followed by a TakeBatch (a woken or polling thread's,
    // or a busy one's once it completes), so this count comes back to 0.
    if (wakes_pending_ > 0) --wakes_pending_;
    if (in_flight_ < max_in_flight_ && ReadyLocked(now)) {
      batch = TakeBatchLocked(&dropped);
      // Another ready batch and another free slot: tell the scheduler too.
      more = ShouldNotifyLocked(now);
    }
    if (has_timer_ || stopping_) cv_.Signal();
  }
  for (auto& [item, status] : dropped) {
    if (observer_ != nullptr) observer_->OnRequestDropped(status.code());
    RequestTiming timing;
    timing.queue_ns = Nanos(SteadyClock::now() - item->enqueued);
    item->done(status, timing);
  }
  if (more) scheduler_->Notify();
  if (batch == nullptr) return nullptr;

  // Outputs are sized here, off the reactor threads, so backends write
  // straight into the response messages; where the backends allow it an
  // output takes over its request's input buffer instead (no allocation).
  batch->segments.reserve(batch->items.size());
  for (auto& item : batch->items) {
    std::string* input = item->input_buffer;
    if (item->segment.top_k > 0) {
      const int64_t count = item->segment.shape.rows() * item->segment.top_k;
      item->top_k->values.resize(static_cast<size_t>(count * ItemSize(item->segment.dtype)));
      item->top_k->indices.resize(static_cast<size_t>(count) * sizeof(int64_t));
      item->segment.top_k_values = item->top_k->values.data();
      // std::string's buffer is aligned for any scalar (operator new, or
      // its in-object buffer after a size_t).
      item->segment.top_k_indices = reinterpret_cast<int64_t*>(item->top_k->indices.data());
      if (!item->segment.full_output) {
        item->segment.output = nullptr;
        item->segment.output_view_ok = false;
        batch->segments.push_back(item->segment);
        continue;
      }
    }
    if (item->fixed_output != nullptr) {
      // Into the caller's region; never answered by a view.
      item->segment.output = item->fixed_output;
      item->segment.output_view_ok = false;
      batch->segments.push_back(item->segment);
      continue;
    }
    if (item->segment.staged != nullptr) {
      // Staged by a backend: computed in place there, answered by a view.
      item->segment.output = const_cast<void*>(item->segment.input);
      item->segment.output_view_ok = true;
      batch->segments.push_back(item->segment);
      continue;
    }
    if (outputs_reuse_inputs_ && input != nullptr &&
        static_cast<int64_t>(input->size()) == item->segment.bytes &&
        input->data() == item->segment.input) {
      *item->output = std::move(*input);
      input->clear();
      item->segment.input = item->output->data();
    } else {
      item->output->resize(static_cast<size_t>(item->segment.bytes));
    }
    item->segment.output = item->output->data();
    item->segment.output_view_ok = item->output_view != nullptr;
    batch->segments.push_back(item->segment);
  }
  const SteadyClock::time_point formed = SteadyClock::now();
  for (auto& item : batch->items) item->queue_ns = Nanos(formed - item->enqueued);
  batch->submitted = ready_since;
  return batch;
}

void Batcher::ReleaseSlot() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
  // The timer may wait for a free slot, and Stop for the last batch.
  if (has_timer_ || stopping_) cv_.Signal();
}

void Batcher::Complete(std::unique_ptr<Batch> batch, BatchResult result, int backend) {
  RequestTiming timing;
  timing.compute_ns = result.compute_ns;
  timing.kernel_ns = result.kernel_ns;
  timing.dispatch_ns = result.dispatch_ns;
  timing.batch_requests = static_cast<int32_t>(batch->items.size());
  timing.batch_rows = batch->rows;
  if (observer_ != nullptr) {
    BatchStats stats;
    stats.backend = backend;
    stats.requests = timing.batch_requests;
    stats.rows = batch->rows;
    stats.bytes = batch->bytes;
    stats.compute_ns = result.compute_ns;
    stats.kernel_ns = result.kernel_ns;
    stats.kernel_bytes = result.kernel_bytes;
    stats.launches = result.launches;
    stats.ok = result.status.ok();
    observer_->OnBatchCompleted(stats);
  }
  const bool per_segment = result.segment_status.size() == batch->items.size();
  // Outputs answered by reference (OutputView): those the backend lent, and
  // staged inputs (Backend::StageInput), computed in place in their buffer.
  const bool lent = result.output_views.size() == batch->items.size();
  for (size_t i = 0; i < batch->items.size(); ++i) {
    WorkItem& item = *batch->items[i];
    const bool ok = per_segment ? result.segment_status[i].ok() : result.status.ok();
    if (!ok || item.output_view == nullptr || !item.segment.full_output) continue;
    if (lent && result.output_views[i].data != nullptr) {
      *item.output_view = std::move(result.output_views[i]);
    } else if (item.segment.staged != nullptr) {
      *item.output_view = OutputView{static_cast<const char*>(item.segment.output),
                                     item.segment.bytes, item.segment.staged};
    }
  }
  const int workers = static_cast<int>(completion_threads_.size());
  const int64_t requests = static_cast<int64_t>(batch->items.size());
  const bool many = options_.offload_completion_requests > 0 &&
                    requests >= options_.offload_completion_requests;
  // What answering sends: whole outputs, and top Ks (a few bytes a row).
  std::vector<int64_t> answer_bytes(batch->items.size());
  int64_t total_answer_bytes = 0;
  for (size_t i = 0; i < batch->items.size(); ++i) {
    const Segment& segment = batch->items[i]->segment;
    answer_bytes[i] = (segment.full_output ? segment.bytes : 0) +
                      (segment.top_k > 0 ? TopKBytes(segment.dtype, segment.shape.rows(),
                                                     segment.top_k)
                                         : 0);
    total_answer_bytes += answer_bytes[i];
  }
  if (workers == 0 || (total_answer_bytes < options_.offload_completion_bytes && !many)) {
    // Small: answered here, on the slot's thread, with no hand-off.
    for (size_t i = 0; i < batch->items.size(); ++i) {
      auto& item = batch->items[i];
      timing.queue_ns = item->queue_ns;
      item->done(per_segment ? result.segment_status[i] : result.status, timing);
    }
    batch.reset();
    ReleaseSlot();
    return;
  }
  // Large, or many requests: answering means serialising and sending as
  // many bytes as were computed, or queueing one write per request, which
  // would hold the slot's thread (and the batch's place in flight) for
  // longer than the compute. The slot is free for the next batch at once;
  // the requests are answered by the completion threads, in up to `workers`
  // groups of about equal bytes (each at least offload_completion_bytes, or
  // offload_completion_requests requests).
  const int64_t by_bytes = (total_answer_bytes + options_.offload_completion_bytes - 1) /
                           options_.offload_completion_bytes;
  const int64_t by_requests = many ? requests / options_.offload_completion_requests : 0;
  const int64_t groups =
      std::min<int64_t>({workers, requests, std::max<int64_t>({1, by_bytes, by_requests})});
  std::vector<CompletionGroup> pending(static_cast<size_t>(groups));
  int64_t bytes_so_far = 0;
  for (size_t i = 0; i < batch->items.size(); ++i) {
    // The group is decided by where the request's bytes start in the batch.
    const size_t g =
        static_cast<size_t>(bytes_so_far * groups / std::max<int64_t>(1, total_answer_bytes));
    CompletionGroup& group = pending[std::min(g, pending.size() - 1)];
    bytes_so_far += answer_bytes[i];
    group.timing = timing;
    group.items.emplace_back(std::move(batch->items[i]),
                             per_segment ? result.segment_status[i] : result.status);
  }
  batch.reset();
  {
    absl::MutexLock lock(&mu_);
    for (CompletionGroup& group : pending) {
      if (group.items.empty()) continue;
      ++completing_;
      completions_.push_back(std::move(group));
      completion_cv_.Signal();
    }
  }
  ReleaseSlot();
}

void Batcher::CompletionLoop() {
  for (;;) {
    CompletionGroup group;
    {
      absl::MutexLock lock(&mu_);
      while (completions_.empty() && !completion_stop_) completion_cv_.Wait(&mu_);
      if (completions_.empty()) return;
      group = std::move(completions_.front());
      completions_.pop_front();
    }
    for (auto& [item, status] : group.items) {
      group.timing.queue_ns = item->queue_ns;
      item->done(status, group.timing);
      item.reset();
    }
    absl::MutexLock lock(&mu_);
    // Stop waits until every request is answered.
    if (--completing_ == 0 && stopping_) cv_.Signal();
  }
}

}  // namespace softmax::server
