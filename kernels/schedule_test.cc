// Planning without a GPU: schedules (PlanSchedule) made from an H200's
// recorded launch plan (kernels/testdata/), so that CI checks the batch-invariance rule where
// it lives. Every row of a probe segment must get the same kernel and the
// same arguments that fix its reductions (geometry, parts, config word)
// alone and inside random tables of every kernel; split and strided scratch
// regions must fit and never overlap; LaunchKernels and SoftmaxScratchBytes
// must agree with the schedule. No CUDA call is made: the segments' pointers
// are addresses that are never dereferenced.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/plan.h"
#include "kernels/dtype.h"
#include "kernels/kernel_testing.h"
#include "kernels/recorded_plan.h"
#include "kernels/softmax_cuda.h"

namespace softmax {
namespace gpu {
namespace detail {
namespace {

// What fixes the order of a row's reductions in one launch step: the kernel
// and the values it reduces by. Rows counts and grids are left out.
struct RowOrder {
  std::string kernel;
  std::vector<long long> values;
  bool operator==(const RowOrder& o) const { return kernel == o.kernel && values == o.values; }
  bool operator<(const RowOrder& o) const {
    return kernel != o.kernel ? kernel < o.kernel : values < o.values;
  }
  std::string ToString() const {
    std::ostringstream out;
    out << kernel << "{";
    for (size_t i = 0; i < values.size(); ++i) out << (i ? "," : "") << values[i];
    return out.str() + "}";
  }
};

long long ScaleBits(float scale) {
  uint32_t bits;
  std::memcpy(&bits, &scale, sizeof(bits));
  return bits;
}

bool Within(const void* p, uintptr_t begin, uintptr_t end) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return a >= begin && a < end;
}

// The orders a schedule gives the rows whose inputs lie in [begin, end), with
// the rows each covers.
std::map<RowOrder, long long> OrdersOf(const Schedule& schedule, uintptr_t begin, uintptr_t end) {
  std::map<RowOrder, long long> out;
  for (const LaunchStep& step : schedule.steps) {
    const std::string name = SoftmaxKernelName(step.kernel);
    switch (KernelInfoOf(step.kernel).args) {
      case StepArgs::kFlat:
        // The flat kernel runs the flat table kernel's order for its rows:
        // the same key as a flat table entry of 2 vectors per thread.
        if (Within(step.flat.input, begin, end)) {
          out[{"flat order", {step.flat.group_log2, kFlatSlots, step.vec, step.log, step.flat.n,
                              ScaleBits(step.flat.scale)}}] += step.flat.rows;
        }
        break;
      case StepArgs::kTable:
        for (const RowSegment& r : step.table) {
          if (!Within(r.input, begin, end)) continue;
          RowOrder order;
          // A flat row in a row_staged launch is summed in the flat order.
          if (step.kernel == SoftmaxKernel::kFlatTable ||
              (step.kernel == SoftmaxKernel::kRowStaged && (r.config & kFlatOrderBit) != 0)) {
            order = {"flat order",
                     {(r.config >> kShapeShift) & 0xf, kFlatSlots, (r.config & kVecBit) != 0,
                      (r.config & kLogBit) != 0, r.n, ScaleBits(r.scale)}};
          } else if (step.kernel == SoftmaxKernel::kRowStaged) {
            // Its order follows from n alone (and the op and scale).
            order = {name, {step.threads, r.config, r.n, ScaleBits(r.scale)}};
          } else if (step.kernel == SoftmaxKernel::kOnChip) {
            order = {name, {r.config, r.n, ScaleBits(r.scale)}};
          } else if (step.kernel == SoftmaxKernel::kStaged) {
            // The instantiation (4 or 14 stages) is part of a staged row's order.
            order = {name, {step.cluster, step.short_shares, r.unused[kStagedChunkSlot],
                            r.config, r.n, ScaleBits(r.scale)}};
          } else {
            // A table family without a key of its own: all its step and entry carry.
            order = {name, {step.cluster, step.threads, step.short_shares, r.unused[0],
                            r.unused[1], r.config, r.n, ScaleBits(r.scale)}};
          }
          out[order] += r.rows;
        }
        break;
      case StepArgs::kSplit:
        if (Within(step.split.input, begin, end)) {
          out[{name, {step.split.parts, step.split.part_vectors, step.split.vec, step.split.log,
                      step.split.n, ScaleBits(step.split.scale)}}] += step.split.rows;
        }
        break;
      case StepArgs::kStrided:
        if (!Within(step.strided.input, begin, end)) break;
        if (step.kernel == SoftmaxKernel::kStridedStaged) {
          out[{name, {step.cluster, step.strided.tile_vectors, step.strided.part_rows,
                      step.strided.strips, step.strided.log,
                      step.strided.n, step.strided.inner, ScaleBits(step.strided.scale)}}] +=
              step.strided.outer;
        } else {
          out[{name, {step.strided.lanes_log2, step.strided.strips, step.strided.part_rows,
                      step.strided.parts, step.strided.vec, step.strided.log, step.strided.n,
                      step.strided.inner, ScaleBits(step.strided.scale)}}] += step.strided.outer;
        }
        break;
    }
  }
  return out;
}

std::string Describe(const std::map<RowOrder, long long>& orders) {
  std::string out;
  for (const auto& [order, rows] : orders) out += order.ToString() + " x" + std::to_string(rows) + " ";
  return out;
}

class ScheduleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    h200_text_ = RecordedPlanText("h200_plan.txt");
    ASSERT_TRUE(LaunchPlan::Parse(h200_text_, &plan_)) << "kernels/testdata/h200_plan.txt";
  }

  Schedule Plan(DType dtype, const std::vector<SoftmaxSegment>& segments,
                bool allow_flat = true) const {
    Schedule schedule;
    EXPECT_EQ(PlanSchedule(plan_, dtype, segments.data(), static_cast<int>(segments.size()),
                           allow_flat, &schedule),
              cudaSuccess);
    return schedule;
  }

  void CheckRowOrders(uint64_t seed, int trials, int* checked) const;

  LaunchPlan plan_;
  std::string h200_text_;  // kernels/testdata/h200_plan.txt
};

// A segment at a made-up address of its own (slot), `misalign` elements past
// a 16-byte boundary.
SoftmaxSegment At(DType dtype, int slot, int64_t outer, int64_t n, int64_t inner,
                  int64_t misalign = 0, float temperature = 1.0f, bool log = false) {
  SoftmaxSegment s;
  const uintptr_t base = (static_cast<uintptr_t>(slot) + 1) << 40;
  const uintptr_t skew = static_cast<uintptr_t>(misalign) * ItemSize(dtype);
  s.input = reinterpret_cast<const void*>(base + skew);
  s.output = reinterpret_cast<void*>(base + (uintptr_t{1} << 39) + skew);
  s.outer = outer;
  s.n = n;
  s.inner = inner;
  s.temperature = temperature;
  s.log = log;
  return s;
}

uintptr_t Begin(const SoftmaxSegment& s) { return reinterpret_cast<uintptr_t>(s.input); }
uintptr_t End(DType dtype, const SoftmaxSegment& s) {
  return Begin(s) + static_cast<uintptr_t>(s.outer * s.n * s.inner) * ItemSize(dtype);
}

TEST_F(ScheduleTest, ParsesTheRecordedPlanBack) {
  EXPECT_EQ(plan_.multiprocessors(), 132);
  EXPECT_EQ(plan_.max_cluster_size(), 8);
  EXPECT_EQ(plan_.device_name(), "NVIDIA H200");
  EXPECT_EQ(plan_.ToString(), h200_text_);
  ASSERT_NE(plan_.Find("staged", DType::kFloat16, 16), nullptr);
  EXPECT_EQ(plan_.Find("staged", DType::kFloat16, 16)->max_active_clusters, 7);
  // Find (a binary search by dtype, cluster size and family) returns every
  // probe by its own key, and no probe for a prefix of a family or a cluster
  // size the plan lacks.
  for (const KernelProbe& probe : plan_.probes()) {
    const std::string family = probe.kernel.substr(0, probe.kernel.find('<'));
    EXPECT_EQ(plan_.Find(family, probe.dtype, probe.cluster_size), &probe) << probe.kernel;
  }
  EXPECT_EQ(plan_.Find("flat_table", DType::kBFloat16)->threads_per_block, 512);
  EXPECT_EQ(plan_.Find("row_staged", DType::kBFloat16)->threads_per_block, 256);
  EXPECT_EQ(plan_.Find("flat", DType::kFloat32), nullptr);
  EXPECT_EQ(plan_.Find("staged", DType::kFloat32, 32), nullptr);
  EXPECT_EQ(plan_.Find("split_stats", DType::kFloat16, 2), nullptr);
  LaunchPlan bad;
  EXPECT_FALSE(LaunchPlan::Parse("not a plan", &bad));
  EXPECT_FALSE(LaunchPlan::Parse("softmax launch plan: device 0 (X), 132 SMs\n", &bad));
}

// The kernels each class of row takes on the H200, alone.
TEST_F(ScheduleTest, KernelsOfOneSegment) {
  struct Case {
    DType dtype;
    int64_t outer, n, inner, misalign;
    const char* kernels;
  };
  const Case cases[] = {
      {DType::kFloat32, 1000, 4096, 1, 0, "flat"},
      {DType::kFloat32, 1000, 4097, 1, 0, "row_staged"},
      {DType::kFloat32, 1000, 4100, 1, 0, "staged"},
      {DType::kFloat32, 10, 32768 - 1, 1, 0, "row_staged"},
      {DType::kFloat32, 10, 32768 + 4, 1, 0, "staged"},
      {DType::kFloat32, 10, 32768 + 5, 1, 0, "row_staged"},
      {DType::kFloat32, 10, 4 * 14080 + 1, 1, 0, "on_chip"},
      {DType::kFloat32, 4, 1 << 20, 1, 0, "split_staged"},
      // float32 rows of 768 KiB..1 MiB on 16-block clusters; the gap below them.
      {DType::kFloat32, 4, 1 << 18, 1, 0, "staged"},
      {DType::kFloat32, 4, (1 << 18) + 4, 1, 0, "split_staged"},
      {DType::kFloat32, 4, 196608, 1, 0, "staged"},
      {DType::kFloat32, 4, 196604, 1, 0, "split_staged"},
      {DType::kFloat32, 4, 131076, 1, 0, "split_staged"},
      {DType::kFloat32, 4, 131072, 1, 0, "staged"},
      {DType::kFloat16, 4, 1 << 19, 1, 0, "split_staged"},
      {DType::kFloat32, 4, (1 << 20) + 1, 1, 0, "split_fused"},
      {DType::kFloat32, 4, 1 << 24, 1, 0, "split_stats,split_merge,split_normalize"},
      {DType::kFloat32, 4, 1 << 24, 1, 1, "split_stats,split_normalize_units"},
      {DType::kFloat16, 4, 1 << 18, 1, 0, "staged"},
      {DType::kFloat16, 8, 8 * 1025, 1, 0, "row_staged"},
      {DType::kFloat16, 8, 8 * 3839, 1, 0, "row_staged"},
      {DType::kFloat16, 8, 8 * 3840, 1, 0, "staged"},  // 60-64 KiB: 2 shares of 30-32 KiB
      {DType::kFloat16, 8, 8 * 4096, 1, 0, "staged"},
      {DType::kFloat16, 8, 8 * 4097, 1, 0, "staged"},
      {DType::kBFloat16, 8, 8 * 8192 + 1, 1, 0, "row_staged"},
      {DType::kBFloat16, 8, 8 * 14080 - 1, 1, 0, "row_staged"},
      {DType::kBFloat16, 8, 8 * 14080 + 1, 1, 0, "on_chip"},
      {DType::kFloat32, 64, 50257, 1, 0, "row_staged"},
      {DType::kFloat32, 64, 50256, 1, 1, "row_staged"},
      {DType::kBFloat16, 8, 8 * 8192 - 1, 1, 0, "row_staged"},
      {DType::kFloat16, 4, 1 << 20, 1, 0, "split_staged"},
      {DType::kBFloat16, 8, 4096, 1, 1, "flat"},
      {DType::kFloat32, 2, 4096, 64, 0, "strided_staged"},
      {DType::kFloat16, 3, 26624, 64, 0, "strided_staged"},
      {DType::kFloat16, 3, 26625, 64, 0, "strided_stats,strided_normalize"},
      {DType::kFloat32, 2, 4096, 63, 0, "strided_stats,strided_normalize"},
      {DType::kFloat32, 2, 4096, 64, 1, "strided_stats,strided_normalize"},
  };
  for (const Case& c : cases) {
    const std::vector<SoftmaxSegment> one = {At(c.dtype, 0, c.outer, c.n, c.inner, c.misalign)};
    const Schedule schedule = Plan(c.dtype, one);
    EXPECT_EQ(schedule.Kernels(), c.kernels) << DTypeName(c.dtype) << " n=" << c.n << "\n"
                                             << schedule.ToString();
    EXPECT_EQ(LaunchKernels(plan_, c.dtype, one.data(), 1), schedule.Kernels());
  }
}

// Rows of the long probes: both sides of 2,048 and 4,096.
constexpr int64_t kProbeRows = 5000;

// Probe segments: both sides of every boundary between kernels, aligned and
// not, non-last axes; fillers of every kernel.
std::vector<SoftmaxSegment> Probes(const LaunchPlan& plan, DType dtype) {
  const int64_t v = VecWidth(dtype);
  std::vector<int64_t> lengths = {1, 7, v, 256 * v, 256 * v + 1, 1024 * v, 1024 * v + 1,
                                  1025 * v, 2048 * v, 8192 * v, 8192 * v + 1, 8193 * v,
                                  16384 * v, 16384 * v + 1};
  const int64_t staged = PathMaxLength(plan, dtype, SoftmaxPath::kStagedRows);
  const int64_t split_staged = SplitStagedMaxLength(plan, dtype);
  const int64_t fused = SplitSinglePassMaxLength(plan, dtype);
  for (int64_t n : {staged, staged + v, split_staged, split_staged + v, fused, fused + 1}) {
    if (n > 0) lengths.push_back(n);
  }
  // Thousands of rows (outer slices) per probe on every kernel class, so
  // that a rule reading the row count of a tensor (say, another kernel from
  // 2,048 rows) gives its random runs of rows other orders than the whole.
  // Nothing is dereferenced: planning only sees the sizes.
  std::vector<SoftmaxSegment> probes;
  int slot = 0;
  for (int64_t n : lengths) {
    for (int64_t misalign : {0, 1}) {
      const bool log = slot % 3 == 0;
      probes.push_back(At(dtype, slot++, kProbeRows, n, 1, misalign, 0.7f, log));
    }
  }
  for (int64_t inner : {int64_t{2}, int64_t{3}, int64_t{64}, int64_t{1000}, 32 * v}) {
    for (int64_t n : {5, 1000, 4096, 26624, 26625, 70000}) {
      probes.push_back(
          At(dtype, slot++, kProbeRows, n, inner, inner == 3 ? 1 : 0, 1.3f, n == 1000));
    }
  }
  return probes;
}

SoftmaxSegment Filler(DType dtype, int slot, std::mt19937_64& rng) {
  const int64_t v = VecWidth(dtype);
  auto pick = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const int64_t misalign = pick(0, 3) == 0 ? pick(1, v - 1) : 0;
  const float temperature = pick(0, 1) ? 1.0f : 0.5f;
  const bool log = pick(0, 1) == 1;
  switch (pick(0, 7)) {
    case 0: return At(dtype, slot, pick(1, 5000), pick(1, 256 * v), 1, misalign, temperature, log);
    case 1: return At(dtype, slot, pick(1, 500), pick(256 * v, 1024 * v), 1, misalign, temperature, log);
    case 2: return At(dtype, slot, pick(1, 50), pick(1025, 8192) * v | 1, 1, misalign, temperature, log);
    case 3: return At(dtype, slot, pick(1, 50), pick(1025, 32768) * v, 1, 0, temperature, log);
    case 4: return At(dtype, slot, pick(1, 4), pick(8193, 16384) * v | 1, 1, misalign, temperature, log);
    case 5: return At(dtype, slot, pick(1, 3), pick(1 << 17, 1 << 19) * v, 1, 0, temperature, log);
    case 6: return At(dtype, slot, pick(1, 2), pick(1 << 21, 1 << 23) | 1, 1, misalign, temperature, log);
    default: return At(dtype, slot, pick(1, 4), pick(2, 5000), pick(2, 300), misalign, temperature, log);
  }
}

// A table of fillers, min_count to max_count of them (the count drawn first).
std::vector<SoftmaxSegment> Fillers(DType dtype, int min_count, int max_count,
                                    std::mt19937_64& rng) {
  const int count = std::uniform_int_distribution<int>(min_count, max_count)(rng);
  std::vector<SoftmaxSegment> table;
  for (int i = 0; i < count; ++i) table.push_back(Filler(dtype, i, rng));
  return table;
}

// The rule, at the plan: a probe's rows (any run of them) get the orders
// they get alone, inside random tables of up to 40 other segments (a third of
// them with their flat rows in the row_staged launch), and within their
// alignment class at any address. *checked counts the tables.
void ScheduleTest::CheckRowOrders(uint64_t seed, int trials, int* checked) const {
  std::mt19937_64 rng(seed);
  for (DType dtype : kAllDTypes) {
    const std::vector<SoftmaxSegment> probes = Probes(plan_, dtype);
    for (size_t p = 0; p < probes.size(); ++p) {
      const SoftmaxSegment& probe = probes[p];
      const std::map<RowOrder, long long> alone =
          OrdersOf(Plan(dtype, {probe}), Begin(probe), End(dtype, probe));
      ASSERT_FALSE(alone.empty()) << "probe " << p;
      for (const auto& entry : alone) {
        ASSERT_EQ(entry.second, probe.outer) << "probe " << p << ": " << Describe(alone);
      }
      for (int trial = 0; trial < trials; ++trial) {
        // A run of the probe's rows, moved by whole 16-byte vectors (same
        // alignment class), among fillers in a random position.
        SoftmaxSegment piece = probe;
        // Half the runs short (up to 64 rows), half of any length.
        const int64_t first = std::uniform_int_distribution<int64_t>(0, probe.outer - 1)(rng);
        const int64_t longest = trial % 2 == 0 ? std::min<int64_t>(64, probe.outer - first)
                                               : probe.outer - first;
        piece.outer = std::uniform_int_distribution<int64_t>(1, longest)(rng);
        const uintptr_t shift = 16 * std::uniform_int_distribution<uintptr_t>(0, 1 << 20)(rng) +
                                static_cast<uintptr_t>(first * probe.n * probe.inner) *
                                    ItemSize(dtype);
        piece.input = reinterpret_cast<const void*>(Begin(probe) + (uintptr_t{1} << 38) + shift);
        piece.output = static_cast<char*>(piece.output) + (uintptr_t{1} << 38) + shift;
        std::vector<SoftmaxSegment> table;
        const int others = std::uniform_int_distribution<int>(0, 40)(rng);
        for (int i = 0; i < others; ++i) table.push_back(Filler(dtype, 100 + i, rng));
        table.insert(table.begin() + std::uniform_int_distribution<int>(0, others)(rng), piece);
        // Every third table has more row_staged rows than flat ones: its flat
        // rows run in the row_staged launch.
        const bool joined = trial % 3 == 1;
        if (joined) {
          long long flat = 0;
          for (const SoftmaxSegment& s : table) {
            if (s.inner == 1 && CeilDiv(s.n, VecWidth(dtype)) <= kFlatMaxVectors) flat += s.outer;
          }
          table.push_back(At(dtype, 99, flat + 1, 1025 * VecWidth(dtype) + 1, 1));
        }
        const Schedule schedule = Plan(dtype, table);
        if (joined && plan_.Find("row_staged", dtype) != nullptr) {
          EXPECT_EQ(schedule.Kernels().find("flat_table"), std::string::npos) << schedule.Kernels();
        }
        const std::map<RowOrder, long long> inside =
            OrdersOf(schedule, Begin(piece), End(dtype, piece));
        ASSERT_EQ(inside.size(), alone.size())
            << DTypeName(dtype) << " probe " << p << " n=" << probe.n << " inner=" << probe.inner
            << "\nalone:  " << Describe(alone) << "\ninside: " << Describe(inside) << "\n"
            << schedule.ToString();
        for (const auto& [order, rows] : alone) {
          const auto it = inside.find(order);
          ASSERT_TRUE(it != inside.end())
              << DTypeName(dtype) << " probe " << p << " n=" << probe.n << "\nalone:  "
              << Describe(alone) << "\ninside: " << Describe(inside);
          EXPECT_EQ(it->second, piece.outer) << order.ToString();
        }
        ++*checked;
      }
    }
  }
}

TEST_F(ScheduleTest, RowOrdersDoNotDependOnTheLaunch) {
  int checked = 0;
  CheckRowOrders(32, 12, &checked);
  EXPECT_GT(checked, 1000);
}

// The rule's registry: every entry takes some probe's rows on the H200's
// plan (no entry is dead), a row goes to the first entry that takes it, and
// the last entry takes every row.
TEST_F(ScheduleTest, EveryRowFamilyTakesSomeRows) {
  const std::vector<RowFamily>& families = RowFamilies();
  std::vector<int> taken(families.size(), 0);
  for (DType dtype : kAllDTypes) {
    for (const SoftmaxSegment& probe : Probes(plan_, dtype)) {
      size_t first = families.size();
      for (size_t f = 0; f < families.size() && first == families.size(); ++f) {
        const RowFamily& family = families[f];
        if (family.probe != nullptr && plan_.Find(family.probe, dtype) == nullptr) continue;
        if (family.takes(plan_, dtype, probe)) first = f;
      }
      ASSERT_LT(first, families.size());
      EXPECT_EQ(families[first].kernel, RowKernelOf(plan_, dtype, probe));
      EXPECT_TRUE(families.back().takes(plan_, dtype, probe));
      ++taken[first];
    }
  }
  for (size_t f = 0; f < families.size(); ++f) {
    EXPECT_GT(taken[f], 0) << "entry " << f << " (" << SoftmaxKernelName(families[f].kernel)
                           << ") takes no probe's rows";
  }
}

// The same on an H100's plan recorded with these kernels (row_staged at 5
// blocks per SM in every dtype, 50 MiB of L2).
TEST_F(ScheduleTest, RowOrdersDoNotDependOnTheLaunchOnAnH100) {
  const std::string h100_text = RecordedPlanText("h100_plan.txt");
  ASSERT_TRUE(LaunchPlan::Parse(h100_text, &plan_)) << "kernels/testdata/h100_plan.txt";
  EXPECT_EQ(plan_.ToString(), h100_text);
  ASSERT_NE(plan_.Find("row_staged", DType::kFloat16), nullptr);
  EXPECT_EQ(plan_.Find("row_staged", DType::kFloat16)->blocks_per_sm, 5);
  int checked = 0;
  CheckRowOrders(33, 12, &checked);
  EXPECT_GT(checked, 1000);
}

// A table's flat rows join its row_staged launch where they are no more than
// its row_staged rows, with the flat table's shape bits and summed in the flat
// order (RowOrdersDoNotDependOnTheLaunch keys them so); else, and in tables
// without row_staged rows, they keep the flat table launch.
TEST_F(ScheduleTest, FlatRowsJoinATablesRowStagedLaunch) {
  for (DType dtype : kAllDTypes) {
    const int64_t v = VecWidth(dtype);
    const SoftmaxSegment long_rows = At(dtype, 0, 50, 2000 * v + 1, 1);
    const Schedule joined = Plan(dtype, {long_rows, At(dtype, 1, 30, 33 * v, 1, 1, 0.5f, true),
                                         At(dtype, 2, 20, 1, 1)});
    EXPECT_EQ(joined.Kernels(), "row_staged") << joined.ToString();
    std::vector<int> shapes;
    for (const RowSegment& r : joined.steps.back().table) {
      if ((r.config & kFlatOrderBit) == 0) continue;
      shapes.push_back((r.config >> kShapeShift) & 0xf);
      EXPECT_EQ(r.config & (kLogBit | kVecBit), r.n == 1 ? 0 : kLogBit) << r.n;
    }
    // Longest rows first: 33 vectors (R = 32 threads), then 1 element (R = 1).
    EXPECT_EQ(shapes, (std::vector<int>{5, 0}));
    EXPECT_EQ(Plan(dtype, {long_rows, At(dtype, 1, 51, 33 * v, 1)}).Kernels(),
              "row_staged,flat_table");
    EXPECT_EQ(Plan(dtype, {At(dtype, 0, 3, 1000 * v, 1), At(dtype, 1, 2, 33 * v, 1)}).Kernels(),
              "flat_table");
  }
}

// A GPU whose blocks cannot hold a row_staged row (99 KiB of opt-in shared
// memory per block) has no row_staged probe: its rows go to the staged
// kernel (aligned) or the on-chip cluster path, alone and in tables alike.
TEST_F(ScheduleTest, PlansWithoutRowStaged) {
  std::string text;
  std::istringstream lines(h200_text_);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("row_staged") == std::string::npos) text += line + "\n";
  }
  ASSERT_TRUE(LaunchPlan::Parse(text, &plan_));
  for (DType dtype : kAllDTypes) ASSERT_EQ(plan_.Find("row_staged", dtype), nullptr);
  struct Case {
    DType dtype;
    int64_t n, misalign;
    const char* kernels;
  };
  const Case cases[] = {
      {DType::kFloat32, 4097, 0, "on_chip"},
      {DType::kFloat32, 4100, 1, "on_chip"},
      {DType::kFloat32, 4100, 0, "staged"},
      {DType::kFloat16, 8 * 1025, 0, "staged"},
      {DType::kFloat16, 8 * 4096, 3, "on_chip"},
      {DType::kBFloat16, 8 * 8192 - 1, 0, "on_chip"},
      {DType::kFloat32, 50257, 0, "on_chip"},
  };
  for (const Case& c : cases) {
    const std::vector<SoftmaxSegment> one = {At(c.dtype, 0, 8, c.n, 1, c.misalign)};
    const Schedule schedule = Plan(c.dtype, one);
    EXPECT_EQ(schedule.Kernels(), c.kernels) << DTypeName(c.dtype) << " n=" << c.n << "\n"
                                             << schedule.ToString();
    EXPECT_EQ(LaunchKernels(plan_, c.dtype, one.data(), 1), schedule.Kernels());
  }
  int checked = 0;
  CheckRowOrders(33, 3, &checked);
  EXPECT_GT(checked, 250);
}

// Scratch: the schedule's size is SoftmaxScratchBytes; every split and
// strided segment's partials, finals and counters (where it has them) lie
// inside it, after the table area, apart from every other segment's; tables
// beyond the inline limit fit the table area.
TEST_F(ScheduleTest, ScratchRegionsFitAndDoNotOverlap) {
  std::mt19937_64 rng(7);
  for (DType dtype : kAllDTypes) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<SoftmaxSegment> table = Fillers(dtype, 1, trial % 4 == 0 ? 120 : 30, rng);
      const int count = static_cast<int>(table.size());
      const Schedule schedule = Plan(dtype, table);
      ASSERT_EQ(schedule.scratch_bytes,
                SoftmaxScratchBytes(plan_, dtype, table.data(), count));
      EXPECT_EQ(LaunchKernels(plan_, dtype, table.data(), count), schedule.Kernels());
      std::vector<std::pair<size_t, size_t>> regions;
      for (const LaunchStep& step : schedule.steps) {
        if (step.TableInScratch()) {
          EXPECT_LE(step.table.size() * sizeof(RowSegment), schedule.table_bytes);
        }
        // A segment's first launch: the one that zeroes its counters, or
        // split_stats (the two-pass split form has no counters).
        if (step.zero_bytes == 0 && step.kernel != SoftmaxKernel::kSplitStats) continue;
        EXPECT_GE(step.partials_offset, schedule.table_bytes);
        EXPECT_LT(step.partials_offset, step.finals_offset);
        EXPECT_LE(step.finals_offset, step.counters_offset);
        EXPECT_LE(step.counters_offset + step.zero_bytes, schedule.scratch_bytes);
        regions.push_back({step.partials_offset, step.counters_offset + step.zero_bytes});
      }
      std::sort(regions.begin(), regions.end());
      for (size_t i = 1; i < regions.size(); ++i) {
        EXPECT_LE(regions[i - 1].second, regions[i].first) << schedule.ToString();
      }
    }
  }
}

// The launch-plan log prints where each table goes (LaunchStep::TableInScratch),
// also where the launch reserves a table area that only some tables use.
TEST_F(ScheduleTest, TheLogSaysWhichTablesGoThroughTheScratch) {
  std::mt19937_64 rng(11);
  int mixed = 0;  // schedules with a table area and an inline table
  for (DType dtype : kAllDTypes) {
    for (int trial = 0; trial < 100; ++trial) {
      std::vector<SoftmaxSegment> table = Fillers(dtype, 20, 120, rng);
      const Schedule schedule = Plan(dtype, table);
      const std::string log = schedule.ToString();
      size_t in_scratch = 0;
      size_t inline_tables = 0;
      for (const LaunchStep& step : schedule.steps) {
        if (step.table.empty()) continue;
        ++(step.TableInScratch() ? in_scratch : inline_tables);
      }
      const auto occurrences = [&log](const std::string& word) {
        size_t n = 0;
        for (size_t at = log.find(word); at != std::string::npos; at = log.find(word, at + 1)) ++n;
        return n;
      };
      EXPECT_EQ(occurrences("entries (scratch)"), in_scratch) << log;
      EXPECT_EQ(occurrences("entries (inline)"), inline_tables) << log;
      if (schedule.table_bytes > 0 && inline_tables > 0) ++mixed;
    }
  }
  EXPECT_GT(mixed, 0);
}

// Every launch's geometry is something the device runs: grids within the
// probe's persistent grid where it waits across blocks, clusters the probe
// found, shared memory within the opt-in limit.
TEST_F(ScheduleTest, StepsFitTheDevice) {
  std::mt19937_64 rng(11);
  for (DType dtype : kAllDTypes) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<SoftmaxSegment> table = Fillers(dtype, 1, 30, rng);
      for (bool allow_flat : {true, false}) {
        const Schedule schedule = Plan(dtype, table, allow_flat);
        for (const LaunchStep& step : schedule.steps) {
          EXPECT_GT(step.grid, 0u);
          EXPECT_GT(step.threads, 0);
          EXPECT_LE(step.shared_bytes, static_cast<size_t>(kStagedMaxBytes));
          if (step.cooperative) {
            const KernelProbe* probe = plan_.Find(SoftmaxKernelName(step.kernel), dtype);
            ASSERT_NE(probe, nullptr);
            EXPECT_LE(static_cast<int>(step.grid), probe->grid) << schedule.ToString();
          }
          if (step.cluster > 0) {
            const char* family = step.kernel == SoftmaxKernel::kOnChip
                                     ? "on_chip"
                                     : SoftmaxKernelName(step.kernel);
            EXPECT_NE(plan_.Find(family, dtype, step.cluster), nullptr) << schedule.ToString();
            EXPECT_EQ(step.grid % static_cast<unsigned>(step.cluster), 0u);
          }
          // The short instantiation's stages cover every share of its launch.
          EXPECT_TRUE(!step.short_shares || step.kernel == SoftmaxKernel::kStaged);
          for (const RowSegment& r : step.table) {
            if (step.short_shares) {
              EXPECT_LE(r.unused[kStagedChunkSlot], kStagedShortStages * kStagedStageVectors)
                  << schedule.ToString();
            }
          }
          if (!allow_flat) {
            EXPECT_NE(step.kernel, SoftmaxKernel::kFlat);
            EXPECT_NE(step.kernel, SoftmaxKernel::kFlatTable);
            EXPECT_NE(step.kernel, SoftmaxKernel::kRowStaged);
          }
        }
      }
    }
  }
}

// Which staged launches run the 4-stage instantiation (shares of up to 64
// KiB, but not float32 on one-block clusters), on which clusters (16-bit rows
// of 60-64 KiB on 2 blocks, of 120-128 KiB on 4).
TEST_F(ScheduleTest, StagedShortInstantiation) {
  struct Case {
    DType dtype;
    int64_t n;
    int cluster;
    bool short_shares;
  };
  const Case cases[] = {
      {DType::kFloat16, 1 << 18, 8, true},    {DType::kBFloat16, 1 << 16, 4, true},
      {DType::kFloat16, 61440, 4, true},      {DType::kFloat16, 61432, 2, true},
      {DType::kFloat16, 32768, 2, true},      {DType::kBFloat16, 30720, 2, true},
      {DType::kFloat32, 1 << 15, 2, true},
      {DType::kFloat32, 1 << 18, 16, true},   {DType::kFloat32, 1 << 16, 4, true},
      {DType::kFloat32, 8192, 1, false},      {DType::kFloat32, 16384, 1, false},
      {DType::kFloat16, 8 * 4097, 2, true},
  };
  for (const Case& c : cases) {
    const std::vector<SoftmaxSegment> table = {At(c.dtype, 0, 4, c.n, 1)};
    const Schedule schedule = Plan(c.dtype, table, true);
    ASSERT_EQ(schedule.steps.size(), 1u) << schedule.ToString();
    const LaunchStep& step = schedule.steps[0];
    EXPECT_EQ(step.kernel, SoftmaxKernel::kStaged) << schedule.ToString();
    EXPECT_EQ(step.cluster, c.cluster) << schedule.ToString();
    EXPECT_EQ(step.short_shares, c.short_shares) << schedule.ToString();
  }
  // Shares beyond 64 KiB (no split_staged: 16 shares of a 3 MiB row) run 14 stages.
  EXPECT_FALSE(StagedShortShares(DType::kFloat16, 16, 192 * 1024));
}

// A plan whose staged clusters stop at 4 blocks (the H200's without its 8-
// and 16-block staged probes): rows of up to 256 KiB have shares of at most
// 64 KiB there and run 4 stages, longer ones 14, on the same cluster size.
// Each row's instantiation is its own, whatever shares its launch.
TEST_F(ScheduleTest, StagedInstantiationFollowsTheRowAlone) {
  std::string text;
  std::istringstream lines(h200_text_);
  for (std::string line; std::getline(lines, line);) {
    const bool large_staged = line.rfind("  staged<", 0) == 0 &&
                              (line.find("  8  ") != std::string::npos ||
                               line.find(" 16  ") != std::string::npos);
    if (!large_staged) text += line + "\n";
  }
  ASSERT_TRUE(LaunchPlan::Parse(text, &plan_));
  for (DType dtype : kAllDTypes) {
    ASSERT_NE(plan_.Find("staged", dtype, 4), nullptr);
    ASSERT_EQ(plan_.Find("staged", dtype, 8), nullptr);
    const int64_t v = VecWidth(dtype);
    const SoftmaxSegment short_rows = At(dtype, 0, 3, 16384 * v, 1);  // 4 shares of 64 KiB
    const SoftmaxSegment long_rows = At(dtype, 1, 5, 32768 * v, 1);   // 4 shares of 128 KiB
    const Schedule both = Plan(dtype, {short_rows, long_rows});
    ASSERT_EQ(both.steps.size(), 2u) << both.ToString();
    for (const SoftmaxSegment& s : {short_rows, long_rows}) {
      const Schedule alone = Plan(dtype, {s});
      ASSERT_EQ(alone.steps.size(), 1u) << alone.ToString();
      EXPECT_EQ(alone.steps[0].cluster, 4) << alone.ToString();
      EXPECT_EQ(alone.steps[0].short_shares, s.n == short_rows.n) << alone.ToString();
      EXPECT_EQ(OrdersOf(both, Begin(s), End(dtype, s)),
                OrdersOf(alone, Begin(s), End(dtype, s)))
          << both.ToString();
    }
  }
  int checked = 0;
  CheckRowOrders(35, 3, &checked);
  EXPECT_GT(checked, 250);
}

// strided_staged tiles: 256 bytes of each row for float32 columns that fit
// at most 8 shares of 64 KiB, else 128 bytes.
TEST_F(ScheduleTest, StridedStagedWideTiles) {
  struct Case {
    DType dtype;
    int64_t n, inner;
    int tile_bytes;
    int cluster;
  };
  const Case cases[] = {
      {DType::kFloat32, 2048, 65536, 256, 8},  {DType::kFloat32, 2049, 65536, 128, 8},
      {DType::kFloat32, 4096, 65536, 128, 8},  {DType::kFloat32, 1000, 64, 256, 4},
      {DType::kFloat32, 33, 256, 256, 1},      {DType::kFloat32, 2048, 96, 128, 4},
      {DType::kFloat16, 2048, 65536, 128, 4},  {DType::kBFloat16, 1024, 128, 128, 2},
  };
  for (const Case& c : cases) {
    const std::vector<SoftmaxSegment> one = {At(c.dtype, 0, 2, c.n, c.inner)};
    const Schedule schedule = Plan(c.dtype, one);
    ASSERT_EQ(schedule.steps.size(), 1u) << schedule.ToString();
    const LaunchStep& step = schedule.steps[0];
    EXPECT_EQ(step.kernel, SoftmaxKernel::kStridedStaged) << schedule.ToString();
    EXPECT_EQ(step.strided.tile_vectors * 16, c.tile_bytes) << schedule.ToString();
    EXPECT_EQ(step.cluster, c.cluster) << schedule.ToString();
  }
}

// strided_staged takes columns by n, inner and the dtype alone: a tensor of
// more outer slices than one launch's 2^31 - 1 blocks hold runs in several
// launches of whole slices, each slice in the order it has alone.
TEST_F(ScheduleTest, StridedStagedDoesNotDependOnTheOuterCount) {
  for (DType dtype : kAllDTypes) {
    const SoftmaxSegment one = At(dtype, 0, 1, 4096, 65536);
    const Schedule alone = Plan(dtype, {one});
    ASSERT_EQ(alone.Kernels(), "strided_staged") << alone.ToString();
    const long long slice_blocks = alone.steps[0].grid;
    const long long outer = 0x7fffffffLL / slice_blocks * 2 + 3;  // three launches
    SoftmaxSegment many = At(dtype, 1, outer, 4096, 65536);
    const Schedule schedule = Plan(dtype, {many});
    ASSERT_EQ(schedule.Kernels(), "strided_staged") << schedule.ToString();
    ASSERT_EQ(schedule.steps.size(), 3u) << schedule.ToString();
    long long covered = 0;
    for (const LaunchStep& step : schedule.steps) {
      EXPECT_LE(step.grid, 0x7fffffffu);
      EXPECT_EQ(step.strided.input,
                static_cast<const char*>(many.input) +
                    static_cast<size_t>(covered * 4096 * 65536) * ItemSize(dtype));
      covered += step.strided.outer;
    }
    EXPECT_EQ(covered, outer);
    const std::map<RowOrder, long long> orders = OrdersOf(schedule, Begin(many), End(dtype, many));
    const std::map<RowOrder, long long> slice = OrdersOf(alone, Begin(one), End(dtype, one));
    ASSERT_EQ(orders.size(), 1u);
    EXPECT_EQ(orders.begin()->first, slice.begin()->first);
    EXPECT_EQ(orders.begin()->second, outer);
  }
}

// A table's launches run its longest rows first: staged, then on_chip, then
// row_staged, then flat_table, whatever order the segments came in; split
// and strided launches of its own segment come after them.
TEST_F(ScheduleTest, TableLaunchesTakeTheLongestRowsFirst) {
  std::mt19937_64 rng(19);
  const auto rank = [](SoftmaxKernel k) {
    switch (k) {
      case SoftmaxKernel::kStaged: return 0;
      case SoftmaxKernel::kOnChip: return 1;
      case SoftmaxKernel::kRowStaged: return 2;
      case SoftmaxKernel::kFlatTable: return 3;
      default: return 4;
    }
  };
  std::map<std::string, int> seen;
  for (DType dtype : kAllDTypes) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<SoftmaxSegment> table = Fillers(dtype, 2, 40, rng);
      const Schedule schedule = Plan(dtype, table);
      int previous = 0;
      for (const LaunchStep& step : schedule.steps) {
        EXPECT_GE(rank(step.kernel), previous) << schedule.ToString();
        previous = std::max(previous, rank(step.kernel));
      }
      ++seen[schedule.Kernels()];
    }
  }
  // The random tables do hold every table kernel, several in one launch.
  for (const char* kernels : {"staged,on_chip,row_staged", "staged,row_staged,flat_table"}) {
    bool found = false;
    for (const auto& [name, n] : seen) found = found || name.rfind(kernels, 0) == 0;
    EXPECT_TRUE(found) << kernels;
  }
}

// row_staged launches take the longest rows first, across launches and
// within each, so that each ends on its shortest blocks; every launch's
// shared memory holds its longest row.
TEST_F(ScheduleTest, RowStagedTakesTheLongestRowsFirst) {
  std::mt19937_64 rng(17);
  int launches = 0;
  for (DType dtype : kAllDTypes) {
    for (int trial = 0; trial < 100; ++trial) {
      std::vector<SoftmaxSegment> table = Fillers(dtype, 2, 40, rng);
      const Schedule schedule = Plan(dtype, table);
      long long previous = std::numeric_limits<long long>::max();
      for (const LaunchStep& step : schedule.steps) {
        if (step.kernel != SoftmaxKernel::kRowStaged) continue;
        ++launches;
        for (const RowSegment& r : step.table) {
          EXPECT_LE(r.n, previous) << schedule.ToString();
          previous = r.n;
          EXPECT_GE(step.shared_bytes, RowStagedShareBytes((r.n + VecWidth(dtype) - 1) /
                                                           VecWidth(dtype)));
        }
      }
    }
  }
  EXPECT_GT(launches, 100);
}

// A launch overlaps the tail of the one before only where nothing passes
// between them (both table launches of other segments: flat_table,
// row_staged, on_chip or staged; no memset or table copy before it) or where it is a second pass
// right after the pass before it (split_merge after split_stats,
// split_normalize after split_merge or split_stats, strided_normalize after strided_stats,
// same scratch: it waits for that pass before it reads what it wrote); never
// the first launch, never a first
// pass or a one-launch split or strided segment.
TEST_F(ScheduleTest, OnlyIndependentTableLaunchesAndSecondPassesOverlap) {
  std::mt19937_64 rng(13);
  int second_passes = 0;
  const auto table_kernel = [](SoftmaxKernel k) {
    return k == SoftmaxKernel::kFlatTable || k == SoftmaxKernel::kStaged ||
           k == SoftmaxKernel::kRowStaged || k == SoftmaxKernel::kOnChip;
  };
  int overlapping = 0;
  for (DType dtype : kAllDTypes) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<SoftmaxSegment> table = Fillers(dtype, 1, trial % 4 == 0 ? 120 : 30, rng);
      for (bool allow_flat : {true, false}) {
        const Schedule schedule = Plan(dtype, table, allow_flat);
        for (size_t i = 0; i < schedule.steps.size(); ++i) {
          const LaunchStep& step = schedule.steps[i];
          const bool tables = i > 0 && table_kernel(schedule.steps[i - 1].kernel) &&
                              table_kernel(step.kernel) && step.zero_bytes == 0 &&
                              step.table.size() <= static_cast<size_t>(kInlineSegments);
          // A second pass follows its own first pass, on the same scratch.
          const bool second_pass =
              i > 0 && step.zero_bytes == 0 &&
              ((schedule.steps[i - 1].kernel == SoftmaxKernel::kSplitStats &&
                step.kernel == SoftmaxKernel::kSplitMerge) ||
               (schedule.steps[i - 1].kernel == SoftmaxKernel::kSplitStats &&
                step.kernel == SoftmaxKernel::kSplitNormalize) ||
               (schedule.steps[i - 1].kernel == SoftmaxKernel::kSplitStats &&
                step.kernel == SoftmaxKernel::kSplitNormalizeUnits) ||
               (schedule.steps[i - 1].kernel == SoftmaxKernel::kSplitMerge &&
                step.kernel == SoftmaxKernel::kSplitNormalize) ||
               (schedule.steps[i - 1].kernel == SoftmaxKernel::kStridedStats &&
                step.kernel == SoftmaxKernel::kStridedNormalize)) &&
              schedule.steps[i - 1].partials_offset == step.partials_offset;
          if (second_pass) ++second_passes;
          const bool expected = tables || second_pass;
          EXPECT_EQ(step.overlap_previous, expected) << i << "\n" << schedule.ToString();
          if (step.overlap_previous) {
            ++overlapping;
            EXPECT_FALSE(step.cooperative);
            EXPECT_NE(schedule.ToString().find("overlaps"), std::string::npos);
          }
        }
      }
    }
  }
  EXPECT_GT(overlapping, 0);  // the random tables do hold such launches
  EXPECT_GT(second_passes, 0);
}

}  // namespace
}  // namespace detail
}  // namespace gpu
}  // namespace softmax
