#include "server/rpc/kserve.h"


#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/rpc/status_macros.h"
#include "server/rpc/validation.h"

namespace softmax::server::kserve {
namespace {

inference::DataType ConfigType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return inference::TYPE_FP32;
    case DType::kFloat16: return inference::TYPE_FP16;
    case DType::kBFloat16: return inference::TYPE_BF16;
  }
  return inference::TYPE_INVALID;
}

void SetDuration(uint64_t count, uint64_t ns, inference::StatisticDuration* out) {
  out->set_count(count);
  out->set_ns(ns);
}

}  // namespace

const char* ModelName(Model model) {
  switch (model) {
    case Model::kSoftmax: return "softmax";
    case Model::kLogSoftmax: return "log_softmax";
    case Model::kSoftmaxFp16: return "softmax_fp16";
    case Model::kLogSoftmaxFp16: return "log_softmax_fp16";
    case Model::kSoftmaxBf16: return "softmax_bf16";
    case Model::kLogSoftmaxBf16: return "log_softmax_bf16";
  }
  return "unknown";
}

bool IsLog(Model model) {
  return model == Model::kLogSoftmax || model == Model::kLogSoftmaxFp16 ||
         model == Model::kLogSoftmaxBf16;
}

DType AdvertisedType(Model model) {
  switch (model) {
    case Model::kSoftmaxFp16:
    case Model::kLogSoftmaxFp16: return DType::kFloat16;
    case Model::kSoftmaxBf16:
    case Model::kLogSoftmaxBf16: return DType::kBFloat16;
    default: return DType::kFloat32;
  }
}

absl::StatusOr<Model> FindModel(absl::string_view name, absl::string_view version) {
  for (Model model : kModels) {
    if (name != ModelName(model)) continue;
    if (!version.empty() && version != kModelVersion) {
      return absl::NotFoundError(absl::StrCat("model \"", name, "\" has no version \"", version,
                                              "\" (served: \"", kModelVersion, "\")"));
    }
    return model;
  }
  return absl::NotFoundError(absl::StrCat(
      "unknown model \"", name,
      "\" (served: \"softmax\", \"log_softmax\", and both with _fp16 or _bf16)"));
}

absl::StatusOr<DType> ParseDatatype(absl::string_view datatype, absl::string_view field) {
  if (datatype == "FP32") return DType::kFloat32;
  if (datatype == "FP16") return DType::kFloat16;
  if (datatype == "BF16") return DType::kBFloat16;
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": expected FP32, FP16 or BF16, got \"", datatype, "\""));
}

const char* DatatypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "FP32";
    case DType::kFloat16: return "FP16";
    case DType::kBFloat16: return "BF16";
  }
  return "INVALID";
}

absl::Status BuildInferenceRequest(InferRequestParts* parts, Model* model,
                                   InferenceRequest* out) {
  absl::StatusOr<Model> found = FindModel(parts->model_name, parts->model_version);
  if (!found.ok()) return found.status();
  *model = *found;
  if (parts->input_count != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inputs: the model takes exactly one input tensor, got ", parts->input_count));
  }
  if (absl::Status outputs = AnswerOutputs(*parts).status(); !outputs.ok()) return outputs;
  absl::StatusOr<DType> dtype = ParseDatatype(parts->input_datatype, "inputs[0].datatype");
  if (!dtype.ok()) return dtype.status();

  const int rank = static_cast<int>(parts->input_shape.size());
  if (parts->axis.has_value()) out->axis = *parts->axis;
  out->temperature = parts->temperature;
  if (parts->classification.has_value()) {
    const int64_t k = *parts->classification;
    if (k <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "outputs[0].parameters.classification: expected a class count > 0, got ", k));
    }
    if (parts->output_region.has_value()) {
      return absl::InvalidArgumentError(
          "outputs[0].parameters: an output can't set both 'shared_memory_region' and "
          "'classification'");
    }
    // As Triton: at most as many classes as the row has (a bad axis is
    // named by validation).
    int64_t top_k = k;
    if (absl::StatusOr<int> axis = NormalizeAxis(parts->axis.value_or(-1), rank); axis.ok()) {
      top_k = std::min(k, rank == 0 ? int64_t{1} : parts->input_shape[*axis]);
    }
    if (top_k <= 0) {
      return absl::InvalidArgumentError(
          "outputs[0].parameters.classification: the axis has no elements to classify");
    }
    out->top_k = top_k;
  }
  if (parts->top_k.has_value()) {
    if (*parts->top_k < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameters.top_k: must be >= 0, got ", *parts->top_k));
    }
    out->top_k = *parts->top_k;  // over the axis: validation names parameters.top_k
  }
  out->log = IsLog(*model);
  out->id = parts->id;
  out->dtype = *dtype;
  out->dims = parts->input_shape;
  out->input.data = parts->input_data.data();
  out->input.bytes = static_cast<int64_t>(parts->input_data.size());
  out->input.buffer = &parts->input_data;
  return absl::OkStatus();
}

FieldNames FieldNamesFor(const InferRequestParts& parts) {
  FieldNames names;
  names.id = "id";
  names.input = "inputs[0]";
  names.shape = "inputs[0].shape";
  names.data = parts.data_field;
  names.axis = "parameters.axis";
  names.temperature = "parameters.temperature";
  names.top_k = "parameters.top_k";
  names.output_region = "outputs[0].parameters.shared_memory_byte_size";
  return names;
}

absl::StatusOr<std::vector<AnswerOutput>> AnswerOutputs(const InferRequestParts& parts) {
  const bool top_k = parts.top_k.value_or(0) > 0;
  if (top_k && parts.classification.has_value()) {
    return absl::InvalidArgumentError(
        "parameters.top_k: not with an output's classification parameter; ask for one");
  }
  std::vector<AnswerOutput> outputs;
  for (size_t i = 0; i < parts.requested_outputs.size(); ++i) {
    const std::string& name = parts.requested_outputs[i];
    if (name == kOutputName && !top_k) {
      outputs.push_back(parts.classification.has_value() ? AnswerOutput::kClassification
                                                          : AnswerOutput::kOutput);
    } else if ((name == kTopKValuesName || name == kTopKIndicesName) && top_k) {
      outputs.push_back(name == kTopKValuesName ? AnswerOutput::kTopKValues
                                                : AnswerOutput::kTopKIndices);
    } else if (name == kOutputName || name == kTopKValuesName || name == kTopKIndicesName) {
      return absl::InvalidArgumentError(absl::StrCat(
          "outputs[", i, "].name: \"", name, "\" ",
          top_k ? "is not answered with parameters.top_k (ask for TOP_K_VALUES and "
                  "TOP_K_INDICES)"
                : "needs the request parameter top_k > 0"));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "outputs[", i, "].name: unknown output \"", name, "\" (the model has one output, \"",
          kOutputName, "\", and with parameters.top_k \"", kTopKValuesName, "\" and \"",
          kTopKIndicesName, "\")"));
    }
  }
  if (outputs.empty()) {
    if (top_k) return std::vector<AnswerOutput>{AnswerOutput::kTopKValues,
                                                AnswerOutput::kTopKIndices};
    outputs.push_back(parts.classification.has_value() ? AnswerOutput::kClassification
                                                        : AnswerOutput::kOutput);
  }
  return outputs;
}

std::string ClassificationString(float value, int64_t index) {
  return absl::StrCat(std::to_string(value), ":", index);
}

std::vector<std::string> ClassificationStrings(const TopKResult& top_k, DType dtype) {
  const std::string& values = top_k.values;
  const int64_t count = static_cast<int64_t>(values.size()) / ItemSize(dtype);
  std::vector<std::string> elements;
  elements.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    int64_t index = 0;
    std::memcpy(&index, top_k.indices.data() + i * sizeof(int64_t), sizeof(int64_t));
    elements.push_back(ClassificationString(LoadAsFloat(values.data(), dtype, i), index));
  }
  return elements;
}

std::string SerializeBytesTensor(const std::vector<std::string>& elements) {
  std::string out;
  size_t bytes = 0;
  for (const std::string& element : elements) bytes += 4 + element.size();
  out.reserve(bytes);
  for (const std::string& element : elements) {
    const uint32_t length = static_cast<uint32_t>(element.size());
    const char prefix[4] = {static_cast<char>(length), static_cast<char>(length >> 8),
                            static_cast<char>(length >> 16), static_cast<char>(length >> 24)};
    out.append(prefix, 4);
    out.append(element);
  }
  return out;
}

absl::StatusOr<std::optional<RegionRef>> MakeRegionRef(std::optional<std::string> region,
                                                       std::optional<int64_t> byte_size,
                                                       std::optional<int64_t> offset,
                                                       absl::string_view field) {
  if (!region.has_value()) {
    if (byte_size.has_value() || offset.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": shared_memory_byte_size or shared_memory_offset without shared_memory_region"));
    }
    return std::optional<RegionRef>();
  }
  if (!byte_size.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".shared_memory_byte_size: required with shared_memory_region"));
  }
  return std::optional<RegionRef>(RegionRef{*std::move(region), *byte_size, offset.value_or(0), std::string(field)});
}

void SetOutputRegion(absl::string_view output_name, RegionRef region, InferRequestParts* parts) {
  if (output_name == kTopKValuesName) {
    parts->top_k_values_region = std::move(region);
  } else if (output_name == kTopKIndicesName) {
    parts->top_k_indices_region = std::move(region);
  } else {
    parts->output_region = std::move(region);
  }
}

namespace {

// The elements of a top K of `request` (validated or not): rows * K; none
// when the axis is bad (validation names it).
std::optional<int64_t> TopKElements(const InferenceRequest& request) {
  const int rank = static_cast<int>(request.dims.size());
  absl::StatusOr<int> axis = NormalizeAxis(request.axis, rank);
  if (!axis.ok()) return std::nullopt;
  int64_t rows = 1;
  for (int i = 0; i < rank; ++i) {
    if (i == *axis) continue;
    if (request.dims[i] < 0) return std::nullopt;  // validation names it
    if (request.dims[i] != 0 && rows > std::numeric_limits<int64_t>::max() / request.dims[i]) {
      return std::nullopt;
    }
    rows *= request.dims[i];
  }
  if (rows > std::numeric_limits<int64_t>::max() / 8 / std::max<int64_t>(request.top_k, 1)) {
    return std::nullopt;  // beyond any limit; validation refuses the shape
  }
  return rows * request.top_k;
}

// Resolves a TOP_K_* output's region of at least `needed` bytes (of
// `tensor`) into `*data`.
absl::Status BindTopKRegion(const RegionRef& ref, const SharedMemoryManager& shared_memory,
                            std::optional<int64_t> needed, absl::string_view tensor, char** data,
                            std::vector<std::shared_ptr<const void>>* leases) {
  if (needed.has_value() && ref.byte_size < *needed) {
    return absl::InvalidArgumentError(absl::StrCat(ref.field, ".shared_memory_byte_size: ",
                                                   ref.byte_size, " bytes, smaller than ", tensor,
                                                   "'s ", *needed, " bytes"));
  }
  absl::StatusOr<SharedMemoryTensor> region =
      shared_memory.Resolve(ref.name, ref.offset, ref.byte_size, ref.field);
  if (!region.ok()) return region.status();
  if (region->memory == MemoryKind::kDevice) {
    return absl::InvalidArgumentError(absl::StrCat(
        ref.field, ".shared_memory_region: ", tensor,
        " is written into system shared memory only, not a CUDA region"));
  }
  *data = region->data;
  leases->push_back(std::move(region->lease));
  return absl::OkStatus();
}

}  // namespace

void WriteTopKRegions(const TopKResult& top_k, const TopKRegions& regions) {
  if (regions.values != nullptr) {
    std::memcpy(regions.values, top_k.values.data(), top_k.values.size());
  }
  if (regions.indices != nullptr) {
    std::memcpy(regions.indices, top_k.indices.data(), top_k.indices.size());
  }
}

absl::Status BindRegions(const InferRequestParts& parts, const SharedMemoryManager* shared_memory,
                         InferenceRequest* request, TopKRegions* top_k_regions,
                         std::vector<std::shared_ptr<const void>>* leases) {
  if (!parts.input_region.has_value() && !parts.output_region.has_value() &&
      !parts.top_k_values_region.has_value() && !parts.top_k_indices_region.has_value()) {
    return absl::OkStatus();
  }
  const bool served = shared_memory != nullptr && shared_memory->mode() != SharedMemoryMode::kOff;
  if (!served) {
    return absl::InvalidArgumentError(
        "shared_memory_region: this server serves no shared memory (--shared_memory=off)");
  }
  if (const auto& in = parts.input_region) {
    absl::StatusOr<SharedMemoryTensor> tensor =
        shared_memory->Resolve(in->name, in->offset, in->byte_size, "inputs[0].parameters");
    if (!tensor.ok()) return tensor.status();
    InputTensor& input = request->input;
    input.data = tensor->data;
    input.bytes = tensor->bytes;
    input.memory = tensor->memory;
    input.device = tensor->device;
    input.external = true;
    input.buffer = nullptr;
    leases->push_back(std::move(tensor->lease));
  }
  if (const auto& out = parts.output_region) {
    absl::StatusOr<SharedMemoryTensor> tensor =
        shared_memory->Resolve(out->name, out->offset, out->byte_size, "outputs[0].parameters");
    if (!tensor.ok()) return tensor.status();
    // (Validation checks that it holds the output.)
    OutputSink& output = request->output;
    output.region = tensor->data;
    output.region_bytes = tensor->bytes;
    output.region_memory = tensor->memory;
    output.region_device = tensor->device;
    leases->push_back(std::move(tensor->lease));
  }
  // (AnswerOutputs has refused TOP_K_* outputs without top_k.)
  const std::optional<int64_t> top_k_elements = TopKElements(*request);
  if (const auto& values = parts.top_k_values_region) {
    std::optional<int64_t> bytes;
    if (top_k_elements) bytes = *top_k_elements * ItemSize(request->dtype);
    SOFTMAX_RETURN_IF_ERROR(BindTopKRegion(*values, *shared_memory, bytes, kTopKValuesName,
                                           &top_k_regions->values, leases));
  }
  if (const auto& indices = parts.top_k_indices_region) {
    std::optional<int64_t> bytes;
    if (top_k_elements) bytes = *top_k_elements * int64_t{sizeof(int64_t)};
    SOFTMAX_RETURN_IF_ERROR(BindTopKRegion(*indices, *shared_memory, bytes, kTopKIndicesName,
                                           &top_k_regions->indices, leases));
  }
  return absl::OkStatus();
}

std::vector<std::string> Extensions(const SharedMemoryManager* shared_memory) {
  std::vector<std::string> out(kExtensions.begin(), kExtensions.end());
  if (shared_memory != nullptr && shared_memory->Enabled(SharedMemoryKind::kSystem)) {
    out.push_back("system_shared_memory");
  }
  if (shared_memory != nullptr && shared_memory->Enabled(SharedMemoryKind::kCuda)) {
    out.push_back("cuda_shared_memory");
  }
  return out;
}

absl::StatusOr<std::vector<SharedMemoryRegionStatus>> RunSharedMemoryCall(
    const SharedMemoryCall& call, SharedMemoryManager* shared_memory) {
  if (shared_memory == nullptr) {
    return absl::UnimplementedError(
        "shared memory is turned off on this server (--shared_memory=off)");
  }
  absl::Status status;
  switch (call.action) {
    case SharedMemoryCall::Action::kStatus:
      return shared_memory->Status(call.kind, call.name);
    case SharedMemoryCall::Action::kRegister:
      status = call.kind == SharedMemoryKind::kSystem
                   ? shared_memory->RegisterSystem(call.name, call.key, call.offset,
                                                   call.byte_size)
                   : shared_memory->RegisterCuda(call.name, call.raw_handle, call.device,
                                                 call.byte_size);
      break;
    case SharedMemoryCall::Action::kUnregister:
      status = shared_memory->Unregister(call.kind, call.name);
      break;
  }
  if (!status.ok()) return status;
  return std::vector<SharedMemoryRegionStatus>();
}

bool HasContents(const inference::InferTensorContents& c) {
  return c.bool_contents_size() > 0 || c.int_contents_size() > 0 ||
         c.int64_contents_size() > 0 || c.uint_contents_size() > 0 ||
         c.uint64_contents_size() > 0 || c.fp32_contents_size() > 0 ||
         c.fp64_contents_size() > 0 || c.bytes_contents_size() > 0;
}

absl::StatusOr<std::string> BytesFromContents(const inference::InferTensorContents& contents,
                                              DType dtype, absl::string_view field) {
  if (dtype != DType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", DatatypeName(dtype),
        " data has no typed contents field; send it in raw_input_contents"));
  }
  inference::InferTensorContents others = contents;
  others.clear_fp32_contents();
  if (HasContents(others)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": FP32 data goes in fp32_contents; another field is set"));
  }
  static_assert(sizeof(float) == 4, "fp32_contents are IEEE binary32");
  std::string bytes(static_cast<size_t>(contents.fp32_contents_size()) * 4, '\0');
  if (!bytes.empty()) std::memcpy(bytes.data(), contents.fp32_contents().data(), bytes.size());
  return bytes;
}

inference::ModelMetadataResponse Metadata(Model model) {
  inference::ModelMetadataResponse metadata;
  metadata.set_name(ModelName(model));
  metadata.add_versions(kModelVersion);
  metadata.set_platform(kPlatform);
  // One type is advertised; all three are accepted (see Model).
  for (auto* tensor : {metadata.add_inputs(), metadata.add_outputs()}) {
    tensor->set_datatype(DatatypeName(AdvertisedType(model)));
    tensor->add_shape(-1);
    tensor->add_shape(-1);
  }
  metadata.mutable_inputs(0)->set_name(kInputName);
  metadata.mutable_outputs(0)->set_name(kOutputName);
  return metadata;
}

inference::ModelConfig Config(Model model) {
  inference::ModelConfig config;
  config.set_name(ModelName(model));
  config.set_platform(kPlatform);
  config.set_backend(kPlatform);
  config.mutable_version_policy()->mutable_latest()->set_num_versions(1);
  config.set_max_batch_size(0);
  inference::ModelInput* input = config.add_input();
  input->set_name(kInputName);
  input->set_data_type(ConfigType(AdvertisedType(model)));
  input->add_dims(-1);
  input->add_dims(-1);
  inference::ModelOutput* output = config.add_output();
  output->set_name(kOutputName);
  output->set_data_type(ConfigType(AdvertisedType(model)));
  output->add_dims(-1);
  output->add_dims(-1);
  config.mutable_dynamic_batching();
  return config;
}

void ModelStatistics::RecordSuccess(Model model, int64_t total_ns,
                                    const RequestTiming& timing) {
  Counters& c = models_[static_cast<int>(model)];
  c.success_count.fetch_add(1, std::memory_order_relaxed);
  c.success_ns.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, total_ns)),
                         std::memory_order_relaxed);
  c.queue_ns.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, timing.queue_ns)),
                       std::memory_order_relaxed);
  c.compute_ns.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, timing.compute_ns)),
                         std::memory_order_relaxed);
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  c.last_inference_ms.store(static_cast<uint64_t>(now.count()), std::memory_order_relaxed);
}

void ModelStatistics::RecordFailure(Model model, int64_t total_ns) {
  Counters& c = models_[static_cast<int>(model)];
  c.fail_count.fetch_add(1, std::memory_order_relaxed);
  c.fail_ns.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, total_ns)),
                      std::memory_order_relaxed);
}

inference::ModelStatistics ModelStatistics::Get(Model model) const {
  const Counters& c = models_[static_cast<int>(model)];
  inference::ModelStatistics stats;
  stats.set_name(ModelName(model));
  stats.set_version(kModelVersion);
  const uint64_t success = c.success_count.load(std::memory_order_relaxed);
  stats.set_last_inference(c.last_inference_ms.load(std::memory_order_relaxed));
  stats.set_inference_count(success);
  // Each request is one execution of the model as a client sees it; the
  // batches it rode in are the Prometheus batch metrics' (they mix models).
  stats.set_execution_count(success);
  inference::InferStatistics* infer = stats.mutable_inference_stats();
  SetDuration(success, c.success_ns.load(std::memory_order_relaxed), infer->mutable_success());
  SetDuration(c.fail_count.load(std::memory_order_relaxed),
              c.fail_ns.load(std::memory_order_relaxed), infer->mutable_fail());
  SetDuration(success, c.queue_ns.load(std::memory_order_relaxed), infer->mutable_queue());
  SetDuration(success, 0, infer->mutable_compute_input());
  SetDuration(success, c.compute_ns.load(std::memory_order_relaxed),
              infer->mutable_compute_infer());
  SetDuration(success, 0, infer->mutable_compute_output());
  return stats;
}

int HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kAlreadyExists: return 409;
    case absl::StatusCode::kUnimplemented: return 501;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted: return 503;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    case absl::StatusCode::kCancelled: return 499;
    default: return 500;
  }
}

}  // namespace softmax::server::kserve
