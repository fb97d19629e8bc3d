// Schedules for ragged tables, outside the library: the ragged mix of softmax_bench.py
// (64 tensors, rows 1-63 x n 16-20000, random.Random(0)) as (A) a block per row, rows
// longest first, over its long rows alone or the whole mix in one launch, against
// persistent grids that take the rows longest first and (B) load the next row into a
// second shared-memory buffer while they reduce and write the current one, (S) the same
// with one buffer. The same arithmetic in every variant (16-byte shared-memory granules,
// three passes; not the library's bits), so the ratios isolate the schedule; the library
// on the same tables and a copy of the same bytes are timed beside them (rows validated
// against the library's output first).
//
//   nvcc -std=c++17 -O3 -arch=sm_90a -o ragged_schedules kernels/bench/ragged_schedules.cu -ldl
//   ./ragged_schedules build/lib/libsoftmax_kernels_c.so
#include <cuda_fp16.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_bench.h"

struct CSeg { uint64_t input, output; int64_t outer, n, inner; float temperature; int32_t log; };
typedef int (*LaunchFn)(int, const CSeg*, int, void*, size_t, void*);
typedef size_t (*ScratchFn)(int, const CSeg*, int);

static const int kMix[64][2] = {
    {55, 12639}, {49, 13797}, {3, 8500},   {62, 16769}, {32, 13284}, {59, 9954},  {62, 15633}, {23, 19132},
    {58, 7173},  {33, 4579},  {19, 4595},  {49, 3123},  {40, 8224},  {59, 17467}, {63, 19739}, {58, 4831},
    {20, 3252},  {47, 2432},  {58, 10835}, {31, 18359}, {7, 11609},  {28, 10377}, {40, 6716},  {62, 18121},
    {31, 14522}, {56, 17099}, {17, 2056},  {52, 17995}, {59, 476},   {6, 13084},  {46, 53},    {40, 16189},
    {53, 10932}, {16, 10672}, {46, 2079},  {13, 18612}, {15, 7834},  {52, 4685},  {52, 17808}, {29, 3004},
    {6, 10503},  {57, 16660}, {60, 16048}, {7, 9893},   {36, 9554},  {46, 4105},  {36, 10919}, {53, 17720},
    {14, 19781}, {36, 19271}, {19, 14597}, {6, 19555},  {52, 12628}, {21, 18878}, {16, 9529},  {12, 6221},
    {53, 6134},  {3, 8537},   {31, 2279},  {6, 4283},   {57, 4916},  {60, 1282},  {54, 2645},  {58, 17730}};

struct Row {
  const char* in;
  char* out;
  int n;
};

template <typename T>
__device__ __forceinline__ void Unpack(uint4 v, float* x) {
  if constexpr (sizeof(T) == 4) {
    x[0] = __uint_as_float(v.x); x[1] = __uint_as_float(v.y);
    x[2] = __uint_as_float(v.z); x[3] = __uint_as_float(v.w);
  } else {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      x[2 * i] = f.x; x[2 * i + 1] = f.y;
    }
  }
}
template <typename T>
__device__ __forceinline__ uint4 Pack(const float* x) {
  if constexpr (sizeof(T) == 4) {
    return make_uint4(__float_as_uint(x[0]), __float_as_uint(x[1]), __float_as_uint(x[2]), __float_as_uint(x[3]));
  } else {
    unsigned w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 h = __floats2half2_rn(x[2 * i], x[2 * i + 1]);
      w[i] = *reinterpret_cast<const unsigned*>(&h);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void Commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void WaitGroups() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// The granules (16-byte, aligned) that cover the row, into buf.
template <typename T, int kT>
__device__ __forceinline__ void IssueLoad(const Row& r, uint4* buf) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(r.in);
  const uint4* g0 = reinterpret_cast<const uint4*>(a & ~uintptr_t{15});
  const int lead = static_cast<int>(a & 15);
  const int granules = (lead + r.n * static_cast<int>(sizeof(T)) + 15) / 16;
  for (int g = threadIdx.x; g < granules; g += kT) CpAsync16(buf + g, g0 + g);
}

template <int kT, bool kMax>
__device__ __forceinline__ float BlockReduce(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = kMax ? -INFINITY : 0.0f;
#pragma unroll
  for (int w = 0; w < kT / 32; ++w) t = kMax ? fmaxf(t, red[w]) : t + red[w];
  __syncthreads();
  return t;
}

// Calls f(x) on each element of the row staged in buf that this thread's
// granules (threadIdx.x, + kT, ...) hold, in order; `lead` elements precede
// the row in the first granule.
template <typename T, int kT, typename F>
__device__ __forceinline__ void ForEachStaged(const Row& r, const uint4* buf, int lead,
                                              int granules, F f) {
  constexpr int V = 16 / sizeof(T);
  for (int g = threadIdx.x; g < granules; g += kT) {
    float x[V];
    Unpack<T>(buf[g], x);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int e = g * V + k - lead;
      if (e >= 0 && e < r.n) f(x[k]);
    }
  }
}

// Three passes over the row staged in buf (max, sum of exp2, output), the
// output written as the output's granules (same alignment as the input's).
template <typename T, int kT>
__device__ __forceinline__ void Compute(const Row& r, const uint4* buf, float* red) {
  constexpr int V = 16 / sizeof(T);
  constexpr float kLog2e = 1.4426950408889634f;
  const uintptr_t a = reinterpret_cast<uintptr_t>(r.in);
  const int lead = static_cast<int>(a & 15) / static_cast<int>(sizeof(T));
  const int granules = (lead + r.n + V - 1) / V;
  float m = -INFINITY;
  ForEachStaged<T, kT>(r, buf, lead, granules, [&](float x) { m = fmaxf(m, x); });
  m = BlockReduce<kT, true>(m, red);
  const float ms = m * kLog2e;
  float d = 0.0f;
  ForEachStaged<T, kT>(r, buf, lead, granules,
                       [&](float x) { d += exp2f(fmaf(x, kLog2e, -ms)); });
  d = BlockReduce<kT, false>(d, red);
  const float inv = 1.0f / d;
  const uintptr_t oa = reinterpret_cast<uintptr_t>(r.out);
  uint4* o0 = reinterpret_cast<uint4*>(oa & ~uintptr_t{15});
  T* out = reinterpret_cast<T*>(r.out);
  for (int g = threadIdx.x; g < granules; g += kT) {
    float x[V];
    Unpack<T>(buf[g], x);
#pragma unroll
    for (int k = 0; k < V; ++k) x[k] = exp2f(fmaf(x[k], kLog2e, -ms)) * inv;
    const int e0 = g * V - lead;
    if (e0 >= 0 && e0 + V <= r.n) {
      o0[g] = Pack<T>(x);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int e = e0 + k;
        if (e >= 0 && e < r.n) out[e] = static_cast<T>(x[k]);
      }
    }
  }
}

// (A) a block per row.
template <typename T, int kT>
__global__ void __launch_bounds__(kT) BlockPerRow(const Row* rows) {
  extern __shared__ uint4 buf[];
  __shared__ float red[kT / 32];
  const Row r = rows[blockIdx.x];
  IssueLoad<T, kT>(r, buf);
  Commit();
  WaitGroups<0>();
  __syncthreads();
  Compute<T, kT>(r, buf, red);
}

// (S, B) persistent: block b takes rows b, b + grid, ... (longest first); with
// kDouble the next row lands in the other buffer while this one is computed.
template <typename T, int kT, bool kDouble>
__global__ void __launch_bounds__(kT) Persistent(const Row* rows, int count, int buf_granules) {
  extern __shared__ uint4 smem[];
  __shared__ float red[kT / 32];
  int cur = blockIdx.x;
  int b = 0;
  if (cur < count) IssueLoad<T, kT>(rows[cur], smem);
  Commit();
  while (cur < count) {
    const int next = cur + gridDim.x;
    if constexpr (kDouble) {
      if (next < count) IssueLoad<T, kT>(rows[next], smem + (b ^ 1) * buf_granules);
      Commit();
      WaitGroups<1>();
    } else {
      WaitGroups<0>();
    }
    __syncthreads();
    Compute<T, kT>(rows[cur], smem + b * buf_granules, red);
    __syncthreads();  // the buffer is the next load's
    if constexpr (!kDouble) {
      if (next < count) IssueLoad<T, kT>(rows[next], smem);
      Commit();
    } else {
      b ^= 1;
    }
    cur = next;
  }
}

static void* g_flush;
template <typename F>
static float Time(F f, int iters = 21) {
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> t;
  for (int i = 0; i < iters + 2; ++i) {
    CK(cudaMemsetAsync(g_flush, i, 256 << 20));
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b);
    if (i >= 2) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Tensor { int rows, n; char *in, *out, *ref; };

template <typename T>
static float ToF(const char* p, size_t i) {
  if constexpr (sizeof(T) == 4) return reinterpret_cast<const float*>(p)[i];
  else return __half2float(reinterpret_cast<const __half*>(p)[i]);
}

template <typename T>
static void Case(int dtype, LaunchFn launch, ScratchFn scratch_bytes) {
  constexpr int V = 16 / sizeof(T);
  const char* dname = sizeof(T) == 4 ? "float32" : "float16";
  std::vector<Tensor> ts;
  double all_bytes = 0, long_bytes = 0;
  srand(11);
  for (const auto& s : kMix) {
    Tensor t{s[0], s[1], nullptr, nullptr, nullptr};
    const size_t bytes = size_t(t.rows) * t.n * sizeof(T);
    CK(cudaMalloc(&t.in, bytes)); CK(cudaMalloc(&t.out, bytes)); CK(cudaMalloc(&t.ref, bytes));
    std::vector<T> h(size_t(t.rows) * t.n);
    for (auto& v : h) v = static_cast<T>(float(rand() % 4000) / 1000.0f - 2.0f);
    CK(cudaMemcpy(t.in, h.data(), bytes, cudaMemcpyHostToDevice));
    all_bytes += bytes;
    if (t.n > 1024 * V) long_bytes += bytes;
    ts.push_back(t);
  }
  // Rows, longest first (stable: tensor order, then row order).
  std::vector<Row> all, lng;
  for (const Tensor& t : ts)
    for (int r = 0; r < t.rows; ++r) all.push_back(Row{t.in + size_t(r) * t.n * sizeof(T), t.out + size_t(r) * t.n * sizeof(T), t.n});
  std::stable_sort(all.begin(), all.end(), [](const Row& x, const Row& y) { return x.n > y.n; });
  for (const Row& r : all) if (r.n > 1024 * V) lng.push_back(r);
  Row *d_all, *d_long;
  CK(cudaMalloc(&d_all, all.size() * sizeof(Row))); CK(cudaMalloc(&d_long, lng.size() * sizeof(Row)));
  CK(cudaMemcpy(d_all, all.data(), all.size() * sizeof(Row), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_long, lng.data(), lng.size() * sizeof(Row), cudaMemcpyHostToDevice));
  const int max_granules = (20000 * int(sizeof(T)) + 15) / 16 + 1;

  void *cx, *cy;
  CK(cudaMalloc(&cx, size_t(all_bytes))); CK(cudaMalloc(&cy, size_t(all_bytes)));
  const float copy_all = Time([&] { CK(cudaMemcpyAsync(cy, cx, size_t(all_bytes), cudaMemcpyDeviceToDevice)); });
  const float copy_long = Time([&] { CK(cudaMemcpyAsync(cy, cx, size_t(long_bytes), cudaMemcpyDeviceToDevice)); });
  printf("== %s mix: %zu rows (%zu long), %.1f MB (long %.1f MB); copy %.1f us (long bytes %.1f us)\n", dname,
         all.size(), lng.size(), all_bytes / 1e6, long_bytes / 1e6, copy_all * 1e3, copy_long * 1e3);

  // The library: the whole mix and its long rows alone (reference outputs in ref).
  std::vector<CSeg> segs_all, segs_long;
  for (const Tensor& t : ts) {
    const CSeg s{(uint64_t)t.in, (uint64_t)t.ref, t.rows, t.n, 1, 1.0f, 0};
    segs_all.push_back(s);
    if (t.n > 1024 * V) segs_long.push_back(s);
  }
  void* scratch = nullptr;
  size_t sb = std::max(scratch_bytes(dtype, segs_all.data(), int(segs_all.size())),
                       scratch_bytes(dtype, segs_long.data(), int(segs_long.size())));
  CK(cudaMalloc(&scratch, sb + 16));
  auto lib = [&](const std::vector<CSeg>& s) {
    const int e = launch(dtype, s.data(), int(s.size()), scratch, sb, nullptr);
    if (e) { printf("library error %d\n", e); exit(1); }
  };
  auto line = [&](const char* name, float ms, double bytes, float copy_ms) {
    printf("  %-40s %7.1f us %7.0f GB/s  %.3f of copy\n", name, ms * 1e3, 2 * bytes / (ms * 1e6), copy_ms / ms);
  };
  lib(segs_all); CK(cudaDeviceSynchronize());
  line("library, whole mix", Time([&] { lib(segs_all); }), all_bytes, copy_all);
  line("library, long rows alone", Time([&] { lib(segs_long); }), long_bytes, copy_long);

  auto check = [&](const char* name, bool long_only) {
    CK(cudaDeviceSynchronize());
    double worst = 0;
    for (const Tensor& t : ts) {
      if (long_only && t.n <= 1024 * V) continue;
      const size_t count = size_t(t.rows) * t.n;
      std::vector<char> a(count * sizeof(T)), b(count * sizeof(T));
      CK(cudaMemcpy(a.data(), t.out, count * sizeof(T), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(b.data(), t.ref, count * sizeof(T), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < count; i += 7) {
        const double x = ToF<T>(a.data(), i), y = ToF<T>(b.data(), i);
        worst = std::max(worst, std::fabs(x - y) / (std::fabs(y) + (sizeof(T) == 4 ? 1e-6 : 1e-4)));
      }
    }
    if (worst > (sizeof(T) == 4 ? 1e-4 : 1e-2)) printf("  INVALID %s: max rel %.3e\n", name, worst);
  };
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

  // (A) a block per row, shared memory for the longest row.
  auto block_per_row = [&](const std::vector<Row>& rows, Row* d, const char* name, double bytes, float copy_ms, bool long_only) {
    constexpr int kT = 256;
    const size_t smem = size_t(max_granules) * 16;
    CK(cudaFuncSetAttribute(BlockPerRow<T, kT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    auto go = [&] { BlockPerRow<T, kT><<<int(rows.size()), kT, smem>>>(d); };
    for (const Tensor& t : ts) CK(cudaMemset(t.out, 0xff, size_t(t.rows) * t.n * sizeof(T)));
    go(); CK(cudaGetLastError());
    check(name, long_only);
    line(name, Time(go), bytes, copy_ms);
  };
  block_per_row(lng, d_long, "A block per row, long rows", long_bytes, copy_long, true);
  block_per_row(all, d_all, "A block per row, whole mix", all_bytes, copy_all, false);

  // (S, B) persistent grids of every resident block.
  auto persistent = [&](auto kernel, int buffers, int threads, const std::vector<Row>& rows, Row* d, const char* name,
                        double bytes, float copy_ms, bool long_only) {
    const size_t smem = size_t(buffers) * max_granules * 16;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    for (int waves : {1, 0}) {  // 0: every resident block; 1: as many blocks as fill one wave with 2 rows each
      int grid = per_sm * sms;
      if (waves == 1) grid = std::min<int>(grid, int((rows.size() + 1) / 2));
      auto go = [&] { kernel<<<grid, threads, smem>>>(d, int(rows.size()), max_granules); };
      for (const Tensor& t : ts) CK(cudaMemset(t.out, 0xff, size_t(t.rows) * t.n * sizeof(T)));
      go(); CK(cudaGetLastError());
      check(name, long_only);
      char label[96];
      snprintf(label, sizeof(label), "%s (%d/SM, grid %d)", name, per_sm, grid);
      line(label, Time(go), bytes, copy_ms);
      if (grid == per_sm * sms) break;
    }
  };
  persistent(Persistent<T, 256, false>, 1, 256, lng, d_long, "S persistent 256, long", long_bytes, copy_long, true);
  persistent(Persistent<T, 256, true>, 2, 256, lng, d_long, "B persistent double 256, long", long_bytes, copy_long, true);
  persistent(Persistent<T, 512, true>, 2, 512, lng, d_long, "B persistent double 512, long", long_bytes, copy_long, true);
  persistent(Persistent<T, 256, true>, 2, 256, all, d_all, "B persistent double 256, whole", all_bytes, copy_all, false);
  persistent(Persistent<T, 512, true>, 2, 512, all, d_all, "B persistent double 512, whole", all_bytes, copy_all, false);
  persistent(Persistent<T, 1024, true>, 2, 1024, all, d_all, "B persistent double 1024, whole", all_bytes, copy_all, false);

  for (Tensor& t : ts) { cudaFree(t.in); cudaFree(t.out); cudaFree(t.ref); }
  cudaFree(d_all); cudaFree(d_long); cudaFree(cx); cudaFree(cy); cudaFree(scratch);
}

int main(int argc, char** argv) {
  if (argc < 2) { printf("usage: ragged_schedules LIB.so\n"); return 1; }
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
  LaunchFn launch = (LaunchFn)dlsym(h, "softmax_launch");
  ScratchFn scratch = (ScratchFn)dlsym(h, "softmax_scratch_bytes");
  if (!launch || !scratch) { printf("dlsym\n"); return 1; }
  CK(cudaMalloc(&g_flush, 256 << 20));
  Case<float>(1, launch, scratch);
  Case<__half>(2, launch, scratch);
  return 0;
}
