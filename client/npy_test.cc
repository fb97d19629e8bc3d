#include "client/npy.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "client/tensor.h"
#include "gtest/gtest.h"
#include "kernels/dtype.h"

namespace softmax::client {
namespace {

std::string Float32Bytes(std::initializer_list<float> values) {
  std::string bytes;
  for (float v : values) bytes.append(reinterpret_cast<const char*>(&v), 4);
  return bytes;
}

TEST(NpyTest, SerializeMatchesNumpyByteForByte) {
  // np.save(f, np.arange(6, dtype='<f4').reshape(2, 3)) from NumPy 1.24.
  const std::string numpy_header =
      std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" + std::string(58, ' ') + "\n";
  NpyArray array;
  array.descr = "<f4";
  array.shape = {2, 3};
  array.data = Float32Bytes({0, 1, 2, 3, 4, 5});
  const std::string bytes = SerializeNpy(array);
  ASSERT_EQ(bytes.size(), 128u + 24u);
  EXPECT_EQ(bytes.substr(0, 128), numpy_header);
  EXPECT_EQ(bytes.substr(128), array.data);
}

TEST(NpyTest, RoundTripsEveryDtypeAndRank) {
  for (const char* descr : {"<f4", "<f2", "<u2", "<f8"}) {
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{}, {5}, {2, 3}, {2, 0, 4}, {1, 1, 1, 7}}) {
      NpyArray array;
      array.descr = descr;
      array.shape = shape;
      const int64_t count = *ElementCount(shape);
      const int item = descr[2] == '8' ? 8 : descr[2] == '4' ? 4 : 2;
      for (int64_t i = 0; i < count * item; ++i) array.data.push_back(static_cast<char>(i * 7 + 3));
      absl::StatusOr<NpyArray> parsed = ParseNpy(SerializeNpy(array));
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(parsed->descr, descr);
      EXPECT_EQ(parsed->shape, shape);
      EXPECT_EQ(parsed->data, array.data);
      EXPECT_EQ(SerializeNpy(array).size() % 64, array.data.size() % 64);
    }
  }
}

TEST(NpyTest, ParsesVersion2AndDoubleQuotes) {
  const std::string header = "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2,)}\n";
  std::string bytes("\x93NUMPY\x02\x00", 8);
  const uint32_t size = static_cast<uint32_t>(header.size());
  bytes.append(reinterpret_cast<const char*>(&size), 4);
  bytes += header;
  bytes += Float32Bytes({1.5f, -2.0f});
  absl::StatusOr<NpyArray> parsed = ParseNpy(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(parsed->data, Float32Bytes({1.5f, -2.0f}));
}

TEST(NpyTest, RejectsMalformedFiles) {
  NpyArray good;
  good.descr = "<f4";
  good.shape = {3};
  good.data = Float32Bytes({1, 2, 3});
  const std::string bytes = SerializeNpy(good);
  EXPECT_FALSE(ParseNpy("not numpy at all").ok());
  EXPECT_FALSE(ParseNpy(bytes.substr(0, bytes.size() - 1)).ok());  // short data
  EXPECT_FALSE(ParseNpy(bytes + "x").ok());                        // long data
  EXPECT_FALSE(ParseNpy(bytes.substr(0, 20)).ok());                // truncated header

  NpyArray fortran = good;
  std::string fortran_bytes = SerializeNpy(fortran);
  fortran_bytes.replace(fortran_bytes.find("False"), 5, "True ");
  absl::StatusOr<NpyArray> parsed = ParseNpy(fortran_bytes);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("Fortran"), absl::string_view::npos);

  NpyArray big_endian = good;
  big_endian.descr = ">f4";
  parsed = ParseNpy(SerializeNpy(big_endian));
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find(">f4"), absl::string_view::npos);

  NpyArray integers = good;
  integers.descr = "<i4";
  EXPECT_FALSE(ParseNpy(SerializeNpy(integers)).ok());
}

TEST(NpyTest, TensorConversionKeepsBitsAndRecordsBfloat16AsU2) {
  RandomTensorOptions options;
  options.shape = {3, 5};
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16}) {
    options.dtype = dtype;
    v1::Tensor tensor = *MakeRandomTensor(options);
    NpyArray array = NpyFromTensor(tensor);
    EXPECT_EQ(array.descr, dtype == v1::DTYPE_FLOAT32   ? "<f4"
                           : dtype == v1::DTYPE_FLOAT16 ? "<f2"
                                                        : "<u2");
    absl::StatusOr<v1::Tensor> back = TensorFromNpy(*ParseNpy(SerializeNpy(array)));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->dtype(), dtype);
    EXPECT_EQ(ShapeOf(*back), options.shape);
    EXPECT_EQ(back->data(), tensor.data());
  }
}

TEST(NpyTest, ConvertsToTheRequestedDtype) {
  NpyArray array;
  array.descr = "<f8";
  array.shape = {3};
  for (double v : {1.0, -0.333333333333, 65504.0}) array.data.append(reinterpret_cast<const char*>(&v), 8);

  absl::StatusOr<v1::Tensor> as_float32 = TensorFromNpy(array);
  ASSERT_TRUE(as_float32.ok());
  EXPECT_EQ(as_float32->dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(TensorToFloats(*as_float32)[1], static_cast<float>(-0.333333333333));

  absl::StatusOr<v1::Tensor> as_half = TensorFromNpy(array, v1::DTYPE_FLOAT16);
  ASSERT_TRUE(as_half.ok());
  EXPECT_EQ(as_half->dtype(), v1::DTYPE_FLOAT16);
  EXPECT_EQ(as_half->data().size(), 6u);
  EXPECT_EQ(TensorToFloats(*as_half)[2], 65504.0f);

  absl::StatusOr<v1::Tensor> as_bf16 = TensorFromNpy(array, v1::DTYPE_BFLOAT16);
  ASSERT_TRUE(as_bf16.ok());
  EXPECT_EQ(TensorToFloats(*as_bf16)[0], 1.0f);

  NpyArray bits;
  bits.descr = "<u2";
  bits.shape = {1};
  bits.data = std::string("\x80\x3f", 2);  // bfloat16 1.0
  EXPECT_TRUE(TensorFromNpy(bits, v1::DTYPE_BFLOAT16).ok());
  EXPECT_FALSE(TensorFromNpy(bits, v1::DTYPE_FLOAT32).ok());
}

TEST(NpyTest, FileRoundTripAndMissingFile) {
  const std::string path = ::testing::TempDir() + "/softmax_client_npy_test.npy";
  NpyArray array;
  array.descr = "<f2";
  array.shape = {2, 2};
  array.data = std::string("\x00\x3c\x00\x40\x00\xc0\x00\x00", 8);
  ASSERT_TRUE(WriteNpyFile(path, array).ok());
  absl::StatusOr<NpyArray> read = ReadNpyFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->data, array.data);
  std::remove(path.c_str());
  EXPECT_EQ(ReadNpyFile(path).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace softmax::client
