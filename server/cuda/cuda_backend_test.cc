// GPU tests of the CudaBackend: ragged mixed batches, pieces cut through a
// small staging limit, in place, zero copy, out of memory, lent outputs,
// staged inputs, shared-memory segments read and written in place, the fused
// top K beside whole outputs, a sticky fault, batches on every slot at once, and the
// backend under the scheduler and the batcher. Skipped without a GPU.
#include "server/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu_softmax.h"
#include "kernels/dtype.h"
#include "kernels/top_k_testing.h"
#include "server/scheduling/batcher.h"
#include "server/scheduling/scheduler.h"
#include "server/testing/test_backends.h"

namespace softmax::server {
namespace {

using Tensor = testing::TestTensor;
using testing::MakeBatch;

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: CudaBackend tests need a GPU"

double Rtol(DType dtype) { return ReferenceRelativeTolerance(dtype); }

// The tests were written for batches beyond 256 KiB taking the DMA copies
// (the default once); they keep that, so both paths stay covered.
constexpr int64_t kTestZeroCopyMaxBytes = int64_t{256} << 10;

// A tensor of normal(0, 3) values; its output poisoned (NaN in every dtype).
Tensor MakeTensor(std::mt19937& rng, DType dtype, SoftmaxShape shape, SoftmaxOptions options) {
  return testing::RandomTensor(rng, dtype, shape, options);
}

// Runs `batch` on `slot` from this thread, as the scheduler's thread of that
// slot does.
BatchResult RunAndWait(CudaBackend& worker, Batch batch, int slot = 0) {
  return testing::RunOnSlot(worker, batch, slot);
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
std::unique_ptr<CudaBackend> CreateWorker(const CudaBackendOptions& options) {
  absl::StatusOr<std::unique_ptr<CudaBackend>> worker =
      CudaBackend::Create(options, [](const absl::Status& status) {
        ADD_FAILURE() << "unexpected GPU fault: " << status;
      });
  EXPECT_TRUE(worker.ok()) << worker.status();
  return worker.ok() ? std::move(*worker) : nullptr;
}

std::unique_ptr<CudaBackend> MakeWorker(int64_t max_staging_bytes,
                                        int64_t memory_limit_bytes = 0) {
  CudaBackendOptions options;
  options.max_staging_bytes = max_staging_bytes;
  options.zero_copy_max_bytes = kTestZeroCopyMaxBytes;
  options.memory_limit_bytes = memory_limit_bytes;
  return CreateWorker(options);
}

TEST(CudaBackendTest, RaggedMixedBatchMatchesReference) {
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

// Expects each of `tensors`' top K (where top_k[i].k > 0) to be the
// reference's (kernels/top_k_testing.h): its indices exactly, its values
// within tolerance. `inputs` are the inputs as they were before compute.
void ExpectTopKMatchesReference(const std::vector<Tensor>& tensors,
                                const std::vector<std::string>& inputs,
                                const std::vector<testing::TestTopK>& top_k) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (top_k[i].k == 0) continue;
    const Tensor& t = tensors[i];
    EXPECT_EQ(softmax::testing::CheckTopK(inputs[i].data(), t.dtype, t.shape, t.options,
                                          top_k[i].k, top_k[i].values.data(),
                                          top_k[i].indices.data()),
              "")
        << "segment " << i << ": " << DTypeName(t.dtype) << " [" << t.shape.outer << ","
        << t.shape.n << "," << t.shape.inner << "] k " << top_k[i].k;
  }
}

TEST(CudaBackendTest, TopKBesideWholeOutputsOnEveryPathAndTheSameAloneAsBatched) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(66);
  // Zero copy (small batches), with copies (past 256 KiB), through staging
  // of 1 MiB (runs split; a segment larger than it gets staging of its own).
  for (const int64_t max_staging_bytes : {int64_t{64} << 20, int64_t{1} << 20}) {
    for (const bool small : {true, false}) {
      auto worker = MakeWorker(max_staging_bytes);
      ASSERT_NE(worker, nullptr);
      std::vector<Tensor> tensors;
      std::vector<int64_t> ks;
      std::vector<bool> full;
      auto add = [&](DType dtype, SoftmaxShape shape, SoftmaxOptions options, int64_t k,
                     bool full_output) {
        tensors.push_back(MakeTensor(rng, dtype, shape, options));
        ks.push_back(std::min(k, shape.n));
        full.push_back(full_output);
      };
      add(DType::kBFloat16, {small ? 2 : 64, 32000, 1}, {}, 5, false);
      add(DType::kFloat16, {3, small ? 40 : 4096, 7}, {0.5f, true}, 64, true);
      add(DType::kFloat32, {5, 1000, 1}, {2.0f, false}, 0, true);  // plain softmax
      add(DType::kFloat32, {small ? 1 : 2, small ? 33 : (1 << 20), 1}, {}, 64, false);
      add(DType::kBFloat16, {9, 64, 1}, {1.0f, true}, 64, false);  // K == n
      add(DType::kFloat16, {1, small ? 8192 : 131072, 1}, {}, 1, true);
      add(DType::kBFloat16, {2, 0, 4}, {}, 0, true);  // empty
      add(DType::kFloat32, {3, 500, 2}, {}, 100, true);  // past the fused K: on the host
      std::vector<std::string> inputs;
      for (const Tensor& t : tensors) inputs.push_back(t.input);
      Batch batch = MakeBatch(tensors);
      std::vector<testing::TestTopK> top_k(tensors.size());
      for (size_t i = 0; i < tensors.size(); ++i) {
        if (ks[i] > 0) testing::AskTopK(tensors[i], ks[i], full[i], &top_k[i], &batch.segments[i]);
      }
      // Computed in place: the ranking reads the input before the output.
      batch.segments[1].output = tensors[1].input.data();
      BatchResult result = RunAndWait(*worker, std::move(batch));
      ASSERT_TRUE(result.status.ok()) << result.status;
      EXPECT_TRUE(result.segment_status.empty());
      ExpectTopKMatchesReference(tensors, inputs, top_k);
      for (size_t i = 0; i < tensors.size(); ++i) {
        Tensor t = tensors[i];
        if (i == 1) {
          t.output = t.input;
          t.input = inputs[i];
        }
        if (full[i]) {
          ExpectMatchesReference(t);
        } else {  // no whole output where none was asked for
          EXPECT_EQ(t.output, std::string(t.input.size(), '\xff')) << "segment " << i;
        }
      }
      // Each top K alone gives the same bits as inside the batch.
      for (size_t i = 0; i < tensors.size(); ++i) {
        if (ks[i] == 0) continue;
        std::vector<Tensor> alone{tensors[i]};
        alone[0].input = inputs[i];
        Batch one = MakeBatch(alone);
        testing::TestTopK mine;
        testing::AskTopK(alone[0], ks[i], false, &mine, &one.segments[0]);
        BatchResult single = RunAndWait(*worker, std::move(one));
        ASSERT_TRUE(single.status.ok()) << single.status;
        EXPECT_EQ(mine.values, top_k[i].values) << "segment " << i;
        EXPECT_EQ(mine.indices, top_k[i].indices) << "segment " << i;
      }
    }
  }
}

TEST(CudaBackendTest, StagedTopKInputsAreReadWhereTheyAre) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(67);
  CudaBackendOptions options;
  options.zero_copy_max_bytes = kTestZeroCopyMaxBytes;
  options.pinned_response_min_bytes = 16 << 10;
  auto worker = CreateWorker(options);
  ASSERT_NE(worker, nullptr);
  // 4 MiB staged (copied to the device), 64 KiB staged, 1 KiB packed.
  std::vector<Tensor> tensors;
  tensors.push_back(MakeTensor(rng, DType::kBFloat16, {64, 32000, 1}, {}));
  tensors.push_back(MakeTensor(rng, DType::kFloat32, {4, 4096, 1}, {1.0f, true}));
  tensors.push_back(MakeTensor(rng, DType::kFloat16, {1, 512, 1}, {}));
  std::vector<std::string> inputs;
  for (const Tensor& t : tensors) inputs.push_back(t.input);
  for (const bool zero_copy : {false, true}) {
    Batch batch = MakeBatch(tensors);
    std::vector<testing::TestTopK> top_k(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      Segment& segment = batch.segments[i];
      segment.output_view_ok = true;
      if (i < 2 && (!zero_copy || i == 1)) {
        ASSERT_TRUE(worker->StageInput(segment)) << i;
      }
      testing::AskTopK(tensors[i], 8, false, &top_k[i], &segment);
    }
    // Without the 4 MiB tensor the batch is read over the bus.
    if (zero_copy) {
      batch.segments.erase(batch.segments.begin());
      top_k[0].k = 0;  // not run
    }
    BatchResult result = RunAndWait(*worker, std::move(batch));
    ASSERT_TRUE(result.status.ok()) << result.status;
    ExpectTopKMatchesReference(tensors, inputs, top_k);
    EXPECT_TRUE(result.output_views.empty());
  }
}

TEST(CudaBackendTest, LargeTensorIsCutIntoPiecesThroughSmallStaging) {
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

TEST(CudaBackendTest, InPlaceSegmentsMatchReferenceAlsoWhenCutIntoPieces) {
  SKIP_WITHOUT_GPU();
  // The batcher hands a request's input buffer back as its output when
  // every backend computes in place: each segment's output is its input.
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
    EXPECT_TRUE(worker->ComputesInPlace());
    Batch batch = MakeBatch(tensors);
    for (Segment& segment : batch.segments) segment.output = const_cast<void*>(segment.input);
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

TEST(CudaBackendTest, NoAllocationsAfterWarmUpAndPipelinedBatches) {
  SKIP_WITHOUT_GPU();
  auto worker = MakeWorker(64 << 20);
  ASSERT_NE(worker, nullptr);
  std::mt19937 rng(5);
  // `batches` batches spread over the slots, every slot running its share on
  // a thread of its own (as the scheduler runs them): all in flight at once.
  const int slots = worker->Slots();
  ASSERT_EQ(slots, kCudaStreams);
  auto round = [&](int batches) {
    std::vector<std::vector<Tensor>> all(batches);
    for (int b = 0; b < batches; ++b) {
      for (int i = 0; i < 16; ++i) {
        all[b].push_back(MakeTensor(rng, DType::kFloat32, {4, 4096, 1}, {}));
      }
    }
    std::vector<BatchResult> results(batches);
    std::vector<std::thread> threads;
    for (int slot = 0; slot < slots; ++slot) {
      threads.emplace_back([&, slot] {
        for (int b = slot; b < batches; b += slots) {
          results[b] = RunAndWait(*worker, MakeBatch(all[b]), slot);
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (int b = 0; b < batches; ++b) {
      ASSERT_TRUE(results[b].status.ok()) << results[b].status;
      for (const Tensor& t : all[b]) ExpectMatchesReference(t);
    }
  };
  round(2 * slots);  // warm-up: fills the caches
  std::vector<MemoryStats> warm = worker->Memory();
  round(4 * slots);
  std::vector<MemoryStats> after = worker->Memory();
  ASSERT_EQ(warm.size(), 2u);
  for (size_t i = 0; i < warm.size(); ++i) {
    // Normal batches run in the slots' own staging: no CUDA allocations at all.
    EXPECT_EQ(after[i].raw_allocations, warm[i].raw_allocations) << after[i].memory;
    // Only the slots' own staging stays in use between batches.
    EXPECT_EQ(after[i].in_use_bytes, warm[i].in_use_bytes) << after[i].memory;
  }
}

TEST(CudaBackendTest, OutOfMemoryFailsOnlyTheRequestThatDoesNotFit) {
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
// tensor; separate outputs and in place (as the batcher lays them out when
// every backend computes in place).
// Below 256 KiB the other tests' small batches cover it too.
TEST(CudaBackendTest, ZeroCopyBatchesMatchReferenceOnEveryKernelPath) {
  SKIP_WITHOUT_GPU();
  for (const bool in_place : {false, true}) {
    CudaBackendOptions options;
    options.max_staging_bytes = 96 << 20;  // the outputs go right behind the inputs
    options.zero_copy_max_bytes = 48 << 20;
    auto created = CudaBackend::Create(options, [](const absl::Status& status) {
      ADD_FAILURE() << "unexpected GPU fault: " << status;
    });
    ASSERT_TRUE(created.ok()) << created.status();
    std::unique_ptr<CudaBackend> worker = std::move(*created);
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
    Batch batch = MakeBatch(tensors);
    ASSERT_LE(batch.bytes, options.zero_copy_max_bytes);
    if (in_place) {
      for (Segment& segment : batch.segments) segment.output = const_cast<void*>(segment.input);
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

// Outputs lent to the responses (OutputView): requests that accept a view
// and are at least pinned_response_min_bytes keep their output in pinned
// memory, both on the zero-copy path and after the D2H copy, and their own
// output buffers are left untouched; smaller ones are copied as before. The
// lent bytes stay within pinned_responses_max_bytes (beyond it, outputs are
// copied), a batch cut into pieces lends nothing, and released views give
// their pinned memory back.
// Where a direct segment's two ends live, for the test below.
enum class End { kHost, kMapped, kDevice };

// The memory one end of a direct segment uses: a copy of `bytes` (or
// room for them) in mapped pinned host memory or device memory.
class EndBuffer {
 public:
  EndBuffer(End end, const std::string& bytes) : end_(end), size_(bytes.size()) {
    if (end == End::kMapped) {
      EXPECT_EQ(cudaHostAlloc(&data_, size_, cudaHostAllocPortable | cudaHostAllocMapped),
                cudaSuccess);
      std::memcpy(data_, bytes.data(), size_);
    } else if (end == End::kDevice) {
      EXPECT_EQ(cudaMalloc(&data_, size_), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(data_, bytes.data(), size_, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~EndBuffer() {
    if (end_ == End::kMapped) cudaFreeHost(data_);
    if (end_ == End::kDevice) cudaFree(data_);
  }
  void* data() const { return data_; }
  MemoryKind memory() const {
    return end_ == End::kMapped   ? MemoryKind::kMappedHost
           : end_ == End::kDevice ? MemoryKind::kDevice
                                  : MemoryKind::kHost;
  }
  // Copies the end's bytes back into `out`.
  void CopyTo(std::string* out) const {
    if (end_ == End::kMapped) std::memcpy(out->data(), data_, size_);
    if (end_ == End::kDevice) cudaMemcpy(out->data(), data_, size_, cudaMemcpyDeviceToHost);
  }

 private:
  End end_;
  size_t size_;
  void* data_ = nullptr;
};

// Shared-memory segments: inputs and outputs in device memory or mapped
// host memory are read and written where they are, beside ordinary segments
// in one batch, through the copies and over the bus alike, and a direct
// segment larger than the staging is computed whole.
TEST(CudaBackendTest, DirectSegmentsComputeInTheirOwnMemoryBesideStagedOnes) {
  SKIP_WITHOUT_GPU();
  auto worker = MakeWorker(1 << 20);
  ASSERT_NE(worker, nullptr);
  std::mt19937 rng(77);
  const std::pair<End, End> ends[] = {
      {End::kHost, End::kHost},     {End::kDevice, End::kDevice}, {End::kMapped, End::kMapped},
      {End::kDevice, End::kHost},   {End::kHost, End::kMapped},   {End::kMapped, End::kDevice},
      {End::kDevice, End::kDevice},  // 4 MiB: beyond the 1 MiB staging
  };
  for (const int64_t zero_copy_rows : {int64_t{0}, int64_t{1}}) {
    std::vector<Tensor> tensors;
    const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
    for (size_t i = 0; i < std::size(ends); ++i) {
      const bool big = i + 1 == std::size(ends) && zero_copy_rows == 0;
      const SoftmaxShape shape = big ? SoftmaxShape{256, 4096, 1}
                                     : SoftmaxShape{zero_copy_rows ? 2 : 40, 3000, 1};
      tensors.push_back(MakeTensor(rng, big ? DType::kFloat32 : dtypes[i % 3], shape,
                                   {1.0f, i % 2 == 1}));
    }
    Batch batch = MakeBatch(tensors);
    std::vector<std::unique_ptr<EndBuffer>> inputs, outputs;
    for (size_t i = 0; i < std::size(ends); ++i) {
      inputs.push_back(std::make_unique<EndBuffer>(ends[i].first, tensors[i].input));
      outputs.push_back(std::make_unique<EndBuffer>(ends[i].second, tensors[i].output));
      Segment& segment = batch.segments[i];
      if (ends[i].first != End::kHost) segment.input = inputs[i]->data();
      if (ends[i].second != End::kHost) segment.output = outputs[i]->data();
      segment.input_memory = inputs[i]->memory();
      segment.output_memory = outputs[i]->memory();
      segment.input_device = segment.output_device = 0;
    }
    BatchResult result = RunAndWait(*worker, std::move(batch));
    ASSERT_TRUE(result.status.ok()) << result.status;
    EXPECT_TRUE(result.segment_status.empty());
    for (size_t i = 0; i < std::size(ends); ++i) {
      outputs[i]->CopyTo(&tensors[i].output);
      SCOPED_TRACE(::testing::Message() << "segment " << i << " zero copy " << zero_copy_rows);
      ExpectMatchesReference(tensors[i]);
    }
  }
}

TEST(CudaBackendTest, ADeviceTheGpuCannotReachFailsOnlyItsSegment) {
  SKIP_WITHOUT_GPU();
  auto worker = MakeWorker(64 << 20);
  ASSERT_NE(worker, nullptr);
  std::mt19937 rng(5);
  std::vector<Tensor> tensors = {MakeTensor(rng, DType::kFloat32, {4, 1000, 1}, {}),
                                 MakeTensor(rng, DType::kFloat32, {4, 1000, 1}, {})};
  Batch batch = MakeBatch(tensors);
  // Claimed to live on a GPU that does not exist: never touched.
  batch.segments[1].input_memory = MemoryKind::kDevice;
  batch.segments[1].input_device = 97;
  BatchResult result = RunAndWait(*worker, std::move(batch));
  ASSERT_EQ(result.segment_status.size(), 2u);
  EXPECT_TRUE(result.segment_status[0].ok());
  EXPECT_EQ(result.segment_status[1].code(), absl::StatusCode::kFailedPrecondition);
  ExpectMatchesReference(tensors[0]);
}

TEST(CudaBackendTest, LentOutputsMatchReferenceWithinTheirBoundAndGoBackWhenReleased) {
  SKIP_WITHOUT_GPU();
  CudaBackendOptions options;
  options.max_staging_bytes = 16 << 20;
  options.zero_copy_max_bytes = kTestZeroCopyMaxBytes;
  options.pinned_response_min_bytes = 16 << 10;
  options.pinned_responses_max_bytes = 6 << 20;
  auto created = CudaBackend::Create(options, [](const absl::Status& status) {
    ADD_FAILURE() << "unexpected GPU fault: " << status;
  });
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<CudaBackend> worker = std::move(*created);
  std::mt19937 rng(31);

  // Runs `tensors` with views accepted; checks every output (from its view
  // or its buffer) and returns the result, views still held.
  auto run = [&](std::vector<Tensor>& tensors, bool in_place) {
    const std::vector<Tensor> originals = tensors;
    Batch batch = MakeBatch(tensors);
    for (Segment& segment : batch.segments) {
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
  created = CudaBackend::Create(options, [](const absl::Status& status) {
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

// Inputs staged in pinned memory as requests are admitted (StageInput) are
// read where they are (by the kernels on the zero-copy path, by their own
// H2D copy otherwise, also when cut into pieces) and, when their output is
// not lent, computed in place there. Mixed with inputs that are packed.
TEST(CudaBackendTest, StagedInputsAreReadWhereTheyAreAndComputedInPlaceWhenNotLent) {
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
      CudaBackendOptions options;
      options.max_staging_bytes = c.max_staging_bytes;
      options.zero_copy_max_bytes = kTestZeroCopyMaxBytes;
      options.pinned_response_min_bytes = 16 << 10;
      // Without lending, room for the staged inputs and nothing more.
      options.pinned_responses_max_bytes = lend ? int64_t{1} << 30 : staged_bytes;
      auto created = CudaBackend::Create(options, [](const absl::Status& status) {
        ADD_FAILURE() << "unexpected GPU fault: " << status;
      });
      ASSERT_TRUE(created.ok()) << created.status();
      std::unique_ptr<CudaBackend> worker = std::move(*created);

      Batch batch = MakeBatch(tensors);
      for (size_t i = 0; i < tensors.size(); ++i) {
        Segment& segment = batch.segments[i];
        segment.output_view_ok = true;
        if (!stage[i]) continue;
        ASSERT_TRUE(worker->StageInput(segment)) << i;
        ASSERT_NE(segment.staged, nullptr);
        ASSERT_EQ(std::memcmp(segment.input, tensors[i].input.data(), tensors[i].input.size()), 0);
        segment.output = const_cast<void*>(segment.input);  // as the batcher does
      }
      const std::vector<Segment> segments = batch.segments;  // keeps the staged buffers
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

// What the scheduler and the metrics read of it; and a batch stamped when it
// became ready (as the batcher does) reports how long it waited for its
// slot's thread, with every way of waiting for the GPU: polling the event
// for event_spin_us then sleeping on it, sleeping at once (0), or spinning
// in cudaEventSynchronize (negative).
TEST(CudaBackendTest, BatchesReportTheirDispatchAndKernelTimeWithEveryEventWait) {
  SKIP_WITHOUT_GPU();
  for (const int64_t spin_us : {kEventSpinUs, int64_t{0}, int64_t{-1}}) {
    SCOPED_TRACE(::testing::Message() << "event_spin_us " << spin_us);
    CudaBackendOptions options;
    options.slots = 2;
    options.max_staging_bytes = 8 << 20;
    options.zero_copy_max_bytes = kTestZeroCopyMaxBytes;
    options.event_spin_us = spin_us;
    std::unique_ptr<CudaBackend> worker = CreateWorker(options);
    ASSERT_NE(worker, nullptr);
    EXPECT_EQ(worker->Name(), "cuda:0");
    EXPECT_EQ(worker->Slots(), 2);
    EXPECT_TRUE(worker->ComputesInPlace());
    EXPECT_NE(worker->Describe().find("streams=2"), std::string::npos) << worker->Describe();
    EXPECT_GT(worker->Device().multiprocessors, 0);
    std::mt19937 rng(7);
    for (int i = 0; i < 20; ++i) {
      // Small (zero copy) and larger (DMA copies) batches, on both slots.
      const int64_t n = i % 4 == 3 ? 100000 : 1024;
      std::vector<Tensor> one = {MakeTensor(rng, DType::kFloat32, {1 + i % 4, n, 1}, {})};
      Batch batch = MakeBatch(one);
      batch.submitted = std::chrono::steady_clock::now();
      const BatchResult result = RunAndWait(*worker, std::move(batch), i % 2);
      ASSERT_TRUE(result.status.ok()) << result.status;
      EXPECT_GT(result.dispatch_ns, 0) << i;
      EXPECT_GT(result.kernel_ns, 0) << i;
      EXPECT_LT(result.kernel_ns, result.compute_ns) << i;
      EXPECT_GE(result.launches, 1) << i;
      EXPECT_EQ(result.kernel_bytes, 2 * static_cast<int64_t>(one[0].input.size())) << i;
      ExpectMatchesReference(one[0]);
    }
    // Unstamped: nothing to report.
    std::vector<Tensor> unstamped = {MakeTensor(rng, DType::kFloat16, {2, 512, 1}, {})};
    EXPECT_EQ(RunAndWait(*worker, MakeBatch(unstamped), 1).dispatch_ns, 0);
  }
}

// The backend as the server runs it: under the scheduler (one thread per
// slot, named after the device) and the batcher, with many callers at once,
// small and large requests mixed, half of them offering their input buffer
// and accepting a lent output (so that inputs are staged at admission and
// outputs lent or computed in place). Every answer is right; every loan is
// given back once the answers are dropped; the threads stop.
TEST(CudaBackendTest, ServesManyCallersThroughTheSchedulerAndBatcher) {
  SKIP_WITHOUT_GPU();
  CudaBackendOptions options;
  options.max_staging_bytes = 8 << 20;
  options.zero_copy_max_bytes = kTestZeroCopyMaxBytes;
  std::unique_ptr<CudaBackend> worker = CreateWorker(options);
  ASSERT_NE(worker, nullptr);
  const int64_t pinned_before = worker->Memory()[1].in_use_bytes;
  constexpr int kThreads = 8;
  constexpr int kPerThread = 40;
  std::mt19937 rng(99);
  std::vector<Tensor> tensors;
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    const int64_t n = i % 5 == 0 ? 70000 : std::uniform_int_distribution<int64_t>(1, 3000)(rng);
    const DType dtype = i % 2 == 0 ? DType::kFloat32 : DType::kBFloat16;
    tensors.push_back(MakeTensor(rng, dtype, {1 + i % 3, n, 1}, {1.0f, i % 4 == 0}));
  }
  const std::vector<Tensor> originals = tensors;
  std::vector<std::unique_ptr<testing::TestRequest>> requests;
  std::vector<OutputView> views(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    requests.push_back(std::make_unique<testing::TestRequest>());
  }
  {
    Scheduler scheduler({worker.get()});
    BatcherOptions batcher_options;
    batcher_options.max_queue_delay = std::chrono::microseconds(100);
    batcher_options.max_batch_bytes = options.max_staging_bytes;
    Batcher batcher(batcher_options, &scheduler);
    EXPECT_TRUE(testing::Await([] { return testing::ThreadsNamed("sm-cuda0-s").size() == 3u; }));
    std::vector<std::thread> callers;
    for (int t = 0; t < kThreads; ++t) {
      callers.emplace_back([&, t] {
        for (int k = 0; k < kPerThread; ++k) {
          const size_t i = static_cast<size_t>(t * kPerThread + k);
          Tensor& tensor = tensors[i];
          testing::TestRequest* request = requests[i].get();
          auto item = std::make_unique<WorkItem>();
          item->segment = testing::SegmentOf(tensor);
          item->output = &request->output;
          if (i % 2 == 1) {
            item->input_buffer = &tensor.input;
            item->output_view = &views[i];
          }
          item->done = [request](const absl::Status& status, const RequestTiming& timing) {
            request->status = status;
            request->timing = timing;
            request->done.Notify();
          };
          ASSERT_TRUE(batcher.Enqueue(std::move(item)).ok());
          // Every fourth caller waits for its answer, as a unary caller does.
          if (k % 4 == 0) {
            ASSERT_TRUE(request->Wait());
          }
        }
      });
    }
    for (std::thread& caller : callers) caller.join();
    for (auto& request : requests) ASSERT_TRUE(request->Wait());
    batcher.Stop();
    EXPECT_TRUE(testing::AwaitNoThreadsNamed("sm-cuda0-s"));
  }
  int lent = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    ASSERT_TRUE(requests[i]->status.ok()) << i << ": " << requests[i]->status;
    EXPECT_GT(requests[i]->timing.kernel_ns, 0);
    Tensor computed = originals[i];
    if (views[i].data != nullptr) {
      ++lent;
      ASSERT_EQ(views[i].bytes, static_cast<int64_t>(computed.input.size()));
      computed.output.assign(views[i].data, static_cast<size_t>(views[i].bytes));
    } else {
      computed.output = requests[i]->output;
    }
    ExpectMatchesReference(computed);
    if (HasFailure()) return;
  }
  // The large requests that accepted a view (n = 70000, at least 16 KiB)
  // were answered from pinned memory.
  EXPECT_GT(lent, 0);
  views.clear();
  EXPECT_EQ(worker->Memory()[1].in_use_bytes, pinned_before);
}

// The fault path, in a child process of its own (a sticky CUDA error leaves
// the process's context unusable): the batch that hits the fault fails
// INTERNAL, the handler is told once, every later batch fails INTERNAL at
// once on any slot, and nothing more is staged. Returns 0 when all of that
// held, else the number of the check that failed.
int RunFaultScenario() {
  std::atomic<int> faults{0};
  CudaBackendOptions options;
  options.max_staging_bytes = 8 << 20;
  options.inject_fault_after_batches = 2;
  auto created = CudaBackend::Create(options, [&faults](const absl::Status& status) {
    faults.fetch_add(1);
    std::fprintf(stderr, "fault reported: %s\n", status.ToString().c_str());
  });
  if (!created.ok()) {
    std::fprintf(stderr, "create: %s\n", created.status().ToString().c_str());
    return 1;
  }
  // Never destroyed: the context it would tear down is dead.
  CudaBackend* worker = created->release();
  std::mt19937 rng(3);
  std::vector<Tensor> first = {MakeTensor(rng, DType::kFloat32, {2, 1024, 1}, {})};
  BatchResult result = RunAndWait(*worker, MakeBatch(first));
  if (!result.status.ok() || faults.load() != 0) return 2;
  std::vector<Tensor> second = {MakeTensor(rng, DType::kFloat32, {2, 1024, 1}, {})};
  result = RunAndWait(*worker, MakeBatch(second));
  std::fprintf(stderr, "faulted batch: %s\n", result.status.ToString().c_str());
  if (result.status.code() != absl::StatusCode::kInternal) return 3;
  if (faults.load() != 1) return 4;
  for (int slot = 0; slot < worker->Slots(); ++slot) {
    std::vector<Tensor> later = {MakeTensor(rng, DType::kFloat16, {1, 512, 1}, {})};
    result = RunAndWait(*worker, MakeBatch(later), slot);
    if (result.status.code() != absl::StatusCode::kInternal) return 5;
  }
  if (faults.load() != 1) return 6;
  std::vector<Tensor> big = {MakeTensor(rng, DType::kFloat32, {64, 1024, 1}, {})};
  Segment segment = testing::SegmentOf(big[0]);
  segment.output_view_ok = true;
  if (worker->StageInput(segment)) return 7;
  return 0;
}

TEST(CudaBackendTest, StickyFaultFailsItsBatchAndEveryLaterOneAndIsReportedOnce) {
  SKIP_WITHOUT_GPU();
  // A fresh process (re-executed, not forked: CUDA is initialised here).
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(_exit(RunFaultScenario()), ::testing::ExitedWithCode(0), "fault reported");
}

}  // namespace
}  // namespace softmax::server
