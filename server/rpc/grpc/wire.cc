#include "server/rpc/grpc/wire.h"

#include <cstdint>
#include <memory>
#include <utility>

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/slice.h>

#include "absl/strings/str_cat.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::server {
namespace {

using google::protobuf::io::CodedOutputStream;

// Wire tags (field number << 3 | 2, length-delimited) of the fields the view
// path writes by hand: SoftmaxResponse.output = 2, Tensor.data = 3.
constexpr uint8_t kOutputTag = (2 << 3) | 2;
constexpr uint8_t kDataTag = (3 << 3) | 2;

// A view's owner, kept by the gRPC slice that references its bytes.
void ReleaseOwner(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

}  // namespace

absl::Status UnparsableMessage(absl::string_view type, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(
      "the request is not a valid ", type, " message (",
      problem.empty() ? "bytes that are not protobuf's wire format, or a string field that is "
                        "not UTF-8"
                      : problem,
      ")"));
}

absl::Status ParseRequestMessage(grpc::ByteBuffer* buffer, TensorBufferPool* pool,
                                 v1::SoftmaxRequest* request) {
  const size_t length = buffer->Length();  // gRPC bounds it by INT_MAX
  if (pool != nullptr) {
    // The whole message bounds its tensor. A merge (unlike gRPC's parse,
    // which clears the message first) keeps the buffer's capacity.
    std::string data = pool->Take(length);
    if (data.capacity() >= TensorBufferPool::kMinPooledBytes) {
      request->mutable_input()->mutable_data()->swap(data);
    }
  }
  bool parsed = false;
  std::string problem;
  {
    grpc::ProtoBufferReader reader(buffer);
    if (!reader.status().ok()) {
      problem = reader.status().error_message();
    } else {
      parsed = request->MergeFromBoundedZeroCopyStream(&reader, static_cast<int>(length));
      if (!parsed) problem = request->InitializationErrorString();
    }
  }
  buffer->Clear();
  if (!parsed) {
    return UnparsableMessage("softmax.v1.SoftmaxRequest", problem);
  }
  return absl::OkStatus();
}

absl::Status SerializeResponse(v1::SoftmaxResponse* response, OutputView view,
                               grpc::ByteBuffer* out) {
  if (view.data == nullptr) {
    bool own_buffer = false;
    const grpc::Status status =
        grpc::SerializationTraits<v1::SoftmaxResponse>::Serialize(*response, out, &own_buffer);
    if (status.ok()) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("cannot serialise the response: ", status.error_message()));
  }
  response->mutable_output()->clear_data();
  const uint64_t data_bytes = static_cast<uint64_t>(view.bytes);
  // The second `output`: one field, `data`, of data_bytes.
  const uint64_t tensor_bytes = 1 + CodedOutputStream::VarintSize64(data_bytes) + data_bytes;
  const size_t message_bytes = response->ByteSizeLong();
  const size_t head_bytes = message_bytes + 1 + CodedOutputStream::VarintSize64(tensor_bytes) +
                            1 + CodedOutputStream::VarintSize64(data_bytes);
  if (message_bytes + tensor_bytes + 16 > static_cast<uint64_t>(INT32_MAX)) {
    return absl::InternalError("cannot serialise the response: over 2 GiB");
  }
  grpc::Slice head(head_bytes);
  uint8_t* p = const_cast<uint8_t*>(head.begin());
  p = response->SerializeWithCachedSizesToArray(p);
  *p++ = kOutputTag;
  p = CodedOutputStream::WriteVarint64ToArray(tensor_bytes, p);
  *p++ = kDataTag;
  p = CodedOutputStream::WriteVarint64ToArray(data_bytes, p);
  if (p != head.end()) return absl::InternalError("response header size mismatch");
  SetHeadAndView(std::move(head), std::move(view), out);
  return absl::OkStatus();
}

void SetHeadAndView(grpc::Slice head, OutputView view, grpc::ByteBuffer* out) {
  grpc::Slice slices[2] = {
      std::move(head),
      grpc::Slice(const_cast<char*>(view.data), static_cast<size_t>(view.bytes), &ReleaseOwner,
                  new std::shared_ptr<const void>(std::move(view.owner)))};
  grpc::ByteBuffer buffer(slices, 2);
  out->Swap(&buffer);
}

}  // namespace softmax::server
