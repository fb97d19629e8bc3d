#include "server/scheduling/memory_budget.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace softmax::server {
namespace {

TEST(MemoryBudgetTest, AdmitsWithinTheLimitAndGivesBackOnRelease) {
  int64_t observed = -1;
  MemoryBudget budget(1000, [&](int64_t held) { observed = held; });
  auto a = budget.TryReserve(600);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(observed, 600);
  EXPECT_EQ(budget.TryReserve(500), nullptr);  // 1100 > 1000
  auto b = budget.TryReserve(400);             // exactly the limit
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(budget.held(), 1000);
  a.reset();
  EXPECT_EQ(budget.held(), 400);
  EXPECT_EQ(observed, 400);
  b.reset();
  EXPECT_EQ(budget.held(), 0);
}

TEST(MemoryBudgetTest, AnEmptyBudgetAdmitsOneRequestLargerThanTheLimit) {
  MemoryBudget budget(100);
  auto big = budget.TryReserve(1000);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(budget.TryReserve(1), nullptr);
  big.reset();
  EXPECT_NE(budget.TryReserve(1), nullptr);
}

TEST(MemoryBudgetTest, NoLimitAdmitsEverything) {
  MemoryBudget budget(0);
  auto a = budget.TryReserve(int64_t{1} << 40);
  auto b = budget.TryReserve(int64_t{1} << 40);
  EXPECT_NE(a, nullptr);
  EXPECT_NE(b, nullptr);
}

TEST(MemoryBudgetTest, ConcurrentReservationsNeverPassTheLimit) {
  MemoryBudget budget(64 * 10);
  std::atomic<int64_t> peak{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        auto lease = budget.TryReserve(64);
        if (lease == nullptr) continue;
        int64_t held = budget.held();
        int64_t seen = peak.load();
        while (held > seen && !peak.compare_exchange_weak(seen, held)) {
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_LE(peak.load(), 64 * 10);
  EXPECT_EQ(budget.held(), 0);
}

}  // namespace
}  // namespace softmax::server
