// The compute interface under the scheduler: a Backend declares its execution
// slots and capabilities, and computes one whole batch of segments at a time
// per slot, on the thread the scheduler runs for that slot (scheduler.h). A
// backend with several slots pipelines batches (the GPU backend packs batch
// k+1 on one stream while batch k runs on another).
//
// Implementations: CpuBackend (server/cpu/), CudaBackend (server/cuda/).
//
// Thread-safety: Execute runs concurrently on different slots; StageInput,
// Device and Memory may be called from any thread.
#ifndef SOFTMAX_SERVER_SCHEDULING_BACKEND_H_
#define SOFTMAX_SERVER_SCHEDULING_BACKEND_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu_softmax.h"
#include "kernels/dtype.h"

namespace softmax::server {

struct WorkItem;  // batcher.h; opaque to backends.

// Where a segment's input or output lives. The GPU backend reads and writes
// kMappedHost and kDevice memory where it is, with no staging; the CPU
// backend computes on host memory only.
enum class MemoryKind {
  kHost,        // ordinary host memory (a message, or unregistered shared memory)
  kMappedHost,  // host memory pinned and mapped into every GPU (registered shared memory)
  kDevice,      // memory of GPU `Segment::*_device` (CUDA shared memory)
};

// One request's share of a batch: a contiguous [outer, n, inner] tensor.
struct Segment {
  const void* input = nullptr;  // points into the request's data; not owned
  // The response's data, already sized; not owned. Null when !full_output.
  void* output = nullptr;
  int64_t bytes = 0;            // input bytes == output bytes
  DType dtype = DType::kFloat32;
  SoftmaxShape shape;
  SoftmaxOptions options;
  // The request can be answered from memory the backend keeps (an
  // OutputView) instead of `output`. A backend may ignore it.
  bool output_view_ok = false;
  // Set by Backend::StageInput: `input` points into memory of the backend's
  // own, kept alive by this, which the backend reads directly.
  std::shared_ptr<const void> staged;
  // Memory other than the host's (shared-memory regions): both pointers
  // are then 16-byte aligned, and the memory stays valid until the request
  // is answered. A backend that cannot reach it fails the segment.
  MemoryKind input_memory = MemoryKind::kHost;
  MemoryKind output_memory = MemoryKind::kHost;
  int input_device = -1;  // the GPU of a kDevice input
  int output_device = -1;
  // The top K of each row (0: none), 1 <= top_k <= shape.n: the backend
  // writes, for row (o, i), its K best
  // elements' softmax (or log-softmax) values in `dtype` to
  // top_k_values[(o * top_k + j) * inner + i] and their indices along the
  // axis to top_k_indices[...], j = 0 (best) .. K-1, ranked by the input
  // value exactly (CpuSoftmaxTopKRows, kernels/cpu_softmax.h). Both are host
  // memory, already sized, and computed before `output` is written (which
  // may be `input` itself).
  int64_t top_k = 0;
  void* top_k_values = nullptr;
  int64_t* top_k_indices = nullptr;
  // False only with top_k: no whole output is computed (`output` is null).
  bool full_output = true;
};

// Bytes of a top K of `rows` rows: K values of `dtype` and K int64 indices each.
inline int64_t TopKBytes(DType dtype, int64_t rows, int64_t k) {
  return rows * k * (ItemSize(dtype) + static_cast<int64_t>(sizeof(int64_t)));
}

// Memory of a backend's own for one input (Backend::AllocateStaging):
// `bytes` writable bytes at `data`, valid while `owner` lives. Empty
// (data null) when the backend has none to give.
struct StagingBuffer {
  char* data = nullptr;
  int64_t bytes = 0;
  std::shared_ptr<const void> owner;
};

// A segment's output left where the backend computed it (the GPU backend's
// pinned host memory) for the response to reference instead of copying it.
// `owner` keeps the bytes alive and valid: whoever holds the last reference
// (gRPC, once the response is sent) gives the memory back. Holding views
// holds backend memory, so backends bound the bytes they lend this way.
struct OutputView {
  const char* data = nullptr;  // null: no view; the output is in segment.output
  int64_t bytes = 0;
  std::shared_ptr<const void> owner;
};

// A batch formed by the batcher. Backends read `segments` and write each
// segment's output; `items` belongs to the batcher and must not be touched.
struct Batch {
  std::vector<Segment> segments;
  int64_t rows = 0;   // sum of segments' shape.rows()
  int64_t bytes = 0;  // sum of segments' input bytes
  std::vector<std::unique_ptr<WorkItem>> items;  // parallel to segments
  // When the batch became ready to run (the scheduler was told of it); a
  // backend reports the wait from here to the start of its compute
  // (BatchResult::dispatch_ns). Unset: not known.
  std::chrono::steady_clock::time_point submitted;

  Batch();
  ~Batch();
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
};

// What a backend reports for a finished batch.
struct BatchResult {
  // OK, or the error every request of the batch fails with (INTERNAL for a
  // device fault, RESOURCE_EXHAUSTED when out of memory).
  absl::Status status;
  int64_t compute_ns = 0;  // time the backend spent on this batch
  // Time from Batch::submitted to the start of that compute: the batch
  // waiting for a slot's thread to take it (0 when not known).
  int64_t dispatch_ns = 0;
  // Kernel figures for the bandwidth metrics: time between the first launch
  // and the end of the last (CUDA events; the CPU backend reports its compute
  // time), bytes read + written by the kernels, and the kernels launched.
  int64_t kernel_ns = 0;
  int64_t kernel_bytes = 0;
  int launches = 0;
  // When non-empty (one per segment), each request's own outcome; overrides
  // `status`. Lets a backend fail only the requests that did not fit in
  // memory while the rest of the batch succeeds.
  std::vector<absl::Status> segment_status;
  // When non-empty (one per segment), the outputs the backend left in its
  // own memory (OutputView::data set) instead of writing segment.output;
  // only for segments with output_view_ok that succeeded.
  std::vector<OutputView> output_views;
};

// What the occupancy probe found for one kernel, for the start-up log and
// the metrics. Plain data so that this header needs no CUDA.
struct KernelOccupancy {
  std::string kernel;  // e.g. "on_chip<float16>/cluster4"
  std::string dtype;
  int threads_per_block = 0;
  int registers_per_thread = 0;
  int shared_bytes = 0;
  int blocks_per_sm = 0;
  int cluster_size = 1;
  int grid = 0;
};

// Static facts about the device a backend runs on.
struct DeviceInfo {
  std::string name;                // "NVIDIA H200", or the CPU's description
  std::string compute_capability;  // "9.0"; empty on the CPU
  int multiprocessors = 0;         // SMs, or CPU threads
  int64_t memory_bytes = 0;        // device memory; 0 on the CPU
  double peak_bandwidth_bytes_per_second = 0;  // nominal, read + write counted
  std::vector<KernelOccupancy> kernels;
  // The GPU's launch plan as the kernels plan from it (its probe table: what
  // decides each row's kernel and geometry, and so its bits); empty on the
  // CPU. GPUs with equal plans give a request the same bits.
  std::string launch_plan;
};

// Memory statistics a backend can report (caching allocators).
struct MemoryStats {
  std::string memory;  // "device" or "pinned"
  int64_t in_use_bytes = 0;
  int64_t cached_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t allocations = 0;
  int64_t cache_hits = 0;
  int64_t raw_allocations = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Short human-readable description for the start-up log, e.g. "cpu threads=8".
  virtual std::string Describe() const = 0;

  // The label this backend's metrics carry: "cpu", "cuda:0", ...
  virtual std::string Name() const = 0;

  // Execution slots: batches this backend can run at once. The scheduler
  // runs one thread per slot and calls Execute(slot, ...) only from the
  // thread of that slot. A GPU backend returns one per CUDA stream, so
  // that one batch's copies overlap another's compute.
  virtual int Slots() const { return 1; }

  // True when Execute reads every input byte of a batch before it writes
  // the same bytes of its output (the GPU backend packs every input into its
  // staging first). Then a request's input buffer may be handed back to it
  // as its output buffer (segment.output == segment.input): no allocation,
  // page faults or zero fill per response.
  virtual bool ComputesInPlace() const { return false; }

  // Called once on each slot's thread before its first Execute, e.g. to make
  // the backend's device current there. Default: nothing.
  virtual void EnterSlotThread(int slot) {}

  // Computes `batch` on the calling thread (the thread of `slot`) and
  // returns when its outputs are written (or lent; see BatchResult).
  // REQUIRES: 0 <= slot < Slots(); no other Execute on the same slot runs.
  virtual BatchResult Execute(int slot, Batch& batch) = 0;

  // Optional: copies the input of `segment` (which has output_view_ok) into
  // memory the backend computes from directly (pinned host memory on the
  // GPU), on the calling thread; the batcher calls it as a request is
  // admitted, on a gRPC thread, so that requests are copied in parallel
  // instead of batch by batch on a slot's thread. On true, segment.input
  // points there and segment.staged keeps it alive; the batcher sets
  // output = input, the backend computes in place there, and the request is
  // answered from that buffer (unless the backend lends an OutputView of
  // another). Such memory must be readable by every backend of the process
  // (pinned host memory is). Default: false.
  virtual bool StageInput(Segment& segment) { return false; }

  // Optional: memory like StageInput's for an input of `bytes` that the
  // caller writes there itself as it arrives (a tensor sent in chunks), so
  // that StageInput's copy is not needed. Hand it over as segment.input and
  // segment.staged of a WorkItem with an output_view (the answer is a view
  // of this memory, computed in place), and the batcher stages nothing more.
  // Any thread. Default: none (StagingBuffer{}).
  virtual StagingBuffer AllocateStaging(int64_t bytes) { return {}; }

  // The device this backend computes on; default: nothing known.
  virtual DeviceInfo Device() const { return {}; }

  // Allocator statistics, one entry per memory kind; default: none.
  virtual std::vector<MemoryStats> Memory() const { return {}; }
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_SCHEDULING_BACKEND_H_
