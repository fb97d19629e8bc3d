#include "server/cuda/caching_allocator.h"

#include <algorithm>
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

size_t CachingAllocator::SizeClass(size_t bytes) {
  if (bytes <= kMiB) {
    // Powers of two: a dozen classes cover every small size, so a mix of
    // batch sizes settles into the cache quickly.
    size_t size = 512;
    while (size < bytes) size <<= 1;
    return size;
  }
  if (bytes <= 64 * kMiB) return RoundUp(bytes, 2 * kMiB);
  return RoundUp(bytes, 32 * kMiB);
}

absl::StatusOr<Block> CachingAllocator::Allocate(size_t bytes) {
  if (bytes == 0) return Block();
  const size_t size = SizeClass(bytes);
  absl::MutexLock lock(&mu_);
  // The smallest cached block of this class or a larger one within the bound.
  for (auto it = free_.lower_bound(size);
       it != free_.end() && it->first <= size * kMaxReuseFactor; ++it) {
    if (it->second.empty()) continue;
    const size_t block_size = it->first;
    void* data = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= block_size;
    stats_.in_use_bytes += block_size;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
    ++stats_.allocations;
    ++stats_.cache_hits;
    return Block(this, data, block_size);
  }
  absl::StatusOr<void*> data = raw_->Allocate(size);
  if (absl::IsResourceExhausted(data.status()) && stats_.cached_bytes > 0) {
    // Out of memory with blocks of other sizes cached: give them back, retry once.
    ReleaseCachedLocked();
    data = raw_->Allocate(size);
  }
  if (!data.ok()) {
    ++stats_.failures;
    return data.status();
  }
  stats_.in_use_bytes += size;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  ++stats_.allocations;
  ++stats_.raw_allocations;
  return Block(this, *data, size);
}

void CachingAllocator::Return(void* data, size_t size) {
  absl::MutexLock lock(&mu_);
  free_[size].push_back(data);
  stats_.in_use_bytes -= size;
  stats_.cached_bytes += size;
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
  for (auto it = free_.upper_bound(above); it != free_.end();) {
    for (void* data : it->second) {
      raw_->Free(data);
      ++stats_.raw_frees;
      stats_.cached_bytes -= it->first;
    }
    it = free_.erase(it);
  }
}

AllocatorStats CachingAllocator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace softmax
