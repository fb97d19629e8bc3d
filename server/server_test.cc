// Server in process, on the CPU backend and loopback ports, through real
// gRPC clients: Start's errors, and the drain's order (server.h) as callers
// see it. The batcher holds requests in its queue (no dispatch when idle, a
// ten-minute delay), so requests are in flight at Drain for as long as a
// test needs; ServerHooks::after_drain_step stops the drain between steps
// while the test calls in. Every wait is on a condition.
#include "server/server.h"

#include <arpa/inet.h>
#include <grpc/grpc.h>
#include <grpc/support/alloc.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/cpu_softmax.h"
#include "server/testing/test_backends.h"
#include "server/testing/v1_messages.h"
#include "softmax/v1/softmax.grpc.pb.h"

namespace softmax::server {
namespace {

using ::softmax::server::testing::Await;
using ::softmax::server::testing::kWait;

// What the service answers a request it refuses while draining.
constexpr char kDrainingMessage[] = "server is shutting down; retry on another replica";

// Every row of a test tensor.
constexpr int64_t kRowLength = 16;

// A server whose batcher keeps requests queued until Drain flushes them: a
// batch forms only at max_batch_rows (8) rows, or when the oldest request
// has waited ten minutes.
ServerOptions QueueingOptions() {
  ServerOptions options;
  options.grpc_address = "127.0.0.1:0";
  options.http_address = "";
  options.metrics_address = "127.0.0.1:0";
  options.device.kind = DeviceSpec::Kind::kCpu;
  options.shared_memory = SharedMemoryMode::kOff;
  options.max_batch_rows = 8;
  options.max_queue_delay = absl::Minutes(10);
  options.test_no_idle_dispatch = true;
  options.max_connection_age = absl::ZeroDuration();
  options.server_version = "test";
  return options;
}

// `rows` rows of kRowLength float32 values from `seed`.
v1::SoftmaxRequest Request(const std::string& id, int64_t rows, uint32_t seed) {
  return testing::RandomRequest(id, {rows, kRowLength}, -1, seed);
}

using testing::ExpectCorrect;

// The value of the gauge `name` (no labels) in the server's metrics; -1
// when absent.
double Gauge(const Server& server, const std::string& name) {
  for (const prometheus::MetricFamily& family : server.metrics()->Collect()) {
    if (family.name == name && !family.metric.empty()) return family.metric[0].gauge.value;
  }
  return -1;
}

// Calls gRPC has started in this process's servers, from channelz: a call
// counts once its headers have reached the server. -1 when channelz says
// nothing.
int64_t ServerCallsStarted() {
  char* json = grpc_channelz_get_servers(0);
  if (json == nullptr) return -1;
  const std::string text(json);
  gpr_free(json);
  int64_t total = -1;
  const std::string key = "\"callsStarted\":\"";
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    const size_t begin = at + key.size();
    int64_t calls = 0;
    if (!absl::SimpleAtoi(text.substr(begin, text.find('"', begin) - begin), &calls)) return -1;
    total = std::max<int64_t>(total, 0) + calls;
  }
  return total;
}

// One unary Softmax call on the callback API.
struct UnaryCall {
  v1::SoftmaxRequest request;
  v1::SoftmaxResponse response;
  grpc::ClientContext context;
  grpc::Status status;
  absl::Notification done;

  UnaryCall(v1::SoftmaxService::Stub& stub, v1::SoftmaxRequest to_send,
            const std::string& token = "")
      : request(std::move(to_send)) {
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    stub.async()->Softmax(&context, &request, &response, [this](grpc::Status outcome) {
      status = std::move(outcome);
      done.Notify();
    });
  }
  bool Wait() { return done.WaitForNotificationWithTimeout(kWait); }
};

class Client {
 public:
  explicit Client(int port)
      : channel_(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                     grpc::InsecureChannelCredentials())),
        stub_(v1::SoftmaxService::NewStub(channel_)) {}

  v1::SoftmaxService::Stub& stub() { return *stub_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

  std::unique_ptr<UnaryCall> Call(const std::string& id, int64_t rows = 1,
                                  const std::string& token = "") {
    return std::make_unique<UnaryCall>(*stub_, Request(id, rows, next_seed_++), token);
  }

  // grpc.health.v1.Health/Check for the whole server (""): SERVING is 1,
  // NOT_SERVING 2; -1 when the call fails.
  int Health() {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext context;
    grpc::ByteBuffer request;  // an empty HealthCheckRequest: service ""
    grpc::Slice empty("");
    request = grpc::ByteBuffer(&empty, 1);
    grpc::ByteBuffer reply;
    grpc::Status status;
    absl::Notification done;
    generic.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                      &reply, [&](grpc::Status outcome) {
                        status = std::move(outcome);
                        done.Notify();
                      });
    if (!done.WaitForNotificationWithTimeout(kWait) || !status.ok()) return -1;
    std::vector<grpc::Slice> slices;
    if (!reply.Dump(&slices).ok()) return -1;
    std::string bytes;
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    // HealthCheckResponse: field 1 (status), a varint.
    if (bytes.size() != 2 || bytes[0] != '\x08') return -1;
    return bytes[1];
  }

 private:
  uint32_t next_seed_ = 1;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::SoftmaxService::Stub> stub_;
};

constexpr int kServing = 1;
constexpr int kNotServing = 2;

const std::vector<DrainStep> kAllSteps = {
    DrainStep::kNotServing,       DrainStep::kRefusing,         DrainStep::kQueueFlushed,
    DrainStep::kLameDuckOver,     DrainStep::kRequestsAnswered, DrainStep::kRefusalsHeld,
    DrainStep::kShutdownStarted,  DrainStep::kHeldCallsReleased,
};

// Records the steps as Drain reports them and runs the test's check, if
// any, for each.
class StepRecorder {
 public:
  // Hooks that report each step here.
  ServerHooks Hooks() {
    ServerHooks hooks;
    hooks.after_drain_step = Hook();
    return hooks;
  }
  std::function<void(DrainStep)> Hook() {
    return [this](DrainStep step) {
      {
        absl::MutexLock lock(&mu_);
        steps_.push_back(step);
      }
      auto check = checks_.find(step);
      if (check != checks_.end()) check->second();
    };
  }
  // Runs `check` on the draining thread when `step` is done. Before Drain.
  void At(DrainStep step, std::function<void()> check) { checks_[step] = std::move(check); }
  std::vector<DrainStep> steps() {
    absl::MutexLock lock(&mu_);
    return steps_;
  }

 private:
  std::map<DrainStep, std::function<void()>> checks_;
  absl::Mutex mu_;
  std::vector<DrainStep> steps_ ABSL_GUARDED_BY(mu_);
};

TEST(ServerTest, StartReturnsErrorsInsteadOfExiting) {
  {
    ServerOptions options = QueueingOptions();
    // A GPU named twice: only a DeviceSpec built by hand can say so.
    options.device = {DeviceSpec::Kind::kCuda, {0, 0}};
    Server server(options);
    const absl::Status started = server.Start();
    EXPECT_EQ(started.code(), absl::StatusCode::kInvalidArgument) << started;
  }
  {
    // Start refuses what Validate refuses, with its message.
    ServerOptions options = QueueingOptions();
    options.max_batch_rows = 0;
    Server server(options);
    const absl::Status started = server.Start();
    EXPECT_EQ(started, Validate(options)) << started;
    EXPECT_EQ(started.code(), absl::StatusCode::kInvalidArgument) << started;
  }
  {
    ServerOptions options = QueueingOptions();
    options.auth_tokens_file = "/nonexistent/tokens";
    Server server(options);
    EXPECT_FALSE(server.Start().ok());
  }
  // The gRPC port of a running server: the second cannot bind it, and
  // stops what it had started (its backend, its /metrics) on destruction.
  Server first(QueueingOptions());
  ASSERT_TRUE(first.Start().ok());
  ServerOptions options = QueueingOptions();
  options.grpc_address = absl::StrCat("127.0.0.1:", first.grpc_port());
  {
    Server second(options);
    const absl::Status started = second.Start();
    EXPECT_EQ(started.code(), absl::StatusCode::kUnavailable) << started;
  }
  // The first one serves on.
  Client client(first.grpc_port());
  EXPECT_EQ(client.Health(), kServing);
}

// A loopback port free right now: bound, read and closed again.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(address.sin_port);
}

// True when something accepts TCP connections on the loopback `port`.
bool Listens(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool connected =
      connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return connected;
}

// Hooks whose create_backends hands Start one FakeBackend made from
// `options`; `made` (may be null) receives it, owned by the server.
ServerHooks OneFakeBackend(testing::FakeBackendOptions options,
                           testing::FakeBackend** made = nullptr) {
  ServerHooks hooks;
  hooks.create_backends = [options, made](const BackendOptions&) {
    auto backend = std::make_unique<testing::FakeBackend>(options);
    if (made != nullptr) *made = backend.get();
    BackendChoice choice;
    choice.device = "fake";
    choice.description = backend->Describe();
    choice.backends.push_back(std::move(backend));
    return absl::StatusOr<BackendChoice>(std::move(choice));
  };
  return hooks;
}

// What a correct backend computes, with `log` overriding the request's op
// when set (a backend that ignores log-softmax).
void ComputeRows(Batch& batch, std::optional<bool> log = std::nullopt) {
  for (const Segment& segment : batch.segments) {
    SoftmaxOptions options = segment.options;
    if (log.has_value()) options.log = *log;
    CpuSoftmaxRows(segment.input, segment.output, segment.dtype, segment.shape, options, 0,
                   segment.shape.rows());
  }
}

// docs/server.md's readiness promise: a backend whose softmax or log-softmax is
// wrong fails Start with an error naming it and what was wrong, and neither
// gRPC, HTTP nor /metrics ever listens.
TEST(ServerTest, StartFailsAndNothingListensWhenTheWarmUpAnswersWrong) {
  struct Case {
    std::string name;
    std::function<void(int, Batch&, BatchResult&)> compute;
    std::string expected;
  };
  const std::vector<Case> cases = {
      // Copies its input (FakeBackend's default compute).
      {"copier", nullptr, "warm-up on copier: softmax element 0 is"},
      {"softmax_only", [](int, Batch& batch, BatchResult&) { ComputeRows(batch, false); },
       "warm-up on softmax_only: log-softmax element 0 is"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ServerOptions options = QueueingOptions();
    const int grpc_port = FreePort();
    const int http_port = FreePort();
    const int metrics_port = FreePort();
    ASSERT_TRUE(grpc_port > 0 && http_port > 0 && metrics_port > 0);
    options.grpc_address = absl::StrCat("127.0.0.1:", grpc_port);
    options.http_address = absl::StrCat("127.0.0.1:", http_port);
    options.metrics_address = absl::StrCat("127.0.0.1:", metrics_port);
    testing::FakeBackendOptions backend;
    backend.name = c.name;
    backend.compute = c.compute;
    Server server(options, OneFakeBackend(backend));
    const absl::Status started = server.Start();
    EXPECT_EQ(started.code(), absl::StatusCode::kInternal) << started;
    EXPECT_NE(started.message().find(c.expected), absl::string_view::npos) << started;
    EXPECT_EQ(server.grpc_port(), 0);
    EXPECT_EQ(server.metrics(), nullptr);
    for (const int port : {grpc_port, http_port, metrics_port}) {
      EXPECT_FALSE(Listens(port)) << "port " << port;
    }
  }
}

// A normal start: the warm-up ran a float32 softmax and then a log-softmax
// on the backend before anything listened, and nothing else ran on it.
TEST(ServerTest, StartWarmsTheBackendUpWithASoftmaxAndALogSoftmaxBeforeItListens) {
  ServerOptions options = QueueingOptions();
  const int grpc_port = FreePort();
  ASSERT_GT(grpc_port, 0);
  options.grpc_address = absl::StrCat("127.0.0.1:", grpc_port);
  std::atomic<int> computed_while_listening{0};
  testing::FakeBackendOptions backend_options;
  backend_options.name = "right";
  backend_options.compute = [grpc_port, &computed_while_listening](int, Batch& batch,
                                                                   BatchResult&) {
    if (Listens(grpc_port)) computed_while_listening.fetch_add(1);
    ComputeRows(batch);
  };
  testing::FakeBackend* backend = nullptr;
  Server server(options, OneFakeBackend(backend_options, &backend));
  ASSERT_TRUE(server.Start().ok());
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(server.grpc_port(), grpc_port);
  const std::vector<std::vector<Segment>> batches = backend->batches();
  ASSERT_EQ(batches.size(), 2u);
  for (size_t i = 0; i < batches.size(); ++i) {
    ASSERT_EQ(batches[i].size(), 1u);
    EXPECT_EQ(batches[i][0].dtype, DType::kFloat32);
    EXPECT_EQ(batches[i][0].options.log, i == 1) << "batch " << i;
  }
  EXPECT_EQ(computed_while_listening.load(), 0);
  Client client(server.grpc_port());
  EXPECT_EQ(client.Health(), kServing);
}

// SIGHUP's work: the tokens file is read again, and the calls' tokens are
// checked against the new ones from then on.
TEST(ServerTest, ReloadAuthTokensSwapsTheTokensInUse) {
  {
    Server server(QueueingOptions());
    ASSERT_TRUE(server.Start().ok());
    EXPECT_EQ(server.ReloadAuthTokens().code(), absl::StatusCode::kFailedPrecondition);
  }
  const std::string path = ::testing::TempDir() + "/server_test_tokens";
  auto write_tokens = [&path](const std::string& tokens) {
    std::ofstream file(path, std::ios::trunc);
    file << tokens;
  };
  write_tokens("# the first\nfirst-token\n");
  ServerOptions options = QueueingOptions();
  options.auth_tokens_file = path;
  Server server(options);
  ASSERT_TRUE(server.Start().ok());
  Client client(server.grpc_port());
  // Eight rows: a batch at once, without the queue's delay.
  auto call = [&client](const std::string& token) {
    std::unique_ptr<UnaryCall> call = client.Call("tokens", 8, token);
    EXPECT_TRUE(call->Wait());
    return call->status.error_code();
  };
  EXPECT_EQ(call("first-token"), grpc::StatusCode::OK);
  EXPECT_EQ(call("second-token"), grpc::StatusCode::UNAUTHENTICATED);

  write_tokens("second-token\n");
  ASSERT_TRUE(server.ReloadAuthTokens().ok());
  EXPECT_EQ(call("first-token"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("second-token"), grpc::StatusCode::OK);

  // A file that cannot be read keeps the tokens in use.
  std::remove(path.c_str());
  EXPECT_FALSE(server.ReloadAuthTokens().ok());
  EXPECT_EQ(call("second-token"), grpc::StatusCode::OK);
}

// SIGTERM's order as callers see it: health goes NOT_SERVING while calls are
// still admitted; then new calls are refused UNAVAILABLE (the lame duck)
// while the admitted ones are answered; the listeners stay open through the
// lame duck.
TEST(ServerTest, DrainGoesNotServingThenRefusesNewCallsAndAnswersAdmittedOnes) {
  StepRecorder recorder;
  ServerOptions options = QueueingOptions();
  options.http_address = "127.0.0.1:0";  // stopped by the drain too
  Server server(options, recorder.Hooks());
  ASSERT_TRUE(server.Start().ok());
  Client client(server.grpc_port());
  ASSERT_EQ(client.Health(), kServing);
  EXPECT_EQ(Gauge(server, "softmax_serving"), 1);

  std::vector<std::unique_ptr<UnaryCall>> admitted;
  for (int i = 0; i < 3; ++i) admitted.push_back(client.Call(absl::StrCat("admitted-", i)));
  ASSERT_TRUE(Await([&] { return Gauge(server, "softmax_queued_requests") == 3; }));

  recorder.At(DrainStep::kNotServing, [&] {
    EXPECT_EQ(client.Health(), kNotServing);
    EXPECT_EQ(Gauge(server, "softmax_serving"), 0);
    // Not refused yet: balancers are told first.
    admitted.push_back(client.Call("admitted-after-not-serving"));
    EXPECT_TRUE(Await([&] { return Gauge(server, "softmax_queued_requests") == 4; }));
  });
  recorder.At(DrainStep::kRefusing, [&] {
    std::unique_ptr<UnaryCall> refused = client.Call("refused-in-lame-duck");
    ASSERT_TRUE(refused->Wait());
    EXPECT_EQ(refused->status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(refused->status.error_message(), kDrainingMessage);
    // The admitted calls are still queued, not refused.
    for (const auto& call : admitted) EXPECT_FALSE(call->done.HasBeenNotified());
  });
  recorder.At(DrainStep::kQueueFlushed, [&] {
    // Answered now, not after the ten-minute batching delay.
    EXPECT_TRUE(Await([&] {
      return std::all_of(admitted.begin(), admitted.end(),
                         [](const auto& call) { return call->done.HasBeenNotified(); });
    }));
  });
  recorder.At(DrainStep::kLameDuckOver, [&] {
    EXPECT_EQ(client.Health(), kNotServing);
    std::unique_ptr<UnaryCall> refused = client.Call("refused-after-lame-duck");
    ASSERT_TRUE(refused->Wait());
    EXPECT_EQ(refused->status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(refused->status.error_message(), kDrainingMessage);
  });
  std::thread drain([&] { server.Drain(); });
  server.Wait();
  drain.join();

  ASSERT_EQ(admitted.size(), 4u);
  for (const auto& call : admitted) {
    ASSERT_TRUE(call->Wait());
    EXPECT_TRUE(call->status.ok()) << call->status.error_message();
    ExpectCorrect(call->request, call->response);
  }
  EXPECT_EQ(recorder.steps(), kAllSteps);
  EXPECT_FALSE(server.device_faulted());
}

// One unary KServe ModelInfer call (a 1x4 float32 softmax) on the callback API.
struct InferCall {
  inference::ModelInferRequest request;
  inference::ModelInferResponse response;
  grpc::ClientContext context;
  grpc::Status status;
  absl::Notification done;

  explicit InferCall(inference::GRPCInferenceService::Stub& stub) {
    request.set_model_name("softmax");
    inference::ModelInferRequest::InferInputTensor* input = request.add_inputs();
    input->set_name("INPUT");
    input->set_datatype("FP32");
    input->add_shape(1);
    input->add_shape(4);
    const float values[4] = {0, 1, 2, 3};
    request.add_raw_input_contents(values, sizeof(values));
    stub.async()->ModelInfer(&context, &request, &response, [this](grpc::Status outcome) {
      status = std::move(outcome);
      done.Notify();
    });
  }
  bool Wait() { return done.WaitForNotificationWithTimeout(kWait); }
};

// A unary call refused once Shutdown is near is held, not answered, so that
// a closed-loop caller sends nothing into the window where gRPC would cancel
// it; the held calls are answered UNAVAILABLE after Shutdown has started.
// `start` makes the call (softmax.v1 Softmax or KServe ModelInfer) on the
// client's connection, made before the drain.
template <typename Call>
void ExpectRefusalsHeldUntilShutdownHasStarted(
    std::function<std::unique_ptr<Call>(Client&)> start) {
  StepRecorder recorder;
  Server server(QueueingOptions(), recorder.Hooks());
  ASSERT_TRUE(server.Start().ok());
  Client client(server.grpc_port());
  ASSERT_EQ(client.Health(), kServing);  // connected before the drain
  ASSERT_GE(ServerCallsStarted(), 1) << "channelz counts no calls";

  std::unique_ptr<Call> held;
  recorder.At(DrainStep::kRefusalsHeld, [&] {
    const int64_t calls_before = ServerCallsStarted();
    held = start(client);
    // The call has reached the server...
    ASSERT_TRUE(Await([&] { return ServerCallsStarted() > calls_before; }));
    // ...and is not answered while refusals are held (a refusal not held
    // comes back within a round trip).
    EXPECT_FALSE(held->done.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  });
  recorder.At(DrainStep::kShutdownStarted, [&] {
    ASSERT_NE(held, nullptr);
    EXPECT_FALSE(held->done.HasBeenNotified());
  });
  std::thread drain([&] { server.Drain(); });
  drain.join();
  ASSERT_NE(held, nullptr);
  ASSERT_TRUE(held->Wait());
  EXPECT_EQ(held->status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(held->status.error_message(), kDrainingMessage);
  server.Wait();
  EXPECT_EQ(recorder.steps(), kAllSteps);
}

TEST(ServerTest, RefusalsAreHeldUntilShutdownHasStartedThenAnsweredUnavailable) {
  ExpectRefusalsHeldUntilShutdownHasStarted<UnaryCall>(
      [](Client& client) { return client.Call("held"); });
}

TEST(ServerTest, KServeModelInferRefusalsAreHeldUntilShutdownHasStarted) {
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub;
  ExpectRefusalsHeldUntilShutdownHasStarted<InferCall>([&stub](Client& client) {
    stub = inference::GRPCInferenceService::NewStub(client.channel());
    return std::make_unique<InferCall>(*stub);
  });
}

// A stream with answers still to come at Drain: every request it had sent
// is answered, each response written, and only then does it end, with a
// retryable UNAVAILABLE.
TEST(ServerTest, StreamMidAnswerAtDrainGetsEveryResponseThenUnavailable) {
  StepRecorder recorder;
  Server server(QueueingOptions(), recorder.Hooks());
  ASSERT_TRUE(server.Start().ok());
  Client client(server.grpc_port());

  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SoftmaxRequest, v1::SoftmaxResponse>> stream =
      client.stub().SoftmaxStream(&context);
  // A full batch (8 rows) is computed at once: the stream is answering.
  const v1::SoftmaxRequest first = Request("first", 8, 100);
  ASSERT_TRUE(stream->Write(first));
  v1::SoftmaxResponse response;
  ASSERT_TRUE(stream->Read(&response));
  ExpectCorrect(first, response);
  // Three more wait in the queue.
  std::vector<v1::SoftmaxRequest> pending;
  for (int i = 0; i < 3; ++i) {
    pending.push_back(Request(absl::StrCat("pending-", i), 1, 200 + i));
    ASSERT_TRUE(stream->Write(pending.back()));
  }
  ASSERT_TRUE(Await([&] { return Gauge(server, "softmax_queued_requests") == 3; }));

  absl::Notification refusing;
  recorder.At(DrainStep::kRefusing, [&] { refusing.Notify(); });
  std::thread drain([&] { server.Drain(); });
  std::vector<v1::SoftmaxResponse> answers;
  while (stream->Read(&response)) answers.push_back(response);
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(refusing.HasBeenNotified());
  // One batch answers all three, in any order.
  ASSERT_EQ(answers.size(), pending.size());
  for (const v1::SoftmaxResponse& answer : answers) {
    auto request = std::find_if(pending.begin(), pending.end(), [&](const auto& sent) {
      return sent.request_id() == answer.request_id();
    });
    ASSERT_NE(request, pending.end()) << answer.request_id();
    ExpectCorrect(*request, answer);
    pending.erase(request);
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  drain.join();
  server.Wait();
  EXPECT_EQ(recorder.steps(), kAllSteps);
}

}  // namespace
}  // namespace softmax::server
