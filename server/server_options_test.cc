// Validate(ServerOptions): the defaults pass, and each refusal names its flag.
#include "server/server_options.h"

#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "absl/flags/marshalling.h"

namespace softmax::server {
namespace {

TEST(ValidateTest, DefaultsAreValid) { EXPECT_TRUE(Validate(ServerOptions()).ok()); }

TEST(ValidateTest, TheLimitsOfEachRangeAreAccepted) {
  ServerOptions options;
  options.max_tensor_bytes = 1;
  options.max_batch_rows = 1;
  options.max_batch_bytes = 1;
  options.max_queued_requests = 1;
  options.max_concurrent_streams = 1;
  options.max_connection_age = kMaxConnectionAge;
  options.max_stream_age = kMaxConnectionAge;
  options.max_queue_delay = kMaxQueueDelay;
  options.max_held_bytes = 0;
  options.shutdown_grace = absl::ZeroDuration();
  options.access_log_one_in = 0;
  EXPECT_TRUE(Validate(options).ok()) << Validate(options);
}

struct Refusal {
  std::string name;
  std::function<void(ServerOptions&)> set;
  std::string message;  // a part of the error
};

class ValidateRefusalTest : public ::testing::TestWithParam<Refusal> {};

TEST_P(ValidateRefusalTest, NamesTheFlag) {
  ServerOptions options;
  GetParam().set(options);
  const absl::Status status = Validate(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find(GetParam().message), std::string::npos)
      << status;
}

INSTANTIATE_TEST_SUITE_P(
    EachField, ValidateRefusalTest,
    ::testing::Values(
        Refusal{"RepeatedGpu",
                [](ServerOptions& o) { o.device = {DeviceSpec::Kind::kCuda, {0, 0}}; },
                "--device: expected"},
        Refusal{"NegativeGpu",
                [](ServerOptions& o) { o.device = {DeviceSpec::Kind::kCuda, {-1}}; },
                "--device: expected"},
        Refusal{"TensorBytes", [](ServerOptions& o) { o.max_tensor_bytes = 0; },
                "--max_tensor_bytes: must be positive, got 0"},
        Refusal{"BatchRows", [](ServerOptions& o) { o.max_batch_rows = 0; },
                "--max_batch_rows: must be positive, got 0"},
        Refusal{"BatchBytes", [](ServerOptions& o) { o.max_batch_bytes = -1; },
                "--max_batch_bytes: must be positive, got -1"},
        Refusal{"QueuedRequests", [](ServerOptions& o) { o.max_queued_requests = 0; },
                "--max_queued_requests: must be positive"},
        Refusal{"ConcurrentStreams", [](ServerOptions& o) { o.max_concurrent_streams = 0; },
                "--max_concurrent_streams: must be positive"},
        Refusal{"ConnectionAgeNegative", [](ServerOptions& o) { o.max_connection_age = absl::Seconds(-1); },
                "--max_connection_age_s: 0 (no maximum) to 2073600, got -1"},
        Refusal{"ConnectionAgeTooLong",
                [](ServerOptions& o) { o.max_connection_age = kMaxConnectionAge + absl::Seconds(1); },
                "--max_connection_age_s: 0 (no maximum) to 2073600, got 2073601"},
        Refusal{"StreamAgeTooLong",
                [](ServerOptions& o) { o.max_stream_age = kMaxConnectionAge + absl::Seconds(1); },
                "--max_stream_age_s: 0 (no maximum) to 2073600"},
        Refusal{"HeldBytes", [](ServerOptions& o) { o.max_held_bytes = -1; },
                "--max_held_bytes: must be >= 0"},
        Refusal{"QueueDelayNegative", [](ServerOptions& o) { o.max_queue_delay = absl::Microseconds(-1); },
                "--max_queue_delay_us: must not be negative"},
        Refusal{"QueueDelayTooLong",
                [](ServerOptions& o) { o.max_queue_delay = kMaxQueueDelay + absl::Microseconds(1); },
                "--max_queue_delay_us: at most 3600000000 (an hour), got 3600000001"},
        Refusal{"Grace", [](ServerOptions& o) { o.shutdown_grace = absl::Seconds(-1); },
                "--shutdown_grace_s: must not be negative"},
        Refusal{"AccessLog", [](ServerOptions& o) { o.access_log_one_in = -1; },
                "--access_log_one_in: must not be negative"},
        Refusal{"InjectedFault", [](ServerOptions& o) { o.inject_fault_after_batches = -1; },
                "SOFTMAX_TEST_INJECT_FAULT_AFTER_BATCHES: must not be negative"}),
    [](const ::testing::TestParamInfo<Refusal>& info) { return info.param.name; });

// The duration flags take a count of the unit their name ends in, as before,
// or a number with its own unit; they print back as a count when whole.
TEST(DurationFlagTest, ParsesACountOfItsUnitOrAUnitOfItsOwn) {
  SecondsFlag seconds;
  std::string error;
  ASSERT_TRUE(absl::ParseFlag("5", &seconds, &error)) << error;
  EXPECT_EQ(seconds.value, absl::Seconds(5));
  EXPECT_EQ(absl::UnparseFlag(seconds), "5");
  ASSERT_TRUE(absl::ParseFlag("1500ms", &seconds, &error)) << error;
  EXPECT_EQ(seconds.value, absl::Milliseconds(1500));
  EXPECT_EQ(absl::UnparseFlag(seconds), "1.5s");
  ASSERT_TRUE(absl::ParseFlag("-1", &seconds, &error)) << error;  // Validate refuses it
  EXPECT_EQ(seconds.value, absl::Seconds(-1));
  EXPECT_FALSE(absl::ParseFlag("five", &seconds, &error));
  EXPECT_NE(error.find("unit"), std::string::npos) << error;

  MicrosecondsFlag micros;
  ASSERT_TRUE(absl::ParseFlag("250", &micros, &error)) << error;
  EXPECT_EQ(micros.value, absl::Microseconds(250));
  ASSERT_TRUE(absl::ParseFlag("2ms", &micros, &error)) << error;
  EXPECT_EQ(absl::UnparseFlag(micros), "2000");
}

TEST(TypedFlagTest, DeviceSharedMemoryAndLogFormatRoundTrip) {
  std::string error;
  for (const char* text : {"auto", "cpu", "none", "cuda:0", "cuda:2,0", "cuda:all"}) {
    DeviceSpec spec;
    ASSERT_TRUE(absl::ParseFlag(text, &spec, &error)) << text << ": " << error;
    EXPECT_EQ(absl::UnparseFlag(spec), text);
  }
  DeviceSpec spec;
  ASSERT_TRUE(absl::ParseFlag("cuda", &spec, &error)) << error;
  EXPECT_EQ(absl::UnparseFlag(spec), "cuda:0");
  EXPECT_FALSE(absl::ParseFlag("tpu", &spec, &error));
  EXPECT_NE(error.find("--device: expected"), std::string::npos) << error;

  for (const char* text : {"off", "system", "all"}) {
    SharedMemoryMode mode;
    ASSERT_TRUE(absl::ParseFlag(text, &mode, &error)) << text << ": " << error;
    EXPECT_EQ(absl::UnparseFlag(mode), text);
  }
  SharedMemoryMode mode;
  EXPECT_FALSE(absl::ParseFlag("some", &mode, &error));
  EXPECT_NE(error.find("--shared_memory: expected"), std::string::npos) << error;

  for (const char* text : {"text", "json"}) {
    logging::LogFormat format;
    ASSERT_TRUE(absl::ParseFlag(text, &format, &error)) << text << ": " << error;
    EXPECT_EQ(absl::UnparseFlag(format), text);
  }
  logging::LogFormat format;
  EXPECT_FALSE(absl::ParseFlag("xml", &format, &error));
  EXPECT_NE(error.find("--log_format: expected text or json"), std::string::npos) << error;
}

}  // namespace
}  // namespace softmax::server
