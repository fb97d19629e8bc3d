// The one translation unit that instantiates every kernel: the occupancy
// probe of each (ProbeKernels) and LaunchSoftmax, which turns a table of
// segments into launches (plan.cu decides the paths and their geometry).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flat.cuh"
#include "kernels/cuda/on_chip.cuh"
#include "kernels/cuda/plan.h"
#include "kernels/cuda/split.cuh"
#include "kernels/cuda/staged.cuh"
#include "kernels/cuda/strided.cuh"
#include "kernels/softmax_cuda.h"

namespace softmax {
namespace gpu {
namespace detail {
namespace {

#define SOFTMAX_CUDA_RETURN_IF_ERROR(expr)    \
  do {                                        \
    const cudaError_t error_ = (expr);        \
    if (error_ != cudaSuccess) return error_; \
  } while (0)

// Flat kernel block sizes that FlatShapeOf returns.
constexpr int kFlatThreads[] = {64, 128, 256, 512};

cudaError_t ProbeKernel(const void* kernel, const std::string& name, const char* paths,
                        DType dtype, int multiprocessors, KernelProbe* probe,
                        int threads = kThreads, size_t dynamic_shared = 0) {
  cudaFuncAttributes attributes;
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, kernel));
  int blocks = 0;
  SOFTMAX_CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, dynamic_shared));
  probe->kernel = name + "<" + DTypeName(dtype) + ">";
  probe->paths = paths;
  probe->dtype = dtype;
  probe->threads_per_block = threads;
  probe->registers_per_thread = attributes.numRegs;
  probe->local_bytes_per_thread = static_cast<int>(attributes.localSizeBytes);
  probe->static_shared_bytes = static_cast<int>(attributes.sharedSizeBytes);
  probe->blocks_per_sm = blocks;
  probe->cluster_size = 1;
  probe->max_active_clusters = 0;
  probe->grid = std::max(1, blocks) * multiprocessors;
  return cudaSuccess;
}

// Clusters of `size` blocks of `kernel` that fit at once (0 when none or on error).
int ActiveClusters(const void* kernel, int size, int threads, size_t dynamic_shared,
                   int multiprocessors) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(size * multiprocessors, 1, 1);
  config.blockDim = dim3(threads, 1, 1);
  config.dynamicSmemBytes = dynamic_shared;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = size;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int active = 0;
  if (cudaOccupancyMaxActiveClusters(&active, kernel, &config) != cudaSuccess) {
    cudaGetLastError();
    active = 0;
  }
  return active;
}

template <typename T>
cudaError_t ProbeTyped(DType dtype, int multiprocessors, bool clusters,
                       std::vector<KernelProbe>* probes, int* max_cluster) {
  const void* on_chip = reinterpret_cast<const void*>(&OnChipKernel<T>);
  KernelProbe probe;
  SOFTMAX_CUDA_RETURN_IF_ERROR(
      ProbeKernel(on_chip, "on_chip", "warp,block", dtype, multiprocessors, &probe));
  probes->push_back(probe);
  for (const int threads : kFlatThreads) {
    KernelProbe flat;
    SOFTMAX_CUDA_RETURN_IF_ERROR(
        ProbeKernel(reinterpret_cast<const void*>(&FlatKernel<T, true, false>),
                    FlatProbeName(threads), "flat", dtype, multiprocessors, &flat, threads));
    probes->push_back(flat);
  }
  {
    SOFTMAX_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(reinterpret_cast<const void*>(&FlatTableKernel<T>),
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(kTableMaxSharedBytes)));
    KernelProbe table;
    SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(reinterpret_cast<const void*>(&FlatTableKernel<T>),
                                             "flat_table", "flat_table", dtype, multiprocessors,
                                             &table, kTableThreads));
    probes->push_back(table);
  }
  int best = 1;
  if (clusters) {
    for (int size = 2; size <= kMaxClusterSize; size *= 2) {
      if (size > 8 && cudaFuncSetAttribute(on_chip, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                           1) != cudaSuccess) {
        cudaGetLastError();
        break;
      }
      const int active = ActiveClusters(on_chip, size, kThreads, 0, multiprocessors);
      if (active <= 0) break;
      KernelProbe c = probe;
      c.paths = "warp,block,cluster";
      c.cluster_size = size;
      c.max_active_clusters = active;
      c.grid = active * size;
      probes->push_back(c);
      best = size;
    }
    // split_staged: probed at its largest share.
    const void* split_staged = reinterpret_cast<const void*>(&SplitStagedKernel<T>);
    SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        split_staged, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(kSplitStagedPartBytes)));
    KernelProbe split_probe;
    SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(split_staged, "split_staged", "split", dtype,
                                             multiprocessors, &split_probe, kStagedThreads,
                                             kSplitStagedPartBytes));
    if (split_probe.blocks_per_sm > 0) probes->push_back(split_probe);
    // Staged: probed at the largest share; one entry per cluster size that
    // fits at least once.
    const void* staged = reinterpret_cast<const void*>(&StagedKernel<T>);
    SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        staged, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kStagedMaxBytes)));
    KernelProbe base;
    SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(staged, "staged", "staged", dtype, multiprocessors,
                                             &base, kStagedThreads, kStagedMaxBytes));
    for (int size = 1; size <= kMaxClusterSize; size *= 2) {
      if (size > 8 && cudaFuncSetAttribute(staged, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                           1) != cudaSuccess) {
        cudaGetLastError();
        break;
      }
      const int active =
          ActiveClusters(staged, size, kStagedThreads, kStagedMaxBytes, multiprocessors);
      if (active <= 0) break;
      KernelProbe c = base;
      c.cluster_size = size;
      c.max_active_clusters = active;
      c.grid = active * size;
      probes->push_back(c);
    }
  }
  *max_cluster = std::min(*max_cluster, best);
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(reinterpret_cast<const void*>(&SplitFusedKernel<T, true>),
                                           "split_fused", "split", dtype, multiprocessors, &probe));
  probes->push_back(probe);
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(reinterpret_cast<const void*>(&SplitStatsKernel<T, true>),
                                           "split_stats", "split", dtype, multiprocessors, &probe));
  probes->push_back(probe);
  SOFTMAX_CUDA_RETURN_IF_ERROR(
      ProbeKernel(reinterpret_cast<const void*>(&SplitNormalizeKernel<T, true>), "split_normalize",
                  "split", dtype, multiprocessors, &probe));
  probes->push_back(probe);
  SOFTMAX_CUDA_RETURN_IF_ERROR(
      ProbeKernel(reinterpret_cast<const void*>(&StridedStatsKernel<T, true>), "strided_stats",
                  "strided", dtype, multiprocessors, &probe));
  probes->push_back(probe);
  SOFTMAX_CUDA_RETURN_IF_ERROR(
      ProbeKernel(reinterpret_cast<const void*>(&StridedNormalizeKernel<T, true>),
                  "strided_normalize", "strided", dtype, multiprocessors, &probe));
  probes->push_back(probe);
  return cudaSuccess;
}

// Copies an on-chip or flat table into the kernel argument (inline) or into
// `table_scratch` (more than kInlineSegments entries).
cudaError_t FillTable(const std::vector<RowSegment>& rows, void* table_scratch,
                      cudaStream_t stream, TableArgs* args) {
  std::memset(args, 0, sizeof(*args));
  args->count = static_cast<int>(rows.size());
  if (rows.size() <= static_cast<size_t>(kInlineSegments)) {
    std::copy(rows.begin(), rows.end(), args->inline_segments);
    return cudaSuccess;
  }
  args->table = static_cast<const RowSegment*>(table_scratch);
  return cudaMemcpyAsync(table_scratch, rows.data(), rows.size() * sizeof(RowSegment),
                         cudaMemcpyHostToDevice, stream);
}

template <typename T>
cudaError_t LaunchOnChip(const LaunchPlan& plan, DType dtype, const std::vector<RowSegment>& rows,
                         int launch_cluster, void* table_scratch, cudaStream_t stream) {
  TableArgs args;
  SOFTMAX_CUDA_RETURN_IF_ERROR(FillTable(rows, table_scratch, stream, &args));
  args.launch_cluster = launch_cluster;
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(kThreads, 1, 1);
  config.stream = stream;
  cudaLaunchAttribute attribute;
  if (launch_cluster > 1) {
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = launch_cluster;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  config.gridDim = dim3(GridOf(plan, "on_chip", dtype, launch_cluster), 1, 1);
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, OnChipKernel<T>, args));
  return cudaGetLastError();
}

// Calls `take` with a last-axis segment's table entries, one per piece of at
// most kMaxPieceRows rows (which keeps the kernels' indices 32-bit): pointers,
// rows, n and scale set; config and units are the caller's. No allocation:
// it runs for every segment of every launch.
template <typename T, typename Take>
void ForEachPiece(const SoftmaxSegment& s, Take take) {
  const size_t item = sizeof(typename Traits<T>::Bits);
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

// The flat table entries of a segment (RowKernel kFlat or kFlatTable): its
// rows' geometry (TableShapeOf) in the config word, in pieces (ForEachPiece).
template <typename T>
void AppendFlatTable(const SoftmaxSegment& s, DType dtype, std::vector<RowSegment>* rows) {
  constexpr int V = VecWidth<T>();
  const TableShape shape = TableShapeOf(CeilDiv(s.n, V));
  const int config = (s.log ? kLogBit : 0) | (VectorAligned(dtype, s) ? kVecBit : 0) |
                     (shape.group_log2 << kShapeShift) | (shape.slots << kSlotsShift);
  const long long rows_per_unit =
      (kTableThreads >> shape.group_log2) * TableRowsPerGroup(shape.slots);
  ForEachPiece<T>(s, [&](RowSegment r) {
    r.config = config;
    r.units = static_cast<int>(CeilDiv(r.rows, rows_per_unit));
    rows->push_back(r);
  });
}

// Launches the flat table kernel over `rows` (AppendFlatTable), in as few
// launches as keep its unit indices in int, each with a one-pass grid; each
// unit prefetches the unit `resident_blocks` ahead, the one that starts as
// this wave of blocks ends. Dynamic shared memory only where a segment's
// rows are not 16-byte aligned.
template <typename T>
cudaError_t LaunchFlatTable(std::vector<RowSegment>* rows, int resident_blocks,
                            void* table_scratch, cudaStream_t stream) {
  size_t begin = 0;
  while (begin < rows->size()) {
    std::vector<RowSegment> part;
    long long units = 0;
    size_t shared = 0;
    for (; begin < rows->size(); ++begin) {
      RowSegment r = (*rows)[begin];
      if (!part.empty() && units + r.units > 0x7fffffffLL) break;
      r.first_worker = static_cast<int>(units);
      units += r.units;
      if ((r.config & kVecBit) == 0) {
        const int group_log2 = (r.config >> kShapeShift) & 0xf;
        const int slots = (r.config >> kSlotsShift) & 0xf;
        shared = std::max(shared, static_cast<size_t>(TableRowsPerGroup(slots)) *
                                      (static_cast<size_t>(slots) * kTableThreads +
                                       (kTableThreads >> group_log2)) * 16);
      }
      part.push_back(r);
    }
    TableArgs args;
    SOFTMAX_CUDA_RETURN_IF_ERROR(FillTable(part, table_scratch, stream, &args));
    args.launch_cluster = static_cast<int>(units);
    args.prefetch_units = resident_blocks;
    FlatTableKernel<T><<<static_cast<unsigned>(units), kTableThreads, shared, stream>>>(args);
    SOFTMAX_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t LaunchFlat(DType dtype, const SoftmaxSegment& s, cudaStream_t stream) {
  constexpr int V = VecWidth<T>();
  const FlatShape shape = FlatShapeOf(CeilDiv(s.n, V));
  FlatArgs a = {};
  a.input = s.input;
  a.output = s.output;
  a.rows = s.outer;
  a.n = s.n;
  a.scale = Log2Scale(s);
  a.group_log2 = shape.group_log2;
  const bool vec = VectorAligned(dtype, s);
  // One pass over the rows: each block one group of rows.
  const long long groups = shape.threads >> shape.group_log2;
  const long long grid = std::min<long long>(CeilDiv(s.outer, std::max(1LL, groups)), 0x7fffffffLL);
  auto kernel = vec ? (s.log ? FlatKernel<T, true, true> : FlatKernel<T, true, false>)
                    : (s.log ? FlatKernel<T, false, true> : FlatKernel<T, false, false>);
  kernel<<<static_cast<unsigned>(grid), shape.threads, 0, stream>>>(a);
  return cudaGetLastError();
}

// The staged kernel over every staged segment of a launch: one launch per
// cluster size (a row per cluster; the segments of one size share it, found
// by binary search), with the largest share among them as dynamic shared
// memory; grids beyond 2^31 - 1 blocks go in pieces.
template <typename T>
cudaError_t LaunchStagedTable(const LaunchPlan& plan, DType dtype,
                              const std::vector<const SoftmaxSegment*>& segments,
                              void* table_scratch, cudaStream_t stream) {
  const size_t item = sizeof(typename Traits<T>::Bits);
  for (int cluster = 1; cluster <= kMaxClusterSize; cluster *= 2) {
    const long long max_rows = 0x7fffffffLL / cluster;
    std::vector<RowSegment> rows;
    size_t shared = 0;
    long long clusters = 0;
    auto flush = [&]() -> cudaError_t {
      if (rows.empty()) return cudaSuccess;
      TableArgs args;
      SOFTMAX_CUDA_RETURN_IF_ERROR(FillTable(rows, table_scratch, stream, &args));
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(static_cast<unsigned>(clusters * cluster), 1, 1);
      config.blockDim = dim3(kStagedThreads, 1, 1);
      config.dynamicSmemBytes = shared;
      config.stream = stream;
      cudaLaunchAttribute attribute;
      attribute.id = cudaLaunchAttributeClusterDimension;
      attribute.val.clusterDim.x = cluster;
      attribute.val.clusterDim.y = 1;
      attribute.val.clusterDim.z = 1;
      config.attrs = &attribute;
      config.numAttrs = 1;
      SOFTMAX_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, StagedKernel<T>, args));
      SOFTMAX_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      rows.clear();
      shared = 0;
      clusters = 0;
      return cudaSuccess;
    };
    for (const SoftmaxSegment* s : segments) {
      StagedShape shape;
      if (!StagedShapeOf(plan, dtype, CeilDiv(s->n, VecWidth<T>()), &shape)) {
        return cudaErrorInvalidValue;
      }
      if (shape.cluster != cluster) continue;
      const size_t pitch = static_cast<size_t>(s->n) * item;
      for (long long first = 0; first < s->outer;) {
        if (clusters == max_rows) SOFTMAX_CUDA_RETURN_IF_ERROR(flush());
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
        rows.push_back(r);
        clusters += take;
        shared = std::max(shared, shape.shared_bytes);
        first += take;
      }
    }
    SOFTMAX_CUDA_RETURN_IF_ERROR(flush());
  }
  return cudaSuccess;
}

// Launches a split kernel cooperatively: every block resident at once, which
// the kernels' waits between blocks rely on.
cudaError_t LaunchCooperative(void (*kernel)(SplitArgs), unsigned grid, int threads,
                              size_t shared_bytes, cudaStream_t stream, const SplitArgs& a) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid, 1, 1);
  config.blockDim = dim3(threads, 1, 1);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, kernel, a));
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchSplit(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s,
                        char* scratch, size_t scratch_bytes, size_t* offset, cudaStream_t stream) {
  const SplitShape shape = SplitShapeOf(plan, dtype, s);
  SplitArgs a = {};
  a.input = s.input;
  a.output = s.output;
  a.rows = s.outer;
  a.n = s.n;
  a.part_vectors = shape.part_vectors;
  a.parts = shape.parts;
  a.scale = Log2Scale(s);
  a.log = s.log;
  a.vec = VectorAligned(dtype, s);
  a.partials = reinterpret_cast<float2*>(scratch + *offset);
  *offset += Align256(sizeof(float2) * s.outer * shape.parts);
  a.finals = reinterpret_cast<float2*>(scratch + *offset);
  *offset += Align256(sizeof(float2) * s.outer);
  a.counters = reinterpret_cast<unsigned*>(scratch + *offset);
  *offset += Align256(sizeof(unsigned) * s.outer);
  if (*offset > scratch_bytes) return cudaErrorInvalidValue;
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.counters, 0, sizeof(unsigned) * s.outer, stream));
  const long long units = s.outer * shape.parts;
  if (shape.staged) {
    return LaunchCooperative(SplitStagedKernel<T>, static_cast<unsigned>(shape.grid),
                             kStagedThreads, static_cast<size_t>(shape.part_vectors) * 16,
                             stream, a);
  }
  if (shape.fused) {
    return LaunchCooperative(
        a.vec ? SplitFusedKernel<T, true> : SplitFusedKernel<T, false>,
        static_cast<unsigned>(std::min<long long>(units, GridOf(plan, "split_fused", dtype))),
        kThreads, 0, stream, a);
  }
  const int stats_grid =
      static_cast<int>(std::min<long long>(units, GridOf(plan, "split_stats", dtype)));
  const int norm_grid =
      static_cast<int>(std::min<long long>(units, GridOf(plan, "split_normalize", dtype)));
  (a.vec ? SplitStatsKernel<T, true> : SplitStatsKernel<T, false>)<<<stats_grid, kThreads, 0, stream>>>(a);
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  (a.vec ? SplitNormalizeKernel<T, true>
         : SplitNormalizeKernel<T, false>)<<<norm_grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchStrided(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s,
                          char* scratch, size_t scratch_bytes, size_t* offset,
                          cudaStream_t stream) {
  constexpr int V = VecWidth<T>();
  const StridedShape shape = StridedShapeOf(plan, dtype, s);
  StridedArgs a = {};
  a.input = s.input;
  a.output = s.output;
  a.outer = s.outer;
  a.n = s.n;
  a.inner = s.inner;
  a.strips = shape.strips;
  a.part_rows = shape.part_rows;
  a.parts = shape.parts;
  a.lanes_log2 = shape.lanes_log2;
  a.scale = Log2Scale(s);
  a.log = s.log;
  a.vec = Aligned16(s.input) && Aligned16(s.output) && (s.inner * ItemSize(dtype)) % 16 == 0;
  const size_t columns = 32 * V;
  const size_t os = static_cast<size_t>(s.outer * shape.strips);
  a.partials = reinterpret_cast<float2*>(scratch + *offset);
  *offset += Align256(sizeof(float2) * columns * os * shape.parts);
  a.finals = reinterpret_cast<float2*>(scratch + *offset);
  *offset += Align256(sizeof(float2) * columns * os);
  a.counters = reinterpret_cast<unsigned*>(scratch + *offset);
  *offset += Align256(sizeof(unsigned) * os);
  if (*offset > scratch_bytes) return cudaErrorInvalidValue;
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.counters, 0, sizeof(unsigned) * os, stream));
  const long long units = static_cast<long long>(os) * shape.parts;
  const int stats_grid =
      static_cast<int>(std::min<long long>(units, GridOf(plan, "strided_stats", dtype)));
  const int norm_grid =
      static_cast<int>(std::min<long long>(units, GridOf(plan, "strided_normalize", dtype)));
  (a.vec ? StridedStatsKernel<T, true>
         : StridedStatsKernel<T, false>)<<<stats_grid, kThreads, 0, stream>>>(a);
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  (a.vec ? StridedNormalizeKernel<T, true>
         : StridedNormalizeKernel<T, false>)<<<norm_grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

// The on-chip table entry config and units of a warp/block/cluster segment.
template <typename T>
void AppendOnChip(const SoftmaxSegment& s, SoftmaxPath path, DType dtype, int grid,
                  int launch_cluster, long long* unit_counter, std::vector<RowSegment>* rows) {
  constexpr int V = VecWidth<T>();
  const long long vectors = CeilDiv(s.n, V);
  const bool vec = VectorAligned(dtype, s);
  int config = static_cast<int>(path) | (s.log ? kLogBit : 0) | (vec ? kVecBit : 0);
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
    const int cluster_log2 = ClusterLog2(vectors);
    config |= cluster_log2 << kShapeShift;
    workers = static_cast<long long>(grid / launch_cluster) * (launch_cluster >> cluster_log2);
  }
  ForEachPiece<T>(s, [&](RowSegment r) {
    r.units = static_cast<int>(CeilDiv(r.rows, rows_per_unit));
    r.config = config;
    r.first_worker = static_cast<int>(*unit_counter % workers);
    *unit_counter += r.units;
    rows->push_back(r);
  });
}

template <typename T>
cudaError_t LaunchTyped(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                        int count, char* scratch, size_t scratch_bytes, cudaStream_t stream,
                        bool allow_flat) {
  constexpr int V = VecWidth<T>();
  // A launch of one segment of flat rows: the flat kernel, the flat table
  // kernel's order (RowKernelOf).
  if (const SoftmaxSegment* flat = FlatSegment(dtype, segments, count, allow_flat)) {
    return LaunchFlat<T>(dtype, *flat, stream);
  }
  // Pass 1: which kernel takes each segment (the rule, per segment), and the
  // cluster size of the on-chip launch (largest any of its segments needs).
  std::vector<RowKernel> kernels(count, RowKernel::kFlat);
  int launch_cluster = 1;
  for (int i = 0; i < count; ++i) {
    const SoftmaxSegment& s = segments[i];
    if (Empty(s)) continue;
    kernels[i] = RowKernelOf(plan, dtype, s);
    const bool on_chip = kernels[i] == RowKernel::kOnChipCluster ||
                         (!allow_flat && (kernels[i] == RowKernel::kFlat ||
                                          kernels[i] == RowKernel::kFlatTable));
    if (on_chip && ChoosePath(plan, dtype, s) == SoftmaxPath::kClusterRows) {
      launch_cluster = std::max(launch_cluster, 1 << ClusterLog2(CeilDiv(s.n, V)));
    }
  }
  const int grid = GridOf(plan, "on_chip", dtype, launch_cluster);
  // Pass 2: the flat table and on-chip tables; on-chip units are numbered in
  // one rotation across segments.
  std::vector<RowSegment> flat_rows;
  std::vector<RowSegment> on_chip_rows;
  long long unit_counter = 0;
  for (int i = 0; i < count; ++i) {
    const SoftmaxSegment& s = segments[i];
    if (Empty(s)) continue;
    const RowKernel kernel = kernels[i];
    if (kernel == RowKernel::kFlat || kernel == RowKernel::kFlatTable) {
      if (allow_flat) {
        AppendFlatTable<T>(s, dtype, &flat_rows);
      } else {
        AppendOnChip<T>(s, ChoosePath(plan, dtype, s), dtype, grid, launch_cluster,
                        &unit_counter, &on_chip_rows);
      }
    } else if (kernel == RowKernel::kOnChipCluster) {
      AppendOnChip<T>(s, SoftmaxPath::kClusterRows, dtype, grid, launch_cluster, &unit_counter,
                      &on_chip_rows);
    }
  }
  // Every table launch uses the one table area of the scratch, one after
  // the other (stream order: a copy lands after the kernel before it ran).
  size_t offset = 0;
  char* table_scratch = nullptr;
  size_t table_entries = 0;
  std::vector<const SoftmaxSegment*> staged;
  for (int i = 0; i < count; ++i) {
    if (Empty(segments[i])) continue;
    table_entries += TableEntries(plan, dtype, segments[i]);
    if (kernels[i] == RowKernel::kStaged) staged.push_back(&segments[i]);
  }
  if (table_entries > static_cast<size_t>(kInlineSegments)) {
    table_scratch = scratch;
    offset += Align256(table_entries * sizeof(RowSegment));
    if (offset > scratch_bytes) return cudaErrorInvalidValue;
  }
  if (!flat_rows.empty()) {
    SOFTMAX_CUDA_RETURN_IF_ERROR(
        LaunchFlatTable<T>(&flat_rows, GridOf(plan, "flat_table", dtype), table_scratch, stream));
  }
  if (!on_chip_rows.empty()) {
    SOFTMAX_CUDA_RETURN_IF_ERROR(
        LaunchOnChip<T>(plan, dtype, on_chip_rows, launch_cluster, table_scratch, stream));
  }
  if (!staged.empty()) {
    SOFTMAX_CUDA_RETURN_IF_ERROR(LaunchStagedTable<T>(plan, dtype, staged, table_scratch, stream));
  }
  // Pass 3: one launch (two for rows read twice) per split or strided segment.
  for (int i = 0; i < count; ++i) {
    const SoftmaxSegment& s = segments[i];
    if (Empty(s)) continue;
    switch (kernels[i]) {
      case RowKernel::kSplitStaged:
      case RowKernel::kSplitFused:
      case RowKernel::kSplitTwoPass:
        SOFTMAX_CUDA_RETURN_IF_ERROR(
            LaunchSplit<T>(plan, dtype, s, scratch, scratch_bytes, &offset, stream));
        break;
      case RowKernel::kStrided:
        SOFTMAX_CUDA_RETURN_IF_ERROR(
            LaunchStrided<T>(plan, dtype, s, scratch, scratch_bytes, &offset, stream));
        break;
      default:
        break;
    }
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t ProbeKernels(DType dtype, int multiprocessors, bool clusters,
                         std::vector<KernelProbe>* probes, int* max_cluster) {
  switch (dtype) {
    case DType::kFloat32:
      return ProbeTyped<float>(dtype, multiprocessors, clusters, probes, max_cluster);
    case DType::kFloat16:
      return ProbeTyped<__half>(dtype, multiprocessors, clusters, probes, max_cluster);
    case DType::kBFloat16:
      return ProbeTyped<__nv_bfloat16>(dtype, multiprocessors, clusters, probes, max_cluster);
  }
  return cudaErrorInvalidValue;
}

}  // namespace detail

cudaError_t LaunchSoftmax(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                          int count, void* scratch, size_t scratch_bytes, cudaStream_t stream,
                          bool allow_flat) {
  if (count < 0 || (count > 0 && segments == nullptr) || plan.multiprocessors() == 0) {
    return cudaErrorInvalidValue;
  }
  for (int i = 0; i < count; ++i) {
    const SoftmaxSegment& s = segments[i];
    if (s.outer < 0 || s.inner < 0 || s.n < 0 || s.n >= (1LL << 31)) return cudaErrorInvalidValue;
    if (detail::Empty(s)) continue;
    if (s.input == nullptr || s.output == nullptr || !(s.temperature > 0.0f) ||
        !std::isfinite(s.temperature)) {
      return cudaErrorInvalidValue;
    }
  }
  if (SoftmaxScratchBytes(plan, dtype, segments, count) > scratch_bytes) {
    return cudaErrorInvalidValue;
  }
  char* bytes = static_cast<char*>(scratch);
  switch (dtype) {
    case DType::kFloat32:
      return detail::LaunchTyped<float>(plan, dtype, segments, count, bytes, scratch_bytes, stream,
                                        allow_flat);
    case DType::kFloat16:
      return detail::LaunchTyped<__half>(plan, dtype, segments, count, bytes, scratch_bytes, stream,
                                         allow_flat);
    case DType::kBFloat16:
      return detail::LaunchTyped<__nv_bfloat16>(plan, dtype, segments, count, bytes, scratch_bytes,
                                                stream, allow_flat);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gpu
}  // namespace softmax
