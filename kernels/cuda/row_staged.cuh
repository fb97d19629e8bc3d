// The row_staged kernel: last-axis rows of 1025..8192 vectors that the
// staged kernel does not take (not 16-byte aligned: odd lengths in a ragged
// table, views at an offset; up to 14,080 vectors where a block may have a
// 220 KiB share, kRowStagedLongMaxVectors) and, in the 16-bit types, aligned rows of up
// to 3839 vectors (RowKernelOf); a row per block of kRowStagedThreads, a
// launch of a table's rows whatever their segments. A table's flat rows (up
// to 1024 vectors) join its launch where they are no more than its
// row_staged rows (plan.cc), each summed in the flat order (FlatOrderSum): H100,
// half and bfloat16 ragged mixes of 64 tensors 1.06-1.08x, float32 1.00x.
//
// The block copies the aligned 16-byte granules that cover its row into
// shared memory with per-thread cp.async copies (all in flight at once: no
// registers held), then makes three passes over them in rolled loops: the
// max, the sum of exp2, and the output. Thread t reads vectors t, t + 256,
// ... of the row, each shifted out of two neighbouring granules
// (ShiftQuad, the shift's quadrant compiled into each loop), so the row is
// reduced in the order of its elements' indices whatever its address, by a
// tree that depends on n alone. The output is written as the output's own
// granules (whole 16-byte stores inside the row, lane stores at its two
// ends), each element computed from its input element alone: exp2 is taken
// twice per element (softmax), against the flat table kernel's register
// rows of up to 8 vectors per thread that this replaced, which issued about
// twice the instructions: H200, ragged mixes of 64 tensors 1.33-1.37x
// float32, 1.25-1.34x half.
//
// Needs sm_80 (cp.async) and a block's opt-in shared memory to hold a row of
// 8192 vectors (the probe lists the kernel only then: H100, H200, A100;
// elsewhere RowKernelOf sends its rows to the staged kernel when aligned,
// else to the on-chip cluster path). Shared memory:
// (vectors + 2) granules, at most 128 KiB + 128 bytes (220 KiB + 128 where the
// "row_staged.long" probe found room); the planner puts rows
// into launches by the blocks per SM their share allows (RowStagedBlocks).
#ifndef SOFTMAX_KERNELS_CUDA_ROW_STAGED_CUH_
#define SOFTMAX_KERNELS_CUDA_ROW_STAGED_CUH_

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flat.cuh"
#include "kernels/cuda/staged.cuh"

namespace softmax {
namespace gpu {
namespace detail {

// Bytes [a * 16 + 4 * kQuad + bits / 8, + 16) of the share (kQuad -1: the
// aligned granule a): a vector shifted out of granules a and a + 1.
template <int kQuad>
__device__ __forceinline__ uint4 ShareVector(const uint4* share, int a, unsigned bits) {
  if constexpr (kQuad < 0) {
    return share[a];
  } else {
    return ShiftQuad<kQuad>(share[a], share[a + 1], bits);
  }
}

// Calls f(std::integral_constant<int, kQuad>) for a byte shift of 0..15:
// kQuad -1 for 0, else shift / 4 (the bits come from shift % 4). Each loop
// over a row is compiled once per quadrant: no per-vector switch.
template <typename F>
__device__ __forceinline__ void WithQuad(int shift, F f) {
  switch (shift == 0 ? -1 : shift >> 2) {
    case -1: f(std::integral_constant<int, -1>()); break;
    case 0: f(std::integral_constant<int, 0>()); break;
    case 1: f(std::integral_constant<int, 1>()); break;
    case 2: f(std::integral_constant<int, 2>()); break;
    default: f(std::integral_constant<int, 3>()); break;
  }
}

// The sum of a row of <= kFlatMaxVectors (a table's flat row: kFlatOrderBit)
// in the flat kernels' order: virtual thread v of R = 2^group_log2
// (FlatShapeOf) sums vectors v and v + R, then GroupReduce's tree over the
// R. R <= kT are the block's first R threads; R = 2 * kT (rows of 513..1024
// vectors) are two per thread, v and v + kT, whose warps' sums go through
// GroupReduce's steps for 16 warps. The bits are the flat kernels'.
template <typename T, int kT, int kQuad>
__device__ __forceinline__ float FlatOrderSum(const uint4* share, int whole, int tail,
                                              unsigned bits, int group_log2, float m,
                                              float scale, float* slots, float* total) {
  constexpr int V = VecWidth<T>();
  static_assert(2 * kT * kFlatSlots >= kFlatMaxVectors, "R <= 2 * kT");
  const int r_threads = 1 << group_log2;
  const int vectors = whole + (tail > 0 ? 1 : 0);
  float dv[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int v = static_cast<int>(threadIdx.x) + h * kT;
#pragma unroll
    for (int j = 0; j < kFlatSlots; ++j) {
      const int i = j * r_threads + v;
      if (v < r_threads && i < vectors) {
        uint4 raw = ShareVector<kQuad>(share, i, bits);
        if (i == whole) raw = MaskLanes<T>(raw, 0, tail);
        float x[V];
        Unpack<T>(raw, x);
#pragma unroll
        for (int k = 0; k < V; ++k) dv[h] = __fadd_rn(dv[h], FastExp2(ScaledDiff(x[k], m, scale)));
      }
    }
  }
  if (r_threads <= kT) {
    const float d = GroupReduce<false>(dv[0], r_threads, 0, slots);
    if (r_threads > 32) return d;  // every warp ends with the group's total
    if (threadIdx.x == 0) *total = d;
    __syncthreads();
    return *total;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    dv[0] = __fadd_rn(dv[0], __shfl_xor_sync(0xffffffffu, dv[0], offset));
    dv[1] = __fadd_rn(dv[1], __shfl_xor_sync(0xffffffffu, dv[1], offset));
  }
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  if (lane == 0) {
    slots[warp] = dv[0];
    slots[warp + kT / 32] = dv[1];
  }
  __syncthreads();
  float d = lane < 2 * kT / 32 ? slots[lane] : 0.0f;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    d = __fadd_rn(d, __shfl_xor_sync(0xffffffffu, d, offset));
  }
  return d;
}

template <typename T>
__global__ void __launch_bounds__(kRowStagedThreads, kRowStagedMinBlocks)
    RowStagedKernel(const __grid_constant__ TableArgs args) {
  constexpr int V = VecWidth<T>();
  constexpr int kT = kRowStagedThreads;
  using Bits = typename Traits<T>::Bits;
  extern __shared__ __align__(kShareAlign) uint4 share[];  // covered + 2 granules
  __shared__ float max_slots[kT / 32];
  __shared__ float sum_slots[kT / 32];
  __shared__ float flat_slots[2 * kT / 32];
  __shared__ float flat_total;
  const RowSegment* table = args.table != nullptr ? args.table : args.inline_segments;
  const int launch_row = static_cast<int>(blockIdx.x);
  const RowSegment& seg = table[TableSegmentOf(table, args.count, launch_row)];
  const long long row = launch_row - seg.first_worker;
  const int n = seg.n;
  const float scale = seg.scale;
  const bool log = (seg.config & kLogBit) != 0;
  const Bits* in = static_cast<const Bits*>(seg.input) + row * n;
  const int lead = LeadElements<T>(in);
  const int covered = (lead + n + V - 1) / V;
  DependentsMayStart();
  {
    const uint4* granules = reinterpret_cast<const uint4*>(in - lead);
#pragma unroll 4
    for (int g = threadIdx.x; g < covered; g += kT) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(SharedAddress(share + g)),
                   "l"(granules + g)
                   : "memory");
    }
    asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
  }
  __syncthreads();
  const int shift = lead * static_cast<int>(sizeof(Bits));
  const unsigned bits = static_cast<unsigned>(shift & 3) * 8;
  const int whole = n / V;         // vectors entirely inside the row
  const int tail = n - whole * V;  // elements of the last, partial vector
  // The partial vector (if any) is the last of its thread, after its loop:
  // every thread visits its vectors in ascending order.
  const bool has_tail = tail > 0 && (whole % kT) == static_cast<int>(threadIdx.x);
  float m = -INFINITY;
  WithQuad(shift, [&](auto quad) {
    constexpr int kQuad = decltype(quad)::value;
#pragma unroll 4
    for (int i = threadIdx.x; i < whole; i += kT) {
      m = fmaxf(m, VectorMax<T>(ShareVector<kQuad>(share, i, bits)));
    }
    if (has_tail) {
      m = fmaxf(m, VectorMax<T>(MaskLanes<T>(ShareVector<kQuad>(share, whole, bits), 0, tail)));
    }
  });
  m = GroupReduce<true>(m, kT, 0, max_slots);  // the block is one group
  // With m == -inf every value is -inf (-> 0) or NaN: shift by 0.
  if (m == -INFINITY) m = 0.0f;
  float d = 0.0f;
  if ((seg.config & kFlatOrderBit) != 0) {
    const int group_log2 = (seg.config >> kShapeShift) & 0xf;
    WithQuad(shift, [&](auto quad) {
      d = FlatOrderSum<T, kT, decltype(quad)::value>(share, whole, tail, bits, group_log2, m,
                                                     scale, flat_slots, &flat_total);
    });
  } else {
    WithQuad(shift, [&](auto quad) {
      constexpr int kQuad = decltype(quad)::value;
      const auto add = [&](uint4 v) {
        float x[V];
        Unpack<T>(v, x);
#pragma unroll
        for (int k = 0; k < V; ++k) d = __fadd_rn(d, FastExp2(ScaledDiff(x[k], m, scale)));
      };
#pragma unroll 2
      for (int i = threadIdx.x; i < whole; i += kT) add(ShareVector<kQuad>(share, i, bits));
      if (has_tail) add(MaskLanes<T>(ShareVector<kQuad>(share, whole, bits), 0, tail));
    });
    d = GroupReduce<false>(d, kT, 0, sum_slots);
  }
  const float factor = OutputFactor(log, d);
  // Output granule G holds elements G * V - lead_out ..: bytes [G * 16 +
  // delta, + 16) of the share, delta = (lead - lead_out) * sizeof(T), that
  // is granules G + q and G + q + 1 shifted by s bytes.
  Bits* out = static_cast<Bits*>(seg.output) + row * n;
  const int lead_out = LeadElements<T>(out);
  uint4* out_granules = reinterpret_cast<uint4*>(out - lead_out);
  const int delta = (lead - lead_out) * static_cast<int>(sizeof(Bits));
  const int q = delta < 0 ? -1 : 0;
  const int s = delta - q * 16;
  const unsigned out_bits = static_cast<unsigned>(s & 3) * 8;
  // Granules wholly inside the row: [first, last); the partial ones at the
  // two ends (lane stores) go to thread 0.
  const int first = lead_out > 0 ? 1 : 0;
  const int last = (lead_out + n) / V;
  const auto normalize = [&](uint4 v) {
    return log ? NormalizeVector<T>(v, m, scale, true, factor)
               : NormalizeVector<T>(v, m, scale, false, factor);
  };
  WithQuad(s, [&](auto quad) {
    constexpr int kQuad = decltype(quad)::value;
    if (log) {
#pragma unroll 2
      for (int g = first + threadIdx.x; g < last; g += kT) {
        StoreGlobal16(out_granules + g, NormalizeVector<T>(ShareVector<kQuad>(share, g + q, out_bits),
                                                           m, scale, true, factor));
      }
    } else {
#pragma unroll 2
      for (int g = first + threadIdx.x; g < last; g += kT) {
        StoreGlobal16(out_granules + g, NormalizeVector<T>(ShareVector<kQuad>(share, g + q, out_bits),
                                                           m, scale, false, factor));
      }
    }
  });
  if (threadIdx.x == 0) {
    // Indices outside [0, covered] hold no element of the row: any granule
    // will do there (those lanes are not stored).
    const auto edge = [&](int g) {
      const int a = min(max(g + q, 0), covered);
      const int b = min(g + q + 1, covered);
      const uint4 v = s == 0 ? share[a] : ShiftBytes(share[a], share[b], s);
      StoreLanes<T>(out, g * V - lead_out, n, normalize(v));
    };
    if (first == 1) edge(0);
    if ((lead_out + n) % V != 0 && last != 0) edge(last);
    if ((lead_out + n) % V != 0 && last == 0 && first == 0) edge(0);
  }
  WaitForPrevious();
}

}  // namespace detail
}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_CUDA_ROW_STAGED_CUH_
