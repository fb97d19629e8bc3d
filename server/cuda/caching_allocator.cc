#include "server/cuda/caching_allocator.h"

#include <algorithm>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"

namespace softmax {
namespace {

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * kKiB;

size_t RoundUp(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

class HostRawAllocator final : public RawAllocator {
 public:
  explicit HostRawAllocator(size_t limit_bytes) : limit_bytes_(limit_bytes) {}
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (limit_bytes_ != 0 && total_ + bytes > limit_bytes_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host allocator: ", bytes, " bytes over the limit of ", limit_bytes_));
    }
    void* ptr = ::operator new(bytes, std::align_val_t{256}, std::nothrow);
    if (ptr == nullptr) return absl::ResourceExhaustedError("host allocator: out of memory");
    total_ += bytes;
    sizes_.emplace(ptr, bytes);
    return ptr;
  }
  void Free(void* ptr) override {
    auto it = sizes_.find(ptr);
    total_ -= it->second;
    sizes_.erase(it);
    ::operator delete(ptr, std::align_val_t{256});
  }
  std::string Name() const override { return "host"; }

 private:
  const size_t limit_bytes_;
  size_t total_ = 0;
  std::map<void*, size_t> sizes_;
};

}  // namespace

std::unique_ptr<RawAllocator> MakeHostRawAllocator(size_t limit_bytes) {
  return std::make_unique<HostRawAllocator>(limit_bytes);
}

Block& Block::operator=(Block&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void Block::Reset() {
  if (owner_ != nullptr && data_ != nullptr) owner_->Return(data_, size_);
  owner_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

CachingAllocator::CachingAllocator(std::unique_ptr<RawAllocator> raw) : raw_(std::move(raw)) {}

CachingAllocator::~CachingAllocator() {
  absl::MutexLock lock(&mu_);
  ReleaseCachedLocked();
}

size_t CachingAllocator::SegmentSize(size_t bytes) {
  const size_t size = RoundUp(bytes, kBlockAlignment);
  if (size <= kSmallBlockBytes) return kSmallSegmentBytes;
  if (size <= kMediumBlockBytes) return kMediumSegmentBytes;
  return RoundUp(size, kLargeSegmentRounding);
}

absl::StatusOr<char*> CachingAllocator::NewSegment(size_t size) {
  size_t segment_size = SegmentSize(size);
  absl::StatusOr<void*> data = raw_->Allocate(segment_size);
  if (absl::IsResourceExhausted(data.status()) && stats_.cached_bytes > 0) {
    // Out of memory with free segments held: give them back, retry once.
    ReleaseCachedLocked();
    data = raw_->Allocate(segment_size);
  }
  const size_t own_size = RoundUp(size, kLargeSegmentRounding);
  if (absl::IsResourceExhausted(data.status()) && segment_size > own_size) {
    segment_size = own_size;  // a shared segment does not fit; one of its own may
    data = raw_->Allocate(segment_size);
  }
  if (!data.ok()) return data.status();
  char* start = static_cast<char*>(*data);
  const bool small = size <= kSmallBlockBytes;
  segments_.emplace(start, Segment{segment_size, small});
  ranges_.emplace(start, Range{segment_size, start, /*free=*/true});
  Pool(small).emplace(segment_size, start);
  stats_.cached_bytes += static_cast<int64_t>(segment_size);
  ++stats_.raw_allocations;
  return start;
}

absl::StatusOr<Block> CachingAllocator::Allocate(size_t bytes) {
  return AllocateWithin(bytes, std::numeric_limits<size_t>::max());
}

absl::StatusOr<Block> CachingAllocator::AllocateWithin(size_t bytes, size_t limit_bytes) {
  if (bytes == 0) return Block();
  const size_t size = RoundUp(bytes, kBlockAlignment);
  absl::MutexLock lock(&mu_);
  const bool small = size <= kSmallBlockBytes;
  FreeSet& pool = Pool(small);
  auto best = pool.lower_bound({size, nullptr});
  const bool hit = best != pool.end();
  if (!hit) {
    const size_t held = static_cast<size_t>(stats_.in_use_bytes + stats_.cached_bytes);
    if (held + SegmentSize(size) > limit_bytes) {
      ++stats_.failures;
      return absl::ResourceExhaustedError(absl::StrCat(
          raw_->Name(), " memory: a new segment for ", size, " bytes would pass the limit of ",
          limit_bytes, " bytes held"));
    }
    absl::StatusOr<char*> segment = NewSegment(size);
    if (!segment.ok()) {
      ++stats_.failures;
      return segment.status();
    }
    best = pool.find({segments_.at(*segment).size, *segment});
  }
  char* start = best->second;
  pool.erase(best);
  Range& range = ranges_.at(start);
  // Split off the rest when it can serve another block of this pool.
  const size_t min_rest = small ? kBlockAlignment : kSmallBlockBytes;
  if (range.size - size >= min_rest) {
    char* rest = start + size;
    ranges_.emplace(rest, Range{range.size - size, range.segment, /*free=*/true});
    pool.emplace(range.size - size, rest);
    range.size = size;
  }
  range.free = false;
  stats_.cached_bytes -= static_cast<int64_t>(range.size);
  stats_.in_use_bytes += static_cast<int64_t>(range.size);
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  ++stats_.allocations;
  if (hit) ++stats_.cache_hits;
  return Block(this, start, range.size);
}

void CachingAllocator::Return(void* data, size_t size) {
  absl::MutexLock lock(&mu_);
  auto it = ranges_.find(static_cast<char*>(data));
  it->second.free = true;
  stats_.in_use_bytes -= static_cast<int64_t>(size);
  stats_.cached_bytes += static_cast<int64_t>(size);
  FreeSet& pool = Pool(segments_.at(it->second.segment).small);
  // Merge with the free neighbours of the same segment.
  auto next = std::next(it);
  if (next != ranges_.end() && next->second.free && next->second.segment == it->second.segment) {
    pool.erase({next->second.size, next->first});
    it->second.size += next->second.size;
    ranges_.erase(next);
  }
  if (it != ranges_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.free && prev->second.segment == it->second.segment) {
      pool.erase({prev->second.size, prev->first});
      prev->second.size += it->second.size;
      ranges_.erase(it);
      it = prev;
    }
  }
  pool.emplace(it->second.size, it->first);
}

void CachingAllocator::ReleaseCached() {
  absl::MutexLock lock(&mu_);
  ReleaseCachedLocked();
}

void CachingAllocator::ReleaseCachedAbove(size_t bytes) {
  absl::MutexLock lock(&mu_);
  ReleaseCachedLocked(bytes);
}

void CachingAllocator::ReleaseCachedLocked(size_t above) {
  for (auto it = segments_.begin(); it != segments_.end();) {
    char* start = it->first;
    const auto [size, small] = it->second;
    const Range& range = ranges_.at(start);
    if (size <= above || !range.free || range.size != size) {  // in use, in part or whole
      ++it;
      continue;
    }
    Pool(small).erase({size, start});
    ranges_.erase(start);
    raw_->Free(start);
    ++stats_.raw_frees;
    stats_.cached_bytes -= static_cast<int64_t>(size);
    it = segments_.erase(it);
  }
}

AllocatorStats CachingAllocator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace softmax
