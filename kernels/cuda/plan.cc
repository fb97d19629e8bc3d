// Host-side planning: the launch plan (occupancy probe), the rule that
// decides which kernel computes a row (RowKernelOf), the geometry of each
// kernel, and the schedule of a launch (PlanSchedule: every launch, its
// geometry, arguments and scratch offsets). No kernel lives here: each
// family's .cu owns its own, and launch.cu only probes them and executes
// schedules.
#include "kernels/cuda/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string_view>
#include <tuple>
#include <utility>

namespace softmax {
namespace gpu {
namespace detail {

int GridOf(const LaunchPlan& plan, std::string_view kernel, DType dtype, int cluster) {
  const KernelProbe* probe = plan.Find(kernel, dtype, cluster);
  return probe != nullptr ? probe->grid : plan.multiprocessors();
}

FlatShape FlatShapeOf(long long vectors) {
  const int group_log2 = CeilLog2(CeilDiv(vectors, kFlatSlots));
  const int threads = group_log2 <= 5 ? kFlatSmallRowThreads : std::max(64, 1 << group_log2);
  return {threads, group_log2};
}

std::string FlatProbeName(int threads) { return "flat.t" + std::to_string(threads); }

const SoftmaxSegment* FlatSegment(DType dtype, const SoftmaxSegment* segments, int count,
                                  bool allow_flat) {
  if (!allow_flat) return nullptr;
  const SoftmaxSegment* only = nullptr;
  for (int i = 0; i < count; ++i) {
    if (Empty(segments[i])) continue;
    if (only != nullptr) return nullptr;
    only = &segments[i];
  }
  if (only == nullptr || only->inner != 1) return nullptr;
  if (CeilDiv(only->n, Vectors(dtype)) > kFlatMaxVectors) return nullptr;
  return only;
}

int ClusterLog2(long long vectors) { return CeilLog2(CeilDiv(vectors, kBlockVectors)); }

bool StagedShapeOf(const LaunchPlan& plan, DType dtype, long long vectors, StagedShape* shape) {
  // Largest cluster the probe could launch at the largest share.
  int largest = 0;
  for (int c = 1; c <= kMaxClusterSize; c *= 2) {
    const KernelProbe* p = plan.Find("staged", dtype, c);
    if (p != nullptr && p->max_active_clusters > 0) largest = c;
  }
  if (largest == 0) return false;
  // Longer rows go to split_staged where the plan has it, but for float32
  // rows of 768 KiB..1 MiB that shares of at most kStagedTargetBytes hold.
  const long long row_bytes = vectors * 16;
  const bool beyond = row_bytes > kStagedMaxRowBytes && plan.Find("split_staged", dtype) != nullptr;
  const bool long_float32 = dtype == DType::kFloat32 && row_bytes >= kStagedLongMinRowBytes &&
                            row_bytes <= kStagedLongMaxRowBytes;
  if (beyond && !long_float32) return false;
  int cluster = 1;
  while (cluster < largest && CeilDiv(vectors, cluster) * 16 > kStagedTargetBytes) cluster *= 2;
  const int small = StagedSmallShareCluster(dtype, row_bytes);
  if (small > 0 && small <= largest) cluster = small;
  const long long chunk = CeilDiv(vectors, cluster);
  if (chunk * 16 > kStagedMaxBytes || (beyond && chunk * 16 > kStagedTargetBytes)) return false;
  shape->cluster = cluster;
  shape->chunk_vectors = static_cast<int>(chunk);
  shape->shared_bytes = static_cast<size_t>(chunk) * 16;
  return true;
}

int StagedSmallShareCluster(DType dtype, long long row_bytes) {
  if (ItemSize(dtype) != 2) return 0;
  for (int cluster : {2, 4}) {
    if (row_bytes >= cluster * kStagedSmallShareMinBytes &&
        row_bytes <= cluster * kStagedSmallShareMaxBytes) {
      return cluster;
    }
  }
  return 0;
}

bool StagedShortShares(DType dtype, int cluster, size_t shared_bytes) {
  return shared_bytes <= static_cast<size_t>(kStagedTargetBytes) &&
         (dtype != DType::kFloat32 || cluster > 1);
}

SplitShape SplitShapeOf(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s) {
  const long long vectors = CeilDiv(s.n, Vectors(dtype));
  if (VectorAligned(dtype, s)) {
    // Parts of at most kSplitStagedPartBytes, as even as whole vectors allow.
    const KernelProbe* probe = plan.Find("split_staged", dtype);
    const long long parts = CeilDiv(vectors * 16, kSplitStagedPartBytes);
    if (probe != nullptr && parts <= probe->grid) {
      const long long steps_rows = std::min<long long>(s.outer, probe->grid / parts);
      return {CeilDiv(vectors, parts), static_cast<int>(parts), false, true,
              static_cast<int>(steps_rows * parts)};
    }
  }
  const long long chunks = CeilDiv(vectors, kBlockVectors);
  if (chunks <= GridOf(plan, "split_fused", dtype)) {
    return {kBlockVectors, static_cast<int>(chunks), true, false, 0};
  }
  // Parts of a fixed size: a row's partials, and the order they merge in,
  // never depend on how many rows share the launch.
  const long long part_vectors = kSplitPartChunks * kBlockVectors;
  return {part_vectors, static_cast<int>(CeilDiv(vectors, part_vectors)), false, false, 0};
}

StridedShape StridedShapeOf(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s) {
  const int v = Vectors(dtype);
  StridedShape shape;
  shape.lanes_log2 = std::min(5, CeilLog2(CeilDiv(s.inner, v)));
  const long long strip_columns = (1LL << shape.lanes_log2) * v;
  shape.strips = CeilDiv(s.inner, strip_columns);
  const long long rows_per_pass = kWarps * (32 >> shape.lanes_log2);
  // Parts of n from the plan, n and inner only (as if outer were 1): a
  // column's partials never depend on how many outer slices share the launch.
  // The parts that finish soonest: waves of units (strips x parts) on the
  // grid times a unit's rows, plus its fixed cost. A last wave of a few long
  // units would double a pass.
  const long long grid = GridOf(plan, "strided_stats", dtype);
  const long long max_parts = std::min(CeilDiv(s.n, rows_per_pass), 4 * grid);
  long long parts = 1;
  long long best = -1;
  for (long long p = 1; p <= max_parts; ++p) {
    const long long part_rows = CeilDiv(CeilDiv(s.n, p), rows_per_pass) * rows_per_pass;
    const long long cost =
        CeilDiv(shape.strips * CeilDiv(s.n, part_rows), grid) * (part_rows + kStridedUnitRows);
    if (best < 0 || cost < best) {
      best = cost;
      parts = p;
    }
  }
  shape.part_rows = CeilDiv(CeilDiv(s.n, parts), rows_per_pass) * rows_per_pass;
  shape.parts = static_cast<int>(CeilDiv(s.n, shape.part_rows));
  return shape;
}

bool StridedStagedShapeOf(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s,
                          StridedStagedShape* shape) {
  if (s.inner <= 1 || !Aligned16(s.input) || !Aligned16(s.output)) return false;
  // Largest cluster the probe could launch at the largest share.
  int largest = 0;
  for (int c = 1; c <= kMaxClusterSize; c *= 2) {
    const KernelProbe* p = plan.Find("strided_staged", dtype, c);
    if (p != nullptr && p->max_active_clusters > 0) largest = c;
  }
  if (largest == 0) return false;
  const long long inner_bytes = s.inner * static_cast<long long>(ItemSize(dtype));
  // Wide tiles first (float32 only); n, inner and the dtype alone decide the
  // tile, and with it the order of every reduction.
  for (const int l : {kStridedWideTileVectors, kStridedTileVectors}) {
    const bool wide = l == kStridedWideTileVectors;
    const long long row_bytes = l * 16LL;
    if (inner_bytes % row_bytes != 0 || (wide && dtype != DType::kFloat32)) continue;
    const long long pass = kStagedThreads / l;
    int cluster = 1;
    while (cluster < largest && CeilDiv(s.n, cluster) * row_bytes > kStagedTargetBytes) cluster *= 2;
    const long long part_rows = CeilDiv(CeilDiv(s.n, cluster), pass) * pass;
    if (wide && (cluster > kStridedWideMaxCluster || part_rows * row_bytes > kStagedTargetBytes)) {
      continue;
    }
    if (part_rows * row_bytes > kStridedStagedMaxBytes) return false;
    const long long tiles = inner_bytes / row_bytes;
    // The columns alone decide: launches take whole outer slices up to
    // 2^31 - 1 blocks each (StridedStagedSteps).
    if (tiles * cluster > 0x7fffffffLL) return false;
    const size_t columns = static_cast<size_t>(l) * Vectors(dtype);
    shape->cluster = cluster;
    shape->tile_vectors = l;
    shape->part_rows = part_rows;
    shape->tiles = tiles;
    shape->shared_bytes = static_cast<size_t>(part_rows * row_bytes) +
                          (kStagedThreads / 32 + cluster) * columns * sizeof(float2);
    return true;
  }
  return false;
}

size_t TableEntries(SoftmaxKernel kernel, const SoftmaxSegment& s) {
  switch (kernel) {
    case SoftmaxKernel::kFlat:
    case SoftmaxKernel::kRowStaged:
    case SoftmaxKernel::kOnChip:
      return static_cast<size_t>(CeilDiv(s.outer, kMaxPieceRows));
    case SoftmaxKernel::kStaged:  // pieces, and one more where a launch fills up
      return static_cast<size_t>(CeilDiv(s.outer, kStagedPieceRows)) + 1;
    default:
      return 0;
  }
}

ScratchLayout SplitScratch(const SplitShape& shape, long long outer) {
  const size_t rows = static_cast<size_t>(outer);
  // Only the one-launch forms wait on counters; the two-pass form has a
  // (max, sum) per row instead (split_merge's totals, its finals).
  const bool counted = shape.fused || shape.staged;
  return {sizeof(float2) * rows * shape.parts, counted ? 0 : sizeof(float2) * rows,
          counted ? sizeof(unsigned) * rows : 0};
}

ScratchLayout StridedScratch(DType dtype, const StridedShape& shape, long long outer) {
  const size_t columns = 32 * Vectors(dtype);
  const size_t os = static_cast<size_t>(outer * shape.strips);
  return {sizeof(float2) * columns * os * shape.parts, sizeof(float2) * columns * os,
          sizeof(unsigned) * os};
}

size_t SegmentScratch(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s,
                      SoftmaxPath path) {
  if (path == SoftmaxPath::kSplitRows) return SplitScratch(SplitShapeOf(plan, dtype, s), s.outer).Total();
  if (path == SoftmaxPath::kStrided && RowKernelOf(plan, dtype, s) == SoftmaxKernel::kStridedStats) {
    return StridedScratch(dtype, StridedShapeOf(plan, dtype, s), s.outer).Total();
  }
  return 0;
}

namespace {

// Longest row (in vectors) the cluster path takes; 0 when it is not used.
long long ClusterMaxVectors(const LaunchPlan& plan) {
  if (plan.max_cluster_size() < 2) return 0;
  const long long limit = static_cast<long long>(kBlockVectors) * plan.max_cluster_size();
  return limit > kBlockVectors ? limit : 0;
}

// Longest row (in vectors) the staged path takes; 0 when it is not used.
long long StagedMaxVectors(const LaunchPlan& plan, DType dtype) {
  StagedShape shape;
  long long lo = kRowStagedMaxVectors;  // the floor; find the largest length that fits
  long long hi = kMaxClusterSize * kStagedMaxBytes / 16;
  if (!StagedShapeOf(plan, dtype, lo + 1, &shape)) return 0;
  // float32's longest staged rows lie past a gap (StagedShapeOf).
  if (StagedShapeOf(plan, dtype, kStagedLongMaxRowBytes / 16, &shape)) {
    lo = std::max(lo, kStagedLongMaxRowBytes / 16);
  }
  while (lo < hi) {
    const long long mid = (lo + hi + 1) / 2;
    if (StagedShapeOf(plan, dtype, mid, &shape)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Whether the staged kernel can take the rows of a last-axis segment: 16-byte
// rows of more than 1024 vectors that the plan can stage.
bool Stageable(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s) {
  const long long vectors = CeilDiv(s.n, Vectors(dtype));
  StagedShape staged;
  return vectors > kFlatMaxVectors && VectorAligned(dtype, s) &&
         StagedShapeOf(plan, dtype, vectors, &staged);
}

}  // namespace

// Batch invariance: THE rule that decides how a row is computed.
//
// A row's kernel and geometry, and so the order of every reduction over it,
// follow from the plan (the GPU model: its SM count and what its occupancy
// probe found), the dtype, the row length n, inner (strided or not) and
// whether the segment allows 16-byte accesses (pointers and row pitch
// 16-byte aligned) -- never from the other segments of the launch, from how
// many rows of its own tensor share it, from the launch's grid or cluster
// size, or from the stream. Every geometry below is a function of those
// alone (FlatShapeOf, TableShapeOf, StagedShapeOf, ClusterLog2, SplitShapeOf
// and StridedShapeOf take no row count), and a row that a launch-level
// shortcut takes (the flat kernel for launches of one segment) is computed
// there in the same order, with the same arithmetic (common.cuh), as in the
// kernel this rule names. Rows that are not 16-byte aligned are computed in
// the order of their elements' indices, whatever their address; rows of more
// than 1024 vectors take the staged kernel when aligned (its copies need
// 16-byte rows; in the 16-bit types rows of 60-64 KiB and from 4097
// vectors, row_staged below), so alignment is part of a row's identity
// there. The server's
// staging keeps every segment 256-byte aligned, so for it that is a function
// of n and the dtype. softmax_invariance_test checks the rule: on the H200,
// 0 of 1467 probe pieces in random launches differ from the same rows alone
// (303 before).
//
// Before this rule (H200, 2026-12-02) a probe tensor asked idle and then
// ~570 times under a 48-caller flood came back with other bits in 1-7
// answers for 14 of 90 shapes: launches of one segment ran the flat or the
// staged kernel and tables the flat table or on-chip kernel, a table holding
// one unaligned row of more than 8192 vectors moved every row to the on-chip
// kernel, the flat table kernel's order followed each row's address, and the
// split and strided paths cut rows by the launch's row count.
namespace {

long long RowVectors(DType dtype, const SoftmaxSegment& s) { return CeilDiv(s.n, Vectors(dtype)); }

// The shape rules of the families below, each for the rows that no family
// before it took.
bool StridedStagedTakes(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s) {
  StridedStagedShape shape;
  return s.inner != 1 && StridedStagedShapeOf(plan, dtype, s, &shape);
}
bool StridedTakes(const LaunchPlan&, DType, const SoftmaxSegment& s) { return s.inner != 1; }
bool FlatTakes(const LaunchPlan&, DType dtype, const SoftmaxSegment& s) {
  return RowVectors(dtype, s) <= kFlatMaxVectors;
}
// Aligned 16-bit rows up to kRowStagedAlignedMaxVectors but those that the
// staged kernel's 2-block clusters of 30-32 KiB shares take.
bool RowStagedAlignedTakes(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s) {
  const long long vectors = RowVectors(dtype, s);
  return VectorAligned(dtype, s) && ItemSize(dtype) == 2 &&
         vectors <= kRowStagedAlignedMaxVectors &&
         !(StagedSmallShareCluster(dtype, vectors * 16) > 0 && Stageable(plan, dtype, s));
}
bool StagedTakes(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s) {
  return Stageable(plan, dtype, s);
}
bool RowStagedTakes(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s) {
  const long long vectors = RowVectors(dtype, s);
  return vectors <= kRowStagedMaxVectors ||
         (vectors <= kRowStagedLongMaxVectors && plan.Find("row_staged.long", dtype) != nullptr);
}
bool OnChipTakes(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s) {
  return RowVectors(dtype, s) <= ClusterMaxVectors(plan);
}
bool SplitStagedTakes(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s) {
  return SplitShapeOf(plan, dtype, s).staged;
}
bool SplitFusedTakes(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s) {
  return SplitShapeOf(plan, dtype, s).fused;
}
bool Always(const LaunchPlan&, DType, const SoftmaxSegment&) { return true; }

}  // namespace

const std::vector<RowFamily>& RowFamilies() {
  static const std::vector<RowFamily> families = {
      {SoftmaxKernel::kStridedStaged, nullptr, StridedStagedTakes},
      {SoftmaxKernel::kStridedStats, nullptr, StridedTakes},
      {SoftmaxKernel::kFlat, nullptr, FlatTakes},
      {SoftmaxKernel::kRowStaged, "row_staged", RowStagedAlignedTakes},
      {SoftmaxKernel::kStaged, nullptr, StagedTakes},
      {SoftmaxKernel::kRowStaged, "row_staged", RowStagedTakes},
      {SoftmaxKernel::kOnChip, nullptr, OnChipTakes},
      {SoftmaxKernel::kSplitStaged, nullptr, SplitStagedTakes},
      {SoftmaxKernel::kSplitFused, nullptr, SplitFusedTakes},
      {SoftmaxKernel::kSplitStats, nullptr, Always},
  };
  return families;
}

const std::vector<ProbeCall>& ProbeOrder() {
  using K = SoftmaxKernel;
  static const std::vector<ProbeCall> order = {
      {K::kOnChip, 0},      {K::kFlat, 0},       {K::kFlatTable, 0},
      {K::kRowStaged, 0},   {K::kOnChip, 1},     {K::kSplitStaged, 0},
      {K::kStaged, 0},      {K::kStridedStaged, 0},
      {K::kSplitFused, 0},  {K::kSplitStats, 0}, {K::kSplitNormalizeUnits, 0},
      {K::kStridedStats, 0}, {K::kStridedNormalize, 0},
  };
  return order;
}

SoftmaxKernel RowKernelOf(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& segment) {
  for (const RowFamily& family : RowFamilies()) {
    if (family.probe != nullptr && plan.Find(family.probe, dtype) == nullptr) continue;
    if (family.takes(plan, dtype, segment)) return family.kernel;
  }
  return SoftmaxKernel::kSplitStats;  // unreachable: the last family takes every row
}

// ---------------------------------------------------------------------------
// The schedule: which launches run a table of segments. Everything below is
// a function of the plan and the segments; launch.cu only executes it.

namespace {

// Calls `take` with a last-axis segment's table entries, one per piece of at
// most kMaxPieceRows rows (which keeps the kernels' indices 32-bit): pointers,
// rows, n and scale set; config and units are the caller's.
template <typename Take>
void ForEachPiece(DType dtype, const SoftmaxSegment& s, Take take) {
  const size_t item = ItemSize(dtype);
  for (long long first = 0; first < s.outer; first += kMaxPieceRows) {
    const long long piece_rows = std::min<long long>(kMaxPieceRows, s.outer - first);
    const size_t offset = static_cast<size_t>(first) * s.n * item;
    RowSegment r = {};
    r.input = static_cast<const char*>(s.input) + offset;
    r.output = static_cast<char*>(s.output) + offset;
    r.rows = static_cast<int>(piece_rows);
    r.n = static_cast<int>(s.n);
    r.scale = Log2Scale(s);
    take(r);
  }
}

LaunchStep FlatStep(DType dtype, const SoftmaxSegment& s) {
  const FlatShape shape = FlatShapeOf(CeilDiv(s.n, Vectors(dtype)));
  LaunchStep step;
  step.kernel = SoftmaxKernel::kFlat;
  step.flat.input = s.input;
  step.flat.output = s.output;
  step.flat.rows = s.outer;
  step.flat.n = s.n;
  step.flat.scale = Log2Scale(s);
  step.flat.group_log2 = shape.group_log2;
  step.vec = VectorAligned(dtype, s);
  step.log = s.log;
  // One pass over the rows: each block one group of rows.
  const long long groups = shape.threads >> shape.group_log2;
  step.grid = static_cast<unsigned>(
      std::min<long long>(CeilDiv(s.outer, std::max(1LL, groups)), 0x7fffffffLL));
  step.threads = shape.threads;
  return step;
}

// The config word of a flat row's table entry: the op, its alignment and
// its group (FlatShapeOf), which fix its flat order in the flat table and
// row_staged (kFlatOrderBit) kernels alike.
int FlatConfig(DType dtype, const SoftmaxSegment& s) {
  const int group_log2 = FlatShapeOf(CeilDiv(s.n, Vectors(dtype))).group_log2;
  return (s.log ? kLogBit : 0) | (VectorAligned(dtype, s) ? kVecBit : 0) |
         (group_log2 << kShapeShift);
}

// The flat table entries of a segment (RowKernelOf: kFlat).
void AppendFlatTable(DType dtype, const SoftmaxSegment& s, std::vector<RowSegment>* rows) {
  const int config = FlatConfig(dtype, s);
  const int group_log2 = (config >> kShapeShift) & 0xf;
  const long long rows_per_unit = (kTableThreads >> group_log2) * kTableFlatRows;
  ForEachPiece(dtype, s, [&](RowSegment r) {
    r.config = config;
    r.units = static_cast<int>(CeilDiv(r.rows, rows_per_unit));
    rows->push_back(r);
  });
}

// The flat table kernel over `rows`, in as few launches as keep its unit
// indices in int, each with a one-pass grid; each unit prefetches the unit
// one wave of resident blocks ahead. Dynamic shared memory only where a
// segment's rows are not 16-byte aligned.
void FlatTableSteps(const LaunchPlan& plan, DType dtype, const std::vector<RowSegment>& rows,
                    std::vector<LaunchStep>* steps) {
  size_t begin = 0;
  while (begin < rows.size()) {
    LaunchStep step;
    step.kernel = SoftmaxKernel::kFlatTable;
    step.threads = kTableThreads;
    long long units = 0;
    for (; begin < rows.size(); ++begin) {
      RowSegment r = rows[begin];
      if (!step.table.empty() && units + r.units > 0x7fffffffLL) break;
      r.first_worker = static_cast<int>(units);
      units += r.units;
      if ((r.config & kVecBit) == 0) {
        const int group_log2 = (r.config >> kShapeShift) & 0xf;
        step.shared_bytes = std::max(
            step.shared_bytes, static_cast<size_t>(kTableFlatRows) *
                                   (static_cast<size_t>(kFlatSlots) * kTableThreads +
                                    (kTableThreads >> group_log2)) * 16);
      }
      step.table.push_back(r);
    }
    step.grid = static_cast<unsigned>(units);
    step.table_word = static_cast<int>(units);
    step.prefetch_units = GridOf(plan, "flat_table", dtype);
    steps->push_back(std::move(step));
  }
}

// The on-chip table entries of a warp, block or cluster segment; units are
// numbered in one rotation across the launch's segments (*unit_counter).
void AppendOnChip(DType dtype, const SoftmaxSegment& s, SoftmaxPath path, int grid,
                  int launch_cluster, long long* unit_counter, std::vector<RowSegment>* rows) {
  const long long vectors = CeilDiv(s.n, Vectors(dtype));
  int config = static_cast<int>(path) | (s.log ? kLogBit : 0) |
               (VectorAligned(dtype, s) ? kVecBit : 0);
  long long rows_per_unit = 1;
  long long workers = 1;
  if (path == SoftmaxPath::kWarpRows) {
    const int lanes_log2 = std::min(5, CeilLog2(vectors));
    const int columns_log2 = CeilLog2(CeilDiv(vectors, 1LL << lanes_log2));
    rows_per_unit = (32LL >> lanes_log2) * WarpRowsPerLane(columns_log2);
    config |= (lanes_log2 << kShapeShift) | (columns_log2 << kColumnsShift);
    workers = static_cast<long long>(grid) * kWarps;
  } else if (path == SoftmaxPath::kBlockRows) {
    const int warps_log2 = CeilLog2(CeilDiv(vectors, kGroupWarpVectors));
    config |= warps_log2 << kShapeShift;
    workers = static_cast<long long>(grid) * (kWarps >> warps_log2);
  } else {
    config |= ClusterLog2(vectors) << kShapeShift;
    workers = static_cast<long long>(grid / launch_cluster) *
              (launch_cluster >> ClusterLog2(vectors));
  }
  ForEachPiece(dtype, s, [&](RowSegment r) {
    r.units = static_cast<int>(CeilDiv(r.rows, rows_per_unit));
    r.config = config;
    r.first_worker = static_cast<int>(*unit_counter % workers);
    *unit_counter += r.units;
    rows->push_back(r);
  });
}

// The staged kernel over every staged segment: one launch per cluster size
// and instantiation (a row per cluster; the segments of one size and
// instantiation share it), with the largest share among them as dynamic
// shared memory; grids beyond 2^31 - 1 blocks go in pieces. A row's
// instantiation follows from its own share (StagedShortShares), never from
// the other rows of its launch.
bool StagedSteps(const LaunchPlan& plan, DType dtype,
                 const std::vector<const SoftmaxSegment*>& segments,
                 std::vector<LaunchStep>* steps) {
  const size_t item = ItemSize(dtype);
  std::vector<StagedShape> shapes(segments.size());
  for (size_t i = 0; i < segments.size(); ++i) {
    if (!StagedShapeOf(plan, dtype, CeilDiv(segments[i]->n, Vectors(dtype)), &shapes[i])) {
      return false;
    }
  }
  // The launches of one cluster size and instantiation.
  const auto launches = [&](int cluster, bool short_shares) {
    const long long max_rows = 0x7fffffffLL / cluster;
    LaunchStep step;
    long long clusters = 0;
    auto flush = [&]() {
      if (step.table.empty()) return;
      step.kernel = SoftmaxKernel::kStaged;
      step.short_shares = short_shares;
      step.grid = static_cast<unsigned>(clusters * cluster);
      step.threads = kStagedThreads;
      step.cluster = cluster;
      steps->push_back(std::move(step));
      step = LaunchStep();
      clusters = 0;
    };
    for (size_t i = 0; i < segments.size(); ++i) {
      const SoftmaxSegment* s = segments[i];
      const StagedShape& shape = shapes[i];
      if (shape.cluster != cluster ||
          StagedShortShares(dtype, cluster, shape.shared_bytes) != short_shares) {
        continue;
      }
      const size_t pitch = static_cast<size_t>(s->n) * item;
      for (long long first = 0; first < s->outer;) {
        if (clusters == max_rows) flush();
        const long long take = std::min(s->outer - first, max_rows - clusters);
        RowSegment r = {};
        r.input = static_cast<const char*>(s->input) + first * pitch;
        r.output = static_cast<char*>(s->output) + first * pitch;
        r.rows = static_cast<int>(take);
        r.units = r.rows;
        r.n = static_cast<int>(s->n);
        r.first_worker = static_cast<int>(clusters);
        r.scale = Log2Scale(*s);
        r.config = s->log ? kLogBit : 0;
        r.unused[kStagedChunkSlot] = shape.chunk_vectors;
        step.table.push_back(r);
        clusters += take;
        step.shared_bytes = std::max(step.shared_bytes, shape.shared_bytes);
        first += take;
      }
    }
    flush();
  };
  for (int cluster = 1; cluster <= kMaxClusterSize; cluster *= 2) {
    launches(cluster, false);
    launches(cluster, true);
  }
  return true;
}

// The row_staged kernel over `rows` (entries of one piece each, rows and n
// set): a block per row, one launch per number of blocks per SM that the
// rows' shares allow (RowStagedBlocks, up to what its registers allow; the
// largest share of a launch is its dynamic shared memory), so that short
// rows are not held to the longest one's occupancy. Longest rows first,
// across launches and within each, so that the launches end on their
// shortest blocks: H200, half ragged mixes of 64 tensors 1.03-1.05x, 24
// tensors of up to 65,536 columns 1.00-1.02x, float32 0.98-1.02x.
int RowStagedBlocks(long long vectors, int most) {
  const long long per_block = static_cast<long long>(RowStagedShareBytes(vectors)) +
                              kRowStagedBlockReserve;
  return static_cast<int>(std::max(1LL, std::min<long long>(most, kRowStagedSmBytes / per_block)));
}

void RowStagedSteps(const LaunchPlan& plan, DType dtype, std::vector<RowSegment> rows,
                    std::vector<LaunchStep>* steps) {
  if (rows.empty()) return;
  std::stable_sort(rows.begin(), rows.end(),
                   [](const RowSegment& a, const RowSegment& b) { return a.n > b.n; });
  const int V = Vectors(dtype);
  const KernelProbe* probe = plan.Find("row_staged", dtype);
  const int most = probe != nullptr && probe->blocks_per_sm > 0 ? probe->blocks_per_sm
                                                                : kRowStagedMinBlocks;
  for (int blocks = 1; blocks <= most; ++blocks) {
    LaunchStep step;
    long long launch_rows = 0;
    auto flush = [&]() {
      if (step.table.empty()) return;
      step.kernel = SoftmaxKernel::kRowStaged;
      step.grid = static_cast<unsigned>(launch_rows);
      step.threads = kRowStagedThreads;
      steps->push_back(std::move(step));
      step = LaunchStep();
      launch_rows = 0;
    };
    for (RowSegment r : rows) {
      const long long vectors = CeilDiv(r.n, V);
      if (RowStagedBlocks(vectors, most) != blocks) continue;
      if (launch_rows + r.rows > 0x7fffffffLL) flush();
      r.first_worker = static_cast<int>(launch_rows);
      r.units = r.rows;
      launch_rows += r.rows;
      step.shared_bytes = std::max(step.shared_bytes, RowStagedShareBytes(vectors));
      step.table.push_back(r);
    }
    flush();
  }
}

// Puts a segment's scratch regions at *offset on (SegmentScratch's layout)
// and has its first launch zero the counters.
void PlaceScratch(const ScratchLayout& layout, size_t* offset, LaunchStep* step) {
  step->partials_offset = *offset;
  step->finals_offset = step->partials_offset + Align256(layout.partials);
  step->counters_offset = step->finals_offset + Align256(layout.finals);
  step->zero_bytes = layout.counters;
  *offset += layout.Total();
}

// The fields every split and strided launch takes from its segment, its
// tensors from byte `offset` on.
template <typename Args>
void SetSegmentArgs(const SoftmaxSegment& s, size_t offset, Args* a) {
  a->input = static_cast<const char*>(s.input) + offset;
  a->output = static_cast<char*>(s.output) + offset;
  a->n = s.n;
  a->scale = Log2Scale(s);
  a->log = s.log;
}

// One split segment: a counter memset and one cooperative launch, or two
// launches (rows read twice); scratch from *offset on.
void SplitSteps(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s, size_t* offset,
                std::vector<LaunchStep>* steps) {
  const SplitShape shape = SplitShapeOf(plan, dtype, s);
  LaunchStep step;
  SplitArgs& a = step.split;
  SetSegmentArgs(s, 0, &a);
  a.rows = s.outer;
  a.part_vectors = shape.part_vectors;
  a.parts = shape.parts;
  a.vec = VectorAligned(dtype, s);
  step.vec = a.vec != 0;
  PlaceScratch(SplitScratch(shape, s.outer), offset, &step);
  const long long units = s.outer * shape.parts;
  if (shape.staged) {
    step.kernel = SoftmaxKernel::kSplitStaged;
    step.grid = static_cast<unsigned>(shape.grid);
    step.threads = kStagedThreads;
    step.shared_bytes = static_cast<size_t>(shape.part_vectors) * 16;
    step.cooperative = true;
    steps->push_back(step);
    return;
  }
  step.threads = kThreads;
  if (shape.fused) {
    step.kernel = SoftmaxKernel::kSplitFused;
    step.grid = static_cast<unsigned>(std::min<long long>(units, GridOf(plan, "split_fused", dtype)));
    step.cooperative = true;
    steps->push_back(step);
    return;
  }
  // Aligned rows: one block per unit, then per chunk, each row's partials
  // merged once in between. Blocks that end and are replaced by the hardware
  // move 1 GiB faster than a grid walking the units (H200, fp32 1 GiB:
  // split_normalize's pass 4.0 against 3.78 TB/s; split_stats 4.54 against
  // 4.48 TB/s of reads). Other rows keep the walking grids, where they
  // measured faster. Units fix the partials, not the grid.
  step.kernel = SoftmaxKernel::kSplitStats;
  step.grid = static_cast<unsigned>(
      std::min<long long>(units, a.vec ? 0x7fffffffLL : GridOf(plan, "split_stats", dtype)));
  steps->push_back(step);
  if (a.vec) {
    step.kernel = SoftmaxKernel::kSplitMerge;
    step.grid = static_cast<unsigned>(std::min<long long>(s.outer, 0x7fffffffLL));
    steps->push_back(step);
  }
  step.kernel = a.vec ? SoftmaxKernel::kSplitNormalize : SoftmaxKernel::kSplitNormalizeUnits;
  const long long chunks = s.outer * CeilDiv(CeilDiv(s.n, Vectors(dtype)), kBlockVectors);
  step.grid = static_cast<unsigned>(
      a.vec ? std::min<long long>(chunks, 0x7fffffffLL)
            : std::min<long long>(units, GridOf(plan, "split_normalize_units", dtype)));
  steps->push_back(step);
}

// One strided segment: a counter memset, strided_stats, strided_normalize.
void StridedSteps(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s, size_t* offset,
                  std::vector<LaunchStep>* steps) {
  const StridedShape shape = StridedShapeOf(plan, dtype, s);
  LaunchStep step;
  StridedArgs& a = step.strided;
  SetSegmentArgs(s, 0, &a);
  a.outer = s.outer;
  a.inner = s.inner;
  a.strips = shape.strips;
  a.part_rows = shape.part_rows;
  a.parts = shape.parts;
  a.lanes_log2 = shape.lanes_log2;
  a.vec = Aligned16(s.input) && Aligned16(s.output) && (s.inner * ItemSize(dtype)) % 16 == 0;
  step.vec = a.vec != 0;
  PlaceScratch(StridedScratch(dtype, shape, s.outer), offset, &step);
  const long long units = s.outer * shape.strips * shape.parts;
  step.threads = kThreads;
  step.kernel = SoftmaxKernel::kStridedStats;
  step.grid =
      static_cast<unsigned>(std::min<long long>(units, GridOf(plan, "strided_stats", dtype)));
  steps->push_back(step);
  step.kernel = SoftmaxKernel::kStridedNormalize;
  step.grid =
      static_cast<unsigned>(std::min<long long>(units, GridOf(plan, "strided_normalize", dtype)));
  step.zero_bytes = 0;
  steps->push_back(step);
}

// A strided_staged launch over `outer` slices of `s` from byte `offset` on.
LaunchStep StridedStagedStep(DType dtype, const SoftmaxSegment& s,
                             const StridedStagedShape& shape, size_t offset, long long outer) {
  LaunchStep step;
  step.kernel = SoftmaxKernel::kStridedStaged;
  step.grid = static_cast<unsigned>(outer * shape.tiles * shape.cluster);
  step.threads = kStagedThreads;
  step.cluster = shape.cluster;
  step.shared_bytes = shape.shared_bytes;
  step.vec = true;
  StridedArgs& a = step.strided;
  SetSegmentArgs(s, offset, &a);
  a.outer = outer;
  a.inner = s.inner;
  a.strips = shape.tiles;
  a.part_rows = shape.part_rows;
  a.parts = shape.cluster;
  a.tile_vectors = shape.tile_vectors;
  a.vec = 1;
  return step;
}

// One strided_staged segment: launches of a cluster per (outer, tile), each
// of as many whole outer slices as 2^31 - 1 blocks hold.
void StridedStagedSteps(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s,
                        std::vector<LaunchStep>* steps) {
  StridedStagedShape shape;
  StridedStagedShapeOf(plan, dtype, s, &shape);  // RowKernelOf checked it
  const long long slice_blocks = shape.tiles * shape.cluster;
  const long long most = 0x7fffffffLL / slice_blocks;
  const size_t slice_bytes = static_cast<size_t>(s.n * s.inner) * ItemSize(dtype);
  for (long long first = 0; first < s.outer; first += most) {
    const long long outer = std::min(most, s.outer - first);
    steps->push_back(StridedStagedStep(dtype, s, shape, first * slice_bytes, outer));
  }
}

}  // namespace

const KernelInfo& KernelInfoOf(SoftmaxKernel kernel) {
  using K = SoftmaxKernel;
  using A = StepArgs;
  const auto strided_staged = [](const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s,
                                 size_t*, std::vector<LaunchStep>* steps) {
    StridedStagedSteps(plan, dtype, s, steps);
  };
  static const KernelInfo kInfo[] = {
      {K::kFlat, "flat", A::kFlat, K::kFlat, nullptr},
      {K::kFlatTable, "flat_table", A::kTable, K::kFlatTable, nullptr},
      {K::kOnChip, "on_chip", A::kTable, K::kOnChip, nullptr},
      {K::kStaged, "staged", A::kTable, K::kStaged, nullptr},
      {K::kSplitStaged, "split_staged", A::kSplit, K::kSplitStaged, SplitSteps},
      {K::kSplitFused, "split_fused", A::kSplit, K::kSplitFused, SplitSteps},
      {K::kSplitStats, "split_stats", A::kSplit, K::kSplitStats, SplitSteps},
      {K::kSplitNormalize, "split_normalize", A::kSplit, K::kSplitStats, nullptr},
      {K::kStridedStats, "strided_stats", A::kStrided, K::kStridedStats, StridedSteps},
      {K::kStridedNormalize, "strided_normalize", A::kStrided, K::kStridedStats, nullptr},
      {K::kStridedStaged, "strided_staged", A::kStrided, K::kStridedStaged, strided_staged},
      {K::kRowStaged, "row_staged", A::kTable, K::kRowStaged, nullptr},
      {K::kSplitMerge, "split_merge", A::kSplit, K::kSplitStats, nullptr},
      {K::kSplitNormalizeUnits, "split_normalize_units", A::kSplit, K::kSplitStats, nullptr},
  };
  static_assert(sizeof(kInfo) / sizeof(kInfo[0]) == kSoftmaxKernels, "one entry per kernel");
  static const KernelInfo kUnknown = {K::kFlat, "unknown", A::kFlat, K::kFlat, nullptr};
  const int i = static_cast<int>(kernel);
  return i >= 0 && i < kSoftmaxKernels && kInfo[i].kernel == kernel ? kInfo[i] : kUnknown;
}

cudaError_t PlanSchedule(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                         int count, bool allow_flat, Schedule* schedule) {
  Schedule out;
  // A launch of one segment of flat rows: the flat kernel, in the flat table
  // kernel's order (RowKernelOf).
  if (const SoftmaxSegment* flat = FlatSegment(dtype, segments, count, allow_flat)) {
    out.steps.push_back(FlatStep(dtype, *flat));
    *schedule = std::move(out);
    return cudaSuccess;
  }
  // Which kernel computes each segment's rows (the rule, per segment), and
  // the cluster size of the on-chip launch (the largest any of its rows needs).
  std::vector<SoftmaxKernel> kernels(count, SoftmaxKernel::kFlat);
  int launch_cluster = 1;
  size_t table_entries = 0;
  for (int i = 0; i < count; ++i) {
    const SoftmaxSegment& s = segments[i];
    if (Empty(s)) continue;
    kernels[i] = RowKernelOf(plan, dtype, s);
    // Without the flat kernels (a test hook) the staged kernel takes the
    // aligned rows that row_staged would, the on-chip kernel the others.
    if (!allow_flat && kernels[i] == SoftmaxKernel::kRowStaged && Stageable(plan, dtype, s)) {
      kernels[i] = SoftmaxKernel::kStaged;
    }
    table_entries += TableEntries(kernels[i], s);
    const bool on_chip = kernels[i] == SoftmaxKernel::kOnChip ||
                         (!allow_flat && (kernels[i] == SoftmaxKernel::kFlat ||
                                          kernels[i] == SoftmaxKernel::kRowStaged));
    if (on_chip && ChoosePath(plan, dtype, s) == SoftmaxPath::kClusterRows) {
      launch_cluster =
          std::max(launch_cluster, 1 << ClusterLog2(CeilDiv(s.n, Vectors(dtype))));
    }
  }
  // A table's flat rows join its row_staged launch, a block per row summed in
  // the flat order (kFlatOrderBit: the bits of the flat kernels), where they
  // are no more than its row_staged rows: one launch whose tail the short rows
  // fill, instead of a flat table launch beside it. Many more short rows than
  // long ones keep the flat table launch, which packs them many to a block.
  // Which launch computes a row changes its schedule, never its bits.
  long long flat_count = 0;
  long long row_staged_count = 0;
  for (int i = 0; i < count; ++i) {
    if (Empty(segments[i])) continue;
    if (kernels[i] == SoftmaxKernel::kFlat) flat_count += segments[i].outer;
    if (kernels[i] == SoftmaxKernel::kRowStaged) row_staged_count += segments[i].outer;
  }
  const bool flat_joins = allow_flat && row_staged_count > 0 && flat_count <= row_staged_count;
  // Every table launch uses the one table area at the start of the scratch,
  // one after the other (stream order: a copy lands after the launch before
  // it ran).
  size_t offset = 0;
  if (table_entries > static_cast<size_t>(kInlineSegments)) {
    out.table_bytes = Align256(table_entries * sizeof(RowSegment));
    offset = out.table_bytes;
  }
  // The flat table and on-chip tables; on-chip units numbered in one
  // rotation across segments.
  const int grid = GridOf(plan, "on_chip", dtype, launch_cluster);
  std::vector<RowSegment> flat_rows;
  std::vector<RowSegment> row_staged_rows;
  std::vector<RowSegment> on_chip_rows;
  std::vector<const SoftmaxSegment*> staged;
  long long unit_counter = 0;
  for (int i = 0; i < count; ++i) {
    const SoftmaxSegment& s = segments[i];
    if (Empty(s)) continue;
    switch (kernels[i]) {
      case SoftmaxKernel::kFlat:
      case SoftmaxKernel::kRowStaged:
        if (!allow_flat) {
          AppendOnChip(dtype, s, ChoosePath(plan, dtype, s), grid, launch_cluster, &unit_counter,
                       &on_chip_rows);
        } else if (kernels[i] == SoftmaxKernel::kFlat && !flat_joins) {
          AppendFlatTable(dtype, s, &flat_rows);
        } else {
          // A flat row keeps the flat table's config word (row_staged reads
          // its group; kVecBit only names its flat order).
          const int config = kernels[i] == SoftmaxKernel::kFlat ? FlatConfig(dtype, s) | kFlatOrderBit
                                                            : (s.log ? kLogBit : 0);
          ForEachPiece(dtype, s, [&](RowSegment r) {
            r.config = config;
            row_staged_rows.push_back(r);
          });
        }
        break;
      case SoftmaxKernel::kOnChip:
        AppendOnChip(dtype, s, SoftmaxPath::kClusterRows, grid, launch_cluster, &unit_counter,
                     &on_chip_rows);
        break;
      case SoftmaxKernel::kStaged:
        staged.push_back(&s);
        break;
      default:
        break;
    }
  }
  // A table's launches, longest rows first: the staged launches (clusters,
  // which need whole sets of free SMs and find them on the idle GPU), the
  // on-chip launch, row_staged (its longest rows first), and last the flat
  // table, whose short rows fill the tail. H100, ragged tables against the
  // reverse order: 60 short tensors beside 4 long ones 1.06-1.22x, 24
  // tensors of up to 65,536 columns 1.05-1.09x, the rest 0.99-1.03x.
  if (!StagedSteps(plan, dtype, staged, &out.steps)) return cudaErrorInvalidValue;
  if (!on_chip_rows.empty()) {
    LaunchStep step;
    step.kernel = SoftmaxKernel::kOnChip;
    step.grid = static_cast<unsigned>(grid);
    step.threads = kThreads;
    step.cluster = launch_cluster > 1 ? launch_cluster : 0;
    step.table = std::move(on_chip_rows);
    step.table_word = launch_cluster;
    out.steps.push_back(std::move(step));
  }
  RowStagedSteps(plan, dtype, std::move(row_staged_rows), &out.steps);
  FlatTableSteps(plan, dtype, flat_rows, &out.steps);
  // The launches of each segment whose family plans them alone (split,
  // strided: one launch, or two for rows read twice).
  for (int i = 0; i < count; ++i) {
    const SoftmaxSegment& s = segments[i];
    if (Empty(s)) continue;
    if (const auto segment_steps = KernelInfoOf(kernels[i]).segment_steps) {
      segment_steps(plan, dtype, s, &offset, &out.steps);
    }
  }
  // Table launches of other segments overlap the tail of the launch before
  // them: no data passes between them, and no copy may come between them (a
  // table beyond kInlineSegments is copied in just before its launch). Only
  // where the plan found clusters (sm_90, which programmatic launches need).
  // H200, ragged tables of 64 tensors: 1.08-1.19x; half long rows 1.38-1.39x.
  // The on-chip launch too: H100, 24 float32 tensors of up to 65,536 columns
  // (on-chip cluster rows beside staged and row_staged launches) 1.07-1.08x.
  // A later pass (split_merge, split_normalize, strided_normalize) overlaps
  // the tail of the pass before too: it loads its first unit, then waits for
  // that pass to complete before it reads what it wrote. H200, 16 x 2^24
  // fp16: 1.014x.
  const auto overlaps = [](SoftmaxKernel k) { return KernelInfoOf(k).table(); };
  // A pass of a form right after the pass before it (a segment's passes are
  // consecutive steps; a form's first pass starts a segment).
  const auto second_pass = [](SoftmaxKernel first, SoftmaxKernel second) {
    const SoftmaxKernel form = KernelInfoOf(second).first_pass;
    return form != second && KernelInfoOf(first).first_pass == form;
  };
  for (size_t i = 1; i < out.steps.size() && plan.max_cluster_size() > 1; ++i) {
    LaunchStep& step = out.steps[i];
    const SoftmaxKernel before = out.steps[i - 1].kernel;
    step.overlap_previous = (overlaps(before) && overlaps(step.kernel) && !step.TableInScratch()) ||
                            second_pass(before, step.kernel);
  }
  out.scratch_bytes = offset;
  *schedule = std::move(out);
  return cudaSuccess;
}

std::string Schedule::Kernels() const {
  std::string out;
  std::vector<SoftmaxKernel> seen;
  for (const LaunchStep& step : steps) {
    if (std::find(seen.begin(), seen.end(), step.kernel) != seen.end()) continue;
    seen.push_back(step.kernel);
    if (!out.empty()) out += ",";
    out += SoftmaxKernelName(step.kernel);
  }
  return out;
}

std::string Schedule::ToString() const {
  std::ostringstream out;
  out << "schedule: " << steps.size() << " launches, scratch " << scratch_bytes
      << " bytes (tables " << table_bytes << ")\n";
  char line[256];
  for (const LaunchStep& step : steps) {
    std::snprintf(line, sizeof(line), "  %-17s grid %7u x %4d  cluster %2d  shared %6zu%s%s%s",
                  SoftmaxKernelName(step.kernel), step.grid, step.threads, step.cluster,
                  step.shared_bytes, step.cooperative ? "  cooperative" : "",
                  step.vec ? "  vec" : "", step.overlap_previous ? "  overlaps" : "");
    out << line;
    if (step.short_shares) out << "  short";
    if (!step.table.empty()) {
      out << "  table " << step.table.size()
          << (step.TableInScratch() ? " entries (scratch)" : " entries (inline)");
    }
    if (step.zero_bytes > 0 || step.partials_offset > 0 || step.finals_offset > 0) {
      out << "  partials @" << step.partials_offset << " finals @" << step.finals_offset
          << " counters @" << step.counters_offset;
    }
    switch (KernelInfoOf(step.kernel).args) {
      case StepArgs::kFlat:
        out << "  rows " << step.flat.rows << " n " << step.flat.n << " group 2^"
            << step.flat.group_log2;
        break;
      case StepArgs::kSplit:
        out << "  rows " << step.split.rows << " n " << step.split.n << " parts "
            << step.split.parts << " x " << step.split.part_vectors << " vectors";
        break;
      case StepArgs::kStrided:
        out << "  [" << step.strided.outer << ", " << step.strided.n << ", "
            << step.strided.inner << "] strips " << step.strided.strips << " parts "
            << step.strided.parts << " x " << step.strided.part_rows << " rows";
        if (step.kernel == SoftmaxKernel::kStridedStaged) {
          out << " tile " << step.strided.tile_vectors * 16 << " bytes";
        }
        break;
      case StepArgs::kTable:
        break;
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace detail

using namespace detail;  // NOLINT: the planning helpers of this file

const char* SoftmaxPathName(SoftmaxPath path) {
  switch (path) {
    case SoftmaxPath::kWarpRows: return "warp_rows";
    case SoftmaxPath::kBlockRows: return "block_rows";
    case SoftmaxPath::kClusterRows: return "cluster_rows";
    case SoftmaxPath::kSplitRows: return "split_rows";
    case SoftmaxPath::kStrided: return "strided";
    case SoftmaxPath::kStagedRows: return "staged_rows";
  }
  return "unknown";
}

const char* SoftmaxKernelName(SoftmaxKernel kernel) { return KernelInfoOf(kernel).name; }

void LaunchPlan::IndexProbes() {
  index_.clear();
  for (size_t i = 0; i < probes_.size(); ++i) {
    const KernelProbe& p = probes_[i];
    const size_t lt = p.kernel.find('<');
    index_.push_back({static_cast<int>(p.dtype), p.cluster_size,
                      static_cast<int>(lt == std::string::npos ? p.kernel.size() : lt),
                      static_cast<int>(i)});
  }
  std::stable_sort(index_.begin(), index_.end(), [&](const IndexEntry& a, const IndexEntry& b) {
    return KeyOf(a) < KeyOf(b);
  });
}

std::tuple<int, int, std::string_view> LaunchPlan::KeyOf(const IndexEntry& e) const {
  return {e.dtype, e.cluster_size,
          std::string_view(probes_[e.probe].kernel).substr(0, e.family_length)};
}

const KernelProbe* LaunchPlan::Find(std::string_view family, DType dtype,
                                    int cluster_size) const {
  const std::tuple<int, int, std::string_view> key{static_cast<int>(dtype), cluster_size, family};
  const auto it = std::lower_bound(
      index_.begin(), index_.end(), key,
      [&](const IndexEntry& e, const std::tuple<int, int, std::string_view>& k) {
        return KeyOf(e) < k;
      });
  if (it == index_.end() || KeyOf(*it) != key) return nullptr;
  return &probes_[it->probe];
}

bool LaunchPlan::Parse(const std::string& text, LaunchPlan* plan) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line)) return false;
  // "softmax launch plan: device D (NAME), S SMs, L2 X MiB, clusters up to C"
  const std::string head = "softmax launch plan: device ";
  const size_t start = line.find(head);
  const size_t open = line.find(" (", start);
  const size_t close = line.rfind("), ");
  if (start == std::string::npos || open == std::string::npos || close == std::string::npos ||
      close < open) {
    return false;
  }
  LaunchPlan p;
  int l2_mib = 0;
  p.device_ = std::atoi(line.c_str() + start + head.size());
  p.device_name_ = line.substr(open + 2, close - open - 2);
  if (std::sscanf(line.c_str() + close + 3, "%d SMs, L2 %d MiB, clusters up to %d",
                  &p.multiprocessors_, &l2_mib, &p.max_cluster_size_) != 3) {
    return false;
  }
  p.l2_bytes_ = l2_mib << 20;
  p.clusters_supported_ = p.max_cluster_size_ > 1;
  if (!std::getline(in, line)) return false;  // the column header
  while (std::getline(in, line)) {
    std::istringstream row(line);
    KernelProbe probe;
    if (!(row >> probe.kernel >> probe.paths >> probe.threads_per_block >>
          probe.registers_per_thread >> probe.local_bytes_per_thread >>
          probe.static_shared_bytes >> probe.blocks_per_sm >> probe.cluster_size >>
          probe.max_active_clusters >> probe.grid)) {
      continue;  // a line of another log between rows
    }
    const size_t lt = probe.kernel.find('<');
    const size_t gt = probe.kernel.find('>', lt);
    if (lt == std::string::npos || gt == std::string::npos) return false;
    const std::string dtype = probe.kernel.substr(lt + 1, gt - lt - 1);
    bool known = false;
    for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      if (dtype == DTypeName(d)) {
        probe.dtype = d;
        known = true;
      }
    }
    if (!known) return false;
    p.probes_.push_back(probe);
  }
  if (p.probes_.empty() || p.multiprocessors_ <= 0) return false;
  p.IndexProbes();
  *plan = std::move(p);
  return true;
}

std::string LaunchPlan::ToString() const {
  std::ostringstream out;
  out << "softmax launch plan: device " << device_ << " (" << device_name_ << "), "
      << multiprocessors_ << " SMs, L2 " << (l2_bytes_ >> 20) << " MiB, clusters up to "
      << max_cluster_size_ << "\n";
  char line[256];
  std::snprintf(line, sizeof(line), "  %-28s %-22s %7s %5s %6s %7s %10s %8s %9s %6s\n", "kernel",
                "paths", "threads", "regs", "local", "static", "blocks/SM", "cluster",
                "clusters", "grid");
  out << line;
  for (const KernelProbe& p : probes_) {
    std::snprintf(line, sizeof(line), "  %-28s %-22s %7d %5d %6d %7d %10d %8d %9d %6d\n",
                  p.kernel.c_str(), p.paths.c_str(), p.threads_per_block, p.registers_per_thread,
                  p.local_bytes_per_thread, p.static_shared_bytes, p.blocks_per_sm,
                  p.cluster_size, p.max_active_clusters, p.grid);
    out << line;
  }
  return out.str();
}

SoftmaxPath ChoosePath(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& segment) {
  const long long vectors = CeilDiv(segment.n, Vectors(dtype));
  switch (RowKernelOf(plan, dtype, segment)) {
    case SoftmaxKernel::kStridedStats:
    case SoftmaxKernel::kStridedStaged: return SoftmaxPath::kStrided;
    case SoftmaxKernel::kStaged: return SoftmaxPath::kStagedRows;
    case SoftmaxKernel::kRowStaged:
      // Aligned rows that row_staged takes in the 16-bit types are still
      // staged rows by class: the path names rows, not kernels.
      if (Stageable(plan, dtype, segment)) return SoftmaxPath::kStagedRows;
      break;
    case SoftmaxKernel::kSplitStaged:
    case SoftmaxKernel::kSplitFused:
    case SoftmaxKernel::kSplitStats: return SoftmaxPath::kSplitRows;
    default: break;
  }
  // Other rows, named by length: the path the on-chip kernel takes them by
  // (allow_flat false, or the cluster path beyond row_staged).
  if (vectors <= kWarpVectors) return SoftmaxPath::kWarpRows;
  if (vectors <= kBlockVectors) return SoftmaxPath::kBlockRows;
  return SoftmaxPath::kClusterRows;
}

std::string LaunchKernels(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                          int count, bool allow_flat) {
  Schedule schedule;
  if (PlanSchedule(plan, dtype, segments, count, allow_flat, &schedule) != cudaSuccess) return "";
  return schedule.Kernels();
}

std::string LaunchSchedule(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                           int count, bool allow_flat) {
  Schedule schedule;
  if (PlanSchedule(plan, dtype, segments, count, allow_flat, &schedule) != cudaSuccess) return "";
  return schedule.ToString();
}

bool FlatKernelTakes(DType dtype, int64_t n) {
  SoftmaxSegment s;
  s.n = n;
  return FlatSegment(dtype, &s, 1, true) != nullptr;
}

int64_t SplitSinglePassMaxLength(const LaunchPlan& plan, DType dtype) {
  const KernelProbe* probe = plan.Find("split_fused", dtype);
  if (probe == nullptr) return 0;
  return static_cast<int64_t>(probe->grid) * kBlockVectors * Vectors(dtype);
}

int64_t SplitStagedMaxLength(const LaunchPlan& plan, DType dtype) {
  const KernelProbe* probe = plan.Find("split_staged", dtype);
  if (probe == nullptr) return 0;
  return static_cast<int64_t>(probe->grid) * (kSplitStagedPartBytes / ItemSize(dtype));
}

int64_t PathMaxLength(const LaunchPlan& plan, DType dtype, SoftmaxPath path) {
  const int64_t v = Vectors(dtype);
  switch (path) {
    case SoftmaxPath::kWarpRows: return kWarpVectors * v;
    case SoftmaxPath::kBlockRows: return kBlockVectors * v;
    case SoftmaxPath::kClusterRows: return ClusterMaxVectors(plan) * v;
    case SoftmaxPath::kStagedRows: return StagedMaxVectors(plan, dtype) * v;
    default: return (int64_t{1} << 31) - 1;
  }
}

size_t SoftmaxScratchBytes(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                           int count) {
  size_t entries = 0;
  size_t total = 0;
  for (int i = 0; i < count; ++i) {
    if (Empty(segments[i])) continue;
    const SoftmaxKernel kernel = RowKernelOf(plan, dtype, segments[i]);
    const SoftmaxPath path = ChoosePath(plan, dtype, segments[i]);
    if (path == SoftmaxPath::kSplitRows || path == SoftmaxPath::kStrided) {
      total += SegmentScratch(plan, dtype, segments[i], path);
    }
    entries += TableEntries(kernel, segments[i]);
  }
  if (entries > static_cast<size_t>(kInlineSegments)) total += Align256(entries * sizeof(RowSegment));
  return total;
}

}  // namespace gpu
}  // namespace softmax
