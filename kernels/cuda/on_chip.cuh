// The on-chip kernel: one persistent launch of 256-thread blocks serves a
// whole table of last-axis segments (any mix of n, temperature and op) along
// three paths chosen per segment, each holding rows in registers (up to 8
// 16-byte vectors per thread) so that each element is read and written once:
//   warp_rows    N <= 256 V: a group of 1..32 lanes per row, several rows per
//                warp, shuffle reductions, no barriers.
//   block_rows   N <= 2048 V: a row per group of 1..8 warps, one named barrier.
//   cluster_rows N <= 32768 V: a row per cluster of 2..8 blocks, (max, sum)
//                pairs exchanged through distributed shared memory.
// With allow_flat (the default) it takes only the cluster path's rows of
// more than 8192 V that are not 16-byte aligned: flat.cuh's kernels take
// rows up to 1024 V, row_staged.cuh's and staged.cuh's the longer ones.
#ifndef SOFTMAX_KERNELS_CUDA_ON_CHIP_CUH_
#define SOFTMAX_KERNELS_CUDA_ON_CHIP_CUH_

#include "kernels/cuda/common.cuh"

namespace softmax {
namespace gpu {
namespace detail {

// Warp path. A group of G = 2^lanes_log2 lanes holds a row; a warp holds
// 32/G rows x kRows; each lane holds kColumns vectors per row (vectors
// c*G + lane), so one load instruction covers 32 contiguous vectors when
// kColumns == 1 (G <= 32) or G == 32. Unit = a tile of (32/G) * kRows rows;
// worker = a warp.
template <typename T, int kColumns, int kRows, bool kVec>
__device__ __forceinline__ void WarpRows(const RowSegment& seg) {
  constexpr int V = VecWidth<T>();
  using Bits = typename Traits<T>::Bits;
  const int lanes_log2 = (seg.config >> kShapeShift) & 0xf;
  const bool log = seg.config & kLogBit;
  const int lane = threadIdx.x & 31;
  const int group_lanes = 1 << lanes_log2;
  const int groups = 32 >> lanes_log2;
  const int lane_in_group = lane & (group_lanes - 1);
  const int workers = gridDim.x * kWarps;
  const int worker = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int n = seg.n;
  const float scale = seg.scale;
  const size_t pitch = static_cast<size_t>(n) * sizeof(Bits);

  const int rows_per_unit = groups * kRows;
  for (int u = FirstUnit(worker, workers, seg.first_worker); u < seg.units; u += workers) {
    const int row0 = u * rows_per_unit + (lane >> lanes_log2);
    uint4 raw[kRows][kColumns];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = row0 + r * groups;
      const char* in = static_cast<const char*>(seg.input) + row * pitch;
#pragma unroll
      for (int c = 0; c < kColumns; ++c) {
        raw[r][c] = row < seg.rows ? LoadVector<T, kVec>(in, c * group_lanes + lane_in_group, n)
                                   : NegInfVector<T>();
      }
    }
    float m[kRows], d[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      m[r] = -INFINITY;
#pragma unroll
      for (int c = 0; c < kColumns; ++c) m[r] = fmaxf(m[r], VectorMax<T>(raw[r][c]));
    }
    for (int offset = group_lanes >> 1; offset > 0; offset >>= 1) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) m[r] = fmaxf(m[r], __shfl_xor_sync(0xffffffffu, m[r], offset));
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float shift = m[r] == -INFINITY ? 0.0f : m[r];
      d[r] = 0.0f;
#pragma unroll
      for (int c = 0; c < kColumns; ++c) {
        float x[V];
        Unpack<T>(raw[r][c], x);
#pragma unroll
        for (int k = 0; k < V; ++k) d[r] += FastExp2((x[k] - shift) * scale);
      }
    }
    for (int offset = group_lanes >> 1; offset > 0; offset >>= 1) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) d[r] += __shfl_xor_sync(0xffffffffu, d[r], offset);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = row0 + r * groups;
      if (row >= seg.rows) continue;
      char* out = static_cast<char*>(seg.output) + row * pitch;
      const float factor = OutputFactor(log, d[r]);
#pragma unroll
      for (int c = 0; c < kColumns; ++c) {
        StoreVector<T, kVec>(out, c * group_lanes + lane_in_group, n,
                       NormalizeVector<T>(raw[r][c], m[r], scale, log, factor));
      }
    }
  }
}

// (WarpRowsPerLane: plan.h.)

// Block path. A group of W = 2^warps_log2 warps (1..8) holds a row, thread t
// holding vectors j*W*32 + t. Unit = a row; worker = a group. One named
// barrier per row; `slots` is double-buffered by `parity`.
template <typename T, bool kVec>
__device__ __forceinline__ void BlockRows(const RowSegment& seg, float2 (*slots)[kWarps]) {
  using Bits = typename Traits<T>::Bits;
  const int warps_log2 = (seg.config >> kShapeShift) & 0xf;
  const bool log = seg.config & kLogBit;
  const int group_warps = 1 << warps_log2;
  const int group_threads = group_warps * 32;
  const int warp = threadIdx.x >> 5;
  const int group = warp >> warps_log2;
  const int t = threadIdx.x & (group_threads - 1);
  const int groups_per_block = kWarps >> warps_log2;
  const int workers = gridDim.x * groups_per_block;
  const int worker = blockIdx.x * groups_per_block + group;
  const int n = seg.n;
  const float scale = seg.scale;
  const size_t pitch = static_cast<size_t>(n) * sizeof(Bits);

  // Skip (block-uniformly) a segment with no row for any group of this block.
  int first_of_block = seg.units;
  for (int g = 0; g < groups_per_block; ++g) {
    first_of_block =
        min(first_of_block, FirstUnit(blockIdx.x * groups_per_block + g, workers, seg.first_worker));
  }
  if (first_of_block >= seg.units) return;
  // Named barrier ids and slots change owners between segments.
  __syncthreads();
  int parity = 0;
  for (int row = FirstUnit(worker, workers, seg.first_worker); row < seg.units; row += workers) {
    const char* in = static_cast<const char*>(seg.input) + row * pitch;
    uint4 raw[kSlots];
#pragma unroll
    for (int j = 0; j < kSlots; ++j) raw[j] = LoadVector<T, kVec>(in, j * group_threads + t, n);
    MaxSum local = WarpMerge(LocalMaxSum<T>(raw, scale), scale);
    if ((threadIdx.x & 31) == 0) slots[parity][warp] = make_float2(local.m, local.d);
    NamedBarrier(1 + group, group_threads);
    MaxSum total{-INFINITY, 0.0f};
    for (int w = 0; w < group_warps; ++w) {
      const float2 s = slots[parity][group * group_warps + w];
      total = Merge(total, MaxSum{s.x, s.y}, scale);
    }
    parity ^= 1;
    const float factor = OutputFactor(log, total.d);
    char* out = static_cast<char*>(seg.output) + row * pitch;
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      StoreVector<T, kVec>(out, j * group_threads + t, n,
                     NormalizeVector<T>(raw[j], total.m, scale, log, factor));
    }
  }
}

// Cluster path. A (sub-)cluster of S = 2^cluster_log2 blocks holds a row;
// block rank r holds vectors [r*chunk, (r+1)*chunk), chunk <= kSlots *
// kThreads. S == 1 (no cluster barrier) is supported but not chosen by the
// host.
// Each block merges its (max, sum) and writes it into the shared memory of
// every block of its sub-cluster (distributed shared memory stores); after one
// cluster barrier every thread reads the S pairs locally. Thread 0 prefetches
// this block's part of the next row into L2 meanwhile (bulk prefetch). A
// launch with cluster size L >= S runs L/S
// sub-clusters per hardware cluster; all of them pass the same number of
// cluster barriers. Unit = a row; worker = a sub-cluster.
template <typename T, bool kVec>
__device__ __forceinline__ void ClusterRows(const RowSegment& seg, int launch_cluster,
                                            float2 (*warp_slots)[kWarps], float2* cluster_slots,
                                            int& parity) {
#if !SOFTMAX_SM90_DEVICE_CODE
  __trap();  // never planned without clusters
#else
  constexpr int V = VecWidth<T>();
  using Bits = typename Traits<T>::Bits;
  cg::cluster_group cluster = cg::this_cluster();
  const int cluster_log2 = (seg.config >> kShapeShift) & 0xf;
  const bool log = seg.config & kLogBit;
  const int sub_size = 1 << cluster_log2;
  const int subs = launch_cluster >> cluster_log2;
  const int rank = static_cast<int>(cluster.block_rank());
  const int sub = rank >> cluster_log2;
  const int hw_cluster = blockIdx.x / launch_cluster;
  const int workers = (gridDim.x / launch_cluster) * subs;
  const int worker = hw_cluster * subs + sub;
  const int n = seg.n;
  const float scale = seg.scale;
  const size_t pitch = static_cast<size_t>(n) * sizeof(Bits);
  const int vectors = (n + V - 1) / V;
  const int chunk = (vectors + sub_size - 1) / sub_size;
  const int first_vector = (rank & (sub_size - 1)) * chunk;

  int min_start = seg.units;
  for (int k = 0; k < subs; ++k) {
    min_start = min(min_start, FirstUnit(hw_cluster * subs + k, workers, seg.first_worker));
  }
  // Skip (cluster-uniformly) a segment with no row for this hardware cluster.
  if (min_start >= seg.units) return;
  __syncthreads();
  const int start = FirstUnit(worker, workers, seg.first_worker);
  const size_t chunk_bytes = static_cast<size_t>(chunk) * 16;
  if (threadIdx.x == 0 && start < seg.units) {
    PrefetchL2(static_cast<const char*>(seg.input) + start * pitch + first_vector * 16,
               min(chunk_bytes, pitch - min(pitch, first_vector * size_t{16})));
  }
  for (int round = 0; min_start + round * workers < seg.units; ++round) {
    const int row = start + round * workers;
    const bool active = row < seg.units;
    const char* in = static_cast<const char*>(seg.input) + (active ? row : 0) * pitch;
    if (threadIdx.x == 0 && row + workers < seg.units) {
      PrefetchL2(in + workers * pitch + first_vector * 16,
                 min(chunk_bytes, pitch - min(pitch, first_vector * size_t{16})));
    }
    uint4 raw[kSlots];
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      const int local = j * kThreads + threadIdx.x;
      raw[j] = (active && local < chunk) ? LoadVector<T, kVec>(in, first_vector + local, n)
                                         : NegInfVector<T>();
    }
    MaxSum mine = WarpMerge(LocalMaxSum<T>(raw, scale), scale);
    if ((threadIdx.x & 31) == 0) warp_slots[parity][threadIdx.x >> 5] = make_float2(mine.m, mine.d);
    __syncthreads();
    if (threadIdx.x == 0) {
      MaxSum block{-INFINITY, 0.0f};
      for (int w = 0; w < kWarps; ++w) {
        block = Merge(block, MaxSum{warp_slots[parity][w].x, warp_slots[parity][w].y}, scale);
      }
      // Push this block's pair into every peer's shared memory (remote stores
      // need no round trip); after the barrier each thread reads locally.
      const float2 mine_pair = make_float2(block.m, block.d);
      float2* slot = cluster_slots + parity * kMaxUsedClusterSize + (rank & (sub_size - 1));
      if (sub_size == 1) {
        *slot = mine_pair;
      } else {
        for (int k = 0; k < sub_size; ++k) *cluster.map_shared_rank(slot, sub * sub_size + k) = mine_pair;
      }
    }
    // Same sub_size in every block of the hardware cluster: uniform choice.
    if (sub_size == 1) {
      __syncthreads();
    } else {
      cluster.sync();
    }
    if (active) {
      MaxSum total{-INFINITY, 0.0f};
      for (int k = 0; k < sub_size; ++k) {
        const float2 s = cluster_slots[parity * kMaxUsedClusterSize + k];
        total = Merge(total, MaxSum{s.x, s.y}, scale);
      }
      const float factor = OutputFactor(log, total.d);
      char* out = static_cast<char*>(seg.output) + row * pitch;
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const int local = j * kThreads + threadIdx.x;
        if (local < chunk) {
          StoreVector<T, kVec>(out, first_vector + local, n,
                         NormalizeVector<T>(raw[j], total.m, scale, log, factor));
        }
      }
    }
    parity ^= 1;
  }
#endif  // SOFTMAX_SM90_DEVICE_CODE
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 2) OnChipKernel(const __grid_constant__ TableArgs args) {
  __shared__ float2 warp_slots[2][kWarps];
  __shared__ float2 cluster_slots[2 * kMaxUsedClusterSize];  // [parity][rank in sub-cluster]
  // Toggles once per cluster round; equal in every block of a hardware
  // cluster, since they all pass the same rounds.
  int cluster_parity = 0;
  const RowSegment* table = args.table != nullptr ? args.table : args.inline_segments;
  DependentsMayStart();
  for (int i = 0; i < args.count; ++i) {
    const RowSegment& seg = table[i];
    const int path = seg.config & kPathMask;
    const bool vec = seg.config & kVecBit;
    if (path == static_cast<int>(SoftmaxPath::kWarpRows)) {
      switch ((seg.config >> kColumnsShift) & 0xf) {
        case 0: vec ? WarpRows<T, 1, 8, true>(seg) : WarpRows<T, 1, 8, false>(seg); break;
        case 1: vec ? WarpRows<T, 2, 4, true>(seg) : WarpRows<T, 2, 4, false>(seg); break;
        case 2: vec ? WarpRows<T, 4, 2, true>(seg) : WarpRows<T, 4, 2, false>(seg); break;
        default: vec ? WarpRows<T, 8, 1, true>(seg) : WarpRows<T, 8, 1, false>(seg); break;
      }
    } else if (path == static_cast<int>(SoftmaxPath::kBlockRows)) {
      if (vec) {
        BlockRows<T, true>(seg, warp_slots);
      } else {
        BlockRows<T, false>(seg, warp_slots);
      }
    } else {
      if (vec) {
        ClusterRows<T, true>(seg, args.launch_cluster, warp_slots, cluster_slots, cluster_parity);
      } else {
        ClusterRows<T, false>(seg, args.launch_cluster, warp_slots, cluster_slots, cluster_parity);
      }
    }
  }
  WaitForPrevious();
  // No block may leave while a peer can still read its shared memory.
#if SOFTMAX_SM90_DEVICE_CODE
  if (args.launch_cluster > 1) cg::this_cluster().sync();
#endif
}

}  // namespace detail
}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_CUDA_ON_CHIP_CUH_
