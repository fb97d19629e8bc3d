// CUDA softmax kernels and their host-side planning (see softmax_cuda.h for
// the family and when each path wins).
//
// Conventions shared by every kernel here:
// - Blocks have kThreads = 256 threads (8 warps) and are persistent: the grid
//   is what the occupancy probe says fits at once, and blocks loop over "units"
//   of work (a tile of rows, a row, a part of a row).
// - Each thread holds up to kSlots = 8 raw 16-byte vectors in registers (the
//   input's own bits, converted to float32 on use), so that 8 independent
//   loads are in flight per thread before the first reduction.
// - Rows are padded with -inf; padding never contributes to a sum and is never
//   stored.
// - exp(x * t) is computed as exp2((x - max) * scale) with scale =
//   log2(e) / temperature; log-softmax as ((x - max) * scale - log2(sum)) * ln 2.
#include "kernels/softmax_cuda.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#ifndef SOFTMAX_STREAMING
#define SOFTMAX_STREAMING 0
#endif
#ifndef SOFTMAX_PREFETCH_NEXT
#define SOFTMAX_PREFETCH_NEXT 0
#endif
#ifndef SOFTMAX_WARP_KERNEL
#define SOFTMAX_WARP_KERNEL 0
#endif
// The flat kernel for launches of one segment (see FlatKernel).
#ifndef SOFTMAX_FLAT_KERNEL
#define SOFTMAX_FLAT_KERNEL 1
#endif
// The flat table kernel for ragged launches whose rows all hold at most 8192
// vectors (see FlatTableKernel).
#ifndef SOFTMAX_FLAT_TABLE
#define SOFTMAX_FLAT_TABLE 1
#endif

namespace softmax {
namespace gpu {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSlots = 8;         // vectors per thread: block, cluster, split paths
constexpr int kWarpSlots = 8;     // vectors per lane: warp path
constexpr int kStridedSlots = 8;  // rows per thread and batch: strided path
constexpr int kBlockVectors = kThreads * kSlots;   // vectors one block holds
// Vectors per thread of the cluster path's "wide" form, used only for rows
// beyond 8 blocks x kSlots: measured on the H200, 16 vectors per thread
// (fewer, larger clusters) lost 5-15% against 8 for N = 16K..64K fp32, and won
// 14% (0.66 against 0.58 of copy) at N = 262144 fp16, which 8 cannot hold.
constexpr int kWideSlots = 16;
constexpr int kWideVectors = kThreads * kWideSlots;
constexpr int kWarpVectors = 32 * kWarpSlots;      // vectors one warp path row holds
constexpr int kGroupWarpVectors = 32 * kSlots;     // vectors one warp of a block-path group holds
constexpr int kMaxClusterSize = 16;  // probed (and reported) up to this size
// Largest cluster a launch uses. 16-block clusters (non-portable) measured no
// faster on the H200 than splitting the row (0.52-0.55 of copy bandwidth at
// N = 262144 fp16 against 0.54-0.61 for the split path), so rows that would
// need them are split.
constexpr int kMaxUsedClusterSize = 8;
// Rows of at least this many vectors take the split path even where a
// cluster could hold them (0: only rows too long for a cluster).
#ifndef SOFTMAX_SPLIT_FROM_VECTORS
#define SOFTMAX_SPLIT_FROM_VECTORS 0
#endif
constexpr long long kSplitFromVectors = SOFTMAX_SPLIT_FROM_VECTORS;
constexpr float kLn2 = 0.693147180559945309f;
constexpr double kLog2e = 1.4426950408889634074;

// ---------------------------------------------------------------------------
// Element types.

// A thread's data is held as raw 16-byte vectors (uint4) of the input's own
// bits; each 32-bit word holds kPerWord elements. Word access uses only
// compile-time indices so the vectors stay in registers.

__device__ __forceinline__ unsigned Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ uint4 MakeVector(unsigned a, unsigned b, unsigned c, unsigned d) {
  uint4 v;
  v.x = a;
  v.y = b;
  v.z = c;
  v.w = d;
  return v;
}

template <typename T>
struct Traits;
template <>
struct Traits<float> {
  using Bits = unsigned int;
  static constexpr int kPerWord = 1;
  static constexpr unsigned kNegInfWord = 0xff800000u;
  __device__ static void WordToFloats(unsigned w, float* f) { f[0] = __uint_as_float(w); }
  __device__ static unsigned FloatsToWord(const float* f) { return __float_as_uint(f[0]); }
  __device__ static unsigned ElementsToWord(const Bits* e) { return e[0]; }
  __device__ static float MaxOfWords(unsigned a, unsigned b, unsigned c, unsigned d) {
    return fmaxf(fmaxf(__uint_as_float(a), __uint_as_float(b)),
                 fmaxf(__uint_as_float(c), __uint_as_float(d)));
  }
  __device__ static Bits Element(unsigned w, int k) { return w; }
};
template <>
struct Traits<__half> {
  using Bits = unsigned short;
  static constexpr int kPerWord = 2;
  static constexpr unsigned kNegInfWord = 0xfc00fc00u;
  // volatile: each pass converts again instead of keeping 8 floats per
  // vector alive across the reductions (which would spill).
  __device__ static void WordToFloats(unsigned w, float* f) {
    asm volatile(
        "{.reg .b16 lo, hi;\n\t"
        "mov.b32 {lo, hi}, %2;\n\t"
        "cvt.f32.f16 %0, lo;\n\t"
        "cvt.f32.f16 %1, hi;}"
        : "=f"(f[0]), "=f"(f[1])
        : "r"(w));
  }
  __device__ static unsigned FloatsToWord(const float* f) {
    return static_cast<unsigned>(__half_as_ushort(__float2half_rn(f[0]))) |
           (static_cast<unsigned>(__half_as_ushort(__float2half_rn(f[1]))) << 16);
  }
  __device__ static unsigned ElementsToWord(const Bits* e) {
    return static_cast<unsigned>(e[0]) | (static_cast<unsigned>(e[1]) << 16);
  }
  __device__ static Bits Element(unsigned w, int k) {
    return static_cast<Bits>(k == 0 ? (w & 0xffffu) : (w >> 16));
  }
  // Packed max of 8 elements (NaN is dropped, like fmaxf; sums catch NaN).
  __device__ static float MaxOfWords(unsigned a, unsigned b, unsigned c, unsigned d) {
    unsigned ab, cd, r;
    asm("max.f16x2 %0, %1, %2;" : "=r"(ab) : "r"(a), "r"(b));
    asm("max.f16x2 %0, %1, %2;" : "=r"(cd) : "r"(c), "r"(d));
    asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(ab), "r"(cd));
    float f[2];
    WordToFloats(r, f);
    return fmaxf(f[0], f[1]);
  }
};
template <>
struct Traits<__nv_bfloat16> {
  using Bits = unsigned short;
  static constexpr int kPerWord = 2;
  static constexpr unsigned kNegInfWord = 0xff80ff80u;
  // volatile: see Traits<__half>::WordToFloats.
  __device__ static void WordToFloats(unsigned w, float* f) {
    unsigned lo, hi;
    asm volatile("shl.b32 %0, %2, 16;\n\tand.b32 %1, %2, 0xffff0000;" : "=r"(lo), "=r"(hi) : "r"(w));
    f[0] = __uint_as_float(lo);
    f[1] = __uint_as_float(hi);
  }
  __device__ static unsigned FloatsToWord(const float* f) {
    return static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(f[0]))) |
           (static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(f[1]))) << 16);
  }
  __device__ static unsigned ElementsToWord(const Bits* e) {
    return static_cast<unsigned>(e[0]) | (static_cast<unsigned>(e[1]) << 16);
  }
  __device__ static Bits Element(unsigned w, int k) {
    return static_cast<Bits>(k == 0 ? (w & 0xffffu) : (w >> 16));
  }
  __device__ static float MaxOfWords(unsigned a, unsigned b, unsigned c, unsigned d) {
    unsigned ab, cd, r;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(ab) : "r"(a), "r"(b));
    asm("max.bf16x2 %0, %1, %2;" : "=r"(cd) : "r"(c), "r"(d));
    asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(ab), "r"(cd));
    float f[2];
    WordToFloats(r, f);
    return fmaxf(f[0], f[1]);
  }
};

// Max of the V elements of a vector, as float.
template <typename T>
__device__ __forceinline__ float VectorMax(uint4 v) {
  return Traits<T>::MaxOfWords(v.x, v.y, v.z, v.w);
}

template <typename T>
__host__ __device__ constexpr int VecWidth() { return 16 / static_cast<int>(sizeof(typename Traits<T>::Bits)); }

template <typename T>
__device__ __forceinline__ uint4 NegInfVector() {
  constexpr unsigned w = Traits<T>::kNegInfWord;
  return MakeVector(w, w, w, w);
}

template <typename T>
__device__ __forceinline__ void Unpack(uint4 raw, float* x) {
  constexpr int P = Traits<T>::kPerWord;
#pragma unroll
  for (int i = 0; i < 4; ++i) Traits<T>::WordToFloats(Word(raw, i), x + i * P);
}

template <typename T>
__device__ __forceinline__ uint4 Pack(const float* y) {
  constexpr int P = Traits<T>::kPerWord;
  return MakeVector(Traits<T>::FloatsToWord(y), Traits<T>::FloatsToWord(y + P),
                    Traits<T>::FloatsToWord(y + 2 * P), Traits<T>::FloatsToWord(y + 3 * P));
}

// Loads (16-byte, aligned) used by every path. SOFTMAX_STREAMING selects
// evict-first cache hints for data read and written once.
__device__ __forceinline__ uint4 LoadGlobal16(const uint4* p) {
#if SOFTMAX_STREAMING
  return __ldcs(p);
#else
  return __ldg(p);
#endif
}
__device__ __forceinline__ void StoreGlobal16(uint4* p, uint4 v) {
#if SOFTMAX_STREAMING
  __stcs(p, v);
#else
  *p = v;
#endif
}

#if SOFTMAX_PREFETCH_NEXT
// Per-thread L2 prefetch of one line ahead of its use.
__device__ __forceinline__ void PrefetchLine(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
#endif

// Element-wise load of V elements starting at p[e0]; positions >= limit read -inf.
template <typename T>
__device__ __forceinline__ uint4 LoadElements(const typename Traits<T>::Bits* p, long long e0,
                                              long long limit) {
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
      const long long idx = e0 + i * P + k;
      e[k] = idx < limit ? __ldg(p + idx) : kNegInf;
    }
    w[i] = Traits<T>::ElementsToWord(e);
  }
  (void)V;
  return MakeVector(w[0], w[1], w[2], w[3]);
}

template <typename T>
__device__ __forceinline__ void StoreElements(typename Traits<T>::Bits* p, long long e0,
                                              long long limit, uint4 v) {
  constexpr int P = Traits<T>::kPerWord;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const long long idx = e0 + i * P + k;
      if (idx < limit) p[idx] = Traits<T>::Element(Word(v, i), k);
    }
  }
}

// Loads vector `vi` (elements vi*V .. vi*V+V-1) of a row of n elements; lanes
// past n read -inf. `vec`: the row start is 16-byte aligned and n % V == 0.
template <typename T, bool kVec>
__device__ __forceinline__ uint4 LoadVector(const void* row, long long vi, long long n) {
  constexpr int V = VecWidth<T>();
  if constexpr (kVec) {
    if (vi * V < n) return LoadGlobal16(static_cast<const uint4*>(row) + vi);
    return NegInfVector<T>();
  }
  return LoadElements<T>(static_cast<const typename Traits<T>::Bits*>(row), vi * V, n);
}

// Stores packed vector v as vector `vi` of a row of n elements (lanes past n dropped).
template <typename T, bool kVec>
__device__ __forceinline__ void StoreVector(void* row, long long vi, long long n, uint4 v) {
  constexpr int V = VecWidth<T>();
  if constexpr (kVec) {
    if (vi * V < n) StoreGlobal16(static_cast<uint4*>(row) + vi, v);
    return;
  }
  StoreElements<T>(static_cast<typename Traits<T>::Bits*>(row), vi * V, n, v);
}

// ---------------------------------------------------------------------------
// (max, sum) pairs: sum = sum_i exp2((x_i - max) * scale). Merging is
// associative (online softmax). A part with max == -inf contributes 0 * its
// sum, so a NaN sum still poisons the row and empty parts vanish.

// 2^x with one MUFU instruction; results below 2^-126 flush to 0 (far under
// every tolerance), -inf gives 0, NaN stays NaN.
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

struct MaxSum {
  float m;
  float d;
};

__device__ __forceinline__ float Rescale(float m_part, float m, float scale) {
  return m_part == -INFINITY ? 0.0f : FastExp2((m_part - m) * scale);
}

__device__ __forceinline__ MaxSum Merge(MaxSum a, MaxSum b, float scale) {
  const float m = fmaxf(a.m, b.m);
  return {m, a.d * Rescale(a.m, m, scale) + b.d * Rescale(b.m, m, scale)};
}

__device__ __forceinline__ MaxSum WarpMerge(MaxSum v, float scale) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, offset),
                 __shfl_xor_sync(0xffffffffu, v.d, offset)};
    v = Merge(v, other, scale);
  }
  return v;
}

// (max, sum) over the kSlots vectors one thread holds.
template <typename T, int kN>
__device__ __forceinline__ MaxSum LocalMaxSum(const uint4 (&raw)[kN], float scale) {
  constexpr int V = VecWidth<T>();
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kN; ++j) m = fmaxf(m, VectorMax<T>(raw[j]));
  // With m == -inf every value is -inf (-> 0) or NaN (-> NaN): shift by 0.
  const float shift = m == -INFINITY ? 0.0f : m;
  float d = 0.0f;
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    float x[V];
    Unpack<T>(raw[j], x);
#pragma unroll
    for (int k = 0; k < V; ++k) d += FastExp2((x[k] - shift) * scale);
  }
  return {m, d};
}

// Final values of one vector given the row's merged (max, sum), packed.
// `factor` is log2(sum) for log-softmax and 1/sum otherwise.
template <typename T>
__device__ __forceinline__ uint4 NormalizeVector(uint4 raw, float m, float scale, bool log,
                                                 float factor) {
  constexpr int P = Traits<T>::kPerWord;
  unsigned w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float x[P];
    Traits<T>::WordToFloats(Word(raw, i), x);
#pragma unroll
    for (int k = 0; k < P; ++k) {
      x[k] = log ? ((x[k] - m) * scale - factor) * kLn2 : FastExp2((x[k] - m) * scale) * factor;
    }
    w[i] = Traits<T>::FloatsToWord(x);
  }
  return MakeVector(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ float OutputFactor(bool log, float sum) {
  return log ? log2f(sum) : 1.0f / sum;
}

// Asks L2 to fetch [p, p + bytes) ahead of the loads that will read it (one
// bulk prefetch per 64 KiB); lets a worker's next unit stream in while it
// reduces the current one, without holding registers.
__device__ __forceinline__ void PrefetchL2(const void* p, size_t bytes) {
  uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~static_cast<uintptr_t>(15);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes + 15) & ~static_cast<uintptr_t>(15);
  for (; begin < end; begin += 65536) {
    const unsigned size = static_cast<unsigned>(min(static_cast<uintptr_t>(65536), end - begin));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(begin), "r"(size) : "memory");
  }
}

__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Block-wide merge; every thread gets the result. `slots` holds kWarps pairs
// and may be reused once this returns.
__device__ __forceinline__ MaxSum BlockMerge(MaxSum v, float scale, float2* slots) {
  v = WarpMerge(v, scale);
  if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = make_float2(v.m, v.d);
  __syncthreads();
  MaxSum total{-INFINITY, 0.0f};
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total = Merge(total, MaxSum{slots[w].x, slots[w].y}, scale);
  __syncthreads();
  return total;
}

// Block-wide merge of `parts` (max, sum) partials written by other blocks
// (read through L2); every thread gets the result.
__device__ __forceinline__ MaxSum MergePartials(const float2* partials, int parts, float scale,
                                                float2* slots) {
  MaxSum total{-INFINITY, 0.0f};
  for (int k = threadIdx.x; k < parts; k += kThreads) {
    const float2 p = __ldcg(partials + k);
    total = Merge(total, MaxSum{p.x, p.y}, scale);
  }
  return BlockMerge(total, scale, slots);
}

// First unit that worker `worker` of `workers` owns when unit 0 goes to worker
// `first_worker` and unit u to worker (first_worker + u) % workers. The host
// rotates first_worker across segments so that small segments do not all
// land on worker 0.
__device__ __forceinline__ int FirstUnit(int worker, int workers, int first_worker) {
  const int r = worker - first_worker;
  return r < 0 ? r + workers : r;
}

// ---------------------------------------------------------------------------
// On-chip paths: one kernel serves a whole table of last-axis segments.

enum Config : int {
  kPathMask = 0xf,        // SoftmaxPath
  kLogBit = 1 << 4,       // log-softmax
  kVecBit = 1 << 5,       // 16-byte accesses
  kShapeShift = 8,        // log2 of: lanes per row (warp path), warps per row
                          // (block path), blocks per row (cluster path)
  kColumnsShift = 12,     // log2 of vectors per lane per row (warp path)
  kWideBit = 1 << 6,      // cluster path with kWideSlots vectors per thread
};

// One segment of the on-chip kernel's table (48 bytes). The host splits
// segments so that rows < 2^30: loop indices are 32-bit.
struct RowSegment {
  const void* input;
  void* output;
  int rows;
  int units;         // work units of this segment
  int n;
  int first_worker;  // the worker that takes unit 0 (rotates across segments)
  float scale;       // log2(e) / temperature
  int config;        // Config bits
  int unused[2];
};
static_assert(sizeof(RowSegment) == 48, "RowSegment layout");

constexpr int kInlineSegments = 64;

// Kernel argument: the table travels inline (<= kInlineSegments entries, no
// copy) or in device memory.
struct OnChipArgs {
  const RowSegment* table;  // null: use inline_segments
  int count;
  int launch_cluster;  // cluster size of this launch (1: none); FlatTableKernel:
                       // the table's total units
  RowSegment inline_segments[kInlineSegments];
};

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
#if SOFTMAX_PREFETCH_NEXT
    if (u + workers < seg.units) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int row = row0 + workers * rows_per_unit + r * groups;
        if (row < seg.rows && static_cast<size_t>(lane_in_group) * 128 < pitch) {
          PrefetchLine(static_cast<const char*>(seg.input) + row * pitch + lane_in_group * 128);
        }
      }
    }
#endif
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

// Rows each lane holds at once in the warp path, by log2 of vectors per lane
// per row (matches the WarpRows instantiations in OnChipKernel).
constexpr int WarpRowsPerLane(int columns_log2, int slots = kWarpSlots) {
  return slots >> columns_log2;
}

// Vectors per lane in the warp-only kernel: fewer registers, 4 blocks per SM.
constexpr int kWarpKernelSlots = 4;

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
#if SOFTMAX_PREFETCH_NEXT
    if (row + workers < seg.units) {
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const size_t offset = (static_cast<size_t>(j) * group_threads + t) * 16;
        if ((t & 7) == 0 && offset < pitch) PrefetchLine(in + workers * pitch + offset);
      }
    }
#endif
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
// block rank r holds vectors [r*chunk, (r+1)*chunk), chunk <= kN * kThreads
// (kN = kSlots, or kWideSlots for the longest rows). S == 1 (no cluster
// barrier) is supported but not chosen by the host.
// Each block merges its (max, sum) and writes it into the shared memory of
// every block of its sub-cluster (distributed shared memory stores); after one
// cluster barrier every thread reads the S pairs locally. Thread 0 prefetches
// this block's part of the next row into L2 meanwhile (bulk prefetch). A
// launch with cluster size L >= S runs L/S
// sub-clusters per hardware cluster; all of them pass the same number of
// cluster barriers. Unit = a row; worker = a sub-cluster.
template <typename T, bool kVec, int kN>
__device__ __forceinline__ void ClusterRows(const RowSegment& seg, int launch_cluster,
                                            float2 (*warp_slots)[kWarps], float2* cluster_slots,
                                            int& parity) {
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
    uint4 raw[kN];
#pragma unroll
    for (int j = 0; j < kN; ++j) {
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
      for (int j = 0; j < kN; ++j) {
        const int local = j * kThreads + threadIdx.x;
        if (local < chunk) {
          StoreVector<T, kVec>(out, first_vector + local, n,
                         NormalizeVector<T>(raw[j], total.m, scale, log, factor));
        }
      }
    }
    parity ^= 1;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 2) OnChipKernel(const __grid_constant__ OnChipArgs args) {
  __shared__ float2 warp_slots[2][kWarps];
  __shared__ float2 cluster_slots[2 * kMaxUsedClusterSize];  // [parity][rank in sub-cluster]
  // Toggles once per cluster round; equal in every block of a hardware
  // cluster, since they all pass the same rounds.
  int cluster_parity = 0;
  const RowSegment* table = args.table != nullptr ? args.table : args.inline_segments;
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
      const bool wide = seg.config & kWideBit;
      if (vec && !wide) {
        ClusterRows<T, true, kSlots>(seg, args.launch_cluster, warp_slots, cluster_slots,
                                     cluster_parity);
      } else if (vec) {
        ClusterRows<T, true, kWideSlots>(seg, args.launch_cluster, warp_slots, cluster_slots,
                                         cluster_parity);
      } else if (!wide) {
        ClusterRows<T, false, kSlots>(seg, args.launch_cluster, warp_slots, cluster_slots,
                                      cluster_parity);
      } else {
        ClusterRows<T, false, kWideSlots>(seg, args.launch_cluster, warp_slots, cluster_slots,
                                          cluster_parity);
      }
    }
  }
  // No block may leave while a peer can still read its shared memory.
  if (args.launch_cluster > 1) cg::this_cluster().sync();
}

#if SOFTMAX_WARP_KERNEL
// Launches whose segments all take the warp path with N <= 128 V use this
// variant: 4 vectors per lane, so twice the warps per SM of OnChipKernel.
template <typename T>
__global__ void __launch_bounds__(kThreads, 4) WarpKernel(const __grid_constant__ OnChipArgs args) {
  const RowSegment* table = args.table != nullptr ? args.table : args.inline_segments;
  for (int i = 0; i < args.count; ++i) {
    const RowSegment& seg = table[i];
    const bool vec = seg.config & kVecBit;
    switch ((seg.config >> kColumnsShift) & 0xf) {
      case 0: vec ? WarpRows<T, 1, 4, true>(seg) : WarpRows<T, 1, 4, false>(seg); break;
      case 1: vec ? WarpRows<T, 2, 2, true>(seg) : WarpRows<T, 2, 2, false>(seg); break;
      default: vec ? WarpRows<T, 4, 1, true>(seg) : WarpRows<T, 4, 1, false>(seg); break;
    }
  }
}
#endif

// ---------------------------------------------------------------------------
// Flat path: a launch of ONE last-axis segment whose rows fit in kS vectors
// per thread of at most 1024 threads. A group of R = 2^group_log2 threads
// holds a row (thread t of the group holding vectors j*R + t, so each load
// instruction of a group covers R contiguous vectors); a block holds
// blockDim/R groups (R <= 32) or is one group (R >= 64). Each thread holds
// only kS (2 or 4) vectors, so the kernel runs at up to 64 warps per SM
// against the on-chip kernel's 16: many blocks in different phases (load,
// reduce, store) keep the memory busy, which the one-row-per-program kernels
// of Triton's tutorial also rely on. The grid is persistent (what the probe
// says fits); blocks loop over groups of rows.
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

// kPipeline: load the block's next rows before reducing the current ones
// (used with 4 vectors per thread, where one 1024-thread block fills an SM).
template <typename T, int kS, bool kVec, bool kLog>
__global__ void __launch_bounds__(1024) FlatKernel(const FlatArgs a) {
  constexpr bool kPipeline = kS == 4;
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
  uint4 next[kS];
  if constexpr (kPipeline) {
    const long long row = static_cast<long long>(blockIdx.x) * groups + group;
    const char* in = static_cast<const char*>(a.input) + row * pitch;
#pragma unroll
    for (int j = 0; j < kS; ++j) {
      next[j] = row < a.rows ? LoadVector<T, kVec>(in, j * r_threads + t, a.n) : NegInfVector<T>();
    }
  }
  for (long long base = static_cast<long long>(blockIdx.x) * groups; base < a.rows;
       base += stride) {
    const long long row = base + group;
    const bool valid = row < a.rows;
    uint4 raw[kS];
    if constexpr (kPipeline) {
      const long long row2 = row + stride;
      const char* in2 = static_cast<const char*>(a.input) + row2 * pitch;
#pragma unroll
      for (int j = 0; j < kS; ++j) {
        raw[j] = next[j];
        next[j] = row2 < a.rows ? LoadVector<T, kVec>(in2, j * r_threads + t, a.n)
                                : NegInfVector<T>();
      }
    } else {
      const char* in = static_cast<const char*>(a.input) + row * pitch;
#pragma unroll
      for (int j = 0; j < kS; ++j) {
        raw[j] = valid ? LoadVector<T, kVec>(in, j * r_threads + t, a.n) : NegInfVector<T>();
      }
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

// ---------------------------------------------------------------------------
// Flat table kernel: the flat kernel's way (a group of threads per row, max
// first, few vectors per thread, one pass of the grid) for a ragged table of
// last-axis segments whose rows hold at most 8192 vectors, in one launch.
// Blocks have 1024 threads; a segment's rows get groups of R = 2^k threads
// (R <= 32, or 128..1024) so that each thread holds at most 8 vectors; a unit
// is one block's worth of a segment's rows (1024 / R rows). Table entries are
// RowSegment with `first_worker` holding the segment's first unit and the
// shape bits holding log2 R. Blocks find their segment by binary search.
constexpr int kTableThreads = 1024;
constexpr int kTableSlots = 8;
constexpr long long kTableMaxVectors = static_cast<long long>(kTableThreads) * kTableSlots;

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

template <typename T>
__global__ void __launch_bounds__(kTableThreads, 1) FlatTableKernel(
    const __grid_constant__ OnChipArgs args) {
  constexpr int V = VecWidth<T>();
  using Bits = typename Traits<T>::Bits;
  __shared__ float max_slots[32];
  __shared__ float sum_slots[32];
  const RowSegment* table = args.table != nullptr ? args.table : args.inline_segments;
  const int total_units = args.launch_cluster;  // total units of the table
  for (int u = blockIdx.x; u < total_units; u += gridDim.x) {
    int lo = 0;
    int hi = args.count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (table[mid].first_worker <= u) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const RowSegment seg = table[lo];
    const int group_log2 = (seg.config >> kShapeShift) & 0xf;
    const int r_threads = 1 << group_log2;
    const int group = threadIdx.x >> group_log2;
    const int t = threadIdx.x & (r_threads - 1);
    const int row = (u - seg.first_worker) * (kTableThreads >> group_log2) + group;
    const bool valid = row < seg.rows;
    const bool log = seg.config & kLogBit;
    const bool vec = seg.config & kVecBit;
    const int vectors = (seg.n + V - 1) / V;
    const int slots_used = (vectors + r_threads - 1) >> group_log2;  // <= kTableSlots
    const char* in = static_cast<const char*>(seg.input) +
                     static_cast<long long>(row) * seg.n * static_cast<long long>(sizeof(Bits));
    uint4 raw[kTableSlots];
#pragma unroll
    for (int j = 0; j < kTableSlots; ++j) {
      const int vi = j * r_threads + t;
      raw[j] = NegInfVector<T>();
      if (valid && j < slots_used) {
        raw[j] = vec ? LoadVector<T, true>(in, vi, seg.n) : LoadVector<T, false>(in, vi, seg.n);
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
      char* out = static_cast<char*>(seg.output) +
                  static_cast<long long>(row) * seg.n * static_cast<long long>(sizeof(Bits));
#pragma unroll
      for (int j = 0; j < kTableSlots; ++j) {
        if (j < slots_used) {
          const uint4 y = NormalizeVector<T>(raw[j], shift, seg.scale, log, factor);
          const int vi = j * r_threads + t;
          if (vec) {
            StoreVector<T, true>(out, vi, seg.n, y);
          } else {
            StoreVector<T, false>(out, vi, seg.n, y);
          }
        }
      }
    }
    // Group shapes may change with the next unit's segment: no warp may
    // write a slot that another group of this unit still reads.
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------
// Split rows (last axis, rows too long for a cluster): a row of `vectors`
// vectors is cut into `parts` parts of part_vectors; unit = (row, part).

struct SplitArgs {
  const void* input;
  void* output;
  long long rows;
  long long n;
  long long part_vectors;  // multiple of kBlockVectors
  int parts;
  float scale;
  int log;
  int vec;
  float2* partials;         // rows * parts
  float2* finals;           // rows
  unsigned int* counters;   // rows, zero on entry; left zero
};

// Pass 1: (max, sum) per part; the last part of a row to finish merges the
// row's partials into finals[row] (threadfence reduction, no waiting).
template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads, 2) SplitStatsKernel(const SplitArgs a) {
  constexpr int V = VecWidth<T>();
  using Bits = typename Traits<T>::Bits;
  __shared__ float2 slots[kWarps];
  __shared__ int is_last;
  const long long vectors = (a.n + V - 1) / V;
  const long long pitch = a.n * static_cast<long long>(sizeof(Bits));
  const long long units = a.rows * a.parts;
  for (long long u = blockIdx.x; u < units; u += gridDim.x) {
    const long long row = u / a.parts;
    const int part = static_cast<int>(u % a.parts);
    const char* in = static_cast<const char*>(a.input) + row * pitch;
    const long long begin = part * a.part_vectors;
    const long long end = min(vectors, begin + a.part_vectors);
    MaxSum acc{-INFINITY, 0.0f};
    for (long long base = begin; base < end; base += kBlockVectors) {
#if SOFTMAX_PREFETCH_NEXT
      if (base + kBlockVectors < end) {
#pragma unroll
        for (int j = 0; j < kSlots; ++j) {
          const long long vi = base + kBlockVectors + j * kThreads + threadIdx.x;
          if ((threadIdx.x & 7) == 0 && vi < end) PrefetchLine(in + vi * 16);
        }
      }
#endif
      uint4 raw[kSlots];
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const long long vi = base + j * kThreads + threadIdx.x;
        raw[j] = vi < end ? LoadVector<T, kVec>(in, vi, a.n) : NegInfVector<T>();
      }
      acc = Merge(acc, LocalMaxSum<T>(raw, a.scale), a.scale);
    }
    const MaxSum part_total = BlockMerge(acc, a.scale, slots);
    if (threadIdx.x == 0) {
      a.partials[u] = make_float2(part_total.m, part_total.d);
      __threadfence();
      is_last = atomicAdd(a.counters + row, 1u) == static_cast<unsigned>(a.parts - 1);
    }
    __syncthreads();
    if (is_last) {
      __threadfence();
      const MaxSum row_total = MergePartials(a.partials + row * a.parts, a.parts, a.scale, slots);
      if (threadIdx.x == 0) {
        a.finals[row] = make_float2(row_total.m, row_total.d);
        a.counters[row] = 0;
      }
    }
    __syncthreads();
  }
}

// Pass 2: re-read and write, units and chunks in reverse order so that the
// data pass 1 read last (most likely still in L2) is read first.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads, 2) SplitNormalizeKernel(const SplitArgs a) {
  constexpr int V = VecWidth<T>();
  using Bits = typename Traits<T>::Bits;
  const long long vectors = (a.n + V - 1) / V;
  const long long pitch = a.n * static_cast<long long>(sizeof(Bits));
  const long long units = a.rows * a.parts;
  for (long long i = blockIdx.x; i < units; i += gridDim.x) {
    const long long u = units - 1 - i;
    const long long row = u / a.parts;
    const int part = static_cast<int>(u % a.parts);
    const char* in = static_cast<const char*>(a.input) + row * pitch;
    char* out = static_cast<char*>(a.output) + row * pitch;
    const long long begin = part * a.part_vectors;
    const long long end = min(vectors, begin + a.part_vectors);
    const float2 total = a.finals[row];
    const float factor = OutputFactor(a.log, total.y);
    const long long chunks = (end - begin + kBlockVectors - 1) / kBlockVectors;
    for (long long c = chunks - 1; c >= 0; --c) {
      const long long base = begin + c * kBlockVectors;
#if SOFTMAX_PREFETCH_NEXT
      if (c > 0) {
#pragma unroll
        for (int j = 0; j < kSlots; ++j) {
          if ((threadIdx.x & 7) == 0) PrefetchLine(in + (base - kBlockVectors + j * kThreads + threadIdx.x) * 16);
        }
      }
#endif
      uint4 raw[kSlots];
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const long long vi = base + j * kThreads + threadIdx.x;
        raw[j] = vi < end ? LoadVector<T, kVec>(in, vi, a.n) : NegInfVector<T>();
      }
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const long long vi = base + j * kThreads + threadIdx.x;
        if (vi < end) {
          StoreVector<T, kVec>(out, vi, a.n,
                         NormalizeVector<T>(raw[j], total.x, a.scale, a.log, factor));
        }
      }
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
  constexpr int V = VecWidth<T>();
  using Bits = typename Traits<T>::Bits;
  __shared__ float2 slots[kWarps];
  const long long vectors = (a.n + V - 1) / V;
  const long long pitch = a.n * static_cast<long long>(sizeof(Bits));
  const long long units = a.rows * a.parts;
  uint4 prev[kSlots];
  long long prev_u = -1;
  MaxSum prev_total{-INFINITY, 0.0f};  // the row's total when parts == 1
  for (long long u = blockIdx.x;; u += gridDim.x) {
    const bool have = u < units;
    const long long row = u / a.parts;
    const long long begin = (u % a.parts) * kBlockVectors;
    const char* in = static_cast<const char*>(a.input) + row * pitch;
    uint4 cur[kSlots];
    if (have) {
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const long long vi = begin + j * kThreads + threadIdx.x;
        cur[j] = vi < vectors ? LoadVector<T, kVec>(in, vi, a.n) : NegInfVector<T>();
      }
    }
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
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        const long long vi = pbegin + j * kThreads + threadIdx.x;
        if (vi < vectors) {
          StoreVector<T, kVec>(out, vi, a.n,
                               NormalizeVector<T>(prev[j], total.m, a.scale, a.log, factor));
        }
      }
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

// ---------------------------------------------------------------------------
// Strided: softmax along n of [outer, n, inner], inner > 1. A warp covers
// 32/L rows of n x L column vectors (L = 2^lanes_log2 lanes per row, V
// columns per lane), a block 16 such row groups; "strip" = L*V adjacent
// columns. Unit = (outer index, strip, part of n); per-column (max, sum)
// partials merge like the split path.

struct StridedArgs {
  const void* input;
  void* output;
  long long outer;
  long long n;
  long long inner;
  long long strips;
  long long part_rows;  // multiple of rows per block pass
  int parts;
  int lanes_log2;
  float scale;
  int log;
  int vec;                // inner % V == 0 and pointers 16-byte aligned
  float2* partials;       // [outer * strips * parts][32 * V]
  float2* finals;         // [outer * strips][32 * V]
  unsigned int* counters; // [outer * strips]
};

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
  const long long units = a.outer * a.strips * a.parts;
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
    for (long long r0 = row_begin + row_in_pass; r0 < row_end;
         r0 += static_cast<long long>(kStridedSlots) * rows_per_pass) {
      uint4 raw[kStridedSlots];
#pragma unroll
      for (int j = 0; j < kStridedSlots; ++j) {
        const long long r = r0 + static_cast<long long>(j) * rows_per_pass;
        raw[j] = r < row_end ? LoadColumns<T, kVec>(base + r * row_pitch, col0, a.inner)
                             : NegInfVector<T>();
      }
      float x[kStridedSlots][V];
#pragma unroll
      for (int j = 0; j < kStridedSlots; ++j) Unpack<T>(raw[j], x[j]);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        float mk = m[k];
#pragma unroll
        for (int j = 0; j < kStridedSlots; ++j) mk = fmaxf(mk, x[j][k]);
        const float shift = mk == -INFINITY ? 0.0f : mk;
        float dk = d[k] * Rescale(m[k], mk, a.scale);
#pragma unroll
        for (int j = 0; j < kStridedSlots; ++j) dk += FastExp2((x[j][k] - shift) * a.scale);
        m[k] = mk;
        d[k] = dk;
      }
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
      MaxSum column{-INFINITY, 0.0f};
      if (slice < slices) {
        for (int p = slice; p < a.parts; p += slices) {
          const float2 v = __ldcg(a.partials + (os * a.parts + p) * kStripColumns + column_index);
          column = Merge(column, MaxSum{v.x, v.y}, a.scale);
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
    float m[V], factor[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float2 f = a.finals[os * kStripColumns + column_vector * V + k];
      m[k] = f.x;
      factor[k] = OutputFactor(a.log, f.y);
    }
    const long long row_begin = part * a.part_rows;
    const long long row_end = min(a.n, row_begin + a.part_rows);
    const long long step = static_cast<long long>(kStridedSlots) * rows_per_pass;
    const long long passes = (row_end - row_begin + step - 1) / step;
    for (long long p = passes - 1; p >= 0; --p) {
      const long long r0 = row_begin + p * step + row_in_pass;
      uint4 raw[kStridedSlots];
#pragma unroll
      for (int j = 0; j < kStridedSlots; ++j) {
        const long long r = r0 + static_cast<long long>(j) * rows_per_pass;
        raw[j] = r < row_end ? LoadColumns<T, kVec>(in + r * row_pitch, col0, a.inner)
                             : NegInfVector<T>();
      }
#pragma unroll
      for (int j = 0; j < kStridedSlots; ++j) {
        const long long r = r0 + static_cast<long long>(j) * rows_per_pass;
        if (r < row_end) {
          float x[V], y[V];
          Unpack<T>(raw[j], x);
#pragma unroll
          for (int k = 0; k < V; ++k) {
            y[k] = a.log ? ((x[k] - m[k]) * a.scale - factor[k]) * kLn2
                         : FastExp2((x[k] - m[k]) * a.scale) * factor[k];
          }
          StoreColumns<T, kVec>(out + r * row_pitch, col0, a.inner, y);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Host side.

#define SOFTMAX_CUDA_RETURN_IF_ERROR(expr)   \
  do {                                       \
    const cudaError_t error_ = (expr);       \
    if (error_ != cudaSuccess) return error_; \
  } while (0)

int CeilLog2(long long x) {
  int l = 0;
  while ((1LL << l) < x) ++l;
  return l;
}

long long CeilDiv(long long a, long long b) { return (a + b - 1) / b; }

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Flat kernel configurations: vectors per thread and block size. Rows of up
// to 2048 vectors use 2 vectors per thread, up to 4096 use 4; a group of
// R = 2^k threads holds a row; blocks are 256 threads for R <= 32, else R.
struct FlatConfig {
  int slots;
  int threads;
};
constexpr FlatConfig kFlatConfigs[] = {{2, 64}, {2, 128}, {2, 256}, {2, 512}, {2, 1024}, {4, 1024}};
constexpr long long kFlatMaxVectors = 4096;

std::string FlatFamily(const FlatConfig& f) {
  return "flat" + std::to_string(f.slots) + "_b" + std::to_string(f.threads);
}

struct FlatShape {
  FlatConfig config;
  int group_log2;
};
FlatShape FlatShapeOf(long long vectors) {
  const int slots = vectors <= 2048 ? 2 : 4;
  const int group_log2 = CeilLog2(CeilDiv(vectors, slots));
  const int threads = group_log2 <= 5 ? 256 : std::max(64, 1 << group_log2);
  return {{slots, threads}, group_log2};
}

template <typename T>
struct Kernels {
  static void* OnChip() { return reinterpret_cast<void*>(&OnChipKernel<T>); }
#if SOFTMAX_WARP_KERNEL
  static void* Warp() { return reinterpret_cast<void*>(&WarpKernel<T>); }
#endif
  static void* Flat(int slots) {
    return slots == 2 ? reinterpret_cast<void*>(&FlatKernel<T, 2, true, false>)
                      : reinterpret_cast<void*>(&FlatKernel<T, 4, true, false>);
  }
  static void* FlatTable() { return reinterpret_cast<void*>(&FlatTableKernel<T>); }
  static void* SplitFused() { return reinterpret_cast<void*>(&SplitFusedKernel<T, true>); }
  static void* SplitStats() { return reinterpret_cast<void*>(&SplitStatsKernel<T, true>); }
  static void* SplitNormalize() { return reinterpret_cast<void*>(&SplitNormalizeKernel<T, true>); }
  static void* StridedStats() { return reinterpret_cast<void*>(&StridedStatsKernel<T, true>); }
  static void* StridedNormalize() { return reinterpret_cast<void*>(&StridedNormalizeKernel<T, true>); }
};

cudaError_t ProbeKernel(const void* kernel, const std::string& family, const char* paths,
                        DType dtype, int multiprocessors, KernelProbe* probe,
                        int threads = kThreads) {
  cudaFuncAttributes attributes;
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaFuncGetAttributes(&attributes, kernel));
  int blocks = 0;
  SOFTMAX_CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0));
  probe->kernel = family + "<" + DTypeName(dtype) + ">";
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

template <typename T>
cudaError_t ProbeDType(DType dtype, int multiprocessors, bool clusters,
                       std::vector<KernelProbe>* probes, int* max_cluster) {
  KernelProbe probe;
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(Kernels<T>::OnChip(), "on_chip", "warp,block", dtype,
                                           multiprocessors, &probe));
  probes->push_back(probe);
#if SOFTMAX_WARP_KERNEL
  KernelProbe warp_probe;
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(Kernels<T>::Warp(), "on_chip_warp", "warp(N<=128V)",
                                           dtype, multiprocessors, &warp_probe));
  probes->push_back(warp_probe);
#endif
#if SOFTMAX_FLAT_KERNEL
  for (const FlatConfig& f : kFlatConfigs) {
    KernelProbe flat;
    SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(Kernels<T>::Flat(f.slots), FlatFamily(f), "flat", dtype,
                                             multiprocessors, &flat, f.threads));
    probes->push_back(flat);
  }
#endif
#if SOFTMAX_FLAT_TABLE
  {
    KernelProbe table;
    SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(Kernels<T>::FlatTable(), "flat_table",
                                             "ragged <= 8192V", dtype, multiprocessors, &table,
                                             kTableThreads));
    probes->push_back(table);
  }
#endif
  int best = 1;
  if (clusters) {
    for (int size = 2; size <= kMaxClusterSize; size *= 2) {
      if (size > 8) {
        if (cudaFuncSetAttribute(Kernels<T>::OnChip(),
                                 cudaFuncAttributeNonPortableClusterSizeAllowed,
                                 1) != cudaSuccess) {
          cudaGetLastError();
          break;
        }
      }
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(size * multiprocessors, 1, 1);
      config.blockDim = dim3(kThreads, 1, 1);
      cudaLaunchAttribute attribute;
      attribute.id = cudaLaunchAttributeClusterDimension;
      attribute.val.clusterDim.x = size;
      attribute.val.clusterDim.y = 1;
      attribute.val.clusterDim.z = 1;
      config.attrs = &attribute;
      config.numAttrs = 1;
      int active = 0;
      if (cudaOccupancyMaxActiveClusters(&active, Kernels<T>::OnChip(), &config) != cudaSuccess) {
        cudaGetLastError();
        active = 0;
      }
      if (active <= 0) break;
      KernelProbe c = probe;
      c.paths = "warp,block,cluster";
      c.cluster_size = size;
      c.max_active_clusters = active;
      c.grid = active * size;
      probes->push_back(c);
      best = size;
    }
  }
  *max_cluster = std::min(*max_cluster, best);
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(Kernels<T>::SplitFused(), "split_fused", "split(1 pass)",
                                           dtype, multiprocessors, &probe));
  probes->push_back(probe);
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(Kernels<T>::SplitStats(), "split_stats", "split", dtype,
                                           multiprocessors, &probe));
  probes->push_back(probe);
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(Kernels<T>::SplitNormalize(), "split_normalize",
                                           "split", dtype, multiprocessors, &probe));
  probes->push_back(probe);
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(Kernels<T>::StridedStats(), "strided_stats", "strided",
                                           dtype, multiprocessors, &probe));
  probes->push_back(probe);
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeKernel(Kernels<T>::StridedNormalize(), "strided_normalize",
                                           "strided", dtype, multiprocessors, &probe));
  probes->push_back(probe);
  return cudaSuccess;
}

int GridOf(const LaunchPlan& plan, const std::string& family, DType dtype, int cluster = 1) {
  const KernelProbe* probe = plan.Find(family, dtype, cluster);
  return probe != nullptr ? probe->grid : plan.multiprocessors();
}

// Geometry of a split-row segment.
struct SplitShape {
  long long part_vectors;
  int parts;
  bool fused;  // single pass (SplitFusedKernel): parts of one block each, parts <= grid
};
SplitShape SplitShapeOf(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s) {
  const int v = 16 / ItemSize(dtype);
  const long long vectors = CeilDiv(s.n, v);
  const long long chunks = CeilDiv(vectors, kBlockVectors);
  if (chunks <= GridOf(plan, "split_fused", dtype)) {
    return {kBlockVectors, static_cast<int>(chunks), true};
  }
  const long long rows = s.outer;
  const long long grid = GridOf(plan, "split_stats", dtype);
  long long parts = std::min(chunks, std::max(1LL, CeilDiv(grid, rows)));
  const long long part_vectors = CeilDiv(chunks, parts) * kBlockVectors;
  parts = CeilDiv(vectors, part_vectors);
  return {part_vectors, static_cast<int>(parts), false};
}

struct StridedShape {
  int lanes_log2;
  long long strips;
  long long part_rows;
  int parts;
};
StridedShape StridedShapeOf(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s) {
  const int v = 16 / ItemSize(dtype);
  StridedShape shape;
  shape.lanes_log2 = std::min(5, CeilLog2(CeilDiv(s.inner, v)));
  const long long strip_columns = (1LL << shape.lanes_log2) * v;
  shape.strips = CeilDiv(s.inner, strip_columns);
  const long long rows_per_pass = kWarps * (32 >> shape.lanes_log2);
  const long long base_units = s.outer * shape.strips;
  const long long grid = GridOf(plan, "strided_stats", dtype);
  long long parts = std::min(CeilDiv(s.n, rows_per_pass), std::max(1LL, CeilDiv(grid, base_units)));
  shape.part_rows = CeilDiv(CeilDiv(s.n, parts), rows_per_pass) * rows_per_pass;
  shape.parts = static_cast<int>(CeilDiv(s.n, shape.part_rows));
  return shape;
}

size_t Align256(size_t x) { return (x + 255) & ~static_cast<size_t>(255); }

struct ScratchLayout {
  size_t table_bytes = 0;
  size_t total = 0;
};

// Scratch bytes of one split or strided segment: partials, finals, counters.
size_t SegmentScratch(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s,
                      SoftmaxPath path) {
  if (path == SoftmaxPath::kSplitRows) {
    const SplitShape shape = SplitShapeOf(plan, dtype, s);
    return Align256(sizeof(float2) * s.outer * shape.parts) + Align256(sizeof(float2) * s.outer) +
           Align256(sizeof(unsigned) * s.outer);
  }
  if (path == SoftmaxPath::kStrided) {
    const StridedShape shape = StridedShapeOf(plan, dtype, s);
    const size_t columns = 32 * (16 / ItemSize(dtype));
    const size_t os = static_cast<size_t>(s.outer * shape.strips);
    return Align256(sizeof(float2) * columns * os * shape.parts) +
           Align256(sizeof(float2) * columns * os) + Align256(sizeof(unsigned) * os);
  }
  return 0;
}

// Cluster path geometry for a row of `vectors` vectors: log2 of the cluster
// size and whether the wide form is used.
struct ClusterShape {
  int log2;
  bool wide;
};
ClusterShape ClusterShapeOf(long long vectors) {
  if (vectors <= static_cast<long long>(kBlockVectors) * kMaxUsedClusterSize) {
    return {CeilLog2(CeilDiv(vectors, kBlockVectors)), false};
  }
  return {CeilLog2(CeilDiv(vectors, kWideVectors)), true};
}

// The kernels' exponent prescale: exp(x / t) = exp2(x * log2(e) / t).
float Log2Scale(const SoftmaxSegment& s) {
  return static_cast<float>(kLog2e / static_cast<double>(s.temperature));
}

bool Empty(const SoftmaxSegment& s) { return s.outer == 0 || s.inner == 0 || s.n == 0; }

// On-chip segments are cut into pieces of at most this many rows.
constexpr long long kMaxPieceRows = 1LL << 30;

template <typename T>
cudaError_t LaunchOnChip(const LaunchPlan& plan, DType dtype, const std::vector<RowSegment>& rows,
                         int launch_cluster, bool warp_kernel, void* table_scratch,
                         cudaStream_t stream) {
  OnChipArgs args;
  std::memset(&args, 0, sizeof(args));
  args.count = static_cast<int>(rows.size());
  args.launch_cluster = launch_cluster;
  if (rows.size() <= static_cast<size_t>(kInlineSegments)) {
    std::copy(rows.begin(), rows.end(), args.inline_segments);
  } else {
    SOFTMAX_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(table_scratch, rows.data(),
                                                 rows.size() * sizeof(RowSegment),
                                                 cudaMemcpyHostToDevice, stream));
    args.table = static_cast<const RowSegment*>(table_scratch);
  }
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
#if SOFTMAX_WARP_KERNEL
  if (warp_kernel) {
    config.gridDim = dim3(GridOf(plan, "on_chip_warp", dtype), 1, 1);
    SOFTMAX_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, WarpKernel<T>, args));
    return cudaGetLastError();
  }
#endif
  (void)warp_kernel;
  config.gridDim = dim3(GridOf(plan, "on_chip", dtype, launch_cluster), 1, 1);
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&config, OnChipKernel<T>, args));
  return cudaGetLastError();
}

// log2 of the group size FlatTableKernel gives rows of `vectors` vectors: at
// most kTableSlots vectors per thread, no 64-thread groups (at most 8 groups
// of whole warps per block, one named barrier each).
int TableGroupLog2(long long vectors) {
  const int group_log2 = CeilLog2(CeilDiv(vectors, kTableSlots));
  return group_log2 > 5 && group_log2 < 7 ? 7 : group_log2;
}

// Whether every on-chip table entry has rows of at most kTableMaxVectors
// vectors and the table's units fit the flat table kernel's int indices.
bool FlatTableFits(const std::vector<RowSegment>& rows, int v) {
  long long units = 0;
  for (const RowSegment& r : rows) {
    const long long vectors = CeilDiv(r.n, v);
    if (vectors > kTableMaxVectors) return false;
    units += CeilDiv(r.rows, kTableThreads >> TableGroupLog2(vectors));
  }
  return units <= 0x7fffffffLL;
}

// Rewrites an on-chip table for FlatTableKernel (group shape, first unit)
// and launches it with a one-pass grid.
template <typename T>
cudaError_t LaunchFlatTable(std::vector<RowSegment>* rows, void* table_scratch,
                            cudaStream_t stream) {
  constexpr int V = VecWidth<T>();
  long long units = 0;
  for (RowSegment& r : *rows) {
    const int group_log2 = TableGroupLog2(CeilDiv(r.n, V));
    r.config = (r.config & (kLogBit | kVecBit)) | (group_log2 << kShapeShift);
    r.units = static_cast<int>(CeilDiv(r.rows, kTableThreads >> group_log2));
    r.first_worker = static_cast<int>(units);
    units += r.units;
  }
  OnChipArgs args;
  std::memset(&args, 0, sizeof(args));
  args.count = static_cast<int>(rows->size());
  args.launch_cluster = static_cast<int>(units);
  if (rows->size() <= static_cast<size_t>(kInlineSegments)) {
    std::copy(rows->begin(), rows->end(), args.inline_segments);
  } else {
    SOFTMAX_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(table_scratch, rows->data(),
                                                 rows->size() * sizeof(RowSegment),
                                                 cudaMemcpyHostToDevice, stream));
    args.table = static_cast<const RowSegment*>(table_scratch);
  }
  FlatTableKernel<T><<<static_cast<unsigned>(units), kTableThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

// The one non-empty segment of a launch that the flat kernel takes, or null.
const SoftmaxSegment* FlatSegment(DType dtype, const SoftmaxSegment* segments, int count,
                                  bool allow_flat) {
  if (!SOFTMAX_FLAT_KERNEL || !allow_flat) return nullptr;
  const SoftmaxSegment* only = nullptr;
  for (int i = 0; i < count; ++i) {
    if (Empty(segments[i])) continue;
    if (only != nullptr) return nullptr;
    only = &segments[i];
  }
  if (only == nullptr || only->inner != 1) return nullptr;
  const long long vectors = CeilDiv(only->n, 16 / ItemSize(dtype));
  if (vectors > kFlatMaxVectors) return nullptr;
  return only;
}

template <typename T, int kS>
cudaError_t LaunchFlatSlots(const FlatArgs& a, bool vec, bool log, int grid, int threads,
                            cudaStream_t stream) {
  auto kernel = vec ? (log ? FlatKernel<T, kS, true, true> : FlatKernel<T, kS, true, false>)
                    : (log ? FlatKernel<T, kS, false, true> : FlatKernel<T, kS, false, false>);
  kernel<<<grid, threads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchFlat(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& s,
                       cudaStream_t stream) {
  constexpr int V = VecWidth<T>();
  const FlatShape shape = FlatShapeOf(CeilDiv(s.n, V));
  FlatArgs a = {};
  a.input = s.input;
  a.output = s.output;
  a.rows = s.outer;
  a.n = s.n;
  a.scale = Log2Scale(s);
  a.group_log2 = shape.group_log2;
  const bool vec = Aligned16(s.input) && Aligned16(s.output) && (s.n * ItemSize(dtype)) % 16 == 0;
  const long long groups = shape.config.threads >> std::min(shape.group_log2, 30);
  // Grid: with 2 vectors per thread, one pass over the rows (each block one
  // group of rows); with 4, the persistent grid of the probe. Measured on
  // the H200 (M x N = 2^28): a one-pass grid is 3-9% faster than the
  // persistent one for 2 vectors per thread (0.90-1.01 of copy bandwidth
  // against 0.87-0.94) and 6-10% slower for 4, where the persistent kernel
  // overlaps the next rows' loads with the current rows' reduction.
  long long grid = CeilDiv(s.outer, std::max(1LL, groups));
  if (shape.config.slots == 4) {
    grid = std::min<long long>(grid, GridOf(plan, FlatFamily(shape.config), dtype));
  }
  grid = std::min<long long>(grid, 0x7fffffffLL);
  const int threads = shape.config.threads;
  const int blocks = static_cast<int>(grid);
  return shape.config.slots == 2 ? LaunchFlatSlots<T, 2>(a, vec, s.log, blocks, threads, stream)
                                 : LaunchFlatSlots<T, 4>(a, vec, s.log, blocks, threads, stream);
}

template <typename T>
cudaError_t LaunchTyped(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                        int count, char* scratch, size_t scratch_bytes, cudaStream_t stream,
                        bool allow_flat) {
  constexpr int V = VecWidth<T>();
  const int item = ItemSize(dtype);
  if (const SoftmaxSegment* flat = FlatSegment(dtype, segments, count, allow_flat)) {
    return LaunchFlat<T>(plan, dtype, *flat, stream);
  }
  // Pass 1: the cluster size of the launch (largest any segment needs).
  int launch_cluster = 1;
  bool warp_kernel = SOFTMAX_WARP_KERNEL != 0;
  for (int i = 0; i < count; ++i) {
    const SoftmaxSegment& s = segments[i];
    if (Empty(s)) continue;
    const SoftmaxPath path = ChoosePath(plan, dtype, s);
    if (path == SoftmaxPath::kClusterRows) {
      launch_cluster = std::max(launch_cluster, 1 << ClusterShapeOf(CeilDiv(s.n, V)).log2);
    }
    if (path == SoftmaxPath::kBlockRows || path == SoftmaxPath::kClusterRows ||
        (path == SoftmaxPath::kWarpRows && CeilDiv(s.n, V) > 32 * kWarpKernelSlots)) {
      warp_kernel = false;
    }
  }
  const int grid = warp_kernel ? GridOf(plan, "on_chip_warp", dtype)
                               : GridOf(plan, "on_chip", dtype, launch_cluster);
  const int lane_slots = warp_kernel ? kWarpKernelSlots : kWarpSlots;
  // Pass 2: the table. Units are numbered in one rotation across segments.
  std::vector<RowSegment> rows;
  long long unit_counter = 0;
  for (int i = 0; i < count; ++i) {
    const SoftmaxSegment& s = segments[i];
    if (Empty(s)) continue;
    const SoftmaxPath path = ChoosePath(plan, dtype, s);
    if (path != SoftmaxPath::kWarpRows && path != SoftmaxPath::kBlockRows &&
        path != SoftmaxPath::kClusterRows) {
      continue;
    }
    const long long vectors = CeilDiv(s.n, V);
    const bool vec = Aligned16(s.input) && Aligned16(s.output) && (s.n * item) % 16 == 0;
    int config = static_cast<int>(path) | (s.log ? kLogBit : 0) | (vec ? kVecBit : 0);
    long long rows_per_unit = 1;
    long long workers = 1;
    if (path == SoftmaxPath::kWarpRows) {
      const int lanes_log2 = std::min(5, CeilLog2(vectors));
      const int columns_log2 = CeilLog2(CeilDiv(vectors, 1LL << lanes_log2));
      rows_per_unit = (32LL >> lanes_log2) * WarpRowsPerLane(columns_log2, lane_slots);
      config |= (lanes_log2 << kShapeShift) | (columns_log2 << kColumnsShift);
      workers = static_cast<long long>(grid) * kWarps;
    } else if (path == SoftmaxPath::kBlockRows) {
      const int warps_log2 = CeilLog2(CeilDiv(vectors, kGroupWarpVectors));
      config |= warps_log2 << kShapeShift;
      workers = static_cast<long long>(grid) * (kWarps >> warps_log2);
    } else {
      const ClusterShape shape = ClusterShapeOf(vectors);
      const int cluster_log2 = shape.log2;
      config |= (cluster_log2 << kShapeShift) | (shape.wide ? kWideBit : 0);
      workers = static_cast<long long>(grid / launch_cluster) * (launch_cluster >> cluster_log2);
    }
    // Pieces of at most kMaxPieceRows rows keep the kernel's indices 32-bit.
    for (long long first = 0; first < s.outer; first += kMaxPieceRows) {
      const long long piece_rows = std::min<long long>(kMaxPieceRows, s.outer - first);
      const size_t offset = static_cast<size_t>(first) * s.n * item;
      RowSegment r = {};
      r.input = static_cast<const char*>(s.input) + offset;
      r.output = static_cast<char*>(s.output) + offset;
      r.rows = static_cast<int>(piece_rows);
      r.n = static_cast<int>(s.n);
      r.scale = Log2Scale(s);
      r.units = static_cast<int>(CeilDiv(piece_rows, rows_per_unit));
      r.config = config;
      r.first_worker = static_cast<int>(unit_counter % workers);
      unit_counter += r.units;
      rows.push_back(r);
    }
  }
  size_t offset = 0;
  char* table_scratch = nullptr;
  if (rows.size() > static_cast<size_t>(kInlineSegments)) {
    table_scratch = scratch;
    offset += Align256(rows.size() * sizeof(RowSegment));
  }
  if (!rows.empty() && allow_flat && SOFTMAX_FLAT_TABLE && FlatTableFits(rows, V)) {
    SOFTMAX_CUDA_RETURN_IF_ERROR(LaunchFlatTable<T>(&rows, table_scratch, stream));
  } else if (!rows.empty()) {
    SOFTMAX_CUDA_RETURN_IF_ERROR(
        LaunchOnChip<T>(plan, dtype, rows, launch_cluster, warp_kernel, table_scratch, stream));
  }
  for (int i = 0; i < count; ++i) {
    const SoftmaxSegment& s = segments[i];
    if (Empty(s)) continue;
    const SoftmaxPath path = ChoosePath(plan, dtype, s);
    const float scale = Log2Scale(s);
    if (path == SoftmaxPath::kSplitRows) {
      const SplitShape shape = SplitShapeOf(plan, dtype, s);
      SplitArgs a = {};
      a.input = s.input;
      a.output = s.output;
      a.rows = s.outer;
      a.n = s.n;
      a.part_vectors = shape.part_vectors;
      a.parts = shape.parts;
      a.scale = scale;
      a.log = s.log;
      a.vec = Aligned16(s.input) && Aligned16(s.output) && (s.n * item) % 16 == 0;
      a.partials = reinterpret_cast<float2*>(scratch + offset);
      offset += Align256(sizeof(float2) * s.outer * shape.parts);
      a.finals = reinterpret_cast<float2*>(scratch + offset);
      offset += Align256(sizeof(float2) * s.outer);
      a.counters = reinterpret_cast<unsigned*>(scratch + offset);
      offset += Align256(sizeof(unsigned) * s.outer);
      if (offset > scratch_bytes) return cudaErrorInvalidValue;
      SOFTMAX_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(a.counters, 0, sizeof(unsigned) * s.outer, stream));
      const long long units = s.outer * shape.parts;
      if (shape.fused) {
        // Cooperative launch: every block resident at once, which the
        // kernel's waits between blocks rely on.
        cudaLaunchConfig_t config = {};
        config.gridDim = dim3(static_cast<unsigned>(
                                  std::min<long long>(units, GridOf(plan, "split_fused", dtype))),
                              1, 1);
        config.blockDim = dim3(kThreads, 1, 1);
        config.stream = stream;
        cudaLaunchAttribute attribute;
        attribute.id = cudaLaunchAttributeCooperative;
        attribute.val.cooperative = 1;
        config.attrs = &attribute;
        config.numAttrs = 1;
        SOFTMAX_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(
            &config, a.vec ? SplitFusedKernel<T, true> : SplitFusedKernel<T, false>, a));
        SOFTMAX_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        continue;
      }
      const int stats_grid = static_cast<int>(std::min<long long>(units, GridOf(plan, "split_stats", dtype)));
      const int norm_grid =
          static_cast<int>(std::min<long long>(units, GridOf(plan, "split_normalize", dtype)));
      (a.vec ? SplitStatsKernel<T, true> : SplitStatsKernel<T, false>)<<<stats_grid, kThreads, 0, stream>>>(a);
      SOFTMAX_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      (a.vec ? SplitNormalizeKernel<T, true> : SplitNormalizeKernel<T, false>)<<<norm_grid, kThreads, 0, stream>>>(a);
      SOFTMAX_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    } else if (path == SoftmaxPath::kStrided) {
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
      a.scale = scale;
      a.log = s.log;
      a.vec = Aligned16(s.input) && Aligned16(s.output) && (s.inner * item) % 16 == 0;
      const size_t columns = 32 * V;
      const size_t os = static_cast<size_t>(s.outer * shape.strips);
      a.partials = reinterpret_cast<float2*>(scratch + offset);
      offset += Align256(sizeof(float2) * columns * os * shape.parts);
      a.finals = reinterpret_cast<float2*>(scratch + offset);
      offset += Align256(sizeof(float2) * columns * os);
      a.counters = reinterpret_cast<unsigned*>(scratch + offset);
      offset += Align256(sizeof(unsigned) * os);
      if (offset > scratch_bytes) return cudaErrorInvalidValue;
      SOFTMAX_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.counters, 0, sizeof(unsigned) * os, stream));
      const long long units = static_cast<long long>(os) * shape.parts;
      const int stats_grid =
          static_cast<int>(std::min<long long>(units, GridOf(plan, "strided_stats", dtype)));
      const int norm_grid =
          static_cast<int>(std::min<long long>(units, GridOf(plan, "strided_normalize", dtype)));
      (a.vec ? StridedStatsKernel<T, true> : StridedStatsKernel<T, false>)<<<stats_grid, kThreads, 0, stream>>>(a);
      SOFTMAX_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      (a.vec ? StridedNormalizeKernel<T, true> : StridedNormalizeKernel<T, false>)<<<norm_grid, kThreads, 0, stream>>>(a);
      SOFTMAX_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    }
  }
  return cudaSuccess;
}

}  // namespace

const char* SoftmaxPathName(SoftmaxPath path) {
  switch (path) {
    case SoftmaxPath::kWarpRows: return "warp_rows";
    case SoftmaxPath::kBlockRows: return "block_rows";
    case SoftmaxPath::kClusterRows: return "cluster_rows";
    case SoftmaxPath::kSplitRows: return "split_rows";
    case SoftmaxPath::kStrided: return "strided";
  }
  return "unknown";
}

cudaError_t LaunchPlan::Create(int device, LaunchPlan* plan) {
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaDeviceProp prop;
  SOFTMAX_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  LaunchPlan p;
  p.device_ = device;
  p.device_name_ = prop.name;
  p.multiprocessors_ = prop.multiProcessorCount;
  p.l2_bytes_ = prop.l2CacheSize;
  p.clusters_supported_ = prop.major >= 9;
  p.max_cluster_size_ = kMaxClusterSize;
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeDType<float>(DType::kFloat32, p.multiprocessors_,
                                                 p.clusters_supported_, &p.probes_,
                                                 &p.max_cluster_size_));
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeDType<__half>(DType::kFloat16, p.multiprocessors_,
                                                  p.clusters_supported_, &p.probes_,
                                                  &p.max_cluster_size_));
  SOFTMAX_CUDA_RETURN_IF_ERROR(ProbeDType<__nv_bfloat16>(DType::kBFloat16, p.multiprocessors_,
                                                         p.clusters_supported_, &p.probes_,
                                                         &p.max_cluster_size_));
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
  std::snprintf(line, sizeof(line), "  %-28s %-20s %7s %5s %6s %7s %10s %8s %9s %6s\n", "kernel",
                "paths", "threads", "regs", "local", "static", "blocks/SM", "cluster",
                "clusters", "grid");
  out << line;
  for (const KernelProbe& p : probes_) {
    std::snprintf(line, sizeof(line), "  %-28s %-20s %7d %5d %6d %7d %10d %8d %9d %6d\n",
                  p.kernel.c_str(), p.paths.c_str(), p.threads_per_block, p.registers_per_thread,
                  p.local_bytes_per_thread, p.static_shared_bytes, p.blocks_per_sm,
                  p.cluster_size, p.max_active_clusters, p.grid);
    out << line;
  }
  return out.str();
}

namespace {
// Longest row (in vectors) the cluster path takes; <= kBlockVectors when the
// cluster path is not used.
long long ClusterMaxVectors(const LaunchPlan& plan) {
  if (plan.max_cluster_size() < 2) return 0;
  long long limit = static_cast<long long>(plan.max_cluster_size() == kMaxUsedClusterSize
                                               ? kWideVectors
                                               : kBlockVectors) *
                    plan.max_cluster_size();
  if (kSplitFromVectors > 0) limit = std::min(limit, kSplitFromVectors - 1);
  return limit > kBlockVectors ? limit : 0;
}
}  // namespace

SoftmaxPath ChoosePath(const LaunchPlan& plan, DType dtype, const SoftmaxSegment& segment) {
  if (segment.inner != 1) return SoftmaxPath::kStrided;
  const int v = 16 / ItemSize(dtype);
  const long long vectors = CeilDiv(segment.n, v);
  if (vectors <= kWarpVectors) return SoftmaxPath::kWarpRows;
  if (vectors <= kBlockVectors) return SoftmaxPath::kBlockRows;
  if (vectors <= ClusterMaxVectors(plan)) return SoftmaxPath::kClusterRows;
  return SoftmaxPath::kSplitRows;
}

std::string LaunchKernels(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                          int count, bool allow_flat) {
  if (FlatSegment(dtype, segments, count, allow_flat) != nullptr) return "flat";
  const int v = 16 / ItemSize(dtype);
  std::vector<std::string> kernels;
  bool on_chip = false;
  bool table_fits = true;
  auto add = [&kernels](const std::string& k) {
    if (std::find(kernels.begin(), kernels.end(), k) == kernels.end()) kernels.push_back(k);
  };
  for (int i = 0; i < count; ++i) {
    const SoftmaxSegment& s = segments[i];
    if (Empty(s)) continue;
    const SoftmaxPath path = ChoosePath(plan, dtype, s);
    if (path == SoftmaxPath::kSplitRows) {
      add(SplitShapeOf(plan, dtype, s).fused ? "split_fused" : "split_two_pass");
    } else if (path == SoftmaxPath::kStrided) {
      add("strided");
    } else {
      on_chip = true;
      table_fits = table_fits && CeilDiv(s.n, v) <= kTableMaxVectors;
    }
  }
  if (on_chip) {
    kernels.insert(kernels.begin(),
                   allow_flat && SOFTMAX_FLAT_TABLE && table_fits ? "flat_table" : "on_chip");
  }
  std::string out;
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
  return static_cast<int64_t>(probe->grid) * kBlockVectors * (16 / ItemSize(dtype));
}

int64_t PathMaxLength(const LaunchPlan& plan, DType dtype, SoftmaxPath path) {
  const int64_t v = 16 / ItemSize(dtype);
  switch (path) {
    case SoftmaxPath::kWarpRows: return kWarpVectors * v;
    case SoftmaxPath::kBlockRows: return kBlockVectors * v;
    case SoftmaxPath::kClusterRows: return ClusterMaxVectors(plan) * v;
    default: return (int64_t{1} << 31) - 1;
  }
}

size_t SoftmaxScratchBytes(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                           int count) {
  size_t on_chip = 0;
  size_t total = 0;
  for (int i = 0; i < count; ++i) {
    if (Empty(segments[i])) continue;
    const SoftmaxPath path = ChoosePath(plan, dtype, segments[i]);
    if (path == SoftmaxPath::kSplitRows || path == SoftmaxPath::kStrided) {
      total += SegmentScratch(plan, dtype, segments[i], path);
    } else {
      on_chip += static_cast<size_t>(CeilDiv(segments[i].outer, kMaxPieceRows));
    }
  }
  if (on_chip > static_cast<size_t>(kInlineSegments)) total += Align256(on_chip * sizeof(RowSegment));
  return total;
}

cudaError_t LaunchSoftmax(const LaunchPlan& plan, DType dtype, const SoftmaxSegment* segments,
                          int count, void* scratch, size_t scratch_bytes, cudaStream_t stream,
                          bool allow_flat) {
  if (count < 0 || (count > 0 && segments == nullptr) || plan.multiprocessors() == 0) {
    return cudaErrorInvalidValue;
  }
  for (int i = 0; i < count; ++i) {
    const SoftmaxSegment& s = segments[i];
    if (s.outer < 0 || s.inner < 0 || s.n < 0 || s.n >= (1LL << 31)) return cudaErrorInvalidValue;
    if (Empty(s)) continue;
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
      return LaunchTyped<float>(plan, dtype, segments, count, bytes, scratch_bytes, stream, allow_flat);
    case DType::kFloat16:
      return LaunchTyped<__half>(plan, dtype, segments, count, bytes, scratch_bytes, stream, allow_flat);
    case DType::kBFloat16:
      return LaunchTyped<__nv_bfloat16>(plan, dtype, segments, count, bytes, scratch_bytes,
                                        stream, allow_flat);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gpu
}  // namespace softmax
