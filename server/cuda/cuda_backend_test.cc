// GPU tests of the DeviceWorker: ragged mixed batches, pieces cut through a
// small staging limit, empty segments, allocator reuse after warm-up, and the
// pipelining of several batches in flight. Skipped without a GPU.
#include "server/device_worker.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_softmax.h"
#include "kernels/dtype.h"

namespace softmax::server {
namespace {

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: DeviceWorker tests need a GPU"

double Rtol(DType dtype) { return ReferenceRelativeTolerance(dtype); }

// The tests were written for batches beyond 256 KiB taking the DMA copies
// (the default once); they keep that, so both paths stay covered.
constexpr int64_t kTestZeroCopyMaxBytes = int64_t{256} << 10;

// One request's data, kept alive beside its segment.
struct Tensor {
  std::string input;
  std::string output;
  DType dtype = DType::kFloat32;
  SoftmaxShape shape;
  SoftmaxOptions options;
};

Tensor MakeTensor(std::mt19937& rng, DType dtype, SoftmaxShape shape, SoftmaxOptions options) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  t.options = options;
  const int64_t elements = shape.elements();
  t.input.resize(elements * ItemSize(dtype));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t i = 0; i < elements; ++i) StoreFromFloat(t.input.data(), dtype, i, normal(rng));
  t.output.assign(t.input.size(), '\xff');  // poison: NaN in every dtype
  return t;
}

std::unique_ptr<Batch> MakeBatch(std::vector<Tensor>& tensors) {
  auto batch = std::make_unique<Batch>();
  for (Tensor& t : tensors) {
    Segment s;
    s.input = t.input.data();
    s.output = t.output.data();
    s.bytes = static_cast<int64_t>(t.input.size());
    s.dtype = t.dtype;
    s.shape = t.shape;
    s.options = t.options;
    batch->rows += t.shape.rows();
    batch->bytes += s.bytes;
    batch->segments.push_back(s);
  }
  return batch;
}

BatchResult RunAndWait(DeviceWorker& worker, std::unique_ptr<Batch> batch) {
  std::promise<BatchResult> promise;
  worker.Submit(std::move(batch), [&promise](std::unique_ptr<Batch>, BatchResult result) {
    promise.set_value(std::move(result));
  });
  return promise.get_future().get();
}

void ExpectMatchesReference(const Tensor& t) {
  std::vector<double> ref(t.shape.elements());
  ReferenceSoftmax(t.input.data(), t.dtype, t.shape, t.options, ref.data());
  const double rtol = Rtol(t.dtype);
  int64_t bad = 0;
  for (int64_t i = 0; i < t.shape.elements(); ++i) {
    const double y = LoadAsFloat(t.output.data(), t.dtype, i);
    const double tolerance = 1e-6 + rtol * std::fabs(ref[i]) +
                             (t.options.log ? rtol * 1.0 : 0.0);  // log values near 0
    if (!(std::fabs(y - ref[i]) <= tolerance)) {
      if (++bad <= 3) {
        ADD_FAILURE() << DTypeName(t.dtype) << " [" << t.shape.outer << "," << t.shape.n << ","
                      << t.shape.inner << "] element " << i << ": got " << y << " want "
                      << ref[i];
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

// A worker that fails the test on a GPU fault; null (and a failure) when it
// cannot be created.
std::unique_ptr<DeviceWorker> CreateWorker(const DeviceWorkerOptions& options) {
  absl::StatusOr<std::unique_ptr<DeviceWorker>> worker =
      DeviceWorker::Create(options, [](const absl::Status& status) {
        ADD_FAILURE() << "unexpected GPU fault: " << status;
      });
  EXPECT_TRUE(worker.ok()) << worker.status();
  return worker.ok() ? std::move(*worker) : nullptr;
}

std::unique_ptr<DeviceWorker> MakeWorker(int64_t max_staging_bytes,
                                        int64_t memory_limit_bytes = 0) {
  DeviceWorkerOptions options;
  options.max_staging_bytes = max_staging_bytes;
  options.zero_copy_max_bytes = kTestZeroCopyMaxBytes;
  options.memory_limit_bytes = memory_limit_bytes;
  return CreateWorker(options);
}

TEST(DeviceWorkerTest, RaggedMixedBatchMatchesReference) {
  SKIP_WITHOUT_GPU();
  auto worker = MakeWorker(64 << 20);
  ASSERT_NE(worker, nullptr);
  std::mt19937 rng(1234);
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  std::uniform_int_distribution<int> rows(1, 63);
  std::uniform_int_distribution<int> length(1, 20000);
  std::vector<Tensor> tensors;
  for (int i = 0; i < 48; ++i) {
    SoftmaxOptions options;
    options.log = i % 3 == 0;
    options.temperature = i % 4 == 0 ? 0.5f : 1.0f;
    tensors.push_back(MakeTensor(rng, dtypes[i % 3], {rows(rng), length(rng), 1}, options));
  }
  // Non-last axes and an empty tensor ride in the same batch.
  tensors.push_back(MakeTensor(rng, DType::kFloat32, {3, 100, 37}, {}));
  tensors.push_back(MakeTensor(rng, DType::kFloat16, {1, 4096, 5}, {1.0f, true}));
  tensors.push_back(MakeTensor(rng, DType::kBFloat16, {2, 0, 4}, {}));
  BatchResult result = RunAndWait(*worker, MakeBatch(tensors));
  ASSERT_TRUE(result.status.ok()) << result.status;
  EXPECT_TRUE(result.segment_status.empty());
  EXPECT_GT(result.kernel_ns, 0);
  EXPECT_GE(result.launches, 3);  // one per dtype at least
  for (const Tensor& t : tensors) ExpectMatchesReference(t);
}

TEST(DeviceWorkerTest, LargeTensorIsCutIntoPiecesThroughSmallStaging) {
  SKIP_WITHOUT_GPU();
  auto worker = MakeWorker(1 << 20);  // 1 MiB of staging per run
  ASSERT_NE(worker, nullptr);
  std::mt19937 rng(99);
  std::vector<Tensor> tensors;
  tensors.push_back(MakeTensor(rng, DType::kFloat32, {600, 4096, 1}, {}));  // 9.4 MiB: 10 runs
  tensors.push_back(MakeTensor(rng, DType::kFloat16, {7, 300000, 1}, {}));  // slabs of 600 KB
  tensors.push_back(MakeTensor(rng, DType::kFloat32, {1, 1 << 20, 1}, {}));  // one 4 MiB slab
  BatchResult result = RunAndWait(*worker, MakeBatch(tensors));
  ASSERT_TRUE(result.status.ok()) << result.status;
  EXPECT_GT(result.launches, 10);
  for (const Tensor& t : tensors) ExpectMatchesReference(t);
}

TEST(DeviceWorkerTest, InPlaceSegmentsMatchReferenceAlsoWhenCutIntoPieces) {
  SKIP_WITHOUT_GPU();
  static_assert(DeviceWorker::kComputesInPlace, "the batcher relies on it on the GPU");
  // The batcher's outputs_reuse_inputs: each segment's output is its input.
  // Once with staging that holds the whole batch, once with 1 MiB of staging
  // so that the large tensors go through in several runs.
  for (const int64_t staging : {int64_t{64} << 20, int64_t{1} << 20}) {
    auto worker = MakeWorker(staging);
    ASSERT_NE(worker, nullptr);
    std::mt19937 rng(static_cast<uint32_t>(staging));
    std::vector<Tensor> tensors;
    tensors.push_back(MakeTensor(rng, DType::kFloat32, {600, 4096, 1}, {}));  // 9.4 MiB
    tensors.push_back(MakeTensor(rng, DType::kFloat16, {7, 300000, 1}, {1.0f, true}));
    tensors.push_back(MakeTensor(rng, DType::kBFloat16, {64, 32000, 1}, {}));
    tensors.push_back(MakeTensor(rng, DType::kFloat32, {3, 100, 37}, {0.5f, false}));
    tensors.push_back(MakeTensor(rng, DType::kFloat32, {1, 3, 1}, {}));
    const std::vector<Tensor> originals = tensors;
    std::unique_ptr<Batch> batch = MakeBatch(tensors);
    for (Segment& segment : batch->segments) segment.output = const_cast<void*>(segment.input);
    BatchResult result = RunAndWait(*worker, std::move(batch));
    ASSERT_TRUE(result.status.ok()) << result.status;
    EXPECT_TRUE(result.segment_status.empty());
    for (size_t i = 0; i < tensors.size(); ++i) {
      Tensor computed = originals[i];
      computed.output = tensors[i].input;  // where the worker wrote
      ExpectMatchesReference(computed);
    }
  }
}

TEST(DeviceWorkerTest, NoAllocationsAfterWarmUpAndPipelinedBatches) {
  SKIP_WITHOUT_GPU();
  auto worker = MakeWorker(64 << 20);
  ASSERT_NE(worker, nullptr);
  std::mt19937 rng(5);
  auto round = [&](int batches) {
    std::vector<std::vector<Tensor>> all(batches);
    std::vector<std::future<BatchResult>> results;
    std::vector<std::promise<BatchResult>> promises(batches);
    for (int b = 0; b < batches; ++b) {
      for (int i = 0; i < 16; ++i) {
        all[b].push_back(MakeTensor(rng, DType::kFloat32, {4, 4096, 1}, {}));
      }
      results.push_back(promises[b].get_future());
    }
    for (int b = 0; b < batches; ++b) {
      worker->Submit(MakeBatch(all[b]), [&promises, b](std::unique_ptr<Batch>, BatchResult r) {
        promises[b].set_value(std::move(r));
      });
    }
    for (int b = 0; b < batches; ++b) {
      BatchResult r = results[b].get();
      ASSERT_TRUE(r.status.ok()) << r.status;
      for (const Tensor& t : all[b]) ExpectMatchesReference(t);
    }
  };
  round(4);  // warm-up: fills the caches
  std::vector<MemoryStats> warm = worker->Memory();
  round(8);
  std::vector<MemoryStats> after = worker->Memory();
  ASSERT_EQ(warm.size(), 2u);
  for (size_t i = 0; i < warm.size(); ++i) {
    // Normal batches run in the slots' own staging: no CUDA allocations at all.
    EXPECT_EQ(after[i].raw_allocations, warm[i].raw_allocations) << after[i].memory;
    // Only the slots' own staging stays in use between batches.
    EXPECT_EQ(after[i].in_use_bytes, warm[i].in_use_bytes) << after[i].memory;
  }
}

TEST(DeviceWorkerTest, OutOfMemoryFailsOnlyTheRequestThatDoesNotFit) {
  SKIP_WITHOUT_GPU();
  // 1 MiB staging per slot: 3 slots x (in + out) = 6 MiB of device memory,
  // plus 10 MiB to spare. A 16 MiB single row needs 32 MiB of its own staging.
  auto worker = MakeWorker(1 << 20, 16 << 20);
  ASSERT_NE(worker, nullptr);
  std::mt19937 rng(17);
  std::vector<Tensor> tensors;
  tensors.push_back(MakeTensor(rng, DType::kFloat32, {8, 1000, 1}, {}));
  tensors.push_back(MakeTensor(rng, DType::kFloat32, {1, 4 << 20, 1}, {}));  // 16 MiB row
  tensors.push_back(MakeTensor(rng, DType::kFloat16, {3, 5000, 1}, {}));
  BatchResult result = RunAndWait(*worker, MakeBatch(tensors));
  ASSERT_TRUE(result.status.ok()) << result.status;
  ASSERT_EQ(result.segment_status.size(), 3u);
  EXPECT_TRUE(result.segment_status[0].ok()) << result.segment_status[0];
  EXPECT_TRUE(absl::IsResourceExhausted(result.segment_status[1])) << result.segment_status[1];
  EXPECT_TRUE(result.segment_status[2].ok()) << result.segment_status[2];
  ExpectMatchesReference(tensors[0]);
  ExpectMatchesReference(tensors[2]);
  // The worker is still healthy: the next batch is served in full.
  std::vector<Tensor> next;
  next.push_back(MakeTensor(rng, DType::kBFloat16, {4, 3000, 1}, {}));
  BatchResult again = RunAndWait(*worker, MakeBatch(next));
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_TRUE(again.segment_status.empty());
  ExpectMatchesReference(next[0]);
}

// Batches within zero_copy_max_bytes are computed straight in pinned host
// memory (no DMA copies). Raised to 48 MiB here so that every kernel path
// reads and writes host memory over the bus: flat and table rows, cluster
// rows, split rows, non-last axes, several dtypes, log-softmax, an empty
// tensor; separate outputs and in place (the batcher's outputs_reuse_inputs).
// The default (64 KiB) is covered by every small batch of the other tests.
TEST(DeviceWorkerTest, ZeroCopyBatchesMatchReferenceOnEveryKernelPath) {
  SKIP_WITHOUT_GPU();
  for (const bool in_place : {false, true}) {
    DeviceWorkerOptions options;
    options.max_staging_bytes = 96 << 20;  // the outputs go right behind the inputs
    options.zero_copy_max_bytes = 48 << 20;
    auto created = DeviceWorker::Create(options, [](const absl::Status& status) {
      ADD_FAILURE() << "unexpected GPU fault: " << status;
    });
    ASSERT_TRUE(created.ok()) << created.status();
    std::unique_ptr<DeviceWorker> worker = std::move(*created);
    std::mt19937 rng(in_place ? 7 : 8);
    std::vector<Tensor> tensors;
    tensors.push_back(MakeTensor(rng, DType::kFloat32, {1, 1024, 1}, {}));
    tensors.push_back(MakeTensor(rng, DType::kFloat16, {8, 4096, 1}, {1.0f, true}));
    tensors.push_back(MakeTensor(rng, DType::kBFloat16, {64, 32000, 1}, {0.7f, false}));
    tensors.push_back(MakeTensor(rng, DType::kFloat32, {2, 65536, 1}, {}));      // cluster rows
    tensors.push_back(MakeTensor(rng, DType::kFloat32, {1, 1 << 20, 1}, {}));    // split row
    tensors.push_back(MakeTensor(rng, DType::kFloat16, {3, 300000, 1}, {}));     // split rows
    tensors.push_back(MakeTensor(rng, DType::kFloat32, {3, 100, 37}, {0.5f, true}));
    tensors.push_back(MakeTensor(rng, DType::kBFloat16, {1, 4096, 5}, {}));
    tensors.push_back(MakeTensor(rng, DType::kFloat32, {2, 0, 4}, {}));
    for (int i = 0; i < 20; ++i) {
      const int64_t n = std::uniform_int_distribution<int64_t>(1, 20000)(rng);
      tensors.push_back(MakeTensor(rng, i % 2 ? DType::kFloat16 : DType::kFloat32,
                                   {1 + i % 4, n, 1}, {1.0f, i % 3 == 0}));
    }
    const std::vector<Tensor> originals = tensors;
    std::unique_ptr<Batch> batch = MakeBatch(tensors);
    ASSERT_LE(batch->bytes, options.zero_copy_max_bytes);
    if (in_place) {
      for (Segment& segment : batch->segments) segment.output = const_cast<void*>(segment.input);
    }
    BatchResult result = RunAndWait(*worker, std::move(batch));
    ASSERT_TRUE(result.status.ok()) << result.status;
    EXPECT_TRUE(result.segment_status.empty());
    EXPECT_GT(result.kernel_ns, 0);
    for (size_t i = 0; i < tensors.size(); ++i) {
      Tensor computed = originals[i];
      computed.output = in_place ? tensors[i].input : tensors[i].output;
      ExpectMatchesReference(computed);
    }
  }
}

// Small batches that find the device idle run on the submitting thread
// (their completion too); with inline_max_bytes = 0, or when too large, they
// are handed to a slot's thread. Many threads submitting small and large
// batches at once all get correct results, and the worker then shuts down;
// also with inline_when_busy, where submitters take any free slot.
TEST(DeviceWorkerTest, SmallBatchesRunOnTheSubmittingThreadWhenTheDeviceIsIdle) {
  SKIP_WITHOUT_GPU();
  struct Config {
    int64_t inline_max;
    bool when_busy;
  };
  // On (the default), off, on also while busy.
  for (const Config config : {Config{65536, false}, Config{0, false}, Config{65536, true}}) {
    const int64_t inline_max = config.inline_max;
    DeviceWorkerOptions options;
    options.max_staging_bytes = 8 << 20;
    options.zero_copy_max_bytes = kTestZeroCopyMaxBytes;
    options.inline_max_bytes = inline_max;
    options.inline_when_busy = config.when_busy;
    std::unique_ptr<DeviceWorker> worker = CreateWorker(options);
    ASSERT_NE(worker, nullptr);
    std::mt19937 rng(99);
    for (int64_t n : {int64_t{1000}, int64_t{100000}}) {  // 4 KB: inline; 400 KB: handed off
      std::vector<Tensor> one;
      one.push_back(MakeTensor(rng, DType::kFloat32, {1, n, 1}, {}));
      std::thread::id ran_on;
      std::promise<BatchResult> promise;
      worker->Submit(MakeBatch(one), [&](std::unique_ptr<Batch>, BatchResult result) {
        ran_on = std::this_thread::get_id();
        promise.set_value(std::move(result));
      });
      BatchResult result = promise.get_future().get();
      ASSERT_TRUE(result.status.ok()) << result.status;
      const bool expect_inline = inline_max > 0 && n == 1000;
      EXPECT_EQ(ran_on == std::this_thread::get_id(), expect_inline)
          << "inline_max_bytes=" << inline_max << " n=" << n;
      ExpectMatchesReference(one[0]);
    }
    // Concurrent submitters, small and large batches mixed.
    constexpr int kThreads = 8;
    constexpr int kPerThread = 40;
    std::vector<std::vector<Tensor>> tensors(kThreads * kPerThread);
    for (int i = 0; i < kThreads * kPerThread; ++i) {
      const int64_t n = i % 5 == 0 ? 70000 : std::uniform_int_distribution<int64_t>(1, 3000)(rng);
      const DType dtype = i % 2 == 0 ? DType::kFloat32 : DType::kBFloat16;
      tensors[i].push_back(MakeTensor(rng, dtype, {1 + i % 3, n, 1}, {1.0f, i % 4 == 0}));
    }
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int k = 0; k < kPerThread; ++k) {
          BatchResult r = RunAndWait(*worker, MakeBatch(tensors[t * kPerThread + k]));
          if (!r.status.ok()) failures.fetch_add(1);
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    EXPECT_EQ(failures.load(), 0);
    for (const auto& t : tensors) ExpectMatchesReference(t[0]);
    worker.reset();  // must not hang with slots lent and returned
  }
}

// Outputs lent to the responses (OutputView): requests that accept a view
// and are at least pinned_response_min_bytes keep their output in pinned
// memory, both on the zero-copy path and after the D2H copy, and their own
// output buffers are left untouched; smaller ones are copied as before. The
// lent bytes stay within pinned_responses_max_bytes (beyond it, outputs are
// copied), a batch cut into pieces lends nothing, and released views give
// their pinned memory back.
TEST(DeviceWorkerTest, LentOutputsMatchReferenceWithinTheirBoundAndGoBackWhenReleased) {
  SKIP_WITHOUT_GPU();
  DeviceWorkerOptions options;
  options.max_staging_bytes = 16 << 20;
  options.zero_copy_max_bytes = kTestZeroCopyMaxBytes;
  options.pinned_response_min_bytes = 16 << 10;
  options.pinned_responses_max_bytes = 6 << 20;
  auto created = DeviceWorker::Create(options, [](const absl::Status& status) {
    ADD_FAILURE() << "unexpected GPU fault: " << status;
  });
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<DeviceWorker> worker = std::move(*created);
  std::mt19937 rng(31);

  // Runs `tensors` with views accepted; checks every output (from its view
  // or its buffer) and returns the result, views still held.
  auto run = [&](std::vector<Tensor>& tensors, bool in_place) {
    const std::vector<Tensor> originals = tensors;
    std::unique_ptr<Batch> batch = MakeBatch(tensors);
    for (Segment& segment : batch->segments) {
      segment.output_view_ok = true;
      if (in_place) segment.output = const_cast<void*>(segment.input);
    }
    BatchResult result = RunAndWait(*worker, std::move(batch));
    EXPECT_TRUE(result.status.ok()) << result.status;
    for (size_t i = 0; i < tensors.size(); ++i) {
      Tensor computed = originals[i];
      const bool lent = !result.output_views.empty() && result.output_views[i].data != nullptr;
      if (lent) {
        EXPECT_EQ(result.output_views[i].bytes, static_cast<int64_t>(computed.input.size()));
        computed.output.assign(result.output_views[i].data,
                               static_cast<size_t>(result.output_views[i].bytes));
        // Not copied back: the request's own buffer is as it was.
        const std::string& own = in_place ? tensors[i].input : tensors[i].output;
        EXPECT_EQ(own, in_place ? originals[i].input : originals[i].output) << "segment " << i;
      } else {
        computed.output = in_place ? tensors[i].input : tensors[i].output;
      }
      ExpectMatchesReference(computed);
    }
    return result;
  };
  auto lent_count = [](const BatchResult& result) {
    int count = 0;
    for (const OutputView& view : result.output_views) count += view.data != nullptr;
    return count;
  };

  const int64_t pinned_before = worker->Memory()[1].in_use_bytes;
  for (const bool in_place : {false, true}) {
    // Zero copy (under 256 KiB): 4 KiB is copied, 64 KiB and 96 KiB are lent.
    std::vector<Tensor> small;
    small.push_back(MakeTensor(rng, DType::kFloat32, {1, 1024, 1}, {}));
    small.push_back(MakeTensor(rng, DType::kFloat16, {8, 4096, 1}, {1.0f, true}));
    small.push_back(MakeTensor(rng, DType::kFloat32, {3, 8192, 1}, {}));
    BatchResult result = run(small, in_place);
    ASSERT_EQ(result.output_views.size(), 3u);
    EXPECT_EQ(result.output_views[0].data, nullptr);
    EXPECT_NE(result.output_views[1].data, nullptr);
    EXPECT_NE(result.output_views[2].data, nullptr);
    // With copies (4 MiB): lent; a second 4 MiB batch while the first one's
    // views are held would pass the 6 MiB bound, so it is copied.
    std::vector<Tensor> large;
    large.push_back(MakeTensor(rng, DType::kBFloat16, {64, 32000, 1}, {0.7f, false}));
    BatchResult first = run(large, in_place);
    EXPECT_EQ(lent_count(first), 1);
    std::vector<Tensor> large2;
    large2.push_back(MakeTensor(rng, DType::kBFloat16, {64, 32000, 1}, {}));
    BatchResult second = run(large2, in_place);
    EXPECT_EQ(lent_count(second), 0);
    first.output_views.clear();  // released: room again
    std::vector<Tensor> large3;
    large3.push_back(MakeTensor(rng, DType::kFloat32, {16, 32000, 1}, {}));
    BatchResult third = run(large3, in_place);
    EXPECT_EQ(lent_count(third), 1);
  }
  // Every view is gone (the results above went out of scope): the pinned
  // memory in use is the slots' staging again.
  EXPECT_EQ(worker->Memory()[1].memory, "pinned");
  EXPECT_EQ(worker->Memory()[1].in_use_bytes, pinned_before);

  // A request larger than the staging is cut into pieces: nothing lent,
  // while one that fits is.
  options.max_staging_bytes = 1 << 20;
  options.zero_copy_max_bytes = kTestZeroCopyMaxBytes;
  options.pinned_responses_max_bytes = 1 << 30;
  created = DeviceWorker::Create(options, [](const absl::Status& status) {
    ADD_FAILURE() << "unexpected GPU fault: " << status;
  });
  ASSERT_TRUE(created.ok()) << created.status();
  worker = std::move(*created);
  std::vector<Tensor> cut;
  cut.push_back(MakeTensor(rng, DType::kFloat32, {2, 1 << 18, 1}, {}));  // 2 x 1 MiB
  EXPECT_EQ(lent_count(run(cut, false)), 0);
  std::vector<Tensor> whole;
  whole.push_back(MakeTensor(rng, DType::kFloat32, {2, 1 << 16, 1}, {}));  // 512 KiB
  EXPECT_EQ(lent_count(run(whole, false)), 1);
}

// A slot's thread answers its batch's requests in the done callback with
// its slot already free. A batch submitted meanwhile goes to a thread that
// waits, not to that one (which would take it only once its callback ends):
// here the first batch's callback blocks until the second batch is done.
TEST(DeviceWorkerTest, ABatchSubmittedDuringAnotherBatchsCallbackRunsOnAWaitingSlot) {
  SKIP_WITHOUT_GPU();
  auto worker = MakeWorker(16 << 20);
  ASSERT_NE(worker, nullptr);
  std::mt19937 rng(41);
  for (int round = 0; round < 5; ++round) {
    std::vector<Tensor> first = {MakeTensor(rng, DType::kFloat32, {2, 1024, 1}, {})};
    std::vector<Tensor> second = {MakeTensor(rng, DType::kFloat16, {8, 4096, 1}, {})};
    std::promise<void> in_callback;
    std::promise<BatchResult> second_done;
    std::future<BatchResult> second_result = second_done.get_future();
    std::atomic<bool> second_finished_in_time{false};
    std::promise<void> first_done;
    worker->Submit(MakeBatch(first), [&](std::unique_ptr<Batch>, BatchResult result) {
      EXPECT_TRUE(result.status.ok()) << result.status;
      in_callback.set_value();
      // Held here until the second batch is answered, or 10 s.
      second_finished_in_time =
          second_result.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
      first_done.set_value();
    });
    in_callback.get_future().wait();
    worker->Submit(MakeBatch(second), [&](std::unique_ptr<Batch>, BatchResult result) {
      second_done.set_value(std::move(result));
    });
    first_done.get_future().wait();
    EXPECT_TRUE(second_finished_in_time.load()) << "round " << round;
    BatchResult result = second_result.get();
    ASSERT_TRUE(result.status.ok()) << result.status;
    ExpectMatchesReference(first[0]);
    ExpectMatchesReference(second[0]);
  }
}

// A batch stamped at its submit (as the batcher does) reports how long it
// waited for a stream's thread; and with idle_spin_us the threads poll for
// the next batch after one instead of sleeping: batches submitted back to
// back, from one thread and from several, all complete and match the
// reference, and the worker stops while its threads poll.
TEST(DeviceWorkerTest, IdleThreadsPollForTheNextBatchAndBatchesReportTheirDispatch) {
  SKIP_WITHOUT_GPU();
  struct Config {
    int64_t idle_spin_us;
    int idle_spin_threads;
  };
  for (const Config config : {Config{0, 1}, Config{2000000, 1}, Config{2000000, 3}}) {
    const int64_t idle_spin_us = config.idle_spin_us;
    DeviceWorkerOptions options;
    options.max_staging_bytes = 8 << 20;
    options.zero_copy_max_bytes = kTestZeroCopyMaxBytes;
    options.idle_spin_us = idle_spin_us;
    options.idle_spin_threads = config.idle_spin_threads;
    std::unique_ptr<DeviceWorker> worker = CreateWorker(options);
    ASSERT_NE(worker, nullptr);
    EXPECT_EQ(worker->Describe().find("idle-spin=") != std::string::npos, idle_spin_us > 0);
    std::mt19937 rng(7);
    for (int i = 0; i < 20; ++i) {
      std::vector<Tensor> one = {MakeTensor(rng, DType::kFloat32, {1 + i % 4, 1024, 1}, {})};
      std::unique_ptr<Batch> batch = MakeBatch(one);
      batch->submitted = std::chrono::steady_clock::now();
      const BatchResult result = RunAndWait(*worker, std::move(batch));
      ASSERT_TRUE(result.status.ok()) << result.status;
      EXPECT_GT(result.dispatch_ns, 0) << i;
      EXPECT_GT(result.kernel_ns, 0) << i;
      EXPECT_LT(result.kernel_ns, result.compute_ns) << i;
      ExpectMatchesReference(one[0]);
    }
    // Unstamped: nothing to report.
    std::vector<Tensor> unstamped = {MakeTensor(rng, DType::kFloat16, {2, 512, 1}, {})};
    EXPECT_EQ(RunAndWait(*worker, MakeBatch(unstamped)).dispatch_ns, 0);
    // More submitters than slots: a batch left to a polling thread must not
    // be lost while the others sleep.
    constexpr int kThreads = 6;
    constexpr int kPerThread = 30;
    std::vector<std::vector<Tensor>> tensors(kThreads * kPerThread);
    for (int i = 0; i < kThreads * kPerThread; ++i) {
      const int64_t n = std::uniform_int_distribution<int64_t>(1, 5000)(rng);
      tensors[i].push_back(MakeTensor(rng, i % 2 ? DType::kBFloat16 : DType::kFloat32,
                                      {1 + i % 3, n, 1}, {}));
    }
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int k = 0; k < kPerThread; ++k) {
          std::promise<BatchResult> promise;
          std::future<BatchResult> future = promise.get_future();
          worker->Submit(MakeBatch(tensors[t * kPerThread + k]),
                         [&promise](std::unique_ptr<Batch>, BatchResult result) {
                           promise.set_value(std::move(result));
                         });
          if (future.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
            failures.fetch_add(1);
            ADD_FAILURE() << "a batch was not run within 20 s";
            std::abort();  // the worker would hang at its destruction
          }
          if (!future.get().status.ok()) failures.fetch_add(1);
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    EXPECT_EQ(failures.load(), 0);
    for (const auto& t : tensors) ExpectMatchesReference(t[0]);
    // Stops while a thread polls (for up to 2 s): it sees the stop at once.
    const auto stop_start = std::chrono::steady_clock::now();
    worker.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - stop_start, std::chrono::milliseconds(1500));
  }
}

// Inputs staged in pinned memory as requests are admitted (StageInput) are
// read where they are (by the kernels on the zero-copy path, by their own
// H2D copy otherwise, also when cut into pieces) and, when their output is
// not lent, computed in place there. Mixed with inputs that are packed.
TEST(DeviceWorkerTest, StagedInputsAreReadWhereTheyAreAndComputedInPlaceWhenNotLent) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(43);
  struct Case {
    int64_t max_staging_bytes;
    std::vector<std::pair<SoftmaxShape, DType>> shapes;
  };
  const std::vector<Case> cases = {
      // Zero copy (under 256 KiB): 4 KiB is below the staging size.
      {16 << 20, {{{1, 1024, 1}, DType::kFloat32}, {{8, 4096, 1}, DType::kFloat16},
                  {{3, 8192, 1}, DType::kFloat32}, {{2, 100, 37}, DType::kBFloat16}}},
      // With copies: 4 MB and 192 KiB staged, 30 KB packed between them.
      {16 << 20, {{{64, 32000, 1}, DType::kBFloat16}, {{3, 5000, 1}, DType::kFloat16},
                  {{6, 8192, 1}, DType::kFloat32}}},
      // Cut into pieces through 1 MiB of staging: 2 MiB staged, 8 pieces.
      {1 << 20, {{{8, 1 << 16, 1}, DType::kFloat32}, {{1, 2000, 1}, DType::kFloat32}}},
  };
  for (const bool lend : {true, false}) {
    for (const Case& c : cases) {
      std::vector<Tensor> tensors;
      for (const auto& [shape, dtype] : c.shapes) {
        tensors.push_back(MakeTensor(rng, dtype, shape, {0.8f, tensors.size() % 2 == 1}));
      }
      // Every tensor of 16 KiB or more but the second is staged.
      std::vector<bool> stage(tensors.size());
      int64_t staged_bytes = 0;
      for (size_t i = 0; i < tensors.size(); ++i) {
        stage[i] = i != 1 && tensors[i].input.size() >= (16 << 10);
        if (stage[i]) staged_bytes += static_cast<int64_t>(tensors[i].input.size());
      }
      DeviceWorkerOptions options;
      options.max_staging_bytes = c.max_staging_bytes;
      options.zero_copy_max_bytes = kTestZeroCopyMaxBytes;
      options.pinned_response_min_bytes = 16 << 10;
      // Without lending, room for the staged inputs and nothing more.
      options.pinned_responses_max_bytes = lend ? int64_t{1} << 30 : staged_bytes;
      auto created = DeviceWorker::Create(options, [](const absl::Status& status) {
        ADD_FAILURE() << "unexpected GPU fault: " << status;
      });
      ASSERT_TRUE(created.ok()) << created.status();
      std::unique_ptr<DeviceWorker> worker = std::move(*created);

      std::unique_ptr<Batch> batch = MakeBatch(tensors);
      for (size_t i = 0; i < tensors.size(); ++i) {
        Segment& segment = batch->segments[i];
        segment.output_view_ok = true;
        if (!stage[i]) continue;
        ASSERT_TRUE(worker->StageInput(segment)) << i;
        ASSERT_NE(segment.staged, nullptr);
        ASSERT_EQ(std::memcmp(segment.input, tensors[i].input.data(), tensors[i].input.size()), 0);
        segment.output = const_cast<void*>(segment.input);  // as the batcher does
      }
      const std::vector<Segment> segments = batch->segments;  // keeps the staged buffers
      BatchResult result = RunAndWait(*worker, std::move(batch));
      ASSERT_TRUE(result.status.ok()) << result.status;
      EXPECT_TRUE(result.segment_status.empty());
      for (size_t i = 0; i < tensors.size(); ++i) {
        Tensor computed = tensors[i];
        const bool viewed = !result.output_views.empty() && result.output_views[i].data != nullptr;
        if (viewed) {
          computed.output.assign(result.output_views[i].data,
                                 static_cast<size_t>(result.output_views[i].bytes));
        } else if (stage[i]) {
          computed.output.assign(static_cast<const char*>(segments[i].output),
                                 tensors[i].input.size());
        }
        if (!lend) {
          EXPECT_FALSE(viewed) << i;
        }
        ExpectMatchesReference(computed);
      }
    }
  }
}

}  // namespace
}  // namespace softmax::server
