#include "server/cuda/caching_allocator.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace softmax {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(CachingAllocatorTest, SegmentSizes) {
  EXPECT_EQ(CachingAllocator::SegmentSize(1), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSize(kMiB), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSize(kMiB + 1), 20 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSize(10 * kMiB), 20 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSize(10 * kMiB + 1), 12 * kMiB);
  EXPECT_EQ(CachingAllocator::SegmentSize(64 * kMiB + 1), 66 * kMiB);
}

TEST(CachingAllocatorTest, FreedBlockIsReusedAndCounted) {
  CachingAllocator allocator(MakeHostRawAllocator());
  void* first = nullptr;
  {
    absl::StatusOr<Block> block = allocator.Allocate(1000);
    ASSERT_TRUE(block.ok()) << block.status();
    first = block->data();
    std::memset(block->data(), 0xab, 1000);  // the memory is really there
    EXPECT_EQ(block->size(), 1024u);
    EXPECT_EQ(allocator.stats().in_use_bytes, 1024);
    EXPECT_EQ(allocator.stats().cached_bytes, static_cast<int64_t>(2 * kMiB) - 1024);
  }
  AllocatorStats stats = allocator.stats();
  EXPECT_EQ(stats.in_use_bytes, 0);
  EXPECT_EQ(stats.cached_bytes, static_cast<int64_t>(2 * kMiB));
  absl::StatusOr<Block> again = allocator.Allocate(900);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), first);
  stats = allocator.stats();
  EXPECT_EQ(stats.allocations, 2);
  EXPECT_EQ(stats.cache_hits, 1);
  EXPECT_EQ(stats.raw_allocations, 1);
  EXPECT_EQ(stats.peak_in_use_bytes, 1024);
}

TEST(CachingAllocatorTest, SmallBlocksShareASegmentAndDoNotOverlap) {
  CachingAllocator allocator(MakeHostRawAllocator());
  std::vector<Block> held;
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<Block> block = allocator.Allocate(10000);
    ASSERT_TRUE(block.ok());
    std::memset(block->data(), i, block->size());
    held.push_back(std::move(*block));
  }
  EXPECT_EQ(allocator.stats().raw_allocations, 1);  // 100 x 10,240 B in one 2 MiB segment
  for (int i = 0; i < 100; ++i) {
    const auto* bytes = static_cast<const unsigned char*>(held[i].data());
    EXPECT_EQ(bytes[0], i);
    EXPECT_EQ(bytes[held[i].size() - 1], i);
  }
}

// Freed blocks merge with their free neighbours on both sides, so that a
// segment cut for small blocks serves a large one once they are gone.
TEST(CachingAllocatorTest, FreedNeighboursMerge) {
  CachingAllocator allocator(MakeHostRawAllocator());
  absl::StatusOr<Block> a = allocator.Allocate(4 * kMiB);
  absl::StatusOr<Block> b = allocator.Allocate(4 * kMiB);
  absl::StatusOr<Block> c = allocator.Allocate(4 * kMiB);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(allocator.stats().raw_allocations, 1);  // one 20 MiB segment
  void* start = std::min({a->data(), b->data(), c->data()});
  b->Reset();  // the middle one first: merged later from both sides
  a->Reset();
  c->Reset();
  absl::StatusOr<Block> whole = allocator.Allocate(18 * kMiB);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->data(), start);
  EXPECT_EQ(allocator.stats().raw_allocations, 1);
  EXPECT_EQ(allocator.stats().cache_hits, 3);
}

TEST(CachingAllocatorTest, NoGrowthUnderRepeatedMixedSizes) {
  CachingAllocator allocator(MakeHostRawAllocator());
  std::mt19937 rng(7);
  std::uniform_int_distribution<size_t> size(1, 5 << 20);
  std::vector<size_t> sizes(16);
  for (size_t& s : sizes) s = size(rng);
  auto round = [&] {
    std::vector<Block> held;
    for (size_t s : sizes) {
      absl::StatusOr<Block> block = allocator.Allocate(s);
      ASSERT_TRUE(block.ok()) << block.status();
      held.push_back(std::move(*block));
    }
  };
  round();  // warm-up
  const AllocatorStats warm = allocator.stats();
  for (int i = 0; i < 50; ++i) {
    std::shuffle(sizes.begin(), sizes.end(), rng);
    round();
  }
  const AllocatorStats after = allocator.stats();
  EXPECT_EQ(after.raw_allocations, warm.raw_allocations);
  EXPECT_EQ(after.cached_bytes, warm.cached_bytes);
  EXPECT_EQ(after.cache_hits - warm.cache_hits, 50 * 16);
}

// Batches of mixed requests: sizes all over the megabytes, a few held at
// once. After the first thousand allocations, hardly any needs new memory.
TEST(CachingAllocatorTest, MixedSizesSettle) {
  CachingAllocator allocator(MakeHostRawAllocator());
  std::mt19937 rng(11);
  std::uniform_int_distribution<size_t> size(1 << 20, 64 << 20);
  std::uniform_int_distribution<size_t> held_count(1, 8);
  std::vector<Block> held;
  int64_t raw_after_warmup = 0;
  for (int i = 0; i < 6000; ++i) {
    if (i == 1000) raw_after_warmup = allocator.stats().raw_allocations;
    while (held.size() >= held_count(rng)) {
      held.erase(held.begin() + std::uniform_int_distribution<size_t>(0, held.size() - 1)(rng));
    }
    absl::StatusOr<Block> block = allocator.Allocate(size(rng));
    ASSERT_TRUE(block.ok());
    held.push_back(std::move(*block));
  }
  // Size classes reusing exact classes only: 64 backing allocations in the
  // first 1,000, 22 more in the next 5,000, 2,862 MiB held.
  const AllocatorStats stats = allocator.stats();
  EXPECT_LE(stats.raw_allocations - raw_after_warmup, 1000);
  EXPECT_LE(stats.cached_bytes + stats.in_use_bytes, int64_t{1} << 30);
}

// Bursts of slow readers: each holds a new mix of sizes (16 KiB - 8 MiB, up
// to 256 MiB in all) at once, then lets go. Once the first bursts have passed,
// the segments they leave serve every later mix.
TEST(CachingAllocatorTest, BurstsOfNewSizeMixesSettle) {
  CachingAllocator allocator(MakeHostRawAllocator());
  std::mt19937 rng(5);
  std::uniform_int_distribution<size_t> size(16 << 10, 8 << 20);
  std::vector<int64_t> raw_after;
  for (int burst = 0; burst < 30; ++burst) {
    std::vector<Block> held;
    int64_t bytes = 0;
    while (bytes < (256 << 20)) {
      absl::StatusOr<Block> block = allocator.Allocate(size(rng));
      ASSERT_TRUE(block.ok());
      bytes += static_cast<int64_t>(block->size());
      held.push_back(std::move(*block));
    }
    std::shuffle(held.begin(), held.end(), rng);
    held.clear();
    EXPECT_EQ(allocator.stats().in_use_bytes, 0);
    raw_after.push_back(allocator.stats().raw_allocations);
  }
  // Size classes (exact class or up to 2x): 55 backing allocations after the
  // first burst, 61 after the sixth, 69 after the last; segments: 16, 17, 19.
  EXPECT_LE(raw_after.back() - raw_after[5], 3);
  EXPECT_LE(raw_after.back(), 20);
}

TEST(CachingAllocatorTest, AllocateWithinServesFromTheCacheButDoesNotGrowPastTheLimit) {
  CachingAllocator allocator(MakeHostRawAllocator());
  const size_t limit = 40 * kMiB;  // two medium segments
  std::vector<Block> held;
  for (int i = 0; i < 6; ++i) {  // 6 x 6 MiB: three per 20 MiB segment
    absl::StatusOr<Block> block = allocator.AllocateWithin(6 * kMiB, limit);
    ASSERT_TRUE(block.ok()) << i << ": " << block.status();
    held.push_back(std::move(*block));
  }
  EXPECT_EQ(allocator.stats().raw_allocations, 2);
  absl::StatusOr<Block> past = allocator.AllocateWithin(6 * kMiB, limit);
  EXPECT_TRUE(absl::IsResourceExhausted(past.status())) << past.status();
  EXPECT_EQ(allocator.stats().raw_allocations, 2);
  // The free 2 MiB rests of the two segments still serve blocks that fit.
  absl::StatusOr<Block> rest = allocator.AllocateWithin(3 * kMiB / 2, limit);
  EXPECT_TRUE(rest.ok()) << rest.status();
  // Plain Allocate is not bound.
  absl::StatusOr<Block> plain = allocator.Allocate(4 * kMiB);
  EXPECT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(allocator.stats().raw_allocations, 3);
  EXPECT_EQ(allocator.stats().raw_frees, 0);  // a refusal releases nothing
}

TEST(CachingAllocatorTest, OutOfMemoryReleasesCacheAndRetries) {
  // 4 MiB of backing memory: no 20 MiB segment fits, a block's own does.
  CachingAllocator allocator(MakeHostRawAllocator(4 << 20));
  { ASSERT_TRUE(allocator.Allocate(2 << 20).ok()); }
  EXPECT_EQ(allocator.stats().raw_allocations, 1);
  EXPECT_EQ(allocator.stats().cached_bytes, 2 << 20);
  // 3 MiB: the free 2 MiB segment must be released to fit a segment of 4 MiB.
  absl::StatusOr<Block> big = allocator.Allocate(3 << 20);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(allocator.stats().raw_frees, 1);
  EXPECT_EQ(allocator.stats().cached_bytes, 1 << 20);  // the segment's free rest
  // The rest belongs to the large pool and no 2 MiB small segment fits: the
  // next one fails cleanly, for this caller only.
  absl::StatusOr<Block> more = allocator.Allocate(1 << 20);
  EXPECT_TRUE(absl::IsResourceExhausted(more.status())) << more.status();
  EXPECT_EQ(allocator.stats().failures, 1);
  EXPECT_EQ(allocator.stats().in_use_bytes, 3 << 20);
}

TEST(CachingAllocatorTest, ZeroBytesGivesEmptyBlock) {
  CachingAllocator allocator(MakeHostRawAllocator());
  absl::StatusOr<Block> block = allocator.Allocate(0);
  ASSERT_TRUE(block.ok());
  EXPECT_FALSE(*block);
  EXPECT_EQ(allocator.stats().allocations, 0);
}

TEST(CachingAllocatorTest, ReleaseCachedReturnsEveryFreeSegment) {
  CachingAllocator allocator(MakeHostRawAllocator());
  { auto a = allocator.Allocate(100); auto b = allocator.Allocate(3 << 20); }
  EXPECT_EQ(allocator.stats().cached_bytes, (2 << 20) + (20 << 20));
  allocator.ReleaseCached();
  EXPECT_EQ(allocator.stats().cached_bytes, 0);
  EXPECT_EQ(allocator.stats().raw_frees, 2);
}

TEST(CachingAllocatorTest, ASegmentInUseIsNotReleased) {
  CachingAllocator allocator(MakeHostRawAllocator());
  absl::StatusOr<Block> kept = allocator.Allocate(4096);
  { auto freed = allocator.Allocate(4096); }
  allocator.ReleaseCached();
  EXPECT_EQ(allocator.stats().raw_frees, 0);
  std::memset(kept->data(), 1, 4096);
  EXPECT_EQ(allocator.stats().cached_bytes, (2 << 20) - 4096);
}

TEST(CachingAllocatorTest, ReleaseCachedAboveKeepsSmallSegments) {
  CachingAllocator allocator(MakeHostRawAllocator());
  { auto small = allocator.Allocate(4096); auto big = allocator.Allocate(8 << 20); }
  EXPECT_EQ(allocator.stats().cached_bytes, (2 << 20) + (20 << 20));
  allocator.ReleaseCachedAbove(2 << 20);
  EXPECT_EQ(allocator.stats().cached_bytes, 2 << 20);
  EXPECT_EQ(allocator.stats().raw_frees, 1);
  absl::StatusOr<Block> again = allocator.Allocate(4000);  // still cached
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(allocator.stats().cache_hits, 1);
}

}  // namespace
}  // namespace softmax
