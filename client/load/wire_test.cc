#include "client/load/wire.h"

#include <string>
#include <vector>

#include <grpcpp/support/slice.h>
#include <gtest/gtest.h>

namespace softmax::client {
namespace {

v1::SoftmaxRequest SampleRequest(size_t data_bytes) {
  v1::SoftmaxRequest request;
  request.mutable_input()->set_dtype(v1::DTYPE_FLOAT32);
  request.mutable_input()->add_shape(1);
  request.mutable_input()->add_shape(static_cast<int64_t>(data_bytes / 4));
  std::string data(data_bytes, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 7);
  request.mutable_input()->set_data(data);
  request.set_axis(-1);
  request.set_temperature(0.5f);
  return request;
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

grpc::ByteBuffer Serialized(const v1::SoftmaxResponse& response) {
  const std::string bytes = response.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

TEST(PreparedRequestTest, TheMessageIsTheRequestAndSharesItsBytes) {
  const v1::SoftmaxRequest request = SampleRequest(4096);
  const PreparedRequest prepared(request);
  EXPECT_EQ(prepared.size(), request.ByteSizeLong());
  v1::SoftmaxRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(prepared.message())));
  EXPECT_EQ(parsed.SerializeAsString(), request.SerializeAsString());
  // A copy, as gRPC makes for each call, references the same bytes.
  const grpc::ByteBuffer copy = prepared.message();
  std::vector<grpc::Slice> a, b;
  ASSERT_TRUE(prepared.message().Dump(&a).ok());
  ASSERT_TRUE(copy.Dump(&b).ok());
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(a[0].begin(), b[0].begin());
}

TEST(PreparedRequestTest, WithRequestIdParsesAsTheRequestWithThatId) {
  const v1::SoftmaxRequest request = SampleRequest(1000);
  const PreparedRequest prepared(request);
  for (const std::string& id : std::vector<std::string>{"0", "17", std::string(300, 'x')}) {
    v1::SoftmaxRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(Flatten(prepared.WithRequestId(id))));
    v1::SoftmaxRequest expected = request;
    expected.set_request_id(id);
    EXPECT_EQ(parsed.SerializeAsString(), expected.SerializeAsString()) << id.size();
  }
}

TEST(PrepareChunksTest, SplitsTheDataAndKeepsTheHeaderOnTheFirstChunk) {
  const v1::SoftmaxRequest request = SampleRequest(1000);
  const auto chunks = PrepareChunks(request, 300);
  ASSERT_EQ(chunks.size(), 4u);  // 300 + 300 + 300 + 100
  std::string data;
  for (size_t i = 0; i < chunks.size(); ++i) {
    v1::SoftmaxRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(Flatten(chunks[i]->message())));
    EXPECT_EQ(parsed.chunk_offset(), static_cast<int64_t>(data.size()));
    EXPECT_EQ(parsed.more_chunks(), i + 1 < chunks.size());
    EXPECT_EQ(parsed.input().shape_size(), i == 0 ? 2 : 0);
    EXPECT_EQ(parsed.has_temperature(), i == 0);
    data += parsed.input().data();
  }
  EXPECT_EQ(data, request.input().data());
}

TEST(AppendResponseChunkTest, ReassemblesInOrderAndRefusesAGap) {
  auto chunk = [](int64_t offset, const std::string& data, bool more) {
    v1::SoftmaxResponse response;
    response.set_request_id("7");
    if (offset == 0) response.mutable_output()->add_shape(6);
    response.mutable_output()->set_data(data);
    response.set_chunk_offset(offset);
    response.set_more_chunks(more);
    return response;
  };
  v1::SoftmaxResponse whole;
  v1::SoftmaxResponse first = chunk(0, "ab", true);
  ASSERT_TRUE(AppendResponseChunk(&first, 6, &whole));
  v1::SoftmaxResponse second = chunk(2, "cd", true);
  ASSERT_TRUE(AppendResponseChunk(&second, 6, &whole));
  v1::SoftmaxResponse gap = chunk(5, "f", false);
  EXPECT_FALSE(AppendResponseChunk(&gap, 6, &whole));
  v1::SoftmaxResponse last = chunk(4, "ef", false);
  ASSERT_TRUE(AppendResponseChunk(&last, 6, &whole));
  EXPECT_EQ(whole.output().data(), "abcdef");
  EXPECT_EQ(whole.output().shape_size(), 1);
  EXPECT_FALSE(whole.more_chunks());
  // A new answer into the same message starts afresh.
  v1::SoftmaxResponse again = chunk(0, "xy", false);
  ASSERT_TRUE(AppendResponseChunk(&again, 2, &whole));
  EXPECT_EQ(whole.output().data(), "xy");
}

TEST(AppendLaterChunkTest, AppendsThePiecesInOrderAndRefusesAGap) {
  v1::SoftmaxResponse whole;
  v1::SoftmaxResponse first;
  first.set_request_id("7");
  first.mutable_output()->set_data("ab");
  first.set_more_chunks(true);
  ASSERT_TRUE(AppendResponseChunk(&first, 6, &whole));
  const std::string bytes = "cdef";
  ChunkView later;
  later.request_id = "7";
  later.chunk_offset = 2;
  later.more_chunks = true;
  later.data = {absl::string_view(bytes).substr(0, 1), absl::string_view(bytes).substr(1, 1)};
  later.data_bytes = 2;
  ASSERT_TRUE(AppendLaterChunk(later, &whole));
  EXPECT_TRUE(whole.more_chunks());
  later.chunk_offset = 5;
  EXPECT_FALSE(AppendLaterChunk(later, &whole));
  later.chunk_offset = 4;
  later.more_chunks = false;
  later.data = {absl::string_view(bytes).substr(2)};
  ASSERT_TRUE(AppendLaterChunk(later, &whole));
  EXPECT_EQ(whole.output().data(), "abcdef");
  EXPECT_FALSE(whole.more_chunks());
}

TEST(ParseResponseReusingBuffersTest, ReusesTheOutputBufferAndResetsEverythingElse) {
  v1::SoftmaxResponse first;
  first.set_request_id("a");
  first.mutable_output()->set_dtype(v1::DTYPE_FLOAT16);
  first.mutable_output()->add_shape(3);
  first.mutable_output()->set_data(std::string(1 << 20, 'p'));
  first.mutable_timing()->set_queue_ns(5);
  v1::SoftmaxResponse response;
  grpc::ByteBuffer buffer = Serialized(first);
  ASSERT_TRUE(ParseResponseReusingBuffers(&buffer, &response));
  EXPECT_EQ(response.SerializeAsString(), first.SerializeAsString());
  EXPECT_EQ(buffer.Length(), 0u);  // consumed
  const char* memory = response.output().data().data();

  v1::SoftmaxResponse second;
  second.set_request_id("b");
  second.mutable_output()->set_dtype(v1::DTYPE_FLOAT32);
  second.mutable_output()->add_shape(2);
  second.mutable_output()->add_shape(5);
  second.mutable_output()->set_data(std::string((1 << 20) - 8, 'q'));
  buffer = Serialized(second);
  ASSERT_TRUE(ParseResponseReusingBuffers(&buffer, &response));
  EXPECT_EQ(response.SerializeAsString(), second.SerializeAsString());  // no timing, shape [2,5]
  EXPECT_EQ(response.output().data().data(), memory);

  v1::SoftmaxResponse failed;
  failed.set_request_id("c");
  failed.mutable_error()->set_code(3);
  buffer = Serialized(failed);
  ASSERT_TRUE(ParseResponseReusingBuffers(&buffer, &response));
  EXPECT_TRUE(response.has_error());
  EXPECT_EQ(response.error().code(), 3);
  EXPECT_EQ(response.request_id(), "c");
  EXPECT_TRUE(response.output().data().empty());
}

TEST(ParseResponseReusingBuffersTest, RefusesBytesThatAreNotAResponse) {
  const std::string garbage = "\xff\xff\xff\xff\xff\xff";
  grpc::Slice slice(garbage);
  grpc::ByteBuffer buffer(&slice, 1);
  v1::SoftmaxResponse response;
  EXPECT_FALSE(ParseResponseReusingBuffers(&buffer, &response));
}

TEST(KserveRequestOfTest, CarriesTheTensorModelAndParameters) {
  v1::SoftmaxRequest request = SampleRequest(64);
  request.set_log(true);
  request.set_axis(0);
  request.mutable_input()->set_dtype(v1::DTYPE_BFLOAT16);
  const inference::ModelInferRequest kserve = KserveRequestOf(request);
  EXPECT_EQ(kserve.model_name(), "log_softmax");
  ASSERT_EQ(kserve.inputs_size(), 1);
  EXPECT_EQ(kserve.inputs(0).name(), "INPUT");
  EXPECT_EQ(kserve.inputs(0).datatype(), "BF16");
  EXPECT_EQ(std::vector<int64_t>(kserve.inputs(0).shape().begin(), kserve.inputs(0).shape().end()),
            (std::vector<int64_t>{1, 16}));
  ASSERT_EQ(kserve.raw_input_contents_size(), 1);
  EXPECT_EQ(kserve.raw_input_contents(0), request.input().data());
  EXPECT_EQ(kserve.parameters().at("axis").int64_param(), 0);
  EXPECT_DOUBLE_EQ(kserve.parameters().at("temperature").double_param(), 0.5);

  request.set_log(false);
  request.set_axis(-1);
  request.set_temperature(1.0f);
  const inference::ModelInferRequest plain = KserveRequestOf(request);
  EXPECT_EQ(plain.model_name(), "softmax");
  EXPECT_TRUE(plain.parameters().empty());
}

TEST(ParseKserveResponseTest, MovesTheFirstOutputIntoASoftmaxResponse) {
  inference::ModelInferResponse answer;
  auto* output = answer.add_outputs();
  output->set_name("OUTPUT");
  output->set_datatype("FP16");
  output->add_shape(2);
  output->add_shape(3);
  answer.add_raw_output_contents(std::string(12, 'x'));
  inference::ModelInferResponse scratch;
  v1::SoftmaxResponse response;
  for (int round = 0; round < 2; ++round) {  // the second parse reuses both buffers
    const std::string bytes = answer.SerializeAsString();
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    ASSERT_TRUE(ParseKserveResponse(&buffer, &scratch, &response));
    EXPECT_EQ(response.output().dtype(), v1::DTYPE_FLOAT16);
    EXPECT_EQ(response.output().shape_size(), 2);
    EXPECT_EQ(response.output().shape(1), 3);
    EXPECT_EQ(response.output().data(), std::string(12, 'x'));
    EXPECT_EQ(buffer.Length(), 0u);
  }

  output->set_datatype("INT8");
  const std::string bytes = answer.SerializeAsString();
  grpc::Slice slice(bytes);
  grpc::ByteBuffer buffer(&slice, 1);
  EXPECT_FALSE(ParseKserveResponse(&buffer, &scratch, &response));
  inference::ModelInferResponse empty;
  const std::string none = empty.SerializeAsString();
  grpc::Slice none_slice(none);
  grpc::ByteBuffer none_buffer(&none_slice, 1);
  EXPECT_FALSE(ParseKserveResponse(&none_buffer, &scratch, &response));
}

}  // namespace
}  // namespace softmax::client
