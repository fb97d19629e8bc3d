// Tests of the load options: the payload-mix grammar, mix files, the Arrival
// flag type and the validation of whole option sets.
#include "client/load/options.h"

#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace softmax::client {
namespace {

TEST(LoadShapeTest, ParsesDimsDtypeAndWeight) {
  absl::StatusOr<LoadShape> shape = ParseLoadShape("8x4096:fp16:2.5");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->dims, (std::vector<int64_t>{8, 4096}));
  EXPECT_EQ(shape->dtype, v1::DTYPE_FLOAT16);
  EXPECT_EQ(shape->weight, 2.5);

  shape = ParseLoadShape(" 1x16M:float32 ");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->dims, (std::vector<int64_t>{1, 16 << 20}));
  EXPECT_EQ(shape->dtype, v1::DTYPE_FLOAT32);
  EXPECT_EQ(shape->weight, 1.0);

  shape = ParseLoadShape("2x3x4K:bfloat16");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->dims, (std::vector<int64_t>{2, 3, 4096}));
  EXPECT_EQ(shape->dtype, v1::DTYPE_BFLOAT16);
}

TEST(LoadShapeTest, RejectsMalformedEntries) {
  // "1x1024" has no dtype: a mix entry always names one, so that a shape with
  // commas in a comma-separated mix cannot be read as several entries.
  for (const char* bad : {"", "1x1024", "1xa:fp32", "1x-3:fp32", "1x8:float64", "1x8:fp32:0",
                          "1x8:fp32:-1", "1x8:fp32:inf", "1x8:fp32:1:extra", "1x8:fp32:w",
                          ":fp32", "1x8:", "4294967296x4294967296:fp32"}) {
    const absl::Status status = ParseLoadShape(bad).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("mix entry"), absl::string_view::npos) << status;
  }
}

TEST(LoadShapeTest, FormatsTheCanonicalLabel) {
  EXPECT_EQ(FormatLoadShape(*ParseLoadShape("1x1K:fp16")), "1x1024:float16:1");
  EXPECT_EQ(FormatLoadShape(*ParseLoadShape("64x32000:bf16:0.25")), "64x32000:bfloat16:0.25");
}

TEST(LoadMixTest, ParsesCommaSeparatedEntries) {
  absl::StatusOr<std::vector<LoadShape>> mix =
      ParseLoadMix("1x1024:float32:3, 8x4096:float16,4x1000:bf16:1");
  ASSERT_TRUE(mix.ok()) << mix.status();
  ASSERT_EQ(mix->size(), 3u);
  EXPECT_EQ((*mix)[0].weight, 3.0);
  EXPECT_EQ((*mix)[1].dims, (std::vector<int64_t>{8, 4096}));
  EXPECT_EQ((*mix)[2].dtype, v1::DTYPE_BFLOAT16);
}

TEST(LoadMixTest, RefusesAShapeWithCommas) {
  // "2,1024:fp16" would otherwise be the entries "2" and "1024:fp16".
  EXPECT_EQ(ParseLoadMix("2,1024:fp16").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLoadMix("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLoadMix(" , ").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoadMixTest, ReadsAMixFile) {
  const std::string path = ::testing::TempDir() + "/load_mix.txt";
  {
    std::ofstream file(path);
    file << "# the production mix\n"
         << "1x1024:float32:8   # most calls\n"
         << "\n"
         << "  64x32000:bf16:1\n";
  }
  absl::StatusOr<std::vector<LoadShape>> shapes = ReadLoadMixFile(path);
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  ASSERT_EQ(shapes->size(), 2u);
  EXPECT_EQ((*shapes)[0].weight, 8.0);
  EXPECT_EQ((*shapes)[1].dims, (std::vector<int64_t>{64, 32000}));
  EXPECT_EQ((*shapes)[1].dtype, v1::DTYPE_BFLOAT16);

  {
    std::ofstream file(path);
    file << "1x1024:fp32\n1x:fp32\n";
  }
  shapes = ReadLoadMixFile(path);
  EXPECT_EQ(shapes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shapes.status().message().find(":2:"), absl::string_view::npos) << shapes.status();

  {
    std::ofstream file(path);
    file << "# nothing but comments\n\n";
  }
  EXPECT_EQ(ReadLoadMixFile(path).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadLoadMixFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(ArrivalFlagTest, ParsesAndUnparses) {
  Arrival arrival = Arrival::kConstant;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("poisson", &arrival, &error));
  EXPECT_EQ(arrival, Arrival::kPoisson);
  EXPECT_EQ(AbslUnparseFlag(arrival), "poisson");
  EXPECT_TRUE(AbslParseFlag("constant", &arrival, &error));
  EXPECT_EQ(arrival, Arrival::kConstant);
  EXPECT_EQ(AbslUnparseFlag(arrival), "constant");
  EXPECT_FALSE(AbslParseFlag("burst", &arrival, &error));
  EXPECT_FALSE(error.empty());
}

TEST(ProtocolFlagTest, ParsesAndUnparsesEveryProtocol) {
  for (const LoadProtocol protocol :
       {LoadProtocol::kSoftmaxV1, LoadProtocol::kKserve, LoadProtocol::kHttp}) {
    LoadProtocol parsed = LoadProtocol::kSoftmaxV1;
    std::string error;
    ASSERT_TRUE(AbslParseFlag(AbslUnparseFlag(protocol), &parsed, &error)) << error;
    EXPECT_EQ(parsed, protocol);
  }
  EXPECT_EQ(AbslUnparseFlag(LoadProtocol::kHttp), "http");
  LoadProtocol parsed = LoadProtocol::kSoftmaxV1;
  std::string error;
  EXPECT_FALSE(AbslParseFlag("rest", &parsed, &error));
  EXPECT_EQ(error, "want softmax.v1, kserve or http");
}

LoadOptions Runnable() {
  LoadOptions options;
  options.shapes = {LoadShape{{1, 1024}}};
  return options;
}

TEST(ValidateLoadOptionsTest, AcceptsARunnableSet) {
  EXPECT_TRUE(ValidateLoadOptions(Runnable()).ok());
  LoadOptions http = Runnable();
  http.protocol = LoadProtocol::kHttp;
  http.target = "127.0.0.1:8000";
  EXPECT_TRUE(ValidateLoadOptions(http).ok());
  LoadOptions kserve_stream = Runnable();
  kserve_stream.protocol = LoadProtocol::kKserve;
  kserve_stream.stream = true;
  EXPECT_TRUE(ValidateLoadOptions(kserve_stream).ok());
  LoadOptions options = Runnable();
  options.requests = 10;
  options.duration = absl::InfiniteDuration();
  options.timeout = absl::InfiniteDuration();
  EXPECT_TRUE(ValidateLoadOptions(options).ok());
}

TEST(ValidateLoadOptionsTest, NamesTheFlagOfEachBadField) {
  struct Case {
    const char* flag;
    void (*spoil)(LoadOptions*);
  };
  const Case cases[] = {
      {"--connections", [](LoadOptions* o) { o->connections = 0; }},
      {"--concurrency", [](LoadOptions* o) { o->concurrency = 0; }},
      {"--rate", [](LoadOptions* o) { o->rate = -5; }},
      {"--max_outstanding", [](LoadOptions* o) { o->max_outstanding = 0; }},
      {"--duration", [](LoadOptions* o) { o->duration = absl::ZeroDuration(); }},
      {"--duration", [](LoadOptions* o) { o->duration = absl::InfiniteDuration(); }},
      {"--requests", [](LoadOptions* o) { o->requests = -1; }},
      {"--warmup", [](LoadOptions* o) { o->warmup = -absl::Seconds(1); }},
      {"--connect_timeout", [](LoadOptions* o) { o->connect_timeout = absl::ZeroDuration(); }},
      {"--mix", [](LoadOptions* o) { o->shapes.clear(); }},
      {"--mix", [](LoadOptions* o) { o->shapes[0].weight = 0; }},
      {"--payloads_per_shape", [](LoadOptions* o) { o->payloads_per_shape = 0; }},
      {"--temperature", [](LoadOptions* o) { o->temperature = 0; }},
      {"--max_message_bytes", [](LoadOptions* o) { o->max_message_bytes = 0; }},
      {"--chunk_bytes needs --protocol=softmax.v1",
       [](LoadOptions* o) {
         o->protocol = LoadProtocol::kKserve;
         o->stream = true;
         o->chunk_bytes = 1000;
       }},
      {"--stream is not available with --protocol=http",
       [](LoadOptions* o) {
         o->protocol = LoadProtocol::kHttp;
         o->target = "localhost:8000";
         o->stream = true;
       }},
      {"--target=dns:///localhost:8000",
       [](LoadOptions* o) {
         o->protocol = LoadProtocol::kHttp;
         o->target = "dns:///localhost:8000";
       }},
  };
  for (const Case& c : cases) {
    LoadOptions options = Runnable();
    c.spoil(&options);
    const absl::Status status = ValidateLoadOptions(options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.flag;
    EXPECT_NE(status.message().find(c.flag), absl::string_view::npos) << status;
  }
}

}  // namespace
}  // namespace softmax::client
