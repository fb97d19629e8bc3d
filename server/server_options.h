// Everything softmax-server is configured with, one field per flag. main.cc
// fills it from the command line and hands it to Server (server/server.h);
// nothing else reads flags. Validate checks what every field must be, for
// softmax-server and for code that embeds a Server alike. What each flag means is written once, in its
// help text in main.cc (`softmax-server --help`); the measured tuning values
// that are no flags are named constants beside the code they tune
// (scheduler.cc, batcher.h, cuda_backend.h, common/malloc_tuning.h; the
// drain's in server.cc), and what follows from a flag (the queue's byte
// bound from --max_held_bytes) is derived in server.cc.
#ifndef SOFTMAX_SERVER_SERVER_OPTIONS_H_
#define SOFTMAX_SERVER_SERVER_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace softmax::server {

// An hour: longer batching delays are a mistake, and bounding them keeps the
// batcher's time arithmetic far from overflow.
inline constexpr int64_t kMaxQueueDelayUs = int64_t{3600} * 1000 * 1000;
// gRPC takes the connection age in int milliseconds: about 24 days at most.
inline constexpr int64_t kMaxConnectionAgeS = int64_t{24} * 24 * 3600;

struct ServerOptions {
  std::string grpc_address = "0.0.0.0:50051";
  std::string metrics_address = "0.0.0.0:9464";
  std::string http_address = "0.0.0.0:8000";
  std::string device = "auto";
  int64_t max_tensor_bytes = int64_t{1} << 30;
  int64_t max_batch_rows = 8192;
  int64_t max_batch_bytes = int64_t{64} << 20;
  int64_t max_queue_delay_us = 0;
  int64_t max_queued_requests = 8192;
  int64_t max_held_bytes = int64_t{8} << 30;
  int max_concurrent_streams = 1024;
  int64_t max_connection_age_s = 0;
  int64_t max_stream_age_s = 0;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  std::string auth_tokens_file;
  bool reflection = true;
  std::string shared_memory = "all";
  int shutdown_grace_s = 30;
  std::string log_format = "text";
  int64_t access_log_one_in = 0;
  std::string listening_file;
  // Testing only, from SOFTMAX_TEST_INJECT_FAULT_AFTER_BATCHES: the GPU
  // backends provoke a real sticky fault after this many batches (0 = never).
  int64_t inject_fault_after_batches = 0;
  // Testing only, from SOFTMAX_TEST_NO_IDLE_DISPATCH=1: an idle device waits
  // --max_queue_delay_us for company like a busy one, so that end-to-end
  // tests can hold requests in the queue (BatcherOptions::dispatch_when_idle).
  bool test_no_idle_dispatch = false;
  // Not a flag: the version the KServe endpoints report in their server
  // metadata; softmax-server passes its own (SOFTMAX_VERSION).
  std::string server_version = "unknown";
  // Not a flag: the source revision the listening file reports; softmax-server
  // passes its own (SOFTMAX_GIT_REVISION).
  std::string revision = "unknown";
};

// OK when `options` can be served; otherwise INVALID_ARGUMENT naming the
// first flag out of range or unreadable ("--max_batch_rows: must be
// positive, got 0"). Server::Start calls it first; softmax-server's main
// before it configures anything. Files and addresses are checked where they
// are used (Start), not here.
absl::Status Validate(const ServerOptions& options);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_SERVER_OPTIONS_H_
