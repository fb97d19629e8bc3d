#include "client/load/wire.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/slice.h>
#include <grpcpp/support/status.h>

namespace softmax::client {
namespace {

using google::protobuf::io::CodedOutputStream;

// SoftmaxRequest.request_id and ModelInferRequest.id: their field numbers.
constexpr uint32_t kRequestIdField = 1;
constexpr uint32_t kKserveIdField = 3;

// Moves `scratch`'s first output into `response` as a softmax.v1 output,
// keeping the capacity of both data strings; false when there is none of a
// known datatype with raw contents.
bool MoveKserveOutput(inference::ModelInferResponse* scratch, v1::SoftmaxResponse* response) {
  if (scratch->outputs_size() < 1 || scratch->raw_output_contents_size() < 1) return false;
  const inference::ModelInferResponse::InferOutputTensor& out = scratch->outputs(0);
  const v1::DType dtype = DTypeOfKserveDatatype(out.datatype());
  if (dtype == v1::DTYPE_UNSPECIFIED) return false;
  std::string data;
  if (response->has_output()) data.swap(*response->mutable_output()->mutable_data());
  response->Clear();
  v1::Tensor* tensor = response->mutable_output();
  tensor->set_dtype(dtype);
  for (int64_t d : out.shape()) tensor->add_shape(d);
  tensor->mutable_data()->swap(*scratch->mutable_raw_output_contents(0));
  scratch->mutable_raw_output_contents(0)->swap(data);
  return true;
}

// Parses `buffer` (consumed) into `message`, merged into what it holds.
template <typename Message>
bool ParseInto(grpc::ByteBuffer* buffer, Message* message) {
  const size_t length = buffer->Length();
  bool parsed = false;
  {
    grpc::ProtoBufferReader reader(buffer);
    parsed = reader.status().ok() &&
             message->MergeFromBoundedZeroCopyStream(&reader, static_cast<int>(length));
  }
  buffer->Clear();
  return parsed;
}

}  // namespace

const char* KserveDatatype(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT16: return "FP16";
    case v1::DTYPE_BFLOAT16: return "BF16";
    default: return "FP32";
  }
}

v1::DType DTypeOfKserveDatatype(absl::string_view datatype) {
  if (datatype == "FP32") return v1::DTYPE_FLOAT32;
  if (datatype == "FP16") return v1::DTYPE_FLOAT16;
  if (datatype == "BF16") return v1::DTYPE_BFLOAT16;
  return v1::DTYPE_UNSPECIFIED;
}

PreparedRequest::PreparedRequest(const v1::SoftmaxRequest& request)
    : PreparedRequest(request.SerializeAsString(), kRequestIdField) {}

PreparedRequest::PreparedRequest(const inference::ModelInferRequest& request)
    : PreparedRequest(request.SerializeAsString(), kKserveIdField) {}

PreparedRequest::PreparedRequest(std::string bytes)
    : PreparedRequest(std::move(bytes), kRequestIdField) {}

PreparedRequest::PreparedRequest(std::string bytes, uint32_t id_field)
    : bytes_(std::move(bytes)), id_field_(id_field) {
  grpc::Slice slice(bytes_.data(), bytes_.size(), grpc::Slice::STATIC_SLICE);
  grpc::ByteBuffer message(&slice, 1);
  message_.Swap(&message);
}

std::vector<std::unique_ptr<const PreparedRequest>> PrepareChunks(const v1::SoftmaxRequest& request,
                                                                  int64_t chunk_bytes) {
  const std::string& data = request.input().data();
  const int64_t total = static_cast<int64_t>(data.size());
  std::vector<std::unique_ptr<const PreparedRequest>> chunks;
  v1::SoftmaxRequest first = request;
  first.mutable_input()->clear_data();
  int64_t offset = 0;
  do {
    const int64_t bytes = std::min(chunk_bytes, total - offset);
    v1::SoftmaxRequest later;
    v1::SoftmaxRequest& message = offset == 0 ? first : later;
    message.mutable_input()->set_data(data.data() + offset, static_cast<size_t>(bytes));
    message.set_chunk_offset(offset);
    message.set_more_chunks(offset + bytes < total);
    chunks.push_back(std::make_unique<const PreparedRequest>(message));
    offset += bytes;
  } while (offset < total);
  return chunks;
}

bool AppendResponseChunk(v1::SoftmaxResponse* chunk, int64_t expected_bytes,
                         v1::SoftmaxResponse* whole) {
  std::string* data = whole->mutable_output()->mutable_data();
  if (chunk->chunk_offset() == 0) {
    std::string kept = std::move(*data);
    std::string first = std::move(*chunk->mutable_output()->mutable_data());
    chunk->mutable_output()->clear_data();
    *whole = *chunk;  // everything but the data, which is small
    kept.clear();
    kept.reserve(static_cast<size_t>(std::max<int64_t>(expected_bytes, 0)));
    kept.append(first);
    data = whole->mutable_output()->mutable_data();
    data->swap(kept);
    // The chunk's message keeps its own capacity for the next parse.
    first.clear();
    chunk->mutable_output()->mutable_data()->swap(first);
    return true;
  }
  if (chunk->chunk_offset() != static_cast<int64_t>(data->size())) return false;
  data->append(chunk->output().data());
  whole->set_more_chunks(chunk->more_chunks());
  return true;
}

bool AppendLaterChunk(const ChunkView& chunk, v1::SoftmaxResponse* whole) {
  std::string* data = whole->mutable_output()->mutable_data();
  if (chunk.chunk_offset != static_cast<int64_t>(data->size())) return false;
  chunk.AppendTo(data);
  whole->set_more_chunks(chunk.more_chunks);
  return true;
}

grpc::ByteBuffer PreparedRequest::WithRequestId(absl::string_view request_id) const {
  std::string field;
  field.reserve(1 + CodedOutputStream::VarintSize64(request_id.size()) + request_id.size());
  field.push_back(static_cast<char>((id_field_ << 3) | 2));  // length-delimited
  uint8_t varint[10];
  const uint8_t* end = CodedOutputStream::WriteVarint64ToArray(request_id.size(), varint);
  field.append(reinterpret_cast<const char*>(varint), end - varint);
  field.append(request_id.data(), request_id.size());
  grpc::Slice slices[2] = {grpc::Slice(field),
                           grpc::Slice(bytes_.data(), bytes_.size(), grpc::Slice::STATIC_SLICE)};
  return grpc::ByteBuffer(slices, 2);
}

inference::ModelInferRequest KserveRequestOf(const v1::SoftmaxRequest& request) {
  inference::ModelInferRequest kserve;
  kserve.set_model_name(request.log() ? "log_softmax" : "softmax");
  auto* input = kserve.add_inputs();
  input->set_name("INPUT");
  input->set_datatype(KserveDatatype(request.input().dtype()));
  for (int64_t d : request.input().shape()) input->add_shape(d);
  kserve.add_raw_input_contents(request.input().data());
  if (request.has_axis() && request.axis() != -1) {
    (*kserve.mutable_parameters())["axis"].set_int64_param(request.axis());
  }
  if (request.has_temperature() && request.temperature() != 1.0f) {
    (*kserve.mutable_parameters())["temperature"].set_double_param(request.temperature());
  }
  return kserve;
}

bool ParseKserveResponse(grpc::ByteBuffer* buffer, inference::ModelInferResponse* scratch,
                         v1::SoftmaxResponse* response) {
  // A repeated field's Clear keeps its strings (and their capacity) for the
  // next parse to reuse.
  scratch->Clear();
  return ParseInto(buffer, scratch) && MoveKserveOutput(scratch, response);
}

bool ParseKserveStreamResponse(grpc::ByteBuffer* buffer,
                               inference::ModelStreamInferResponse* scratch,
                               v1::SoftmaxResponse* response) {
  // As above: the nested response's Clear keeps its strings.
  scratch->mutable_infer_response()->Clear();
  scratch->clear_error_message();
  if (!ParseInto(buffer, scratch)) return false;
  inference::ModelInferResponse* answer = scratch->mutable_infer_response();
  if (!scratch->error_message().empty()) {
    response->Clear();
    response->mutable_error()->set_code(static_cast<int>(grpc::StatusCode::UNKNOWN));
    response->mutable_error()->set_message(scratch->error_message());
  } else if (!MoveKserveOutput(answer, response)) {
    return false;
  }
  response->set_request_id(answer->id());
  return true;
}

bool ParseResponseReusingBuffers(grpc::ByteBuffer* buffer, v1::SoftmaxResponse* response) {
  // Clear() would free the output message and its string with it.
  std::string data;
  if (response->has_output()) data.swap(*response->mutable_output()->mutable_data());
  response->Clear();
  data.clear();
  if (data.capacity() > 0) response->mutable_output()->mutable_data()->swap(data);
  return ParseInto(buffer, response);
}

}  // namespace softmax::client
