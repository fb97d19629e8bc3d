// EXPERIMENT (removed before merge): the staged kernel before one exp2 per
// element, timed beside it (SOFTMAX_STAGED_KERNEL=two_exp).
#ifndef SOFTMAX_KERNELS_CUDA_STAGED_TWO_EXP_CUH_
#define SOFTMAX_KERNELS_CUDA_STAGED_TWO_EXP_CUH_
#include <utility>
#include "kernels/cuda/staged.cuh"
namespace softmax {
namespace gpu {
namespace detail {
template <typename T>
__global__ void __launch_bounds__(kStagedThreads, 1) StagedKernelTwoExp(const __grid_constant__ StagedArgs a) {
#if !SOFTMAX_SM90_DEVICE_CODE
  __trap();  // never planned below sm_90 (its probe finds no cluster)
#else
  constexpr int V = VecWidth<T>();
  constexpr int kStagedWarps = kStagedThreads / 32;
  constexpr int kPerStep = 4;  // vectors per thread between (max, sum) merges
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
  const int stages = (count + a.stage_vectors - 1) / a.stage_vectors;  // <= kStagedMaxStages

  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) BarrierInit(SharedAddress(&barriers[s]), 1);
    // Make the initialised barriers visible to the copy engine.
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int s = 0; s < stages; ++s) {
      const int begin = s * a.stage_vectors;
      const unsigned bytes = static_cast<unsigned>(min(a.stage_vectors, count - begin)) * 16u;
      const unsigned bar = SharedAddress(&barriers[s]);
      BarrierExpectBytes(bar, bytes);
      BulkLoad(SharedAddress(share + begin), in + begin, bytes, bar);
    }
  }
  __syncthreads();
  // A block may write into a peer's shared memory only once every block of
  // the cluster has started: arrive now, wait before the first remote store
  // (by then the stages have landed).
  auto cluster_started = cluster.barrier_arrive();

  // (max, sum) of this block's share, one stage at a time as stages land.
  MaxSum acc{-INFINITY, 0.0f};
  for (int s = 0; s < stages; ++s) {
    const int begin = s * a.stage_vectors;
    const int end = min(count, begin + a.stage_vectors);
    BarrierWait(SharedAddress(&barriers[s]), 0);
    for (int base = begin + threadIdx.x; base < end; base += kPerStep * kStagedThreads) {
      uint4 raw[kPerStep];
#pragma unroll
      for (int j = 0; j < kPerStep; ++j) {
        const int i = base + j * kStagedThreads;
        raw[j] = i < end ? share[i] : NegInfVector<T>();
      }
      acc = Merge(acc, LocalMaxSum<T>(raw, a.scale), a.scale);
    }
  }
  acc = WarpMerge(acc, a.scale);
  if ((threadIdx.x & 31) == 0) warp_slots[threadIdx.x >> 5] = make_float2(acc.m, acc.d);
  __syncthreads();
  cluster.barrier_wait(std::move(cluster_started));
  MaxSum total{-INFINITY, 0.0f};
  if (blocks == 1) {
#pragma unroll
    for (int w = 0; w < kStagedWarps; ++w) {
      total = Merge(total, MaxSum{warp_slots[w].x, warp_slots[w].y}, a.scale);
    }
  } else {
    if (threadIdx.x == 0) {
      MaxSum block{-INFINITY, 0.0f};
#pragma unroll
      for (int w = 0; w < kStagedWarps; ++w) {
        block = Merge(block, MaxSum{warp_slots[w].x, warp_slots[w].y}, a.scale);
      }
      // Push this block's pair into every peer's shared memory; after the
      // barrier each thread reads the pairs locally. No remote access follows
      // the barrier, so a block may exit as soon as it is done.
      const float2 pair = make_float2(block.m, block.d);
      for (int k = 0; k < blocks; ++k) *cluster.map_shared_rank(&cluster_slots[rank], k) = pair;
    }
    cluster.sync();
    for (int k = 0; k < blocks; ++k) {
      total = Merge(total, MaxSum{cluster_slots[k].x, cluster_slots[k].y}, a.scale);
    }
  }
  const bool log = a.log != 0;
  const float factor = OutputFactor(log, total.d);
  for (int i = threadIdx.x; i < count; i += kStagedThreads) {
    StoreGlobal16(out + i, NormalizeVector<T>(share[i], total.m, a.scale, log, factor));
  }
#endif  // SOFTMAX_SM90_DEVICE_CODE
}

}  // namespace detail
}  // namespace gpu
}  // namespace softmax
#endif
