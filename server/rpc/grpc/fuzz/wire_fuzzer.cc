// libFuzzer target for the wire path: raw bytes as a front-end receives
// them, through parsing, validation, the batcher and a CPU backend, back to
// the bytes of the response. The first byte picks the front-end:
//   even: a softmax.v1.SoftmaxRequest message, as gRPC hands it
//         (ParseRequestMessage on a grpc::ByteBuffer; and ReadLaterChunk,
//         checked against protobuf's parse);
//   odd:  a KServe v2 HTTP infer body; the next two bytes give
//         Inference-Header-Content-Length (modulo the body's size + 1).
// Checks: every refusal is a client error (INVALID_ARGUMENT, or
// RESOURCE_EXHAUSTED / UNAVAILABLE from the queue) with a message; every
// accepted request is answered exactly once, within seconds; an answer
// serialises, parses back and carries the request's id, dtype, shape and
// byte count; softmax outputs of finite float32 inputs lie in [0, 1].
// AddressSanitizer and UBSan watch the rest.
//
// With clang (-DSOFTMAX_BUILD_FUZZERS=ON) this is a libFuzzer binary; in
// other builds fuzz_replay_main.cc drives it over the corpus and a bounded
// number of mutations (the ctest smoke run). See README.md.
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <google/protobuf/stubs/logging.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/synchronization/notification.h"
#include "common/chunk_wire.h"
#include "absl/time/time.h"
#include "server/cpu/cpu_backend.h"
#include "server/rpc/kserve.h"
#include "server/rpc/http/kserve_http.h"
#include "server/rpc/grpc/service.h"
#include "server/rpc/grpc/wire.h"
#include "server/scheduling/batcher.h"
#include "server/scheduling/scheduler.h"

namespace softmax::server {
namespace {

// Small limits keep every accepted request cheap to compute.
constexpr int64_t kMaxTensorBytes = 1 << 16;
// Far longer than any answer of a 64 KiB tensor takes, even under ASan.
constexpr absl::Duration kAnswerWithin = absl::Seconds(20);

void Check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "wire_fuzzer: check failed: %s\n", what);
    std::abort();
  }
}

// One backend, scheduler, batcher and service for the whole run (never
// destroyed: the process exits with them).
struct Harness {
  Harness() {
    // Protobuf logs every invalid UTF-8 string it parses; the fuzzer makes many.
    google::protobuf::SetLogHandler(nullptr);
    backend = std::make_unique<CpuBackend>(CpuBackendOptions{1, 4096});
    scheduler = std::make_unique<Scheduler>(std::vector<Backend*>{backend.get()});
    BatcherOptions batcher_options;
    batcher_options.max_queued_bytes = 8 * kMaxTensorBytes;
    batcher = std::make_unique<Batcher>(batcher_options, scheduler.get(), nullptr);
    admission = std::make_unique<Admission>(AdmissionOptions{}, batcher.get());
    front_end.admission = admission.get();
    front_end.limits.max_tensor_bytes = kMaxTensorBytes;
  }
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Batcher> batcher;
  std::unique_ptr<Admission> admission;
  FrontEnd front_end;
};

Harness& GetHarness() {
  static Harness* const harness = new Harness();
  return *harness;
}

std::string BufferBytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  Check(buffer.Dump(&slices).ok(), "a response buffer dumps");
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

void CheckRefusal(const absl::Status& status) {
  Check(status.code() == absl::StatusCode::kInvalidArgument ||
            status.code() == absl::StatusCode::kResourceExhausted ||
            status.code() == absl::StatusCode::kUnavailable,
        "a refusal is INVALID_ARGUMENT, RESOURCE_EXHAUSTED or UNAVAILABLE");
  Check(!status.message().empty(), "a refusal says why");
}

// Dispatches `request` and checks its one answer.
void DispatchAndCheck(v1::SoftmaxRequest* request) {
  // What the answer must match (Dispatch may move the input away).
  const std::string request_id = request->request_id();
  const v1::Tensor input_meta = [&] {
    v1::Tensor meta;
    meta.set_dtype(request->input().dtype());
    *meta.mutable_shape() = request->input().shape();
    return meta;
  }();
  const int64_t input_bytes = static_cast<int64_t>(request->input().data().size());
  const bool log = request->log();
  std::vector<float> finite_inputs;
  if (request->input().dtype() == v1::DTYPE_FLOAT32 && input_bytes > 0 && input_bytes % 4 == 0) {
    finite_inputs.resize(static_cast<size_t>(input_bytes / 4));
    std::memcpy(finite_inputs.data(), request->input().data().data(),
                static_cast<size_t>(input_bytes));
  }

  v1::SoftmaxResponse response;
  OutputView view;
  absl::Notification done;
  int answers = 0;
  absl::Status outcome;
  const absl::Status accepted = Dispatch(
      GetHarness().front_end, request, &response, &view, std::chrono::system_clock::now() + std::chrono::seconds(10),
      [] { return false; },
      [&](const absl::Status& status) {
        outcome = status;
        ++answers;
        done.Notify();
      });
  if (!accepted.ok()) {
    CheckRefusal(accepted);
    Check(answers == 0, "a refused request gets no answer");
    return;
  }
  Check(done.WaitForNotificationWithTimeout(kAnswerWithin), "an accepted request is answered");
  Check(answers == 1, "an accepted request is answered once");
  if (!outcome.ok()) {
    CheckRefusal(outcome);
    return;
  }
  grpc::ByteBuffer wire;
  Check(SerializeResponse(&response, std::move(view), &wire).ok(), "the answer serialises");
  v1::SoftmaxResponse parsed;
  Check(parsed.ParseFromString(BufferBytes(wire)), "the answer parses back");
  Check(parsed.request_id() == request_id, "the answer carries the request's id");
  Check(parsed.output().dtype() == input_meta.dtype(), "the output has the input's dtype");
  Check(parsed.output().shape_size() == input_meta.shape_size(),
        "the output has the input's rank");
  for (int i = 0; i < input_meta.shape_size(); ++i) {
    Check(parsed.output().shape(i) == input_meta.shape(i), "the output has the input's shape");
  }
  Check(static_cast<int64_t>(parsed.output().data().size()) == input_bytes,
        "the output has the input's byte count");
  if (!log && !finite_inputs.empty()) {
    bool all_finite = true;
    for (float x : finite_inputs) all_finite = all_finite && std::isfinite(x);
    if (all_finite) {
      for (size_t i = 0; i < finite_inputs.size(); ++i) {
        float y;
        std::memcpy(&y, parsed.output().data().data() + 4 * i, 4);
        Check(y >= 0.0f && y <= 1.0f, "softmax of finite inputs lies in [0, 1]");
      }
    }
  }
}

// The stream's reading of a later chunk without a full parse
// (ReadLaterChunk) agrees with protobuf's wherever both accept the bytes
// (protobuf also refuses an id of invalid UTF-8), over three slices.
void CheckLaterChunkReading(const uint8_t* data, size_t size) {
  const char* bytes = reinterpret_cast<const char*>(data);
  grpc::Slice slices[3] = {grpc::Slice(bytes, size / 3),
                           grpc::Slice(bytes + size / 3, size * 2 / 3 - size / 3),
                           grpc::Slice(bytes + size * 2 / 3, size - size * 2 / 3)};
  const grpc::ByteBuffer buffer(slices, 3);
  ChunkView view;
  if (!ReadLaterChunk(buffer, kRequestChunkFields, &view)) return;
  v1::SoftmaxRequest parsed;
  if (!parsed.ParseFromArray(data, static_cast<int>(size))) return;
  std::string copied(static_cast<size_t>(view.data_bytes), '\0');
  view.CopyTo(copied.data());
  Check(parsed.request_id() == view.request_id, "a later chunk's id reads as protobuf's");
  Check(parsed.chunk_offset() == view.chunk_offset && view.chunk_offset > 0,
        "a later chunk's offset reads as protobuf's");
  Check(parsed.more_chunks() == view.more_chunks, "a later chunk's more_chunks reads alike");
  Check(parsed.input().data() == copied, "a later chunk's data reads as protobuf's");
  Check(parsed.input().dtype() == v1::DTYPE_UNSPECIFIED && parsed.input().shape_size() == 0 &&
            !parsed.has_axis() && !parsed.has_temperature() && !parsed.log(),
        "a later chunk read so has no header fields");
}

void SoftmaxV1(const uint8_t* data, size_t size) {
  CheckLaterChunkReading(data, size);
  grpc::Slice slice(data, size);
  grpc::ByteBuffer buffer(&slice, 1);
  v1::SoftmaxRequest request;
  const absl::Status parsed = ParseRequestMessage(&buffer, nullptr, &request);
  if (!parsed.ok()) {
    CheckRefusal(parsed);
    return;
  }
  DispatchAndCheck(&request);
}

void KServeHttp(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const std::string body(reinterpret_cast<const char*>(data) + 2, size - 2);
  const int64_t header_length = (int64_t{data[0]} << 8 | data[1]) % (body.size() + 1);
  kserve::InferRequestParts parts;
  parts.model_name = "softmax";
  HttpInferOptions options;
  absl::Status status = ParseHttpInferRequest(body, header_length, &parts, &options);
  v1::SoftmaxRequest request;
  kserve::Model model = kserve::Model::kSoftmax;
  if (status.ok()) status = kserve::BuildSoftmaxRequest(&parts, &model, &request);
  if (!status.ok()) {
    CheckRefusal(status);
    return;
  }
  DispatchAndCheck(&request);
}

}  // namespace
}  // namespace softmax::server

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    softmax::server::SoftmaxV1(data + 1, size - 1);
  } else {
    softmax::server::KServeHttp(data + 1, size - 1);
  }
  return 0;
}
