// inference.GRPCInferenceService over a real gRPC channel on a free loopback
// port, behind a backend that lends its outputs as the GPU backend does
// (OutputView), so the path a CPU-backend end-to-end test never takes is
// checked here: responses reference the lent output, every lent buffer is
// released once its response is sent.
#include "server/rpc/grpc/kserve_grpc.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "kernels/cpu_softmax.h"
#include "server/metrics/metrics.h"
#include "server/rpc/grpc/grpc_server.h"
#include "server/rpc/grpc/test_server.h"
#include "server/scheduling/batcher.h"
#include "server/scheduling/scheduler.h"
#include "server/testing/test_backends.h"

namespace softmax::server {
namespace {

// Computes every segment into a buffer of its own and lends it.
class LendingBackend final : public Backend {
 public:
  std::string Describe() const override { return "lending"; }
  std::string Name() const override { return "lending"; }
  BatchResult Execute(int slot, Batch& batch) override {
    BatchResult result;
    result.output_views.resize(batch.segments.size());
    for (size_t i = 0; i < batch.segments.size(); ++i) {
      const Segment& s = batch.segments[i];
      void* output = s.output;
      if (s.output_view_ok) {
        auto kept = std::shared_ptr<std::string>(
            new std::string(static_cast<size_t>(s.bytes), '\0'), [this](std::string* buffer) {
              delete buffer;
              alive.fetch_sub(1);
            });
        alive.fetch_add(1);
        lent.fetch_add(1);
        output = kept->data();
        result.output_views[i] = OutputView{kept->data(), s.bytes, kept};
      }
      CpuSoftmaxRows(s.input, output, s.dtype, s.shape, s.options, 0, s.shape.rows());
    }
    result.compute_ns = 1;
    return result;
  }
  std::atomic<int> lent{0};
  std::atomic<int> alive{0};
};

struct Harness {
  // `echo`: --device=none, no backend.
  explicit Harness(bool echo = false, int64_t max_tensor_bytes = 1 << 20) {
    metrics = std::move(*Metrics::Create(""));
    if (!echo) {
      auto lending = std::make_unique<LendingBackend>();
      backend = lending.get();
      owned_backend = std::move(lending);
      scheduler = std::make_unique<Scheduler>(std::vector<Backend*>{backend});
      batcher = std::make_unique<Batcher>(BatcherOptions{}, scheduler.get(), metrics.get());
    }
    front_ends = std::make_unique<testing::TestGrpcServer>(batcher.get(), metrics.get(),
                                                     max_tensor_bytes, /*max_stream_pending=*/4);
    channel = front_ends->channel;
    stub = inference::GRPCInferenceService::NewStub(channel);
  }
  ~Harness() {
    // The batcher first: what it still holds is answered while the front-ends
    // (and the admission whose tickets those requests hold) are alive.
    if (batcher != nullptr) batcher->Stop();
    front_ends.reset();
  }

  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<Backend> owned_backend;
  LendingBackend* backend = nullptr;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Batcher> batcher;
  std::unique_ptr<testing::TestGrpcServer> front_ends;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub;
};

inference::ModelInferRequest Request(const std::string& id, const std::vector<float>& values,
                                     int64_t rows, bool log) {
  inference::ModelInferRequest request;
  request.set_model_name(log ? "log_softmax" : "softmax");
  request.set_id(id);
  auto* input = request.add_inputs();
  input->set_name("INPUT");
  input->set_datatype("FP32");
  input->add_shape(rows);
  input->add_shape(static_cast<int64_t>(values.size()) / rows);
  request.add_raw_input_contents(values.data(), values.size() * sizeof(float));
  return request;
}

void ExpectCorrect(const std::vector<float>& values, int64_t rows, bool log,
                   const inference::ModelInferResponse& response) {
  ASSERT_EQ(response.outputs_size(), 1);
  EXPECT_EQ(response.outputs(0).name(), "OUTPUT");
  EXPECT_EQ(response.outputs(0).datatype(), "FP32");
  ASSERT_EQ(response.raw_output_contents_size(), 1);
  const std::string& raw = response.raw_output_contents(0);
  ASSERT_EQ(raw.size(), values.size() * sizeof(float));
  const int64_t n = static_cast<int64_t>(values.size()) / rows;
  SoftmaxOptions options;
  options.log = log;
  std::vector<double> expected(values.size());
  ReferenceSoftmax(values.data(), DType::kFloat32, SoftmaxShape{rows, n, 1}, options,
                   expected.data());
  for (size_t i = 0; i < values.size(); ++i) {
    const float got = LoadAsFloat(raw.data(), DType::kFloat32, static_cast<int64_t>(i));
    ASSERT_NEAR(got, expected[i], 1e-6 + 2e-6 * std::fabs(expected[i])) << "element " << i;
  }
}

// True once every lent buffer is released: gRPC lets go of a response's
// slices shortly after the client has it.
bool AllReleased(const LendingBackend& backend) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (backend.alive.load() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return backend.alive.load() == 0;
}

std::vector<float> Values(size_t count, float scale) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = scale * std::sin(static_cast<float>(i));
  return values;
}

TEST(KServeGrpcTest, ModelInferAnswersFromTheLentOutput) {
  Harness harness;
  for (int i = 0; i < 5; ++i) {
    const std::vector<float> values = Values(3 * 257, 1.0f + i);
    grpc::ClientContext context;
    inference::ModelInferResponse response;
    const grpc::Status status =
        harness.stub->ModelInfer(&context, Request("u", values, 3, i % 2 == 1), &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.id(), "u");
    EXPECT_EQ(response.model_version(), "1");
    ExpectCorrect(values, 3, i % 2 == 1, response);
  }
  EXPECT_EQ(harness.backend->lent.load(), 5);
  EXPECT_TRUE(AllReleased(*harness.backend));
  const inference::ModelStatistics stats = harness.front_ends->statistics.Get(kserve::Model::kSoftmax);
  EXPECT_EQ(stats.inference_count(), 3u);
}

// A large tensor is parsed into a pooled buffer and its answer sent from
// one, unary and streamed: the buffers come back to the service's pool.
TEST(KServeGrpcTest, LargeTensorsTravelThroughPooledBuffers) {
  const size_t columns = (TensorBufferPool::kMinPooledBytes + (1 << 20)) / 4;  // 17 MiB
  Harness harness(/*echo=*/true, int64_t{64} << 20);
  const std::vector<float> values = Values(columns, 2.0f);
  const inference::ModelInferRequest request = Request("big", values, 1, false);
  for (int call = 0; call < 3; ++call) {
    grpc::ClientContext context;
    inference::ModelInferResponse response;
    const grpc::Status status = harness.stub->ModelInfer(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.raw_output_contents_size(), 1);
    EXPECT_TRUE(response.raw_output_contents(0) == request.raw_input_contents(0));
  }
  grpc::ClientContext context;
  auto stream = harness.stub->ModelStreamInfer(&context);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  inference::ModelStreamInferResponse response;
  int answered = 0;
  while (stream->Read(&response)) {
    ++answered;
    EXPECT_TRUE(response.error_message().empty()) << response.error_message();
    ASSERT_EQ(response.infer_response().raw_output_contents_size(), 1);
    EXPECT_TRUE(response.infer_response().raw_output_contents(0) ==
                request.raw_input_contents(0));
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(answered, 2);
  // gRPC releases the responses' buffers once they are on the wire.
  TensorBufferPool& pool = *harness.front_ends->front_end.buffers;
  EXPECT_TRUE(testing::Await([&pool] { return pool.idle_buffers() >= 1; }));
  EXPECT_LE(pool.idle_buffers(), 2u);  // at most two calls were in flight at once
}

// softmax_requests_total of `method`, every code summed.
double RequestsCounted(Metrics& metrics, const std::string& method) {
  double total = 0;
  for (const auto& family : metrics.Collect()) {
    if (family.name != "softmax_requests_total") continue;
    for (const auto& metric : family.metric) {
      for (const auto& label : metric.label) {
        if (label.name == "method" && label.value == method) total += metric.counter.value;
      }
    }
  }
  return total;
}

// Every answered request leaves exactly one record (request_record.h),
// whichever gRPC front-end and whichever way it ended: the request counters
// equal the answers, and the KServe statistics count each request of a known
// model once, as a success or a failure.
TEST(KServeGrpcTest, EveryAnswerIsRecordedExactlyOnce) {
  Harness harness;
  // KServe unary: 2 answered, 1 invalid, 1 of no such model (no statistics).
  for (int i = 0; i < 4; ++i) {
    inference::ModelInferRequest request = Request(std::to_string(i), Values(8, 1.0f), 2, false);
    if (i == 2) (*request.mutable_parameters())["temperature"].set_double_param(-1.0);
    if (i == 3) request.set_model_name("no_such_model");
    grpc::ClientContext context;
    inference::ModelInferResponse response;
    const grpc::Status status = harness.stub->ModelInfer(&context, request, &response);
    EXPECT_EQ(status.ok(), i < 2) << i << ": " << status.error_message();
  }
  // KServe stream: 3 answered, 1 invalid (in band).
  {
    grpc::ClientContext context;
    auto stream = harness.stub->ModelStreamInfer(&context);
    for (int i = 0; i < 4; ++i) {
      inference::ModelInferRequest request = Request(std::to_string(i), Values(8, 1.0f), 2, true);
      if (i == 1) (*request.mutable_parameters())["temperature"].set_double_param(-1.0);
      ASSERT_TRUE(stream->Write(request));
    }
    stream->WritesDone();
    inference::ModelStreamInferResponse response;
    int answered = 0;
    while (stream->Read(&response)) ++answered;
    EXPECT_TRUE(stream->Finish().ok());
    EXPECT_EQ(answered, 4);
  }
  // softmax.v1 unary: 1 answered, 1 invalid; stream: 2 answered, 1 invalid.
  auto v1_stub = v1::SoftmaxService::NewStub(harness.channel);
  auto v1_request = [](bool valid) {
    v1::SoftmaxRequest request;
    request.mutable_input()->set_dtype(v1::DTYPE_FLOAT32);
    request.mutable_input()->add_shape(2);
    request.mutable_input()->set_data(std::string(valid ? 8 : 5, '\0'));
    return request;
  };
  for (bool valid : {true, false}) {
    grpc::ClientContext context;
    v1::SoftmaxResponse response;
    EXPECT_EQ(v1_stub->Softmax(&context, v1_request(valid), &response).ok(), valid);
  }
  {
    grpc::ClientContext context;
    auto stream = v1_stub->SoftmaxStream(&context);
    for (bool valid : {true, false, true}) ASSERT_TRUE(stream->Write(v1_request(valid)));
    stream->WritesDone();
    v1::SoftmaxResponse response;
    int answered = 0;
    while (stream->Read(&response)) ++answered;
    stream->Finish().IgnoreError();
    EXPECT_EQ(answered, 3);
  }
  Metrics& metrics = *harness.metrics;
  EXPECT_EQ(RequestsCounted(metrics, "ModelInfer"), 4);
  EXPECT_EQ(RequestsCounted(metrics, "ModelStreamInfer"), 4);
  EXPECT_EQ(RequestsCounted(metrics, "Softmax"), 2);
  EXPECT_EQ(RequestsCounted(metrics, "SoftmaxStream"), 3);
  const kserve::ModelStatistics& statistics = harness.front_ends->statistics;
  const inference::ModelStatistics softmax = statistics.Get(kserve::Model::kSoftmax);
  const inference::ModelStatistics log = statistics.Get(kserve::Model::kLogSoftmax);
  EXPECT_EQ(softmax.inference_count(), 2u);
  EXPECT_EQ(softmax.inference_stats().fail().count(), 1u);
  EXPECT_EQ(log.inference_count(), 3u);
  EXPECT_EQ(log.inference_stats().fail().count(), 1u);
}

TEST(KServeGrpcTest, StreamAnswersEveryRequestAndErrorsInBand) {
  Harness harness;
  grpc::ClientContext context;
  auto stream = harness.stub->ModelStreamInfer(&context);
  const int count = 40;  // more than max_stream_pending (4): reads pause and resume
  std::vector<std::vector<float>> sent;
  for (int i = 0; i < count; ++i) {
    sent.push_back(Values(2 * 100, 0.5f + i));
    inference::ModelInferRequest request = Request(std::to_string(i), sent.back(), 2, false);
    if (i % 10 == 3) (*request.mutable_parameters())["temperature"].set_double_param(-1.0);
    ASSERT_TRUE(stream->Write(request));
  }
  stream->WritesDone();
  int answered = 0;
  int errors = 0;
  inference::ModelStreamInferResponse response;
  while (stream->Read(&response)) {
    ++answered;
    const int i = std::stoi(response.infer_response().id());
    if (i % 10 == 3) {
      EXPECT_NE(response.error_message().find("temperature"), std::string::npos);
      ++errors;
    } else {
      EXPECT_TRUE(response.error_message().empty()) << response.error_message();
      ExpectCorrect(sent[static_cast<size_t>(i)], 2, false, response.infer_response());
    }
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(answered, count);
  EXPECT_EQ(errors, 4);
  EXPECT_TRUE(AllReleased(*harness.backend));
}

}  // namespace
}  // namespace softmax::server

namespace softmax::server {
namespace {

// Every gRPC unary protocol's refusal while draining is held across the
// GOAWAY (Admission::HoldRefusals) until ReleaseHeldCalls, then answered
// UNAVAILABLE: softmax.v1 Softmax and KServe ModelInfer alike. A stream's
// refusal is answered in band at once.
TEST(KServeGrpcTest, EveryUnaryProtocolsRefusalIsHeldAcrossTheGoaway) {
  Harness harness(/*echo=*/true);
  Admission& admission = *harness.front_ends->admission;
  admission.StartDraining();
  admission.HoldRefusals();
  auto v1_stub = v1::SoftmaxService::NewStub(harness.channel);
  std::atomic<int> answered{0};
  grpc::Status v1_status, kserve_status;
  auto call_deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(20); };
  std::thread v1_call([&] {
    grpc::ClientContext context;
    context.set_deadline(call_deadline());
    v1::SoftmaxRequest request;
    request.mutable_input()->set_dtype(v1::DTYPE_FLOAT32);
    request.mutable_input()->add_shape(2);
    request.mutable_input()->set_data(std::string(8, '\0'));
    v1::SoftmaxResponse response;
    v1_status = v1_stub->Softmax(&context, request, &response);
    answered.fetch_add(1);
  });
  std::thread kserve_call([&] {
    grpc::ClientContext context;
    context.set_deadline(call_deadline());
    inference::ModelInferResponse response;
    kserve_status = harness.stub->ModelInfer(&context, Request("k", Values(4, 1.0f), 1, false),
                                             &response);
    answered.fetch_add(1);
  });
  // A stream's refusal: in band, not held.
  {
    grpc::ClientContext context;
    context.set_deadline(call_deadline());
    auto stream = harness.stub->ModelStreamInfer(&context);
    // (A draining server may end the stream before reading it.)
    inference::ModelStreamInferResponse response;
    if (stream->Write(Request("s", Values(4, 1.0f), 1, false)) && stream->Read(&response)) {
      EXPECT_NE(response.error_message().find("shutting down"), std::string::npos)
          << response.error_message();
    }
    stream->WritesDone();
    stream->Finish().IgnoreError();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(answered.load(), 0) << "a unary refusal was answered while refusals are held";
  admission.ReleaseHeldCalls();
  v1_call.join();
  kserve_call.join();
  EXPECT_EQ(v1_status.error_code(), grpc::StatusCode::UNAVAILABLE) << v1_status.error_message();
  EXPECT_EQ(kserve_status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << kserve_status.error_message();
  EXPECT_TRUE(admission.WaitForInFlight(absl::Now() + absl::Seconds(10)));
}

}  // namespace
}  // namespace softmax::server
