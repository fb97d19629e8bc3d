// The scheduler: owns the execution slots of every backend and decides which
// slot runs which batch. It is the one place that answers "which thread runs
// this batch?".
//
// The route of a batch, from admission to answer: a front-end (server/rpc/)
// validates a request and hands it to Admission::Admit (admission.h), which
// refuses it, echoes it (--device=none) or passes it to Batcher::Enqueue; the
// batcher queues it and, when the queue holds a ready batch (full, its oldest request's delay passed,
// or a slot idle) while a slot is free, calls Scheduler::Notify. The
// scheduler runs one thread per slot of every backend (one per CUDA stream of
// each GPU, one for the CPU backend); Notify lets a slot thread that is
// polling for work take it, or wakes one waiting thread of the least-loaded
// backend (fewest busy slots). That thread forms the batch from the queue
// (BatchSource::TakeBatch), runs it on its own backend (Backend::Execute,
// blocking: copies, kernels, the wait for the GPU), and answers its requests
// (BatchSource::Complete; large batches are handed to the batcher's
// completion threads). It then takes the next ready batch itself, without
// sleeping, and polls briefly for one before it sleeps. Once Start has run,
// nothing else starts compute: no thread-locals, no inline paths, no
// per-backend queues (the warm-up, WarmUp in server/device.h, computes on
// slot 0 before the scheduler exists).
//
// Thread-safety: Notify, StageInput, AllocateStaging and the accessors may
// be called from any thread; Start and Stop once each, from the owner.
#ifndef SOFTMAX_SERVER_SCHEDULING_SCHEDULER_H_
#define SOFTMAX_SERVER_SCHEDULING_SCHEDULER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/scheduling/backend.h"

namespace softmax::server {

// Where slot threads take batches from and hand them back (the Batcher).
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The next ready batch, or null when none is ready. Never blocks.
  virtual std::unique_ptr<Batch> TakeBatch() = 0;
  // Answers the requests of `batch`, which `backend` (an index into the
  // scheduler's backends) ran with `result`.
  virtual void Complete(std::unique_ptr<Batch> batch, BatchResult result, int backend) = 0;
};

class Scheduler {
 public:
  // `backends` (at least one) must outlive the scheduler.
  explicit Scheduler(std::vector<Backend*> backends);
  // Stops (see Stop).
  ~Scheduler();

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Starts one thread per slot of every backend, taking batches from
  // `source`, which must outlive Stop(). Called once.
  void Start(BatchSource* source);

  // A batch is ready: a free slot's thread will call TakeBatch soon. Cheap
  // when no thread waits.
  void Notify();

  // Joins the slot threads once they are idle. The source must hold no
  // ready batch any more (the batcher drains first). Idempotent.
  void Stop();

  // Slots of every backend together: batches that may run at once.
  int slots() const { return total_slots_; }
  // True when every backend computes in place (Backend::ComputesInPlace).
  bool ComputesInPlace() const { return computes_in_place_; }
  // Stages `segment` into the memory of one of the backends, in turn
  // (Backend::StageInput).
  bool StageInput(Segment& segment);
  // Staging from one of the backends, in turn (Backend::AllocateStaging).
  StagingBuffer AllocateStaging(int64_t bytes);
  const std::vector<Backend*>& backends() const { return backends_; }

 private:
  struct SlotThread {
    int backend = 0;
    int slot = 0;
    bool waiting = false;  // waits on its own condition variable, unclaimed
    std::unique_ptr<absl::CondVar> cv;
  };

  void SlotLoop(int index);
  // On a slot thread of `backend`: polls for a Notify for up to kIdleSpin
  // when fewer than kIdleSpinThreads threads poll already; true when one came.
  bool PollForWork(int backend, uint64_t seen);
  // True when no backend has fewer busy slots than `backend`.
  bool LeastLoaded(int backend) const;

  const std::vector<Backend*> backends_;
  int total_slots_ = 0;
  bool computes_in_place_ = true;
  BatchSource* source_ = nullptr;
  std::atomic<uint32_t> next_stager_{0};

  // Busy slots per backend: the load that Notify balances.
  std::unique_ptr<std::atomic<int>[]> busy_;
  // Bumped by every Notify; a thread sleeps only while it is unchanged since
  // it last found nothing to take, so no Notify is lost.
  std::atomic<uint64_t> epoch_{0};
  // Backend of the thread polling for work, or -1.
  std::atomic<int> polling_backend_{-1};
  std::atomic<int> polling_{0};
  std::atomic<bool> stopping_{false};

  absl::Mutex mu_;
  std::vector<SlotThread> slot_threads_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
  absl::Mutex stop_mu_;  // serialises Stop() callers around the join
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_SCHEDULING_SCHEDULER_H_
