// libFuzzer target for the wire path: raw bytes as a front-end receives
// them, through parsing, validation, the batcher and a CPU backend, back to
// the bytes of the response. The first byte picks the front-end:
//   even:      a softmax.v1.SoftmaxRequest message, as gRPC hands it
//              (ParseRequestMessage on a grpc::ByteBuffer; and
//              ReadLaterChunk, checked against protobuf's parse);
//   1 mod 4:   a KServe v2 HTTP infer body; the next two bytes give
//              Inference-Header-Content-Length (modulo the body's size + 1);
//   3 mod 4:   a KServe v2 gRPC inference.ModelInferRequest message, as
//              ModelInfer (bit 2 clear) or ModelStreamInfer (set) hands it
//              over (ParseInferRequest, PrepareInfer).
// Both KServe front-ends may name one registered system shared-memory
// region, "fuzz" (kRegionBytes), for their input and output.
// Checks: every refusal is a client error (INVALID_ARGUMENT, or
// RESOURCE_EXHAUSTED / UNAVAILABLE from the queue; NOT_FOUND for a KServe
// model or region) with a message; every accepted request is answered
// exactly once, within seconds; an answer serialises, parses back and
// carries the request's id, dtype, shape and byte count (in the region
// when the request names one for its output); softmax outputs of finite
// float32 inputs lie in [0, 1].
// AddressSanitizer and UBSan watch the rest.
//
// With clang (-DSOFTMAX_BUILD_FUZZERS=ON) this is a libFuzzer binary; in
// other builds fuzz_replay_main.cc drives it over the corpus and a bounded
// number of mutations (the ctest smoke run). See README.md.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <google/protobuf/stubs/logging.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/synchronization/notification.h"
#include "common/chunk_wire.h"
#include "absl/time/time.h"
#include "server/cpu/cpu_backend.h"
#include "server/rpc/kserve.h"
#include "server/rpc/http/kserve_http.h"
#include "server/rpc/grpc/kserve_infer.h"
#include "server/rpc/grpc/service.h"
#include "server/rpc/grpc/wire.h"
#include "server/rpc/dispatch.h"
#include "server/rpc/softmax_v1.h"
#include "server/scheduling/batcher.h"
#include "server/scheduling/scheduler.h"
#include "server/shm/shared_memory.h"

namespace softmax::server {
namespace {

// Small limits keep every accepted request cheap to compute.
constexpr int64_t kMaxTensorBytes = 1 << 16;
// The shared-memory region KServe requests may name: room for an input and
// an output of the largest tensor.
constexpr int64_t kRegionBytes = 2 * kMaxTensorBytes;
constexpr char kRegionName[] = "fuzz";
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
    shared_memory = std::make_unique<SharedMemoryManager>(SharedMemoryMode::kSystem, nullptr);
    // A POSIX shared-memory object of this process, unlinked once mapped.
    const std::string key = "/softmax_wire_fuzzer_" + std::to_string(getpid());
    const int fd = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    Check(fd >= 0 && ftruncate(fd, kRegionBytes) == 0, "a shared-memory object is made");
    close(fd);
    const absl::Status registered =
        shared_memory->RegisterSystem(kRegionName, key, 0, kRegionBytes);
    shm_unlink(key.c_str());
    Check(registered.ok(), "the shared-memory region registers");
    Check(shared_memory->Resolve(kRegionName, 0, kRegionBytes, "region").ok(),
          "the shared-memory region resolves");
  }
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Batcher> batcher;
  std::unique_ptr<Admission> admission;
  FrontEnd front_end;
  std::unique_ptr<SharedMemoryManager> shared_memory;
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

// A KServe front-end's refusal: as CheckRefusal, or NOT_FOUND for an
// unknown model or shared-memory region.
void CheckKServeRefusal(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kNotFound) CheckRefusal(status);
  Check(!status.message().empty(), "a refusal says why");
}

// What a request wrote into its output region: the region's first
// input_bytes (all of it when smaller; the answer's count check then fails).
std::string RegionOutput(const char* region, int64_t region_bytes, int64_t input_bytes) {
  return std::string(region, static_cast<size_t>(std::min(region_bytes, input_bytes)));
}

// What an answer must carry, taken from a request before it is submitted
// (which may move its input away).
struct Expected {
  explicit Expected(const InferenceRequest& request)
      : request_id(request.id),
        dtype(request.dtype),
        shape(request.dims),
        log(request.log),
        top_k(request.top_k),
        full_output(request.full_output),
        input_bytes(request.input.bytes) {
    if (dtype == DType::kFloat32 && input_bytes > 0 && input_bytes % 4 == 0) {
      finite_inputs.resize(static_cast<size_t>(input_bytes / 4));
      std::memcpy(finite_inputs.data(), request.input.data, static_cast<size_t>(input_bytes));
    }
  }

  // `output`: the answer's output bytes, of `dtype` and `shape`.
  void CheckOutput(const std::string& id, DType output_dtype,
                   const std::vector<int64_t>& output_shape, absl::string_view output) const {
    Check(id == request_id, "the answer carries the request's id");
    Check(output_dtype == dtype, "the output has the input's dtype");
    Check(output_shape == shape, "the output has the input's shape");
    CheckBytes(output);
  }

  // The output's bytes alone: the input's count, and softmax of finite
  // float32 inputs in [0, 1].
  void CheckBytes(absl::string_view output) const {
    Check(static_cast<int64_t>(output.size()) == input_bytes,
          "the output has the input's byte count");
    if (log || finite_inputs.empty()) return;
    for (float x : finite_inputs) {
      if (!std::isfinite(x)) return;
    }
    for (size_t i = 0; i < finite_inputs.size(); ++i) {
      float y;
      std::memcpy(&y, output.data() + 4 * i, 4);
      Check(y >= 0.0f && y <= 1.0f, "softmax of finite inputs lies in [0, 1]");
    }
  }

  // The top K answer of an accepted request with top_k: its values in the
  // input's dtype, as many int64 indices, no output unless asked for.
  void CheckTopK(DType values_dtype, size_t value_bytes, size_t index_bytes,
                 bool has_output) const {
    Check(values_dtype == dtype, "the top K values have the input's dtype");
    Check(value_bytes > 0 || input_bytes == 0, "a top K request is answered with its top K");
    Check(value_bytes / static_cast<size_t>(ItemSize(dtype)) * 8 == index_bytes,
          "the top K has one index per value");
    Check(static_cast<int64_t>(value_bytes) <= input_bytes, "the top K is no larger than the output");
    Check(full_output == has_output, "the whole output comes only with full_output");
  }

  std::string request_id;
  DType dtype;
  std::vector<int64_t> shape;
  bool log;
  int64_t top_k = 0;
  bool full_output = false;
  int64_t input_bytes = 0;
  std::vector<float> finite_inputs;
};

// Submits `request` (validated there, with `names`) and waits for its one
// answer: true when it is OK (then the request's sink holds it), false for
// a checked refusal.
bool SubmitAndWait(InferenceRequest request, const FieldNames& names,
                   Admission::Admitted* admitted = nullptr) {
  absl::Notification done;
  std::atomic<int> answers{0};
  absl::Status outcome;
  request.deadline = std::chrono::system_clock::now() + std::chrono::seconds(10);
  Submit(GetHarness().front_end, std::move(request), names,
         Responder{[&](const absl::Status& status, const RequestTiming&) {
                     outcome = status;
                     if (answers.fetch_add(1) == 0) done.Notify();
                   },
                   false},
         admitted);
  Check(done.WaitForNotificationWithTimeout(kAnswerWithin), "every request is answered");
  Check(answers.load() == 1, "every request is answered once");
  if (!outcome.ok()) {
    CheckRefusal(outcome);
    return false;
  }
  return true;
}

// A softmax.v1 request: submitted, and its answer serialised and parsed back.
void DispatchAndCheck(v1::SoftmaxRequest* request) {
  v1::SoftmaxResponse response;
  OutputView view;
  TopKResult top_k;
  InferenceRequest submitted;
  if (absl::Status built = FromSoftmaxV1(request, &response, &view, &top_k, &submitted);
      !built.ok()) {
    CheckRefusal(built);
    return;
  }
  const Expected expected(submitted);
  if (!SubmitAndWait(std::move(submitted), kSoftmaxV1Fields)) return;
  FinishSoftmaxV1Response(RequestTiming{}, &top_k, &response);
  grpc::ByteBuffer wire;
  Check(SerializeResponse(&response, std::move(view), &wire).ok(), "the answer serialises");
  v1::SoftmaxResponse parsed;
  Check(parsed.ParseFromString(BufferBytes(wire)), "the answer parses back");
  if (expected.top_k > 0) {
    Check(parsed.request_id() == expected.request_id, "the answer carries the request's id");
    Check(parsed.has_top_k(), "a top K request is answered with its top K");
    expected.CheckTopK(static_cast<DType>(static_cast<int>(parsed.top_k().values().dtype())),
                       parsed.top_k().values().data().size(), parsed.top_k().indices().size(),
                       parsed.has_output());
    if (!expected.full_output) return;
  }
  expected.CheckOutput(parsed.request_id(),
                       static_cast<DType>(static_cast<int>(parsed.output().dtype())),
                       {parsed.output().shape().begin(), parsed.output().shape().end()},
                       parsed.output().data());
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

// A KServe HTTP infer body, as the server's handler takes it: parsed,
// built, its shared-memory tensors bound, submitted.
void KServeHttp(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const std::string body(reinterpret_cast<const char*>(data) + 2, size - 2);
  const int64_t header_length = (int64_t{data[0]} << 8 | data[1]) % (body.size() + 1);
  kserve::InferRequestParts parts;
  parts.model_name = "softmax";
  HttpInferOptions options;
  absl::Status status = ParseHttpInferRequest(body, header_length, &parts, &options);
  InferenceRequest request;
  kserve::Model model = kserve::Model::kSoftmax;
  if (status.ok()) status = kserve::BuildInferenceRequest(&parts, &model, &request);
  std::vector<std::shared_ptr<const void>> leases;
  kserve::TopKRegions top_k_regions;
  if (status.ok()) {
    status = kserve::BindRegions(parts, GetHarness().shared_memory.get(), &request,
                                 &top_k_regions, &leases);
  }
  if (!status.ok()) {
    CheckKServeRefusal(status);
    return;
  }
  // The handler builds its JSON from the request; here the bytes are checked.
  std::string output;
  OutputView view;
  TopKResult top_k;
  request.output.buffer = &output;
  request.output.view = &view;
  request.output.top_k = &top_k;
  const Expected expected(request);
  const char* region = request.output.region;
  const int64_t region_bytes = request.output.region_bytes;
  if (!SubmitAndWait(std::move(request), kserve::FieldNamesFor(parts))) return;
  if (region != nullptr) {
    expected.CheckBytes(RegionOutput(region, region_bytes, expected.input_bytes));
  } else if (expected.top_k > 0) {
    expected.CheckTopK(expected.dtype, top_k.values.size(), top_k.indices.size(),
                       expected.input_bytes == 0 ? expected.full_output
                                                 : view.data != nullptr || !output.empty());
  } else {
    expected.CheckBytes(view.data != nullptr
                            ? absl::string_view(view.data, static_cast<size_t>(view.bytes))
                            : absl::string_view(output));
  }
}

// A KServe gRPC ModelInferRequest: parsed, converted, submitted, and its
// answer serialised (`in_stream`: as ModelStreamInfer's) and parsed back.
void KServeGrpc(const uint8_t* data, size_t size, bool in_stream) {
  grpc::Slice slice(data, size);
  grpc::ByteBuffer buffer(&slice, 1);
  InferCall call;
  InferenceRequest request;
  absl::Status status = ParseInferRequest(&buffer, nullptr, &call.message);
  if (status.ok()) {
    status = PrepareInfer(&call.message, GetHarness().shared_memory.get(), &call, &request);
  }
  if (!status.ok()) {
    CheckKServeRefusal(status);
    return;
  }
  const Expected expected(request);
  const char* region = request.output.region;
  const int64_t region_bytes = request.output.region_bytes;
  if (!SubmitAndWait(std::move(request), kserve::FieldNamesFor(call.parts), &call.admitted)) {
    return;
  }
  inference::ModelInferResponse answer;
  OutputView view = FillInferResponse(&call, &answer);
  grpc::ByteBuffer wire;
  Check(SerializeInferResponse(&answer, std::move(view), in_stream, &wire).ok(),
        "the answer serialises");
  inference::ModelInferResponse parsed;
  if (in_stream) {
    inference::ModelStreamInferResponse stream_response;
    Check(stream_response.ParseFromString(BufferBytes(wire)), "the stream answer parses back");
    Check(stream_response.error_message().empty(), "an answer has no error message");
    parsed = stream_response.infer_response();
  } else {
    Check(parsed.ParseFromString(BufferBytes(wire)), "the answer parses back");
  }
  if (expected.top_k > 0) {
    // Classification (BYTES "<value>:<index>", one per class), or the
    // TOP_K_VALUES / TOP_K_INDICES tensors, each as large as its shape.
    Check(parsed.outputs_size() >= 1 &&
              parsed.raw_output_contents_size() == parsed.outputs_size(),
          "a top K answer has one raw_output_contents entry per output");
    for (int i = 0; i < parsed.outputs_size(); ++i) {
      const auto& output = parsed.outputs(i);
      int64_t elements = 1;
      for (int64_t dim : output.shape()) elements *= dim;
      absl::string_view bytes = parsed.raw_output_contents(i);
      if (output.datatype() == "INT64") {
        Check(static_cast<int64_t>(bytes.size()) == 8 * elements, "one index per element");
        continue;
      }
      if (output.datatype() != "BYTES") {
        Check(output.datatype() == kserve::DatatypeName(expected.dtype),
              "the top K values have the input's datatype");
        continue;
      }
      int64_t strings = 0;
      while (!bytes.empty()) {
        Check(bytes.size() >= 4, "a BYTES element starts with its 4-byte length");
        uint32_t length = 0;
        std::memcpy(&length, bytes.data(), 4);
        Check(bytes.size() - 4 >= length, "a BYTES element fits its tensor");
        Check(bytes.substr(4, length).find(':') != absl::string_view::npos,
              "a class reads <value>:<index>");
        bytes.remove_prefix(4 + length);
        ++strings;
      }
      Check(strings == elements, "a classification answer has one string per element");
    }
    return;
  }
  Check(parsed.outputs_size() == 1 && parsed.raw_output_contents_size() == 1,
        "an answer has one output and one raw_output_contents entry");
  const auto& output = parsed.outputs(0);
  const absl::StatusOr<DType> dtype = kserve::ParseDatatype(output.datatype(), "datatype");
  Check(dtype.ok(), "the output's datatype is FP32, FP16 or BF16");
  std::string bytes = parsed.raw_output_contents(0);
  if (region != nullptr) {
    Check(bytes.empty(), "an output written into a region is not in the answer");
    Check(output.parameters().at("shared_memory_region").string_param() == kRegionName,
          "the answer names the output's region");
    bytes = RegionOutput(region, region_bytes, expected.input_bytes);
  }
  expected.CheckOutput(parsed.id(), *dtype,
                       {output.shape().begin(), output.shape().end()}, bytes);
}

}  // namespace
}  // namespace softmax::server

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    softmax::server::SoftmaxV1(data + 1, size - 1);
  } else if (data[0] % 4 == 1) {
    softmax::server::KServeHttp(data + 1, size - 1);
  } else {
    softmax::server::KServeGrpc(data + 1, size - 1, (data[0] & 4) != 0);
  }
  return 0;
}
