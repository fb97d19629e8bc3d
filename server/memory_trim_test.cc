#include "server/memory_trim.h"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/malloc_tuning.h"
#include "gtest/gtest.h"

#if SOFTMAX_HAVE_TCMALLOC
#include <gperftools/malloc_extension_c.h>
#endif

namespace softmax::server {
namespace {

// These tests measure the allocator's free pages through RSS. AddressSanitizer
// replaces malloc with its own allocator (it holds freed memory back in
// quarantine and ignores mallopt, malloc_trim and tcmalloc), so under it they
// measure nothing. The glibc settings' own test runs only where glibc's malloc
// is the server's (a build without tcmalloc).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMeasurable = false;
#else
constexpr bool kMeasurable = true;
#endif
constexpr bool kGlibcMalloc = kMeasurable && !SOFTMAX_HAVE_TCMALLOC;
constexpr char kNotMeasurable[] = "AddressSanitizer's allocator replaces the server's";
constexpr char kNotGlibcMalloc[] = "the server allocates with tcmalloc, not glibc's malloc";

constexpr int64_t kMiB = int64_t{1} << 20;

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// With the server's malloc settings: 4 threads at once (each in a heap of its
// own) allocate 24 blocks of 1 MiB each and touch them, then free them. With
// `pinned_between`, a small allocation follows each block and stays, so that
// the freed blocks lie between live memory (in the heap's free lists, where
// only a trim returns them); without, they end up at the top of each heap.
std::vector<void*> FreeMemoryInHeaps(bool pinned_between) {
  if (kGlibcMalloc) {
    EXPECT_TRUE(ApplyMallocTuning(MallocTuning()));
  }
  constexpr int kThreads = 4;
  std::vector<std::vector<void*>> pins(kThreads);
  std::vector<std::thread> threads;
  absl::Mutex mu;
  int allocated = 0;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, pinned_between, &pins, &mu, &allocated] {
      std::vector<void*> blocks;
      for (int i = 0; i < 24; ++i) {
        blocks.push_back(malloc(kMiB));
        std::memset(blocks.back(), 1, kMiB);
        if (pinned_between) pins[t].push_back(malloc(64));
      }
      {
        absl::MutexLock lock(&mu);
        ++allocated;
        mu.Await(absl::Condition(
            +[](int* count) { return *count == kThreads; }, &allocated));
      }
      for (void* block : blocks) free(block);
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::vector<void*> all;
  for (const std::vector<void*>& some : pins) all.insert(all.end(), some.begin(), some.end());
  return all;
}

void FreeAll(const std::vector<void*>& pointers) {
  for (void* pointer : pointers) free(pointer);
}

TEST(MemoryTrimmerTest, AllocatorIsTheBuildsChoice) {
  EXPECT_STREQ(MemoryTrimmer::AllocatorName(), SOFTMAX_HAVE_TCMALLOC ? "tcmalloc" : "glibc");
#if SOFTMAX_HAVE_TCMALLOC
  // malloc is tcmalloc's: it reports the bytes this process allocated.
  size_t before = 0, after = 0;
  ASSERT_TRUE(MallocExtension_GetNumericProperty("generic.current_allocated_bytes", &before));
  void* volatile block = malloc(8 * kMiB);  // volatile: the pair is not elided
  ASSERT_TRUE(MallocExtension_GetNumericProperty("generic.current_allocated_bytes", &after));
  free(block);
  EXPECT_GE(after, before + 8 * kMiB);
#endif
}

TEST(MemoryTrimmerTest, TrimNowReturnsFreedPagesBetweenLiveAllocations) {
  if (!kMeasurable) GTEST_SKIP() << kNotMeasurable;
  const int64_t before = ResidentBytes();
  std::vector<void*> pins = FreeMemoryInHeaps(/*pinned_between=*/true);
  ASSERT_GT(ResidentBytes() - before, 64 * kMiB) << "the heaps kept nothing: nothing to test";
  EXPECT_TRUE(MemoryTrimmer::TrimNow());
  EXPECT_LT(ResidentBytes() - before, 16 * kMiB);
  FreeAll(pins);
}

// The other half of the bound: what is freed at the top of a thread's heap
// goes back at once past the trim threshold (with it at 1 GiB, all 96 MiB
// stayed, and no trim returned them). In a process of its own, whose heaps are new.
TEST(MemoryTrimmerDeathTest, ServerMallocTuningReturnsTheTopOfNewThreadHeaps) {
  if (!kGlibcMalloc) GTEST_SKIP() << kNotGlibcMalloc;
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const int64_t before = ResidentBytes();
        FreeMemoryInHeaps(/*pinned_between=*/false);
        std::exit(ResidentBytes() - before < 48 * kMiB ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// In a process of its own, so that the freed pages are new ones that only a
// trim returns.
TEST(MemoryTrimmerDeathTest, TrimsEveryPeriod) {
  if (!kMeasurable) GTEST_SKIP() << kNotMeasurable;
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const int64_t before = ResidentBytes();
        MemoryTrimmer trimmer(absl::Milliseconds(20));
        FreeMemoryInHeaps(/*pinned_between=*/true);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (ResidentBytes() - before >= 16 * kMiB &&
               std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        std::exit(ResidentBytes() - before < 16 * kMiB ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(MemoryTrimmerTest, StopsAtOnceMidPeriod) {
  const auto start = std::chrono::steady_clock::now();
  { MemoryTrimmer trimmer(absl::Hours(1)); }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace softmax::server
