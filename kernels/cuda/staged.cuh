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
  int stage_vectors;    // vectors per bulk copy
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

template <typename T>
__global__ void __launch_bounds__(kStagedThreads, 1) StagedKernel(const __grid_constant__ StagedArgs a) {
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

#endif  // SOFTMAX_KERNELS_CUDA_STAGED_CUH_
