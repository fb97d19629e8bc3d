#include "server/rpc/grpc/kserve_grpc.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/slice.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/logging/log.h"
#include "server/rpc/grpc/authenticate.h"
#include "server/rpc/dispatch.h"
#include "server/rpc/grpc/reset_guard.h"
#include "server/rpc/grpc/status_util.h"
#include "server/rpc/status_macros.h"
#include "server/rpc/grpc/stream_reactor.h"
#include "server/rpc/grpc/wire.h"

namespace softmax::server {
namespace {

using SteadyClock = std::chrono::steady_clock;

int64_t NanosSince(SteadyClock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - start)
      .count();
}

// One inference request on its way through Dispatch.
struct InferCall {
  ~InferCall() {
    if (buffers != nullptr) RecycleBuffers(buffers.get(), &request, &response);
  }
  // Where its large tensor buffers go back to (the service's pool).
  std::shared_ptr<TensorBufferPool> buffers;
  SteadyClock::time_point start = SteadyClock::now();
  bool model_known = false;
  kserve::Model model = kserve::Model::kSoftmax;
  std::string data_field = "raw_input_contents[0]";
  int64_t data_bytes = 0;
  v1::SoftmaxRequest request;
  v1::SoftmaxResponse response;
  OutputView view;
  inference::ModelInferRequest message;  // the unary call's parsed request
  // Shared memory: where the tensors are (when has_external), the output's
  // region for the response, and what keeps the regions mapped.
  bool has_external = false;
  ExternalTensors external;
  std::optional<kserve::RegionRef> output_region;
  std::vector<std::shared_ptr<const void>> leases;
  std::shared_ptr<const void> held;  // its share of the memory budget
  grpc::CallbackServerContext* context = nullptr;  // the call's; for the access log
};

// The shared-memory parameters of a tensor's `parameters` (see
// kserve::MakeRegionRef); `field` names them in messages.
absl::StatusOr<std::optional<kserve::RegionRef>> RegionOf(
    const google::protobuf::Map<std::string, inference::InferParameter>& parameters,
    absl::string_view field) {
  std::optional<std::string> region;
  std::optional<int64_t> byte_size, offset;
  for (const auto& [name, value] : parameters) {
    if (name == "shared_memory_region") {
      if (value.parameter_choice_case() != inference::InferParameter::kStringParam) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".shared_memory_region: expected a string parameter"));
      }
      region = value.string_param();
    } else if (name == "shared_memory_byte_size" || name == "shared_memory_offset") {
      int64_t number = 0;
      if (value.parameter_choice_case() == inference::InferParameter::kInt64Param) {
        number = value.int64_param();
      } else if (value.parameter_choice_case() == inference::InferParameter::kUint64Param) {
        number = static_cast<int64_t>(
            std::min<uint64_t>(value.uint64_param(), std::numeric_limits<int64_t>::max()));
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".", name, ": expected an integer parameter"));
      }
      (name == "shared_memory_offset" ? offset : byte_size) = number;
    }
  }
  return kserve::MakeRegionRef(std::move(region), byte_size, offset, field);
}

// The int64 / double value of request parameter `name`, when given.
absl::Status ReadParameters(const inference::ModelInferRequest& request,
                            kserve::InferRequestParts* parts) {
  for (const auto& [name, value] : request.parameters()) {
    if (name == "axis") {
      if (value.parameter_choice_case() != inference::InferParameter::kInt64Param) {
        return absl::InvalidArgumentError("parameters.axis: expected an int64 parameter");
      }
      parts->axis = value.int64_param();
    } else if (name == "temperature") {
      if (value.parameter_choice_case() == inference::InferParameter::kDoubleParam) {
        parts->temperature = value.double_param();
      } else if (value.parameter_choice_case() == inference::InferParameter::kInt64Param) {
        parts->temperature = static_cast<double>(value.int64_param());
      } else {
        return absl::InvalidArgumentError(
            "parameters.temperature: expected a double (or int64) parameter");
      }
    }
    // Other parameters (Triton's priority, timeout, ...) are ignored, as
    // Triton ignores those a model does not use.
  }
  return absl::OkStatus();
}

// Turns `request` (whose raw contents are taken) into call->request, with
// its tensors' regions in `shared_memory` (may be null) bound.
absl::Status PrepareInfer(inference::ModelInferRequest* request,
                          const SharedMemoryManager* shared_memory, InferCall* call) {
  absl::StatusOr<kserve::Model> model =
      kserve::FindModel(request->model_name(), request->model_version());
  if (!model.ok()) return model.status();
  call->model_known = true;
  call->model = *model;

  kserve::InferRequestParts parts;
  parts.model_name = request->model_name();
  parts.model_version = request->model_version();
  parts.id = request->id();
  parts.input_count = request->inputs_size();
  for (int i = 0; i < request->outputs_size(); ++i) {
    const auto& output = request->outputs(i);
    parts.requested_outputs.push_back(output.name());
    absl::StatusOr<std::optional<kserve::RegionRef>> region =
        RegionOf(output.parameters(), absl::StrCat("outputs[", i, "].parameters"));
    if (!region.ok()) return region.status();
    if (region->has_value()) parts.output_region = **region;
  }
  SOFTMAX_RETURN_IF_ERROR(ReadParameters(*request, &parts));
  if (request->raw_input_contents_size() > 0 &&
      request->raw_input_contents_size() != request->inputs_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "raw_input_contents: expected one entry per input (", request->inputs_size(), "), got ",
        request->raw_input_contents_size()));
  }
  if (request->inputs_size() == 1) {
    const auto& input = request->inputs(0);
    parts.input_datatype = input.datatype();
    parts.input_shape.assign(input.shape().begin(), input.shape().end());
    absl::StatusOr<DType> dtype = kserve::ParseDatatype(input.datatype(), "inputs[0].datatype");
    if (!dtype.ok()) return dtype.status();
    absl::StatusOr<std::optional<kserve::RegionRef>> region =
        RegionOf(input.parameters(), "inputs[0].parameters");
    if (!region.ok()) return region.status();
    if (region->has_value()) {
      if (request->raw_input_contents_size() > 0 ||
          (input.has_contents() && kserve::HasContents(input.contents()))) {
        return absl::InvalidArgumentError(
            "inputs[0]: data given both in shared memory and in the request; send one");
      }
      parts.input_region = **region;
      call->data_field = "inputs[0].parameters.shared_memory_byte_size";
    } else if (request->raw_input_contents_size() == 1) {
      if (input.has_contents() && kserve::HasContents(input.contents())) {
        return absl::InvalidArgumentError(
            "inputs[0].contents: given together with raw_input_contents; send one or the other");
      }
      parts.input_data.swap(*request->mutable_raw_input_contents(0));
    } else {
      call->data_field = "inputs[0].contents.fp32_contents";
      absl::StatusOr<std::string> bytes =
          kserve::BytesFromContents(input.contents(), *dtype, "inputs[0].contents");
      if (!bytes.ok()) return bytes.status();
      parts.input_data = std::move(*bytes);
    }
    call->data_bytes = parts.input_region.has_value()
                           ? parts.input_region->byte_size
                           : static_cast<int64_t>(parts.input_data.size());
  }
  kserve::Model built = call->model;
  SOFTMAX_RETURN_IF_ERROR(kserve::BuildSoftmaxRequest(&parts, &built, &call->request));
  SOFTMAX_RETURN_IF_ERROR(
      kserve::BindRegions(parts, shared_memory, &call->external, &call->leases));
  call->has_external = parts.input_region.has_value() || parts.output_region.has_value();
  call->output_region = parts.output_region;
  return absl::OkStatus();
}

// Fills `out` with the answer of an OK `call` but its output bytes, which
// are returned: a view of the lent output, or (view.data null) moved into
// out's raw_output_contents.
OutputView FillInferResponse(InferCall* call, inference::ModelInferResponse* out) {
  out->set_model_name(kserve::ModelName(call->model));
  out->set_model_version(kserve::kModelVersion);
  out->set_id(call->request.request_id());
  auto* output = out->add_outputs();
  output->set_name(kserve::kOutputName);
  const auto dtype = static_cast<DType>(static_cast<int>(call->request.input().dtype()));
  output->set_datatype(kserve::DatatypeName(dtype));
  output->mutable_shape()->CopyFrom(call->request.input().shape());
  if (const auto& region = call->output_region) {
    // Written into the caller's region: no bytes in the response.
    auto& parameters = *output->mutable_parameters();
    parameters["shared_memory_region"].set_string_param(region->name);
    parameters["shared_memory_byte_size"].set_int64_param(region->byte_size);
    if (region->offset != 0) parameters["shared_memory_offset"].set_int64_param(region->offset);
    // An empty entry keeps raw_output_contents parallel to outputs, as
    // Triton's does: its C++ client (perf_analyzer) indexes one by the other.
    out->add_raw_output_contents();
    return OutputView{};
  }
  if (call->view.data != nullptr) return std::move(call->view);
  // A large output (echo, CPU backend) is sent by reference, not copied.
  if (call->buffers != nullptr) LendLargeOutput(call->buffers, &call->response, &call->view);
  if (call->view.data != nullptr) return std::move(call->view);
  out->add_raw_output_contents()->swap(*call->response.mutable_output()->mutable_data());
  return OutputView{};
}

using google::protobuf::io::CodedOutputStream;

// Wire tags (field number << 3 | 2): ModelInferResponse.raw_output_contents
// = 6, ModelStreamInferResponse.infer_response = 2.
constexpr uint8_t kRawOutputTag = (6 << 3) | 2;
constexpr uint8_t kInferResponseTag = (2 << 3) | 2;


template <typename Message>
absl::Status SerializeMessage(const Message& message, grpc::ByteBuffer* out) {
  bool own_buffer = false;
  const grpc::Status status =
      grpc::SerializationTraits<Message>::Serialize(message, out, &own_buffer);
  if (status.ok()) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("cannot serialise the response: ", status.error_message()));
}

// Serialises `response` into `out`, as a ModelStreamInferResponse's
// infer_response when `in_stream`. With a view, its bytes follow as the
// last raw_output_contents entry, referenced and not copied (a repeated
// field may come anywhere in a message); the view's owner is released with
// the buffer's last reference.
absl::Status SerializeInferResponse(inference::ModelInferResponse* response, OutputView view,
                                    bool in_stream, grpc::ByteBuffer* out) {
  if (view.data == nullptr) {
    if (!in_stream) return SerializeMessage(*response, out);
    inference::ModelStreamInferResponse wrapper;
    wrapper.mutable_infer_response()->Swap(response);
    return SerializeMessage(wrapper, out);
  }
  const uint64_t data_bytes = static_cast<uint64_t>(view.bytes);
  const size_t message_bytes = response->ByteSizeLong();
  const uint64_t entry_bytes = 1 + CodedOutputStream::VarintSize64(data_bytes) + data_bytes;
  const uint64_t inner_bytes = message_bytes + entry_bytes;
  if (inner_bytes + 16 > static_cast<uint64_t>(INT32_MAX)) {
    return absl::InternalError("cannot serialise the response: over 2 GiB");
  }
  const size_t head_bytes = (in_stream ? 1 + CodedOutputStream::VarintSize64(inner_bytes) : 0) +
                            message_bytes + 1 + CodedOutputStream::VarintSize64(data_bytes);
  grpc::Slice head(head_bytes);
  uint8_t* p = const_cast<uint8_t*>(head.begin());
  if (in_stream) {
    *p++ = kInferResponseTag;
    p = CodedOutputStream::WriteVarint64ToArray(inner_bytes, p);
  }
  p = response->SerializeWithCachedSizesToArray(p);
  *p++ = kRawOutputTag;
  p = CodedOutputStream::WriteVarint64ToArray(data_bytes, p);
  if (p != head.end()) return absl::InternalError("response header size mismatch");
  SetHeadAndView(std::move(head), std::move(view), out);
  return absl::OkStatus();
}

// Parses a ModelInferRequest out of `buffer` (consumed). A large message's
// first raw_input_contents entry lands in a buffer from `pool` (may be
// null): a repeated field keeps its cleared elements, with their capacity,
// for the parser to reuse. 2-core host, 64 MiB echo: 34,000 page faults
// per request without it.
absl::Status ParseInferRequest(grpc::ByteBuffer* buffer, TensorBufferPool* pool,
                               inference::ModelInferRequest* request) {
  if (pool != nullptr && request->raw_input_contents_size() == 0) {
    std::string data = pool->Take(buffer->Length());
    if (data.capacity() >= TensorBufferPool::kMinPooledBytes) {
      request->add_raw_input_contents()->swap(data);
      request->mutable_raw_input_contents()->Clear();
    }
  }
  const grpc::Status status =
      grpc::SerializationTraits<inference::ModelInferRequest>::Deserialize(buffer, request);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request is not a valid inference.ModelInferRequest message (",
                     status.error_message(), ")"));
  }
  return absl::OkStatus();
}

// Statistics, metrics and access log of a finished request.
void Record(KServeGrpcService* service, RpcMethod method, const InferCall& call,
            const absl::Status& status) {
  RequestTiming timing;
  timing.queue_ns = call.response.timing().queue_ns();
  timing.compute_ns = call.response.timing().compute_ns();
  kserve::RecordInference(
      service->statistics(), service->front_end().metrics, method,
      call.model_known ? std::optional<kserve::Model>(call.model) : std::nullopt, status,
      NanosSince(call.start), call.data_bytes, timing, [&call] { return call.context->peer(); });
}

// Parses `buffer` into `request` and starts `call` (owned by the completion
// from here on); `complete` runs exactly once with the outcome, possibly
// before this returns.
template <typename Complete>
void StartInfer(KServeGrpcService* service, grpc::CallbackServerContext* context,
                grpc::ByteBuffer* buffer, inference::ModelInferRequest* request,
                std::unique_ptr<InferCall> owned,
                std::function<bool()> is_cancelled, Complete complete) {
  InferCall* call = owned.release();
  call->context = context;
  const FrontEnd& front_end = service->front_end();
  call->buffers = front_end.buffers;
  absl::Status status = Authenticate(front_end.authenticator, *context);
  // As softmax.v1's Softmax: a call that ended before its message arrived
  // is CANCELLED, and counted against its connection (reset_guard.h).
  if (!buffer->Valid()) {
    if (front_end.reset_guard != nullptr) {
      front_end.reset_guard->RecordPrematureReset(context->peer());
    }
    if (status.ok()) status = absl::CancelledError("the call ended before its request message arrived");
  }
  if (status.ok()) status = ParseInferRequest(buffer, call->buffers.get(), request);
  if (status.ok()) status = PrepareInfer(request, service->shared_memory(), call);
  if (status.ok()) {
    status = kserve::RenameInputFields(
        Dispatch(front_end, &call->request, &call->response, &call->view, context->deadline(),
                 std::move(is_cancelled),
                 [call, complete](const absl::Status& outcome) {
                   complete(std::unique_ptr<InferCall>(call), outcome);
                 },
                 call->has_external ? &call->external : nullptr, &call->held),
        call->data_field);
  }
  if (!status.ok()) complete(std::unique_ptr<InferCall>(call), status);
}

// ModelStreamInfer's messages, for StreamReactor: a ModelInferRequest in, a
// ModelStreamInferResponse out, errors in band (error_message).
class StreamInferHandler {
 public:
  struct Entry {
    grpc::ByteBuffer incoming;  // the request as read
    inference::ModelInferRequest request;
    std::unique_ptr<InferCall> call;
    grpc::ByteBuffer outgoing;  // the response as written
    Admission::Ticket ticket;   // in flight until answered (StreamReactor)
  };

  StreamInferHandler(KServeGrpcService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {}

  std::unique_ptr<Entry> NewEntry() { return std::make_unique<Entry>(); }

  void Start(Entry* entry, std::function<bool()> is_cancelled,
             std::function<void(const absl::Status&)> done) {
    StartInfer(service_, context_, &entry->incoming, &entry->request,
               std::make_unique<InferCall>(), std::move(is_cancelled),
               [entry, done = std::move(done)](std::unique_ptr<InferCall> call,
                                               const absl::Status& outcome) {
                 entry->call = std::move(call);
                 done(outcome);
               });
  }

  // Every request has its answer, one message each.
  bool Answer(Entry& entry, const absl::Status& status) {
    absl::Status outcome = status;
    if (outcome.ok()) {
      inference::ModelInferResponse response;
      OutputView view = FillInferResponse(entry.call.get(), &response);
      outcome = SerializeInferResponse(&response, std::move(view), true, &entry.outgoing);
    }
    if (!outcome.ok()) {
      // In band: the error, with the request's id and model for the caller.
      inference::ModelStreamInferResponse error;
      error.set_error_message(std::string(outcome.message()));
      error.mutable_infer_response()->set_id(entry.request.id());
      error.mutable_infer_response()->set_model_name(entry.request.model_name());
      SerializeMessage(error, &entry.outgoing).IgnoreError();
    }
    Record(service_, RpcMethod::kModelStreamInfer, *entry.call, outcome);
    entry.call.reset();
    entry.request.Clear();
    return true;
  }
  bool NextOutgoing(Entry&) { return false; }
  void ReadsDone() {}  // nothing is held between messages
  bool AtMessageBoundary() const { return true; }

 private:
  KServeGrpcService* const service_;
  grpc::CallbackServerContext* const context_;
};

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

KServeGrpcService::KServeGrpcService(const FrontEnd& front_end,
                                     kserve::ModelStatistics* statistics,
                                     std::string server_version,
                                     SharedMemoryManager* shared_memory)
    : front_end_(front_end),
      statistics_(statistics),
      server_version_(std::move(server_version)),
      shared_memory_(shared_memory) {}

grpc::ServerUnaryReactor* KServeGrpcService::Unimplemented(grpc::CallbackServerContext* context,
                                                           const char* rpc) {
  if (absl::Status allowed = Authenticate(front_end_.authenticator, *context); !allowed.ok()) {
    return FinishWith(context, allowed);
  }
  return FinishWith(context, absl::UnimplementedError(absl::StrCat(
                                 "inference.GRPCInferenceService/", rpc,
                                 " is not implemented by softmax-serve")));
}

grpc::ServerUnaryReactor* KServeGrpcService::ServerLive(grpc::CallbackServerContext* context,
                                                        const inference::ServerLiveRequest*,
                                                        inference::ServerLiveResponse* response) {
  response->set_live(true);
  return FinishWith(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeGrpcService::ServerReady(
    grpc::CallbackServerContext* context, const inference::ServerReadyRequest*,
    inference::ServerReadyResponse* response) {
  response->set_ready(!front_end_.admission->draining());
  return FinishWith(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeGrpcService::ModelReady(
    grpc::CallbackServerContext* context, const inference::ModelReadyRequest* request,
    inference::ModelReadyResponse* response) {
  // A model (or version) not served is not ready, and that is the answer,
  // not an error: Triton's, which tritonclient's is_model_ready expects.
  absl::StatusOr<kserve::Model> model = kserve::FindModel(request->name(), request->version());
  response->set_ready(model.ok() && !front_end_.admission->draining());
  return FinishWith(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeGrpcService::ServerMetadata(
    grpc::CallbackServerContext* context, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  if (absl::Status allowed = Authenticate(front_end_.authenticator, *context); !allowed.ok()) {
    return FinishWith(context, allowed);
  }
  response->set_name(kserve::kServerName);
  response->set_version(server_version_);
  for (const std::string& extension : kserve::Extensions(shared_memory_)) {
    response->add_extensions(extension);
  }
  return FinishWith(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeGrpcService::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  if (absl::Status allowed = Authenticate(front_end_.authenticator, *context); !allowed.ok()) {
    return FinishWith(context, allowed);
  }
  absl::StatusOr<kserve::Model> model = kserve::FindModel(request->name(), request->version());
  if (model.ok()) *response = kserve::Metadata(*model);
  return FinishWith(context, model.status());
}

grpc::ServerUnaryReactor* KServeGrpcService::ModelConfig(
    grpc::CallbackServerContext* context, const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  if (absl::Status allowed = Authenticate(front_end_.authenticator, *context); !allowed.ok()) {
    return FinishWith(context, allowed);
  }
  absl::StatusOr<kserve::Model> model = kserve::FindModel(request->name(), request->version());
  if (model.ok()) *response->mutable_config() = kserve::Config(*model);
  return FinishWith(context, model.status());
}

grpc::ServerUnaryReactor* KServeGrpcService::ModelStatistics(
    grpc::CallbackServerContext* context, const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  if (absl::Status allowed = Authenticate(front_end_.authenticator, *context); !allowed.ok()) {
    return FinishWith(context, allowed);
  }
  if (request->name().empty()) {
    for (kserve::Model model : kserve::kModels) {
      *response->add_model_stats() = statistics_->Get(model);
    }
    return FinishWith(context, absl::OkStatus());
  }
  absl::StatusOr<kserve::Model> model = kserve::FindModel(request->name(), request->version());
  if (model.ok()) *response->add_model_stats() = statistics_->Get(*model);
  return FinishWith(context, model.status());
}

namespace {

// A unary ModelInfer: holds the request's share of the memory budget until
// gRPC has sent the answer (OnDone), not only until it is serialised.
// Counted as in flight (its ticket) until then too.
class InferReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit InferReactor(Admission* admission) : ticket(admission->Enter()) {}
  void OnDone() override { delete this; }
  Admission::Ticket ticket;
  std::shared_ptr<const void> held;
};

}  // namespace

grpc::ServerUnaryReactor* KServeGrpcService::ModelInfer(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  auto* reactor = new InferReactor(front_end_.admission);
  auto call = std::make_unique<InferCall>();
  inference::ModelInferRequest* message = &call->message;
  // gRPC hands the request as const, but the buffer is this call's and is
  // not read again once this handler has it: parsing consumes it.
  StartInfer(
      this, context, const_cast<grpc::ByteBuffer*>(request), message, std::move(call),
      [context] { return context->IsCancelled(); },
      [this, reactor, response](std::unique_ptr<InferCall> done, const absl::Status& status) {
        absl::Status outcome = status;
        if (outcome.ok()) {
          inference::ModelInferResponse answer;
          OutputView view = FillInferResponse(done.get(), &answer);
          outcome = SerializeInferResponse(&answer, std::move(view), false, response);
        }
        Record(this, RpcMethod::kModelInfer, *done, outcome);
        reactor->held = std::move(done->held);
        done.reset();
        reactor->Finish(ToGrpcStatus(outcome));
      });
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* KServeGrpcService::ModelStreamInfer(
    grpc::CallbackServerContext* context) {
  return new StreamReactor<StreamInferHandler>(front_end_, context,
                                               Authenticate(front_end_.authenticator, *context),
                                               StreamInferHandler(this, context));
}

// The shared-memory extensions. Without a manager (or with
// --shared_memory=off) registration answers UNIMPLEMENTED, as Triton does for
// an extension it does not serve.
namespace {

absl::Status NoSharedMemory() {
  return absl::UnimplementedError(
      "shared memory is turned off on this server (--shared_memory=off)");
}

int64_t ToInt64(uint64_t value) {
  return static_cast<int64_t>(std::min<uint64_t>(value, std::numeric_limits<int64_t>::max()));
}

}  // namespace

grpc::ServerUnaryReactor* KServeGrpcService::SystemSharedMemoryStatus(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryStatusRequest* request,
    inference::SystemSharedMemoryStatusResponse* response) {
  if (absl::Status allowed = Authenticate(front_end_.authenticator, *context); !allowed.ok()) {
    return FinishWith(context, allowed);
  }
  if (shared_memory_ == nullptr) return FinishWith(context, NoSharedMemory());
  absl::StatusOr<std::vector<SharedMemoryRegionStatus>> regions =
      shared_memory_->Status(SharedMemoryKind::kSystem, request->name());
  if (!regions.ok()) return FinishWith(context, regions.status());
  for (const SharedMemoryRegionStatus& region : *regions) {
    auto& out = (*response->mutable_regions())[region.name];
    out.set_name(region.name);
    out.set_key(region.key);
    out.set_offset(static_cast<uint64_t>(region.offset));
    out.set_byte_size(static_cast<uint64_t>(region.byte_size));
  }
  return FinishWith(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeGrpcService::SystemSharedMemoryRegister(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryRegisterRequest* request,
    inference::SystemSharedMemoryRegisterResponse*) {
  if (absl::Status allowed = Authenticate(front_end_.authenticator, *context); !allowed.ok()) {
    return FinishWith(context, allowed);
  }
  if (shared_memory_ == nullptr) return FinishWith(context, NoSharedMemory());
  return FinishWith(context, shared_memory_->RegisterSystem(request->name(), request->key(),
                                                            ToInt64(request->offset()),
                                                            ToInt64(request->byte_size())));
}

grpc::ServerUnaryReactor* KServeGrpcService::SystemSharedMemoryUnregister(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryUnregisterRequest* request,
    inference::SystemSharedMemoryUnregisterResponse*) {
  if (absl::Status allowed = Authenticate(front_end_.authenticator, *context); !allowed.ok()) {
    return FinishWith(context, allowed);
  }
  if (shared_memory_ == nullptr) return FinishWith(context, NoSharedMemory());
  return FinishWith(context, shared_memory_->Unregister(SharedMemoryKind::kSystem,
                                                        request->name()));
}

grpc::ServerUnaryReactor* KServeGrpcService::CudaSharedMemoryStatus(
    grpc::CallbackServerContext* context, const inference::CudaSharedMemoryStatusRequest* request,
    inference::CudaSharedMemoryStatusResponse* response) {
  if (absl::Status allowed = Authenticate(front_end_.authenticator, *context); !allowed.ok()) {
    return FinishWith(context, allowed);
  }
  if (shared_memory_ == nullptr) return FinishWith(context, NoSharedMemory());
  absl::StatusOr<std::vector<SharedMemoryRegionStatus>> regions =
      shared_memory_->Status(SharedMemoryKind::kCuda, request->name());
  if (!regions.ok()) return FinishWith(context, regions.status());
  for (const SharedMemoryRegionStatus& region : *regions) {
    auto& out = (*response->mutable_regions())[region.name];
    out.set_name(region.name);
    out.set_device_id(static_cast<uint64_t>(region.device));
    out.set_byte_size(static_cast<uint64_t>(region.byte_size));
  }
  return FinishWith(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeGrpcService::CudaSharedMemoryRegister(
    grpc::CallbackServerContext* context,
    const inference::CudaSharedMemoryRegisterRequest* request,
    inference::CudaSharedMemoryRegisterResponse*) {
  if (absl::Status allowed = Authenticate(front_end_.authenticator, *context); !allowed.ok()) {
    return FinishWith(context, allowed);
  }
  if (shared_memory_ == nullptr) return FinishWith(context, NoSharedMemory());
  return FinishWith(context,
                    shared_memory_->RegisterCuda(request->name(), request->raw_handle(),
                                                 request->device_id(),
                                                 ToInt64(request->byte_size())));
}

grpc::ServerUnaryReactor* KServeGrpcService::CudaSharedMemoryUnregister(
    grpc::CallbackServerContext* context,
    const inference::CudaSharedMemoryUnregisterRequest* request,
    inference::CudaSharedMemoryUnregisterResponse*) {
  if (absl::Status allowed = Authenticate(front_end_.authenticator, *context); !allowed.ok()) {
    return FinishWith(context, allowed);
  }
  if (shared_memory_ == nullptr) return FinishWith(context, NoSharedMemory());
  return FinishWith(context, shared_memory_->Unregister(SharedMemoryKind::kCuda,
                                                        request->name()));
}

}  // namespace softmax::server
