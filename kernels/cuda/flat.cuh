// The flat kernels: rows of <= 1024 V held by a group of threads with 2
// vectors per thread, so that many warps per SM keep the memory busy; the
// row's max is reduced first and exp2 taken once per element.
//   flat        launches of ONE last-axis segment.
//   flat_table  the rows of ragged tables, in one launch.
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
// (FlatArgs: plan.h.)

// Reduces v over a group of r_threads (op: max or sum): a butterfly of
// shuffles within the warp (width min(R, 32)), and for groups of whole warps
// the warps' values through `slots` after a block barrier (every group of a
// block has the same R), then a butterfly over 32 lanes with the identity
// (-inf or 0) beyond the group's warps. The flat and flat table kernels both
// reduce through this one function: the same tree for the same R.
template <bool kMax>
__device__ __forceinline__ float GroupReduce(float v, int r_threads, int group, float* slots) {
  const int width = r_threads < 32 ? r_threads : 32;
  for (int offset = width >> 1; offset > 0; offset >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? fmaxf(v, o) : __fadd_rn(v, o);
  }
  if (r_threads <= 32) return v;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  const int warps = r_threads >> 5;
  v = lane < warps ? slots[group * warps + lane] : (kMax ? -INFINITY : 0.0f);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? fmaxf(v, o) : __fadd_rn(v, o);
  }
  return v;
}

// Sum over the vectors j < used of a thread of exp2((x - shift) * scale),
// vector by vector, element by element: the flat order's per-thread sum.
template <typename T, int kN>
__device__ __forceinline__ float ThreadExpSum(const uint4 (&raw)[kN], int used, float shift,
                                              float scale) {
  constexpr int V = VecWidth<T>();
  float d = 0.0f;
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    if (j < used) {
      float x[V];
      Unpack<T>(raw[j], x);
#pragma unroll
      for (int k = 0; k < V; ++k) d = __fadd_rn(d, FastExp2(ScaledDiff(x[k], shift, scale)));
    }
  }
  return d;
}

template <typename T, bool kVec, bool kLog>
__global__ void __launch_bounds__(1024) FlatKernel(const FlatArgs a) {
  constexpr int kS = kFlatSlots;
  constexpr int V = VecWidth<T>();
  using Bits = typename Traits<T>::Bits;
  // The max and the sum reductions use separate slots: the sum's barrier
  // separates a row's max reads from the next row's max writes, and the next
  // row's max barrier the sum reads from the next sum writes.
  __shared__ float max_slots[32];
  __shared__ float sum_slots[32];
  const int group_log2 = a.group_log2;
  const int r_threads = 1 << group_log2;
  const int t = threadIdx.x & (r_threads - 1);
  const int groups = blockDim.x >> group_log2;
  const int group = threadIdx.x >> group_log2;
  const long long pitch = a.n * static_cast<long long>(sizeof(Bits));
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
    const float m = GroupReduce<true>(VectorsMax<T>(raw), r_threads, group, max_slots);
    // The sum of a row of max -inf is 0 or NaN: the row comes out NaN, as in
    // the reference.
    const float shift = ExpShift(m);
    // The flat table kernel's order and arithmetic (ThreadExpSum,
    // NormalizeVector), with each exp2 kept instead of taken twice.
    float e[kS][V];
    float d = 0.0f;
#pragma unroll
    for (int j = 0; j < kS; ++j) {
      float x[V];
      Unpack<T>(raw[j], x);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        e[j][k] = kLog ? ScaledDiff(x[k], shift, a.scale)
                       : FastExp2(ScaledDiff(x[k], shift, a.scale));
        d = __fadd_rn(d, kLog ? FastExp2(e[j][k]) : e[j][k]);
      }
    }
    d = GroupReduce<false>(d, r_threads, group, sum_slots);
    if (valid) {
      char* out = static_cast<char*>(a.output) + row * pitch;
      const float factor = OutputFactor(kLog, d);
#pragma unroll
      for (int j = 0; j < kS; ++j) {
        float y[V];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          y[k] = kLog ? LogSoftmaxOut(e[j][k], factor) : SoftmaxOut(e[j][k], factor);
        }
        StoreVector<T, kVec>(out, j * r_threads + t, a.n, Pack<T>(y));
      }
    }
  }
}

// Flat table kernel: the flat kernel's way (a group of threads per row, max
// first, 2 vectors per thread, one pass of the grid) for the rows of <= 1024
// vectors of a ragged table, in one launch. A segment's rows get the flat
// kernel's geometry (FlatShapeOf: R = 1..512 threads) and run in blocks of
// 512 threads, two resident per SM; a unit is one block's worth of a
// segment's rows (512 / R groups of kTableFlatRows rows). Table entries are
// RowSegment with `first_worker` holding the segment's first unit and the
// shape bits log2 R. Blocks find their segment by binary search. (Longer
// rows of a table: row_staged.cuh, staged.cuh.)
//
// Every row is reduced in the order of its elements' indices (thread t
// holds vectors j * R + t of the row), whatever its address: rows of a
// 16-byte aligned segment are read as vectors; the others are read as the
// aligned 16-byte granules that cover them (MaskLanes), staged in dynamic
// shared memory (S * R + 1 granules per group); each thread shifts its
// vector out of its own granule and the next (ShiftBytes), and outputs go
// back the same way at the output's offset. Every shared-memory access is a
// whole aligned granule: H200, ragged tables, 1.01-1.12x over 4-byte
// accesses at the row's offset (4-way bank conflicts).

// Bytes [shift, shift + 16) of the 32 bytes lo:hi (shift 0..15, a multiple
// of 2; the same for every thread of a row): one funnel shift per word.
// Unaligned rows move through shared memory as whole aligned granules
// (16-byte accesses, no bank conflicts) and are shifted in registers.
template <int kQuad>
__device__ __forceinline__ uint4 ShiftQuad(uint4 lo, uint4 hi, unsigned bits) {
  const unsigned w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  return MakeVector(__funnelshift_r(w[kQuad], w[kQuad + 1], bits),
                    __funnelshift_r(w[kQuad + 1], w[kQuad + 2], bits),
                    __funnelshift_r(w[kQuad + 2], w[kQuad + 3], bits),
                    __funnelshift_r(w[kQuad + 3], w[kQuad + 4], bits));
}
__device__ __forceinline__ uint4 ShiftBytes(uint4 lo, uint4 hi, int shift) {
  const unsigned bits = static_cast<unsigned>(shift & 3) * 8;
  switch (shift >> 2) {
    case 0: return ShiftQuad<0>(lo, hi, bits);
    case 1: return ShiftQuad<1>(lo, hi, bits);
    case 2: return ShiftQuad<2>(lo, hi, bits);
    default: return ShiftQuad<3>(lo, hi, bits);
  }
}

// GroupReduce over kRows values at once (one barrier for all of them): each
// row's value goes through exactly GroupReduce's steps. `slots` holds kRows
// x 32 floats.
template <bool kMax, int kRows>
__device__ __forceinline__ void GroupReduceRows(float (&v)[kRows], int r_threads, int group,
                                                float (*slots)[32]) {
  const int width = r_threads < 32 ? r_threads : 32;
  for (int offset = width >> 1; offset > 0; offset >>= 1) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float o = __shfl_xor_sync(0xffffffffu, v[r], offset);
      v[r] = kMax ? fmaxf(v[r], o) : __fadd_rn(v[r], o);
    }
  }
  if (r_threads <= 32) return;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) slots[r][warp] = v[r];
  }
  __syncthreads();
  const int warps = r_threads >> 5;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    v[r] = lane < warps ? slots[r][group * warps + lane] : (kMax ? -INFINITY : 0.0f);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float o = __shfl_xor_sync(0xffffffffu, v[r], offset);
      v[r] = kMax ? fmaxf(v[r], o) : __fadd_rn(v[r], o);
    }
  }
}

// One unit of the flat table kernel: kRows rows per group of R threads,
// kSlots vectors per thread and row (vectors j*R + t). Row r of group g is row
// (unit's first) + r * groups + g, so that one load instruction of a warp
// covers neighbouring rows.
template <typename T, int kThreads, int kRows, int kSlots>
__device__ __forceinline__ void FlatTableUnit(const RowSegment& seg, int u, uint4* regions,
                                              float (*max_slots)[32], float (*sum_slots)[32]) {
  constexpr int V = VecWidth<T>();
  using Bits = typename Traits<T>::Bits;
  const int group_log2 = (seg.config >> kShapeShift) & 0xf;
  const int r_threads = 1 << group_log2;
  const int groups = kThreads >> group_log2;
  const int group = threadIdx.x >> group_log2;
  const int t = threadIdx.x & (r_threads - 1);
  const int first_row = (u - seg.first_worker) * groups * kRows + group;
  const bool log = seg.config & kLogBit;
  const bool direct = seg.config & kVecBit;  // every row 16-byte aligned, whole vectors
  const int vectors = (seg.n + V - 1) / V;
  const int used = min(kSlots, (vectors - t + r_threads - 1) >> group_log2);
  const int region_granules = kSlots * r_threads + 1;
  uint4 raw[kRows][kSlots];
  if (direct) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = first_row + r * groups;
      const uint4* in = reinterpret_cast<const uint4*>(static_cast<const Bits*>(seg.input) +
                                                        static_cast<long long>(row) * seg.n);
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const int vi = j * r_threads + t;
        raw[r][j] = row < seg.rows && vi < vectors ? LoadGlobal16(in + vi) : NegInfVector<T>();
      }
    }
  } else {
    // Granule g of a row holds its elements g*V - lead .. g*V - lead + V-1;
    // a row's S * R + 1 granules in the region cover every vector of it.
    // Thread t loads granules j * R + t (thread 0 also the last), masks the
    // lanes outside the row, and stages them.
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = first_row + r * groups;
      const Bits* in = static_cast<const Bits*>(seg.input) + static_cast<long long>(row) * seg.n;
      const int lead = LeadElements<T>(in);
      const uint4* granules = reinterpret_cast<const uint4*>(in - lead);
      const int covered = row < seg.rows ? (lead + seg.n + V - 1) / V : 0;
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const int g = j * r_threads + t;
        raw[r][j] = g < covered ? LoadGlobal16(granules + g) : NegInfVector<T>();
      }
    }
    // Masked only once every load is issued: a mask between two loads made
    // the warps holding a row's ends wait for each load in turn.
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = first_row + r * groups;
      const Bits* in = static_cast<const Bits*>(seg.input) + static_cast<long long>(row) * seg.n;
      const int lead = LeadElements<T>(in);
      uint4* region = regions + (r * groups + group) * region_granules;
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const int e0 = (j * r_threads + t) * V - lead;
        if (e0 < 0 || e0 + V > seg.n) raw[r][j] = MaskLanes<T>(raw[r][j], -e0, seg.n - e0);
        region[j * r_threads + t] = raw[r][j];
      }
      if (t == 0) {
        const int extra = kSlots * r_threads;
        const int e0 = extra * V - lead;
        const uint4 last = row < seg.rows && e0 < seg.n
                               ? LoadGlobal16(reinterpret_cast<const uint4*>(in - lead) + extra)
                               : NegInfVector<T>();
        region[extra] = MaskLanes<T>(last, -e0, seg.n - e0);
      }
    }
    __syncthreads();
    // Vector vi is bytes [lead bytes, + 16) of granules vi (this thread's own,
    // masked, in raw) and vi + 1.
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = first_row + r * groups;
      const int shift = (reinterpret_cast<uintptr_t>(static_cast<const Bits*>(seg.input) +
                                                     static_cast<long long>(row) * seg.n) &
                         15u);
      if (shift == 0) continue;
      const uint4* region = regions + (r * groups + group) * region_granules;
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const int g = j * r_threads + t;
        raw[r][j] = ShiftBytes(raw[r][j], region[g + 1], shift);
      }
    }
  }
  float m[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    m[r] = -INFINITY;
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      if (j < used) m[r] = fmaxf(m[r], VectorMax<T>(raw[r][j]));
    }
  }
  GroupReduceRows<true, kRows>(m, r_threads, group, max_slots);
  float d[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    // With m == -inf every value is -inf (-> 0) or NaN: shift by 0.
    if (m[r] == -INFINITY) m[r] = 0.0f;
    d[r] = ThreadExpSum<T>(raw[r], used, m[r], seg.scale);
  }
  GroupReduceRows<false, kRows>(d, r_threads, group, sum_slots);
  if (direct) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = first_row + r * groups;
      if (row >= seg.rows) continue;
      uint4* out = reinterpret_cast<uint4*>(static_cast<Bits*>(seg.output) +
                                            static_cast<long long>(row) * seg.n);
      const float factor = OutputFactor(log, d[r]);
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        if (j < used) {
          StoreGlobal16(out + j * r_threads + t,
                        NormalizeVector<T>(raw[r][j], m[r], seg.scale, log, factor));
        }
      }
    }
    return;
  }
  // Outputs go back through the region, vector k at granule k + 1, then out
  // as the output's own granules: granule G holds the last `lead` elements of
  // vector G - 1 and the first of vector G (whole 16-byte stores; masked at
  // the edges).
  __syncthreads();  // every group has read its region
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    uint4* region = regions + (r * groups + group) * region_granules;
    const float factor = OutputFactor(log, d[r]);
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      if (j < used) {
        region[j * r_threads + t + 1] =
            NormalizeVector<T>(raw[r][j], m[r], seg.scale, log, factor);
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int row = first_row + r * groups;
    if (row >= seg.rows) continue;
    Bits* out = static_cast<Bits*>(seg.output) + static_cast<long long>(row) * seg.n;
    const int lead = LeadElements<T>(out);
    const int shift = 16 - lead * static_cast<int>(sizeof(Bits));
    uint4* granules = reinterpret_cast<uint4*>(out - lead);
    const uint4* region = regions + (r * groups + group) * region_granules;
    const int covered = (lead + seg.n + V - 1) / V;
#pragma unroll
    for (int j = 0; j <= kSlots; ++j) {
      const int g = j < kSlots ? j * r_threads + t : (t == 0 ? kSlots * r_threads : covered);
      if (g < covered) {
        // Granule g + 1 holds vector g; past the last vector its lanes lie
        // beyond the row and are dropped.
        const uint4 cur = region[min(g + 1, kSlots * r_threads)];
        const uint4 v = lead == 0 ? cur : ShiftBytes(region[g], cur, shift);
        const int e0 = g * V - lead;
        if (e0 >= 0 && e0 + V <= seg.n) {
          StoreGlobal16(granules + g, v);
        } else {
          StoreLanes<T>(out, e0, seg.n, v);
        }
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kTableThreads, kTableBlocks) FlatTableKernel(
    const __grid_constant__ TableArgs args) {
  constexpr int kThreads = kTableThreads;
  using Bits = typename Traits<T>::Bits;
  extern __shared__ uint4 regions[];  // unaligned segments: S * R + 1 granules per row
  __shared__ float max_slots[kTableFlatRows][32];
  __shared__ float sum_slots[kTableFlatRows][32];
  const RowSegment* table = args.table != nullptr ? args.table : args.inline_segments;
  const int total_units = args.launch_cluster;  // total units of the table
  DependentsMayStart();
  for (int u = blockIdx.x; u < total_units; u += gridDim.x) {
    // The unit that starts when this wave of blocks ends streams into L2
    // while this one loads, reduces and writes. H200, the ragged mix: 1,712
    // -> 1,775 GB/s (fp32), 1,687 -> 1,777 (fp16).
    const int ahead = u + args.prefetch_units;
    if (threadIdx.x == 0 && args.prefetch_units > 0 && ahead < total_units) {
      const RowSegment& next = table[TableSegmentOf(table, args.count, ahead)];
      const int next_rows = (kThreads >> ((next.config >> kShapeShift) & 0xf)) * kTableFlatRows;
      const int first = (ahead - next.first_worker) * next_rows;
      PrefetchL2(static_cast<const Bits*>(next.input) + static_cast<long long>(first) * next.n,
                 static_cast<size_t>(min(next_rows, next.rows - first)) * next.n * sizeof(Bits));
    }
    const RowSegment seg = table[TableSegmentOf(table, args.count, u)];
    FlatTableUnit<T, kThreads, kTableFlatRows, kFlatSlots>(seg, u, regions, max_slots, sum_slots);
    // Group shapes may change with the next unit's segment: no warp may
    // write a slot or a region that another group of this unit still reads.
    __syncthreads();
  }
  WaitForPrevious();
}

}  // namespace detail
}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_CUDA_FLAT_CUH_
