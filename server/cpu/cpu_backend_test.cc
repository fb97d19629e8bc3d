#include "server/cpu/cpu_backend.h"

#include <sched.h>

#include <cmath>
#include <chrono>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu_softmax.h"
#include "kernels/dtype.h"
#include "kernels/top_k_testing.h"
#include "server/scheduling/batcher.h"
#include "server/scheduling/scheduler.h"
#include "server/testing/test_backends.h"

namespace softmax::server {
namespace {

// A tensor with its input bytes, the backend's output and what to compute.
using Case = testing::TestTensor;

// Outputs start as 0x7f bytes, which no softmax value matches.
Case MakeCase(DType dtype, SoftmaxShape shape, SoftmaxOptions options, uint32_t seed,
              float scale = 4.0f) {
  std::mt19937 rng(seed);
  return testing::RandomTensor(rng, dtype, shape, options, scale, '\x7f');
}

// Runs `cases` as one batch on the backend's slot, from this thread.
BatchResult RunBatch(CpuBackend& backend, std::vector<Case>& cases) {
  for (Case& c : cases) c.output.assign(c.input.size(), '\x7f');
  Batch batch = testing::MakeBatch(cases);
  return testing::RunOnSlot(backend, batch);
}

// Tolerances in the spirit of torch.testing, a little wider for rounding of
// the float64 result into the narrow type.
void Tolerance(DType dtype, double* rtol, double* atol) {
  switch (dtype) {
    case DType::kFloat32: *rtol = 2e-6; *atol = 1e-6; return;
    case DType::kFloat16: *rtol = 1e-3; *atol = 1e-5; return;
    case DType::kBFloat16: *rtol = 8e-3; *atol = 1e-5; return;
  }
}

void ExpectMatchesReference(const Case& c) {
  std::vector<double> expected(static_cast<size_t>(c.shape.elements()));
  ReferenceSoftmax(c.input.data(), c.dtype, c.shape, c.options, expected.data());
  double rtol = 0, atol = 0;
  Tolerance(c.dtype, &rtol, &atol);
  for (int64_t i = 0; i < c.shape.elements(); ++i) {
    const double got = LoadAsFloat(c.output.data(), c.dtype, i);
    const double want = expected[i];
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << "element " << i;
    } else if (std::isinf(want)) {
      ASSERT_EQ(got, want) << "element " << i;
    } else {
      ASSERT_NEAR(got, want, atol + rtol * std::fabs(want))
          << DTypeName(c.dtype) << " element " << i << " of [" << c.shape.outer << ","
          << c.shape.n << "," << c.shape.inner << "]";
    }
  }
}

TEST(CpuBackendTest, MatchesReferenceAcrossDTypesAxesTemperatureAndLog) {
  CpuBackend backend(CpuBackendOptions{3, 64});
  uint32_t seed = 1;
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const SoftmaxShape& shape :
         {SoftmaxShape{1, 33, 1}, SoftmaxShape{17, 1000, 1},   // last axis
          SoftmaxShape{4, 9, 13}, SoftmaxShape{1, 64, 50},     // middle / first axis
          SoftmaxShape{6, 1, 5}}) {                            // rows of length 1
      for (const SoftmaxOptions& options :
           {SoftmaxOptions{1.0f, false}, SoftmaxOptions{0.25f, false},
            SoftmaxOptions{3.0f, true}, SoftmaxOptions{1.0f, true}}) {
        std::vector<Case> cases{MakeCase(dtype, shape, options, seed++)};
        const BatchResult result = RunBatch(backend, cases);
        ASSERT_TRUE(result.status.ok()) << result.status;
        ExpectMatchesReference(cases[0]);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(CpuBackendTest, MixedSegmentsInOneBatch) {
  CpuBackend backend(CpuBackendOptions{4, 128});
  std::vector<Case> cases;
  cases.push_back(MakeCase(DType::kFloat32, {300, 128, 1}, {1.0f, false}, 11));
  cases.push_back(MakeCase(DType::kFloat16, {2, 5000, 1}, {0.7f, true}, 12));
  cases.push_back(MakeCase(DType::kBFloat16, {3, 7, 11}, {2.0f, false}, 13));
  cases.push_back(MakeCase(DType::kFloat32, {0, 4, 1}, {1.0f, false}, 14));  // empty
  cases.push_back(MakeCase(DType::kFloat32, {1, 1, 1}, {1.0f, true}, 15));   // scalar
  const BatchResult result = RunBatch(backend, cases);
  ASSERT_TRUE(result.status.ok()) << result.status;
  EXPECT_GT(result.compute_ns, 0);
  for (const Case& c : cases) ExpectMatchesReference(c);
  // The scalar: log-softmax of one element is 0.
  EXPECT_EQ(LoadAsFloat(cases[4].output.data(), DType::kFloat32, 0), 0.0f);
}

TEST(CpuBackendTest, ComputesTopKAloneOrBesideTheWholeOutput) {
  // Top K alone (no output written), top K with the whole output, the
  // output computed in place over its input, and a plain segment, in one
  // batch cut into small tasks across dtypes and axes.
  CpuBackend backend(CpuBackendOptions{3, 64});
  std::vector<Case> cases;
  cases.push_back(MakeCase(DType::kFloat32, {37, 1000, 1}, {1.0f, false}, 21));
  cases.push_back(MakeCase(DType::kFloat16, {3, 300, 7}, {0.5f, true}, 22));
  cases.push_back(MakeCase(DType::kBFloat16, {5, 4096, 1}, {2.0f, false}, 23));
  cases.push_back(MakeCase(DType::kFloat32, {4, 64, 3}, {1.0f, false}, 24));
  cases.push_back(MakeCase(DType::kBFloat16, {9, 70, 1}, {1.0f, true}, 25));
  for (Case& c : cases) c.output.assign(c.input.size(), '\x7f');
  Batch batch = testing::MakeBatch(cases);
  std::vector<testing::TestTopK> top_k(cases.size());
  testing::AskTopK(cases[0], 5, false, &top_k[0], &batch.segments[0]);
  testing::AskTopK(cases[1], 64, true, &top_k[1], &batch.segments[1]);
  testing::AskTopK(cases[2], 1, false, &top_k[2], &batch.segments[2]);
  testing::AskTopK(cases[3], 64, true, &top_k[3], &batch.segments[3]);
  // In place: the ranking must read the input before the output replaces it.
  const std::string in_place_input = cases[3].input;
  batch.segments[3].output = cases[3].input.data();
  const BatchResult result = testing::RunOnSlot(backend, batch);
  ASSERT_TRUE(result.status.ok()) << result.status;
  for (size_t i = 0; i < 4; ++i) {
    const Case& c = cases[i];
    const std::string& input = i == 3 ? in_place_input : c.input;
    EXPECT_EQ(softmax::testing::CheckTopK(input.data(), c.dtype, c.shape, c.options, top_k[i].k,
                                 top_k[i].values.data(), top_k[i].indices.data()),
              "")
        << "segment " << i;
  }
  // No whole output where none was asked for; the others' as ever.
  EXPECT_EQ(cases[0].output, std::string(cases[0].input.size(), '\x7f'));
  EXPECT_EQ(cases[2].output, std::string(cases[2].input.size(), '\x7f'));
  ExpectMatchesReference(cases[1]);
  ExpectMatchesReference(cases[4]);
  Case in_place = cases[3];
  in_place.output = cases[3].input;
  in_place.input = in_place_input;
  ExpectMatchesReference(in_place);
  // Read once; written: two whole outputs and the top Ks.
  int64_t expected_bytes = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    expected_bytes += cases[i].input.size();
    if (batch.segments[i].full_output) expected_bytes += cases[i].input.size();
    if (i < 4) {
      expected_bytes += static_cast<int64_t>(top_k[i].values.size() + 8 * top_k[i].indices.size());
    }
  }
  EXPECT_EQ(result.kernel_bytes, expected_bytes);
}

TEST(CpuBackendTest, TasksSpanSegmentsAndCutThemAnywhere) {
  // Many small requests with empty ones between, then requests larger than a
  // task, under task sizes that fall inside and across segment boundaries:
  // every row of every segment is computed exactly once (the outputs start
  // as 0x7f bytes, which no softmax value matches).
  for (const int64_t min_task : {1, 7, 40, 100, 1 << 20}) {
    CpuBackend backend(CpuBackendOptions{3, min_task});
    std::vector<Case> cases;
    uint32_t seed = 100;
    for (int i = 0; i < 40; ++i) {
      const SoftmaxShape shape = i % 9 == 4 ? SoftmaxShape{0, 8, 1}
                                            : SoftmaxShape{1 + i % 3, 3 + i % 5, 1 + i % 2};
      cases.push_back(MakeCase(DType::kFloat32, shape, {1.0f, i % 2 == 1}, seed++));
    }
    cases.push_back(MakeCase(DType::kFloat16, {37, 61, 1}, {1.0f, false}, seed++));
    cases.push_back(MakeCase(DType::kBFloat16, {5, 9, 7}, {0.5f, false}, seed++));
    cases.push_back(MakeCase(DType::kFloat32, {1, 2, 1}, {1.0f, false}, seed++));
    const BatchResult result = RunBatch(backend, cases);
    ASSERT_TRUE(result.status.ok()) << result.status;
    for (const Case& c : cases) {
      ExpectMatchesReference(c);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CpuBackendTest, NaNAndInfinityRowsFollowTorch) {
  CpuBackend backend(CpuBackendOptions{2, 1});
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> rows = {
      {-inf, -inf, -inf, -inf},  // all -inf -> NaN
      {1.0f, nan, 2.0f, 3.0f},   // NaN anywhere -> NaN row
      {-inf, 0.0f, -inf, 0.0f},  // -inf entries -> exactly 0
      {inf, 1.0f, 2.0f, 3.0f},   // +inf -> NaN (inf - inf)
  };
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (bool log : {false, true}) {
      Case c{dtype, SoftmaxShape{4, 4, 1}, SoftmaxOptions{1.0f, log}, {}, {}};
      c.input.resize(16 * ItemSize(dtype));
      for (int r = 0; r < 4; ++r) {
        for (int k = 0; k < 4; ++k) StoreFromFloat(c.input.data(), dtype, r * 4 + k, rows[r][k]);
      }
      std::vector<Case> cases{c};
      ASSERT_TRUE(RunBatch(backend, cases).status.ok());
      ExpectMatchesReference(cases[0]);
      const std::string& out = cases[0].output;
      for (int k = 0; k < 4; ++k) {
        EXPECT_TRUE(std::isnan(LoadAsFloat(out.data(), dtype, 0 * 4 + k)));
        EXPECT_TRUE(std::isnan(LoadAsFloat(out.data(), dtype, 1 * 4 + k)));
        EXPECT_TRUE(std::isnan(LoadAsFloat(out.data(), dtype, 3 * 4 + k)));
      }
      const float masked = LoadAsFloat(out.data(), dtype, 2 * 4 + 0);
      const float kept = LoadAsFloat(out.data(), dtype, 2 * 4 + 1);
      if (log) {
        EXPECT_EQ(masked, -inf);
        EXPECT_NEAR(kept, std::log(0.5), 1e-2);
      } else {
        EXPECT_EQ(masked, 0.0f);
        EXPECT_EQ(kept, 0.5f);
      }
    }
  }
}

TEST(CpuBackendTest, ExtremeValuesDoNotOverflow) {
  CpuBackend backend(CpuBackendOptions{2, 16});
  std::vector<Case> cases{MakeCase(DType::kFloat32, {8, 257, 1}, {1.0f, false}, 21, 1e4f),
                          MakeCase(DType::kFloat32, {8, 257, 1}, {1e-3f, true}, 22, 10.0f)};
  ASSERT_TRUE(RunBatch(backend, cases).status.ok());
  for (const Case& c : cases) ExpectMatchesReference(c);
}

TEST(CpuBackendTest, EmptySegmentsComplete) {
  CpuBackend backend(CpuBackendOptions{2, 16});
  std::vector<Case> cases{MakeCase(DType::kFloat16, {0, 3, 1}, {}, 1),
                          MakeCase(DType::kFloat16, {4, 0, 1}, {}, 2)};
  const BatchResult result = RunBatch(backend, cases);
  EXPECT_TRUE(result.status.ok());
  EXPECT_TRUE(cases[0].output.empty());
}

TEST(CpuBackendTest, RowSumsAreOneOnLargeBatch) {
  CpuBackend backend(CpuBackendOptions{0, 16384});
  EXPECT_GE(backend.threads(), 1);
  std::vector<Case> cases{MakeCase(DType::kFloat32, {512, 1024, 1}, {}, 5)};
  ASSERT_TRUE(RunBatch(backend, cases).status.ok());
  for (int64_t r = 0; r < 512; ++r) {
    double sum = 0;
    for (int64_t k = 0; k < 1024; ++k) sum += LoadAsFloat(cases[0].output.data(), DType::kFloat32, r * 1024 + k);
    ASSERT_NEAR(sum, 1.0, 1e-4) << "row " << r;
  }
}

// No thread count: one thread per core the process may run on, so a
// container's cpuset (or taskset) sizes the pool, not the machine.
TEST(CpuBackendTest, ZeroThreadsMeansEveryCoreTheProcessMayUse) {
  cpu_set_t cores;
  CPU_ZERO(&cores);
  ASSERT_EQ(sched_getaffinity(0, sizeof(cores), &cores), 0);
  CpuBackend backend(CpuBackendOptions{0, 16384});
  EXPECT_EQ(backend.threads(), CPU_COUNT(&cores));

  int first_core = 0;
  while (!CPU_ISSET(first_core, &cores)) ++first_core;
  cpu_set_t one_core;
  CPU_ZERO(&one_core);
  CPU_SET(first_core, &one_core);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one_core), &one_core), 0);
  const int pinned_threads = CpuBackend(CpuBackendOptions{0, 16384}).threads();
  ASSERT_EQ(sched_setaffinity(0, sizeof(cores), &cores), 0);
  EXPECT_EQ(pinned_threads, 1);
}

// What the scheduler needs of it: one slot, not in place, the "cpu" label;
// and the figures the metrics read: dispatch from the batch's stamp, its
// compute as kernel time, every byte read and written once.
TEST(CpuBackendTest, ReportsItsSlotNameAndBatchFigures) {
  CpuBackend backend(CpuBackendOptions{2, 16});
  EXPECT_EQ(backend.Slots(), 1);
  EXPECT_EQ(backend.Name(), "cpu");
  EXPECT_FALSE(backend.ComputesInPlace());
  EXPECT_EQ(backend.Describe(), "cpu threads=2");
  EXPECT_EQ(backend.Device().multiprocessors, 2);
  std::vector<Case> cases{MakeCase(DType::kFloat32, {16, 300, 1}, {}, 3)};
  for (Case& c : cases) c.output.assign(c.input.size(), '\x7f');
  Batch batch = testing::MakeBatch(cases);
  batch.submitted = std::chrono::steady_clock::now() - std::chrono::milliseconds(5);
  BatchResult result = testing::RunOnSlot(backend, batch);
  ASSERT_TRUE(result.status.ok()) << result.status;
  EXPECT_GE(result.dispatch_ns, 5'000'000);
  EXPECT_GT(result.compute_ns, 0);
  EXPECT_EQ(result.kernel_ns, result.compute_ns);
  EXPECT_EQ(result.kernel_bytes, 2 * batch.bytes);
  EXPECT_TRUE(result.segment_status.empty());
  EXPECT_TRUE(result.output_views.empty());
  ExpectMatchesReference(cases[0]);
  // Unstamped: no dispatch to report.
  Batch unstamped = testing::MakeBatch(cases);
  EXPECT_EQ(testing::RunOnSlot(backend, unstamped).dispatch_ns, 0);
}

// Under the scheduler and the batcher, as the server runs it: requests of
// several shapes from several threads are all computed correctly, on the
// backend's one slot thread.
TEST(CpuBackendTest, ServesRequestsThroughTheSchedulerAndBatcher) {
  CpuBackend backend(CpuBackendOptions{2, 64});
  Scheduler scheduler({&backend});
  BatcherOptions options;
  options.max_batch_rows = 64;
  options.max_queue_delay = std::chrono::microseconds(200);
  Batcher batcher(options, &scheduler);
  constexpr int kThreads = 3;
  constexpr int kPerThread = 40;
  std::vector<Case> cases;
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    cases.push_back(MakeCase(i % 2 ? DType::kFloat16 : DType::kFloat32,
                             {1 + i % 4, 1 + (i * 37) % 700, 1}, {1.0f, i % 3 == 0}, 500 + i));
  }
  std::vector<std::unique_ptr<testing::TestRequest>> requests;
  for (size_t i = 0; i < cases.size(); ++i) {
    requests.push_back(std::make_unique<testing::TestRequest>());
  }
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t) {
    producers.emplace_back([&, t] {
      for (int k = 0; k < kPerThread; ++k) {
        const int i = t * kPerThread + k;
        Case& c = cases[i];
        auto item = std::make_unique<WorkItem>();
        item->segment = testing::SegmentOf(c);
        item->output = &requests[i]->output;
        testing::TestRequest* request = requests[i].get();
        item->done = [request](const absl::Status& status, const RequestTiming& timing) {
          request->status = status;
          request->timing = timing;
          request->answered_on = std::this_thread::get_id();
          request->done.Notify();
        };
        ASSERT_TRUE(batcher.Enqueue(std::move(item)).ok());
      }
    });
  }
  for (std::thread& producer : producers) producer.join();
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(requests[i]->Wait());
    ASSERT_TRUE(requests[i]->status.ok()) << requests[i]->status;
    EXPECT_GT(requests[i]->timing.compute_ns, 0);
    cases[i].output = requests[i]->output;
    ExpectMatchesReference(cases[i]);
    if (HasFatalFailure()) return;
  }
  batcher.Stop();
}

}  // namespace
}  // namespace softmax::server

namespace softmax::server {
namespace {

// Found by server/fuzz/request_fuzzer: an empty tensor whose softmax axis is
// huge ([3, 2, 0, ..., 2164934066369]) made the row routine size its row
// buffer for n before noticing there were no rows.
TEST(CpuBackendTest, EmptyTensorWithHugeAxisAllocatesNoRowBuffer) {
  const SoftmaxShape shape{0, int64_t{1} << 41, 1};
  char input = 0;
  char output = 0;
  CpuSoftmaxRows(&input, &output, DType::kFloat16, shape, SoftmaxOptions{}, 0, shape.rows());
  SUCCEED();  // reaching here: no std::bad_alloc / length_error
}

}  // namespace
}  // namespace softmax::server
