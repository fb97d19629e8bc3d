// The split_rows path: last-axis rows too long for one cluster's shared
// memory, cut into parts held by the blocks of a persistent grid.
//   split_fused                      rows whose parts the grid holds at once:
//                                    one cooperative launch, one read + one write.
//   split_stats + split_merge +      longer rows: (max, sum) partials, each
//   split_normalize                  row's merged once (aligned rows; others
//                                    merge in split_normalize), then a re-read
//                                    in reverse order: two reads + one write.
#ifndef SOFTMAX_KERNELS_CUDA_SPLIT_CUH_
#define SOFTMAX_KERNELS_CUDA_SPLIT_CUH_

#include "kernels/cuda/common.cuh"

namespace softmax {
namespace gpu {
namespace detail {

// Split rows (last axis, rows too long for a cluster): a row of `vectors`
// vectors is cut into `parts` parts of part_vectors; unit = (row, part).

// (SplitArgs: plan.h.)

// Pass 1: (max, sum) per part into partials[unit]. No block waits on
// another: merging a row's partials is left to split_merge. H200, 16 x 2^24:
// 2,567 -> 2,659 GB/s fp32, 2,347 -> 2,445 fp16
// against a last-part merge behind a returning atomic.

// A split launch's rows: vectors and bytes per row, and units (row parts).
struct SplitRows {
  long long vectors;
  long long pitch;
  long long units;
};
template <typename T>
__device__ __forceinline__ SplitRows SplitRowsOf(const SplitArgs& a) {
  constexpr int V = VecWidth<T>();
  return {(a.n + V - 1) / V, a.n * static_cast<long long>(sizeof(typename Traits<T>::Bits)),
          a.rows * a.parts};
}

// A block's kSlots vectors of a row from `base` on (thread t holds vectors
// base + j * kThreads + t), -inf from `end` on.
template <typename T, bool kVec>
__device__ __forceinline__ void LoadBlockVectors(const char* in, long long base, long long end,
                                                 long long n, uint4 (&raw)[kSlots]) {
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    const long long vi = base + j * kThreads + threadIdx.x;
    raw[j] = vi < end ? LoadVector<T, kVec>(in, vi, n) : NegInfVector<T>();
  }
}

// Writes them (those before `end`) normalized by the row's max and factor.
template <typename T, bool kVec>
__device__ __forceinline__ void StoreBlockVectors(char* out, long long base, long long end,
                                                  long long n, const uint4 (&raw)[kSlots],
                                                  float row_max, float scale, bool log,
                                                  float factor) {
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
    const long long vi = base + j * kThreads + threadIdx.x;
    if (vi < end) {
      StoreVector<T, kVec>(out, vi, n, NormalizeVector<T>(raw[j], row_max, scale, log, factor));
    }
  }
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads, kSplitStatsBlocks) SplitStatsKernel(const SplitArgs a) {
  __shared__ float2 slots[kWarps];
  const auto [vectors, pitch, units] = SplitRowsOf<T>(a);
  // split_merge is launched as a dependent, and split_normalize as its
  // dependent: the latter's first blocks load while these drain.
  DependentsMayStart();
  for (long long u = blockIdx.x; u < units; u += gridDim.x) {
    const long long row = u / a.parts;
    const int part = static_cast<int>(u % a.parts);
    const char* in = static_cast<const char*>(a.input) + row * pitch;
    const long long begin = part * a.part_vectors;
    const long long end = min(vectors, begin + a.part_vectors);
    MaxSum acc{-INFINITY, 0.0f};
    for (long long base = begin; base < end; base += kBlockVectors) {
      uint4 raw[kSlots];
      LoadBlockVectors<T, kVec>(in, base, end, a.n, raw);
      acc = Merge(acc, LocalMaxSum<T>(raw, a.scale), a.scale);
    }
    const MaxSum part_total = BlockMerge(acc, a.scale, slots);
    if (threadIdx.x == 0) a.partials[u] = make_float2(part_total.m, part_total.d);
  }
}

// Between the passes (aligned rows), split_merge (split.cu: not a template,
// so defined in one translation unit) merges each row's partials once.

// Pass 2 of 16-byte aligned rows: re-read and write, one block per chunk of
// kBlockVectors, chunks in reverse order so that the data pass 1 read last
// (most likely still in L2) is read first. H200, 1 GiB fp32: 4.0 TB/s,
// against 3.78 for a grid of 2 blocks per SM walking the chunks.
template <typename T>
__global__ void __launch_bounds__(kThreads) SplitNormalizeKernel(const SplitArgs a) {
  constexpr bool kVec = true;
  using Bits = typename Traits<T>::Bits;
  const long long vectors = (a.n + VecWidth<T>() - 1) / VecWidth<T>();
  const long long pitch = a.n * static_cast<long long>(sizeof(Bits));
  const long long row_chunks = (vectors + kBlockVectors - 1) / kBlockVectors;
  const long long chunks = a.rows * row_chunks;
  for (long long i = blockIdx.x; i < chunks; i += gridDim.x) {
    const long long g = chunks - 1 - i;
    const long long row = g / row_chunks;
    const long long base = (g % row_chunks) * kBlockVectors;
    const char* in = static_cast<const char*>(a.input) + row * pitch;
    char* out = static_cast<char*>(a.output) + row * pitch;
    uint4 raw[kSlots];
    LoadBlockVectors<T, kVec>(in, base, vectors, a.n, raw);
    // The first wave's loads are in flight while split_merge finishes (this
    // launch is its programmatic dependent).
    if (i == blockIdx.x) WaitForPrevious();
    const float2 total = __ldcg(a.totals + row);
    const float factor = OutputFactor(a.log, total.y);
    StoreBlockVectors<T, kVec>(out, base, vectors, a.n, raw, total.x, a.scale, a.log, factor);
  }
}

// Pass 2 of rows that are not 16-byte aligned (LoadElements), without
// split_merge: a grid of 2 blocks per SM walks the units and chunks in
// reverse order, and a block merges a row's partials (MergePartials, as
// split_merge does) when it first meets the row, while its unit's last chunk
// loads. H200, fp32 16 x (2^24 - 1): 1.12x the one-block-per-chunk form
// that aligned rows use.
template <typename T>
__global__ void __launch_bounds__(kThreads, 2) SplitNormalizeUnitsKernel(const SplitArgs a) {
  constexpr bool kVec = false;
  __shared__ float2 slots[kWarps];
  const auto [vectors, pitch, units] = SplitRowsOf<T>(a);
  long long merged_row = -1;
  MaxSum total{-INFINITY, 0.0f};
  for (long long i = blockIdx.x; i < units; i += gridDim.x) {
    const long long u = units - 1 - i;
    const long long row = u / a.parts;
    const int part = static_cast<int>(u % a.parts);
    const char* in = static_cast<const char*>(a.input) + row * pitch;
    char* out = static_cast<char*>(a.output) + row * pitch;
    const long long begin = part * a.part_vectors;
    const long long end = min(vectors, begin + a.part_vectors);
    const long long chunks = (end - begin + kBlockVectors - 1) / kBlockVectors;
    uint4 last[kSlots];
    LoadBlockVectors<T, kVec>(in, begin + (chunks - 1) * kBlockVectors, end, a.n, last);
    // The first unit's last chunk is in flight while split_stats finishes
    // (this launch is its programmatic dependent).
    if (i == blockIdx.x) WaitForPrevious();
    if (row != merged_row) {  // uniform across the block
      total = MergePartials(a.partials + row * a.parts, a.parts, a.scale, slots);
      merged_row = row;
    }
    const float factor = OutputFactor(a.log, total.d);
    for (long long c = chunks - 1; c >= 0; --c) {
      const long long base = begin + c * kBlockVectors;
      uint4 raw[kSlots];
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const long long vi = base + j * kThreads + threadIdx.x;
        raw[j] = c == chunks - 1 ? last[j]
                 : vi < end      ? LoadVector<T, kVec>(in, vi, a.n)
                                 : NegInfVector<T>();
      }
      StoreBlockVectors<T, kVec>(out, base, end, a.n, raw, total.m, a.scale, a.log, factor);
    }
  }
}

// Single-pass split rows: used when every part of a row can be held at once
// by the grid (parts <= grid) and each part is one block's worth of vectors
// (part_vectors == kBlockVectors). Unit u = (row, part) goes to block
// u % grid, as its (u / grid)-th unit. A block loads unit u into registers,
// then finishes its previous unit while those loads are in flight: it waits
// until every part of that unit's row has published its (max, sum) partial,
// merges them, and writes the previous unit's part from registers. Then it
// publishes unit u's partial. Each element is read once and written once.
//
// Why it cannot deadlock: the grid is launched cooperatively (all blocks
// resident). A block waiting at its k-th unit needs the partials of a row
// whose units lie in steps k-1 and k (parts <= grid); a step-k unit v of that
// row has v - grid in an earlier row (otherwise the row would have more than
// grid parts), so its owner waits only on earlier rows: waits follow rows in
// increasing order and the first row waits on nothing.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads, 2) SplitFusedKernel(const SplitArgs a) {
  __shared__ float2 slots[kWarps];
  const auto [vectors, pitch, units] = SplitRowsOf<T>(a);
  uint4 prev[kSlots];
  long long prev_u = -1;
  MaxSum prev_total{-INFINITY, 0.0f};  // the row's total when parts == 1
  for (long long u = blockIdx.x;; u += gridDim.x) {
    const bool have = u < units;
    const long long row = u / a.parts;
    const long long begin = (u % a.parts) * kBlockVectors;
    const char* in = static_cast<const char*>(a.input) + row * pitch;
    uint4 cur[kSlots];
    if (have) LoadBlockVectors<T, kVec>(in, begin, vectors, a.n, cur);
    if (prev_u >= 0) {
      const long long prow = prev_u / a.parts;
      const long long pbegin = (prev_u % a.parts) * kBlockVectors;
      MaxSum total = prev_total;
      if (a.parts > 1) {
        if (threadIdx.x == 0) {
          const volatile unsigned* counter = a.counters + prow;
          while (*counter < static_cast<unsigned>(a.parts)) __nanosleep(100);
          __threadfence();
        }
        __syncthreads();
        total = MergePartials(a.partials + prow * a.parts, a.parts, a.scale, slots);
      }
      const float factor = OutputFactor(a.log, total.d);
      char* out = static_cast<char*>(a.output) + prow * pitch;
      StoreBlockVectors<T, kVec>(out, pbegin, vectors, a.n, prev, total.m, a.scale, a.log,
                                 factor);
    }
    if (!have) break;
    const MaxSum part_total = BlockMerge(LocalMaxSum<T>(cur, a.scale), a.scale, slots);
    if (a.parts > 1) {
      if (threadIdx.x == 0) {
        a.partials[u] = make_float2(part_total.m, part_total.d);
        __threadfence();
        atomicAdd(a.counters + row, 1u);
      }
    } else {
      prev_total = part_total;
    }
#pragma unroll
    for (int j = 0; j < kSlots; ++j) prev[j] = cur[j];
    prev_u = u;
  }
}

}  // namespace detail
}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_CUDA_SPLIT_CUH_
