// DeviceWorker: the CUDA backend, one per GPU.
//
// Owns the device's primary context (made current on its threads), one CUDA
// stream per pipeline slot (three by default), a caching device allocator, a
// caching pinned-host allocator for staging, and the kernels' launch plan from
// the start-up occupancy probe.
//
// The path of a batch, on the thread of the slot that took it:
//   pack every segment's input into pinned staging (16-byte aligned offsets)
//   -> one H2D copy (none for a small batch: see zero_copy_max_bytes)
//   -> ONE persistent softmax launch per dtype over the segment table (long
//   rows add their split-row launches) -> one D2H copy (none for a small
//   batch) -> wait for the slot's stream -> copy each segment's rows into its
//   response. With several slots, batch k+1 is packed and copied while batch k
//   computes on the other stream.
//
// A batch larger than `max_staging_bytes` (a large request runs alone) is
// cut into pieces of whole [n, inner] slabs that fit, run one after another
// through the same staging; a single slab larger than that gets staging of its
// own size. Out of device or pinned memory: the allocators release their
// caches and retry once; if the batch still does not fit, each request is
// retried alone and only those that do not fit fail, RESOURCE_EXHAUSTED.
//
// Large outputs need not be copied back at all: a batch's outputs may stay
// in a pinned block of their own that the responses reference until gRPC
// has sent them (OutputView; see pinned_responses_max_bytes).
//
// A sticky CUDA error (illegal address, launch failure...) leaves the context
// unusable: the batch fails INTERNAL, every later batch fails INTERNAL at
// once, and `on_fault` is called once so that the process can go NOT_SERVING
// and exit non-zero for its supervisor to restart it.
//
// Thread-safety: Submit, Device and Memory may be called from any thread.
#ifndef SOFTMAX_SERVER_DEVICE_WORKER_H_
#define SOFTMAX_SERVER_DEVICE_WORKER_H_

#include <atomic>
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
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/backend.h"

namespace softmax::server {

struct DeviceWorkerOptions {
  int device = 0;
  // Pipeline depth: batches in flight on their own streams. 2 overlaps one
  // batch's copies with the other's compute; a third lets small batches
  // (whose round trip is mostly launch latency) start while two are in
  // flight, which at 16-64 callers cut their queueing by half on the H200.
  int slots = 3;
  // Staging a batch may use before it is cut into pieces. Match the
  // batcher's max_batch_bytes so a normal batch runs in one piece.
  int64_t max_staging_bytes = int64_t{64} << 20;
  // How a slot waits for its batch: false spins on the CUDA event (lowest
  // wake-up latency, one busy core per slot); true polls it for `spin_us`
  // microseconds, then sleeps on it (cudaEventBlockingSync), leaving the
  // cores to gRPC when the host's CPUs are the bottleneck. A short poll
  // keeps the wake-up latency of small batches (a GPU round trip of tens of
  // microseconds) while the long waits of big copies sleep.
  bool blocking_sync = true;
  int64_t spin_us = 50;
  // A batch of at most this many bytes that finds the device idle (no slot
  // busy, nothing waiting) runs on the submitting thread instead of being
  // handed to a slot's thread: a lone small request then skips one thread
  // wake-up on its way to the GPU and one on its way back. Only when the
  // whole device is idle: a submitter that ran a batch while another was in
  // flight would stop feeding the pipeline meanwhile. 0 = always hand off,
  // the default: since a hand-off wakes exactly one slot thread, handing off
  // was level with or ahead of running inline at one caller on the H200
  // (three alternating rounds, bench/service/results/h200-5/ab-c1), and it
  // keeps the gRPC threads free.
  int64_t inline_max_bytes = 0;
  // Also run such a batch on the submitting thread while other slots are
  // busy, as long as one is free. Then a gRPC thread waits out the GPU round
  // trip, but the batch skips the hand-off (about 13 us on the H200).
  bool inline_when_busy = false;
  // After a batch, a slot's thread polls for the next one this many
  // microseconds before it sleeps on its condition variable, so that a
  // batch submitted meanwhile starts without a thread wake-up (one busy
  // core per polling thread while it lasts), as long as fewer than
  // idle_spin_threads threads poll already. 0 = sleep at once.
  int64_t idle_spin_us = 400;
  int idle_spin_threads = 1;
  // A batch of at most this many input bytes skips the host<->device copies:
  // the kernels read its inputs from the pinned staging and write its
  // outputs there, over the bus. Two DMA copies and their stream
  // dependencies cost more than a few hundred kilobytes of data: on the
  // H200, 8 x 4096 float16 requests (64 KiB) took 26.6 us alone and 55.8 us
  // three to a batch, against 42.8 and 68.3 us with copies; ten to a batch
  // (640 KiB), the two were level (device_worker_bench). In the service,
  // where inputs of 16 KiB or more are staged as they are admitted and so
  // need one H2D copy each, batches of 7-18 such requests (0.5-1.2 MiB)
  // spent 108-318 us in compute with copies against 54-97 us without, and
  // 64 x 32000 bfloat16 (4 MiB) 830-920 us against 310-450 (gpu-check
  // ab-zc). 0 = always copy.
  int64_t zero_copy_max_bytes = int64_t{4} << 20;
  // Responses may reference their outputs where the batch left them, in
  // pinned host memory, instead of each output being copied into its
  // response message and gRPC copying it again to serialise it: for
  // requests of at least pinned_response_min_bytes (smaller ones copy in
  // less time than the loan costs), in batches that run in one piece, while
  // the pinned memory lent to responses not yet sent stays within
  // pinned_responses_max_bytes. Beyond that bound (slow readers) outputs are
  // copied as before. 0 = never lend. The same bound and size select the
  // inputs staged in pinned memory as requests are admitted (StageInput).
  int64_t pinned_responses_max_bytes = int64_t{1} << 30;
  int64_t pinned_response_min_bytes = int64_t{16} << 10;
  // Device memory the caching allocator may take from CUDA, staging
  // included (0 = no cap). Past it, allocation fails as out of memory does:
  // the caches are released and retried, then RESOURCE_EXHAUSTED for the
  // requests that do not fit.
  int64_t memory_limit_bytes = 0;
  // Testing only: after this many batches (0 = never), launch a kernel on an
  // invalid address to produce a real sticky fault.
  int64_t inject_fault_after_batches = 0;
};

class DeviceWorker final : public Backend {
 public:
  // Called once, from a worker thread, after a sticky CUDA error.
  using FaultHandler = std::function<void(const absl::Status&)>;

  // Makes `options.device` current, probes the kernels, creates streams and
  // allocators, starts the slot threads. Errors: FAILED_PRECONDITION when the
  // device cannot be used, INTERNAL for other CUDA failures.
  static absl::StatusOr<std::unique_ptr<DeviceWorker>> Create(const DeviceWorkerOptions& options,
                                                              FaultHandler on_fault);
  // Finishes the batches already submitted, then releases everything.
  ~DeviceWorker() override;

  // A run of pieces packs all of its inputs into staging before any of its
  // outputs is written back, and pieces never overlap, so a segment may be
  // computed in place (output == input): the batcher's outputs_reuse_inputs.
  static constexpr bool kComputesInPlace = true;

  std::string Describe() const override;
  int MaxBatchesInFlight() const override { return options_.slots; }
  void Submit(std::unique_ptr<Batch> batch, Done done) override;
  // Copies inputs of at least pinned_response_min_bytes into pinned memory
  // of their own (within pinned_responses_max_bytes, which the staged inputs
  // share with the lent outputs): the kernels, or the H2D copy, then read
  // them there, and the slot's thread has nothing to pack for them.
  bool StageInput(Segment& segment) override;
  DeviceInfo Device() const override { return info_; }
  std::vector<MemoryStats> Memory() const override;

  // The occupancy probe, one line per kernel, for the start-up log.
  const std::string& ProbeReport() const { return probe_report_; }

 private:
  struct State;  // CUDA objects, allocators and the plan (device_worker.cc)
  struct Slot;

  DeviceWorker(const DeviceWorkerOptions& options, FaultHandler on_fault);
  void SlotLoop(int slot);
  BatchResult RunBatch(Slot& slot, Batch& batch);
  // RunBatch, or INTERNAL at once after a fault.
  BatchResult Run(Slot& slot, Batch& batch);
  // Marks the worker failed (once) and reports the fault.
  void Fault(const absl::Status& status);

  const DeviceWorkerOptions options_;
  FaultHandler on_fault_;
  std::unique_ptr<State> state_;
  DeviceInfo info_;
  std::string probe_report_;
  std::atomic<bool> failed_{false};
  std::atomic<int64_t> batches_run_{0};

  // Signals the idle slot that should take the batch just queued.
  void WakeForPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  // One per slot, so that a batch wakes exactly one waiting thread.
  std::unique_ptr<absl::CondVar[]> slot_cv_;
  std::deque<std::pair<std::unique_ptr<Batch>, Done>> pending_ ABSL_GUARDED_BY(mu_);
  // Per slot: running a batch (on its own thread or on a submitting one).
  std::vector<bool> slot_busy_ ABSL_GUARDED_BY(mu_);
  // Per slot: its thread waits on its condition variable (or has been
  // signalled and not yet woken). A thread that is not waiting, e.g. one
  // answering its last batch's requests in the done callback, would miss a
  // signal; it checks the queue before it waits instead.
  std::vector<bool> slot_waiting_ ABSL_GUARDED_BY(mu_);
  // pending_.size(), for threads polling without the lock (idle_spin_us).
  std::atomic<int> queued_{0};
  // Slot threads polling for a batch (idle_spin_us): the first batches
  // queued are theirs, without a signal.
  std::atomic<int> spinning_{0};
  std::atomic<bool> stop_polling_{false};  // set by the destructor
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_DEVICE_WORKER_H_
