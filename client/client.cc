#include "client/client.h"

#include <grpcpp/generic/generic_stub.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace softmax::client {
namespace {

void ApplyCallOptions(const CallOptions& options, grpc::ClientContext& context) {
  if (options.timeout != absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  }
  context.set_wait_for_ready(options.wait_for_ready);
}

}  // namespace

std::shared_ptr<grpc::Channel> CreateChannel(const ChannelOptions& options) {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(options.max_message_bytes);
  arguments.SetMaxSendMessageSize(options.max_message_bytes);
  return grpc::CreateCustomChannel(options.target, grpc::InsecureChannelCredentials(), arguments);
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<v1::SoftmaxResponse> CallSoftmax(const std::shared_ptr<grpc::Channel>& channel,
                                                const v1::SoftmaxRequest& request,
                                                const CallOptions& options) {
  v1::SoftmaxService::Stub stub(channel);
  grpc::ClientContext context;
  ApplyCallOptions(options, context);
  v1::SoftmaxResponse response;
  if (!options.stream) {
    grpc::Status status = stub.Softmax(&context, request, &response);
    if (!status.ok()) return FromGrpcStatus(status);
    return response;
  }
  std::unique_ptr<grpc::ClientReaderWriter<v1::SoftmaxRequest, v1::SoftmaxResponse>> stream =
      stub.SoftmaxStream(&context);
  const bool written = stream->Write(request);
  stream->WritesDone();
  const bool got_response = written && stream->Read(&response);
  // Drain until the server closes, so Finish() reports the real status.
  v1::SoftmaxResponse extra;
  int extra_responses = 0;
  while (got_response && stream->Read(&extra)) ++extra_responses;
  grpc::Status status = stream->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  if (!got_response) {
    return absl::UnavailableError("stream closed without a response");
  }
  if (extra_responses > 0) {
    return absl::InternalError(
        absl::StrCat("stream answered one request with ", 1 + extra_responses, " responses"));
  }
  if (response.has_error() && response.error().code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(response.error().code()),
                        response.error().message());
  }
  return response;
}

const char* HealthStateName(HealthState state) {
  switch (state) {
    case HealthState::kUnknown: return "UNKNOWN";
    case HealthState::kServing: return "SERVING";
    case HealthState::kNotServing: return "NOT_SERVING";
    case HealthState::kServiceUnknown: return "SERVICE_UNKNOWN";
  }
  return "UNKNOWN";
}

std::string EncodeHealthCheckRequest(const std::string& service) {
  // HealthCheckRequest { string service = 1; }: tag 0x0a, varint length, bytes.
  std::string bytes;
  if (service.empty()) return bytes;
  bytes.push_back(0x0a);
  uint64_t length = service.size();
  while (length >= 0x80) {
    bytes.push_back(static_cast<char>((length & 0x7f) | 0x80));
    length >>= 7;
  }
  bytes.push_back(static_cast<char>(length));
  bytes += service;
  return bytes;
}

absl::StatusOr<HealthState> DecodeHealthCheckResponse(const std::string& bytes) {
  // HealthCheckResponse { ServingStatus status = 1; }; skip any other field.
  HealthState state = HealthState::kUnknown;
  size_t at = 0;
  auto read_varint = [&](uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64 && at < bytes.size(); shift += 7) {
      const unsigned char byte = static_cast<unsigned char>(bytes[at++]);
      *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return true;
    }
    return false;
  };
  while (at < bytes.size()) {
    uint64_t key = 0;
    if (!read_varint(&key)) return absl::DataLossError("health: truncated response");
    const int field = static_cast<int>(key >> 3);
    const int wire_type = static_cast<int>(key & 7);
    uint64_t value = 0;
    if (wire_type == 0) {
      if (!read_varint(&value)) return absl::DataLossError("health: truncated response");
      if (field == 1) state = static_cast<HealthState>(value);
    } else if (wire_type == 2) {
      if (!read_varint(&value) || value > bytes.size() - at) {
        return absl::DataLossError("health: truncated response");
      }
      at += value;
    } else if (wire_type == 1 || wire_type == 5) {
      const size_t width = wire_type == 1 ? 8 : 4;
      if (width > bytes.size() - at) return absl::DataLossError("health: truncated response");
      at += width;
    } else {
      return absl::DataLossError("health: unexpected wire type");
    }
  }
  if (static_cast<int>(state) < 0 || static_cast<int>(state) > 3) state = HealthState::kUnknown;
  return state;
}

absl::StatusOr<HealthState> CheckHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                                        absl::Duration timeout) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  if (timeout != absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  const std::string encoded = EncodeHealthCheckRequest(service);
  grpc::Slice slice(encoded);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                 &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return FromGrpcStatus(status);
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::DataLossError("health: unreadable response");
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return DecodeHealthCheckResponse(bytes);
}

}  // namespace softmax::client
