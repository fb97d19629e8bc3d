#include "server/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "kernels/softmax_cuda.h"
#include "server/cuda/caching_allocator.h"
#include "server/cuda/cuda_status.h"

namespace softmax::server {
namespace {

constexpr int64_t kStagingAlignment = 256;  // keeps every segment 16-byte aligned

int64_t AlignUp(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// cudaMalloc, optionally capped: past `limit_bytes` (0 = no cap) it answers
// RESOURCE_EXHAUSTED as if the device were full, so that a server sharing its
// GPU with other processes keeps to its share.
class CudaDeviceRawAllocator final : public RawAllocator {
 public:
  explicit CudaDeviceRawAllocator(int64_t limit_bytes) : limit_bytes_(limit_bytes) {}
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (limit_bytes_ > 0 && total_ + static_cast<int64_t>(bytes) > limit_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "device memory: ", bytes, " more bytes would pass the backend's limit of ",
          limit_bytes_, " (", total_, " held)"));
    }
    void* ptr = nullptr;
    absl::Status status = SOFTMAX_CUDA_STATUS(cudaMalloc(&ptr, bytes));
    if (!status.ok()) return status;
    total_ += static_cast<int64_t>(bytes);
    sizes_[ptr] = static_cast<int64_t>(bytes);
    return ptr;
  }
  void Free(void* ptr) override {
    auto it = sizes_.find(ptr);
    if (it != sizes_.end()) {
      total_ -= it->second;
      sizes_.erase(it);
    }
    cudaFree(ptr);
  }
  std::string Name() const override { return "device"; }

 private:
  const int64_t limit_bytes_;
  int64_t total_ = 0;
  std::map<void*, int64_t> sizes_;
};

class CudaPinnedRawAllocator final : public RawAllocator {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* ptr = nullptr;
    absl::Status status = SOFTMAX_CUDA_STATUS(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable));
    if (!status.ok()) return status;
    return ptr;
  }
  void Free(void* ptr) override { cudaFreeHost(ptr); }
  std::string Name() const override { return "pinned"; }
};

MemoryStats ToMemoryStats(const CachingAllocator& allocator) {
  const AllocatorStats stats = allocator.stats();
  MemoryStats out;
  out.memory = allocator.name();
  out.in_use_bytes = stats.in_use_bytes;
  out.cached_bytes = stats.cached_bytes;
  out.peak_bytes = stats.peak_in_use_bytes;
  out.allocations = stats.allocations;
  out.cache_hits = stats.cache_hits;
  out.raw_allocations = stats.raw_allocations;
  return out;
}

// One host-side copy between a request's bytes and the pinned staging.
struct HostCopy {
  char* destination;
  const char* source;
  int64_t bytes;
};

// Copies everything in `copies`; large totals are cut into 1 MiB chunks and
// spread over a few threads, since one core's memcpy (about 10 GB/s) would
// otherwise bound big batches well below the PCIe copies.
void CopyAll(const std::vector<HostCopy>& copies) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  constexpr int64_t kParallelAbove = int64_t{8} << 20;
  constexpr int kMaxThreads = 4;
  int64_t total = 0;
  for (const HostCopy& copy : copies) total += copy.bytes;
  if (total < kParallelAbove) {
    for (const HostCopy& copy : copies) std::memcpy(copy.destination, copy.source, copy.bytes);
    return;
  }
  std::vector<HostCopy> chunks;
  for (const HostCopy& copy : copies) {
    for (int64_t offset = 0; offset < copy.bytes; offset += kChunk) {
      chunks.push_back({copy.destination + offset, copy.source + offset,
                        std::min(kChunk, copy.bytes - offset)});
    }
  }
  const int threads = static_cast<int>(std::min<int64_t>(kMaxThreads, total / kParallelAbove + 1));
  auto work = [&chunks, threads](int index) {
    for (size_t i = index; i < chunks.size(); i += threads) {
      std::memcpy(chunks[i].destination, chunks[i].source, chunks[i].bytes);
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads; ++t) helpers.emplace_back(work, t);
  work(0);
  for (std::thread& helper : helpers) helper.join();
}

// Waits for `event`. spin_us < 0: cudaEventSynchronize alone (it spins
// unless the event was created with cudaEventBlockingSync). Otherwise polls
// the event for up to spin_us microseconds, then sleeps on it (such events
// are created with cudaEventBlockingSync).
absl::Status WaitForEvent(cudaEvent_t event, int64_t spin_us) {
  if (spin_us > 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
    for (;;) {
      const cudaError_t error = cudaEventQuery(event);
      if (error == cudaSuccess) return absl::OkStatus();
      if (error != cudaErrorNotReady) return SOFTMAX_CUDA_STATUS(error);
      // "Not ready" is no error: keep it out of the thread's last-error slot,
      // which the kernel launches check.
      if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
      if (std::chrono::steady_clock::now() >= until) break;
    }
  }
  return SOFTMAX_CUDA_STATUS(cudaEventSynchronize(event));
}

// Records `event` on `stream` and waits for it (WaitForEvent): for the end
// of everything queued so far.
absl::Status RecordAndWait(cudaEvent_t event, cudaStream_t stream, int64_t spin_us) {
  SOFTMAX_RETURN_IF_CUDA(cudaEventRecord(event, stream));
  return WaitForEvent(event, spin_us);
}

// A contiguous run of whole [n, inner] slabs of one segment.
struct Piece {
  int segment = 0;
  int64_t outer_begin = 0;
  int64_t outer_count = 0;
  int64_t bytes = 0;
  int64_t slab_bytes = 0;  // bytes of one outer index
};

// Pinned memory lent to responses (OutputView). Shared with the views'
// owners, so that a view released after the worker is gone still returns
// its block to a live allocator.
struct PinnedLoans {
  PinnedLoans(std::shared_ptr<CachingAllocator> allocator, size_t segment_limit)
      : memory(std::move(allocator)), limit_bytes(segment_limit) {}
  std::shared_ptr<CachingAllocator> memory;
  // Loans take no new pinned segment past this many bytes held by the
  // allocator: the slots' staging, the bytes loans may lend and one segment
  // (so that a small bound still has room for a loan's segment). Slow readers
  // that keep the loans at their bound then leave a cache of bounded size and
  // count (AllocateWithin); where the free rests of partly used segments fit
  // no loan, it copies. A GPU soak with bursts of zero-window readers: with a
  // quarter more allowed, the cache grew towards it for 8 minutes (113 to 134
  // segments, 1,396 to 1,468 MiB, the bound 1,472).
  const size_t limit_bytes;
  std::atomic<int64_t> bytes{0};  // reserved by blocks not yet given back
};

// A batch's outputs, left in a pinned block of their own for the responses
// to reference (OutputView) instead of being copied into each response.
struct LentOutputs {
  char* data = nullptr;  // the block; outputs at the run's staging offsets
  std::shared_ptr<const void> owner;  // the block; gives it back when released
  std::vector<bool> segment_lent;     // per segment: its output stays in the block
  std::vector<int64_t> segment_offset;  // per lent segment: where its output is
};

}  // namespace

// One pipeline slot: its stream, its kernel-timing events and its staging,
// sized once to max_staging_bytes so that normal batches never allocate.
struct CudaBackend::Slot {
  cudaStream_t stream = nullptr;
  cudaEvent_t kernel_start = nullptr;
  cudaEvent_t kernel_end = nullptr;
  cudaEvent_t done = nullptr;  // after the D2H copy; what the slot waits on
  Block pinned;      // host staging: inputs packed here, outputs copied back here
  Block device_in;
  Block device_out;
};

struct CudaBackend::State {
  gpu::LaunchPlan plan;
  std::unique_ptr<CachingAllocator> device_memory;
  std::shared_ptr<CachingAllocator> pinned_memory;
  std::shared_ptr<PinnedLoans> loans;  // the pinned memory lent to responses
  std::vector<Slot> slots;
};

CudaBackend::CudaBackend(const CudaBackendOptions& options, FaultHandler on_fault)
    : options_(options),
      on_fault_(std::move(on_fault)),
      state_(std::make_unique<State>()) {}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const CudaBackendOptions& options, FaultHandler on_fault) {
  if (options.slots < 1 || options.max_staging_bytes <= 0) {
    return absl::InvalidArgumentError("CudaBackend: slots and max_staging_bytes must be positive");
  }
  std::unique_ptr<CudaBackend> worker(new CudaBackend(options, std::move(on_fault)));
  State& state = *worker->state_;
  absl::Status status = SOFTMAX_CUDA_STATUS(cudaSetDevice(options.device));
  if (!status.ok()) return absl::FailedPreconditionError(status.message());
  status = SOFTMAX_CUDA_STATUS(gpu::LaunchPlan::Create(options.device, &state.plan));
  if (!status.ok()) return status;

  cudaDeviceProp props;
  status = SOFTMAX_CUDA_STATUS(cudaGetDeviceProperties(&props, options.device));
  if (!status.ok()) return status;
  int memory_clock_khz = 0;
  int bus_width_bits = 0;
  cudaDeviceGetAttribute(&memory_clock_khz, cudaDevAttrMemoryClockRate, options.device);
  cudaDeviceGetAttribute(&bus_width_bits, cudaDevAttrGlobalMemoryBusWidth, options.device);
  DeviceInfo& info = worker->info_;
  info.name = props.name;
  info.compute_capability = absl::StrCat(props.major, ".", props.minor);
  info.multiprocessors = props.multiProcessorCount;
  info.memory_bytes = static_cast<int64_t>(props.totalGlobalMem);
  // Double data rate: two transfers per clock over the whole bus.
  info.peak_bandwidth_bytes_per_second = 2.0 * memory_clock_khz * 1e3 * bus_width_bits / 8.0;
  std::string report = absl::StrFormat(
      "occupancy probe for %s (%d SMs, L2 %d bytes, max cluster %d):\n", info.name,
      state.plan.multiprocessors(), state.plan.l2_bytes(), state.plan.max_cluster_size());
  for (const gpu::KernelProbe& probe : state.plan.probes()) {
    KernelOccupancy k;
    k.kernel = probe.cluster_size > 1 ? absl::StrCat(probe.kernel, "/cluster", probe.cluster_size)
                                      : probe.kernel;
    k.dtype = DTypeName(probe.dtype);
    k.threads_per_block = probe.threads_per_block;
    k.registers_per_thread = probe.registers_per_thread;
    k.shared_bytes = probe.static_shared_bytes;
    k.blocks_per_sm = probe.blocks_per_sm;
    k.cluster_size = probe.cluster_size;
    k.grid = probe.grid;
    info.kernels.push_back(k);
  }
  const std::string plan_text = state.plan.ToString();
  report += plan_text;
  worker->probe_report_ = std::move(report);
  // Without its first line, which names the device: the rest is what planning reads.
  info.launch_plan = plan_text.substr(plan_text.find('\n') + 1);

  state.device_memory = std::make_unique<CachingAllocator>(
      std::make_unique<CudaDeviceRawAllocator>(options.memory_limit_bytes));
  state.pinned_memory =
      std::make_shared<CachingAllocator>(std::make_unique<CudaPinnedRawAllocator>());
  state.loans = std::make_shared<PinnedLoans>(
      state.pinned_memory,
      static_cast<size_t>(options.slots * options.max_staging_bytes +
                          options.pinned_responses_max_bytes) +
          kMediumSegmentBytes);
  state.slots.resize(options.slots);
  for (Slot& slot : state.slots) {
    status = SOFTMAX_CUDA_STATUS(cudaStreamCreateWithFlags(&slot.stream, cudaStreamNonBlocking));
    if (status.ok()) status = SOFTMAX_CUDA_STATUS(cudaEventCreate(&slot.kernel_start));
    if (status.ok()) status = SOFTMAX_CUDA_STATUS(cudaEventCreate(&slot.kernel_end));
    const unsigned done_flags =
        cudaEventDisableTiming | (options.event_spin_us >= 0 ? cudaEventBlockingSync : 0u);
    if (status.ok()) status = SOFTMAX_CUDA_STATUS(cudaEventCreateWithFlags(&slot.done, done_flags));
    if (!status.ok()) return status;
    absl::StatusOr<Block> pinned = state.pinned_memory->Allocate(options.max_staging_bytes);
    if (!pinned.ok()) return pinned.status();
    absl::StatusOr<Block> device_in = state.device_memory->Allocate(options.max_staging_bytes);
    if (!device_in.ok()) return device_in.status();
    absl::StatusOr<Block> device_out = state.device_memory->Allocate(options.max_staging_bytes);
    if (!device_out.ok()) return device_out.status();
    slot.pinned = std::move(*pinned);
    slot.device_in = std::move(*device_in);
    slot.device_out = std::move(*device_out);
  }
  return worker;
}

CudaBackend::~CudaBackend() {
  for (Slot& slot : state_->slots) {
    // Back to the caches before the allocators are destroyed.
    slot.pinned.Reset();
    slot.device_in.Reset();
    slot.device_out.Reset();
  }
  if (!failed_.load()) {
    for (Slot& slot : state_->slots) {
      if (slot.kernel_end != nullptr) cudaEventDestroy(slot.kernel_end);
      if (slot.done != nullptr) cudaEventDestroy(slot.done);
      if (slot.kernel_start != nullptr) cudaEventDestroy(slot.kernel_start);
      if (slot.stream != nullptr) cudaStreamDestroy(slot.stream);
    }
  }
}

std::string CudaBackend::Describe() const {
  return absl::StrFormat("cuda:%d %s (sm_%s, %d SMs, %.0f GiB, nominal %.0f GB/s) streams=%d",
                         options_.device, info_.name,
                         absl::StrReplaceAll(info_.compute_capability, {{".", ""}}),
                         info_.multiprocessors, info_.memory_bytes / double(1 << 30),
                         info_.peak_bandwidth_bytes_per_second / 1e9, options_.slots);
}

std::string CudaBackend::Name() const { return absl::StrCat("cuda:", options_.device); }

void CudaBackend::EnterSlotThread(int slot) { cudaSetDevice(options_.device); }

BatchResult CudaBackend::Execute(int slot, Batch& batch) {
  if (failed_.load()) {
    BatchResult result;
    result.status =
        absl::InternalError("the GPU failed earlier with a fatal error; the server is restarting");
    return result;
  }
  return RunBatch(state_->slots[slot], batch);
}

std::vector<MemoryStats> CudaBackend::Memory() const {
  return {ToMemoryStats(*state_->device_memory), ToMemoryStats(*state_->pinned_memory)};
}

bool CudaBackend::StageInput(Segment& segment) {
  // (A shared-memory input is read where it is, never copied.)
  if (!segment.output_view_ok || segment.input_memory != MemoryKind::kHost) return false;
  StagingBuffer staging = AllocateStaging(segment.bytes);
  if (staging.data == nullptr) return false;
  CopyAll({{staging.data, static_cast<const char*>(segment.input), segment.bytes}});
  segment.input = staging.data;
  segment.staged = std::move(staging.owner);
  return true;
}

StagingBuffer CudaBackend::AllocateStaging(int64_t bytes) {
  if (bytes <= 0 || bytes < options_.pinned_response_min_bytes ||
      options_.pinned_responses_max_bytes <= 0 || failed_.load()) {
    return {};
  }
  PinnedLoans& loans = *state_->loans;
  if (loans.bytes.fetch_add(bytes) + bytes > options_.pinned_responses_max_bytes) {
    loans.bytes.fetch_sub(bytes);
    return {};
  }
  absl::StatusOr<Block> block =
      loans.memory->AllocateWithin(static_cast<size_t>(bytes), loans.limit_bytes);
  if (!block.ok()) {
    loans.bytes.fetch_sub(bytes);
    return {};
  }
  auto* owned = new Block(std::move(*block));
  StagingBuffer staging;
  staging.data = static_cast<char*>(owned->data());
  staging.bytes = bytes;
  staging.owner =
      std::shared_ptr<const void>(owned, [loans = state_->loans, bytes](const Block* b) {
        delete b;
        loans->bytes.fetch_sub(bytes);
      });
  return staging;
}

absl::Status CudaBackend::CanReach(const Segment& segment) const {
  for (const auto& [memory, device] : {std::pair(segment.input_memory, segment.input_device),
                                       std::pair(segment.output_memory, segment.output_device)}) {
    if (memory != MemoryKind::kDevice || device == options_.device) continue;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, options_.device, device) != cudaSuccess || can == 0) {
      cudaGetLastError();
      return absl::FailedPreconditionError(absl::StrCat(
          "the tensor's region is on GPU ", device, ", which GPU ", options_.device,
          " (where the batch ran) cannot access; register regions on GPU ", options_.device));
    }
  }
  return absl::OkStatus();
}

void CudaBackend::Fault(const absl::Status& status) {
  if (failed_.exchange(true)) return;
  if (on_fault_) on_fault_(status);
}

namespace {

// The three staging buffers a run goes through.
struct Staging {
  char* host;  // pinned
  int64_t host_bytes;
  char* in;    // device
  char* out;   // device
};

// A segment whose input (output) the kernels read (write) where it is:
// shared memory in a GPU, or pinned and mapped host memory.
bool InputDirect(const Segment& segment) { return segment.input_memory != MemoryKind::kHost; }
bool OutputDirect(const Segment& segment) { return segment.output_memory != MemoryKind::kHost; }

// What a kernel table entry (gpu::SoftmaxSegment or gpu::TopKSegment) takes
// from `segment` besides its pointers: `outer` of its outer rows, its row
// length and inner stride, temperature and log flag.
template <typename KernelSegment>
void SetRows(const Segment& segment, int64_t outer, KernelSegment& s) {
  s.outer = outer;
  s.n = segment.shape.n;
  s.inner = segment.shape.inner;
  s.temperature = segment.options.temperature;
  s.log = segment.options.log;
}

// Bytes `piece` takes in the staging: none when both of its ends are direct.
int64_t StagingBytes(const Batch& batch, const Piece& piece) {
  const Segment& segment = batch.segments[piece.segment];
  return InputDirect(segment) && OutputDirect(segment) ? 0 : piece.bytes;
}

// Queues copies of the byte ranges [offsets[k], offsets[k] + bytes) of the
// pieces not skipped, merging consecutive ones into one copy.
absl::Status CopyRanges(char* destination, const char* source, cudaMemcpyKind kind,
                        const std::vector<Piece>& pieces, const std::vector<int64_t>& offsets,
                        const std::function<bool(size_t)>& skip, cudaStream_t stream) {
  size_t k = 0;
  while (k < pieces.size()) {
    if (skip(k)) {
      ++k;
      continue;
    }
    const int64_t begin = offsets[k];
    int64_t end = begin;
    while (k < pieces.size() && !skip(k)) {
      end = offsets[k] + pieces[k].bytes;
      ++k;
    }
    SOFTMAX_RETURN_IF_CUDA(
        cudaMemcpyAsync(destination + begin, source + begin, end - begin, kind, stream));
  }
  return absl::OkStatus();
}

// Where the input of `piece` is when its segment's input was staged
// (Backend::StageInput), or null when it has to be packed.
const char* StagedInput(const Batch& batch, const Piece& piece) {
  const Segment& segment = batch.segments[piece.segment];
  if (segment.staged == nullptr) return nullptr;
  return static_cast<const char*>(segment.input) + piece.outer_begin * piece.slab_bytes;
}

// Runs `enqueue_and_wait` (queues a run's copies and kernels on `stream`
// between the kernel_start and kernel_end events, and waits for it). On an
// error, waits until whatever was queued is finished before the buffers go
// back to the caches, where another slot could take them; on success adds
// the kernels' time to `kernel_ns`.
absl::Status RunAndTime(const std::function<absl::Status()>& enqueue_and_wait,
                        cudaStream_t stream, cudaEvent_t kernel_start, cudaEvent_t kernel_end,
                        int64_t* kernel_ns) {
  if (absl::Status status = enqueue_and_wait(); !status.ok()) {
    cudaStreamSynchronize(stream);
    cudaGetLastError();
    return status;
  }
  float kernel_ms = 0;
  SOFTMAX_RETURN_IF_CUDA(cudaEventElapsedTime(&kernel_ms, kernel_start, kernel_end));
  *kernel_ns += static_cast<int64_t>(kernel_ms * 1e6);
  return absl::OkStatus();
}

// Runs `pieces` through `staging` once: pack, H2D, one launch per dtype, D2H,
// wait, unpack. Adds the kernel time and launches to the totals.
//
// A run of at most `zero_copy_max_bytes` skips both copies: the kernels read
// the packed inputs straight from the pinned staging and write the outputs
// right behind them, over the bus (pinned memory is mapped into the device's
// address space under unified addressing). For a few kilobytes the two DMA
// copies cost more than the data: each is an API call, a copy-engine start
// and a dependency on the stream, some 10 us together against a kernel of a
// few microseconds.
absl::Status RunPiecesIn(const gpu::LaunchPlan& plan, CachingAllocator& device_memory,
                         cudaStream_t stream, cudaEvent_t kernel_start, cudaEvent_t kernel_end,
                         cudaEvent_t done, int64_t spin_us, int64_t zero_copy_max_bytes,
                         const Staging& staging, Batch& batch, const std::vector<Piece>& pieces,
                         const std::vector<int64_t>& offsets, int64_t total, bool inject_fault,
                         LentOutputs* lent, int64_t* kernel_ns, int* launches) {
  char* const host = staging.host;
  const int64_t host_out_offset = AlignUp(total, kStagingAlignment);
  // With `lent`, the outputs land in its block (by the kernels over the bus,
  // or by the D2H copy) and only the segments not lent are copied out.
  const bool zero_copy = total <= zero_copy_max_bytes &&
                         (lent != nullptr || host_out_offset + total <= staging.host_bytes);
  char* const in = zero_copy ? host : staging.in;
  char* const host_out =
      lent != nullptr ? lent->data : (zero_copy ? host + host_out_offset : host);
  char* const out = zero_copy ? host_out : staging.out;
  // One segment table, and one launch, per dtype. Tables and scratch are
  // ready before anything is queued on the stream, so an allocation failure
  // leaves no copy or kernel running on the buffers.
  std::map<DType, std::vector<gpu::SoftmaxSegment>> tables;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const Piece& piece = pieces[k];
    const Segment& segment = batch.segments[piece.segment];
    gpu::SoftmaxSegment s;
    const char* staged = StagedInput(batch, piece);
    const int64_t within = piece.outer_begin * piece.slab_bytes;
    s.input = InputDirect(segment) ? static_cast<const char*>(segment.input) + within
              : zero_copy && staged != nullptr ? staged
                                               : in + offsets[k];
    s.output = OutputDirect(segment) ? static_cast<char*>(segment.output) + within
                                     : out + offsets[k];
    SetRows(segment, piece.outer_count, s);
    if (inject_fault && k == 0) {
      // A pointer nothing maps: the kernel's first read faults for real.
      s.input = reinterpret_cast<const void*>(uintptr_t{1} << 47);
    }
    tables[segment.dtype].push_back(s);
  }
  std::vector<Block> scratch;
  for (auto& [dtype, table] : tables) {
    const int count = static_cast<int>(table.size());
    const size_t bytes = gpu::SoftmaxScratchBytes(plan, dtype, table.data(), count);
    absl::StatusOr<Block> block = device_memory.Allocate(bytes);
    if (!block.ok()) return block.status();
    scratch.push_back(std::move(*block));
  }

  // Staged and direct inputs are read where they are; the others are
  // packed first.
  std::vector<HostCopy> copies;
  bool any_staged = false;
  bool any_direct_output = false;
  for (size_t k = 0; k < pieces.size(); ++k) {
    const Piece& piece = pieces[k];
    any_direct_output = any_direct_output || OutputDirect(batch.segments[piece.segment]);
    if (StagedInput(batch, piece) != nullptr || InputDirect(batch.segments[piece.segment])) {
      any_staged = true;
      continue;
    }
    const char* source = static_cast<const char*>(batch.segments[piece.segment].input);
    copies.push_back({host + offsets[k], source + piece.outer_begin * piece.slab_bytes,
                      piece.bytes});
  }
  CopyAll(copies);

  auto enqueue_and_wait = [&]() -> absl::Status {
    if (!zero_copy && !any_staged) {
      SOFTMAX_RETURN_IF_CUDA(cudaMemcpyAsync(in, host, total, cudaMemcpyHostToDevice, stream));
    } else if (!zero_copy) {
      // One copy per staged piece, from its own buffer; none for a direct
      // one; one per run of consecutive packed pieces.
      for (size_t k = 0; k < pieces.size(); ++k) {
        if (const char* staged = StagedInput(batch, pieces[k])) {
          SOFTMAX_RETURN_IF_CUDA(cudaMemcpyAsync(in + offsets[k], staged, pieces[k].bytes,
                                                 cudaMemcpyHostToDevice, stream));
        }
      }
      if (absl::Status status = CopyRanges(
              in, host, cudaMemcpyHostToDevice, pieces, offsets,
              [&](size_t k) {
                return StagedInput(batch, pieces[k]) != nullptr ||
                       InputDirect(batch.segments[pieces[k].segment]);
              },
              stream);
          !status.ok()) {
        return status;
      }
    }
    SOFTMAX_RETURN_IF_CUDA(cudaEventRecord(kernel_start, stream));
    size_t table_index = 0;
    for (auto& [dtype, table] : tables) {
      Block& block = scratch[table_index++];
      int kernels = 0;
      SOFTMAX_RETURN_IF_CUDA(gpu::LaunchSoftmax(plan, dtype, table.data(),
                                                static_cast<int>(table.size()), block.data(),
                                                block.size(), stream, true, &kernels));
      *launches += kernels;
    }
    SOFTMAX_RETURN_IF_CUDA(cudaEventRecord(kernel_end, stream));
    if (zero_copy) return WaitForEvent(kernel_end, spin_us);
    if (!any_direct_output) {
      SOFTMAX_RETURN_IF_CUDA(
          cudaMemcpyAsync(host_out, out, total, cudaMemcpyDeviceToHost, stream));
    } else {
      if (absl::Status status = CopyRanges(
              host_out, out, cudaMemcpyDeviceToHost, pieces, offsets,
              [&](size_t k) { return OutputDirect(batch.segments[pieces[k].segment]); }, stream);
          !status.ok()) {
        return status;
      }
    }
    return RecordAndWait(done, stream, spin_us);
  };
  if (absl::Status status =
          RunAndTime(enqueue_and_wait, stream, kernel_start, kernel_end, kernel_ns);
      !status.ok()) {
    return status;
  }

  copies.clear();
  for (size_t k = 0; k < pieces.size(); ++k) {
    const Piece& piece = pieces[k];
    if (lent != nullptr && lent->segment_lent[piece.segment]) {
      lent->segment_offset[piece.segment] = offsets[k];
      continue;
    }
    if (OutputDirect(batch.segments[piece.segment])) continue;  // written in place
    char* destination = static_cast<char*>(batch.segments[piece.segment].output);
    copies.push_back({destination + piece.outer_begin * piece.slab_bytes, host_out + offsets[k],
                      piece.bytes});
  }
  CopyAll(copies);
  return absl::OkStatus();
}

// Runs `pieces` in the slot's own staging when they fit it (every normal
// batch); otherwise in staging of the run's size taken from the caches (a
// slab larger than max_staging_bytes), which is given back to the system
// afterwards rather than kept: such requests are rare and their blocks large.
absl::Status RunPieces(const gpu::LaunchPlan& plan, CachingAllocator& device_memory,
                       CachingAllocator& pinned_memory, cudaStream_t stream,
                       cudaEvent_t kernel_start, cudaEvent_t kernel_end, cudaEvent_t done,
                       int64_t spin_us, int64_t zero_copy_max_bytes, const Block& slot_pinned,
                       const Block& slot_device_in, const Block& slot_device_out, Batch& batch,
                       const std::vector<Piece>& pieces, bool inject_fault, LentOutputs* lent,
                       int64_t* kernel_ns, int* launches) {
  std::vector<int64_t> offsets;
  offsets.reserve(pieces.size());
  int64_t total = 0;
  for (const Piece& piece : pieces) {
    total = AlignUp(total, kStagingAlignment);
    offsets.push_back(total);
    total += StagingBytes(batch, piece);
  }
  if (static_cast<size_t>(total) <= slot_pinned.size()) {
    const Staging staging{static_cast<char*>(slot_pinned.data()),
                          static_cast<int64_t>(slot_pinned.size()),
                          static_cast<char*>(slot_device_in.data()),
                          static_cast<char*>(slot_device_out.data())};
    return RunPiecesIn(plan, device_memory, stream, kernel_start, kernel_end, done, spin_us,
                       zero_copy_max_bytes, staging, batch, pieces, offsets, total, inject_fault,
                       lent, kernel_ns, launches);
  }
  absl::Status status;
  {
    absl::StatusOr<Block> pinned = pinned_memory.Allocate(total);
    absl::StatusOr<Block> device_in =
        pinned.ok() ? device_memory.Allocate(total) : absl::StatusOr<Block>(pinned.status());
    absl::StatusOr<Block> device_out =
        device_in.ok() ? device_memory.Allocate(total) : absl::StatusOr<Block>(device_in.status());
    if (!device_out.ok()) {
      status = device_out.status();
    } else {
      const Staging staging{static_cast<char*>(pinned->data()),
                            static_cast<int64_t>(pinned->size()),
                            static_cast<char*>(device_in->data()),
                            static_cast<char*>(device_out->data())};
      status = RunPiecesIn(plan, device_memory, stream, kernel_start, kernel_end, done, spin_us,
                           zero_copy_max_bytes, staging, batch, pieces, offsets, total,
                           inject_fault, lent, kernel_ns, launches);
    }
  }  // the blocks return to the caches here...
  // ...and leave them, so that occasional huge requests do not pin host memory for good.
  pinned_memory.ReleaseCachedAbove(slot_pinned.size());
  device_memory.ReleaseCachedAbove(slot_device_in.size());
  return status;
}

// Runs the fused top K (LaunchSoftmaxTopK) of the batch's `segments` (all
// with top_k > 0), on the slot's stream: packs the inputs that are neither
// staged nor direct into pinned memory, copies them to the device unless
// they total at most `zero_copy_max_bytes` (then the kernel reads them over
// the bus, as RunPiecesIn does), launches once per dtype, and has the kernel
// write K values and indices per row straight into pinned memory, from
// which they are copied into each segment's top_k_values and top_k_indices.
// Uses the slot's staging when it fits, else blocks of the run's size.
absl::Status RunTopK(CachingAllocator& device_memory, CachingAllocator& pinned_memory,
                     cudaStream_t stream, cudaEvent_t kernel_start, cudaEvent_t kernel_end,
                     cudaEvent_t done, int64_t spin_us, int64_t zero_copy_max_bytes,
                     const Block& slot_pinned, const Block& slot_device_in, const Batch& batch,
                     const std::vector<int>& segments, int64_t* kernel_ns, int* launches) {
  const size_t count = segments.size();
  // Pinned layout: packed inputs, then each segment's values and indices.
  // Device layout (when copying): every input that is not direct.
  std::vector<int64_t> packed_offset(count, -1), device_offset(count, -1);
  std::vector<int64_t> values_offset(count), indices_offset(count);
  int64_t host_total = 0;
  int64_t device_total = 0;
  for (size_t k = 0; k < count; ++k) {
    const Segment& segment = batch.segments[segments[k]];
    if (InputDirect(segment)) continue;
    if (segment.staged == nullptr) {
      host_total = AlignUp(host_total, kStagingAlignment);
      packed_offset[k] = host_total;
      host_total += segment.bytes;
    }
    device_total = AlignUp(device_total, kStagingAlignment);
    device_offset[k] = device_total;
    device_total += segment.bytes;
  }
  for (size_t k = 0; k < count; ++k) {
    const Segment& segment = batch.segments[segments[k]];
    const int64_t answers = segment.shape.rows() * segment.top_k;
    values_offset[k] = AlignUp(host_total, kStagingAlignment);
    indices_offset[k] = AlignUp(values_offset[k] + answers * ItemSize(segment.dtype),
                                kStagingAlignment);
    host_total = indices_offset[k] + answers * static_cast<int64_t>(sizeof(int64_t));
  }
  const bool zero_copy = device_total <= zero_copy_max_bytes;
  Block own_pinned;
  Block own_device;
  char* host = static_cast<char*>(slot_pinned.data());
  if (host_total > static_cast<int64_t>(slot_pinned.size())) {
    absl::StatusOr<Block> block = pinned_memory.Allocate(host_total);
    if (!block.ok()) return block.status();
    own_pinned = std::move(*block);
    host = static_cast<char*>(own_pinned.data());
  }
  char* device = static_cast<char*>(slot_device_in.data());
  if (!zero_copy && device_total > static_cast<int64_t>(slot_device_in.size())) {
    absl::StatusOr<Block> block = device_memory.Allocate(device_total);
    if (!block.ok()) return block.status();
    own_device = std::move(*block);
    device = static_cast<char*>(own_device.data());
  }
  // Given back to the system afterwards when the slot's did not fit, as
  // RunPieces does.
  struct Release {
    CachingAllocator& pinned;
    CachingAllocator& device;
    const Block& slot_pinned;
    const Block& slot_device;
    Block& own_pinned;
    Block& own_device;
    ~Release() {
      const bool any = static_cast<bool>(own_pinned) || static_cast<bool>(own_device);
      own_pinned.Reset();
      own_device.Reset();
      if (!any) return;
      pinned.ReleaseCachedAbove(slot_pinned.size());
      device.ReleaseCachedAbove(slot_device.size());
    }
  } release{pinned_memory, device_memory, slot_pinned, slot_device_in, own_pinned, own_device};

  std::map<DType, std::vector<gpu::TopKSegment>> tables;
  for (size_t k = 0; k < count; ++k) {
    const Segment& segment = batch.segments[segments[k]];
    gpu::TopKSegment t;
    const char* host_input = segment.staged != nullptr ? static_cast<const char*>(segment.input)
                                                       : host + packed_offset[k];
    t.input = InputDirect(segment) ? segment.input
              : zero_copy          ? static_cast<const void*>(host_input)
                                   : device + device_offset[k];
    t.values = host + values_offset[k];
    t.indices = reinterpret_cast<int64_t*>(host + indices_offset[k]);
    SetRows(segment, segment.shape.outer, t);
    t.k = segment.top_k;
    tables[segment.dtype].push_back(t);
  }
  std::vector<Block> scratch;
  for (auto& [dtype, table] : tables) {
    const size_t bytes =
        gpu::SoftmaxTopKScratchBytes(dtype, table.data(), static_cast<int>(table.size()));
    absl::StatusOr<Block> block = device_memory.Allocate(bytes);
    if (!block.ok()) return block.status();
    scratch.push_back(std::move(*block));
  }
  std::vector<HostCopy> copies;
  for (size_t k = 0; k < count; ++k) {
    if (packed_offset[k] < 0) continue;
    const Segment& segment = batch.segments[segments[k]];
    copies.push_back(
        {host + packed_offset[k], static_cast<const char*>(segment.input), segment.bytes});
  }
  CopyAll(copies);

  auto enqueue_and_wait = [&]() -> absl::Status {
    if (!zero_copy) {
      for (size_t k = 0; k < count; ++k) {
        if (device_offset[k] < 0) continue;
        const Segment& segment = batch.segments[segments[k]];
        const char* source = packed_offset[k] >= 0 ? host + packed_offset[k]
                                                   : static_cast<const char*>(segment.input);
        SOFTMAX_RETURN_IF_CUDA(cudaMemcpyAsync(device + device_offset[k], source, segment.bytes,
                                               cudaMemcpyHostToDevice, stream));
      }
    }
    SOFTMAX_RETURN_IF_CUDA(cudaEventRecord(kernel_start, stream));
    size_t table_index = 0;
    for (auto& [dtype, table] : tables) {
      Block& block = scratch[table_index++];
      int kernels = 0;
      SOFTMAX_RETURN_IF_CUDA(gpu::LaunchSoftmaxTopK(dtype, table.data(),
                                                    static_cast<int>(table.size()), block.data(),
                                                    block.size(), stream, &kernels));
      *launches += kernels;
    }
    SOFTMAX_RETURN_IF_CUDA(cudaEventRecord(kernel_end, stream));
    return RecordAndWait(done, stream, spin_us);
  };
  if (absl::Status status =
          RunAndTime(enqueue_and_wait, stream, kernel_start, kernel_end, kernel_ns);
      !status.ok()) {
    return status;
  }
  for (size_t k = 0; k < count; ++k) {
    const Segment& segment = batch.segments[segments[k]];
    const int64_t answers = segment.shape.rows() * segment.top_k;
    std::memcpy(segment.top_k_values, host + values_offset[k],
                answers * ItemSize(segment.dtype));
    std::memcpy(segment.top_k_indices, host + indices_offset[k],
                answers * static_cast<int64_t>(sizeof(int64_t)));
  }
  return absl::OkStatus();
}

// Decides which outputs of a batch that runs in one piece (`pieces`) stay in
// pinned memory for their responses to reference: those of requests that
// accept it (output_view_ok) of at least `min_bytes`, while the bytes lent
// stay within `max_bytes`. Null when none does; then every output is copied
// into its response, as it is when the pinned memory cannot be had.
std::unique_ptr<LentOutputs> LendOutputs(const std::shared_ptr<PinnedLoans>& loans,
                                         const Batch& batch, const std::vector<Piece>& pieces,
                                         int64_t min_bytes, int64_t max_bytes) {
  if (max_bytes <= 0) return nullptr;
  std::vector<int> pieces_of(batch.segments.size(), 0);
  for (const Piece& piece : pieces) ++pieces_of[piece.segment];
  auto lent = std::make_unique<LentOutputs>();
  lent->segment_lent.assign(batch.segments.size(), false);
  lent->segment_offset.assign(batch.segments.size(), 0);
  bool any = false;
  for (size_t i = 0; i < batch.segments.size(); ++i) {
    const Segment& segment = batch.segments[i];
    if (segment.output_view_ok && segment.bytes >= min_bytes && pieces_of[i] == 1) {
      lent->segment_lent[i] = true;
      any = true;
    }
  }
  if (!any) return nullptr;
  int64_t total = 0;  // as RunPieces lays the run out
  for (const Piece& piece : pieces) {
    total = AlignUp(total, kStagingAlignment) + StagingBytes(batch, piece);
  }
  if (loans->bytes.fetch_add(total) + total > max_bytes) {
    loans->bytes.fetch_sub(total);
    return nullptr;
  }
  absl::StatusOr<Block> block =
      loans->memory->AllocateWithin(static_cast<size_t>(total), loans->limit_bytes);
  if (!block.ok()) {
    loans->bytes.fetch_sub(total);
    return nullptr;
  }
  auto* owned = new Block(std::move(*block));
  lent->data = static_cast<char*>(owned->data());
  lent->owner = std::shared_ptr<const void>(owned, [loans, total](const Block* b) {
    delete b;
    loans->bytes.fetch_sub(total);
  });
  return lent;
}

}  // namespace

BatchResult CudaBackend::RunBatch(Slot& slot, Batch& batch) {
  const auto start = std::chrono::steady_clock::now();
  BatchResult result;
  if (batch.submitted != std::chrono::steady_clock::time_point{}) {
    result.dispatch_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(start - batch.submitted).count();
  }
  const int64_t limit = options_.max_staging_bytes;

  std::vector<absl::Status> segment_status(batch.segments.size());
  bool any_failed = false;
  // Cut segments into pieces of whole slabs that fit the staging limit (a
  // segment that needs no staging stays whole).
  std::vector<Piece> pieces;
  std::vector<int> top_k_segments;
  for (int i = 0; i < static_cast<int>(batch.segments.size()); ++i) {
    const Segment& segment = batch.segments[i];
    if (segment.shape.elements() == 0) continue;  // empty: nothing to compute
    if (absl::Status reach = CanReach(segment); !reach.ok()) {
      segment_status[i] = reach;
      any_failed = true;
      continue;
    }
    if (segment.top_k > gpu::kMaxFusedTopK) {
      // Past the fused kernel's K: on this thread, ranked alike (the CPU
      // backend's routine), before any output is written over the input.
      if (segment.input_memory == MemoryKind::kDevice) {
        segment_status[i] = absl::FailedPreconditionError(absl::StrCat(
            "a top K of more than ", gpu::kMaxFusedTopK,
            " is computed on the host, and this tensor is in GPU memory"));
        any_failed = true;
        continue;
      }
      CpuSoftmaxTopKRows(segment.input, segment.dtype, segment.shape, segment.options,
                         segment.top_k, segment.top_k_values, segment.top_k_indices, 0,
                         segment.shape.rows());
      result.kernel_bytes +=
          segment.bytes + TopKBytes(segment.dtype, segment.shape.rows(), segment.top_k);
    } else if (segment.top_k > 0) {
      top_k_segments.push_back(i);
    }
    if (!segment.full_output) continue;
    Piece piece;
    piece.segment = i;
    piece.slab_bytes = segment.shape.n * segment.shape.inner * ItemSize(segment.dtype);
    const int64_t per_piece = InputDirect(segment) && OutputDirect(segment)
                                  ? segment.shape.outer
                                  : std::max<int64_t>(1, limit / piece.slab_bytes);
    for (int64_t o = 0; o < segment.shape.outer; o += per_piece) {
      piece.outer_begin = o;
      piece.outer_count = std::min(per_piece, segment.shape.outer - o);
      piece.bytes = piece.outer_count * piece.slab_bytes;
      pieces.push_back(piece);
    }
  }
  // Group consecutive pieces into runs that fit (a piece over the limit runs alone).
  std::vector<std::vector<Piece>> runs;
  int64_t run_bytes = 0;
  for (const Piece& piece : pieces) {
    const int64_t padded = AlignUp(StagingBytes(batch, piece), kStagingAlignment);
    if (runs.empty() || run_bytes + padded > limit) {
      runs.emplace_back();
      run_bytes = 0;
    }
    runs.back().push_back(piece);
    run_bytes += padded;
  }

  const bool inject = options_.inject_fault_after_batches > 0 &&
                      batches_run_.fetch_add(1) + 1 == options_.inject_fault_after_batches;
  State& state = *state_;
  // Outputs the responses may reference where they are computed (see
  // pinned_responses_max_bytes): only for a batch that runs in one piece.
  std::unique_ptr<LentOutputs> lent;
  if (runs.size() == 1) {
    lent = LendOutputs(state.loans, batch, runs[0], options_.pinned_response_min_bytes,
                       options_.pinned_responses_max_bytes);
  }
  // The top Ks first (an output computed in place overwrites its input), in
  // runs whose inputs fit the staging; out of memory, each alone.
  auto top_k_run = [&](const std::vector<int>& run_segments) {
    return RunTopK(*state.device_memory, *state.pinned_memory, slot.stream, slot.kernel_start,
                   slot.kernel_end, slot.done, options_.event_spin_us,
                   options_.zero_copy_max_bytes, slot.pinned, slot.device_in, batch,
                   run_segments, &result.kernel_ns, &result.launches);
  };
  std::vector<std::vector<int>> top_k_runs;
  int64_t top_k_bytes = 0;
  for (int i : top_k_segments) {
    const int64_t padded = AlignUp(batch.segments[i].bytes, kStagingAlignment);
    if (top_k_runs.empty() || top_k_bytes + padded > limit) {
      top_k_runs.emplace_back();
      top_k_bytes = 0;
    }
    top_k_runs.back().push_back(i);
    top_k_bytes += padded;
  }
  for (const std::vector<int>& top_k_segments_run : top_k_runs) {
    absl::Status status = top_k_run(top_k_segments_run);
    if (absl::IsResourceExhausted(status) && top_k_segments_run.size() > 1) {
      status = absl::OkStatus();
      for (int i : top_k_segments_run) {
        absl::Status alone = top_k_run({i});
        if (!alone.ok() && IsStickyCudaError(CudaErrorOf(alone))) {
          status = alone;
          break;
        }
        if (!alone.ok()) {
          segment_status[i] = alone;
          any_failed = true;
        }
      }
    }
    if (status.ok()) continue;
    if (IsStickyCudaError(CudaErrorOf(status))) {
      Fault(status);
      result.status = absl::InternalError(absl::StrCat("GPU fault: ", status.message()));
      result.segment_status.clear();
      return result;
    }
    for (int i : top_k_segments_run) segment_status[i] = status;
    any_failed = true;
  }
  for (int i : top_k_segments) {
    const Segment& segment = batch.segments[i];
    if (!segment_status[i].ok()) continue;
    result.kernel_bytes +=
        segment.bytes + TopKBytes(segment.dtype, segment.shape.rows(), segment.top_k);
  }

  bool lent_filled = false;
  auto run = [&](const std::vector<Piece>& run_pieces, bool fault, LentOutputs* lend) {
    return RunPieces(state.plan, *state.device_memory, *state.pinned_memory, slot.stream,
                     slot.kernel_start, slot.kernel_end, slot.done,
                     options_.event_spin_us,
                     options_.zero_copy_max_bytes, slot.pinned, slot.device_in,
                     slot.device_out, batch, run_pieces, fault, lend, &result.kernel_ns,
                     &result.launches);
  };
  for (size_t r = 0; r < runs.size(); ++r) {
    // Pieces of a request that already failed are not worth computing.
    bool needed = false;
    for (const Piece& piece : runs[r]) needed = needed || segment_status[piece.segment].ok();
    if (!needed) continue;
    absl::Status status = run(runs[r], inject && r == 0, r == 0 ? lent.get() : nullptr);
    if (status.ok()) {
      lent_filled = lent != nullptr && r == 0;
      continue;
    }
    if (IsStickyCudaError(CudaErrorOf(status))) {
      Fault(status);
      result.status = absl::InternalError(absl::StrCat("GPU fault: ", status.message()));
      result.segment_status.clear();
      return result;
    }
    if (absl::IsResourceExhausted(status)) {
      // Out of memory even after the caches were released: retry each
      // request alone so that only the ones that do not fit fail.
      std::map<int, std::vector<Piece>> by_segment;
      for (const Piece& piece : runs[r]) by_segment[piece.segment].push_back(piece);
      if (by_segment.size() > 1) {
        for (auto& [segment, segment_pieces] : by_segment) {
          absl::Status alone = run(segment_pieces, false, nullptr);
          if (!alone.ok() && IsStickyCudaError(CudaErrorOf(alone))) {
            Fault(alone);
            result.status = absl::InternalError(absl::StrCat("GPU fault: ", alone.message()));
            result.segment_status.clear();
            return result;
          }
          if (!alone.ok()) {
            segment_status[segment] = alone;
            any_failed = true;
          }
        }
        continue;
      }
    }
    for (const Piece& piece : runs[r]) segment_status[piece.segment] = status;
    any_failed = true;
  }
  for (const Piece& piece : pieces) {
    if (segment_status[piece.segment].ok()) result.kernel_bytes += 2 * piece.bytes;
  }
  // (Staged segments that were not lent are answered from their own
  // buffer, where they were computed in place, by the batcher.)
  if (lent_filled) {
    result.output_views.resize(batch.segments.size());
    for (size_t i = 0; i < batch.segments.size(); ++i) {
      if (!lent->segment_lent[i] || !segment_status[i].ok()) continue;
      OutputView& view = result.output_views[i];
      view.data = lent->data + lent->segment_offset[i];
      view.bytes = batch.segments[i].bytes;
      view.owner = lent->owner;
    }
  }
  if (any_failed) result.segment_status = std::move(segment_status);
  result.compute_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
  return result;
}

}  // namespace softmax::server
