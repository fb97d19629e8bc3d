// The staged_rows path: a last-axis row of more than 8192 vectors (1025..8192
// in launches of one segment) is split evenly over a thread-block cluster of
// C = 1..16 blocks (one row per cluster, grid = rows x C). Each block stages
// its share of the row in shared memory with per-thread asynchronous copies
// (cp.async, 16 bytes each, one commit group per 16 KiB stage, all in flight
// at once), takes each stage's max and exp2 as soon as it lands, pushes the
// block's (max, sum) into every peer's shared memory (distributed shared
// memory), passes one cluster barrier, and writes its share from shared
// memory. Each element is read once from device memory and written once;
// shares of up to 224 KiB (16 blocks: 3.5 MiB per row) fit.
//
// H200, M x N = 2^28, share target 64 KiB: fp32 N = 8192..65536 at
// 0.94-0.96 of copy, 262144 at 0.84; fp16 16384..65536 at 0.95-0.97, 262144
// at 0.87. Bulk copies (cp.async.bulk, one per stage, issued by one thread,
// completing on an mbarrier) measured 0.74-0.87 at the same points in the
// same run: the per-thread copies are what brought the path to the ceiling.
//
// Needs: sm_90 (clusters), rows 16-byte aligned with n % V == 0 (16-byte
// copies); input != output is not required (a block reads its whole share
// before writing it).
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
  float scale;
  int log;
};

__device__ __forceinline__ unsigned SharedAddress(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Waits until at most `pending` of this thread's cp.async groups are in
// flight (an immediate operand: in unrolled loops the switch folds away).
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
static_assert(kStagedMaxStages <= 14, "CpAsyncWait covers 0..13 pending groups");

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
template <typename T>
__global__ void __launch_bounds__(kStagedThreads, 1) StagedKernel(const __grid_constant__ StagedArgs a) {
#if !SOFTMAX_SM90_DEVICE_CODE
  __trap();  // never planned below sm_90 (its probe finds no cluster)
#else
  constexpr int V = VecWidth<T>();
  constexpr int kStagedWarps = kStagedThreads / 32;
  constexpr int kPerStage = kStagedStageVectors / kStagedThreads;
  using Bits = typename Traits<T>::Bits;
  extern __shared__ uint4 share[];  // chunk_vectors (16-byte aligned)
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

  // Each thread copies the vectors it will read (16 bytes per cp.async), one
  // commit group per stage and always kStagedMaxStages groups, so that stage
  // s waits with an immediate count. No other thread reads them.
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
      CpAsyncWait(kStagedMaxStages - 1 - s);
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
