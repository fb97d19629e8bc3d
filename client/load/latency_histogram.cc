#include "client/load/latency_histogram.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace softmax::client {
namespace {

constexpr int64_t kEmptyMin = std::numeric_limits<int64_t>::max();
constexpr int64_t kEmptyMax = std::numeric_limits<int64_t>::min();

int HighestBit(uint64_t value) { return 63 - __builtin_clzll(value); }

void AtomicAdd(std::atomic<double>* target, double value) {
  double current = target->load(std::memory_order_relaxed);
  while (!target->compare_exchange_weak(current, current + value, std::memory_order_relaxed)) {
  }
}

}  // namespace

LatencyHistogram::LatencyHistogram() : min_(kEmptyMin), max_(kEmptyMax) {
  for (auto& bucket : buckets_) bucket.store(0, std::memory_order_relaxed);
}

int LatencyHistogram::BucketIndex(int64_t value) {
  if (value < (int64_t{1} << kExactBits)) return value < 0 ? 0 : static_cast<int>(value);
  const int exponent = HighestBit(static_cast<uint64_t>(value));  // >= kExactBits
  const int shift = exponent - (kExactBits - 1);
  const int sub = static_cast<int>(value >> shift);  // in [kSubBuckets, 2 * kSubBuckets)
  return (1 << kExactBits) + (exponent - kExactBits) * kSubBuckets + (sub - kSubBuckets);
}

int64_t LatencyHistogram::BucketLowest(int index) {
  if (index < (1 << kExactBits)) return index;
  const int offset = index - (1 << kExactBits);
  const int exponent = kExactBits + offset / kSubBuckets;
  const int64_t sub = kSubBuckets + offset % kSubBuckets;
  return sub << (exponent - (kExactBits - 1));
}

int64_t LatencyHistogram::BucketHighest(int index) {
  if (index < (1 << kExactBits)) return index;
  const int offset = index - (1 << kExactBits);
  const int exponent = kExactBits + offset / kSubBuckets;
  const int shift = exponent - (kExactBits - 1);
  // Computed as lowest + (width - 1) so the last bucket does not overflow.
  return BucketLowest(index) + ((int64_t{1} << shift) - 1);
}

void LatencyHistogram::UpdateMinMax(int64_t low, int64_t high) {
  int64_t current = min_.load(std::memory_order_relaxed);
  while (low < current &&
         !min_.compare_exchange_weak(current, low, std::memory_order_relaxed)) {
  }
  current = max_.load(std::memory_order_relaxed);
  while (high > current &&
         !max_.compare_exchange_weak(current, high, std::memory_order_relaxed)) {
  }
}

void LatencyHistogram::Record(int64_t value) {
  if (value < 0) value = 0;
  buckets_[BucketIndex(value)].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(&sum_, static_cast<double>(value));
  UpdateMinMax(value, value);
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  for (int i = 0; i < kBucketCount; ++i) {
    const uint64_t n = other.buckets_[i].load(std::memory_order_relaxed);
    if (n != 0) buckets_[i].fetch_add(n, std::memory_order_relaxed);
  }
  count_.fetch_add(other.count_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  AtomicAdd(&sum_, other.sum_.load(std::memory_order_relaxed));
  const int64_t other_min = other.min_.load(std::memory_order_relaxed);
  const int64_t other_max = other.max_.load(std::memory_order_relaxed);
  if (other_min != kEmptyMin) UpdateMinMax(other_min, other_min);
  if (other_max != kEmptyMax) UpdateMinMax(other_max, other_max);
}

void LatencyHistogram::TakeInto(LatencyHistogram* destination) {
  for (int i = 0; i < kBucketCount; ++i) {
    const uint64_t n = buckets_[i].exchange(0, std::memory_order_relaxed);
    if (n != 0) destination->buckets_[i].fetch_add(n, std::memory_order_relaxed);
  }
  destination->count_.fetch_add(count_.exchange(0, std::memory_order_relaxed),
                                std::memory_order_relaxed);
  AtomicAdd(&destination->sum_, sum_.exchange(0.0, std::memory_order_relaxed));
  const int64_t low = min_.exchange(kEmptyMin, std::memory_order_relaxed);
  const int64_t high = max_.exchange(kEmptyMax, std::memory_order_relaxed);
  if (low != kEmptyMin) destination->UpdateMinMax(low, low);
  if (high != kEmptyMax) destination->UpdateMinMax(high, high);
}

void LatencyHistogram::Reset() {
  for (auto& bucket : buckets_) bucket.store(0, std::memory_order_relaxed);
  count_.store(0, std::memory_order_relaxed);
  sum_.store(0.0, std::memory_order_relaxed);
  min_.store(kEmptyMin, std::memory_order_relaxed);
  max_.store(kEmptyMax, std::memory_order_relaxed);
}

int64_t LatencyHistogram::min() const {
  const int64_t value = min_.load(std::memory_order_relaxed);
  return value == kEmptyMin ? 0 : value;
}

int64_t LatencyHistogram::max() const {
  const int64_t value = max_.load(std::memory_order_relaxed);
  return value == kEmptyMax ? 0 : value;
}

double LatencyHistogram::mean() const {
  const uint64_t n = count();
  return n == 0 ? 0.0 : sum_.load(std::memory_order_relaxed) / static_cast<double>(n);
}

uint64_t LatencyHistogram::NearestRank(double q, uint64_t count) {
  if (count == 0) return 0;
  const double exact = std::clamp(q, 0.0, 1.0) * static_cast<double>(count);
  // Without the tolerance, 0.99 * 1000 rounds up to rank 991.
  const double rank = std::ceil(exact - 1e-9 * exact);
  return std::clamp<uint64_t>(static_cast<uint64_t>(rank), 1, count);
}

int64_t LatencyHistogram::ValueAtQuantile(double q) const {
  // The total comes from the buckets themselves so that a concurrent Record
  // (bucket and count updated separately) cannot push the rank past the end.
  uint64_t total = 0;
  for (const auto& bucket : buckets_) total += bucket.load(std::memory_order_relaxed);
  if (total == 0) return 0;
  const uint64_t rank = NearestRank(q, total);
  uint64_t seen = 0;
  int index = kBucketCount - 1;
  for (int i = 0; i < kBucketCount; ++i) {
    seen += buckets_[i].load(std::memory_order_relaxed);
    if (seen >= rank) {
      index = i;
      break;
    }
  }
  const int64_t low = BucketLowest(index);
  const int64_t middle = low + (BucketHighest(index) - low) / 2;
  const int64_t recorded_min = min();
  const int64_t recorded_max = max();
  return std::clamp(middle, std::min(recorded_min, recorded_max), recorded_max);
}

}  // namespace softmax::client
