#include "server/cuda/caching_allocator.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace softmax {
namespace {

TEST(CachingAllocatorTest, SizeClassesRoundUp) {
  EXPECT_EQ(CachingAllocator::SizeClass(1), 512u);
  EXPECT_EQ(CachingAllocator::SizeClass(512), 512u);
  EXPECT_EQ(CachingAllocator::SizeClass(513), 1024u);
  EXPECT_EQ(CachingAllocator::SizeClass(3000), 4096u);
  EXPECT_EQ(CachingAllocator::SizeClass(1 << 20), 1u << 20);
  EXPECT_EQ(CachingAllocator::SizeClass((1 << 20) + 1), 2u << 20);
  EXPECT_EQ(CachingAllocator::SizeClass((64u << 20) + 1), 96u << 20);
}

TEST(CachingAllocatorTest, FreedBlockIsReusedAndCounted) {
  CachingAllocator allocator(MakeHostRawAllocator());
  void* first = nullptr;
  {
    absl::StatusOr<Block> block = allocator.Allocate(1000);
    ASSERT_TRUE(block.ok()) << block.status();
    first = block->data();
    std::memset(block->data(), 0xab, 1000);  // the memory is really there
    EXPECT_EQ(allocator.stats().in_use_bytes, 1024);
  }
  AllocatorStats stats = allocator.stats();
  EXPECT_EQ(stats.in_use_bytes, 0);
  EXPECT_EQ(stats.cached_bytes, 1024);
  absl::StatusOr<Block> again = allocator.Allocate(900);  // same class
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), first);
  stats = allocator.stats();
  EXPECT_EQ(stats.allocations, 2);
  EXPECT_EQ(stats.cache_hits, 1);
  EXPECT_EQ(stats.raw_allocations, 1);
  EXPECT_EQ(stats.cached_bytes, 0);
  EXPECT_EQ(stats.peak_in_use_bytes, 1024);
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
  EXPECT_EQ(after.peak_in_use_bytes, warm.peak_in_use_bytes);
  EXPECT_EQ(after.cache_hits, 50 * 16);
}

TEST(CachingAllocatorTest, AMissTakesACachedBlockAtMostTwiceAsLarge) {
  CachingAllocator allocator(MakeHostRawAllocator());
  void* six = nullptr;
  {
    absl::StatusOr<Block> block = allocator.Allocate(6 << 20);
    ASSERT_TRUE(block.ok());
    six = block->data();
  }
  {
    absl::StatusOr<Block> block = allocator.Allocate(3 << 20);  // class 4 MiB: none cached
    ASSERT_TRUE(block.ok());
    EXPECT_EQ(block->data(), six);
    EXPECT_EQ(block->size(), 6u << 20);
    EXPECT_EQ(allocator.stats().in_use_bytes, 6 << 20);
    EXPECT_EQ(allocator.stats().raw_allocations, 1);
  }
  EXPECT_EQ(allocator.stats().cached_bytes, 6 << 20);  // back in its own class
  // More than twice the class: not taken.
  absl::StatusOr<Block> small = allocator.Allocate(2 << 20);
  ASSERT_TRUE(small.ok());
  EXPECT_NE(small->data(), six);
  EXPECT_EQ(small->size(), 2u << 20);
  EXPECT_EQ(allocator.stats().raw_allocations, 2);
  EXPECT_EQ(allocator.stats().cache_hits, 1);
}

// Batches of mixed requests: sizes all over the 2 MiB classes, a few held at
// once. The cache settles: after the first thousand allocations, hardly any
// needs new memory.
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
  // Reusing exact classes only: 64 backing allocations in the first 1,000,
  // 22 more in the next 5,000, 2,862 MiB held; within 2x: 20, 3, 766 MiB.
  const AllocatorStats stats = allocator.stats();
  EXPECT_LE(stats.raw_allocations - raw_after_warmup, 5);
  EXPECT_LE(stats.cached_bytes + stats.in_use_bytes, int64_t{1} << 30);
}

TEST(CachingAllocatorTest, OutOfMemoryReleasesCacheAndRetriesOnce) {
  // 4 MiB of backing memory: a cached 2 MiB block must be released to fit 3 MiB.
  CachingAllocator allocator(MakeHostRawAllocator(4 << 20));
  { ASSERT_TRUE(allocator.Allocate(2 << 20).ok()); }
  EXPECT_EQ(allocator.stats().cached_bytes, 2 << 20);
  absl::StatusOr<Block> big = allocator.Allocate(3 << 20);  // class 4 MiB
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(allocator.stats().raw_frees, 1);
  EXPECT_EQ(allocator.stats().cached_bytes, 0);
  // Nothing left to release: the next one fails cleanly, for this caller only.
  absl::StatusOr<Block> more = allocator.Allocate(1 << 20);
  EXPECT_TRUE(absl::IsResourceExhausted(more.status())) << more.status();
  EXPECT_EQ(allocator.stats().failures, 1);
  EXPECT_EQ(allocator.stats().in_use_bytes, 4 << 20);
}

TEST(CachingAllocatorTest, ZeroBytesGivesEmptyBlock) {
  CachingAllocator allocator(MakeHostRawAllocator());
  absl::StatusOr<Block> block = allocator.Allocate(0);
  ASSERT_TRUE(block.ok());
  EXPECT_FALSE(*block);
  EXPECT_EQ(allocator.stats().allocations, 0);
}

TEST(CachingAllocatorTest, ReleaseCachedReturnsEverything) {
  CachingAllocator allocator(MakeHostRawAllocator());
  { auto a = allocator.Allocate(100); auto b = allocator.Allocate(3 << 20); }
  EXPECT_GT(allocator.stats().cached_bytes, 0);
  allocator.ReleaseCached();
  EXPECT_EQ(allocator.stats().cached_bytes, 0);
  EXPECT_EQ(allocator.stats().raw_frees, 2);
}

TEST(CachingAllocatorTest, ReleaseCachedAboveKeepsSmallBlocks) {
  CachingAllocator allocator(MakeHostRawAllocator());
  { auto small = allocator.Allocate(4096); auto big = allocator.Allocate(8 << 20); }
  EXPECT_EQ(allocator.stats().cached_bytes, 4096 + (8 << 20));
  allocator.ReleaseCachedAbove(1 << 20);
  EXPECT_EQ(allocator.stats().cached_bytes, 4096);
  EXPECT_EQ(allocator.stats().raw_frees, 1);
  absl::StatusOr<Block> again = allocator.Allocate(4000);  // still cached
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(allocator.stats().cache_hits, 1);
}

}  // namespace
}  // namespace softmax
