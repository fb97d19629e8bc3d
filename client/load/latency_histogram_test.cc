#include "client/load/latency_histogram.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace softmax::client {
namespace {

constexpr double kQuantiles[] = {0.0, 0.001, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999, 1.0};

// Checks every quantile of `histogram` against the exact nearest-rank value of
// `sorted` within the documented bound.
void ExpectQuantilesWithinBound(const LatencyHistogram& histogram, std::vector<int64_t> values) {
  std::sort(values.begin(), values.end());
  ASSERT_EQ(histogram.count(), values.size());
  for (double q : kQuantiles) {
    const uint64_t rank = LatencyHistogram::NearestRank(q, values.size());
    const int64_t exact = values[rank - 1];
    const int64_t reported = histogram.ValueAtQuantile(q);
    const double allowed = LatencyHistogram::kMaxRelativeError * static_cast<double>(exact);
    EXPECT_LE(std::abs(static_cast<double>(reported - exact)), allowed)
        << "q=" << q << " exact=" << exact << " reported=" << reported;
  }
  EXPECT_EQ(histogram.min(), values.front());
  EXPECT_EQ(histogram.max(), values.back());
  double sum = 0;
  for (int64_t v : values) sum += static_cast<double>(v);
  EXPECT_NEAR(histogram.mean(), sum / values.size(), 1e-9 * sum / values.size());
}

TEST(LatencyHistogramTest, EmptyReportsZero) {
  LatencyHistogram histogram;
  EXPECT_EQ(histogram.count(), 0u);
  EXPECT_EQ(histogram.ValueAtQuantile(0.5), 0);
  EXPECT_EQ(histogram.min(), 0);
  EXPECT_EQ(histogram.max(), 0);
  EXPECT_EQ(histogram.mean(), 0.0);
}

TEST(LatencyHistogramTest, SmallValuesAreExact) {
  LatencyHistogram histogram;
  std::vector<int64_t> values;
  for (int64_t v = 0; v < 256; ++v) {
    for (int64_t k = 0; k <= v % 3; ++k) {
      histogram.Record(v);
      values.push_back(v);
    }
  }
  std::sort(values.begin(), values.end());
  for (double q : kQuantiles) {
    EXPECT_EQ(histogram.ValueAtQuantile(q),
              values[LatencyHistogram::NearestRank(q, values.size()) - 1])
        << "q=" << q;
  }
}

TEST(LatencyHistogramTest, NearestRankIgnoresRoundingNoise) {
  EXPECT_EQ(LatencyHistogram::NearestRank(0.99, 1000), 990u);
  EXPECT_EQ(LatencyHistogram::NearestRank(0.999, 1000), 999u);
  EXPECT_EQ(LatencyHistogram::NearestRank(0.5, 3), 2u);
  EXPECT_EQ(LatencyHistogram::NearestRank(0.0, 7), 1u);
  EXPECT_EQ(LatencyHistogram::NearestRank(1.0, 7), 7u);
  EXPECT_EQ(LatencyHistogram::NearestRank(0.5, 0), 0u);
}

TEST(LatencyHistogramTest, BucketsTileTheRangeWithBoundedWidth) {
  int64_t expected_lowest = 0;
  for (int i = 0; i < LatencyHistogram::kBucketCount; ++i) {
    const int64_t lowest = LatencyHistogram::BucketLowest(i);
    const int64_t highest = LatencyHistogram::BucketHighest(i);
    ASSERT_EQ(lowest, expected_lowest) << "bucket " << i;
    ASSERT_GE(highest, lowest);
    ASSERT_EQ(LatencyHistogram::BucketIndex(lowest), i);
    ASSERT_EQ(LatencyHistogram::BucketIndex(highest), i);
    // Width at most 1/128 of the lower bound outside the exact range.
    if (lowest >= 256) {
      ASSERT_LE(static_cast<double>(highest - lowest + 1), static_cast<double>(lowest) / 128.0);
    }
    if (i + 1 < LatencyHistogram::kBucketCount) expected_lowest = highest + 1;
  }
  EXPECT_EQ(LatencyHistogram::BucketHighest(LatencyHistogram::kBucketCount - 1),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(LatencyHistogram::BucketIndex(-5), 0);
}

TEST(LatencyHistogramTest, LogUniformValuesWithinBound) {
  std::mt19937_64 rng(7);
  // Latencies from 1 us to 10 s in nanoseconds, spread over seven decades.
  std::uniform_real_distribution<double> exponent(3.0, 10.0);
  LatencyHistogram histogram;
  std::vector<int64_t> values;
  for (int i = 0; i < 200000; ++i) {
    const int64_t v = static_cast<int64_t>(std::pow(10.0, exponent(rng)));
    histogram.Record(v);
    values.push_back(v);
  }
  ExpectQuantilesWithinBound(histogram, values);
}

TEST(LatencyHistogramTest, HeavyTailWithinBound) {
  std::mt19937_64 rng(11);
  std::lognormal_distribution<double> body(std::log(200e3), 0.3);  // about 200 us
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  LatencyHistogram histogram;
  std::vector<int64_t> values;
  for (int i = 0; i < 100000; ++i) {
    // One request in a thousand stalls for about 50 ms.
    const double v = coin(rng) < 0.001 ? 50e6 * (1 + coin(rng)) : body(rng);
    values.push_back(static_cast<int64_t>(v));
    histogram.Record(values.back());
  }
  ExpectQuantilesWithinBound(histogram, values);
}

TEST(LatencyHistogramTest, MergeEqualsRecordingEverythingInOne) {
  std::mt19937_64 rng(3);
  std::exponential_distribution<double> gap(1.0 / 300e3);
  LatencyHistogram parts[4];
  LatencyHistogram all;
  std::vector<int64_t> values;
  for (int i = 0; i < 40000; ++i) {
    const int64_t v = static_cast<int64_t>(gap(rng));
    parts[i % 4].Record(v);
    all.Record(v);
    values.push_back(v);
  }
  LatencyHistogram merged;
  for (const auto& part : parts) merged.Merge(part);
  EXPECT_EQ(merged.count(), all.count());
  for (double q : kQuantiles) EXPECT_EQ(merged.ValueAtQuantile(q), all.ValueAtQuantile(q));
  ExpectQuantilesWithinBound(merged, values);
  // The sources are unchanged.
  EXPECT_EQ(parts[0].count(), 10000u);
}

TEST(LatencyHistogramTest, ConcurrentRecordsAreAllCounted) {
  LatencyHistogram histogram;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&histogram, t] {
      for (int i = 0; i < kPerThread; ++i) histogram.Record(1000 * (t + 1) + i % 100);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(histogram.count(), static_cast<uint64_t>(kThreads * kPerThread));
  EXPECT_EQ(histogram.min(), 1000);
  EXPECT_EQ(histogram.max(), 4099);
}

TEST(LatencyHistogramTest, TakeIntoMovesAndEmpties) {
  LatencyHistogram source;
  LatencyHistogram destination;
  for (int64_t v = 1; v <= 1000; ++v) source.Record(v * 1000);
  destination.Record(5);
  source.TakeInto(&destination);
  EXPECT_EQ(source.count(), 0u);
  EXPECT_EQ(source.ValueAtQuantile(0.5), 0);
  EXPECT_EQ(destination.count(), 1001u);
  EXPECT_EQ(destination.min(), 5);
  EXPECT_EQ(destination.max(), 1000000);
  source.Record(42);
  EXPECT_EQ(source.min(), 42);
  EXPECT_EQ(source.max(), 42);
}

}  // namespace
}  // namespace softmax::client
