#include "server/rpc/kserve.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "server/rpc/validation.h"

namespace softmax::server::kserve {
namespace {

InferRequestParts GoodParts() {
  InferRequestParts parts;
  parts.model_name = "softmax";
  parts.id = "r1";
  parts.input_count = 1;
  parts.input_datatype = "FP32";
  parts.input_shape = {2, 3};
  parts.input_data = std::string(24, '\0');
  return parts;
}

// `parts` built and validated as the front-ends submit it, naming KServe's
// fields.
absl::Status Build(InferRequestParts* parts, Model* model, InferenceRequest* request) {
  *request = InferenceRequest{};
  absl::Status status = BuildInferenceRequest(parts, model, request);
  if (status.ok()) status = ValidateRequest(request, RequestLimits{}, FieldNamesFor(*parts));
  return status;
}

TEST(KServeTest, FindModelServesTwoModelsAtVersionOne) {
  EXPECT_EQ(*FindModel("softmax", ""), Model::kSoftmax);
  EXPECT_EQ(*FindModel("log_softmax", "1"), Model::kLogSoftmax);
  EXPECT_EQ(FindModel("softmax", "2").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FindModel("resnet", "").status().code(), absl::StatusCode::kNotFound);
}

TEST(KServeTest, TypedVariantsAdvertiseTheirTypeAndComputeTheSame) {
  ASSERT_EQ(*FindModel("log_softmax_bf16", "1"), Model::kLogSoftmaxBf16);
  EXPECT_TRUE(IsLog(Model::kLogSoftmaxBf16));
  EXPECT_FALSE(IsLog(Model::kSoftmaxFp16));
  EXPECT_EQ(Metadata(Model::kSoftmaxFp16).inputs(0).datatype(), "FP16");
  EXPECT_EQ(Config(Model::kLogSoftmaxBf16).input(0).data_type(), inference::TYPE_BF16);
  EXPECT_EQ(Config(Model::kSoftmax).output(0).data_type(), inference::TYPE_FP32);
  for (Model model : kModels) EXPECT_EQ(*FindModel(ModelName(model), ""), model);
  InferRequestParts parts = GoodParts();
  parts.model_name = "log_softmax_fp16";  // an FP32 input: every variant takes every type
  Model model;
  InferenceRequest request;
  ASSERT_TRUE(Build(&parts, &model, &request).ok());
  EXPECT_TRUE(request.log);
  EXPECT_EQ(request.dtype, DType::kFloat32);
}

TEST(KServeTest, BuildsTheInferenceRequestThatValidationAccepts) {
  InferRequestParts parts = GoodParts();
  parts.model_name = "log_softmax";
  parts.axis = 0;
  parts.temperature = 2.0;
  Model model;
  InferenceRequest request;
  ASSERT_TRUE(Build(&parts, &model, &request).ok());
  EXPECT_EQ(model, Model::kLogSoftmax);
  EXPECT_TRUE(request.log);
  EXPECT_EQ(request.axis, 0);
  EXPECT_DOUBLE_EQ(*request.temperature, 2.0);
  EXPECT_EQ(request.id, "r1");
  EXPECT_EQ(request.dtype, DType::kFloat32);
  EXPECT_EQ(request.input.bytes, 24);
  EXPECT_EQ(request.input.data, parts.input_data.data());  // a view, not a copy
  EXPECT_TRUE(request.tensor.valid);
}

TEST(KServeTest, ClassificationAsksForAtMostTheRowsLength) {
  InferRequestParts parts = GoodParts();  // [2, 3]
  parts.classification = 2;
  Model model;
  InferenceRequest request;
  ASSERT_TRUE(Build(&parts, &model, &request).ok());
  EXPECT_EQ(request.top_k, 2);
  parts = GoodParts();
  parts.classification = 10;  // more classes than the row has: all of them, as Triton
  parts.axis = 0;
  ASSERT_TRUE(Build(&parts, &model, &request).ok());
  EXPECT_EQ(request.top_k, 2);
  for (int64_t k : {0, -3}) {
    parts = GoodParts();
    parts.classification = k;
    const absl::Status status = Build(&parts, &model, &request);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("classification"), absl::string_view::npos) << status;
  }
  parts = GoodParts();
  parts.classification = 1;
  parts.output_region = RegionRef{"r", 24, 0, "outputs[0].parameters"};
  EXPECT_EQ(Build(&parts, &model, &request).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KServeTest, TopKAnswersTheRequestedTopKOutputs) {
  using Kind = AnswerOutput;
  InferRequestParts parts = GoodParts();
  EXPECT_EQ(*AnswerOutputs(parts), std::vector<Kind>{Kind::kOutput});
  parts.classification = 2;
  EXPECT_EQ(*AnswerOutputs(parts), std::vector<Kind>{Kind::kClassification});
  parts = GoodParts();
  parts.top_k = 2;
  EXPECT_EQ(*AnswerOutputs(parts), (std::vector<Kind>{Kind::kTopKValues, Kind::kTopKIndices}));
  parts.requested_outputs = {kTopKIndicesName};
  EXPECT_EQ(*AnswerOutputs(parts), std::vector<Kind>{Kind::kTopKIndices});
  Model model;
  InferenceRequest request;
  ASSERT_TRUE(Build(&parts, &model, &request).ok());
  EXPECT_EQ(request.top_k, 2);
  EXPECT_FALSE(request.full_output);
  for (auto [top_k, output] : {std::pair<int64_t, const char*>{2, kOutputName},
                               {0, kTopKValuesName}, {0, "LOGITS"}}) {
    parts = GoodParts();
    if (top_k > 0) parts.top_k = top_k;
    parts.requested_outputs = {output};
    const absl::Status status = Build(&parts, &model, &request);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << output;
    EXPECT_NE(status.message().find("outputs[0].name"), absl::string_view::npos) << status;
  }
  parts = GoodParts();
  parts.top_k = -1;
  EXPECT_NE(Build(&parts, &model, &request).message().find("parameters.top_k"),
            absl::string_view::npos);
  parts = GoodParts();
  parts.top_k = 4;  // over the row: named by validation, in KServe's words
  EXPECT_EQ(Build(&parts, &model, &request).message().substr(0, 17), "parameters.top_k:");
}

TEST(KServeTest, ClassificationStringsAreTritons) {
  // std::to_string of the value: "%f", six decimals.
  EXPECT_EQ(ClassificationString(0.5f, 3), "0.500000:3");
  EXPECT_EQ(ClassificationString(-1.25f, 31999), "-1.250000:31999");
  EXPECT_EQ(ClassificationString(1e-9f, 0), "0.000000:0");
  TopKResult top_k;
  const uint16_t bits[2] = {0x3f00, 0x3e80};  // 0.5, 0.25
  top_k.values = std::string(reinterpret_cast<const char*>(bits), 4);
  const int64_t indices[2] = {7, 2};
  top_k.indices = std::string(reinterpret_cast<const char*>(indices), 16);
  const std::vector<std::string> strings = ClassificationStrings(top_k, DType::kBFloat16);
  EXPECT_EQ(strings, (std::vector<std::string>{"0.500000:7", "0.250000:2"}));
  EXPECT_EQ(SerializeBytesTensor(strings),
            std::string("\x0a\0\0\0" "0.500000:7" "\x0a\0\0\0" "0.250000:2", 28));
}

TEST(KServeTest, RejectsWhatIsKServesOwnNamingTheField) {
  Model model;
  struct Case {
    void (*mutate)(InferRequestParts*);
    absl::StatusCode code;
    const char* field;
  };
  const Case cases[] = {
      {[](InferRequestParts* p) { p->model_name = "nope"; }, absl::StatusCode::kNotFound,
       "unknown model"},
      {[](InferRequestParts* p) { p->input_count = 2; }, absl::StatusCode::kInvalidArgument,
       "inputs:"},
      {[](InferRequestParts* p) { p->input_count = 0; }, absl::StatusCode::kInvalidArgument,
       "inputs:"},
      {[](InferRequestParts* p) { p->input_datatype = "INT32"; },
       absl::StatusCode::kInvalidArgument, "inputs[0].datatype"},
      {[](InferRequestParts* p) { p->requested_outputs = {"OUTPUT", "PROBS"}; },
       absl::StatusCode::kInvalidArgument, "outputs[1].name"},
      {[](InferRequestParts* p) { p->temperature = 0.0; }, absl::StatusCode::kInvalidArgument,
       "temperature"},
      {[](InferRequestParts* p) { p->axis = int64_t{1} << 40; },
       absl::StatusCode::kInvalidArgument, "axis"},
  };
  for (const Case& c : cases) {
    InferRequestParts parts = GoodParts();
    c.mutate(&parts);
    InferenceRequest request;
    const absl::Status status = Build(&parts, &model, &request);
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_NE(status.message().find(c.field), absl::string_view::npos) << status;
  }
}

TEST(KServeTest, ValidationNamesKServeFieldsNatively) {
  Model model;
  InferenceRequest request;
  InferRequestParts parts = GoodParts();
  parts.input_data.resize(20);
  absl::Status status = Build(&parts, &model, &request);
  EXPECT_EQ(status.message(), "raw_input_contents[0]: expected 24 bytes (6 elements of float32), got 20");
  parts = GoodParts();
  parts.data_field = "inputs[0].contents.fp32_contents";
  parts.input_shape = {2, -3};
  status = Build(&parts, &model, &request);
  EXPECT_EQ(status.message().substr(0, 19), "inputs[0].shape[1]:") << status;
  parts = GoodParts();
  parts.id = std::string(kMaxRequestIdBytes + 1, 'i');
  EXPECT_EQ(Build(&parts, &model, &request).message().substr(0, 3), "id:");
}

TEST(KServeTest, TypedContentsOnlyForFp32) {
  inference::InferTensorContents contents;
  contents.add_fp32_contents(1.0f);
  contents.add_fp32_contents(2.0f);
  absl::StatusOr<std::string> bytes = BytesFromContents(contents, DType::kFloat32, "c");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), 8u);
  EXPECT_FALSE(BytesFromContents(contents, DType::kFloat16, "c").ok());
  contents.add_int_contents(3);
  EXPECT_FALSE(BytesFromContents(contents, DType::kFloat32, "c").ok());
}

TEST(KServeTest, StatisticsCountPerModel) {
  ModelStatistics stats;
  RequestTiming timing;
  timing.queue_ns = 10;
  timing.compute_ns = 20;
  stats.RecordSuccess(Model::kSoftmax, 100, timing);
  stats.RecordSuccess(Model::kSoftmax, 50, timing);
  stats.RecordFailure(Model::kLogSoftmax, 7);
  const inference::ModelStatistics softmax = stats.Get(Model::kSoftmax);
  EXPECT_EQ(softmax.inference_count(), 2u);
  EXPECT_EQ(softmax.inference_stats().success().ns(), 150u);
  EXPECT_EQ(softmax.inference_stats().queue().ns(), 20u);
  EXPECT_EQ(softmax.inference_stats().compute_infer().ns(), 40u);
  EXPECT_GT(softmax.last_inference(), 0u);
  const inference::ModelStatistics log = stats.Get(Model::kLogSoftmax);
  EXPECT_EQ(log.inference_count(), 0u);
  EXPECT_EQ(stats.Get(Model::kSoftmaxBf16).inference_count(), 0u);
  EXPECT_EQ(log.inference_stats().fail().count(), 1u);
}

TEST(KServeTest, ConfigSaysDynamicBatchingAndVariableDims) {
  const inference::ModelConfig config = Config(Model::kLogSoftmax);
  EXPECT_EQ(config.name(), "log_softmax");
  EXPECT_TRUE(config.has_dynamic_batching());
  ASSERT_EQ(config.input_size(), 1);
  EXPECT_EQ(config.input(0).dims(0), -1);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatus(absl::StatusCode::kUnavailable), 503);
}

TEST(KServeTest, SharedMemoryCallsRegisterListAndUnregister) {
  SharedMemoryCall status_call;
  EXPECT_EQ(RunSharedMemoryCall(status_call, nullptr).status().code(),
            absl::StatusCode::kUnimplemented);

  const std::string key = absl::StrCat("/softmax-kserve-test-", getpid());
  const int fd = shm_open(key.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  {
    SharedMemoryManager manager(SharedMemoryMode::kSystem, nullptr);
    SharedMemoryCall call;
    call.action = SharedMemoryCall::Action::kRegister;
    call.name = "region";
    call.key = key;
    call.offset = 1024;
    call.byte_size = 2048;
    absl::StatusOr<std::vector<SharedMemoryRegionStatus>> answer =
        RunSharedMemoryCall(call, &manager);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_TRUE(answer->empty());
    EXPECT_EQ(RunSharedMemoryCall(call, &manager).status().code(),
              absl::StatusCode::kAlreadyExists);

    answer = RunSharedMemoryCall(status_call, &manager);
    ASSERT_TRUE(answer.ok()) << answer.status();
    ASSERT_EQ(answer->size(), 1u);
    EXPECT_EQ((*answer)[0].name, "region");
    EXPECT_EQ((*answer)[0].key, key);
    EXPECT_EQ((*answer)[0].offset, 1024);
    EXPECT_EQ((*answer)[0].byte_size, 2048);
    // The CUDA kind lists none of the system regions, and is off here.
    SharedMemoryCall cuda = status_call;
    cuda.kind = SharedMemoryKind::kCuda;
    answer = RunSharedMemoryCall(cuda, &manager);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_TRUE(answer->empty());
    cuda.action = SharedMemoryCall::Action::kRegister;
    cuda.name = "gpu";
    EXPECT_EQ(RunSharedMemoryCall(cuda, &manager).status().code(),
              absl::StatusCode::kUnimplemented);

    call.action = SharedMemoryCall::Action::kUnregister;
    ASSERT_TRUE(RunSharedMemoryCall(call, &manager).ok());
    EXPECT_EQ(RunSharedMemoryCall(call, &manager).status().code(), absl::StatusCode::kNotFound);
    answer = RunSharedMemoryCall(status_call, &manager);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_TRUE(answer->empty());
  }
  shm_unlink(key.c_str());
}

}  // namespace
}  // namespace softmax::server::kserve
