// The top_k kernel: softmax statistics and the K best elements of each row
// in one pass over the input (LaunchSoftmaxTopK in softmax_cuda.h is its
// API; top_k.cu its host side).
//
// Geometry, a function of n and the dtype alone (TopKPartVectors): a row of
// `vectors` 16-byte vectors (V elements each, counted from the row's first
// element whatever its address) is cut into parts of part_vectors; a block
// of kTopKThreads threads takes one part. Warp w, step s holds the part's
// vectors (s * kWarps + w) * 32 + lane, kTopKUnroll steps loaded at once, so
// a warp meets the part's elements in increasing index order, step by step.
//
// Each lane keeps (max, sum) over its vectors (LocalMaxSum per group of
// steps, merged in order), then warps, then parts merge in a fixed order:
// the statistics' bits follow from the row alone (batch invariance), and a
// row reads the same elements in the same lanes whether it is 16-byte
// aligned, unaligned or strided (a non-last axis), so its bits are also the
// same at any address and along any axis.
//
// Ranking: by the input value (exact; temperature > 0 keeps the order),
// descending, ties lower index first, NaN above every number, -0 equal to
// +0: a total order read from the row alone, held as a 64-bit key (the
// value's order-preserving bits, then the complement of its index). Each
// warp keeps candidates in a shared-memory buffer of kTopKBuffer keys behind
// a bar (the K-th best key it holds): an element at or below the bar, met
// after it, cannot be in the top K (it ranks below K kept ones), so most
// elements cost one compare. A full buffer is sorted (bitonic, one warp) and
// cut to K. The first group primes the bar with the K-th largest of the
// lanes' maxima (a lower bound of the K-th best element).
//
// Rows of several parts: each block writes its part's (max, sum) and sorted
// K keys to scratch; the last block of the row (a counter, zeroed before the
// launch) merges them in part order and writes the row's K values and
// indices. Only K values and K indices per row are written.
#ifndef SOFTMAX_KERNELS_CUDA_TOP_K_CUH_
#define SOFTMAX_KERNELS_CUDA_TOP_K_CUH_

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/plan.h"

namespace softmax {
namespace gpu {
namespace detail {

// Blocks of kWarps warps (BlockMerge's slots), as the split kernels.
constexpr int kTopKThreads = kThreads;
// Blocks per SM the registers allow (shared memory, 33 KiB a block, would
// allow 6): float32 fits 64 registers (4 blocks) without spills; the 16-bit
// types, 8 elements a vector, spilled 36 bytes at 64 and take 3 (85).
template <typename T>
constexpr int kTopKBlocks = sizeof(T) == 4 ? 4 : 3;
// Keys one warp's buffer holds: K kept and a step's 32 * V arrivals (256
// for the 16-bit types) with room to spare; 4 KiB a warp, 32 KiB a block.
constexpr int kTopKBuffer = 512;
// Steps a warp loads before it reduces them: 4 x 16 bytes in flight per
// thread, 16 KiB per block.
constexpr int kTopKUnroll = 4;
// A part is at least this many vectors (16 KiB: 4 steps of each warp), and
// a row has at most kTopKMaxParts parts (longer rows take longer parts), so
// that the last block's merge reads at most kTopKMaxParts * K keys.
constexpr long long kTopKPartVectors = static_cast<long long>(kTopKUnroll) * kTopKThreads;
constexpr long long kTopKMaxParts = 512;
static_assert(kTopKUnroll * 32 >= kMaxFusedTopK, "a warp's first vector maxima prime the bar");
// How a row is read: 16-byte vectors, elements at any address, or a strided
// (non-last) axis. The same elements reach the same lanes in each.
enum TopKMode : int { kTopKVectors = 0, kTopKElements = 1, kTopKStrided = 2 };

// Arguments of one top_k launch: rows [first_row, first_row + grid / parts)
// of one segment viewed as [outer, n, inner].
struct TopKArgs {
  const void* input;
  void* values;       // [outer, k, inner] of the dtype
  int64_t* indices;   // [outer, k, inner]
  long long outer;
  long long n;
  long long inner;
  long long first_row;
  long long part_vectors;
  int parts;
  int k;
  float scale;        // log2(e) / temperature
  int log;
  float2* partials;   // [rows * parts] (parts > 1)
  unsigned long long* keys;  // [rows * parts * k]
  unsigned* counters;        // [rows], zero before the launch
};

// Order-preserving bits of x: larger float, larger key; -0 as +0; every NaN
// one key above +inf; -inf lowest of the numbers and still above 0 (0 marks
// an empty slot).
__device__ __forceinline__ unsigned TopKValueKey(float x) {
  if (x != x) return 0xffffffffu;
  const unsigned bits = __float_as_uint(__fadd_rn(x, 0.0f));  // -0 -> +0
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
__device__ __forceinline__ float TopKKeyValue(unsigned key) {
  if (key == 0xffffffffu) return __uint_as_float(0x7fc00000u);
  if (key == 0u) return -INFINITY;
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}
__device__ __forceinline__ unsigned long long TopKKey(float x, long long index) {
  return (static_cast<unsigned long long>(TopKValueKey(x)) << 32) |
         (0xffffffffu - static_cast<unsigned>(index));
}
__device__ __forceinline__ long long TopKKeyIndex(unsigned long long key) {
  return static_cast<long long>(0xffffffffu - static_cast<unsigned>(key & 0xffffffffu));
}

// One warp's candidates: buffer of kTopKBuffer keys in shared memory, its
// count and the bar (as a key, and as a float with its compare mode for the
// scan of the input).
struct TopKWarp {
  unsigned long long* buffer;
  int count;
  int k;
  unsigned long long bar;  // K-th best key held (0: none)
  float bar_value;         // the bar's value
  bool inclusive;          // first group: keep values equal to the bar
  bool saturated;          // the bar is NaN: nothing later can enter
  bool sorted;             // buffer[0, count) is sorted, count <= k: TopKSelect has nothing to do
};

// Sorts buffer[0, size) descending (one warp, size a power of two >= 2),
// given that each run of `run` keys (a power of two) is sorted descending
// already (run 1: none is). A bitonic network in its one-direction form:
// each merge level first compares i with its mirror in the block of 2 runs,
// then halves.
__device__ __forceinline__ void TopKSortRuns(unsigned long long* buffer, int size, int run) {
  const int lane = threadIdx.x & 31;
  for (int k = 2 * run; k <= size; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int t = lane; t < size / 2; t += 32) {
        const int i = ((t & ~(j - 1)) << 1) | (t & (j - 1));  // 2 j (t / j) + t % j, j a power of two
        // First step of a level: i against its mirror in the block of k.
        const int l = j == (k >> 1) ? (i | (k - 1)) - (i & (k - 1)) : i + j;
        const unsigned long long a = buffer[i];
        const unsigned long long b = buffer[l];
        if (a < b) {
          buffer[i] = b;
          buffer[l] = a;
        }
      }
      __syncwarp();
    }
  }
}

// Sorts buffer[0, count) descending (one warp; keys past count are padded
// with 0 up to a power of two), keeps the best k and raises the bar. A
// buffer already sorted and cut (w.sorted) is left as it is.
__device__ __forceinline__ void TopKSelect(TopKWarp& w) {
  if (w.sorted) return;
  const int lane = threadIdx.x & 31;
  int size = 32;
  while (size < w.count) size <<= 1;
  for (int i = w.count + lane; i < size; i += 32) w.buffer[i] = 0ull;
  __syncwarp();
  TopKSortRuns(w.buffer, size, 1);
  w.sorted = true;  // and below, count <= k
  if (w.count >= w.k) {
    w.count = w.k;
    w.bar = w.buffer[w.k - 1];
    w.bar_value = TopKKeyValue(static_cast<unsigned>(w.bar >> 32));
    w.inclusive = false;
    w.saturated = static_cast<unsigned>(w.bar >> 32) == 0xffffffffu;
  }
}

// Appends the keys of the lanes whose `pass` is set, in lane order; sorts
// first when `incoming` more might not fit.
__device__ __forceinline__ void TopKPush(TopKWarp& w, bool pass, unsigned long long key) {
  const unsigned mask = __ballot_sync(0xffffffffu, pass);
  if (mask == 0u) return;
  const int lane = threadIdx.x & 31;
  if (pass) w.buffer[w.count + __popc(mask & ((1u << lane) - 1u))] = key;
  w.count += __popc(mask);
  w.sorted = false;
}

// Lane-wise pass test of one vector against the bar (NaN passes an unordered compare).
template <int V>
__device__ __forceinline__ void TopKPasses(const TopKWarp& w, const float (&x)[V], int e0, int n,
                                           bool (&pass)[V]) {
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const bool above = w.inclusive ? !(x[k] < w.bar_value) : !(x[k] <= w.bar_value);
    pass[k] = above && e0 + k < n;
  }
}

// Vector vi of a strided row (element e at e * inner from `row`), -inf past n.
template <typename T>
__device__ __forceinline__ uint4 LoadStrided(const typename Traits<T>::Bits* row, long long vi,
                                             long long n, long long inner) {
  constexpr int V = VecWidth<T>();
  constexpr int P = Traits<T>::kPerWord;
  using Bits = typename Traits<T>::Bits;
  constexpr Bits kNegInf = static_cast<Bits>(Traits<T>::kNegInfWord);
  unsigned w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    Bits e[P];
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const long long idx = vi * V + i * P + k;
      e[k] = idx < n ? row[idx * inner] : kNegInf;
    }
    w[i] = Traits<T>::ElementsToWord(e);
  }
  return MakeVector(w[0], w[1], w[2], w[3]);
}

template <typename T, int kMode>
__device__ __forceinline__ uint4 TopKLoad(const void* row, long long vi, long long n,
                                          long long inner) {
  if constexpr (kMode == kTopKStrided) {
    return LoadStrided<T>(static_cast<const typename Traits<T>::Bits*>(row), vi, n, inner);
  } else {
    return LoadVector<T, kMode == kTopKVectors>(row, vi, n);
  }
}

// The block's best k of the warps' lists, each sorted and cut (TopKSelect),
// merged pairwise in a tree: each list padded with 0 to a run of a power of
// two >= k, then at each level warp w < half appends warp w + half's run to
// its own, merges the two (TopKSortRuns) and keeps the best run. Returns in
// warp 0's w (sorted, count = min(k, keys held)). Called by every thread.
static_assert(2 * kMaxFusedTopK <= kTopKBuffer, "two runs fit a warp's buffer");
__device__ __forceinline__ void TopKBlockMerge(TopKWarp& w,
                                               unsigned long long (*buffers)[kTopKBuffer],
                                               int* counts) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  int run = 1;
  while (run < w.k) run <<= 1;
  for (int i = w.count + lane; i < run; i += 32) w.buffer[i] = 0ull;
  if (lane == 0) counts[warp] = w.count;
  for (int half = kWarps / 2; half > 0; half >>= 1) {
    __syncthreads();
    if (warp < half) {
      for (int i = lane; i < run; i += 32) w.buffer[run + i] = buffers[warp + half][i];
      __syncwarp();
      TopKSortRuns(w.buffer, 2 * run, run);
    }
  }
  if (warp == 0) {
    int total = 0;
    for (int other = 0; other < kWarps; ++other) total += counts[other];
    w.count = min(total, w.k);
    w.sorted = true;
  }
}

// Writes a row's k values and indices from warp 0's sorted keys.
template <typename T>
__device__ __forceinline__ void TopKWrite(const TopKArgs& a, const TopKWarp& w, long long row,
                                          MaxSum total) {
  using Bits = typename Traits<T>::Bits;
  const long long o = row / a.inner;
  const long long i = row - o * a.inner;
  const float factor = OutputFactor(a.log != 0, total.d);
  for (int r = threadIdx.x; r < a.k; r += 32) {
    const unsigned long long key = w.buffer[r];
    const float x = TopKKeyValue(static_cast<unsigned>(key >> 32));
    const float t = ScaledDiff(x, total.m, a.scale);
    float y[2];
    y[0] = a.log ? LogSoftmaxOut(t, factor) : SoftmaxOut(FastExp2(t), factor);
    y[1] = 0.0f;
    const long long at = (o * a.k + r) * a.inner + i;
    static_cast<Bits*>(a.values)[at] = Traits<T>::Element(Traits<T>::FloatsToWord(y), 0);
    a.indices[at] = TopKKeyIndex(key);
  }
}

// Grid: a block per (row, part), rows from a.first_row; kTopKThreads threads.
// kMode: TopKMode (kTopKVectors needs inner == 1, a 16-byte aligned input and
// n % V == 0).
template <typename T, int kMode>
__global__ void __launch_bounds__(kTopKThreads, kTopKBlocks<T>) TopKKernel(const TopKArgs a) {
  constexpr int V = VecWidth<T>();
  constexpr int U = kTopKUnroll;
  using Bits = typename Traits<T>::Bits;
  __shared__ unsigned long long buffers[kWarps][kTopKBuffer];
  __shared__ int counts[kWarps];
  __shared__ float2 slots[kWarps];
  __shared__ bool last;

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const long long unit = blockIdx.x;
  const long long row = a.first_row + unit / a.parts;
  const int part = static_cast<int>(unit % a.parts);
  const long long o = row / a.inner;
  const long long i = row - o * a.inner;
  const Bits* row_input = static_cast<const Bits*>(a.input) + o * a.n * a.inner + i;
  // Element and vector indices within the row: n < 2^31.
  const int n = static_cast<int>(a.n);
  const int vectors = (n + V - 1) / V;
  const int first = static_cast<int>(part * a.part_vectors);
  const int end = static_cast<int>(min(static_cast<long long>(vectors), first + a.part_vectors));

  TopKWarp w{buffers[warp], 0, a.k, 0ull, -INFINITY, true, false, false};
  MaxSum ms{-INFINITY, 0.0f};
  constexpr int group_vectors = U * kWarps * 32;
  for (int g = first; g < end; g += group_vectors) {
    uint4 raw[U];
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int vi = g + (j * kWarps + warp) * 32 + lane;
      raw[j] = vi < end ? TopKLoad<T, kMode>(row_input, vi, a.n, a.inner) : NegInfVector<T>();
    }
    ms = Merge(ms, LocalMaxSum<T, U>(raw, a.scale), a.scale);
    if (g == first) {
      // The bar's first value: the K-th largest of the lanes' maxima (K <=
      // 32) or of every vector's maximum (U per lane); distinct elements, so
      // at least K elements reach it. K = 64, normal data (host simulation):
      // 81 of a warp's 512 float32 elements pass (227 with two maxima per lane).
      if (a.k <= 32) {
        const float m = VectorsMax<T>(raw);
        w.buffer[lane] = static_cast<unsigned long long>(TopKValueKey(m)) << 32;
        w.count = 32;
      } else {
        // Every vector's maximum (NaN ones as -inf, a bound all the same).
#pragma unroll
        for (int j = 0; j < U; ++j) {
          const float v = VectorMax<T>(raw[j]);
          const unsigned key = TopKValueKey(v == v ? v : -INFINITY);
          w.buffer[j * 32 + lane] = static_cast<unsigned long long>(key) << 32;
        }
        w.count = 32 * U;
      }
      __syncwarp();
      TopKSelect(w);
      w.bar = 0ull;  // the maxima held no index: the bar is a value only
      w.count = 0;
      w.inclusive = true;
      w.saturated = false;
      __syncwarp();
    }
    if (!w.saturated) {
#pragma unroll
      for (int j = 0; j < U; ++j) {
        const int vi = g + (j * kWarps + warp) * 32 + lane;
        float x[V];
        Unpack<T>(raw[j], x);
        bool pass[V];
        TopKPasses<V>(w, x, vi * V, vi < end ? n : 0, pass);
        bool any = false;
#pragma unroll
        for (int k = 0; k < V; ++k) any = any || pass[k];
        if (__any_sync(0xffffffffu, any)) {
          if (w.count + 32 * V > kTopKBuffer) {
            TopKSelect(w);
            if (w.saturated) break;
          }
#pragma unroll
          for (int k = 0; k < V; ++k) TopKPush(w, pass[k], TopKKey(x[k], vi * V + k));
          __syncwarp();
        }
      }
    }
    if (g == first && w.count > w.k) TopKSelect(w);
    // Later groups hold only larger indices: an element equal to the bar
    // ranks below the K kept ones.
    w.inclusive = false;
    if (w.bar_value != w.bar_value) w.saturated = true;
  }
  TopKSelect(w);
  const MaxSum part_total = BlockMerge(ms, a.scale, slots);
  TopKBlockMerge(w, buffers, counts);
  if (a.parts == 1) {
    if (warp == 0) TopKWrite<T>(a, w, row, part_total);
    return;
  }

  // Several parts: publish this one, and let the row's last block merge.
  const long long slot = row * a.parts + part;
  if (warp == 0) {
    for (int r = lane; r < a.k; r += 32) a.keys[slot * a.k + r] = r < w.count ? w.buffer[r] : 0ull;
    if (lane == 0) a.partials[slot] = make_float2(part_total.m, part_total.d);
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.counters + row, 1u) == static_cast<unsigned>(a.parts - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  const MaxSum total = MergePartials(a.partials + row * a.parts, a.parts, a.scale, slots);
  // Each part's keys are sorted (0 past its count): warp w lays parts w,
  // w + kWarps, ... out as runs of a power of two >= k and merges them
  // (TopKSortRuns), keeping the best run when the buffer fills.
  int run = 1;
  while (run < a.k) run <<= 1;
  const int run_slots = kTopKBuffer / run;
  TopKWarp m{buffers[warp], 0, a.k, 0ull, -INFINITY, false, false, true};
  int held = 0;
  for (int p = warp; p < a.parts; p += kWarps) {
    if (held == run_slots) {
      TopKSortRuns(m.buffer, kTopKBuffer, run);
      held = 1;
    }
    const unsigned long long* keys = a.keys + (row * a.parts + p) * a.k;
    for (int r = lane; r < run; r += 32) {
      m.buffer[held * run + r] = r < a.k ? __ldcg(keys + r) : 0ull;
    }
    ++held;
    __syncwarp();
  }
  int runs = 1;
  while (runs < held) runs <<= 1;
  for (int i = held * run + lane; i < runs * run; i += 32) m.buffer[i] = 0ull;
  __syncwarp();
  TopKSortRuns(m.buffer, runs * run, run);
  m.count = held > 0 ? a.k : 0;  // a row's parts hold at least k elements (k <= n)
  TopKBlockMerge(m, buffers, counts);
  if (warp == 0) TopKWrite<T>(a, m, row, total);
}

}  // namespace detail
}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_CUDA_TOP_K_CUH_
