// Internal to kernels/: the geometry that the kernels (kernels/cuda/*.cuh,
// *.cu) and the host planning (plan.cc, launch.cu) share. Not part of the library's API
// (kernels/softmax_cuda.h is).
//
// Path and kernel names, used the same way in code, probes, logs and docs:
//   paths (SoftmaxPath):  warp_rows, block_rows, cluster_rows, staged_rows,
//                         split_rows, strided
//   kernels (SoftmaxKernel; probes, LaunchKernels): flat, flat_table, row_staged,
//                         on_chip, staged, split_staged, split_fused, split_stats,
//                         split_merge, split_normalize, split_normalize_units,
//                         strided_stats, strided_normalize, strided_staged
#ifndef SOFTMAX_KERNELS_CUDA_PLAN_H_
#define SOFTMAX_KERNELS_CUDA_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda_types.h"
#include "kernels/dtype.h"
#include "kernels/softmax_cuda.h"

namespace softmax {
namespace gpu {
namespace detail {

// Blocks of the on-chip, split and strided kernels.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSlots = 8;         // vectors per thread: block, cluster, split paths
constexpr int kWarpSlots = 8;     // vectors per lane: warp path
constexpr int kStridedSlots = 8;  // rows per thread and batch: strided path
constexpr int kBlockVectors = kThreads * kSlots;  // vectors one block holds
constexpr int kWarpVectors = 32 * kWarpSlots;   // vectors one warp-path row holds
constexpr int kGroupWarpVectors = 32 * kSlots;  // vectors one warp of a block-path group holds
constexpr int kMaxClusterSize = 16;             // probed (and reported) up to this size
// Largest cluster the register cluster path uses: 16-block clusters measured
// no faster on the H200 (0.52-0.55 of copy at N = 262144 fp16).
constexpr int kMaxUsedClusterSize = 8;
constexpr int kInlineSegments = 64;  // on-chip table entries passed in the kernel parameters
constexpr long long kMaxPieceRows = 1LL << 30;  // on-chip segments are cut into pieces of this

// Flat table kernel: rows of <= 1024 vectors (kFlatMaxVectors) of a table,
// in the flat kernel's geometry and order, in blocks of 512 threads, two
// resident per SM (one block's loads overlap the other's reductions and
// stores). Each group holds this many rows at once, 4 vectors per thread in
// flight (4 rows spilled 60-84 bytes per thread at the 64-register cap).
constexpr int kTableThreads = 512;
constexpr int kTableBlocks = 2;
constexpr int kTableFlatRows = 2;
// Its dynamic shared memory for segments whose rows are not 16-byte
// aligned: per row, S * R + 1 granules (a row may span one granule more
// than its vectors), at most 3 per thread and row (rows of 1..2 vectors).
constexpr size_t kTableMaxSharedBytes = 16 * static_cast<size_t>(kTableFlatRows) * 3 * kTableThreads;

// row_staged kernel (kernels/cuda/row_staged.cuh): a row of 1025..8192
// vectors per block, its covering granules staged in shared memory. It
// takes the rows the staged kernel cannot (not 16-byte aligned) and, in the
// 16-bit types, aligned rows up to kRowStagedAlignedMaxVectors but those of
// 60-64 KiB (kStagedSmallShareMinBytes, below). H200, against
// the staged kernel there: ragged mixes of 64 half tensors 1.12-1.21x (24
// tensors of up to 65,536 columns 0.96-0.97x), sweep N = 16384-32768
// 0.99-1.01x; float32 32768 x 8192 0.98x (it keeps the staged kernel), half
// 4096 x 65536 0.84x (one 128 KiB share per SM).
constexpr long long kRowStagedMaxVectors = 8192;
constexpr long long kRowStagedAlignedMaxVectors = 4096;
constexpr int kRowStagedThreads = 256;
// 48 registers (no spills), 5 blocks per SM: H100, half and bfloat16 ragged
// tables 1.00-1.06x (the benchmark's mix 1.02-1.04x) against 4 blocks at 52
// registers; 6 blocks (40 registers) ran the half mixes 0.90-0.98x,
// 512-thread blocks 0.84-1.04x.
constexpr int kRowStagedMinBlocks = 5;
// Shared memory of one SM that row_staged blocks share (the H100's and
// H200's 228 KiB, less 1 KiB per block that the driver reserves): rows go
// into one launch per number of blocks per SM their share allows. Only
// which launch takes a row depends on it, never its bits.
constexpr long long kRowStagedSmBytes = 228 * 1024;
constexpr long long kRowStagedBlockReserve = 1024;
// Its share: the row's vectors and the two granules a row may straddle.
inline size_t RowStagedShareBytes(long long vectors) {
  return static_cast<size_t>((vectors + 2) * 16 + 127) & ~static_cast<size_t>(127);
}
constexpr size_t kRowStagedMaxShareBytes =
    ((static_cast<size_t>(kRowStagedMaxVectors) + 2) * 16 + 127) & ~static_cast<size_t>(127);
// Rows that the staged kernel cannot take (not 16-byte aligned) take
// row_staged up to this many vectors, one 220 KiB share per SM, where a
// block may have that much shared memory (the "row_staged.long" probe: the
// H100's and H200's 227 KiB; elsewhere they stay on the cluster path).
// H200: fp32 4096 x 50257 0.87 of copy (0.43 on the cluster path), fp16
// 2048 x 100003 0.74 (0.30).
constexpr long long kRowStagedLongMaxVectors = 14080;
constexpr size_t kRowStagedLongMaxShareBytes =
    ((static_cast<size_t>(kRowStagedLongMaxVectors) + 2) * 16 + 127) & ~static_cast<size_t>(127);

// Flat kernel: one-segment launches of rows of up to 1024 vectors, 2 per
// thread. Longer aligned rows of such launches go to the staged kernel: H200,
// M x N = 2^28, N = 2048-4096 vectors: 0.96-0.97 of copy against 0.91-0.95 flat.
constexpr long long kFlatMaxVectors = 1024;
constexpr int kFlatSlots = 2;
// Block size of the flat kernel for rows of <= 64 vectors (groups of <= 32
// threads, several rows per block; short blocks, up to 32 per SM): H200,
// M x N = 2^28, float32 N = 32-128 and half N = 32-512: 1.016-1.025x over
// 256 threads (0.997-1.012 of copy); 128 threads 0.996-1.002x of 64.
constexpr int kFlatSmallRowThreads = 64;

// Staged kernels (kernels/cuda/staged.cuh): a row per cluster of 1..16
// blocks (staged) or per group of blocks of a cooperative grid
// (split_staged), each block's share staged in shared memory by per-thread
// async copies.
constexpr int kStagedThreads = 256;
// A stage (one cp.async commit group per thread) is 1024 vectors (16 KiB;
// the last one of a share may be shorter): 4 per thread, reduced as soon as
// it lands.
constexpr int kStagedStageVectors = 1024;
constexpr int kStagedMaxStages = 14;  // 224 KiB / 16 KiB
// Shares of up to this size let 3 blocks share an SM; the cluster grows
// (up to the largest the probe found) before a share exceeds it. H200, one
// run, geometric mean over 16 staged points: 0.884 of copy at 64 KiB, 0.850
// at 128 KiB, 0.807 at 32 KiB (fp32 N = 65536: 0.944 / 0.915 / 0.845).
constexpr long long kStagedTargetBytes = 65536;
// 16-bit rows whose shares on a cluster of 2 or 4 blocks would be
// kStagedSmallShareMinBytes..kStagedSmallShareMaxBytes (rows of 60-64 and
// 120-128 KiB) take that cluster (4 blocks per SM by registers), instead of
// row_staged (a 60-64 KiB row per block) or 2 blocks of 60-64 KiB (3 per SM
// by shared memory). H200, half and bf16: 64 KiB rows on 2 blocks 1.015-1.017x
// over row_staged (0.98 of copy), 60-62 KiB 1.015-1.019x; 4 blocks against 2:
// 128 KiB 1.017x, 120 KiB 1.008x, 112 KiB 0.99x, 96 KiB 0.92x, 80 KiB 0.82x.
constexpr long long kStagedSmallShareMinBytes = 30 * 1024;
constexpr long long kStagedSmallShareMaxBytes = 32 * 1024;
// The staged kernel's instantiation for launches whose shares all fit
// kStagedTargetBytes (StagedShortShares): its stage loops unrolled 4 times
// instead of 14, 3,088 SASS instructions instead of 9,432 in half (the same
// arithmetic per stage, so the same bits). H200, against 14: half and bf16
// 1024 x 262144 1.02-1.035x (0.967 of copy), float32 1.008x; float32 on
// one-block clusters 0.97x at 32768 x 8192 (48 registers instead of 70 let
// 5 blocks of 32 KiB shares share an SM), so those keep 14.
constexpr int kStagedShortStages = static_cast<int>(kStagedTargetBytes / (kStagedStageVectors * 16));
// Largest share (dynamic shared memory) a block stages: the 227 KiB opt-in
// limit less the static barriers and slots.
constexpr long long kStagedMaxBytes = 224 * 1024;
// Longest row the staged path takes when split_staged is there to take
// longer ones (rows that would need 16-block clusters). H200, one run:
// rows from 256 KiB or 128 KiB on split_staged were 3-24% slower.
constexpr long long kStagedMaxRowBytes = 512 * 1024;
// float32 rows of kStagedLongMinRowBytes..kStagedLongMaxRowBytes take the
// staged path too, where 16-block clusters hold them in shares of 48-64 KiB.
// H200, one run, against split_staged: fp32 N = 262144 (1 MiB rows) 1.115x
// (0.97 of copy), 768 KiB rows 1.03x, 640 KiB (40 KiB shares) 0.93x; half
// rows of 1 MiB 0.94x (they stay on split_staged).
constexpr long long kStagedLongMinRowBytes = 768 * 1024;
constexpr long long kStagedLongMaxRowBytes = 1024 * 1024;
// split_staged: parts of at most kSplitStagedStages stages (64 KiB), 3
// blocks per SM. H200, fp32 N = 2^20: 3,321 GB/s against 3,263 with two
// 32 KiB buffers per block (the next part landing while one is written),
// and 3,057 with an L2 prefetch of the next part while waiting.
constexpr int kSplitStagedStages = 4;
constexpr long long kSplitStagedPartBytes = kSplitStagedStages * kStagedStageVectors * 16LL;
constexpr int kSplitStagedBlocks = 3;
// split_stats: parts of this many blocks' worth of vectors
// (64 KiB), whatever the number of rows, so that a row's partials do not
// depend on the rest of its launch.
constexpr long long kSplitPartChunks = 2;
// split_stats: registers for 4 blocks per SM (half types 64 instead of 87,
// fp32 57 instead of 70: more loads in flight). H200, 16 x 2^24: fp16
// 1.04x, bf16 1.05x, fp32 1.00x.
constexpr int kSplitStatsBlocks = 4;
static_assert(kStagedMaxStages * kStagedStageVectors * 16LL >= kStagedMaxBytes &&
                  kStagedStageVectors % kStagedThreads == 0,
              "stages cover the largest share, whole vectors per thread");

// Strided path: a unit's fixed cost (its first loads' latency, its part's
// merge), in rows of its part, when StridedShapeOf weighs parts against
// waves. H200, dim 0 of [65536, 4096] fp32: 13 parts of 32 strips ran 416
// units on a 396-block grid, the last wave nearly empty.
constexpr long long kStridedUnitRows = 64;
// strided_stats: partials a column's last block loads at once before merging
// them in order (the merge of a column's parts is one block's serial chain).
constexpr int kStridedMergeBatch = 8;

// strided_staged: a tile is this many 16-byte vectors of each row (128
// bytes: whole DRAM sectors), over all n rows, staged by a cluster of up to
// 16 blocks with shares of at most kStridedStagedMaxBytes (the rest of the
// opt-in limit holds the warps' and the cluster's column pairs). The cluster
// grows until a share is at most kStagedTargetBytes. H200, dim 0 of
// [4096, 65536]: 64 KiB shares 3,242 GB/s fp32 and 2,787 half, 32 KiB
// shares 2,478 and 1,574; shares landing in 4 commit groups, each group's
// max taken as it lands, 3,231 and 2,471.
constexpr int kStridedTileVectors = 8;
constexpr long long kStridedStagedMaxBytes = 208 * 1024;
// float32 tiles of kStridedWideTileVectors (256 bytes of each row) where
// inner allows them and the tile fits a cluster of at most
// kStridedWideMaxCluster blocks with shares of at most kStagedTargetBytes
// (columns of up to 2,048 rows). H200, dim 0 of float32 [512..2048, x]:
// 1.03-1.14x (0.88-0.94 of copy); 16-block clusters and half lost.
constexpr int kStridedWideTileVectors = 16;
constexpr int kStridedWideMaxCluster = 8;
// The warps' and the cluster's column pairs of a tile of `tile_vectors`.
constexpr size_t StridedStagedSlotBytes(int tile_vectors) {
  return static_cast<size_t>(kStagedThreads / 32 + kMaxClusterSize) * tile_vectors * 8 * 8;
}
constexpr size_t kStridedStagedSlotBytes = StridedStagedSlotBytes(kStridedTileVectors);

constexpr double kLog2e = 1.4426950408889634074;

// On-chip kernel: the config word of a table entry.
enum Config : int {
  kPathMask = 0xf,     // SoftmaxPath
  kLogBit = 1 << 4,    // log-softmax
  kVecBit = 1 << 5,    // 16-byte accesses
  kFlatOrderBit = 1 << 6,  // row_staged: a flat row, summed in the flat order (shape bits: log2 R)
  kShapeShift = 8,     // log2 of: lanes per row (warp path), warps per row
                       // (block path), blocks per row (cluster path), threads
                       // per row (flat table kernel)
  kColumnsShift = 12,  // log2 of vectors per lane per row (warp path)
};

// One segment of the table of the on-chip, flat table, row_staged and staged
// kernels (48 bytes). The host splits segments so that rows < 2^30: loop
// indices are 32-bit.
struct RowSegment {
  const void* input;
  void* output;
  int rows;
  int units;         // work units of this segment
  int n;
  int first_worker;  // on_chip: the worker that takes unit 0 (rotates across
                     // segments); flat_table: the segment's first unit;
                     // row_staged, staged: its first row in the launch
  float scale;       // log2(e) / temperature
  int config;        // Config bits
  int unused[2];
};
static_assert(sizeof(RowSegment) == 48, "RowSegment layout");

// Kernel argument of the table kernels (on-chip, flat table, row_staged,
// staged): the table travels
// inline (<= kInlineSegments entries, no copy) or in device memory.
struct TableArgs {
  const RowSegment* table;  // null: use inline_segments
  int count;
  int launch_cluster;  // on_chip: cluster size of this launch (1: none);
                       // flat_table: the table's total units
  int prefetch_units = 0;  // flat_table: a unit asks L2 for the unit this far ahead
  RowSegment inline_segments[kInlineSegments];
};

// Kernel arguments of the flat, split and strided kernels (the table
// kernels take TableArgs). Built by the planner (PlanSchedule); the split and
// strided scratch pointers are filled in by the executor from the step's
// scratch offsets.
struct FlatArgs {
  const void* input;
  void* output;
  long long rows;
  long long n;
  float scale;
  int group_log2;
};

// Split rows (last axis, rows too long for a cluster): a row of `vectors`
// vectors is cut into `parts` parts of part_vectors; unit = (row, part).
struct SplitArgs {
  const void* input;
  void* output;
  long long rows;
  long long n;
  long long part_vectors;  // multiple of kBlockVectors
  int parts;
  float scale;
  int log;
  int vec;
  float2* partials;         // rows * parts
  float2* totals;           // rows: (max, sum) per row (split_merge -> split_normalize)
  unsigned int* counters;   // rows: parts counted in (split_fused, split_staged); zeroed first
};

// Strided: softmax along n of [outer, n, inner], inner > 1 (strided.cuh).
struct StridedArgs {
  const void* input;
  void* output;
  long long outer;
  long long n;
  long long inner;
  long long strips;
  long long part_rows;  // multiple of rows per block pass
  int parts;
  int lanes_log2;
  float scale;
  int log;
  int vec;                // inner % V == 0 and pointers 16-byte aligned
  int tile_vectors;       // strided_staged: 16-byte vectors of each row in a tile
  float2* partials;       // [outer * strips * parts][32 * V]
  float2* finals;         // [outer * strips][32 * V]
  unsigned int* counters; // [outer * strips]
};

// The staged kernel's table entry keeps its vectors per block in this slot
// of `unused`.
constexpr int kStagedChunkSlot = 0;

// Rows each lane holds at once in the on-chip warp path, by log2 of vectors
// per lane per row (matches the WarpRows instantiations in OnChipKernel).
constexpr int WarpRowsPerLane(int columns_log2, int slots = kWarpSlots) {
  return slots >> columns_log2;
}

inline int CeilLog2(long long x) {
  int l = 0;
  while ((1LL << l) < x) ++l;
  return l;
}
inline long long CeilDiv(long long a, long long b) { return (a + b - 1) / b; }
inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
inline size_t Align256(size_t x) { return (x + 255) & ~static_cast<size_t>(255); }
inline bool Empty(const SoftmaxSegment& s) { return s.outer == 0 || s.inner == 0 || s.n == 0; }
inline int Vectors(DType dtype) { return 16 / ItemSize(dtype); }  // elements per 16-byte vector
// The kernels' exponent prescale: exp(x / t) = exp2(x * log2(e) / t).
inline float Log2Scale(const SoftmaxSegment& s) {
  return static_cast<float>(kLog2e / static_cast<double>(s.temperature));
}
// Whether a last-axis segment allows 16-byte accesses to every row.
inline bool VectorAligned(DType dtype, const SoftmaxSegment& s) {
  return Aligned16(s.input) && Aligned16(s.output) && (s.n * ItemSize(dtype)) % 16 == 0;
}

// Grid of `kernel` (a probe name) from the plan, or one block per SM.
int GridOf(const LaunchPlan& plan, std::string_view kernel, DType dtype, int cluster = 1);

// Flat kernel: block size and group size for rows of `vectors`.
struct FlatShape {
  int threads;     // block size: kFlatSmallRowThreads for groups of <= 32 threads, else the group
  int group_log2;  // log2 of the threads holding a row
};
FlatShape FlatShapeOf(long long vectors);
std::string FlatProbeName(int threads);  // "flat" + block size, e.g. "flat.t256"

// The one non-empty segment of a launch that the flat kernel takes, or null.
// The flat kernel computes each row in the order the flat table kernel gives
// rows of <= 1024 vectors (RowKernelOf): which of the two runs is a matter of
// speed, never of bits.
const SoftmaxSegment* FlatSegment(DType dtype, const SoftmaxSegment* segments, int count,
                                  bool allow_flat);

// The kernel that computes the rows of a segment, and so the order of every
// reduction over a row (RowKernelOf in plan.cc holds the rule). One of
// kFlat (rows of <= 1024 vectors in the flat order: the flat kernel for a
// launch of one segment, the flat table kernel or row_staged's flat rows in
// tables), kRowStaged, kStaged, kOnChip (its cluster path), kSplitStaged,
// kSplitFused, kSplitStats (the two-pass split form: split_stats, then
// split_merge and split_normalize, or split_normalize_units), kStridedStaged
// and kStridedStats (strided_stats, then strided_normalize).
SoftmaxKernel RowKernelOf(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& segment);

// Which of LaunchStep's argument sets a kernel takes: the executor passes
// it (ExecuteStep<K, T>, executor.cuh), the log prints it and schedule_test keys
// rows by it.
enum class StepArgs {
  kFlat,     // LaunchStep::flat
  kTable,    // LaunchStep::table (TableArgs); launches of other segments may overlap each other
  kSplit,    // LaunchStep::split, scratch offsets resolved
  kStrided,  // LaunchStep::strided, scratch offsets resolved
};

struct LaunchStep;

// A kernel family's descriptor, one per SoftmaxKernel value (KernelInfoOf),
// in enum order; with its RowFamilies() entries (which rows it takes), its
// ProbeOrder() entries and its executor and probe (ExecuteStep<K, T> and
// ProbeFamily<K, T>, defined in its family's .cu), all the planner and
// the executor know of it: its name (probes, logs, LaunchKernels), its
// arguments, the first pass of its form (itself for a one-pass kernel; a
// later pass right after a pass of the same form overlaps its tail) and,
// for a kernel that plans each segment's launches alone (split, strided:
// the first pass of its form), the function that appends them, taking
// scratch from *offset on. Table kernels (null there) share launches;
// PlanSchedule builds their tables.
struct KernelInfo {
  SoftmaxKernel kernel;
  const char* name;
  StepArgs args;
  SoftmaxKernel first_pass;
  void (*segment_steps)(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& segment,
                        size_t* offset, std::vector<LaunchStep>* steps);
  bool table() const { return args == StepArgs::kTable; }
};
const KernelInfo& KernelInfoOf(SoftmaxKernel kernel);

// The rule as a registry: one entry per kernel family (a family may stand
// twice, at two precedences), each with the probe it needs in the plan (for
// the row's dtype; nullptr: none, or its shape rule asks the plan itself)
// and its shape rule (dtypes, alignment, lengths, inner). RowKernelOf gives
// a row to the first entry whose probe the plan holds and whose rule takes
// it; a new family is an entry here at its precedence, its KernelInfo, its
// ProbeOrder() entry and its family's .cu (executor.cuh; kernels/README.md
// lists the files).
struct RowFamily {
  SoftmaxKernel kernel;
  const char* probe;
  bool (*takes)(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& segment);
};
const std::vector<RowFamily>& RowFamilies();

// The plan's probes in the order LaunchPlan::Create takes them, for each
// dtype (launch.cu; the plan prints its lines in this order): each entry
// calls its kernel's ProbeFamily (its family's .cu) with its part, so that a
// family may probe at two places. The on-chip kernel's block comes first,
// its clusters (part 1) before the other cluster kernels, and they bound
// the plan's cluster size. A kernel that needs no probe has no entry.
struct ProbeCall {
  SoftmaxKernel kernel;
  int part;
};
const std::vector<ProbeCall>& ProbeOrder();

// Cluster path (registers): log2 of the blocks per row.
int ClusterLog2(long long vectors);

// Staged path: blocks per row (a power of two) and vectors per block.
struct StagedShape {
  int cluster;
  int chunk_vectors;
  size_t shared_bytes;  // dynamic shared memory per block
};
// Returns false when the plan cannot stage rows of `vectors` vectors.
bool StagedShapeOf(const LaunchPlan& plan, DType dtype, long long vectors, StagedShape* shape);

// Split path: parts of a row and which kernel takes them.
struct SplitShape {
  long long part_vectors;
  int parts;
  bool fused;   // single pass (split_fused): parts of one block each, parts <= grid
  bool staged;  // single pass (split_staged): aligned rows, parts staged in shared memory
  int grid;     // split_staged: blocks of the cooperative launch, a multiple of parts
};
SplitShape SplitShapeOf(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s);

// The cluster (2 or 4) that gives a 16-bit row of `row_bytes` shares of
// kStagedSmallShareMinBytes..kStagedSmallShareMaxBytes; 0 for other rows.
int StagedSmallShareCluster(DType dtype, long long row_bytes);

// Whether a staged row on `cluster`-block clusters with a share of
// `shared_bytes` runs the kStagedShortStages instantiation. A function of
// the row alone: a staged launch holds only rows of one answer.
bool StagedShortShares(DType dtype, int cluster, size_t shared_bytes);

// Strided path: lanes per column group, column strips, and parts of n.
struct StridedShape {
  int lanes_log2;
  long long strips;
  long long part_rows;
  int parts;
};
StridedShape StridedShapeOf(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s);

// strided_staged: blocks per tile (a power of two), rows per block, tiles
// per outer slice. Returns false where the kernel does not take `s`.
struct StridedStagedShape {
  int cluster;
  int tile_vectors;     // 16-byte vectors of each row: kStridedTileVectors or kStridedWideTileVectors
  long long part_rows;  // a multiple of the block's rows per pass (256 / tile_vectors)
  long long tiles;
  size_t shared_bytes;  // dynamic: the share and the column pairs
};
bool StridedStagedShapeOf(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s,
                          StridedStagedShape* shape);

// Rows of a staged table entry: whole launches of 16-block clusters stay
// within 2^31 - 1 blocks.
constexpr long long kStagedPieceRows = 0x7fffffffLL / kMaxClusterSize;

// Entries a segment may take in the tables of the flat table, row_staged,
// on-chip and staged kernels (at most; 0 for split and strided segments).
// The launch's table area in the scratch holds them all when they exceed
// kInlineSegments.
size_t TableEntries(SoftmaxKernel kernel, const SoftmaxSegment& s);

// Scratch of one split or strided segment, in this order, each region
// 256-byte aligned: (max, sum) partials, finals, and counters (zeroed before
// the segment's first launch).
struct ScratchLayout {
  size_t partials;
  size_t finals;
  size_t counters;
  size_t Total() const { return Align256(partials) + Align256(finals) + Align256(counters); }
};
ScratchLayout SplitScratch(const SplitShape& shape, long long outer);
ScratchLayout StridedScratch(DType dtype, const StridedShape& shape, long long outer);

// Scratch bytes of one split or two-pass strided segment (0 for the others).
size_t SegmentScratch(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s,
                      SoftmaxPath path);

// One launch of a schedule: the kernel, its geometry and its arguments.
// The planner (PlanSchedule) fills every field; the executor (launch.cu)
// only resolves scratch offsets into pointers and launches.
struct LaunchStep {
  SoftmaxKernel kernel = SoftmaxKernel::kFlat;
  unsigned grid = 0;
  int threads = 0;
  int cluster = 0;           // cluster dimension attribute; 0: launched without one
  size_t shared_bytes = 0;   // dynamic shared memory per block
  bool cooperative = false;  // every block resident at once (split_staged, split_fused)
  bool vec = false;          // flat, split, strided: 16-byte accesses
  bool log = false;          // flat: log-softmax
  bool short_shares = false; // staged: kStagedShortStages instantiation (StagedShortShares)
  // flat_table, row_staged, on_chip, staged: the table. It travels in the kernel
  // parameters up to kInlineSegments entries, else in the scratch's table
  // area (Schedule::table_bytes), copied there just before this launch.
  std::vector<RowSegment> table;
  int table_word = 0;      // TableArgs::launch_cluster (flat_table: units; on_chip: cluster)
  int prefetch_units = 0;  // TableArgs::prefetch_units
  FlatArgs flat = {};
  SplitArgs split = {};      // partials and counters: the offsets below
  StridedArgs strided = {};  // likewise
  size_t partials_offset = 0;
  size_t finals_offset = 0;
  size_t counters_offset = 0;
  size_t zero_bytes = 0;  // counters zeroed (one memset) before this launch
  // Launched as a programmatic dependent of the step before: its blocks
  // start as that launch's blocks drain (DependentsMayStart, WaitForPrevious
  // in common.cuh). Table launches (flat_table, row_staged, on_chip or staged
  // after one of them, this table inline) wait for it to complete before they exit; a later pass
  // (split_merge after split_stats, split_normalize after split_merge or
  // split_stats, strided_normalize after strided_stats) waits before it reads what the
  // pass before wrote. Either
  // way it completes after the step before, so stream order holds.
  bool overlap_previous = false;
  // The table goes through the scratch's table area (too long to travel
  // inline): the one rule the executor, the overlap rule and the log read.
  bool TableInScratch() const { return table.size() > static_cast<size_t>(kInlineSegments); }
};

// What a LaunchSoftmax call runs, in order. A value: planning needs no
// device (a LaunchPlan recorded on one, LaunchPlan::Parse, will do), and
// the same arguments always give the same schedule.
struct Schedule {
  std::vector<LaunchStep> steps;
  // Scratch bytes at offset 0 for the tables that do not travel inline; 0
  // where every one does. Reserved for all the launch's table entries
  // (SoftmaxScratchBytes reckons it without planning the launches), so it
  // may exceed the largest table copied there.
  size_t table_bytes = 0;
  size_t scratch_bytes = 0;  // scratch the launch needs (SoftmaxScratchBytes)
  std::string Kernels() const;   // the kernels' names in launch order, once each
  std::string ToString() const;  // one line per launch
};

// Plans a launch of `count` segments (the rule of RowKernelOf per segment,
// then the launches that run them). Returns cudaErrorInvalidValue where a
// segment cannot be planned (a staged row the plan cannot stage).
cudaError_t PlanSchedule(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                         int count, bool allow_flat, Schedule* schedule);

// Implemented in launch.cu: appends the probes of every kernel for `dtype`
// (ProbeOrder) and lowers *max_cluster to the largest cluster size the
// on-chip kernel can launch.
cudaError_t ProbeKernels(DType dtype, int multiprocessors, bool clusters,
                         std::vector<KernelProbe>* probes, int* max_cluster);

}  // namespace detail
}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_CUDA_PLAN_H_
