#include "server/scheduling/scheduler.h"

#include <chrono>
#include <climits>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/thread_name.h"

namespace softmax::server {
namespace {

// After a batch, a slot's thread polls this long for the next one before it
// sleeps: a thread woken from its condition variable cost each batch 18-23 us
// at one caller on the H200 host, against 13 us of kernels for 1 x 1024.
constexpr std::chrono::microseconds kIdleSpin(400);
// Threads that poll at once: one is enough to spare a lone caller's batches
// that wake-up, and a poll yields its core to any thread that wants it.
constexpr int kIdleSpinThreads = 1;

}  // namespace

Scheduler::Scheduler(std::vector<Backend*> backends)
    : backends_(std::move(backends)),
      busy_(std::make_unique<std::atomic<int>[]>(backends_.size())) {
  for (size_t b = 0; b < backends_.size(); ++b) {
    busy_[b].store(0);
    total_slots_ += std::max(1, backends_[b]->Slots());
    computes_in_place_ = computes_in_place_ && backends_[b]->ComputesInPlace();
  }
  if (backends_.empty()) computes_in_place_ = false;
}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Start(BatchSource* source) {
  source_ = source;
  absl::MutexLock lock(&mu_);
  for (size_t b = 0; b < backends_.size(); ++b) {
    for (int s = 0; s < std::max(1, backends_[b]->Slots()); ++s) {
      SlotThread thread;
      thread.backend = static_cast<int>(b);
      thread.slot = s;
      thread.cv = std::make_unique<absl::CondVar>();
      slot_threads_.push_back(std::move(thread));
    }
  }
  for (size_t i = 0; i < slot_threads_.size(); ++i) {
    threads_.emplace_back([this, i] { SlotLoop(static_cast<int>(i)); });
  }
}

bool Scheduler::LeastLoaded(int backend) const {
  const int mine = busy_[backend].load(std::memory_order_relaxed);
  for (size_t b = 0; b < backends_.size(); ++b) {
    if (busy_[b].load(std::memory_order_relaxed) < mine) return false;
  }
  return true;
}

void Scheduler::Notify() {
  epoch_.fetch_add(1, std::memory_order_acq_rel);
  const int polling = polling_backend_.load(std::memory_order_acquire);
  if (polling >= 0 && LeastLoaded(polling)) return;  // the polling thread takes it
  absl::MutexLock lock(&mu_);
  int chosen = -1;
  int chosen_busy = INT_MAX;
  for (size_t i = 0; i < slot_threads_.size(); ++i) {
    const SlotThread& thread = slot_threads_[i];
    if (!thread.waiting) continue;
    const int busy = busy_[thread.backend].load(std::memory_order_relaxed);
    if (busy < chosen_busy) {
      chosen = static_cast<int>(i);
      chosen_busy = busy;
    }
  }
  // None waiting: every thread is busy or about to look again, and a thread
  // looks again before it sleeps (epoch_).
  if (chosen < 0) return;
  // Claimed: the next Notify wakes another thread.
  slot_threads_[chosen].waiting = false;
  slot_threads_[chosen].cv->Signal();
}

bool Scheduler::PollForWork(int backend, uint64_t seen) {
  static_assert(kIdleSpinThreads == 1, "polling_backend_ names one polling thread");
  int polling = polling_.load(std::memory_order_acquire);
  bool mine = false;
  while (!mine && polling < kIdleSpinThreads) {
    mine = polling_.compare_exchange_weak(polling, polling + 1, std::memory_order_acq_rel);
  }
  if (!mine) return false;
  polling_backend_.store(backend, std::memory_order_release);
  const auto until = std::chrono::steady_clock::now() + kIdleSpin;
  bool work = false;
  while (!stopping_.load(std::memory_order_relaxed)) {
    if (epoch_.load(std::memory_order_acquire) != seen) {
      work = true;
      break;
    }
    if (std::chrono::steady_clock::now() >= until) break;
    // Yielding, not pausing, so gRPC's threads get a core they wait for: on
    // 2 cores, streamed 1x16 at 256 callers ran 1.03-1.45x faster (3 rounds).
    std::this_thread::yield();
  }
  polling_backend_.store(-1, std::memory_order_release);
  polling_.fetch_sub(1, std::memory_order_acq_rel);
  return work;
}

void Scheduler::SlotLoop(int index) {
  int backend_index = 0;
  int slot = 0;
  {
    absl::MutexLock lock(&mu_);
    backend_index = slot_threads_[index].backend;
    slot = slot_threads_[index].slot;
  }
  Backend& backend = *backends_[backend_index];
  // Thread names hold 15 characters: "sm-cuda0-s2", "sm-cpu-s0".
  NameThisThread(absl::StrCat(
      "sm-", absl::StrReplaceAll(backend.Name(), {{":", ""}}), "-s", slot));
  backend.EnterSlotThread(slot);
  bool ran = false;  // ran a batch since it last slept
  for (;;) {
    // Read before looking, so that a Notify after the look is never missed.
    const uint64_t seen = epoch_.load(std::memory_order_acquire);
    std::unique_ptr<Batch> batch = source_->TakeBatch();
    if (batch != nullptr) {
      busy_[backend_index].fetch_add(1, std::memory_order_relaxed);
      BatchResult result = backend.Execute(slot, *batch);
      busy_[backend_index].fetch_sub(1, std::memory_order_relaxed);
      source_->Complete(std::move(batch), std::move(result), backend_index);
      ran = true;
      continue;
    }
    if (stopping_.load(std::memory_order_acquire)) return;
    uint64_t sleep_while = seen;
    if (ran && PollForWork(backend_index, seen)) {
      if (LeastLoaded(backend_index)) continue;
      // A less-loaded backend should run it: hand it to one of its threads
      // (Notify wakes one, now that none polls), and sleep until the next.
      Notify();
      sleep_while = epoch_.load(std::memory_order_acquire);
    }
    ran = false;
    absl::MutexLock lock(&mu_);
    SlotThread& me = slot_threads_[index];
    while (epoch_.load(std::memory_order_acquire) == sleep_while &&
           !stopping_.load(std::memory_order_acquire)) {
      me.waiting = true;
      me.cv->Wait(&mu_);
      me.waiting = false;
    }
  }
}

bool Scheduler::StageInput(Segment& segment) {
  if (backends_.empty()) return false;
  const uint32_t turn = next_stager_.fetch_add(1, std::memory_order_relaxed);
  return backends_[turn % backends_.size()]->StageInput(segment);
}

StagingBuffer Scheduler::AllocateStaging(int64_t bytes) {
  if (backends_.empty()) return {};
  const uint32_t turn = next_stager_.fetch_add(1, std::memory_order_relaxed);
  return backends_[turn % backends_.size()]->AllocateStaging(bytes);
}

void Scheduler::Stop() {
  absl::MutexLock stop_lock(&stop_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_.store(true, std::memory_order_release);
    for (SlotThread& thread : slot_threads_) thread.cv->Signal();
  }
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

}  // namespace softmax::server
