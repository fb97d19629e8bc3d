#include "server/rpc/grpc/kserve_infer.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/support/slice.h>

#include "absl/strings/str_cat.h"
#include "server/rpc/grpc/wire.h"
#include "server/rpc/status_macros.h"

namespace softmax::server {
namespace {

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
    } else if (name == "top_k") {
      if (value.parameter_choice_case() != inference::InferParameter::kInt64Param) {
        return absl::InvalidArgumentError("parameters.top_k: expected an int64 parameter");
      }
      parts->top_k = value.int64_param();
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

using google::protobuf::io::CodedOutputStream;

// Wire tags (field number << 3 | 2): ModelInferResponse.raw_output_contents
// = 6, ModelStreamInferResponse.infer_response = 2.
constexpr uint8_t kRawOutputTag = (6 << 3) | 2;
constexpr uint8_t kInferResponseTag = (2 << 3) | 2;

}  // namespace

absl::Status PrepareInfer(inference::ModelInferRequest* request,
                          const SharedMemoryManager* shared_memory, InferCall* call,
                          InferenceRequest* out) {
  absl::StatusOr<kserve::Model> model =
      kserve::FindModel(request->model_name(), request->model_version());
  if (!model.ok()) return model.status();
  call->record.model = *model;

  kserve::InferRequestParts& parts = call->parts;
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
    if (region->has_value()) kserve::SetOutputRegion(output.name(), **std::move(region), &parts);
    if (auto it = output.parameters().find("classification"); it != output.parameters().end()) {
      // An int64 parameter, as Triton requires (tritonclient's class_count).
      if (it->second.parameter_choice_case() != inference::InferParameter::kInt64Param) {
        return absl::InvalidArgumentError(absl::StrCat(
            "outputs[", i, "].parameters.classification: expected an int64 parameter"));
      }
      parts.classification = it->second.int64_param();
    }
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
      parts.data_field = "inputs[0].parameters.shared_memory_byte_size";
    } else if (request->raw_input_contents_size() == 1) {
      if (input.has_contents() && kserve::HasContents(input.contents())) {
        return absl::InvalidArgumentError(
            "inputs[0].contents: given together with raw_input_contents; send one or the other");
      }
      parts.input_data.swap(*request->mutable_raw_input_contents(0));
    } else {
      parts.data_field = "inputs[0].contents.fp32_contents";
      absl::StatusOr<std::string> bytes =
          kserve::BytesFromContents(input.contents(), *dtype, "inputs[0].contents");
      if (!bytes.ok()) return bytes.status();
      parts.input_data = std::move(*bytes);
    }
    call->record.data_bytes = parts.input_region.has_value()
                                  ? parts.input_region->byte_size
                                  : static_cast<int64_t>(parts.input_data.size());
  }
  kserve::Model built = *call->record.model;
  SOFTMAX_RETURN_IF_ERROR(kserve::BuildInferenceRequest(&parts, &built, out));
  SOFTMAX_RETURN_IF_ERROR(kserve::BindRegions(
      parts, shared_memory, out, &call->top_k_regions, &call->leases));
  call->dtype = out->dtype;
  call->top_k = out->top_k > 0;
  call->outputs = *kserve::AnswerOutputs(parts);  // checked by BuildInferenceRequest
  out->output.buffer = &call->output;
  out->output.view = &call->view;
  out->output.top_k = &call->top_k_result;
  return absl::OkStatus();
}

OutputView FillInferResponse(InferCall* call, inference::ModelInferResponse* out) {
  const kserve::InferRequestParts& parts = call->parts;
  out->set_model_name(kserve::ModelName(*call->record.model));
  out->set_model_version(kserve::kModelVersion);
  out->set_id(parts.id);
  auto* output = out->add_outputs();
  output->set_name(kserve::kOutputName);
  const DType dtype = call->dtype;
  output->set_datatype(kserve::DatatypeName(dtype));
  output->mutable_shape()->Add(parts.input_shape.begin(), parts.input_shape.end());
  if (const auto& region = parts.output_region) {
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
  if (call->top_k) {
    // Classification (BYTES "<value>:<index>"), or TOP_K_VALUES and
    // TOP_K_INDICES (kserve.h): small, copied.
    out->clear_outputs();
    const TopKResult& top_k = call->top_k_result;
    kserve::WriteTopKRegions(top_k, call->top_k_regions);
    for (kserve::AnswerOutput kind : call->outputs) {
      auto* tensor = out->add_outputs();
      tensor->mutable_shape()->Add(top_k.dims.begin(), top_k.dims.end());
      std::string* raw = out->add_raw_output_contents();
      // Written into the caller's region: its parameters, no bytes.
      const std::optional<kserve::RegionRef>& region =
          kind == kserve::AnswerOutput::kTopKValues    ? parts.top_k_values_region
          : kind == kserve::AnswerOutput::kTopKIndices ? parts.top_k_indices_region
                                                       : std::nullopt;
      switch (kind) {
        case kserve::AnswerOutput::kOutput:  // not with a top K
        case kserve::AnswerOutput::kClassification:
          tensor->set_name(kserve::kOutputName);
          tensor->set_datatype("BYTES");
          *raw = kserve::SerializeBytesTensor(kserve::ClassificationStrings(top_k, dtype));
          break;
        case kserve::AnswerOutput::kTopKValues:
          tensor->set_name(kserve::kTopKValuesName);
          tensor->set_datatype(kserve::DatatypeName(dtype));
          if (!region) *raw = top_k.values;
          break;
        case kserve::AnswerOutput::kTopKIndices:
          tensor->set_name(kserve::kTopKIndicesName);
          tensor->set_datatype("INT64");
          if (!region) *raw = top_k.indices;
          break;
      }
      if (region) {
        auto& parameters = *tensor->mutable_parameters();
        parameters["shared_memory_region"].set_string_param(region->name);
        parameters["shared_memory_byte_size"].set_int64_param(region->byte_size);
        if (region->offset != 0) parameters["shared_memory_offset"].set_int64_param(region->offset);
      }
    }
    return OutputView{};
  }
  if (call->view.data != nullptr) return std::move(call->view);
  // A large output (echo, CPU backend) is sent by reference, not copied.
  if (call->buffers != nullptr && call->output.size() >= TensorBufferPool::kMinPooledBytes) {
    return TensorBufferPool::LendAsView(call->buffers, std::move(call->output));
  }
  out->add_raw_output_contents()->swap(call->output);
  return OutputView{};
}

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
    return UnparsableMessage("inference.ModelInferRequest", status.error_message());
  }
  return absl::OkStatus();
}

}  // namespace softmax::server
