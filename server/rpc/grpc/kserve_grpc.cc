#include "server/rpc/grpc/kserve_grpc.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/logging/log.h"
#include "server/rpc/grpc/authenticate.h"
#include "server/rpc/grpc/kserve_infer.h"
#include "server/rpc/dispatch.h"
#include "server/rpc/grpc/reset_guard.h"
#include "server/rpc/grpc/status_util.h"
#include "server/rpc/status_macros.h"
#include "server/rpc/grpc/stream_reactor.h"
#include "server/rpc/grpc/wire.h"

namespace softmax::server {
namespace {

// The record of a finished request (request_record.h).
void Record(KServeGrpcService* service, const InferCall& call, const absl::Status& status) {
  WriteRequestRecord(call.record, status, {service->front_end().metrics, service->statistics()},
                     [&call] { return call.context->peer(); });
}

// Parses `buffer` into `request` and starts `call` (owned by the completion
// from here on); `complete` runs exactly once with the outcome, possibly
// before this returns. `hold_refusals`: a unary call's (Responder).
template <typename Complete>
void StartInfer(KServeGrpcService* service, grpc::CallbackServerContext* context,
                grpc::ByteBuffer* buffer, inference::ModelInferRequest* request,
                std::unique_ptr<InferCall> owned, std::function<bool()> is_cancelled,
                bool hold_refusals, Complete complete) {
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
  InferenceRequest submitted;
  if (status.ok()) status = ParseInferRequest(buffer, call->buffers.get(), request);
  if (status.ok()) status = PrepareInfer(request, service->shared_memory(), call, &submitted);
  if (!status.ok()) {
    complete(std::unique_ptr<InferCall>(call), status);
    return;
  }
  submitted.deadline = context->deadline();
  submitted.is_cancelled = std::move(is_cancelled);
  Responder responder;
  responder.hold_refusals = hold_refusals;
  responder.done = [call, complete](const absl::Status& outcome, const RequestTiming& timing) {
    call->record.timing = timing;
    complete(std::unique_ptr<InferCall>(call), outcome);
  };
  Submit(front_end, std::move(submitted), kserve::FieldNamesFor(call->parts),
         std::move(responder), &call->admitted);
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
    // In flight from its read until its answer is written (StreamReactor):
    // the ticket, and the budget Submit adds to it.
    Admission::Admitted admitted;
  };

  StreamInferHandler(KServeGrpcService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {}

  std::unique_ptr<Entry> NewEntry() { return std::make_unique<Entry>(); }

  void Start(Entry* entry, std::function<bool()> is_cancelled,
             std::function<void(const absl::Status&)> done) {
    // The call submits with the entry's ticket and gives both back with
    // its outcome, for the entry to keep until its answer is written.
    auto call = std::make_unique<InferCall>();
    call->record.method = RpcMethod::kModelStreamInfer;
    call->admitted = std::move(entry->admitted);
    StartInfer(service_, context_, &entry->incoming, &entry->request, std::move(call),
               std::move(is_cancelled), /*hold_refusals=*/false,
               [entry, done = std::move(done)](std::unique_ptr<InferCall> call,
                                               const absl::Status& outcome) {
                 entry->admitted = std::move(call->admitted);
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
    Record(service_, *entry.call, outcome);
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

// The one authentication step of every method but the health checks
// (ServerLive, ServerReady, ModelReady) and inference (StartInfer, the
// stream's refusal): the call fails UNAUTHENTICATED without a known token,
// else finishes with what `body` returns (run only then).
template <typename Body>
grpc::ServerUnaryReactor* Authenticated(const FrontEnd& front_end,
                                        grpc::CallbackServerContext* context, Body body) {
  absl::Status status = Authenticate(front_end.authenticator, *context);
  if (status.ok()) status = body();
  return FinishWith(context, status);
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
  return Authenticated(front_end_, context, [&]() -> absl::Status {
    return absl::UnimplementedError(absl::StrCat("inference.GRPCInferenceService/", rpc,
                                                 " is not implemented by softmax-serve"));
  });
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
  return Authenticated(front_end_, context, [&]() -> absl::Status {
    response->set_name(kserve::kServerName);
    response->set_version(server_version_);
    for (const std::string& extension : kserve::Extensions(shared_memory_)) {
      response->add_extensions(extension);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KServeGrpcService::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  return Authenticated(front_end_, context, [&]() -> absl::Status {
    absl::StatusOr<kserve::Model> model = kserve::FindModel(request->name(), request->version());
    if (model.ok()) *response = kserve::Metadata(*model);
    return model.status();
  });
}

grpc::ServerUnaryReactor* KServeGrpcService::ModelConfig(
    grpc::CallbackServerContext* context, const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  return Authenticated(front_end_, context, [&]() -> absl::Status {
    absl::StatusOr<kserve::Model> model = kserve::FindModel(request->name(), request->version());
    if (model.ok()) *response->mutable_config() = kserve::Config(*model);
    return model.status();
  });
}

grpc::ServerUnaryReactor* KServeGrpcService::ModelStatistics(
    grpc::CallbackServerContext* context, const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  return Authenticated(front_end_, context, [&]() -> absl::Status {
    if (request->name().empty()) {
      for (kserve::Model model : kserve::kModels) {
        *response->add_model_stats() = statistics_->Get(model);
      }
      return absl::OkStatus();
    }
    absl::StatusOr<kserve::Model> model = kserve::FindModel(request->name(), request->version());
    if (model.ok()) *response->add_model_stats() = statistics_->Get(*model);
    return model.status();
  });
}

namespace {

// A unary ModelInfer: keeps what its request was admitted with (its
// in-flight ticket and share of the memory budget) until gRPC has sent the
// answer (OnDone), not only until it is serialised.
class InferReactor final : public grpc::ServerUnaryReactor {
 public:
  void OnDone() override { delete this; }
  Admission::Admitted admitted;
};

}  // namespace

grpc::ServerUnaryReactor* KServeGrpcService::ModelInfer(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  auto* reactor = new InferReactor;
  auto call = std::make_unique<InferCall>();
  inference::ModelInferRequest* message = &call->message;
  // gRPC hands the request as const, but the buffer is this call's and is
  // not read again once this handler has it: parsing consumes it.
  // A refusal while draining is held across Shutdown's GOAWAY, as every
  // gRPC unary call's (Admission::Submit, Responder::hold_refusals).
  StartInfer(
      this, context, const_cast<grpc::ByteBuffer*>(request), message, std::move(call),
      [context] { return context->IsCancelled(); }, /*hold_refusals=*/true,
      [this, reactor, response](std::unique_ptr<InferCall> done, const absl::Status& status) {
        absl::Status outcome = status;
        if (outcome.ok()) {
          inference::ModelInferResponse answer;
          OutputView view = FillInferResponse(done.get(), &answer);
          outcome = SerializeInferResponse(&answer, std::move(view), false, response);
        }
        Record(this, *done, outcome);
        reactor->admitted = std::move(done->admitted);
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

// The shared-memory extensions: each method parses its request into a
// kserve::SharedMemoryCall and encodes what kserve::RunSharedMemoryCall
// answers.
namespace {

using kserve::SharedMemoryCall;

int64_t ToInt64(uint64_t value) {
  return static_cast<int64_t>(std::min<uint64_t>(value, std::numeric_limits<int64_t>::max()));
}

SharedMemoryCall MakeCall(SharedMemoryCall::Action action, SharedMemoryKind kind,
                          const std::string& name) {
  SharedMemoryCall call;
  call.action = action;
  call.kind = kind;
  call.name = name;
  return call;
}

// Runs `call`; a status call's regions go through `add` into the response.
template <typename Add>
absl::Status RunCall(const SharedMemoryCall& call, SharedMemoryManager* shared_memory, Add add) {
  absl::StatusOr<std::vector<SharedMemoryRegionStatus>> regions =
      kserve::RunSharedMemoryCall(call, shared_memory);
  if (!regions.ok()) return regions.status();
  for (const SharedMemoryRegionStatus& region : *regions) add(region);
  return absl::OkStatus();
}

void NoRegions(const SharedMemoryRegionStatus&) {}

}  // namespace

grpc::ServerUnaryReactor* KServeGrpcService::SystemSharedMemoryStatus(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryStatusRequest* request,
    inference::SystemSharedMemoryStatusResponse* response) {
  return Authenticated(front_end_, context, [&]() -> absl::Status {
    return RunCall(MakeCall(SharedMemoryCall::Action::kStatus, SharedMemoryKind::kSystem,
                            request->name()),
                   shared_memory_, [response](const SharedMemoryRegionStatus& region) {
                     auto& out = (*response->mutable_regions())[region.name];
                     out.set_name(region.name);
                     out.set_key(region.key);
                     out.set_offset(static_cast<uint64_t>(region.offset));
                     out.set_byte_size(static_cast<uint64_t>(region.byte_size));
                   });
  });
}

grpc::ServerUnaryReactor* KServeGrpcService::SystemSharedMemoryRegister(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryRegisterRequest* request,
    inference::SystemSharedMemoryRegisterResponse*) {
  return Authenticated(front_end_, context, [&]() -> absl::Status {
    SharedMemoryCall call = MakeCall(SharedMemoryCall::Action::kRegister,
                                     SharedMemoryKind::kSystem, request->name());
    call.key = request->key();
    call.offset = ToInt64(request->offset());
    call.byte_size = ToInt64(request->byte_size());
    return RunCall(call, shared_memory_, NoRegions);
  });
}

grpc::ServerUnaryReactor* KServeGrpcService::SystemSharedMemoryUnregister(
    grpc::CallbackServerContext* context,
    const inference::SystemSharedMemoryUnregisterRequest* request,
    inference::SystemSharedMemoryUnregisterResponse*) {
  return Authenticated(front_end_, context, [&]() -> absl::Status {
    return RunCall(MakeCall(SharedMemoryCall::Action::kUnregister, SharedMemoryKind::kSystem,
                            request->name()),
                   shared_memory_, NoRegions);
  });
}

grpc::ServerUnaryReactor* KServeGrpcService::CudaSharedMemoryStatus(
    grpc::CallbackServerContext* context, const inference::CudaSharedMemoryStatusRequest* request,
    inference::CudaSharedMemoryStatusResponse* response) {
  return Authenticated(front_end_, context, [&]() -> absl::Status {
    return RunCall(MakeCall(SharedMemoryCall::Action::kStatus, SharedMemoryKind::kCuda,
                            request->name()),
                   shared_memory_, [response](const SharedMemoryRegionStatus& region) {
                     auto& out = (*response->mutable_regions())[region.name];
                     out.set_name(region.name);
                     out.set_device_id(static_cast<uint64_t>(region.device));
                     out.set_byte_size(static_cast<uint64_t>(region.byte_size));
                   });
  });
}

grpc::ServerUnaryReactor* KServeGrpcService::CudaSharedMemoryRegister(
    grpc::CallbackServerContext* context,
    const inference::CudaSharedMemoryRegisterRequest* request,
    inference::CudaSharedMemoryRegisterResponse*) {
  return Authenticated(front_end_, context, [&]() -> absl::Status {
    SharedMemoryCall call = MakeCall(SharedMemoryCall::Action::kRegister,
                                     SharedMemoryKind::kCuda, request->name());
    call.raw_handle = request->raw_handle();
    call.device = request->device_id();
    call.byte_size = ToInt64(request->byte_size());
    return RunCall(call, shared_memory_, NoRegions);
  });
}

grpc::ServerUnaryReactor* KServeGrpcService::CudaSharedMemoryUnregister(
    grpc::CallbackServerContext* context,
    const inference::CudaSharedMemoryUnregisterRequest* request,
    inference::CudaSharedMemoryUnregisterResponse*) {
  return Authenticated(front_end_, context, [&]() -> absl::Status {
    return RunCall(MakeCall(SharedMemoryCall::Action::kUnregister, SharedMemoryKind::kCuda,
                            request->name()),
                   shared_memory_, NoRegions);
  });
}

}  // namespace softmax::server
