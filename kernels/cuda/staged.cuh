// The staged_rows path: a last-axis row of more than 8192 vectors (1025..8192
// in launches of one segment) is split
// evenly over a thread-block cluster of C = 1..16 blocks (one row per
// cluster, grid = rows x C). Each block stages its share of the row in
// shared memory with bulk asynchronous copies (cp.async.bulk, up to
// kStagedMaxStages stages of >= 16 KiB, one mbarrier each, all in flight at
// once), reduces each stage's (max, sum) as soon as it lands, pushes the
// block's pair into every peer's shared memory (distributed shared memory),
// passes one cluster barrier, and writes its share from shared memory. Each
// element is read once from device memory and written once; shares of up to
// 224 KiB (16 blocks: 3.5 MiB per row) fit.
//
// Needs: sm_90, rows 16-byte aligned with n % V == 0 (the bulk copies move
// 16-byte multiples from 16-byte aligned addresses); input != output is not
// required (a block reads its whole share before writing it).
#ifndef SOFTMAX_KERNELS_CUDA_STAGED_CUH_
#define SOFTMAX_KERNELS_CUDA_STAGED_CUH_

#include <utility>

#include "kernels/cuda/common.cuh"

namespace softmax {
namespace gpu {
namespace detail {

struct StagedArgs {
  const void* input;
  void* output;
  long long n;          // elements per row, a multiple of V
  int chunk_vectors;    // vectors per block (the last block of a row may hold fewer)
  int stage_vectors;    // vectors per bulk copy (EXPERIMENT: the two-exp2 kernel only)
  float scale;
  int log;
};

__device__ __forceinline__ unsigned SharedAddress(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void BarrierInit(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Arrives on `bar` and expects `bytes` of asynchronous copies to complete on it.
__device__ __forceinline__ void BarrierExpectBytes(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void BarrierWait(unsigned bar, unsigned phase) {
  asm volatile(
      "{\n\t.reg .pred done;\n"
      "WAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra WAIT_%=;\n}" ::"r"(bar),
      "r"(phase)
      : "memory");
}

// Bulk copy of `bytes` (a multiple of 16) from global `src` to shared `dst`
// (both 16-byte aligned), completing on mbarrier `bar`.
__device__ __forceinline__ void BulkLoad(unsigned dst, const void* src, unsigned bytes,
                                         unsigned bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// Cluster barrier halves: arrive without ordering (it only says "this block
// has started"), wait with acquire (the default).
__device__ __forceinline__ void ClusterArriveRelaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void ClusterWait() {
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

// Each stage is kStagedStageVectors vectors: a thread holds kPerStage of
// them, takes their max (packed, before any conversion), then exp2 of each
// against that max once, sums, and (softmax) writes e back over x in the
// share, rounded to T. The write pass scales e by one factor per stage,
// exp2((m_stage - m_row) * scale) / sum: one exp2 per element, taken while
// later stages are still landing. Log-softmax keeps x and writes
// (x - m_row) * scale - log2(sum). Rounding e to a 16-bit T adds at most
// half an ulp before the output's own rounding.
// EXPERIMENT: waits until at most `pending` of this thread's cp.async groups
// are in flight (an immediate operand: unrolled loops fold the switch).
__device__ __forceinline__ void CpAsyncWait(int pending) {
  switch (pending) {
#define SOFTMAX_CP_ASYNC_WAIT(k) \
  case k: asm volatile("cp.async.wait_group " #k ";" ::: "memory"); break;
    SOFTMAX_CP_ASYNC_WAIT(0) SOFTMAX_CP_ASYNC_WAIT(1) SOFTMAX_CP_ASYNC_WAIT(2)
    SOFTMAX_CP_ASYNC_WAIT(3) SOFTMAX_CP_ASYNC_WAIT(4) SOFTMAX_CP_ASYNC_WAIT(5)
    SOFTMAX_CP_ASYNC_WAIT(6) SOFTMAX_CP_ASYNC_WAIT(7) SOFTMAX_CP_ASYNC_WAIT(8)
    SOFTMAX_CP_ASYNC_WAIT(9) SOFTMAX_CP_ASYNC_WAIT(10) SOFTMAX_CP_ASYNC_WAIT(11)
    SOFTMAX_CP_ASYNC_WAIT(12) SOFTMAX_CP_ASYNC_WAIT(13)
#undef SOFTMAX_CP_ASYNC_WAIT
    default: asm volatile("cp.async.wait_all;" ::: "memory");
  }
}

template <typename T, bool kBulk = true>
__global__ void __launch_bounds__(kStagedThreads, 1) StagedKernel(const __grid_constant__ StagedArgs a) {
#if !SOFTMAX_SM90_DEVICE_CODE
  __trap();  // never planned below sm_90 (its probe finds no cluster)
#else
  constexpr int V = VecWidth<T>();
  constexpr int kStagedWarps = kStagedThreads / 32;
  constexpr int kPerStage = kStagedStageVectors / kStagedThreads;
  using Bits = typename Traits<T>::Bits;
  extern __shared__ uint4 share[];  // chunk_vectors (16-byte aligned)
  __shared__ __align__(8) unsigned long long barriers[kStagedMaxStages];
  __shared__ float2 warp_slots[kStagedWarps];
  __shared__ float2 cluster_slots[kMaxClusterSize];

  cg::cluster_group cluster = cg::this_cluster();
  const int blocks = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  // Blocks of a 1-D cluster have consecutive x indices: cluster = row.
  const long long row = blockIdx.x / blocks;
  const long long vectors = a.n / V;
  const long long first = static_cast<long long>(rank) * a.chunk_vectors;
  const long long left = vectors - first;
  const int count = left <= 0 ? 0 : static_cast<int>(left < a.chunk_vectors ? left : a.chunk_vectors);
  const size_t pitch = static_cast<size_t>(a.n) * sizeof(Bits);
  const uint4* in = reinterpret_cast<const uint4*>(static_cast<const char*>(a.input) + row * pitch) + first;
  uint4* out = reinterpret_cast<uint4*>(static_cast<char*>(a.output) + row * pitch) + first;
  const int stages = (count + kStagedStageVectors - 1) / kStagedStageVectors;  // <= kStagedMaxStages

  if (!kBulk) {
    // EXPERIMENT: each thread copies the vectors it will read (16 bytes per
    // cp.async), one commit group per stage, kStagedMaxStages groups always.
#pragma unroll
    for (int s = 0; s < kStagedMaxStages; ++s) {
      if (s < stages) {
        const int begin = s * kStagedStageVectors;
        const int end = min(count, begin + kStagedStageVectors);
#pragma unroll
        for (int j = 0; j < kPerStage; ++j) {
          const int i = begin + j * kStagedThreads + threadIdx.x;
          if (i < end) {
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(SharedAddress(share + i)),
                         "l"(in + i)
                         : "memory");
          }
        }
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
  } else if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) BarrierInit(SharedAddress(&barriers[s]), 1);
    // Make the initialised barriers visible to the copy engine.
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int s = 0; s < stages; ++s) {
      const int begin = s * kStagedStageVectors;
      const unsigned bytes = static_cast<unsigned>(min(kStagedStageVectors, count - begin)) * 16u;
      const unsigned bar = SharedAddress(&barriers[s]);
      BarrierExpectBytes(bar, bytes);
      BulkLoad(SharedAddress(share + begin), in + begin, bytes, bar);
    }
  }
  __syncthreads();
  // A block may write into a peer's shared memory only once every block of
  // the cluster has started: arrive now, wait before the first remote store.
  if (blocks > 1) ClusterArriveRelaxed();

  const bool log = a.log != 0;
  const float scale = a.scale;
  float stage_max[kStagedMaxStages];
  MaxSum acc{-INFINITY, 0.0f};
#pragma unroll
  for (int s = 0; s < kStagedMaxStages; ++s) {
    stage_max[s] = -INFINITY;
    if (s < stages) {
      const int begin = s * kStagedStageVectors;
      const int end = min(count, begin + kStagedStageVectors);
      if (kBulk) {
        BarrierWait(SharedAddress(&barriers[s]), 0);
      } else {
        CpAsyncWait(kStagedMaxStages - 1 - s);
      }
      uint4 raw[kPerStage];
#pragma unroll
      for (int j = 0; j < kPerStage; ++j) {
        const int i = begin + j * kStagedThreads + threadIdx.x;
        raw[j] = i < end ? share[i] : NegInfVector<T>();
      }
      float m = -INFINITY;
#pragma unroll
      for (int j = 0; j < kPerStage; ++j) m = fmaxf(m, VectorMax<T>(raw[j]));
      // With m == -inf every value is -inf (-> 0) or NaN (-> NaN): shift by 0.
      const float shift = m == -INFINITY ? 0.0f : m;
      float d = 0.0f;
#pragma unroll
      for (int j = 0; j < kPerStage; ++j) {
        float x[V];
        Unpack<T>(raw[j], x);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          x[k] = FastExp2((x[k] - shift) * scale);
          d += x[k];
        }
        const int i = begin + j * kStagedThreads + threadIdx.x;
        if (!log && i < end) share[i] = Pack<T>(x);
      }
      stage_max[s] = m;
      acc = Merge(acc, MaxSum{m, d}, scale);
    }
  }
  acc = WarpMerge(acc, scale);
  if ((threadIdx.x & 31) == 0) warp_slots[threadIdx.x >> 5] = make_float2(acc.m, acc.d);
  __syncthreads();
  MaxSum total{-INFINITY, 0.0f};
#pragma unroll
  for (int w = 0; w < kStagedWarps; ++w) {
    total = Merge(total, MaxSum{warp_slots[w].x, warp_slots[w].y}, scale);
  }
  if (blocks > 1) {
    ClusterWait();
    // Lane k pushes this block's pair into peer k's shared memory; after the
    // barrier each thread reads the pairs locally. No remote access follows
    // the barrier, so a block may exit as soon as it is done.
    if (threadIdx.x < blocks) {
      *cluster.map_shared_rank(&cluster_slots[rank], static_cast<int>(threadIdx.x)) =
          make_float2(total.m, total.d);
    }
    cluster.sync();
    total = MaxSum{-INFINITY, 0.0f};
    for (int k = 0; k < blocks; ++k) {
      total = Merge(total, MaxSum{cluster_slots[k].x, cluster_slots[k].y}, scale);
    }
  }
  const float factor = OutputFactor(log, total.d);
#pragma unroll
  for (int s = 0; s < kStagedMaxStages; ++s) {
    if (s < stages) {
      const int begin = s * kStagedStageVectors;
      const int end = min(count, begin + kStagedStageVectors);
      // A stage whose max is -inf holds only zeros (e = 0): factor 0, unless
      // the row's sum is 0 or NaN, which makes the whole row NaN.
      const float stage_factor = Rescale(stage_max[s], total.m, scale) * factor;
#pragma unroll
      for (int j = 0; j < kPerStage; ++j) {
        const int i = begin + j * kStagedThreads + threadIdx.x;
        if (i < end) {
          const uint4 v = share[i];
          if (log) {
            StoreGlobal16(out + i, NormalizeVector<T>(v, total.m, scale, true, factor));
          } else {
            float e[V];
            Unpack<T>(v, e);
#pragma unroll
            for (int k = 0; k < V; ++k) e[k] *= stage_factor;
            StoreGlobal16(out + i, Pack<T>(e));
          }
        }
      }
    }
  }
#endif  // SOFTMAX_SM90_DEVICE_CODE
}

}  // namespace detail
}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_CUDA_STAGED_CUH_
