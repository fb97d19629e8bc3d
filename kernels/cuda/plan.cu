// Host-side planning: the launch plan (occupancy probe), which path takes a
// segment, the geometry of each path, and the scratch a launch needs. No
// kernel lives here (launch.cu owns them all).
#include "kernels/cuda/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace softmax {
namespace gpu {
namespace detail {

int GridOf(const LaunchPlan& plan, const std::string& kernel, DType dtype, int cluster) {
  const KernelProbe* probe = plan.Find(kernel, dtype, cluster);
  return probe != nullptr ? probe->grid : plan.multiprocessors();
}

FlatShape FlatShapeOf(long long vectors) {
  const int group_log2 = CeilLog2(CeilDiv(vectors, kFlatSlots));
  const int threads = group_log2 <= 5 ? 256 : std::max(64, 1 << group_log2);
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

TableShape TableShapeOf(long long vectors) {
  if (vectors <= kFlatMaxVectors) return {FlatShapeOf(vectors).group_log2, kFlatSlots};
  // At most kTableSlots vectors per thread, no 64-thread groups.
  const int group_log2 = CeilLog2(CeilDiv(vectors, kTableSlots));
  return {group_log2 > 5 && group_log2 < 7 ? 7 : group_log2, kTableSlots};
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
  // Longer rows go to split_staged where the plan has it.
  if (vectors * 16 > kStagedMaxRowBytes && plan.Find("split_staged", dtype) != nullptr) return false;
  int cluster = 1;
  while (cluster < largest && CeilDiv(vectors, cluster) * 16 > kStagedTargetBytes) cluster *= 2;
  const long long chunk = CeilDiv(vectors, cluster);
  if (chunk * 16 > kStagedMaxBytes) return false;
  shape->cluster = cluster;
  shape->chunk_vectors = static_cast<int>(chunk);
  shape->shared_bytes = static_cast<size_t>(chunk) * 16;
  return true;
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
  const long long grid = GridOf(plan, "strided_stats", dtype);
  long long parts =
      std::min(CeilDiv(s.n, rows_per_pass), std::max(1LL, CeilDiv(grid, shape.strips)));
  shape.part_rows = CeilDiv(CeilDiv(s.n, parts), rows_per_pass) * rows_per_pass;
  shape.parts = static_cast<int>(CeilDiv(s.n, shape.part_rows));
  return shape;
}

size_t TableEntries(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s) {
  switch (RowKernelOf(plan, dtype, s)) {
    case RowKernel::kFlat:
    case RowKernel::kFlatTable:
    case RowKernel::kOnChipCluster:
      return static_cast<size_t>(CeilDiv(s.outer, kMaxPieceRows));
    case RowKernel::kStaged:  // pieces, and one more where a launch fills up
      return static_cast<size_t>(CeilDiv(s.outer, kStagedPieceRows)) + 1;
    default:
      return 0;
  }
}

size_t SegmentScratch(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s,
                      SoftmaxPath path) {
  if (path == SoftmaxPath::kSplitRows) {
    const SplitShape shape = SplitShapeOf(plan, dtype, s);
    return Align256(sizeof(float2) * s.outer * shape.parts) + Align256(sizeof(float2) * s.outer) +
           Align256(sizeof(unsigned) * s.outer);
  }
  if (path == SoftmaxPath::kStrided) {
    const StridedShape shape = StridedShapeOf(plan, dtype, s);
    const size_t columns = 32 * Vectors(dtype);
    const size_t os = static_cast<size_t>(s.outer * shape.strips);
    return Align256(sizeof(float2) * columns * os * shape.parts) +
           Align256(sizeof(float2) * columns * os) + Align256(sizeof(unsigned) * os);
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
  long long lo = kTableMaxVectors;  // the floor; find the largest length that fits
  long long hi = kMaxClusterSize * kStagedMaxBytes / 16;
  if (!StagedShapeOf(plan, dtype, lo + 1, &shape)) return 0;
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
// 16-byte rows), so alignment is part of a row's identity there. The server's
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
RowKernel RowKernelOf(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& segment) {
  if (segment.inner != 1) return RowKernel::kStrided;
  const long long vectors = CeilDiv(segment.n, Vectors(dtype));
  if (vectors <= kFlatMaxVectors) return RowKernel::kFlat;
  StagedShape staged;
  if (VectorAligned(dtype, segment) && StagedShapeOf(plan, dtype, vectors, &staged)) {
    return RowKernel::kStaged;
  }
  if (vectors <= kTableMaxVectors) return RowKernel::kFlatTable;
  if (vectors <= ClusterMaxVectors(plan)) return RowKernel::kOnChipCluster;
  const SplitShape split = SplitShapeOf(plan, dtype, segment);
  if (split.staged) return RowKernel::kSplitStaged;
  return split.fused ? RowKernel::kSplitFused : RowKernel::kSplitTwoPass;
}

const char* RowKernelName(RowKernel kernel) {
  switch (kernel) {
    case RowKernel::kFlat: return "flat";
    case RowKernel::kFlatTable: return "flat_table";
    case RowKernel::kStaged: return "staged";
    case RowKernel::kOnChipCluster: return "on_chip";
    case RowKernel::kSplitStaged: return "split_staged";
    case RowKernel::kSplitFused: return "split_fused";
    case RowKernel::kSplitTwoPass: return "split_stats,split_normalize";
    case RowKernel::kStrided: return "strided_stats,strided_normalize";
  }
  return "unknown";
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

cudaError_t LaunchPlan::Create(int device, LaunchPlan* plan) {
  cudaError_t error = cudaSetDevice(device);
  if (error != cudaSuccess) return error;
  cudaDeviceProp prop;
  error = cudaGetDeviceProperties(&prop, device);
  if (error != cudaSuccess) return error;
  LaunchPlan p;
  p.device_ = device;
  p.device_name_ = prop.name;
  p.multiprocessors_ = prop.multiProcessorCount;
  p.l2_bytes_ = prop.l2CacheSize;
  p.clusters_supported_ = prop.major >= 9;
  p.max_cluster_size_ = kMaxClusterSize;
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    error = ProbeKernels(dtype, p.multiprocessors_, p.clusters_supported_, &p.probes_,
                         &p.max_cluster_size_);
    if (error != cudaSuccess) return error;
  }
  p.max_cluster_size_ = std::min(p.max_cluster_size_, kMaxUsedClusterSize);
  if (!p.clusters_supported_) p.max_cluster_size_ = 1;
  *plan = std::move(p);
  return cudaSuccess;
}

const KernelProbe* LaunchPlan::Find(const std::string& family, DType dtype,
                                    int cluster_size) const {
  const std::string name = family + "<" + DTypeName(dtype) + ">";
  for (const KernelProbe& probe : probes_) {
    if (probe.kernel == name && probe.cluster_size == cluster_size) return &probe;
  }
  return nullptr;
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
    case RowKernel::kStrided: return SoftmaxPath::kStrided;
    case RowKernel::kStaged: return SoftmaxPath::kStagedRows;
    case RowKernel::kSplitStaged:
    case RowKernel::kSplitFused:
    case RowKernel::kSplitTwoPass: return SoftmaxPath::kSplitRows;
    default: break;
  }
  // Register rows, named by length: the path the on-chip kernel takes them
  // by (allow_flat false, or the cluster path beyond the flat table kernel).
  if (vectors <= kWarpVectors) return SoftmaxPath::kWarpRows;
  if (vectors <= kBlockVectors) return SoftmaxPath::kBlockRows;
  return SoftmaxPath::kClusterRows;
}

std::string LaunchKernels(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                          int count, bool allow_flat) {
  if (FlatSegment(dtype, segments, count, allow_flat) != nullptr) return "flat";
  std::vector<std::string> kernels;
  bool flat_table = false;
  bool on_chip = false;
  auto add = [&kernels](const std::string& k) {
    if (std::find(kernels.begin(), kernels.end(), k) == kernels.end()) kernels.push_back(k);
  };
  for (int i = 0; i < count; ++i) {
    const SoftmaxSegment& s = segments[i];
    if (Empty(s)) continue;
    const RowKernel kernel = RowKernelOf(plan, dtype, s);
    switch (kernel) {
      case RowKernel::kFlat:
      case RowKernel::kFlatTable:
        (allow_flat ? flat_table : on_chip) = true;
        break;
      case RowKernel::kOnChipCluster:
        on_chip = true;
        break;
      default:
        add(RowKernelName(kernel));
    }
  }
  std::string out;
  if (flat_table) out = "flat_table";
  if (on_chip) out += std::string(out.empty() ? "" : ",") + "on_chip";
  for (const std::string& k : kernels) out += (out.empty() ? "" : ",") + k;
  return out;
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
    const SoftmaxPath path = ChoosePath(plan, dtype, segments[i]);
    if (path == SoftmaxPath::kSplitRows || path == SoftmaxPath::kStrided) {
      total += SegmentScratch(plan, dtype, segments[i], path);
    }
    entries += TableEntries(plan, dtype, segments[i]);
  }
  if (entries > static_cast<size_t>(kInlineSegments)) total += Align256(entries * sizeof(RowSegment));
  return total;
}

}  // namespace gpu
}  // namespace softmax
