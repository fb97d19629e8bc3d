#include "common/chunk_wire.h"

#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>
#include <gtest/gtest.h>

#include "softmax/v1/softmax.pb.h"

namespace softmax {
namespace {

// `bytes` as a ByteBuffer of slices cut at `cuts` (offsets, ascending).
grpc::ByteBuffer Sliced(const std::string& bytes, const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  size_t begin = 0;
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.data() + begin, cut - begin);
    begin = cut;
  }
  slices.emplace_back(bytes.data() + begin, bytes.size() - begin);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

v1::SoftmaxRequest LaterRequest() {
  v1::SoftmaxRequest request;
  request.set_request_id("tensor-7");
  std::string data(300, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + 5);
  request.mutable_input()->set_data(data);
  request.set_chunk_offset(4096);
  request.set_more_chunks(true);
  return request;
}

std::string Joined(const ChunkView& view) {
  std::string out(static_cast<size_t>(view.data_bytes), '\0');
  view.CopyTo(out.data());
  return out;
}

TEST(ReadLaterChunkTest, ReadsTheFieldsAcrossAnySliceBoundary) {
  const v1::SoftmaxRequest request = LaterRequest();
  const std::string bytes = request.SerializeAsString();
  for (size_t a = 0; a <= bytes.size(); a += 7) {
    for (size_t b = a; b <= bytes.size(); b += 13) {
      ChunkView view;
      ASSERT_TRUE(ReadLaterChunk(Sliced(bytes, {a, b}), kRequestChunkFields, &view))
          << "cut at " << a << ", " << b;
      EXPECT_EQ(view.request_id, "tensor-7");
      EXPECT_EQ(view.chunk_offset, 4096);
      EXPECT_TRUE(view.more_chunks);
      ASSERT_EQ(view.data_bytes, 300);
      EXPECT_EQ(Joined(view), request.input().data());
      std::string appended = "x";
      view.AppendTo(&appended);
      EXPECT_EQ(appended, "x" + request.input().data());
    }
  }
}

TEST(ReadLaterChunkTest, ReadsAResponseChunkAndAnEmptyOne) {
  v1::SoftmaxResponse response;
  response.set_request_id("3");
  response.mutable_output()->set_data("abcdef");
  response.set_chunk_offset(12);
  ChunkView view;
  ASSERT_TRUE(ReadLaterChunk(Sliced(response.SerializeAsString(), {}), kResponseChunkFields,
                             &view));
  EXPECT_EQ(view.request_id, "3");
  EXPECT_EQ(view.chunk_offset, 12);
  EXPECT_FALSE(view.more_chunks);
  EXPECT_EQ(Joined(view), "abcdef");
  // The request's numbering does not read a response.
  EXPECT_FALSE(ReadLaterChunk(Sliced(response.SerializeAsString(), {}), kRequestChunkFields,
                              &view));
  response.clear_output();
  ASSERT_TRUE(ReadLaterChunk(Sliced(response.SerializeAsString(), {}), kResponseChunkFields,
                             &view));
  EXPECT_EQ(view.data_bytes, 0);
}

// Everything but the plain shape is left to the full parse.
TEST(ReadLaterChunkTest, LeavesEveryOtherMessageToTheFullParse) {
  std::vector<std::pair<std::string, v1::SoftmaxRequest>> cases;
  auto with = [&](const std::string& name, auto change) {
    v1::SoftmaxRequest request = LaterRequest();
    change(request);
    cases.emplace_back(name, request);
  };
  with("first chunk", [](v1::SoftmaxRequest& r) { r.set_chunk_offset(0); });
  with("negative offset", [](v1::SoftmaxRequest& r) { r.set_chunk_offset(-5); });
  with("dtype", [](v1::SoftmaxRequest& r) { r.mutable_input()->set_dtype(v1::DTYPE_FLOAT16); });
  with("shape", [](v1::SoftmaxRequest& r) { r.mutable_input()->add_shape(3); });
  with("axis", [](v1::SoftmaxRequest& r) { r.set_axis(0); });
  with("temperature", [](v1::SoftmaxRequest& r) { r.set_temperature(2.0f); });
  with("log", [](v1::SoftmaxRequest& r) { r.set_log(true); });
  with("long id", [](v1::SoftmaxRequest& r) { r.set_request_id(std::string(2000, 'i')); });
  for (const auto& [name, request] : cases) {
    ChunkView view;
    EXPECT_FALSE(ReadLaterChunk(Sliced(request.SerializeAsString(), {}), kRequestChunkFields,
                                &view))
        << name;
  }
  const std::string good = LaterRequest().SerializeAsString();
  ChunkView view;
  for (size_t cut : {size_t{1}, size_t{5}, good.size() - 1}) {
    EXPECT_FALSE(ReadLaterChunk(Sliced(good.substr(0, cut), {}), kRequestChunkFields, &view))
        << "truncated at " << cut;
  }
  // A field twice, an unknown field, a tensor whose length overruns the message.
  EXPECT_FALSE(ReadLaterChunk(Sliced(good + "\x30\x01", {}), kRequestChunkFields, &view));
  EXPECT_FALSE(ReadLaterChunk(Sliced(good + "\x48\x01", {}), kRequestChunkFields, &view));
  EXPECT_FALSE(ReadLaterChunk(Sliced(std::string("\x12\xff\x01", 3) + "ab", {}),
                              kRequestChunkFields, &view));
  EXPECT_FALSE(ReadLaterChunk(grpc::ByteBuffer(), kRequestChunkFields, &view));
}

}  // namespace
}  // namespace softmax
