// Validate(ServerOptions): the defaults pass, and each refusal names its flag.
#include "server/server_options.h"

#include <functional>
#include <string>

#include <gtest/gtest.h>

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
  options.max_connection_age_s = kMaxConnectionAgeS;
  options.max_stream_age_s = kMaxConnectionAgeS;
  options.max_queue_delay_us = kMaxQueueDelayUs;
  options.max_held_bytes = 0;
  options.shutdown_grace_s = 0;
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
        Refusal{"Device", [](ServerOptions& o) { o.device = "tpu"; }, "--device: expected"},
        Refusal{"RepeatedGpu", [](ServerOptions& o) { o.device = "cuda:0,0"; },
                "--device: expected"},
        Refusal{"SharedMemory", [](ServerOptions& o) { o.shared_memory = "some"; },
                "--shared_memory"},
        Refusal{"LogFormat", [](ServerOptions& o) { o.log_format = "xml"; },
                "--log_format: expected text or json"},
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
        Refusal{"ConnectionAgeNegative", [](ServerOptions& o) { o.max_connection_age_s = -1; },
                "--max_connection_age_s: 0 (no maximum) to 2073600, got -1"},
        Refusal{"ConnectionAgeTooLong",
                [](ServerOptions& o) { o.max_connection_age_s = kMaxConnectionAgeS + 1; },
                "--max_connection_age_s: 0 (no maximum) to 2073600, got 2073601"},
        Refusal{"StreamAgeTooLong",
                [](ServerOptions& o) { o.max_stream_age_s = kMaxConnectionAgeS + 1; },
                "--max_stream_age_s: 0 (no maximum) to 2073600"},
        Refusal{"HeldBytes", [](ServerOptions& o) { o.max_held_bytes = -1; },
                "--max_held_bytes: must be >= 0"},
        Refusal{"QueueDelayNegative", [](ServerOptions& o) { o.max_queue_delay_us = -1; },
                "--max_queue_delay_us: must not be negative"},
        Refusal{"QueueDelayTooLong",
                [](ServerOptions& o) { o.max_queue_delay_us = kMaxQueueDelayUs + 1; },
                "--max_queue_delay_us: at most 3600000000 (an hour)"},
        Refusal{"Grace", [](ServerOptions& o) { o.shutdown_grace_s = -1; },
                "--shutdown_grace_s: must not be negative"},
        Refusal{"AccessLog", [](ServerOptions& o) { o.access_log_one_in = -1; },
                "--access_log_one_in: must not be negative"},
        Refusal{"InjectedFault", [](ServerOptions& o) { o.inject_fault_after_batches = -1; },
                "SOFTMAX_TEST_INJECT_FAULT_AFTER_BATCHES: must not be negative"}),
    [](const ::testing::TestParamInfo<Refusal>& info) { return info.param.name; });

}  // namespace
}  // namespace softmax::server
