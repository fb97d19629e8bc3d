// CudaBackend: the CUDA backend, one per GPU.
//
// Owns the device's primary context (made current on its threads), one CUDA
// stream per pipeline slot (three by default), a caching device allocator, a
// caching pinned-host allocator for staging, and the kernels' launch plan from
// the start-up occupancy probe.
//
// The path of a batch, on the scheduler's thread of the slot that took it:
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
// A segment's top K (Segment::top_k) runs first, in its own pass: its
// inputs packed (or read where they are staged), copied to the device unless
// small (zero copy as above), ONE fused LaunchSoftmaxTopK per dtype writing
// K values and indices per row straight into pinned memory; only those come
// back. A K past gpu::kMaxFusedTopK is computed on the slot's thread with
// the CPU backend's routine (same ranking), from host memory only.
//
// Large outputs need not be copied back at all: a batch's outputs may stay
// in a pinned block of their own that the responses reference until gRPC
// has sent them (OutputView; see kPinnedResponsesMaxBytes).
//
// A sticky CUDA error (illegal address, launch failure...) leaves the context
// unusable: the batch fails INTERNAL, every later batch fails INTERNAL at
// once, and `on_fault` is called once so that the process can go NOT_SERVING
// and exit non-zero for its supervisor to restart it.
//
// Thread-safety: Execute runs on the scheduler's slot threads, one per slot;
// StageInput, Device and Memory may be called from any thread.
#ifndef SOFTMAX_SERVER_CUDA_CUDA_BACKEND_H_
#define SOFTMAX_SERVER_CUDA_CUDA_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/scheduling/backend.h"

namespace softmax::server {

// Tuning values, measured on the H200; the options below default to them and
// exist so that tests can exercise every path.
//
// Batches in flight per GPU, one CUDA stream each: two overlap one batch's
// copies with another's compute; a third let small batches start while two
// were in flight, which halved their queueing at 16-64 callers.
inline constexpr int kCudaStreams = 3;
// A slot polls its batch's completion event this long before it sleeps on
// it: small batches finish within it and keep a spinning wait's latency,
// while the long waits of big copies leave the cores to gRPC (spin 0 or
// 500 us measured no different from 50).
inline constexpr int64_t kEventSpinUs = 50;
// Batches of at most this many input bytes skip the host<->device copies:
// the kernels read and write the pinned staging over the bus. 64 x 32000
// bfloat16 (4 MiB) computed in 310-450 us so against 830-920 us with copies.
inline constexpr int64_t kZeroCopyMaxBytes = int64_t{4} << 20;
// Responses of at least kPinnedResponseMinBytes are sent from the pinned
// memory their batch was computed into (and their inputs copied into pinned
// memory as they are admitted) while such loans stay within
// kPinnedResponsesMaxBytes; smaller ones copy in less time than a loan
// costs. Beyond the bound (slow readers) outputs are copied instead.
inline constexpr int64_t kPinnedResponsesMaxBytes = int64_t{1} << 30;
inline constexpr int64_t kPinnedResponseMinBytes = int64_t{16} << 10;

struct CudaBackendOptions {
  int device = 0;
  // Pipeline depth: batches in flight on their own streams (kCudaStreams).
  int slots = kCudaStreams;
  // Staging a batch may use before it is cut into pieces. Match the
  // batcher's max_batch_bytes so a normal batch runs in one piece.
  int64_t max_staging_bytes = int64_t{64} << 20;
  // Polling of each batch's completion before sleeping on it (kEventSpinUs);
  // negative: spin in cudaEventSynchronize until it completes.
  int64_t event_spin_us = kEventSpinUs;
  // See kZeroCopyMaxBytes; 0 = always copy.
  int64_t zero_copy_max_bytes = kZeroCopyMaxBytes;
  // See kPinnedResponsesMaxBytes; 0 = never lend (always copy).
  int64_t pinned_responses_max_bytes = kPinnedResponsesMaxBytes;
  int64_t pinned_response_min_bytes = kPinnedResponseMinBytes;
  // Device memory the caching allocator may take from CUDA, staging
  // included (0 = no cap). Past it, allocation fails as out of memory does:
  // the caches are released and retried, then RESOURCE_EXHAUSTED for the
  // requests that do not fit. softmax-server sets no cap (the device's own
  // memory is the bound); the backend's tests set one to provoke that path.
  int64_t memory_limit_bytes = 0;
  // Testing only: after this many batches (0 = never), launch a kernel on an
  // invalid address to produce a real sticky fault.
  int64_t inject_fault_after_batches = 0;
};

class CudaBackend final : public Backend {
 public:
  // Called once, from a slot's thread, after a sticky CUDA error.
  using FaultHandler = std::function<void(const absl::Status&)>;

  // Makes `options.device` current, probes the kernels, creates streams and
  // allocators. Errors: FAILED_PRECONDITION when the device cannot be used,
  // INTERNAL for other CUDA failures.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options,
                                                             FaultHandler on_fault);
  // Releases everything. REQUIRES: no Execute running (the scheduler stopped).
  ~CudaBackend() override;

  std::string Describe() const override;
  std::string Name() const override;
  int Slots() const override { return options_.slots; }
  // A run of pieces packs all of its inputs into staging before any of its
  // outputs is written back, and pieces never overlap, so a segment may be
  // computed in place (output == input).
  bool ComputesInPlace() const override { return true; }
  // Makes the device current on the slot's thread.
  void EnterSlotThread(int slot) override;
  BatchResult Execute(int slot, Batch& batch) override;
  // Copies inputs of at least pinned_response_min_bytes into pinned memory
  // of their own (within pinned_responses_max_bytes, which the staged inputs
  // share with the lent outputs): the kernels, or the H2D copy, then read
  // them there, and the slot's thread has nothing to pack for them. The
  // memory is portable: any GPU of the process may compute from it.
  bool StageInput(Segment& segment) override;
  // The memory StageInput copies into, under the same bound.
  StagingBuffer AllocateStaging(int64_t bytes) override;
  DeviceInfo Device() const override { return info_; }
  std::vector<MemoryStats> Memory() const override;

  // The occupancy probe, one line per kernel, for the start-up log.
  const std::string& ProbeReport() const { return probe_report_; }

 private:
  struct State;  // CUDA objects, allocators and the plan (cuda_backend.cc)
  struct Slot;

  CudaBackend(const CudaBackendOptions& options, FaultHandler on_fault);
  BatchResult RunBatch(Slot& slot, Batch& batch);
  // OK when the kernels on this GPU can read and write `segment`'s memory
  // (another GPU's only with peer access); FAILED_PRECONDITION otherwise.
  absl::Status CanReach(const Segment& segment) const;
  // Marks the backend failed (once) and reports the fault.
  void Fault(const absl::Status& status);

  const CudaBackendOptions options_;
  FaultHandler on_fault_;
  std::unique_ptr<State> state_;
  DeviceInfo info_;
  std::string probe_report_;
  std::atomic<bool> failed_{false};
  std::atomic<int64_t> batches_run_{0};
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_CUDA_CUDA_BACKEND_H_
