// Talking to softmax-server: channel creation with message limits raised,
// one-shot calls (unary, or one request on the bidirectional stream), and the
// standard grpc.health.v1 health check.
//
// Thread-safety: the functions are safe to call concurrently; a channel may be
// shared by any number of threads.
#ifndef SOFTMAX_CLIENT_CLIENT_H_
#define SOFTMAX_CLIENT_CLIENT_H_

#include <climits>
#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "softmax/v1/softmax.grpc.pb.h"

namespace softmax::client {

// How to reach the server.
struct ChannelOptions {
  // host:port, or any gRPC target URI (dns:///, unix:).
  std::string target = "localhost:50051";
  // Send and receive limit for one message. gRPC's client default receive
  // limit is 4 MiB, far below a server's --max_tensor_bytes (1 GiB by
  // default); the widest gRPC accepts is INT_MAX. The server enforces its own.
  int max_message_bytes = INT_MAX;
};

// An insecure channel to options.target with the limits above. The channel
// connects lazily; failures show up on the first call.
std::shared_ptr<grpc::Channel> CreateChannel(const ChannelOptions& options);

// Converts a gRPC status to the absl::Status with the same code and message
// (the two code spaces are numbered alike).
absl::Status FromGrpcStatus(const grpc::Status& status);

// How one call is made.
struct CallOptions {
  // Deadline for the whole call; absl::InfiniteDuration() for none.
  absl::Duration timeout = absl::Seconds(60);
  // false: the unary Softmax RPC. true: one request on SoftmaxStream; an
  // `error` carried in the stream response is returned as the status.
  bool stream = false;
  // Wait for the channel to connect instead of failing fast when the server
  // is not up yet (gRPC's wait_for_ready).
  bool wait_for_ready = false;
};

// Sends `request` and returns the server's response, or the RPC's status
// (INVALID_ARGUMENT for a bad request, UNAVAILABLE when unreachable, ...).
absl::StatusOr<v1::SoftmaxResponse> CallSoftmax(const std::shared_ptr<grpc::Channel>& channel,
                                                const v1::SoftmaxRequest& request,
                                                const CallOptions& options);

// grpc.health.v1 serving states, numbered as on the wire.
enum class HealthState : int { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };
const char* HealthStateName(HealthState state);

// Calls grpc.health.v1.Health/Check for `service` ("" = the whole server).
// NOT_FOUND when the server does not know the service name.
absl::StatusOr<HealthState> CheckHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                                        absl::Duration timeout);

// The health messages, encoded by hand: libgrpc++ ships no generated
// grpc.health.v1 classes, and generating our own could collide with a
// server's in one process. Exposed for tests.
std::string EncodeHealthCheckRequest(const std::string& service);
absl::StatusOr<HealthState> DecodeHealthCheckResponse(const std::string& bytes);

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_CLIENT_H_
