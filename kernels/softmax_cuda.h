// Softmax and log-softmax on an NVIDIA GPU: the launch plan built once per
// device by an occupancy probe, and one launch function that runs a ragged
// batch of softmax problems ("segments") of one element type.
//
// Usable from plain C++: this header needs only cuda_runtime_api.h (for
// cudaStream_t and cudaError_t; kernels/cuda_types.h stands in for it where
// the CUDA toolkit is absent, for the planner alone). No Abseil, no gRPC.
//
// The kernel family (kernels/cuda/: one file per kernel family, plan.cc for
// the choices below), chosen per segment from its row length N (V = 16 bytes
// / element size: 4 for float32, 8 for float16/bfloat16). Each path reads and
// writes each element once, except the two-pass split and strided forms.
//
//   SoftmaxPath::kWarpRows     N <= 256 V, and
//   SoftmaxPath::kBlockRows    N <= 2048 V (names by length): rows of up to
//                              1024 V run in the flat order (a group of R
//                              threads, 2 vectors each, max first: the flat
//                              kernel for a launch of one segment, the flat
//                              table kernel in tables; flat.cuh); longer
//                              rows that the staged path does not take run
//                              row_staged (a row per block, staged in
//                              shared memory; row_staged.cuh). With
//                              allow_flat false the on-chip
//                              kernel takes them (several short rows per
//                              warp, or a row per group of 1..8 warps;
//                              on_chip.cuh).
//   SoftmaxPath::kClusterRows  2048 V < N <= 16384 V, rows the staged path
//                              does not take (not 16-byte aligned): up to
//                              8192 V row_staged, beyond a row
//                              per cluster of 2..8 blocks holding it in
//                              registers, (max, sum) pairs crossing blocks
//                              through distributed shared memory. (on_chip.cuh)
//   SoftmaxPath::kStagedRows   16-byte aligned rows of more than 1024 V, up to
//                              512 KiB, float32 also 768 KiB..1 MiB (without
//                              split_staged: up to what 16 blocks hold in
//                              shared memory, 224 KiB each).
//                              A row per cluster of 1..16 blocks, each
//                              staging its share in shared memory with
//                              cp.async copies (several stages in flight),
//                              (max, sum) exchanged through distributed shared
//                              memory; one launch per cluster size. (staged.cuh)
//                              In the 16-bit types rows of up to 3839 V run
//                              row_staged instead.
//   SoftmaxPath::kSplitRows    Longer rows, split across the blocks of a
//                              persistent cooperative grid, one pass each:
//                              aligned rows staged in the grid's shared
//                              memory in parts of 64 KiB (split_staged,
//                              SplitStagedMaxLength; staged.cuh), other rows
//                              held in its registers (split_fused,
//                              SplitSinglePassMaxLength). Longer rows:
//                              (max, sum) partials of 64 KiB parts then a
//                              re-read, two reads and one write. (split.cuh)
//   SoftmaxPath::kStrided      Softmax over a non-last axis ([outer, N, inner],
//                              inner > 1): coalesced over inner, N split
//                              across blocks; two reads and one write.
//                              (strided.cuh)
//
// Batch invariance: the kernel and geometry of a row, and so its output
// bits, follow from the plan (the GPU model), the dtype, N, inner,
// temperature, op and whether the segment is 16-byte aligned (pointers and
// row pitch), never from the other segments of a launch, the number of rows
// that share it, the stream or the scratch (kernels/cuda/plan.cc,
// RowKernelOf, holds the rule). Rows that are not 16-byte aligned give the
// same bits at any address. Bits differ across GPU models, between the CPU
// reference and the GPU, and with allow_flat false.
//
// Every path vectorises with 16-byte accesses when the segment's pointers and
// row pitch are 16-byte aligned; otherwise float32 falls back to element
// accesses and the 16-bit types to aligned granules shifted into place.
// Arithmetic is float32 (exp2 with a log2(e)/temperature prescale).
// Semantics match kernels/cpu_softmax.h: a NaN or +inf in a row, or a row of
// all -inf, gives a row of NaN.
//
// Thread-safety: a LaunchPlan is immutable after Create and may be shared by
// threads. LaunchSoftmax may be called concurrently on different streams with
// different scratch buffers.
#ifndef SOFTMAX_KERNELS_SOFTMAX_CUDA_H_
#define SOFTMAX_KERNELS_SOFTMAX_CUDA_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "kernels/cuda_types.h"
#include "kernels/dtype.h"

namespace softmax {
namespace gpu {

// Kernel variants, by row-length class (see the table above).
enum class SoftmaxPath : int {
  kWarpRows = 0,
  kBlockRows = 1,
  kClusterRows = 2,
  kSplitRows = 3,
  kStrided = 4,
  kStagedRows = 5,
};
const char* SoftmaxPathName(SoftmaxPath path);

// The kernels a launch runs (LaunchSchedule lists them with their geometry;
// the planner, kernels/cuda/plan.cc, picks them). A path is a row-length
// class; a kernel is what computes it. Which kernel computes a row fixes the
// order of its reductions, so it is chosen per row (RowKernelOf), and a
// launch only groups rows of one kernel into one grid.
//
// SOFTMAX_KERNEL_LIST(X) applies X to each kernel in the order of its
// value, 0 first: the enum, kSoftmaxKernels and the declarations of each
// kernel's executor and probe (kernels/cuda/executor.cuh) come from this one
// list. Each entry says when it wins and what it needs.
#define SOFTMAX_KERNEL_LIST(X)                                                                 \
  /* Launches of one segment of last-axis rows of up to 1024 vectors: a group                  \
     of 1..512 threads per row, 2 vectors each, max first, one exp2 per                        \
     element; few registers, full occupancy. Computes rows in the flat table                   \
     kernel's order. Needs nothing (unaligned rows: see above). */                             \
  X(kFlat)                                                                                     \
  /* Every last-axis row of up to 1024 vectors of a table, in one launch of                    \
     512-thread blocks, in the flat kernel's order. Wins for tables: one                       \
     launch, one pass of the grid. Unaligned rows pass through shared memory                   \
     so that they reduce in element order at any address. */                                   \
  X(kFlatTable)                                                                                \
  /* Rows of 8193..16384 vectors that are not 16-byte aligned: a row per                       \
     cluster of 2..8 blocks in registers, (max, sum) through distributed                       \
     shared memory. Needs clusters (sm_90). Also every register row with                       \
     allow_flat false (a test hook). */                                                        \
  X(kOnChip)                                                                                   \
  /* 16-byte aligned rows of 1025 vectors up to 512 KiB (float32: also                         \
     768 KiB..1 MiB, 16 shares of 48-64 KiB): a row per cluster of                             \
     1..16 blocks, each staging its share in shared memory with cp.async, one                  \
     read and one write. Wins from 1025 vectors (0.96-0.97 of copy against                     \
     0.91-0.95 flat on the H200). Needs 16-byte rows and clusters. Rows                        \
     whose shares fit 64 KiB run an instantiation with 4 unrolled stages                       \
     instead of 14 (StagedShortShares, from the row's own share). 16-bit                       \
     rows of 60-64 and 120-128 KiB run on 2 and 4 blocks (shares of                            \
     30-32 KiB). */                                                                            \
  X(kStaged)                                                                                   \
  /* Aligned rows beyond the staged kernel, up to what a cooperative grid                      \
     stages at once (24.75 MiB on the H200): parts of 64 KiB in shared memory,                 \
     (max, sum) through global scratch, one read. Needs a cooperative launch                   \
     and scratch. */                                                                           \
  X(kSplitStaged)                                                                              \
  /* Other long rows up to what the grid holds in registers: one pass. Needs                   \
     a cooperative launch and scratch. */                                                      \
  X(kSplitFused)                                                                               \
  /* Longer rows: (max, sum) partials of 64 KiB parts (split_stats), then a                    \
     re-read in reverse order that writes (split_normalize): two reads.                        \
     Aligned rows: a block per part, each row's partials merged once                           \
     (split_merge), a block per 32 KiB chunk. Others: grids walking the parts,                 \
     split_normalize_units merging the partials of each row it meets. */                       \
  X(kSplitStats)                                                                               \
  X(kSplitNormalize)                                                                           \
  /* inner > 1 (a non-last axis): coalesced over inner, n split across                         \
     blocks: partials (strided_stats), then a re-read (strided_normalize). */                  \
  X(kStridedStats)                                                                             \
  X(kStridedNormalize)                                                                         \
  /* inner > 1 in one pass where a tile of columns (128 bytes of each row)                     \
     over all n rows fits a cluster's shared memory (n up to 26,624 rows on                    \
     the H200): a cluster of 1..16 blocks per tile stages it, exchanges the                    \
     columns' (max, sum) through distributed shared memory and writes: one                     \
     read. Needs 16-byte pointers, rows of a multiple of 128 bytes, clusters. */               \
  X(kStridedStaged)                                                                            \
  /* Last-axis rows of 1025..8192 vectors that are not 16-byte aligned, and                    \
     aligned ones up to 3839 vectors in the 16-bit types: a row per block of                   \
     256 threads, its 16-byte granules staged in shared memory with cp.async                   \
     (no registers held while they land), read shifted into element order:                     \
     one read and one write. Wins for ragged tables (a short-lived block per                   \
     row, blocks per SM as the shares allow). Needs sm_80 and 128 KiB of                       \
     shared memory per block; without them the split path takes those rows.                    \
     Where a block may have 220 KiB (H100, H200), unaligned rows of up to                      \
     14,080 vectors too (one row per SM; e.g. float32 rows of GPT-2's 50,257                   \
     words: 0.87 of copy on the H200, 0.43 on the cluster path). A table's                     \
     rows of up to 1024 vectors join its launch where they are no more than                    \
     its row_staged rows, summed in the flat order (the flat kernels' bits). */                \
  X(kRowStaged)                                                                                \
  /* Between split_stats and split_normalize, for aligned rows: a block per row. */            \
  X(kSplitMerge)                                                                               \
  /* split_normalize of rows that are not 16-byte aligned: grids walking the                   \
     parts, merging the partials of each row they meet. */                                     \
  X(kSplitNormalizeUnits)
enum class SoftmaxKernel : int {
#define SOFTMAX_KERNEL_ENUMERATOR(K) K,
  SOFTMAX_KERNEL_LIST(SOFTMAX_KERNEL_ENUMERATOR)
#undef SOFTMAX_KERNEL_ENUMERATOR
};
// The number of SoftmaxKernel values; they run 0..kSoftmaxKernels - 1.
#define SOFTMAX_KERNEL_COUNT(K) +1
constexpr int kSoftmaxKernels = 0 SOFTMAX_KERNEL_LIST(SOFTMAX_KERNEL_COUNT);
#undef SOFTMAX_KERNEL_COUNT
const char* SoftmaxKernelName(SoftmaxKernel kernel);

// One softmax problem: a contiguous tensor viewed as [outer, n, inner],
// normalised along n. inner == 1 is the last axis.
struct SoftmaxSegment {
  const void* input = nullptr;  // device pointer, outer * n * inner elements
  void* output = nullptr;       // device pointer, same layout; may equal input
                                // only for the single-pass paths (warp, block,
                                // cluster); never overlap otherwise
  int64_t outer = 1;
  int64_t n = 1;                // 1 <= n < 2^31
  int64_t inner = 1;
  float temperature = 1.0f;     // finite, > 0 (validated by the caller)
  bool log = false;             // log-softmax instead of softmax
};

// What the occupancy probe found for one kernel (one path family, one dtype,
// one cluster size).
struct KernelProbe {
  std::string kernel;            // e.g. "on_chip<float16>"
  std::string paths;             // the SoftmaxPath values it serves
  DType dtype = DType::kFloat32;
  int threads_per_block = 0;
  int registers_per_thread = 0;
  int local_bytes_per_thread = 0;  // stack / spills; 0 expected
  int static_shared_bytes = 0;
  int blocks_per_sm = 0;         // cudaOccupancyMaxActiveBlocksPerMultiprocessor
  int cluster_size = 1;          // 1: launched without clusters
  int max_active_clusters = 0;   // cudaOccupancyMaxActiveClusters (cluster_size > 1)
  int grid = 0;                  // persistent grid used for launches
};

// Launch plan for one device: built once (it queries the device and every
// kernel's attributes), then read-only.
class LaunchPlan {
 public:
  LaunchPlan() = default;

  // Probes `device` (which becomes current on the calling thread). Returns
  // cudaSuccess and fills *plan, or the first CUDA error (the sticky error
  // state is cleared where the error is not sticky).
  static cudaError_t Create(int device, LaunchPlan* plan);

  int device() const { return device_; }
  const std::string& device_name() const { return device_name_; }
  int multiprocessors() const { return multiprocessors_; }
  int l2_bytes() const { return l2_bytes_; }
  bool clusters_supported() const { return clusters_supported_; }
  const std::vector<KernelProbe>& probes() const { return probes_; }

  // The probe entry for `family` ("on_chip", "flat.t256" and the other flat
  // block sizes, "flat_table", "row_staged", "staged", "split_fused",
  // ...: the kernel's name before "<dtype>"), dtype and cluster size, or
  // nullptr. Planning calls it several times per segment: a binary search
  // that allocates nothing.
  const KernelProbe* Find(std::string_view family, DType dtype, int cluster_size = 1) const;

  // Largest cluster size the on-chip kernel's cluster path uses on this
  // device (8, 4, 2 or 1; the staged kernel may use 16-block clusters, which
  // its probes list).
  int max_cluster_size() const { return max_cluster_size_; }

  // Multi-line human-readable table of the probe.
  std::string ToString() const;

  // Reads a ToString() table back (a plan recorded on one GPU, for planning
  // without it: tests and tools). Returns false when `text` is not one.
  static bool Parse(const std::string& text, LaunchPlan* plan);

 private:
  int device_ = -1;
  std::string device_name_;
  int multiprocessors_ = 0;
  int l2_bytes_ = 0;
  bool clusters_supported_ = false;
  int max_cluster_size_ = 1;
  std::vector<KernelProbe> probes_;
  // probes_ by (dtype, cluster size, family: the name before "<dtype>"), sorted.
  struct IndexEntry {
    int dtype;
    int cluster_size;
    int family_length;
    int probe;
  };
  std::vector<IndexEntry> index_;
  void IndexProbes();
  std::tuple<int, int, std::string_view> KeyOf(const IndexEntry& e) const;
};

// Largest last-axis row length that `path` takes for `dtype` on this plan
// (the split path: the largest n accepted). Rows longer than the warp path's
// limit go to the block path, and so on.
int64_t PathMaxLength(const LaunchPlan& plan, DType dtype, SoftmaxPath path);

// The kernels a LaunchSoftmax call with these arguments runs, comma-separated,
// in launch order, each once (SoftmaxKernelName: flat, flat_table, row_staged,
// on_chip, staged, split_staged, split_fused, split_stats, split_merge, split_normalize,
// split_normalize_units, strided_stats, strided_normalize, strided_staged);
// empty on a bad argument.
std::string LaunchKernels(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                          int count, bool allow_flat = true);

// The launches a LaunchSoftmax call with these arguments runs, one line
// each: kernel, grid, block, cluster, shared memory, table entries and
// scratch offsets (the schedule the planner returns; empty on a bad
// argument).
std::string LaunchSchedule(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                           int count, bool allow_flat = true);

// Whether a launch whose only segment has last-axis rows of n elements runs
// the flat kernel (when allowed; see LaunchSoftmax).
bool FlatKernelTakes(DType dtype, int64_t n);

// Longest last-axis row that the split path handles in one pass (each
// element read once) whatever its alignment: rows up to what the whole
// persistent grid holds in registers (split_fused). Longer rows are read
// twice, unless split_staged takes them.
int64_t SplitSinglePassMaxLength(const LaunchPlan& plan, DType dtype);

// Longest 16-byte aligned last-axis row that the split path handles in one
// pass staged in the grid's shared memory (split_staged); 0 without it.
int64_t SplitStagedMaxLength(const LaunchPlan& plan, DType dtype);

// The path LaunchSoftmax takes for `segment` of `dtype` on this plan.
SoftmaxPath ChoosePath(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& segment);

// Device scratch (bytes) that LaunchSoftmax needs for these segments; 0 when
// none. Scratch is owned by the caller and may be reused after the stream has
// passed the launch.
size_t SoftmaxScratchBytes(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                           int count);

// Enqueues softmax for `count` segments of `dtype` on `stream`. The rows of
// up to 1024 vectors (any mix of n, temperature and op) share one flat table
// launch, or the row_staged launch where they are no more than its rows;
// longer rows up to 8192 vectors that the staged path does not take
// share row_staged launches (one per number of blocks per SM their shares
// allow, longest rows first); one on-chip launch takes rows of more than 8192 vectors that are
// not 16-byte aligned; the staged segments one launch per cluster size;
// each split-row or strided segment adds a memset and one launch (two where
// its rows are read twice, three with split_merge). A launch whose only non-empty
// segment has last-axis rows of up to 1024 vectors (4096 float32, 8192
// float16) runs the flat kernel (FlatKernelTakes), which computes them in
// the flat table kernel's order. Every row's bits are those of the same row
// launched alone (see Batch invariance above). `allow_flat` false gives the
// rows of the flat and row_staged kernels to the on-chip kernel, or to the
// staged kernel where it can take them (other bits; for its tests).
// `scratch` must hold SoftmaxScratchBytes(...) bytes (may be null when that
// is 0). Returns cudaSuccess, cudaErrorInvalidValue for a bad argument (n
// out of range, null pointer, scratch too small), or the launch error.
// Asynchronous: errors during execution surface at a later sync. On
// success, `kernel_launches` (when not null) receives the number of kernels
// launched (memsets and table copies not counted).
cudaError_t LaunchSoftmax(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                          int count, void* scratch, size_t scratch_bytes, cudaStream_t stream,
                          bool allow_flat = true, int* kernel_launches = nullptr);

// ---------------------------------------------------------------------------
// The top K of softmax rows, fused (kernels/cuda/top_k.cuh): one pass over
// each row's input computes its (max, sum) and its K best elements, and
// writes only K values (softmax or log-softmax, in the dtype) and their
// int64 indices along the axis.
//
// Ranking: by the input value, exactly (temperature > 0 keeps the order of
// x / temperature, and so of the softmax), descending; equal values lower
// index first (-0 equals +0); NaN above every number, NaNs lower index first.
// The host selection (server/rpc/top_k.h) ranks the rounded outputs
// instead: where two inputs differ but round to the same output value it
// orders them by index, this ranking by their input. The values agree
// within the reference tolerance and the indices agree wherever no two
// outputs tie; a row holding a NaN or +inf is all NaN (softmax semantics),
// ranked here by its inputs (NaN first, then +inf, then the largest numbers).
//
// Batch invariance: a row's values and indices follow from its dtype, n,
// temperature and op alone (not its address, alignment, axis or the other
// segments): the indices are a total order of the row; the statistics are
// reduced in an order fixed by n (parts of the row, lanes, warps, parts).
//
// K up to kMaxFusedTopK; a larger K takes LaunchSoftmax and the host
// selection over the whole output.
constexpr int64_t kMaxFusedTopK = 64;

// One top-K problem: a contiguous tensor viewed as [outer, n, inner], ranked
// along n. Outputs are [outer, k, inner], best first.
struct TopKSegment {
  const void* input = nullptr;  // device pointer, outer * n * inner elements
  void* values = nullptr;       // device pointer, outer * k * inner elements of the dtype
  int64_t* indices = nullptr;   // device pointer, outer * k * inner indices along n
  int64_t outer = 1;
  int64_t n = 1;                // 1 <= n < 2^31
  int64_t inner = 1;
  int64_t k = 1;                // 1 <= k <= min(n, kMaxFusedTopK)
  float temperature = 1.0f;     // finite, > 0
  bool log = false;             // log-softmax values instead of softmax
};

// Device scratch (bytes) that LaunchSoftmaxTopK needs for these segments;
// 0 when none (rows of up to 16 KiB of vectors need none). Owned by the
// caller; reusable once the stream has passed the launch.
size_t SoftmaxTopKScratchBytes(DType dtype, const TopKSegment* segments, int count);

// Enqueues the top K of `count` segments of `dtype` on `stream`: a memset
// of row counters (when a row spans several blocks) and one launch per
// segment (more past 2^31 - 1 blocks). `scratch` holds
// SoftmaxTopKScratchBytes(...) bytes (may be null when 0). Returns
// cudaSuccess, cudaErrorInvalidValue for a bad argument (n or k out of
// range, null pointer, bad temperature, scratch too small), or the launch
// error; execution errors surface at a later sync. On success
// `kernel_launches` (when not null) receives the kernels launched.
cudaError_t LaunchSoftmaxTopK(DType dtype, const TopKSegment* segments, int count, void* scratch,
                              size_t scratch_bytes, cudaStream_t stream,
                              int* kernel_launches = nullptr);

}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_SOFTMAX_CUDA_H_
