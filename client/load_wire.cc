#include "client/load_wire.h"

#include <cstdint>
#include <utility>

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/slice.h>

namespace softmax::client {
namespace {

using google::protobuf::io::CodedOutputStream;

// SoftmaxRequest.request_id: field 1, length-delimited.
constexpr uint8_t kRequestIdTag = (1 << 3) | 2;

}  // namespace

PreparedRequest::PreparedRequest(const v1::SoftmaxRequest& request)
    : bytes_(request.SerializeAsString()) {
  grpc::Slice slice(bytes_.data(), bytes_.size(), grpc::Slice::STATIC_SLICE);
  grpc::ByteBuffer message(&slice, 1);
  message_.Swap(&message);
}

grpc::ByteBuffer PreparedRequest::WithRequestId(absl::string_view request_id) const {
  std::string field;
  field.reserve(1 + CodedOutputStream::VarintSize64(request_id.size()) + request_id.size());
  field.push_back(static_cast<char>(kRequestIdTag));
  uint8_t varint[10];
  const uint8_t* end = CodedOutputStream::WriteVarint64ToArray(request_id.size(), varint);
  field.append(reinterpret_cast<const char*>(varint), end - varint);
  field.append(request_id.data(), request_id.size());
  grpc::Slice slices[2] = {grpc::Slice(field),
                           grpc::Slice(bytes_.data(), bytes_.size(), grpc::Slice::STATIC_SLICE)};
  return grpc::ByteBuffer(slices, 2);
}

bool ParseResponseReusingBuffers(grpc::ByteBuffer* buffer, v1::SoftmaxResponse* response) {
  // Clear() would free the output message and its string with it.
  std::string data;
  if (response->has_output()) data.swap(*response->mutable_output()->mutable_data());
  response->Clear();
  data.clear();
  if (data.capacity() > 0) response->mutable_output()->mutable_data()->swap(data);
  const size_t length = buffer->Length();
  bool parsed = false;
  {
    grpc::ProtoBufferReader reader(buffer);
    parsed = reader.status().ok() &&
             response->MergeFromBoundedZeroCopyStream(&reader, static_cast<int>(length));
  }
  buffer->Clear();
  return parsed;
}

}  // namespace softmax::client
