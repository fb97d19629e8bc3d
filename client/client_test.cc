#include "client/client.h"

#include "gtest/gtest.h"

namespace softmax::client {
namespace {

TEST(ClientTest, EncodesHealthCheckRequests) {
  EXPECT_EQ(EncodeHealthCheckRequest(""), "");
  EXPECT_EQ(EncodeHealthCheckRequest("softmax.v1.SoftmaxService"),
            std::string("\x0a\x19") + "softmax.v1.SoftmaxService");
  const std::string long_name(200, 'x');
  EXPECT_EQ(EncodeHealthCheckRequest(long_name), std::string("\x0a\xc8\x01") + long_name);
}

TEST(ClientTest, DecodesHealthCheckResponses) {
  EXPECT_EQ(*DecodeHealthCheckResponse(""), HealthState::kUnknown);
  EXPECT_EQ(*DecodeHealthCheckResponse(std::string("\x08\x01", 2)), HealthState::kServing);
  EXPECT_EQ(*DecodeHealthCheckResponse(std::string("\x08\x02", 2)), HealthState::kNotServing);
  // Unknown fields are skipped.
  EXPECT_EQ(*DecodeHealthCheckResponse(std::string("\x12\x02" "ab\x08\x01", 6)),
            HealthState::kServing);
  EXPECT_FALSE(DecodeHealthCheckResponse(std::string("\x08", 1)).ok());
  EXPECT_FALSE(DecodeHealthCheckResponse(std::string("\x12\x05" "ab", 4)).ok());
  EXPECT_STREQ(HealthStateName(HealthState::kNotServing), "NOT_SERVING");
}

TEST(ClientTest, ConvertsGrpcStatusCodes) {
  const absl::Status status =
      FromGrpcStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "axis: out of range"));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "axis: out of range");
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "")).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(ClientTest, UnreachableServerIsUnavailable) {
  ChannelOptions options;
  options.target = "127.0.0.1:1";  // nothing listens on port 1
  std::shared_ptr<grpc::Channel> channel = CreateChannel(options);
  absl::StatusOr<HealthState> state = CheckHealth(channel, "", absl::Seconds(5));
  EXPECT_EQ(state.status().code(), absl::StatusCode::kUnavailable);
  v1::SoftmaxRequest request;
  CallOptions call;
  call.timeout = absl::Seconds(5);
  EXPECT_EQ(CallSoftmax(channel, request, call).status().code(), absl::StatusCode::kUnavailable);
  call.stream = true;
  EXPECT_EQ(CallSoftmax(channel, request, call).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace softmax::client
