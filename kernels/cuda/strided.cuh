// The strided path: softmax along n of [outer, n, inner] with inner > 1
// (a non-last axis): strided_stats writes per-column (max, sum) partials,
// strided_normalize re-reads and writes. Two reads + one write.
#ifndef SOFTMAX_KERNELS_CUDA_STRIDED_CUH_
#define SOFTMAX_KERNELS_CUDA_STRIDED_CUH_

#include "kernels/cuda/common.cuh"

namespace softmax {
namespace gpu {
namespace detail {

// Strided: softmax along n of [outer, n, inner], inner > 1. A warp covers
// 32/L rows of n x L column vectors (L = 2^lanes_log2 lanes per row, V
// columns per lane), a block 16 such row groups; "strip" = L*V adjacent
// columns. Unit = (outer index, strip, part of n); per-column (max, sum)
// partials merge like the split path.

// (StridedArgs: plan.h.)

template <typename T, bool kVec>
__device__ __forceinline__ uint4 LoadColumns(const char* base, long long col0, long long inner) {
  using Bits = typename Traits<T>::Bits;
  if constexpr (kVec) {
    if (col0 < inner) return LoadGlobal16(reinterpret_cast<const uint4*>(base + col0 * sizeof(Bits)));
    return NegInfVector<T>();
  }
  return LoadElements<T>(reinterpret_cast<const Bits*>(base), col0, inner);
}

template <typename T, bool kVec>
__device__ __forceinline__ void StoreColumns(char* base, long long col0, long long inner,
                                             const float* y) {
  using Bits = typename Traits<T>::Bits;
  const uint4 v = Pack<T>(y);
  if constexpr (kVec) {
    if (col0 < inner) StoreGlobal16(reinterpret_cast<uint4*>(base + col0 * sizeof(Bits)), v);
    return;
  }
  StoreElements<T>(reinterpret_cast<Bits*>(base), col0, inner, v);
}

// A batch whose rows all lie in the part, at 16-byte aligned columns: one
// pointer stepping by a fixed stride, no bound per row (H200, half dim 0 of
// [1048576, 256]: strided_stats 82.6 -> 68.2 M instructions, 215.7 -> 202.4 us).
__device__ __forceinline__ void LoadBatch(const char* p, long long slot_bytes, uint4* raw) {
#pragma unroll
  for (int j = 0; j < kStridedSlots; ++j) {
    raw[j] = LoadGlobal16(reinterpret_cast<const uint4*>(p));
    p += slot_bytes;
  }
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads, 2) StridedStatsKernel(const StridedArgs a) {
  constexpr int V = VecWidth<T>();
  constexpr int kStripColumns = 32 * V;
  using Bits = typename Traits<T>::Bits;
  __shared__ float2 tile[kWarps][kStripColumns];
  __shared__ int is_last;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int lanes = 1 << a.lanes_log2;
  const int column_vector = lane & (lanes - 1);
  const int rows_per_warp = 32 >> a.lanes_log2;
  const int row_in_pass = warp * rows_per_warp + (lane >> a.lanes_log2);
  const int rows_per_pass = kWarps * rows_per_warp;
  const int strip_columns = lanes * V;
  const long long row_pitch = a.inner * static_cast<long long>(sizeof(Bits));
  const long long slot_bytes = rows_per_pass * row_pitch;  // a thread's rows, one slot apart
  const long long units = a.outer * a.strips * a.parts;
  // strided_normalize is launched as a dependent: its blocks load while
  // these drain (it waits for this launch before it reads finals).
  DependentsMayStart();
  for (long long u = blockIdx.x; u < units; u += gridDim.x) {
    const long long os = u / a.parts;
    const int part = static_cast<int>(u % a.parts);
    const long long o = os / a.strips;
    const long long col0 = (os % a.strips) * strip_columns + column_vector * V;
    const char* base = static_cast<const char*>(a.input) + o * a.n * row_pitch;
    const long long row_begin = part * a.part_rows;
    const long long row_end = min(a.n, row_begin + a.part_rows);
    float m[V], d[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      m[k] = -INFINITY;
      d[k] = 0.0f;
    }
    const long long step = static_cast<long long>(kStridedSlots) * rows_per_pass;
    const bool whole_vector = kVec && col0 < a.inner;
    const auto load = [&](long long r0, uint4* raw) {
      if (whole_vector && r0 + (kStridedSlots - 1) * rows_per_pass < row_end) {
        LoadBatch(base + r0 * row_pitch + col0 * static_cast<long long>(sizeof(Bits)), slot_bytes,
                  raw);
        return;
      }
#pragma unroll
      for (int j = 0; j < kStridedSlots; ++j) {
        const long long r = r0 + static_cast<long long>(j) * rows_per_pass;
        raw[j] = r < row_end ? LoadColumns<T, kVec>(base + r * row_pitch, col0, a.inner)
                             : NegInfVector<T>();
      }
    };
    const auto reduce = [&](const uint4* raw) {
      float x[kStridedSlots][V];
#pragma unroll
      for (int j = 0; j < kStridedSlots; ++j) Unpack<T>(raw[j], x[j]);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        float mk = m[k];
#pragma unroll
        for (int j = 0; j < kStridedSlots; ++j) mk = fmaxf(mk, x[j][k]);
        const float shift = ExpShift(mk);
        // Roundings spelled out: the old sum rescaled and the first exp2 in
        // one fused multiply-add, then one add per row.
        float dk = __fmaf_rn(d[k], Rescale(m[k], mk, a.scale),
                             FastExp2(ScaledDiff(x[0][k], shift, a.scale)));
#pragma unroll
        for (int j = 1; j < kStridedSlots; ++j) {
          dk = __fadd_rn(dk, FastExp2(ScaledDiff(x[j][k], shift, a.scale)));
        }
        m[k] = mk;
        d[k] = dk;
      }
    };
    // The next batch loads while this one is reduced (two register buffers
    // taken in turn; the same reductions in the same order). H200, dim 0 of
    // [1048576, 256] fp16: strided_stats 177.8 -> 170.2 us.
    uint4 raw_a[kStridedSlots], raw_b[kStridedSlots];
    long long r0 = row_begin + row_in_pass;
    if (r0 < row_end) load(r0, raw_a);
    while (r0 < row_end) {
      if (r0 + step < row_end) load(r0 + step, raw_b);
      reduce(raw_a);
      r0 += step;
      if (r0 >= row_end) break;
      if (r0 + step < row_end) load(r0 + step, raw_a);
      reduce(raw_b);
      r0 += step;
    }
    // Merge the rows a warp covers (lanes with the same column vector).
    for (int offset = 16; offset >= lanes; offset >>= 1) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const MaxSum other{__shfl_xor_sync(0xffffffffu, m[k], offset),
                           __shfl_xor_sync(0xffffffffu, d[k], offset)};
        const MaxSum merged = Merge(MaxSum{m[k], d[k]}, other, a.scale);
        m[k] = merged.m;
        d[k] = merged.d;
      }
    }
    if (lane < lanes) {
#pragma unroll
      for (int k = 0; k < V; ++k) tile[warp][column_vector * V + k] = make_float2(m[k], d[k]);
    }
    __syncthreads();
    if (threadIdx.x < strip_columns) {
      MaxSum column{-INFINITY, 0.0f};
      for (int w = 0; w < kWarps; ++w) {
        column = Merge(column, MaxSum{tile[w][threadIdx.x].x, tile[w][threadIdx.x].y}, a.scale);
      }
      a.partials[u * kStripColumns + threadIdx.x] = make_float2(column.m, column.d);
      __threadfence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      is_last = atomicAdd(a.counters + os, 1u) == static_cast<unsigned>(a.parts - 1);
    }
    __syncthreads();
    if (is_last) {
      __threadfence();
      // strip_columns <= 256 columns, >= 2 threads per column.
      const int slices = kThreads / strip_columns;
      const int column_index = threadIdx.x % strip_columns;
      const int slice = threadIdx.x / strip_columns;
      // Loads in batches, merged in the same order (p = slice, slice +
      // slices, ...), so the bits are those of one load at a time, which made
      // this block's merge a chain of L2 round trips. H200, fp16 dim 0 of
      // [1048576, 256] (264 parts): 2,171 -> 2,299 GB/s.
      MaxSum column{-INFINITY, 0.0f};
      if (slice < slices) {
        for (int p0 = slice; p0 < a.parts; p0 += kStridedMergeBatch * slices) {
          float2 v[kStridedMergeBatch];
#pragma unroll
          for (int b = 0; b < kStridedMergeBatch; ++b) {
            const int p = p0 + b * slices;
            v[b] = p < a.parts ? __ldcg(a.partials + (os * a.parts + p) * kStripColumns + column_index)
                               : make_float2(-INFINITY, 0.0f);
          }
#pragma unroll
          for (int b = 0; b < kStridedMergeBatch; ++b) {
            if (p0 + b * slices < a.parts) column = Merge(column, MaxSum{v[b].x, v[b].y}, a.scale);
          }
        }
      }
      float2* scratch = &tile[0][0];  // kWarps * kStripColumns >= kThreads
      if (slice < slices) scratch[threadIdx.x] = make_float2(column.m, column.d);
      __syncthreads();
      if (threadIdx.x < strip_columns) {
        MaxSum total{-INFINITY, 0.0f};
        for (int s = 0; s < slices; ++s) {
          const float2 v = scratch[s * strip_columns + threadIdx.x];
          total = Merge(total, MaxSum{v.x, v.y}, a.scale);
        }
        a.finals[os * kStripColumns + threadIdx.x] = make_float2(total.m, total.d);
      }
      if (threadIdx.x == 0) a.counters[os] = 0;
    }
    __syncthreads();
  }
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads, 2) StridedNormalizeKernel(const StridedArgs a) {
  constexpr int V = VecWidth<T>();
  constexpr int kStripColumns = 32 * V;
  using Bits = typename Traits<T>::Bits;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int lanes = 1 << a.lanes_log2;
  const int column_vector = lane & (lanes - 1);
  const int rows_per_warp = 32 >> a.lanes_log2;
  const int row_in_pass = warp * rows_per_warp + (lane >> a.lanes_log2);
  const int rows_per_pass = kWarps * rows_per_warp;
  const int strip_columns = lanes * V;
  const long long row_pitch = a.inner * static_cast<long long>(sizeof(Bits));
  const long long slot_bytes = rows_per_pass * row_pitch;  // a thread's rows, one slot apart
  const long long units = a.outer * a.strips * a.parts;
  for (long long i = blockIdx.x; i < units; i += gridDim.x) {
    const long long u = units - 1 - i;
    const long long os = u / a.parts;
    const int part = static_cast<int>(u % a.parts);
    const long long o = os / a.strips;
    const long long col0 = (os % a.strips) * strip_columns + column_vector * V;
    const long long offset = o * a.n * row_pitch;
    const char* in = static_cast<const char*>(a.input) + offset;
    char* out = static_cast<char*>(a.output) + offset;
    const long long row_begin = part * a.part_rows;
    const long long row_end = min(a.n, row_begin + a.part_rows);
    const long long step = static_cast<long long>(kStridedSlots) * rows_per_pass;
    const long long passes = (row_end - row_begin + step - 1) / step;
    const bool whole_vector = kVec && col0 < a.inner;
    const auto whole_batch = [&](long long r0) {
      return whole_vector && r0 + (kStridedSlots - 1) * rows_per_pass < row_end;
    };
    const long long column_bytes = col0 * static_cast<long long>(sizeof(Bits));
    const auto load = [&](long long p, uint4* raw) {
      const long long r0 = row_begin + p * step + row_in_pass;
      if (whole_batch(r0)) {
        LoadBatch(in + r0 * row_pitch + column_bytes, slot_bytes, raw);
        return;
      }
#pragma unroll
      for (int j = 0; j < kStridedSlots; ++j) {
        const long long r = r0 + static_cast<long long>(j) * rows_per_pass;
        raw[j] = r < row_end ? LoadColumns<T, kVec>(in + r * row_pitch, col0, a.inner)
                             : NegInfVector<T>();
      }
    };
    float m[V], factor[V];
    const auto normalize = [&](uint4 raw, float* y) {
      float x[V];
      Unpack<T>(raw, x);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        y[k] = a.log ? ((x[k] - m[k]) * a.scale - factor[k]) * kLn2
                     : FastExp2((x[k] - m[k]) * a.scale) * factor[k];
      }
    };
    const auto store = [&](long long p, const uint4* raw) {
      const long long r0 = row_begin + p * step + row_in_pass;
      if (whole_batch(r0)) {
        char* q = out + r0 * row_pitch + column_bytes;
#pragma unroll
        for (int j = 0; j < kStridedSlots; ++j) {
          float y[V];
          normalize(raw[j], y);
          StoreGlobal16(reinterpret_cast<uint4*>(q), Pack<T>(y));
          q += slot_bytes;
        }
        return;
      }
#pragma unroll
      for (int j = 0; j < kStridedSlots; ++j) {
        const long long r = r0 + static_cast<long long>(j) * rows_per_pass;
        if (r < row_end) {
          float y[V];
          normalize(raw[j], y);
          StoreColumns<T, kVec>(out + r * row_pitch, col0, a.inner, y);
        }
      }
    };
    uint4 raw_a[kStridedSlots], raw_b[kStridedSlots];
    long long p = passes - 1;
    if (p >= 0) load(p, raw_a);
    // The first unit's first loads are in flight while strided_stats
    // finishes (this launch is its programmatic dependent).
    if (i == blockIdx.x) WaitForPrevious();
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float2 f = a.finals[os * kStripColumns + column_vector * V + k];
      m[k] = f.x;
      factor[k] = OutputFactor(a.log, f.y);
    }
    // Passes in reverse order, the next one loading while this one is
    // written (two register buffers, taken in turn).
    while (p >= 0) {
      if (p >= 1) load(p - 1, raw_b);
      store(p, raw_a);
      if (--p < 0) break;
      if (p >= 1) load(p - 1, raw_a);
      store(p, raw_b);
      --p;
    }
  }
}

}  // namespace detail
}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_CUDA_STRIDED_CUH_
