// LatencyHistogram: an HDR-style log-linear histogram of non-negative integer
// values (the load generator records nanoseconds), with bounded relative error,
// fixed memory and lock-free recording.
//
// Layout: values below 256 each have their own bucket (exact). Above that,
// every power-of-two range [2^e, 2^(e+1)) is split into 128 equal buckets, so a
// bucket is never wider than 1/128 of its lower bound. A quantile is reported as
// the middle of the bucket holding it (clamped to the recorded min and max), so
// it is within kMaxRelativeError (1/256, about 0.4%) of the exact order
// statistic. 7296 buckets cover the whole int64 range in about 58 KB.
//
// Quantiles follow the nearest-rank definition: the value at quantile q is the
// ceil(q * count)-th smallest recorded value (the smallest for q = 0).
//
// Thread-safety: Record, Merge (as the destination or the source), TakeInto and
// the readers may all run concurrently; counters are relaxed atomics, so a
// reader racing with writers sees a slightly stale but never torn histogram.
// Merge lets each thread or connection own a histogram and combine them later.
#ifndef SOFTMAX_CLIENT_LOAD_LATENCY_HISTOGRAM_H_
#define SOFTMAX_CLIENT_LOAD_LATENCY_HISTOGRAM_H_

#include <array>
#include <atomic>
#include <cstdint>

namespace softmax::client {

class LatencyHistogram {
 public:
  // Values below 2^kExactBits are stored exactly.
  static constexpr int kExactBits = 8;
  // Buckets per power of two above the exact range.
  static constexpr int kSubBuckets = 1 << (kExactBits - 1);
  static constexpr int kBucketCount = (1 << kExactBits) + (63 - kExactBits) * kSubBuckets;
  // Worst-case |reported - exact| / exact for any quantile.
  static constexpr double kMaxRelativeError = 1.0 / (2 * kSubBuckets);

  LatencyHistogram();
  LatencyHistogram(const LatencyHistogram&) = delete;
  LatencyHistogram& operator=(const LatencyHistogram&) = delete;

  // Adds one value; negative values are recorded as 0.
  void Record(int64_t value);

  // Adds every value recorded in `other` to this histogram. `other` is not
  // changed. REQUIRES: &other != this.
  void Merge(const LatencyHistogram& other);

  // Moves everything recorded so far into `*destination` (merged with what it
  // holds) and leaves this histogram empty, without losing concurrent records.
  // The progress line uses it to read per-interval percentiles.
  // REQUIRES: destination != this.
  void TakeInto(LatencyHistogram* destination);

  // Empties the histogram. Not atomic with respect to concurrent Record calls.
  void Reset();

  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  // Exact smallest / largest value recorded; 0 when empty.
  int64_t min() const;
  int64_t max() const;
  // Exact mean of the recorded values; 0 when empty.
  double mean() const;

  // Value at quantile q in [0, 1] (clamped), within kMaxRelativeError of the
  // exact nearest-rank value; 0 when empty.
  int64_t ValueAtQuantile(double q) const;

  // The 1-based nearest rank for quantile q among `count` values: ceil(q * count)
  // clamped to [1, count], immune to q * count landing just above an integer
  // through rounding. 0 when count is 0.
  static uint64_t NearestRank(double q, uint64_t count);

  // Bucket geometry, exposed for tests: the bucket holding `value`, and the
  // smallest / largest value that bucket holds.
  static int BucketIndex(int64_t value);
  static int64_t BucketLowest(int index);
  static int64_t BucketHighest(int index);

 private:
  void RecordCount(int64_t value, uint64_t count, int index);
  void UpdateMinMax(int64_t low, int64_t high);

  std::array<std::atomic<uint64_t>, kBucketCount> buckets_;
  std::atomic<uint64_t> count_{0};
  // A double sum cannot overflow and is exact enough for a mean; C++17 has no
  // atomic fetch_add for double, so it is added with a compare-exchange loop.
  std::atomic<double> sum_{0.0};
  std::atomic<int64_t> min_;
  std::atomic<int64_t> max_;
};

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_LOAD_LATENCY_HISTOGRAM_H_
