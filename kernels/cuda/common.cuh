// Shared device code of the softmax kernels: element types held as raw
// 16-byte vectors, loads and stores, (max, sum) pairs and their reductions.
//
// Conventions shared by every kernel:
// - Rows are held as raw 16-byte vectors (uint4) of the input's own bits,
//   converted to float32 on use; V = 16 / element size elements per vector.
// - Rows are padded with -inf; padding never contributes to a sum and is never
//   stored.
// - exp(x / t) is computed as exp2((x - max) * scale) with scale =
//   log2(e) / t; log-softmax as ((x - max) * scale - log2(sum)) * ln 2.
// - A NaN or +inf in a row, or a row of all -inf, gives a row of NaN.
#ifndef SOFTMAX_KERNELS_CUDA_COMMON_CUH_
#define SOFTMAX_KERNELS_CUDA_COMMON_CUH_

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/plan.h"

// Thread-block clusters, bulk asynchronous copies and mbarrier transaction
// counts exist from sm_90. Device code for older GPUs (sm_80-sm_89, built
// into the image) leaves them out; the launch plan never picks a path that
// needs them there (LaunchPlan::clusters_supported, the staged probe).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define SOFTMAX_SM90_DEVICE_CODE 0
#else
#define SOFTMAX_SM90_DEVICE_CODE 1
#endif

namespace softmax {
namespace gpu {
namespace detail {

namespace cg = cooperative_groups;

constexpr float kLn2 = 0.693147180559945309f;

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
  __device__ static unsigned MaxWord(unsigned a, unsigned b) {
    return __float_as_uint(fmaxf(__uint_as_float(a), __uint_as_float(b)));
  }
  __device__ static unsigned ElementsToWord(const Bits* e) { return e[0]; }
  __device__ static float MaxOfWords(unsigned a, unsigned b, unsigned c, unsigned d) {
    return fmaxf(fmaxf(__uint_as_float(a), __uint_as_float(b)),
                 fmaxf(__uint_as_float(c), __uint_as_float(d)));
  }
  __device__ static Bits Element(unsigned w, int k) { return w; }
};
// What the 16-bit types share (two elements per word), from their own
// WordToFloats and MaxWord.
template <typename Self>
struct PairTraits {
  using Bits = unsigned short;
  static constexpr int kPerWord = 2;
  __device__ static unsigned ElementsToWord(const Bits* e) {
    return static_cast<unsigned>(e[0]) | (static_cast<unsigned>(e[1]) << 16);
  }
  __device__ static Bits Element(unsigned w, int k) {
    return static_cast<Bits>(k == 0 ? (w & 0xffffu) : (w >> 16));
  }
  // Packed max of 8 elements (NaN is dropped, like fmaxf; sums catch NaN).
  __device__ static float MaxOfWords(unsigned a, unsigned b, unsigned c, unsigned d) {
    float f[2];
    Self::WordToFloats(Self::MaxWord(Self::MaxWord(a, b), Self::MaxWord(c, d)), f);
    return fmaxf(f[0], f[1]);
  }
};
template <>
struct Traits<__half> : PairTraits<Traits<__half>> {
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
  // One packed conversion (cvt.rn.f16x2.f32) for both elements.
  __device__ static unsigned FloatsToWord(const float* f) {
    const __half2 h = __floats2half2_rn(f[0], f[1]);
    return *reinterpret_cast<const unsigned*>(&h);
  }
  // Elementwise packed max (NaN is dropped, like fmaxf).
  __device__ static unsigned MaxWord(unsigned a, unsigned b) {
    unsigned r;
    asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
  }
};
template <>
struct Traits<__nv_bfloat16> : PairTraits<Traits<__nv_bfloat16>> {
  static constexpr unsigned kNegInfWord = 0xff80ff80u;
  // volatile: see Traits<__half>::WordToFloats.
  __device__ static void WordToFloats(unsigned w, float* f) {
    unsigned lo, hi;
    asm volatile("shl.b32 %0, %2, 16;\n\tand.b32 %1, %2, 0xffff0000;" : "=r"(lo), "=r"(hi) : "r"(w));
    f[0] = __uint_as_float(lo);
    f[1] = __uint_as_float(hi);
  }
  // One packed conversion (cvt.rn.bf16x2.f32) for both elements.
  __device__ static unsigned FloatsToWord(const float* f) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(f[0], f[1]);
    return *reinterpret_cast<const unsigned*>(&h);
  }
  __device__ static unsigned MaxWord(unsigned a, unsigned b) {
    unsigned r;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
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

// 16-byte global accesses used by every path.
__device__ __forceinline__ uint4 LoadGlobal16(const uint4* p) { return __ldg(p); }
__device__ __forceinline__ void StoreGlobal16(uint4* p, uint4 v) { *p = v; }

// Vector access at any element address (a row whose start or length is not
// a multiple of 16 bytes), the same elements either way. float32: a load or
// store per element. 16-bit types: the one or two aligned 16-byte granules
// that hold the vector, shifted into place, and 1-4 aligned stores (H200,
// unaligned half rows 1.12-1.91x; the same form in float32 0.55-1.06x). A
// granule that holds one of the row's bytes never crosses a page, so its
// other bytes can be read; the second granule is read only when it holds one
// of the row's elements. Loaded elements at or past `limit` are -inf; stores
// write only elements e0 .. min(e0+V, limit)-1.
template <typename T>
__device__ __forceinline__ uint4 LoadElements(const typename Traits<T>::Bits* p, long long e0,
                                              long long limit) {
  constexpr int V = VecWidth<T>();
  constexpr int S = static_cast<int>(sizeof(typename Traits<T>::Bits));
  if constexpr (S == 4) {
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = e0 + i < limit ? __ldg(p + e0 + i) : Traits<T>::kNegInfWord;
    return MakeVector(w[0], w[1], w[2], w[3]);
  }
  if (e0 >= limit) return NegInfVector<T>();
  const uintptr_t address = reinterpret_cast<uintptr_t>(p + e0);
  const int shift = static_cast<int>(address & 15u);  // bytes, a multiple of S
  const uint4* granule = reinterpret_cast<const uint4*>(address - shift);
  const uint4 a = LoadGlobal16(granule);
  uint4 b = a;  // lanes taken from b when it is not read are masked below
  if (shift != 0 && e0 + (16 - shift) / S < limit) b = LoadGlobal16(granule + 1);
  const unsigned c[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  const int q = shift >> 2;
  unsigned w[5];
#pragma unroll
  for (int i = 0; i < 5; ++i) w[i] = q == 0 ? c[i] : q == 1 ? c[i + 1] : q == 2 ? c[i + 2] : c[i + 3];
  if (shift & 2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = __funnelshift_r(w[i], w[i + 1], 16);
  }
  if (e0 + V > limit) {
    // Masked here, not through MaskLanes (below): that form made
    // on_chip<bfloat16> spill 16 bytes on the H200.
    constexpr int P = Traits<T>::kPerWord;
    using Bits = typename Traits<T>::Bits;
    constexpr Bits kNegInf = static_cast<Bits>(Traits<T>::kNegInfWord);
    const long long valid = limit - e0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      Bits e[P];
#pragma unroll
      for (int k = 0; k < P; ++k) e[k] = i * P + k < valid ? Traits<T>::Element(w[i], k) : kNegInf;
      w[i] = Traits<T>::ElementsToWord(e);
    }
  }
  return MakeVector(w[0], w[1], w[2], w[3]);
}

template <typename T>
__device__ __forceinline__ void StoreElements(typename Traits<T>::Bits* p, long long e0,
                                              long long limit, uint4 v) {
  constexpr int V = VecWidth<T>();
  constexpr int P = Traits<T>::kPerWord;
  if (P == 1 || e0 + V > limit) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int k = 0; k < P; ++k) {
        const long long idx = e0 + i * P + k;
        if (idx < limit) p[idx] = Traits<T>::Element(Word(v, i), k);
      }
    }
    return;
  }
  char* const at = reinterpret_cast<char*>(p + e0);
  const int shift = static_cast<int>(reinterpret_cast<uintptr_t>(at) & 15u);
  if (shift == 0) {
    *reinterpret_cast<uint4*>(at) = v;
  } else if (shift == 8) {
    *reinterpret_cast<uint2*>(at) = make_uint2(v.x, v.y);
    *reinterpret_cast<uint2*>(at + 8) = make_uint2(v.z, v.w);
  } else if ((shift & 3) == 0) {  // 4 or 12: a word, two words at an 8-byte boundary, a word
    *reinterpret_cast<unsigned*>(at) = v.x;
    *reinterpret_cast<uint2*>(at + 4) = make_uint2(v.y, v.z);
    *reinterpret_cast<unsigned*>(at + 12) = v.w;
  } else {  // 16-bit elements at 2 bytes past a word: an element, 3 words, an element
    using Bits = typename Traits<T>::Bits;
    const unsigned u0 = __funnelshift_r(v.x, v.y, 16);
    const unsigned u1 = __funnelshift_r(v.y, v.z, 16);
    const unsigned u2 = __funnelshift_r(v.z, v.w, 16);
    *reinterpret_cast<Bits*>(at) = static_cast<Bits>(v.x & 0xffffu);
    if ((shift & 7) == 6) {  // at + 2 is 8-byte aligned
      *reinterpret_cast<uint2*>(at + 2) = make_uint2(u0, u1);
      *reinterpret_cast<unsigned*>(at + 10) = u2;
    } else {  // at + 10 is 8-byte aligned
      *reinterpret_cast<unsigned*>(at + 2) = u0;
      *reinterpret_cast<uint2*>(at + 6) = make_uint2(u1, u2);
    }
    *reinterpret_cast<Bits*>(at + 14) = static_cast<Bits>(v.w >> 16);
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

// Rows whose start is not 16-byte aligned (odd lengths in a ragged table, a
// view at an offset) are read as the aligned 16-byte granules that cover them:
// granule g of a row starting `lead` elements into its first granule holds the
// row's elements g*V - lead .. g*V - lead + V-1. A granule holding at least one
// of the row's bytes never crosses a page, so reading its other lanes (a
// neighbour's elements, or past the buffer) cannot fault; they are masked on
// load and never written. Lanes of `v` outside [lo, hi) become -inf.
template <typename T>
__device__ __forceinline__ uint4 MaskLanes(uint4 v, int lo, int hi) {
  constexpr int P = Traits<T>::kPerWord;
  using Bits = typename Traits<T>::Bits;
  constexpr Bits kNegInf = static_cast<Bits>(Traits<T>::kNegInfWord);
  unsigned w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    Bits e[P];
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int lane = i * P + k;
      e[k] = lane >= lo && lane < hi ? Traits<T>::Element(Word(v, i), k) : kNegInf;
    }
    w[i] = Traits<T>::ElementsToWord(e);
  }
  return MakeVector(w[0], w[1], w[2], w[3]);
}

// Stores the lanes of v as elements e0 .. e0+V-1 of a row of n elements,
// dropping those outside [0, n) (e0 may be negative). Not merged with
// StoreElements: its lower bound there made the on-chip kernel spill (16-28 bytes, half types).
template <typename T>
__device__ __forceinline__ void StoreLanes(typename Traits<T>::Bits* row, long long e0, long long n,
                                           uint4 v) {
  constexpr int P = Traits<T>::kPerWord;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const long long idx = e0 + i * P + k;
      if (idx >= 0 && idx < n) row[idx] = Traits<T>::Element(Word(v, i), k);
    }
  }
}

// Elements between p and the 16-byte boundary below it.
template <typename T>
__device__ __forceinline__ int LeadElements(const void* p) {
  return static_cast<int>((reinterpret_cast<uintptr_t>(p) & 15u) / sizeof(typename Traits<T>::Bits));
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

// The arithmetic of every kernel, with each rounding spelled out (_rn: no
// contraction into FMA, which the compiler would otherwise choose per
// instantiation): two kernels that reduce a row in the same order then give
// the same bits (batch invariance, plan.cc RowKernelOf).
__device__ __forceinline__ float ScaledDiff(float x, float m, float scale) {
  return __fmul_rn(__fsub_rn(x, m), scale);
}
// Softmax output from e = exp2((x - max) * scale); log-softmax from
// t = (x - max) * scale. `factor` is 1/sum, or log2(sum) for log-softmax.
__device__ __forceinline__ float SoftmaxOut(float e, float factor) { return __fmul_rn(e, factor); }
__device__ __forceinline__ float LogSoftmaxOut(float t, float factor) {
  return __fmul_rn(__fsub_rn(t, factor), kLn2);
}

struct MaxSum {
  float m;
  float d;
};

__device__ __forceinline__ float Rescale(float m_part, float m, float scale) {
  return m_part == -INFINITY ? 0.0f : FastExp2(ScaledDiff(m_part, m, scale));
}

__device__ __forceinline__ MaxSum Merge(MaxSum a, MaxSum b, float scale) {
  const float m = fmaxf(a.m, b.m);
  return {m, __fadd_rn(__fmul_rn(a.d, Rescale(a.m, m, scale)),
                      __fmul_rn(b.d, Rescale(b.m, m, scale)))};
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

// The largest element of kN vectors, as float (NaN dropped, like fmaxf).
template <typename T, int kN>
__device__ __forceinline__ float VectorsMax(const uint4 (&raw)[kN]) {
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kN; ++j) m = fmaxf(m, VectorMax<T>(raw[j]));
  return m;
}

// What exp2 subtracts from a row's elements, given its max m: with m == -inf
// every value is -inf (-> 0) or NaN (-> NaN), so the shift is 0.
__device__ __forceinline__ float ExpShift(float m) { return m == -INFINITY ? 0.0f : m; }

// (max, sum) over the kSlots vectors one thread holds.
template <typename T, int kN>
__device__ __forceinline__ MaxSum LocalMaxSum(const uint4 (&raw)[kN], float scale) {
  constexpr int V = VecWidth<T>();
  const float m = VectorsMax<T>(raw);
  const float shift = ExpShift(m);
  float d = 0.0f;
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    float x[V];
    Unpack<T>(raw[j], x);
#pragma unroll
    for (int k = 0; k < V; ++k) d = __fadd_rn(d, FastExp2(ScaledDiff(x[k], shift, scale)));
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
      const float t = ScaledDiff(x[k], m, scale);
      x[k] = log ? LogSoftmaxOut(t, factor) : SoftmaxOut(FastExp2(t), factor);
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
#if SOFTMAX_SM90_DEVICE_CODE  // (a hint: nothing to do without it)
  uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~static_cast<uintptr_t>(15);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes + 15) & ~static_cast<uintptr_t>(15);
  for (; begin < end; begin += 65536) {
    const unsigned size = static_cast<unsigned>(min(static_cast<uintptr_t>(65536), end - begin));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(begin), "r"(size) : "memory");
  }
#endif
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

// Programmatic dependent launch (sm_90; no-ops for a launch made without
// it): DependentsMayStart lets the next launch's blocks start as this one's
// drain; WaitForPrevious waits until the launch before has completed and its
// writes are visible. A table kernel calls the first when it starts and the
// second before it exits, so that its completion implies the previous one's.
__device__ __forceinline__ void DependentsMayStart() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void WaitForPrevious() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The table entry holding unit u (entries are sorted by first unit; the
// flat table, row_staged and staged kernels).
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

}  // namespace detail
}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_CUDA_COMMON_CUH_
