// Tests of the load run's payloads: what BuildLoadPayloads prepares for each
// protocol, the weighted schedule, and CheckLoadOutput's verdicts.
#include "client/load/payload.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "client/tensor.h"
#include "gtest/gtest.h"
#include "kernels/cpu_softmax.h"

namespace softmax::client {
namespace {

LoadOptions TwoEntryMix() {
  LoadOptions options;
  options.shapes = *ParseLoadMix("1x64:float32:1,3x100:fp16:3");
  options.payloads_per_shape = 2;
  return options;
}

TEST(BuildLoadPayloadsTest, ScheduleFollowsTheWeightsAndCyclesTheCopies) {
  std::vector<uint32_t> schedule;
  absl::StatusOr<std::vector<LoadPayload>> payloads =
      BuildLoadPayloads(TwoEntryMix(), "", &schedule);
  ASSERT_TRUE(payloads.ok()) << payloads.status();
  ASSERT_EQ(payloads->size(), 4u);  // two copies of each entry, in mix order
  EXPECT_EQ(ShapeOf((*payloads)[0].request.input()), (std::vector<int64_t>{1, 64}));
  EXPECT_EQ(ShapeOf((*payloads)[2].request.input()), (std::vector<int64_t>{3, 100}));
  ASSERT_EQ(schedule.size(), static_cast<size_t>(kLoadScheduleLength));
  std::map<uint32_t, int> uses;
  int longest_run_of_second = 0, run = 0;
  for (uint32_t index : schedule) {
    ++uses[index];
    run = index >= 2 ? run + 1 : 0;
    longest_run_of_second = std::max(longest_run_of_second, run);
  }
  EXPECT_EQ(uses[0] + uses[1], kLoadScheduleLength / 4);
  EXPECT_EQ(uses[2] + uses[3], kLoadScheduleLength * 3 / 4);
  EXPECT_EQ(uses[0], uses[1]);
  EXPECT_EQ(uses[2], uses[3]);
  // Evenly interleaved: weight 3 against 1 never runs longer than 3.
  EXPECT_EQ(longest_run_of_second, 3);
}

TEST(BuildLoadPayloadsTest, EachPayloadIsPreparedForItsProtocol) {
  LoadOptions options = TwoEntryMix();
  options.axis = 0;
  options.temperature = 2.0f;
  options.log = true;
  std::vector<uint32_t> schedule;
  absl::StatusOr<std::vector<LoadPayload>> payloads = BuildLoadPayloads(options, "", &schedule);
  ASSERT_TRUE(payloads.ok()) << payloads.status();
  const LoadPayload& fp16 = (*payloads)[2];
  EXPECT_TRUE(fp16.request.input().data().empty());  // sent from `prepared` only
  EXPECT_EQ(fp16.request.axis(), 0);
  EXPECT_EQ(fp16.request.temperature(), 2.0f);
  EXPECT_TRUE(fp16.request.log());
  EXPECT_EQ(fp16.view.outer, 1);
  EXPECT_EQ(fp16.view.n, 3);
  EXPECT_EQ(fp16.view.inner, 100);
  EXPECT_EQ(fp16.rows, 100);
  EXPECT_EQ(fp16.tensor_bytes, 3 * 100 * 2);
  ASSERT_NE(fp16.prepared, nullptr);
  EXPECT_GT(fp16.prepared->size(), 600u);
  EXPECT_TRUE(fp16.chunks.empty());
  EXPECT_EQ(fp16.http, nullptr);
  EXPECT_TRUE(fp16.expected.empty());  // no --verify

  options.chunk_bytes = 256;
  payloads = BuildLoadPayloads(options, "", &schedule);
  ASSERT_TRUE(payloads.ok()) << payloads.status();
  EXPECT_EQ((*payloads)[0].chunks.size(), 1u);  // 256 bytes: one chunk
  EXPECT_EQ((*payloads)[2].chunks.size(), 3u);  // 600 bytes
  EXPECT_EQ((*payloads)[2].prepared, nullptr);

  options.chunk_bytes = 0;
  options.protocol = LoadProtocol::kKserve;
  payloads = BuildLoadPayloads(options, "", &schedule);
  ASSERT_TRUE(payloads.ok()) << payloads.status();
  ASSERT_NE((*payloads)[2].prepared, nullptr);  // a ModelInferRequest, its data raw
  EXPECT_GT((*payloads)[2].prepared->size(), 600u);
  EXPECT_TRUE((*payloads)[2].chunks.empty());

  options.protocol = LoadProtocol::kHttp;
  payloads = BuildLoadPayloads(options, "http://127.0.0.1:8000", &schedule);
  ASSERT_TRUE(payloads.ok()) << payloads.status();
  ASSERT_NE((*payloads)[2].http, nullptr);
  EXPECT_EQ((*payloads)[2].http->url(), "http://127.0.0.1:8000/v2/models/log_softmax/infer");
  EXPECT_EQ((*payloads)[2].prepared, nullptr);
}

TEST(BuildLoadPayloadsTest, AnEntryOverTheLargeSizeIsBuiltOnce) {
  LoadOptions options;
  // One float32 element more than kLargeLoadPayloadBytes.
  options.shapes = *ParseLoadMix("1x4194305:float32");
  options.payloads_per_shape = 4;
  std::vector<uint32_t> schedule;
  absl::StatusOr<std::vector<LoadPayload>> payloads = BuildLoadPayloads(options, "", &schedule);
  ASSERT_TRUE(payloads.ok()) << payloads.status();
  EXPECT_EQ(payloads->size(), 1u);
  EXPECT_EQ((*payloads)[0].tensor_bytes, kLargeLoadPayloadBytes + 4);
  for (uint32_t index : schedule) EXPECT_EQ(index, 0u);
}

TEST(BuildLoadPayloadsTest, AnAxisOutsideAnEntryIsInvalid) {
  LoadOptions options = TwoEntryMix();
  options.axis = 2;
  std::vector<uint32_t> schedule;
  EXPECT_EQ(BuildLoadPayloads(options, "", &schedule).status().code(),
            absl::StatusCode::kInvalidArgument);
}

class CheckLoadOutputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.shapes = *ParseLoadMix("4x50:bf16");
    options_.payloads_per_shape = 1;
    options_.verify = true;
    options_.seed = 7;
    std::vector<uint32_t> schedule;
    absl::StatusOr<std::vector<LoadPayload>> payloads =
        BuildLoadPayloads(options_, "", &schedule);
    ASSERT_TRUE(payloads.ok()) << payloads.status();
    payloads_ = *std::move(payloads);
    // The payload's input, made again from its seed, answered as the server
    // would.
    RandomTensorOptions random;
    random.shape = {4, 50};
    random.dtype = v1::DTYPE_BFLOAT16;
    random.seed = 7;
    correct_ = *MakeRandomTensor(random);
    const SoftmaxShape view = *ShapeAlongAxis(ShapeOf(correct_), -1);
    const std::string input = correct_.data();
    CpuSoftmaxRows(input.data(), correct_.mutable_data()->data(), DType::kBFloat16, view,
                   SoftmaxOptions(), 0, view.rows());
  }

  const LoadPayload& payload() const { return payloads_[0]; }

  LoadOptions options_;
  std::vector<LoadPayload> payloads_;
  v1::Tensor correct_;
};

TEST_F(CheckLoadOutputTest, AcceptsTheServersAnswer) {
  ASSERT_EQ(payload().expected.size(), 200u);
  EXPECT_EQ(CheckLoadOutput(payload(), correct_), "");
}

TEST_F(CheckLoadOutputTest, NamesTheFirstElementOutOfTolerance) {
  v1::Tensor wrong = correct_;
  // Elements 5 and 9 (bfloat16, two bytes each) set to 2.0 (0x4000).
  for (int element : {5, 9}) {
    (*wrong.mutable_data())[2 * element] = 0x00;
    (*wrong.mutable_data())[2 * element + 1] = 0x40;
  }
  const std::string problem = CheckLoadOutput(payload(), wrong);
  EXPECT_EQ(problem.rfind("2 of 200 elements out of tolerance; first: element 5 is 2, reference ",
                          0),
            0u)
      << problem;
}

TEST_F(CheckLoadOutputTest, RefusesAnotherDtypeShapeOrSize) {
  v1::Tensor wrong = correct_;
  wrong.set_dtype(v1::DTYPE_FLOAT16);
  EXPECT_EQ(CheckLoadOutput(payload(), wrong), "dtype float16 instead of bfloat16");
  wrong = correct_;
  wrong.clear_shape();
  wrong.add_shape(200);
  EXPECT_EQ(CheckLoadOutput(payload(), wrong), "shape [200] instead of [4, 50]");
  wrong = correct_;
  wrong.mutable_data()->resize(398);
  EXPECT_EQ(CheckLoadOutput(payload(), wrong), "398 data bytes instead of 400");
}

// The top 3 of each row of `output` ([4, 50] bfloat16), best first.
v1::TopK TopThree(const v1::Tensor& output) {
  v1::TopK top_k;
  top_k.mutable_values()->set_dtype(output.dtype());
  top_k.mutable_values()->add_shape(4);
  top_k.mutable_values()->add_shape(3);
  for (int row = 0; row < 4; ++row) {
    std::vector<int64_t> order(50);
    for (int64_t j = 0; j < 50; ++j) order[j] = j;
    const auto at = [&](int64_t j) {
      return LoadAsFloat(output.data().data(), DType::kBFloat16, row * 50 + j);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return at(a) > at(b); });
    for (int j = 0; j < 3; ++j) {
      top_k.mutable_values()->mutable_data()->append(output.data(), 2 * (row * 50 + order[j]), 2);
      top_k.mutable_indices()->append(reinterpret_cast<const char*>(&order[j]), 8);
    }
  }
  return top_k;
}

TEST_F(CheckLoadOutputTest, TopKAnswersAreCheckedByValueAndRank) {
  options_.top_k = 3;
  std::vector<uint32_t> schedule;
  absl::StatusOr<std::vector<LoadPayload>> payloads = BuildLoadPayloads(options_, "", &schedule);
  ASSERT_TRUE(payloads.ok()) << payloads.status();
  const LoadPayload& payload = (*payloads)[0];
  EXPECT_EQ(payload.request.top_k(), 3);
  const v1::TopK correct = TopThree(correct_);
  EXPECT_EQ(CheckLoadTopK(payload, correct), "");

  // Row 0's third answer replaced by its worst element, value and index:
  // each value is right, but a better one was left out.
  v1::TopK wrong = correct;
  int64_t worst = 0;
  for (int64_t j = 1; j < 50; ++j) {
    if (LoadAsFloat(correct_.data().data(), DType::kBFloat16, j) <
        LoadAsFloat(correct_.data().data(), DType::kBFloat16, worst)) {
      worst = j;
    }
  }
  wrong.mutable_values()->mutable_data()->replace(4, 2, correct_.data(), 2 * worst, 2);
  wrong.mutable_indices()->replace(16, 8, reinterpret_cast<const char*>(&worst), 8);
  const std::string problem = CheckLoadTopK(payload, wrong);
  EXPECT_NE(problem.find("ranked below a left-out index"), std::string::npos) << problem;

  wrong = correct;
  wrong.mutable_indices()->resize(8);
  EXPECT_NE(CheckLoadTopK(payload, wrong).find("expected 12 values and indices"),
            std::string::npos);

  options_.top_k = 51;
  EXPECT_EQ(BuildLoadPayloads(options_, "", &schedule).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace softmax::client
