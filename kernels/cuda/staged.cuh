// Rows staged in shared memory, each element read once and written once.
//
// staged (staged_rows path): a 16-byte aligned last-axis row of more than
// 1024 vectors (in the 16-bit types rows of 60-64 KiB and from 4097 vectors:
// row_staged takes the others) and up to 512 KiB (float32 also 768 KiB..1 MiB, kStagedLongMinRowBytes)
// is split evenly over a thread-block cluster
// of C = 1..16 blocks (one row per cluster, grid = rows x C; the segments of
// one cluster size share a launch, a table like the flat table kernel's). Each block stages its share of the row in
// shared memory with per-thread asynchronous copies (cp.async, 16 bytes each,
// one commit group per 16 KiB stage, all in flight at once), takes each
// stage's max and exp2 as soon as it lands, pushes the block's (max, sum)
// into every peer's shared memory (distributed shared memory), waits for
// its peers' pairs on its mbarrier, and writes its share from shared memory. Without
// split_staged the path takes rows up to 16 shares of 224 KiB (3.5 MiB).
//
// split_staged (split_rows path): longer aligned rows, in parts of up to
// 64 KiB staged the same way by the blocks of a cooperative grid, (max, sum)
// exchanged through global scratch; rows up to what the grid holds at once
// (H200: 396 parts, 24.75 MiB).
//
// H200, M x N = 2^28, share target 64 KiB: fp32 N = 8192..65536 at
// 0.94-0.96 of copy; fp16 16384..65536 at 0.94-0.97, 262144 at 0.87.
// split_staged: fp32 262144 at 0.87 (0.84 on 16-block clusters), N = 2^20
// at 0.79-0.80 (0.63-0.66 before it). Bulk copies (cp.async.bulk, one per
// stage, issued by one thread, completing on an mbarrier) measured 0.74-0.87
// at the staged points in one run: the per-thread copies are what brought
// the path to the ceiling.
//
// Needs: sm_90 (clusters; the probe of both kernels needs them), rows
// 16-byte aligned with n % V == 0 (16-byte copies); input != output is not
// required (a block reads its whole share before writing it).
#ifndef SOFTMAX_KERNELS_CUDA_STAGED_CUH_
#define SOFTMAX_KERNELS_CUDA_STAGED_CUH_

#include <type_traits>
#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/split.cuh"

namespace softmax {
namespace gpu {
namespace detail {

// The staged kernel's table (TableArgs): one RowSegment per segment (or
// piece of one), `first_worker` its first row in the launch (a row per
// cluster), `units` its rows, kStagedChunkSlot of `unused` its vectors per
// block (the last block of a row may hold fewer), config kLogBit. Every
// segment of a launch has the same cluster size. (kStagedChunkSlot: plan.h.)

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

// Shares (dynamic shared memory, after the static slots) start on a
// 128-byte boundary: at a 16-byte offset (the mbarrier below in front of
// them) the staged kernel ran 0.88-0.97x on the H200, at every staged point.
constexpr int kShareAlign = 128;

// The clusters' (max, sum) exchange (staged, strided_staged) without a
// second cluster barrier: each block pushes its pairs into every peer's
// shared memory with st.async, which counts their bytes on the peer's
// mbarrier, and waits on its own mbarrier until every peer's bytes have
// landed. cluster.sync() there compiled to MEMBAR.ALL.GPU, a second barrier
// round and an L1 invalidation. H200, with the shares 128-byte aligned
// (kShareAlign), against cluster.sync(): staged fp16 1024 x 262144
// 1.06-1.08x, 4096 x 65536 1.04x, fp32 4096 x 65536 1.03x; strided_staged
// dim 0 of [4096, 65536] half 1.15x, fp32 1.03x.
// Protocol: thread 0 initializes the block's barrier and expects the bytes
// (ExchangeInit) before the block's relaxed cluster arrive; a block pushes
// only after ClusterWait (every peer's barrier initialized); each block
// reads its slots after ExchangeWait, and no push reaches it afterwards, so
// it may exit as soon as it is done. Each barrier completes once per launch
// (phase 0), which is all ExchangeWait waits for.
__device__ __forceinline__ void ExchangeInit(uint64_t* bar, unsigned bytes) {
  asm volatile(
      "mbarrier.init.shared::cta.b64 [%0], 1;\n\t"
      "fence.mbarrier_init.release.cluster;\n\t"
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SharedAddress(bar)),
      "r"(bytes)
      : "memory");
}
// The address of `p` (shared memory of this block) in block `rank` of the cluster.
__device__ __forceinline__ unsigned PeerShared(const void* p, int rank) {
  unsigned out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(SharedAddress(p)), "r"(rank));
  return out;
}
__device__ __forceinline__ void PushPair(const float2* slot, const uint64_t* bar, int rank, float2 v) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(
                   PeerShared(slot, rank)),
               "f"(v.x), "f"(v.y), "r"(PeerShared(bar, rank))
               : "memory");
}
__device__ __forceinline__ void ExchangeWait(const uint64_t* bar) {
  asm volatile(
      "{\n\t.reg .pred done;\n"
      "WAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n\t"
      "@!done bra WAIT;\n\t}" ::"r"(SharedAddress(bar))
      : "memory");
}

// Each stage is kStagedStageVectors vectors: a thread holds kPerStage of
// them, takes their max (packed, before any conversion), then exp2 of each
// against that max once, sums, and (softmax) writes e back over x in the
// share, rounded to T. The write pass scales e by one factor per stage,
// exp2((m_stage - m_row) * scale) / sum: one exp2 per element, taken while
// later stages are still landing. Log-softmax keeps x and writes
// (x - m_row) * scale - log2(sum). Rounding e to a 16-bit T adds at most
// half an ulp before the output's own rounding.
//
// The three steps of one block's share of a row (`count` vectors, at most
// kMaxStages stages): IssueCopies stages them from `in` into `share`,
// ReduceStages takes their (max, sum) (e written back for softmax; the
// block's total in every thread), WriteStages writes the output from the
// share once the row's total is known. Each thread copies, reads and writes
// only its own vectors of the share.
template <int kMaxStages>
__device__ __forceinline__ void IssueCopies(uint4* share, const uint4* in, int count) {
  constexpr int kPerStage = kStagedStageVectors / kStagedThreads;
  const int stages = (count + kStagedStageVectors - 1) / kStagedStageVectors;  // <= kMaxStages
  // Each thread copies the vectors it will read (16 bytes per cp.async), one
  // commit group per stage and always kMaxStages groups, so that stage s
  // waits with an immediate count. No other thread reads them.
#pragma unroll
  for (int s = 0; s < kMaxStages; ++s) {
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
}

// Needs this share's kMaxStages groups to be the last ones committed.
template <typename T, int kMaxStages>
__device__ __forceinline__ MaxSum ReduceStages(uint4* share, float2* warp_slots, int count,
                                               float scale, bool log, float (&stage_max)[kMaxStages]) {
  constexpr int V = VecWidth<T>();
  constexpr int kStagedWarps = kStagedThreads / 32;
  constexpr int kPerStage = kStagedStageVectors / kStagedThreads;
  const int stages = (count + kStagedStageVectors - 1) / kStagedStageVectors;
  MaxSum acc{-INFINITY, 0.0f};
#pragma unroll
  for (int s = 0; s < kMaxStages; ++s) {
    stage_max[s] = -INFINITY;
    if (s < stages) {
      const int begin = s * kStagedStageVectors;
      const int end = min(count, begin + kStagedStageVectors);
      CpAsyncWait(kMaxStages - 1 - s);
      uint4 raw[kPerStage];
#pragma unroll
      for (int j = 0; j < kPerStage; ++j) {
        const int i = begin + j * kStagedThreads + threadIdx.x;
        raw[j] = i < end ? share[i] : NegInfVector<T>();
      }
      const float m = VectorsMax<T>(raw);
      const float shift = ExpShift(m);
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
  return total;
}

// Writes this thread's vectors [begin, end) of one stage from `share`: the
// log-softmax from the row's max, or the staged exp2 values times
// stage_factor.
template <typename T>
__device__ __forceinline__ void WriteStage(const uint4* share, uint4* out, int begin, int end,
                                           float scale, bool log, float row_max, float factor,
                                           float stage_factor) {
  constexpr int V = VecWidth<T>();
  constexpr int kPerStage = kStagedStageVectors / kStagedThreads;
#pragma unroll
  for (int j = 0; j < kPerStage; ++j) {
    const int i = begin + j * kStagedThreads + threadIdx.x;
    if (i < end) {
      const uint4 v = share[i];
      if (log) {
        StoreGlobal16(out + i, NormalizeVector<T>(v, row_max, scale, true, factor));
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

template <typename T, int kMaxStages>
__device__ __forceinline__ void WriteStages(const uint4* share, uint4* out, int count, float scale,
                                            bool log, const float (&stage_max)[kMaxStages],
                                            MaxSum total) {
  const int stages = (count + kStagedStageVectors - 1) / kStagedStageVectors;
  const float factor = OutputFactor(log, total.d);
#pragma unroll
  for (int s = 0; s < kMaxStages; ++s) {
    if (s < stages) {
      const int begin = s * kStagedStageVectors;
      const int end = min(count, begin + kStagedStageVectors);
      // A stage whose max is -inf holds only zeros (e = 0): factor 0, unless
      // the row's sum is 0 or NaN, which makes the whole row NaN.
      const float stage_factor = Rescale(stage_max[s], total.m, scale) * factor;
      WriteStage<T>(share, out, begin, end, scale, log, total.m, factor, stage_factor);
    }
  }
}

// WriteStages, and after each stage the next share's copies of that stage
// (`next_count` vectors from `next_in`, one commit group per stage as
// IssueCopies makes them) into the slots this thread has just read: the next
// share loads while this one is written. Each thread reuses only its own
// slots, so no barrier is needed. (Only WriteStage, inlined, is shared: the
// staged kernel's 14-stage loops through IssueCopies and WriteStages per
// stage ran fp16 1024 x 262144 at 0.49x on the H200.)
template <typename T, int kMaxStages>
__device__ __forceinline__ void WriteStagesThenCopy(uint4* share, uint4* out, int count,
                                                    float scale, bool log,
                                                    const float (&stage_max)[kMaxStages],
                                                    MaxSum total, const uint4* next_in,
                                                    int next_count) {
  constexpr int kPerStage = kStagedStageVectors / kStagedThreads;
  const int stages = (count + kStagedStageVectors - 1) / kStagedStageVectors;
  const int next_stages = (next_count + kStagedStageVectors - 1) / kStagedStageVectors;
  const float factor = OutputFactor(log, total.d);
#pragma unroll
  for (int s = 0; s < kMaxStages; ++s) {
    const int begin = s * kStagedStageVectors;
    if (s < stages) {
      const int end = min(count, begin + kStagedStageVectors);
      const float stage_factor = Rescale(stage_max[s], total.m, scale) * factor;
      WriteStage<T>(share, out, begin, end, scale, log, total.m, factor, stage_factor);
    }
    if (s < next_stages) {
      const int end = min(next_count, begin + kStagedStageVectors);
#pragma unroll
      for (int j = 0; j < kPerStage; ++j) {
        const int i = begin + j * kStagedThreads + threadIdx.x;
        if (i < end) {
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(SharedAddress(share + i)),
                       "l"(next_in + i)
                       : "memory");
        }
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
}

// Blocks per SM the staged kernel's registers must allow: 4 for the 16-bit
// types (64 registers); float32 is left to the compiler (70 registers, 3
// blocks). H200, 16384 x 16384: fp16 and bf16 1.06x over 80 registers (3
// blocks); fp32 at 64 registers (4 blocks) 0.98x at 32768 x 8192.
template <typename T>
constexpr int kStagedBlocks = sizeof(T) == 2 ? 4 : 1;

// kMaxStages: the most stages a share of the launch holds, the number of
// times the stage loops are unrolled (kStagedShortStages or kStagedMaxStages;
// the plan picks, StagedShortShares).
template <typename T, int kMaxStages>
__global__ void __launch_bounds__(kStagedThreads, kStagedBlocks<T>) StagedKernel(const __grid_constant__ TableArgs args) {
#if !SOFTMAX_SM90_DEVICE_CODE
  __trap();  // never planned below sm_90 (its probe finds no cluster)
#else
  constexpr int V = VecWidth<T>();
  using Bits = typename Traits<T>::Bits;
  extern __shared__ __align__(kShareAlign) uint4 share[];  // chunk_vectors
  __shared__ float2 warp_slots[kStagedThreads / 32];
  __shared__ float2 cluster_slots[kMaxClusterSize];
  __shared__ uint64_t exchange_bar;

  cg::cluster_group cluster = cg::this_cluster();
  const int blocks = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  // Blocks of a 1-D cluster have consecutive x indices: cluster = row.
  const int launch_row = static_cast<int>(blockIdx.x / blocks);
  const RowSegment* table = args.table != nullptr ? args.table : args.inline_segments;
  const RowSegment& seg = table[TableSegmentOf(table, args.count, launch_row)];
  const long long row = launch_row - seg.first_worker;
  const int chunk_vectors = seg.unused[kStagedChunkSlot];
  const float scale = seg.scale;
  const long long vectors = seg.n / V;
  const long long first = static_cast<long long>(rank) * chunk_vectors;
  const long long left = vectors - first;
  const int count = left <= 0 ? 0 : static_cast<int>(left < chunk_vectors ? left : chunk_vectors);
  const size_t pitch = static_cast<size_t>(seg.n) * sizeof(Bits);
  const uint4* in = reinterpret_cast<const uint4*>(static_cast<const char*>(seg.input) + row * pitch) + first;
  uint4* out = reinterpret_cast<uint4*>(static_cast<char*>(seg.output) + row * pitch) + first;
  const bool log = (seg.config & kLogBit) != 0;
  DependentsMayStart();
  if (blocks > 1 && threadIdx.x == 0) ExchangeInit(&exchange_bar, blocks * sizeof(float2));
  IssueCopies<kMaxStages>(share, in, count);
  __syncthreads();
  // A block may write into a peer's shared memory only once every block of
  // the cluster has started: arrive now, wait before the first remote store.
  if (blocks > 1) ClusterArriveRelaxed();
  float stage_max[kMaxStages];
  MaxSum total = ReduceStages<T>(share, warp_slots, count, scale, log, stage_max);
  if (blocks > 1) {
    ClusterWait();
    // Lane k pushes this block's pair into peer k's shared memory; once
    // every peer's pair has landed each thread reads them locally.
    if (threadIdx.x < blocks) {
      PushPair(&cluster_slots[rank], &exchange_bar, static_cast<int>(threadIdx.x),
               make_float2(total.m, total.d));
    }
    ExchangeWait(&exchange_bar);
    total = MaxSum{-INFINITY, 0.0f};
    for (int k = 0; k < blocks; ++k) {
      total = Merge(total, MaxSum{cluster_slots[k].x, cluster_slots[k].y}, scale);
    }
  }
  WriteStages<T>(share, out, count, scale, log, stage_max, total);
  WaitForPrevious();
#endif  // SOFTMAX_SM90_DEVICE_CODE
}

// The strided_staged kernel: a non-last axis ([outer, n, inner], inner > 1)
// in one pass where a tile of columns (L 16-byte vectors: 128 bytes of each
// row, kStridedTileVectors, or 256 for float32 columns of up to 8 shares,
// kStridedWideTileVectors) over all n rows fits a cluster's shared memory.
// Unit = (outer index, tile), one per cluster of 1..16 blocks; block `rank`
// stages rows rank * part_rows .. with per-thread cp.async copies, takes
// each column's (max, sum) over its rows (max first, then exp2 once per
// element, e kept in shared memory for softmax), pushes its column pairs
// into every peer's shared memory, waits for its peers' on its mbarrier, merges the cluster's
// pairs in rank order and writes from shared memory: one read and one write
// per element. Thread t holds column vector t % L of rows t / L + (256 / L) j;
// the order of every reduction follows from n, L and the cluster size alone.
// Dynamic shared memory: the share (part_rows x L vectors), then the warps'
// column pairs (8 x C) and the cluster's (cluster x C), C columns per tile.
template <typename T, int L>
__global__ void __launch_bounds__(kStagedThreads, 1) StridedStagedKernel(const __grid_constant__ StridedArgs a) {
#if !SOFTMAX_SM90_DEVICE_CODE
  __trap();  // never planned below sm_90 (its probe finds no cluster)
#else
  constexpr int V = VecWidth<T>();
  constexpr int C = L * V;                   // columns of a tile
  constexpr int kPass = kStagedThreads / L;  // rows per pass of the block
  static_assert(L >= 8 && L <= 32 && C <= kStagedThreads, "a thread merges each column");
  constexpr int kStagedWarps = kStagedThreads / 32;
  using Bits = typename Traits<T>::Bits;
  extern __shared__ __align__(kShareAlign) uint4 share[];
  cg::cluster_group cluster = cg::this_cluster();
  const int blocks = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  float2* warp_pairs = reinterpret_cast<float2*>(share + a.part_rows * L);  // [warp][C]
  float2* cluster_pairs = warp_pairs + kStagedWarps * C;                     // [rank][C]
  __shared__ float2 totals[C];
  __shared__ uint64_t exchange_bar;
  const long long unit = blockIdx.x / blocks;
  const long long o = unit / a.strips;
  const long long tile = unit % a.strips;
  const int c = threadIdx.x % L;
  const int q = threadIdx.x / L;
  const long long row0 = static_cast<long long>(rank) * a.part_rows;
  const int rows = static_cast<int>(max(0LL, min(a.part_rows, a.n - row0)));
  const size_t pitch = static_cast<size_t>(a.inner) * sizeof(Bits);
  const size_t offset = (static_cast<size_t>(o) * a.n + row0) * pitch +
                        static_cast<size_t>(tile) * (L * 16) + c * 16;
  const char* in = static_cast<const char*>(a.input) + offset;
  char* out = static_cast<char*>(a.output) + offset;
  const bool log = a.log != 0;
  const float scale = a.scale;
  if (blocks > 1 && threadIdx.x == 0) ExchangeInit(&exchange_bar, blocks * C * sizeof(float2));
  for (int r = q; r < rows; r += kPass) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(SharedAddress(share + r * L + c)),
                 "l"(in + r * pitch)
                 : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
  // A block may write into a peer's shared memory only once every block of
  // the cluster has started: arrive now, wait before the first remote store.
  if (blocks > 1) ClusterArriveRelaxed();
  asm volatile("cp.async.wait_all;" ::: "memory");
  float m[V], d[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    m[k] = -INFINITY;
    d[k] = 0.0f;
  }
  {
    // Packed max (exact: the max of the elements, converted once). H200,
    // dim 0 of [4096, 65536] fp16: 1.014x.
    uint4 mw = NegInfVector<T>();
    for (int r = q; r < rows; r += kPass) {
      const uint4 v = share[r * L + c];
      mw = MakeVector(Traits<T>::MaxWord(mw.x, v.x), Traits<T>::MaxWord(mw.y, v.y),
                      Traits<T>::MaxWord(mw.z, v.z), Traits<T>::MaxWord(mw.w, v.w));
    }
    Unpack<T>(mw, m);
  }
  float shift[V];
#pragma unroll
  for (int k = 0; k < V; ++k) shift[k] = ExpShift(m[k]);
  for (int r = q; r < rows; r += kPass) {
    float x[V];
    Unpack<T>(share[r * L + c], x);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      x[k] = FastExp2(ScaledDiff(x[k], shift[k], scale));
      d[k] = __fadd_rn(d[k], x[k]);
    }
    if (!log) share[r * L + c] = Pack<T>(x);
  }
  // The lanes of a warp that hold one column vector (lane % L), then the
  // warps in order, then the cluster's blocks in rank order.
  MaxSum own[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    own[k] = MaxSum{m[k], d[k]};
#pragma unroll
    for (int offset = L; offset < 32; offset <<= 1) {
      const MaxSum other{__shfl_xor_sync(0xffffffffu, own[k].m, offset),
                         __shfl_xor_sync(0xffffffffu, own[k].d, offset)};
      own[k] = Merge(own[k], other, scale);
    }
  }
  const int lane = threadIdx.x & 31;
  if (lane < L) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      warp_pairs[(threadIdx.x >> 5) * C + lane * V + k] = make_float2(own[k].m, own[k].d);
    }
  }
  __syncthreads();
  MaxSum column{-INFINITY, 0.0f};
  if (threadIdx.x < C) {
#pragma unroll
    for (int w = 0; w < kStagedWarps; ++w) {
      const float2 p = warp_pairs[w * C + threadIdx.x];
      column = Merge(column, MaxSum{p.x, p.y}, scale);
    }
  }
  if (blocks > 1) {
    ClusterWait();
    if (threadIdx.x < C) {
      for (int p = 0; p < blocks; ++p) {
        PushPair(&cluster_pairs[rank * C + threadIdx.x], &exchange_bar, p,
                 make_float2(column.m, column.d));
      }
    }
    ExchangeWait(&exchange_bar);
    if (threadIdx.x < C) {
      column = MaxSum{-INFINITY, 0.0f};
      for (int k = 0; k < blocks; ++k) {
        const float2 p = cluster_pairs[k * C + threadIdx.x];
        column = Merge(column, MaxSum{p.x, p.y}, scale);
      }
    }
  }
  if (threadIdx.x < C) totals[threadIdx.x] = make_float2(column.m, column.d);
  __syncthreads();
  float factor[V], total_m[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float2 t = totals[c * V + k];
    total_m[k] = t.x;
    factor[k] = OutputFactor(log, t.y);
    // Softmax scales this thread's e by one factor per column. A column part
    // whose max is -inf holds only zeros: factor 0, unless the column's sum
    // is 0 or NaN, which makes the whole column NaN.
    if (!log) factor[k] = __fmul_rn(Rescale(m[k], t.x, scale), factor[k]);
  }
  for (int r = q; r < rows; r += kPass) {
    float x[V];
    Unpack<T>(share[r * L + c], x);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      x[k] = log ? LogSoftmaxOut(ScaledDiff(x[k], total_m[k], scale), factor[k])
                 : SoftmaxOut(x[k], factor[k]);
    }
    StoreGlobal16(reinterpret_cast<uint4*>(out + r * pitch), Pack<T>(x));
  }
#endif  // SOFTMAX_SM90_DEVICE_CODE
}

// The split_staged kernel: aligned rows too long for the staged path but not
// for the whole grid's shared memory. A row is cut into `parts` parts of
// part_vectors (the last one may hold fewer; at most kSplitStagedStages
// stages); unit u = (row, part) goes to block u % grid, as its (u / grid)-th
// unit. A block stages its unit, reduces it, publishes its (max, sum) in
// global scratch and counts itself in, waits until every part of the row has
// done so, merges the row's partials (read through L2) and writes its unit,
// staging its next unit stage by stage as it goes (WriteStagesThenCopy; the
// next unit is of the next step, whose parts no block of this step writes,
// so in-place launches stay correct). Each element is read once and written
// once.
//
// Why it cannot deadlock: the grid is launched cooperatively (every block
// resident) and is a multiple of parts, so all parts of a row are units of
// the same step; a block publishes before it waits and waits only on blocks
// of its own step.
template <typename T>
__global__ void __launch_bounds__(kStagedThreads, kSplitStagedBlocks) SplitStagedKernel(const __grid_constant__ SplitArgs a) {
#if !SOFTMAX_SM90_DEVICE_CODE
  __trap();  // never planned below sm_90 (probed with the staged kernel)
#else
  constexpr int V = VecWidth<T>();
  using Bits = typename Traits<T>::Bits;
  extern __shared__ __align__(kShareAlign) uint4 share[];  // part_vectors
  __shared__ float2 warp_slots[kStagedThreads / 32];
  __shared__ float2 slots[kWarps];
  static_assert(kStagedThreads == kThreads, "MergePartials strides by kThreads");
  const long long vectors = a.n / V;
  const size_t pitch = static_cast<size_t>(a.n) * sizeof(Bits);
  const long long units = a.rows * a.parts;
  const bool log = a.log != 0;
  // Unit u's share: its first vector in the input, and its vector count.
  const auto share_in = [&](long long u) {
    return reinterpret_cast<const uint4*>(static_cast<const char*>(a.input) + (u / a.parts) * pitch) +
           (u % a.parts) * a.part_vectors;
  };
  const auto share_count = [&](long long u) {
    const long long left = vectors - (u % a.parts) * a.part_vectors;
    return u < units ? static_cast<int>(left < a.part_vectors ? left : a.part_vectors) : 0;
  };
  if (blockIdx.x < units) IssueCopies<kSplitStagedStages>(share, share_in(blockIdx.x), share_count(blockIdx.x));
  for (long long u = blockIdx.x; u < units; u += gridDim.x) {
    const long long row = u / a.parts;
    const long long first = (u % a.parts) * a.part_vectors;
    const int count = share_count(u);
    float stage_max[kSplitStagedStages];
    const MaxSum part_total = ReduceStages<T>(share, warp_slots, count, a.scale, log, stage_max);
    if (threadIdx.x == 0) {
      a.partials[u] = make_float2(part_total.m, part_total.d);
      __threadfence();
      atomicAdd(a.counters + row, 1u);
      const volatile unsigned* published = a.counters + row;
      while (*published < static_cast<unsigned>(a.parts)) __nanosleep(32);
      __threadfence();
    }
    __syncthreads();
    const MaxSum total = MergePartials(a.partials + row * a.parts, a.parts, a.scale, slots);
    // The next unit's share loads while this one is written. H200, 256 x
    // 2^20: fp16 3,300 -> 3,430 GB/s, bf16 3,280 -> 3,427, fp32 3,354 -> 3,401.
    const long long next = u + gridDim.x;
    WriteStagesThenCopy<T>(share, reinterpret_cast<uint4*>(static_cast<char*>(a.output) + row * pitch) + first,
                           count, a.scale, log, stage_max, total, share_in(next < units ? next : u),
                           share_count(next));
  }
#endif  // SOFTMAX_SM90_DEVICE_CODE
}

}  // namespace detail
}  // namespace gpu
}  // namespace softmax

#endif  // SOFTMAX_KERNELS_CUDA_STAGED_CUH_
