// glibc malloc settings for processes that move large messages: the load
// client, and the server where it was built without tcmalloc (the server's
// allocator and why: server/memory_trim.h).
//
// By default glibc serves every allocation above a threshold (128 KiB,
// raised dynamically up to 32 MiB) with its own mmap and returns it with
// munmap on free, and it trims freed memory at the top of a heap back to the
// system above 128 KiB. A server receiving and answering multi-megabyte
// tensors then maps fresh pages for nearly every message, and pays a page
// fault per 4 KiB page to touch them. On the H200 host, 64 x 32000 bfloat16
// requests (4 MiB each) at 16 callers: 905 and 1,005 requests/s in two
// default runs, 1,262 with server and client keeping their memory.
//
// Kept memory must stay bounded, though: glibc gives threads heaps of their
// own (arenas, up to 8 per core), and free memory at the top of a heap goes
// back only past the trim threshold (malloc_trim does not return it). With
// the threshold at 1 GiB, beyond any thread heap's 64 MiB, each heap kept its
// peak for good: a 10-minute CPU soak with bursts of large messages took RSS
// from 372 to 509 MiB, step by step, with 49 MiB in use; with it at 16 MiB
// and 16 heaps on 2 cores, RSS still climbed from 277 to 411 MiB in 8
// minutes, 86 MiB in use, the heaps filling their tops one by one. What stays
// behind is at most heaps x threshold beyond what the last trim period
// touched (server/memory_trim.h), so the two are set together.
//
// The heap count is a trade, measured on the H200 host (16 cores): one heap
// per core queues threads on heap locks at small messages (1 x 1024 float32,
// 256 callers: 83,900 req/s against 95,100 with four per core, medians of 3
// rounds), while four per core met more page faults on large ones (64 x
// 32000 bfloat16, 16 callers: 1,325-1,362 req/s against 1,689 for the server
// before any heap limit; on the 2-core host 299 faults per request against
// 77). One per core keeps the large messages level and the bound at
// cores x 16 MiB.
//
// Thread-safety: call once, at start, before other threads allocate.
#ifndef SOFTMAX_COMMON_MALLOC_TUNING_H_
#define SOFTMAX_COMMON_MALLOC_TUNING_H_

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>

namespace softmax {

// glibc's upper bound for M_MMAP_THRESHOLD on 64-bit systems.
constexpr int64_t kMaxMmapThresholdBytes = int64_t{32} << 20;
// The trim threshold below: a freed block this large at a heap's top goes
// back to the system, so buffers of this size and more are pooled instead
// (server/rpc/tensor_buffer_pool.h).
constexpr int64_t kTrimThresholdBytes = int64_t{16} << 20;

struct MallocTuning {
  // Allocations up to this size come from the heap, where freed memory is
  // reused, instead of a fresh mmap each. 0 keeps glibc's default.
  int64_t mmap_threshold_bytes = kMaxMmapThresholdBytes;
  // Free memory at the top of a heap is returned to the system only beyond
  // this much: four of the 4 MiB messages above, under a thread heap's 64 MiB.
  // 0 keeps glibc's default.
  int64_t trim_threshold_bytes = kTrimThresholdBytes;
  // Heaps (arenas) per online core, at least one in all. 0 keeps glibc's
  // default (8 per core on 64-bit systems).
  int arenas_per_core = 1;
};

// True when every value is within what mallopt accepts.
inline bool ValidMallocTuning(const MallocTuning& tuning) {
  return tuning.mmap_threshold_bytes >= 0 &&
         tuning.mmap_threshold_bytes <= kMaxMmapThresholdBytes &&
         tuning.trim_threshold_bytes >= 0 && tuning.trim_threshold_bytes <= INT_MAX &&
         tuning.arenas_per_core >= 0 && tuning.arenas_per_core <= 64;
}

// Applies `tuning` (after ValidMallocTuning); false if glibc refused a value.
inline bool ApplyMallocTuning(const MallocTuning& tuning) {
  bool ok = true;
  if (tuning.mmap_threshold_bytes > 0) {
    ok &= mallopt(M_MMAP_THRESHOLD, static_cast<int>(tuning.mmap_threshold_bytes)) == 1;
  }
  if (tuning.trim_threshold_bytes > 0) {
    ok &= mallopt(M_TRIM_THRESHOLD, static_cast<int>(tuning.trim_threshold_bytes)) == 1;
  }
  if (tuning.arenas_per_core > 0) {
    const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    ok &= mallopt(M_ARENA_MAX, static_cast<int>(cores * tuning.arenas_per_core)) == 1;
  }
  return ok;
}

}  // namespace softmax

#endif  // SOFTMAX_COMMON_MALLOC_TUNING_H_
