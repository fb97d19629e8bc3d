// CachingAllocator: keeps freed memory for reuse so that, after warm-up, the
// serving hot path makes no cudaMalloc / cudaHostAlloc calls.
//
// It works as PyTorch's CUDA caching allocator does. Memory comes from the raw
// allocator in segments: 2 MiB for blocks up to 1 MiB (the small pool),
// 20 MiB for blocks up to 10 MiB, the block's own size rounded up to 2 MiB
// beyond. A block is cut from the best-fitting free range of its pool and the
// rest of the range stays free; a freed block merges with its free
// neighbours, so once a burst of any size mix has passed, its segments are
// whole again and serve the next mix. The memory itself comes from a
// RawAllocator: device memory (cudaMalloc), pinned host memory
// (cudaHostAlloc) or, in tests, plain heap memory. When the raw allocator
// reports out of memory, the free segments are released and the allocation
// retried (at the block's own size if a larger segment was asked for);
// failing again gives RESOURCE_EXHAUSTED for that caller only.
//
// Statistics follow PyTorch's caching allocator: bytes in use, cached (free
// but held), peak in use; allocation calls, cache hits, raw allocations.
//
// Thread-safety: all methods are thread-safe.
#ifndef SOFTMAX_SERVER_CUDA_CACHING_ALLOCATOR_H_
#define SOFTMAX_SERVER_CUDA_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace softmax {

// Blocks are multiples of this; smaller remainders are not split off.
inline constexpr size_t kBlockAlignment = 512;
// Blocks up to kSmallBlockBytes come from segments of kSmallSegmentBytes,
// apart from larger blocks, so that small blocks held for long do not keep
// large segments from being released.
inline constexpr size_t kSmallBlockBytes = size_t{1} << 20;
inline constexpr size_t kSmallSegmentBytes = size_t{2} << 20;
// Blocks up to kMediumBlockBytes come from segments of kMediumSegmentBytes:
// batches of mixed requests ask for sizes all over this range, and one
// segment serves several of them (PyTorch's kMinLargeAlloc / kLargeBuffer).
inline constexpr size_t kMediumBlockBytes = size_t{10} << 20;
inline constexpr size_t kMediumSegmentBytes = size_t{20} << 20;
// Larger blocks get a segment of their own, rounded up to this.
inline constexpr size_t kLargeSegmentRounding = size_t{2} << 20;

// Where the bytes come from. Implementations need not be thread-safe: the
// CachingAllocator serialises calls.
class RawAllocator {
 public:
  virtual ~RawAllocator() = default;
  // Returns `bytes` bytes, or RESOURCE_EXHAUSTED when out of memory, or
  // another error (e.g. INTERNAL for a CUDA fault).
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  // REQUIRES: `ptr` came from Allocate and is not in use.
  virtual void Free(void* ptr) = 0;
  virtual std::string Name() const = 0;
};

// Heap memory from operator new; for tests and the CPU path. `limit_bytes`
// (0 = none) makes allocations past that total fail as out of memory.
std::unique_ptr<RawAllocator> MakeHostRawAllocator(size_t limit_bytes = 0);

struct AllocatorStats {
  int64_t in_use_bytes = 0;      // handed out, not yet returned
  int64_t cached_bytes = 0;      // returned, held for reuse
  int64_t peak_in_use_bytes = 0;
  int64_t allocations = 0;       // Allocate() calls that succeeded
  int64_t cache_hits = 0;        // ... served from the cache
  int64_t raw_allocations = 0;   // RawAllocator::Allocate calls that succeeded
  int64_t raw_frees = 0;         // RawAllocator::Free calls (cache releases)
  int64_t failures = 0;          // Allocate() calls answered with an error
};

// A block handed out by CachingAllocator. Movable, not copyable; returns its
// memory to the cache on destruction.
class CachingAllocator;
class Block {
 public:
  Block() = default;
  Block(Block&& other) noexcept { *this = std::move(other); }
  Block& operator=(Block&& other) noexcept;
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  ~Block() { Reset(); }

  void* data() const { return data_; }
  // The size asked for, rounded up to kBlockAlignment (more when the rest
  // of its free range was too small to split off).
  size_t size() const { return size_; }
  explicit operator bool() const { return data_ != nullptr; }
  void Reset();

 private:
  friend class CachingAllocator;
  Block(CachingAllocator* owner, void* data, size_t size) : owner_(owner), data_(data), size_(size) {}
  CachingAllocator* owner_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
};

class CachingAllocator {
 public:
  explicit CachingAllocator(std::unique_ptr<RawAllocator> raw);
  // REQUIRES: every Block has been returned.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns a block of at least `bytes` bytes (bytes == 0 gives an empty
  // block). Errors: RESOURCE_EXHAUSTED when the memory is not there even
  // after releasing the cache; the raw allocator's other errors unchanged.
  absl::StatusOr<Block> Allocate(size_t bytes);

  // As Allocate, but a block that no free range fits gets a new segment only
  // while all segments together stay within `limit_bytes`; past it the call
  // fails RESOURCE_EXHAUSTED at once, releasing nothing. For memory a caller
  // can do without (it then copies), so that bursts of it leave a bounded cache.
  absl::StatusOr<Block> AllocateWithin(size_t bytes, size_t limit_bytes);

  // Gives every free segment back to the raw allocator.
  void ReleaseCached();

  // Gives free segments larger than `bytes` back to the raw allocator.
  void ReleaseCachedAbove(size_t bytes);

  AllocatorStats stats() const;
  std::string name() const { return raw_->Name(); }

  // The segment a block of `bytes` (rounded) is cut from when no free range fits.
  static size_t SegmentSize(size_t bytes);

 private:
  friend class Block;
  // A block or a free range, within one segment.
  struct Range {
    size_t size = 0;
    char* segment = nullptr;  // where its segment starts
    bool free = false;
  };
  using FreeSet = std::set<std::pair<size_t, char*>>;  // free ranges by (size, address)

  void Return(void* data, size_t size);
  void ReleaseCachedLocked(size_t above = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Segment {
    size_t size = 0;
    bool small = false;  // in the small pool
  };
  // Adds a free segment for a block of `size` bytes to its pool.
  absl::StatusOr<char*> NewSegment(size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  FreeSet& Pool(bool small) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return small ? free_small_ : free_large_;
  }

  mutable absl::Mutex mu_;
  std::unique_ptr<RawAllocator> raw_ ABSL_GUARDED_BY(mu_);
  std::map<char*, Segment> segments_ ABSL_GUARDED_BY(mu_);  // by where they start
  std::map<char*, Range> ranges_ ABSL_GUARDED_BY(mu_);     // every block and free range
  FreeSet free_small_ ABSL_GUARDED_BY(mu_);  // ranges of small-pool segments
  FreeSet free_large_ ABSL_GUARDED_BY(mu_);
  AllocatorStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace softmax

#endif  // SOFTMAX_SERVER_CUDA_CACHING_ALLOCATOR_H_
