#include "server/rpc/grpc/status_util.h"

#include <gtest/gtest.h>

namespace softmax::server {
namespace {

TEST(StatusUtilTest, CodesAndMessagesCarryOver) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  const grpc::Status invalid = ToGrpcStatus(absl::InvalidArgumentError("axis: bad"));
  EXPECT_EQ(invalid.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(invalid.error_message(), "axis: bad");
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("full")).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpcStatus(absl::DeadlineExceededError("late")).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("oom")).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ToGrpcStatus(absl::InternalError("fault")).error_code(),
            grpc::StatusCode::INTERNAL);
}

}  // namespace
}  // namespace softmax::server
