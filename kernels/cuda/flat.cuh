// The flat kernels: rows held by a group of threads with few vectors per
// thread (2..8), so that many warps per SM keep the memory busy; the row's
// max is reduced first and exp2 taken once per element.
//   flat        launches of ONE last-axis segment with rows of <= 1024 V.
//   flat_table  ragged tables whose rows all hold <= 8192 V, in one launch.
#ifndef SOFTMAX_KERNELS_CUDA_FLAT_CUH_
#define SOFTMAX_KERNELS_CUDA_FLAT_CUH_

#include "kernels/cuda/common.cuh"

namespace softmax {
namespace gpu {
namespace detail {

// Flat path: a launch of ONE last-axis segment whose rows fit in kFlatSlots
// (2) vectors per thread of at most 512 threads. A group of R = 2^group_log2
// threads holds a row (thread t of the group holding vectors j*R + t, so each
// load instruction of a group covers R contiguous vectors); a block holds
// blockDim/R groups (R <= 32) or is one group (R >= 64). With 2 vectors per
// thread the kernel runs at up to 64 warps per SM against the on-chip
// kernel's 16: many blocks in different phases (load, reduce, store) keep the
// memory busy, which the one-row-per-program kernels of Triton's tutorial
// also rely on. The grid is one pass over the rows (a block per group of
// rows); the loop over rows only covers grids capped at 2^31 - 1 blocks.
//
// With so few elements per thread, merging (max, sum) pairs (two exp2 per
// merge) would cost more exp2 than the elements themselves, so the row's max
// is reduced first, then exp2 is taken once per element, kept, summed and
// reduced, and softmax is that value times 1/sum: one exp2 per element.
struct FlatArgs {
  const void* input;
  void* output;
  long long rows;
  long long n;
  float scale;
  int group_log2;
};

// Reduces v over the group (op: max or sum). Groups of <= 32 lanes use
// shuffles; a group spanning the block goes through `slots` (one barrier).
// GroupReduce below does the same for several groups per block, but its
// named barrier with a run-time id makes ptxas reserve all 16 barriers, and
// in this kernel it added spills to the 4-vector forms; the measured build
// uses this one.
template <bool kMax>
__device__ __forceinline__ float FlatReduce(float v, int r_threads, float* slots) {
  const int width = r_threads < 32 ? r_threads : 32;
  for (int offset = width >> 1; offset > 0; offset >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  if (r_threads <= 32) return v;
  if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = v;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  v = lane < (r_threads >> 5) ? slots[lane] : (kMax ? -INFINITY : 0.0f);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  return v;
}

template <typename T, bool kVec, bool kLog>
__global__ void __launch_bounds__(1024) FlatKernel(const FlatArgs a) {
  constexpr int kS = kFlatSlots;
  constexpr int V = VecWidth<T>();
  using Bits = typename Traits<T>::Bits;
  // [parity][max, sum][warp]: double-buffered, so rows need no barrier of
  // their own beyond the two reductions'.
  __shared__ float slots[2][2][32];
  const int group_log2 = a.group_log2;
  const int r_threads = 1 << group_log2;
  const int t = threadIdx.x & (r_threads - 1);
  const int groups = blockDim.x >> group_log2;
  const int group = threadIdx.x >> group_log2;
  const long long pitch = a.n * static_cast<long long>(sizeof(Bits));
  int parity = 0;
  const long long stride = static_cast<long long>(gridDim.x) * groups;
  for (long long base = static_cast<long long>(blockIdx.x) * groups; base < a.rows;
       base += stride) {
    const long long row = base + group;
    const bool valid = row < a.rows;
    uint4 raw[kS];
    const char* in = static_cast<const char*>(a.input) + row * pitch;
#pragma unroll
    for (int j = 0; j < kS; ++j) {
      raw[j] = valid ? LoadVector<T, kVec>(in, j * r_threads + t, a.n) : NegInfVector<T>();
    }
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < kS; ++j) m = fmaxf(m, VectorMax<T>(raw[j]));
    m = FlatReduce<true>(m, r_threads, slots[parity][0]);
    // With m == -inf every value is -inf (-> 0) or NaN: shift by 0 (the sum
    // is then 0 or NaN and the row comes out NaN, as in the reference).
    const float shift = m == -INFINITY ? 0.0f : m;
    float e[kS][V];
    float d = 0.0f;
#pragma unroll
    for (int j = 0; j < kS; ++j) {
      float x[V];
      Unpack<T>(raw[j], x);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        e[j][k] = kLog ? (x[k] - shift) * a.scale : FastExp2((x[k] - shift) * a.scale);
        d += kLog ? FastExp2(e[j][k]) : e[j][k];
      }
    }
    d = FlatReduce<false>(d, r_threads, slots[parity][1]);
    parity ^= 1;
    if (valid) {
      char* out = static_cast<char*>(a.output) + row * pitch;
      const float factor = kLog ? log2f(d) : 1.0f / d;
#pragma unroll
      for (int j = 0; j < kS; ++j) {
        float y[V];
#pragma unroll
        for (int k = 0; k < V; ++k) y[k] = kLog ? (e[j][k] - factor) * kLn2 : e[j][k] * factor;
        StoreVector<T, kVec>(out, j * r_threads + t, a.n, Pack<T>(y));
      }
    }
  }
}

// Flat table kernel: the flat kernel's way (a group of threads per row, max
// first, few vectors per thread, one pass of the grid) for a ragged table of
// last-axis segments whose rows hold at most 8192 vectors, in one launch.
// Blocks have 1024 threads; a segment's rows get groups of R = 2^k threads
// (R <= 32, or 128..1024) so that each thread holds at most 8 vectors; a unit
// is one block's worth of a segment's rows (1024 / R rows). Table entries are
// RowSegment with `first_worker` holding the segment's first unit and the
// shape bits holding log2 R. Blocks find their segment by binary search.

// Reduces v over a group of r_threads (max or sum): shuffles within a warp,
// and for groups of whole warps the warps' values through `slots` after a
// named barrier of the group (id 1 + group).
template <bool kMax>
__device__ __forceinline__ float GroupReduce(float v, int r_threads, int group, float* slots) {
  const int width = r_threads < 32 ? r_threads : 32;
  for (int offset = width >> 1; offset > 0; offset >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  if (r_threads <= 32) return v;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  if (lane == 0) slots[warp] = v;
  NamedBarrier(1 + group, r_threads);
  const int warps = r_threads >> 5;
  v = lane < warps ? slots[group * warps + lane] : (kMax ? -INFINITY : 0.0f);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? fmaxf(v, o) : v + o;
  }
  return v;
}

// The table entry holding unit u (entries are sorted by first unit).
__device__ __forceinline__ int TableSegmentOf(const RowSegment* table, int count, int u) {
  int lo = 0;
  int hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (table[mid].first_worker <= u) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

template <typename T>
__global__ void __launch_bounds__(kTableThreads, 1) FlatTableKernel(
    const __grid_constant__ TableArgs args) {
  constexpr int V = VecWidth<T>();
  using Bits = typename Traits<T>::Bits;
  __shared__ float max_slots[32];
  __shared__ float sum_slots[32];
  const RowSegment* table = args.table != nullptr ? args.table : args.inline_segments;
  const int total_units = args.launch_cluster;  // total units of the table
  for (int u = blockIdx.x; u < total_units; u += gridDim.x) {
    // The unit that starts when this wave of blocks ends streams into L2
    // while this one loads, reduces and writes. H200, the ragged mix: 1,712
    // -> 1,775 GB/s (fp32), 1,687 -> 1,777 (fp16).
    const int ahead = u + args.prefetch_units;
    if (threadIdx.x == 0 && args.prefetch_units > 0 && ahead < total_units) {
      const RowSegment& next = table[TableSegmentOf(table, args.count, ahead)];
      const int next_rows = kTableThreads >> ((next.config >> kShapeShift) & 0xf);
      const int first = (ahead - next.first_worker) * next_rows;
      PrefetchL2(static_cast<const Bits*>(next.input) + static_cast<long long>(first) * next.n,
                 static_cast<size_t>(min(next_rows, next.rows - first)) * next.n * sizeof(Bits));
    }
    const RowSegment seg = table[TableSegmentOf(table, args.count, u)];
    const int group_log2 = (seg.config >> kShapeShift) & 0xf;
    const int r_threads = 1 << group_log2;
    const int group = threadIdx.x >> group_log2;
    const int t = threadIdx.x & (r_threads - 1);
    const int row = (u - seg.first_worker) * (kTableThreads >> group_log2) + group;
    const bool valid = row < seg.rows;
    const bool log = seg.config & kLogBit;
    // The row as aligned granules (MaskLanes): `lead` elements of its first
    // granule belong to the row before, so every access is 16 bytes wide
    // whatever the row's length. H200, the 64-tensor ragged mix (random
    // lengths, most rows unaligned): fp16 776 -> 1,794 GB/s, fp32 1,806 -> 1,777.
    const Bits* in = static_cast<const Bits*>(seg.input) + static_cast<long long>(row) * seg.n;
    const int lead = LeadElements<T>(in);
    const int slots_used = (seg.n + lead + V * r_threads - 1) / (V * r_threads);  // <= kTableSlots
    uint4 raw[kTableSlots];
#pragma unroll
    for (int j = 0; j < kTableSlots; ++j) {
      // Element index (in the row) of the granule's first lane; -lead < e0.
      const int e0 = (j * r_threads + t) * V - lead;
      raw[j] = NegInfVector<T>();
      if (valid && j < slots_used && e0 < seg.n) {
        raw[j] = LoadGlobal16(reinterpret_cast<const uint4*>(in + e0));
      }
    }
    // Masked only once every load is issued: a mask between two loads made
    // the warps holding a row's ends wait for each load in turn.
#pragma unroll
    for (int j = 0; j < kTableSlots; ++j) {
      const int e0 = (j * r_threads + t) * V - lead;
      if (j < slots_used && (e0 < 0 || e0 + V > seg.n)) {
        raw[j] = MaskLanes<T>(raw[j], -e0, seg.n - e0);
      }
    }
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTableSlots; ++j) {
      if (j < slots_used) m = fmaxf(m, VectorMax<T>(raw[j]));
    }
    m = GroupReduce<true>(m, r_threads, group, max_slots);
    const float shift = m == -INFINITY ? 0.0f : m;
    float d = 0.0f;
#pragma unroll
    for (int j = 0; j < kTableSlots; ++j) {
      if (j < slots_used) {
        float x[V];
        Unpack<T>(raw[j], x);
#pragma unroll
        for (int k = 0; k < V; ++k) d += FastExp2((x[k] - shift) * seg.scale);
      }
    }
    d = GroupReduce<false>(d, r_threads, group, sum_slots);
    if (valid) {
      const float factor = OutputFactor(log, d);
      Bits* out = static_cast<Bits*>(seg.output) + static_cast<long long>(row) * seg.n;
      // Whole granules go out as 16-byte stores where the output shares the
      // input's offset in its granule (the usual case); the rest element-wise.
      const bool same_lead = LeadElements<T>(out) == lead;
#pragma unroll
      for (int j = 0; j < kTableSlots; ++j) {
        const int e0 = (j * r_threads + t) * V - lead;
        if (j < slots_used && e0 < seg.n) {
          const uint4 y = NormalizeVector<T>(raw[j], shift, seg.scale, log, factor);
          if (same_lead && e0 >= 0 && e0 + V <= seg.n) {
            StoreGlobal16(reinterpret_cast<uint4*>(out + e0), y);
          } else {
            StoreLanes<T>(out, e0, seg.n, y);
          }
        }
      }
    }
    // Group shapes may change with the next unit's segment: no warp may
    // write a slot that another group of this unit still reads.
    __syncthreads();
  }
}

}  // namespace detail
}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_CUDA_FLAT_CUH_
