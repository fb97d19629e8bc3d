#include "server/rpc/http/kserve_http.h"

#include <civetweb.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <cstring>
#include <algorithm>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/civetweb_stop.h"
#include "server/logging/log.h"
#include "server/rpc/dispatch.h"
#include "server/rpc/request_record.h"
#include "server/rpc/status_macros.h"

namespace softmax::server {
namespace {

using Json = nlohmann::json;

// Bytes a body may carry beyond its tensor's (JSON header, framing), and
// the most bytes of JSON text per tensor byte accepted ("-1.2345678e-05, "
// is 16 characters for a 4-byte float; 2-byte types take as many).
constexpr int64_t kBodyHeadroomBytes = 64 * 1024;
constexpr int64_t kJsonBytesPerTensorByte = 8;

// One HTTP reply.
struct Reply {
  int status = 200;
  std::string body;        // JSON (or the JSON header, with binary data)
  std::string binary;      // binary tensor data after the header, if any
  const char* binary_data = nullptr;  // or a view of it
  size_t binary_size = 0;
  bool binary_reply = false;
};

// A reply of a status and no body (health and readiness).
Reply EmptyReply(int status) {
  Reply reply;
  reply.status = status;
  return reply;
}

Reply JsonReply(int status, const Json& json) {
  Reply reply;
  reply.status = status;
  reply.body = json.dump();
  return reply;
}

Reply ErrorReply(const absl::Status& status) {
  return JsonReply(kserve::HttpStatus(status.code()), Json{{"error", status.message()}});
}

void Send(mg_connection* connection, const Reply& reply) {
  const size_t binary = reply.binary_data != nullptr ? reply.binary_size : reply.binary.size();
  // The status line and headers in one write, with the JSON body when it is
  // small: civetweb's header functions send a line per write (six packets
  // with TCP_NODELAY), and refuse to start a response once a "100 Continue"
  // went out (ReadBody). The handler's return value gives civetweb the status.
  std::string head = absl::StrCat(
      "HTTP/1.1 ", reply.status, " ", mg_get_response_code_text(connection, reply.status),
      "\r\nContent-Type: ",
      reply.binary_reply ? "application/octet-stream" : "application/json",
      "\r\nContent-Length: ", reply.body.size() + binary, "\r\n");
  if (reply.binary_reply) {
    absl::StrAppend(&head, "Inference-Header-Content-Length: ", reply.body.size(), "\r\n");
  }
  if (reply.status == 401) absl::StrAppend(&head, "WWW-Authenticate: Bearer\r\n");
  absl::StrAppend(&head, "\r\n");
  constexpr size_t kCoalesceBodyBytes = 64 * 1024;
  if (reply.body.size() <= kCoalesceBodyBytes) {
    head += reply.body;
    mg_write(connection, head.data(), head.size());
  } else {
    mg_write(connection, head.data(), head.size());
    mg_write(connection, reply.body.data(), reply.body.size());
  }
  if (binary > 0) {
    const char* data = reply.binary_data != nullptr ? reply.binary_data : reply.binary.data();
    mg_write(connection, data, binary);
  }
}

// A JSON array of `element(item)` for each item of `list`.
template <typename List, typename Element>
Json ArrayOf(const List& list, Element element) {
  Json out = Json::array();
  for (const auto& item : list) out.push_back(element(item));
  return out;
}

template <typename Numbers>
std::vector<int64_t> Dims(const Numbers& numbers) {
  return std::vector<int64_t>(numbers.begin(), numbers.end());
}

Json MetadataJson(kserve::Model model) {
  const inference::ModelMetadataResponse metadata = kserve::Metadata(model);
  auto tensor = [](const auto& t) {
    return Json{{"name", t.name()}, {"datatype", t.datatype()}, {"shape", Dims(t.shape())}};
  };
  return {{"name", metadata.name()},
          {"versions", std::vector<std::string>(metadata.versions().begin(),
                                                metadata.versions().end())},
          {"platform", metadata.platform()},
          {"inputs", ArrayOf(metadata.inputs(), tensor)},
          {"outputs", ArrayOf(metadata.outputs(), tensor)}};
}

Json ConfigJson(kserve::Model model) {
  const inference::ModelConfig config = kserve::Config(model);
  auto tensor = [](const auto& t) {
    return Json{{"name", t.name()},
                {"data_type", inference::DataType_Name(t.data_type())},
                {"dims", Dims(t.dims())}};
  };
  return {{"name", config.name()},
          {"platform", config.platform()},
          {"backend", config.backend()},
          {"version_policy", {{"latest", {{"num_versions", 1}}}}},
          {"max_batch_size", config.max_batch_size()},
          {"input", ArrayOf(config.input(), tensor)},
          {"output", ArrayOf(config.output(), tensor)},
          {"dynamic_batching", Json::object()}};
}

Json StatisticsJson(const inference::ModelStatistics& stats) {
  auto duration = [](const inference::StatisticDuration& d) {
    return Json{{"count", d.count()}, {"ns", d.ns()}};
  };
  const inference::InferStatistics& infer = stats.inference_stats();
  return {{"name", stats.name()},
          {"version", stats.version()},
          {"last_inference", stats.last_inference()},
          {"inference_count", stats.inference_count()},
          {"execution_count", stats.execution_count()},
          {"inference_stats",
           {{"success", duration(infer.success())},
            {"fail", duration(infer.fail())},
            {"queue", duration(infer.queue())},
            {"compute_input", duration(infer.compute_input())},
            {"compute_infer", duration(infer.compute_infer())},
            {"compute_output", duration(infer.compute_output())}}},
          {"batch_stats", Json::array()}};
}

// Nesting accepted in a tensor's JSON data: far more than any tensor's rank,
// and a bound on the recursion below.
constexpr int kMaxJsonDataDepth = 64;

// Appends the numbers of a (nested) JSON array, as `dtype`, to `out`.
absl::Status AppendJsonData(const Json& data, DType dtype, std::string* out, int depth = 0) {
  if (data.is_array()) {
    if (depth >= kMaxJsonDataDepth) {
      return absl::InvalidArgumentError(
          absl::StrCat("inputs[0].data: arrays nested deeper than ", kMaxJsonDataDepth));
    }
    for (const Json& item : data) {
      SOFTMAX_RETURN_IF_ERROR(AppendJsonData(item, dtype, out, depth + 1));
    }
    return absl::OkStatus();
  }
  if (!data.is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat("inputs[0].data: expected numbers, got a ", data.type_name()));
  }
  const float value = data.get<float>();
  if (dtype == DType::kFloat32) {
    char bytes[4];
    std::memcpy(bytes, &value, 4);
    out->append(bytes, 4);
  } else {
    const uint16_t bits = dtype == DType::kFloat16 ? FloatToHalf(value) : FloatToBFloat16(value);
    char bytes[2];
    std::memcpy(bytes, &bits, 2);
    out->append(bytes, 2);
  }
  return absl::OkStatus();
}

// The JSON data of an output: its elements as numbers, row-major, flat.
Json OutputJsonData(const char* data, int64_t bytes, DType dtype) {
  Json out = Json::array();
  const int64_t count = bytes / ItemSize(dtype);
  out.get_ref<Json::array_t&>().reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out.push_back(LoadAsFloat(data, dtype, i));
  return out;
}

// One inference request on its way through the batcher; shared by the
// handler and the batcher's completion, so it lives as long as either needs
// it (the handler may give up waiting).
struct HttpCall {
  kserve::InferRequestParts parts;  // the request as read; owns its input
  std::string output;
  OutputView view;
  TopKResult top_k;
  RequestTiming timing;
  absl::Status status;
  absl::Notification done;
  std::atomic<bool> abandoned{false};
  std::vector<std::shared_ptr<const void>> leases;  // shared-memory regions in use
  kserve::TopKRegions top_k_regions;  // where the top K goes in shared memory
  Admission::Admitted admitted;  // its ticket and budget, until the reply is sent
};

// Reads the request body into `body` (sized to its Content-Length); the
// bytes read, fewer when the peer stopped sending.
size_t ReadBody(mg_connection* connection, std::string* body) {
  // A client that asked to be told before it sends the body (libcurl does
  // for large POSTs, so perf_analyzer -i http does) would otherwise wait
  // out its timeout, a second per request, before sending it.
  if (const char* expect = mg_get_header(connection, "Expect");
      expect != nullptr && absl::EqualsIgnoreCase(expect, "100-continue") && !body->empty()) {
    mg_printf(connection, "HTTP/1.1 100 Continue\r\n\r\n");
  }
  size_t read = 0;
  while (read < body->size()) {
    const int n = mg_read(connection, body->data() + read, body->size() - read);
    if (n <= 0) break;
    read += static_cast<size_t>(n);
  }
  return read;
}

// The shared-memory parameters of a tensor's JSON `parameters` (see
// kserve::MakeRegionRef); `field` names them in messages.
absl::StatusOr<std::optional<kserve::RegionRef>> RegionOf(const Json& tensor,
                                                          absl::string_view field) {
  std::optional<std::string> region;
  std::optional<int64_t> byte_size, offset;
  if (auto p = tensor.find("parameters"); p != tensor.end() && p->is_object()) {
    if (auto name = p->find("shared_memory_region"); name != p->end()) {
      if (!name->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".shared_memory_region: expected a string"));
      }
      region = name->get<std::string>();
    }
    for (const char* key : {"shared_memory_byte_size", "shared_memory_offset"}) {
      auto value = p->find(key);
      if (value == p->end()) continue;
      if (!value->is_number_integer()) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".", key, ": expected an integer"));
      }
      const int64_t number = value->is_number_unsigned()
                                 ? static_cast<int64_t>(std::min<uint64_t>(
                                       value->get<uint64_t>(),
                                       std::numeric_limits<int64_t>::max()))
                                 : value->get<int64_t>();
      (std::strcmp(key, "shared_memory_offset") == 0 ? offset : byte_size) = number;
    }
  }
  return kserve::MakeRegionRef(std::move(region), byte_size, offset, field);
}

// Reads the request parameter `name` as a T (bool, int64_t or double) into
// `out`; INVALID_ARGUMENT naming it when `value` is of another JSON type.
template <typename T, typename Out>
absl::Status ReadParameter(const Json& value, absl::string_view name, Out* out) {
  const char* expected = "a number";
  bool matches = value.is_number();
  if constexpr (std::is_same_v<T, bool>) {
    expected = "a boolean";
    matches = value.is_boolean();
  } else if constexpr (std::is_integral_v<T>) {
    expected = "an integer";
    matches = value.is_number_integer();
  }
  if (!matches) {
    return absl::InvalidArgumentError(absl::StrCat("parameters.", name, ": expected ", expected));
  }
  *out = value.get<T>();
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseHttpInferRequest(const std::string& body, int64_t header_length,
                                   kserve::InferRequestParts* parts, HttpInferOptions* options) {
  if (header_length < 0 || header_length > static_cast<int64_t>(body.size())) {
    return absl::InvalidArgumentError("Inference-Header-Content-Length: beyond the body");
  }
  parts->data_field = "inputs[0].data";
  const Json header = Json::parse(body.begin(), body.begin() + header_length, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError("request body: not a JSON object");
  }
  if (auto id = header.find("id"); id != header.end()) {
    if (!id->is_string()) return absl::InvalidArgumentError("id: expected a string");
    parts->id = id->get<std::string>();
  }
  if (auto parameters = header.find("parameters"); parameters != header.end()) {
    if (!parameters->is_object()) {
      return absl::InvalidArgumentError("parameters: expected an object");
    }
    for (const auto& [name, value] : parameters->items()) {
      if (name == "axis") {
        SOFTMAX_RETURN_IF_ERROR(ReadParameter<int64_t>(value, name, &parts->axis));
      } else if (name == "temperature") {
        SOFTMAX_RETURN_IF_ERROR(ReadParameter<double>(value, name, &parts->temperature));
      } else if (name == "top_k") {
        SOFTMAX_RETURN_IF_ERROR(ReadParameter<int64_t>(value, name, &parts->top_k));
      } else if (name == "binary_data_output") {
        SOFTMAX_RETURN_IF_ERROR(ReadParameter<bool>(value, name, &options->binary_output));
      }
    }
  }
  auto inputs = header.find("inputs");
  if (inputs == header.end() || !inputs->is_array()) {
    return absl::InvalidArgumentError("inputs: expected an array of input tensors");
  }
  parts->input_count = static_cast<int>(inputs->size());
  if (auto outputs = header.find("outputs"); outputs != header.end()) {
    if (!outputs->is_array()) return absl::InvalidArgumentError("outputs: expected an array");
    for (size_t i = 0; i < outputs->size(); ++i) {
      const Json& output = (*outputs)[i];
      auto name = output.find("name");
      if (!output.is_object() || name == output.end() || !name->is_string()) {
        return absl::InvalidArgumentError(absl::StrCat("outputs[", i, "].name: missing"));
      }
      parts->requested_outputs.push_back(name->get<std::string>());
      absl::StatusOr<std::optional<kserve::RegionRef>> region =
          RegionOf(output, absl::StrCat("outputs[", i, "].parameters"));
      if (!region.ok()) return region.status();
      if (region->has_value()) {
        kserve::SetOutputRegion(name->get<std::string>(), **std::move(region), parts);
      }
      if (auto p = output.find("parameters"); p != output.end() && p->is_object()) {
        if (auto binary = p->find("binary_data"); binary != p->end() && binary->is_boolean()) {
          options->binary_output = options->binary_output || binary->get<bool>();
        }
        if (auto count = p->find("classification"); count != p->end()) {
          if (!count->is_number_integer()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "outputs[", i, "].parameters.classification: expected an integer"));
          }
          parts->classification = count->get<int64_t>();
        }
      }
    }
  }
  const int64_t binary_bytes = static_cast<int64_t>(body.size()) - header_length;
  if (parts->input_count != 1) {
    return absl::OkStatus();  // BuildSoftmaxRequest names the error
  }
  const Json& input = (*inputs)[0];
  if (!input.is_object()) return absl::InvalidArgumentError("inputs[0]: expected an object");
  auto datatype = input.find("datatype");
  if (datatype == input.end() || !datatype->is_string()) {
    return absl::InvalidArgumentError("inputs[0].datatype: missing");
  }
  parts->input_datatype = datatype->get<std::string>();
  absl::StatusOr<DType> dtype = kserve::ParseDatatype(parts->input_datatype,
                                                      "inputs[0].datatype");
  if (!dtype.ok()) return dtype.status();
  auto shape = input.find("shape");
  if (shape == input.end() || !shape->is_array()) {
    return absl::InvalidArgumentError("inputs[0].shape: expected an array of integers");
  }
  for (const Json& dim : *shape) {
    if (!dim.is_number_integer()) {
      return absl::InvalidArgumentError("inputs[0].shape: expected an array of integers");
    }
    parts->input_shape.push_back(dim.get<int64_t>());
  }
  std::optional<int64_t> binary_size;
  if (auto p = input.find("parameters"); p != input.end() && p->is_object()) {
    if (auto size = p->find("binary_data_size"); size != p->end()) {
      if (!size->is_number_integer() || size->get<int64_t>() < 0) {
        return absl::InvalidArgumentError(
            "inputs[0].parameters.binary_data_size: expected a non-negative integer");
      }
      binary_size = size->get<int64_t>();
    }
  }
  auto data = input.find("data");
  absl::StatusOr<std::optional<kserve::RegionRef>> region =
      RegionOf(input, "inputs[0].parameters");
  if (!region.ok()) return region.status();
  if (region->has_value()) {
    if (data != input.end() || binary_size.has_value() || binary_bytes != 0) {
      return absl::InvalidArgumentError(
          "inputs[0]: data given both in shared memory and in the request; send one");
    }
    parts->input_region = **region;
    parts->data_field = "inputs[0].parameters.shared_memory_byte_size";
    return absl::OkStatus();
  }
  if (binary_size.has_value()) {
    if (data != input.end()) {
      return absl::InvalidArgumentError(
          "inputs[0]: both data and binary_data_size given; send one or the other");
    }
    if (*binary_size != binary_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inputs[0].parameters.binary_data_size: ", *binary_size, " bytes, but the body holds ",
          binary_bytes, " bytes after the JSON header (Inference-Header-Content-Length)"));
    }
    parts->data_field = "inputs[0] binary data";
    parts->input_data.assign(body, static_cast<size_t>(header_length), std::string::npos);
    return absl::OkStatus();
  }
  if (binary_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request body: ", binary_bytes,
        " bytes of binary data after the JSON header, but no input has binary_data_size"));
  }
  if (data == input.end()) {
    return absl::InvalidArgumentError(
        "inputs[0].data: missing (give data, or binary_data_size with binary data)");
  }
  return AppendJsonData(*data, *dtype, &parts->input_data);
}

namespace {

// The caller's address, for the access log.
std::string Peer(mg_connection* connection) {
  const mg_request_info* info = mg_get_request_info(connection);
  return absl::StrCat(info->remote_addr, ":", info->remote_port);
}

// POST .../infer: reads the body, answers it; returns the HTTP status sent.
int Infer(mg_connection* connection, const std::string& name, const std::string& version,
          const FrontEnd& front_end, kserve::ModelStatistics* statistics,
          const SharedMemoryManager* shared_memory) {
  const int64_t max_tensor_bytes = front_end.limits.max_tensor_bytes;
  RequestRecord record(RpcMethod::kHttpInfer);
  auto finish = [&](const Reply& reply, const absl::Status& status,
                    const RequestTiming* timing) {
    Send(connection, reply);
    if (timing != nullptr) record.timing = *timing;
    WriteRequestRecord(record, status, {front_end.metrics, statistics}, [connection] {
      return Peer(connection);
    });
    return reply.status;
  };
  auto fail = [&](const absl::Status& status) {
    return finish(ErrorReply(status), status, nullptr);
  };

  absl::StatusOr<kserve::Model> model = kserve::FindModel(name, version);
  if (!model.ok()) return fail(model.status());
  record.model = *model;

  const mg_request_info* info = mg_get_request_info(connection);
  const int64_t max_body =
      std::min<int64_t>(std::numeric_limits<int32_t>::max(),
                        max_tensor_bytes * kJsonBytesPerTensorByte + kBodyHeadroomBytes);
  if (info->content_length < 0) {
    return fail(absl::InvalidArgumentError("request body: Content-Length is required"));
  }
  if (info->content_length > max_body) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "request body: ", info->content_length, " bytes exceeds the server's limit of ",
        max_body, " bytes (from --max_tensor_bytes)")));
  }
  std::string body(static_cast<size_t>(info->content_length), '\0');
  const size_t read = ReadBody(connection, &body);
  if (read != body.size()) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "request body: got ", read, " of ", body.size(), " bytes (Content-Length)")));
  }
  int64_t header_length = static_cast<int64_t>(body.size());
  if (const char* value = mg_get_header(connection, "Inference-Header-Content-Length")) {
    if (!absl::SimpleAtoi(value, &header_length) || header_length < 0 ||
        header_length > static_cast<int64_t>(body.size())) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "Inference-Header-Content-Length: expected 0 to ", body.size(), ", got \"", value,
          "\"")));
    }
  }

  auto call = std::make_shared<HttpCall>();
  kserve::InferRequestParts& parts = call->parts;
  parts.model_name = name;
  parts.model_version = version;
  HttpInferOptions options;
  absl::Status status = ParseHttpInferRequest(body, header_length, &parts, &options);
  body = std::string();
  record.data_bytes = parts.input_region.has_value()
                          ? parts.input_region->byte_size
                          : static_cast<int64_t>(parts.input_data.size());
  kserve::Model built = *model;
  InferenceRequest request;
  if (status.ok()) status = kserve::BuildInferenceRequest(&parts, &built, &request);
  if (status.ok()) status = kserve::BindRegions(parts, shared_memory, &request, &call->top_k_regions,
                                                  &call->leases);
  if (!status.ok()) return fail(status);
  const DType dtype = request.dtype;
  const bool answer_top_k = request.top_k > 0;
  request.output.buffer = &call->output;
  request.output.view = &call->view;
  request.output.top_k = &call->top_k;
  request.deadline = std::chrono::system_clock::now() + kHttpRequestTimeout;
  request.is_cancelled = [raw = call.get()] {
    return raw->abandoned.load(std::memory_order_relaxed);
  };
  // A refusal is answered (503) at once: no GOAWAY can cancel it.
  Submit(front_end, std::move(request), kserve::FieldNamesFor(parts),
         Responder{[call](const absl::Status& outcome, const RequestTiming& timing) {
                     call->timing = timing;
                     call->status = outcome;
                     call->done.Notify();
                   },
                   /*hold_refusals=*/false},
         &call->admitted);
  // The batcher drops the request at its deadline; the margin covers a batch
  // already computing then.
  if (!call->done.WaitForNotificationWithTimeout(
          absl::FromChrono(kHttpRequestTimeout) + absl::Seconds(10))) {
    call->abandoned.store(true);
    return fail(absl::DeadlineExceededError("the request was not answered in time"));
  }
  if (!call->status.ok()) return fail(call->status);

  const char* out_data = call->view.data != nullptr ? call->view.data : call->output.data();
  const int64_t out_bytes = call->view.data != nullptr
                                ? call->view.bytes
                                : static_cast<int64_t>(call->output.size());
  Json output = {{"name", kserve::kOutputName},
                 {"datatype", kserve::DatatypeName(dtype)},
                 {"shape", parts.input_shape}};
  Reply reply;
  Json outputs = Json::array();
  if (answer_top_k) {
    // Classification (BYTES "<value>:<index>"), or TOP_K_VALUES and
    // TOP_K_INDICES (kserve.h); binary data follows in the outputs' order.
    const TopKResult& top_k = call->top_k;
    const std::vector<int64_t>& shape = top_k.dims;
    // Checked by BuildInferenceRequest.
    const std::vector<kserve::AnswerOutput> kinds = *kserve::AnswerOutputs(parts);
    kserve::WriteTopKRegions(top_k, call->top_k_regions);
    for (kserve::AnswerOutput kind : kinds) {
      Json tensor = {{"shape", shape}};
      std::string binary;
      const std::optional<kserve::RegionRef>& region =
          kind == kserve::AnswerOutput::kTopKValues    ? parts.top_k_values_region
          : kind == kserve::AnswerOutput::kTopKIndices ? parts.top_k_indices_region
                                                       : std::nullopt;
      if (region) {
        // Written into the caller's region: its parameters, no data.
        tensor["name"] = kind == kserve::AnswerOutput::kTopKValues ? kserve::kTopKValuesName
                                                                   : kserve::kTopKIndicesName;
        tensor["datatype"] =
            kind == kserve::AnswerOutput::kTopKValues ? kserve::DatatypeName(dtype) : "INT64";
        tensor["parameters"] = {{"shared_memory_region", region->name},
                                {"shared_memory_byte_size", region->byte_size}};
        if (region->offset != 0) tensor["parameters"]["shared_memory_offset"] = region->offset;
        outputs.push_back(std::move(tensor));
        continue;
      }
      if (kind == kserve::AnswerOutput::kTopKValues) {
        tensor["name"] = kserve::kTopKValuesName;
        tensor["datatype"] = kserve::DatatypeName(dtype);
        if (options.binary_output) {
          binary = top_k.values;
        } else {
          tensor["data"] = OutputJsonData(top_k.values.data(),
                                          static_cast<int64_t>(top_k.values.size()), dtype);
        }
      } else if (kind == kserve::AnswerOutput::kTopKIndices) {
        tensor["name"] = kserve::kTopKIndicesName;
        tensor["datatype"] = "INT64";
        if (options.binary_output) {
          binary = top_k.indices;
        } else {
          std::vector<int64_t> indices(top_k.indices.size() / sizeof(int64_t));
          std::memcpy(indices.data(), top_k.indices.data(), top_k.indices.size());
          tensor["data"] = std::move(indices);
        }
      } else {
        tensor["name"] = kserve::kOutputName;
        tensor["datatype"] = "BYTES";
        std::vector<std::string> elements = kserve::ClassificationStrings(top_k, dtype);
        if (options.binary_output) {
          binary = kserve::SerializeBytesTensor(elements);
        } else {
          tensor["data"] = std::move(elements);
        }
      }
      if (options.binary_output) {
        tensor["parameters"] = {{"binary_data_size", binary.size()}};
        reply.binary += binary;
        reply.binary_reply = true;
      }
      outputs.push_back(std::move(tensor));
    }
  } else if (const auto& region = parts.output_region) {
    // Written into the caller's region: no data in the response.
    output["parameters"] = {{"shared_memory_region", region->name},
                            {"shared_memory_byte_size", region->byte_size}};
    if (region->offset != 0) output["parameters"]["shared_memory_offset"] = region->offset;
  } else if (options.binary_output) {
    output["parameters"] = {{"binary_data_size", out_bytes}};
    reply.binary_reply = true;
    reply.binary_data = out_data;
    reply.binary_size = static_cast<size_t>(out_bytes);
  } else {
    output["data"] = OutputJsonData(out_data, out_bytes, dtype);
  }
  if (outputs.empty()) outputs.push_back(std::move(output));
  Json response = {{"model_name", kserve::ModelName(*model)},
                   {"model_version", kserve::kModelVersion},
                   {"outputs", std::move(outputs)}};
  if (!parts.id.empty()) response["id"] = parts.id;
  reply.body = response.dump();
  return finish(reply, absl::OkStatus(), &call->timing);
}

int HandleRequest(mg_connection* connection, void* server) {
  return static_cast<KServeHttpServer*>(server)->Handle(connection);
}

// The health checks of the protocol, answered without a token so probes
// keep working: /v2/health/live, /v2/health/ready and a model's /ready.
bool IsHealthCheck(const std::vector<std::string>& segments) {
  if (segments.size() == 3 && segments[1] == "health") return true;
  return segments.size() >= 4 && segments[1] == "models" && segments.back() == "ready";
}

}  // namespace

KServeHttpServer::KServeHttpServer(HttpServerOptions options, const FrontEnd& front_end,
                                   kserve::ModelStatistics* statistics)
    : options_(std::move(options)), front_end_(front_end), statistics_(statistics) {}

KServeHttpServer::~KServeHttpServer() {
  JoinStop();
  Stop();
}

absl::Status KServeHttpServer::Start() {
  const HttpServerOptions& options = options_;
  const bool tls = !options.tls.cert_file.empty() || !options.tls.key_file.empty();
  if (tls) {
    if (options.tls.cert_file.empty() || options.tls.key_file.empty()) {
      return absl::InvalidArgumentError("--tls_cert_file and --tls_key_file go together");
    }
    SOFTMAX_RETURN_IF_ERROR(EnableCivetwebTls());
  } else if (!options.tls.client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca_file needs --tls_cert_file and --tls_key_file");
  }
  // A trailing "s" makes civetweb's port TLS-only.
  const std::string listening = tls ? options.address + "s" : options.address;
  const std::string threads = std::to_string(kHttpThreads);
  const std::string keep_alive = std::to_string(kHttpKeepAliveMs);
  const char* civet_options[] = {"listening_ports", listening.c_str(),
                                 "num_threads", threads.c_str(),
                                 "enable_keep_alive", "yes",
                                 "keep_alive_timeout_ms", keep_alive.c_str(),
                                 "tcp_nodelay", "1",
                                 nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = [](const mg_connection*, const char*) { return 1; };  // quiet
  // The SSL_CTX is configured here rather than by civetweb's options, which
  // want the certificate and key in one file.
  callbacks.init_ssl = [](void* ssl_ctx, void* user_data) {
    auto* self = static_cast<KServeHttpServer*>(user_data);
    self->tls_status_ = ConfigureTlsContext(ssl_ctx, self->options_.tls);
    return self->tls_status_.ok() ? 1 : -1;
  };
  context_ = mg_start(&callbacks, this, civet_options);
  if (!tls_status_.ok()) {
    if (context_ != nullptr) mg_stop(context_);
    context_ = nullptr;
    return tls_status_;
  }
  if (context_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("http: cannot listen on ", options.address));
  }
  mg_set_request_handler(context_, "/v2", &HandleRequest, this);
  mg_server_port ports[4];
  const int count = mg_get_server_ports(context_, 4, ports);
  if (count < 1) {
    return absl::UnavailableError(absl::StrCat("http: cannot listen on ", options.address));
  }
  const size_t colon = options.address.rfind(':');
  const std::string host =
      colon == std::string::npos ? options.address : options.address.substr(0, colon);
  bound_address_ = absl::StrCat(host, ":", ports[0].port);
  return absl::OkStatus();
}

void KServeHttpServer::Stop() {
  if (context_ == nullptr) return;
  const size_t colon = bound_address_.rfind(':');
  int port = 0;
  if (colon != std::string::npos) absl::SimpleAtoi(bound_address_.substr(colon + 1), &port);
  StopCivetwebServer([this] { mg_stop(context_); }, port);
  context_ = nullptr;
}

int KServeHttpServer::Handle(mg_connection* connection) {
  const mg_request_info* info = mg_get_request_info(connection);
  const std::string method = info->request_method != nullptr ? info->request_method : "";
  const std::string path = info->local_uri != nullptr ? info->local_uri : "";
  std::vector<std::string> segments = absl::StrSplit(path, '/', absl::SkipEmpty());
  // segments[0] == "v2" (the handler's prefix).
  if (segments.empty() || segments[0] != "v2") {
    Send(connection, ErrorReply(absl::NotFoundError(absl::StrCat("no endpoint ", path))));
    return 404;
  }
  auto reply_and_return = [connection](const Reply& reply) {
    Send(connection, reply);
    return reply.status;
  };
  auto not_found = [&] {
    return reply_and_return(ErrorReply(absl::NotFoundError(
        absl::StrCat("no endpoint ", method, " ", path, " (see the KServe v2 HTTP API)"))));
  };
  auto require = [&](const char* wanted) { return method == wanted; };
  const bool draining = front_end_.admission->draining();
  if (front_end_.authenticator != nullptr && !IsHealthCheck(segments)) {
    const char* authorization = mg_get_header(connection, "Authorization");
    const absl::Status allowed =
        front_end_.authenticator->CheckHeader(authorization != nullptr ? authorization : "");
    if (!allowed.ok()) {
      if (segments.back() == "infer") {
        WriteRequestRecord(RequestRecord(RpcMethod::kHttpInfer), allowed,
                           {front_end_.metrics, statistics_},
                           [connection] { return Peer(connection); });
      }
      return reply_and_return(ErrorReply(allowed));
    }
  }

  if (segments.size() == 1) {
    if (!require("GET")) return not_found();
    Json extensions = Json::array();
    for (const std::string& extension : kserve::Extensions(options_.shared_memory)) {
      extensions.push_back(extension);
    }
    return reply_and_return(JsonReply(200, {{"name", kserve::kServerName},
                                            {"version", options_.server_version},
                                            {"extensions", extensions}}));
  }
  if (segments[1] == "health" && segments.size() == 3 && require("GET")) {
    // The status is the answer (tritonclient reads only it); the body is
    // KServe's own, which its Python SDK parses.
    if (segments[2] == "live") return reply_and_return(JsonReply(200, {{"live", true}}));
    if (segments[2] == "ready") {
      return reply_and_return(JsonReply(draining ? 503 : 200, {{"ready", !draining}}));
    }
    return not_found();
  }
  if (segments[1] == "systemsharedmemory" || segments[1] == "cudasharedmemory") {
    return SharedMemory(connection, method, segments);
  }
  if (segments[1] != "models" || segments.size() < 3) return not_found();
  if (segments.size() == 3 && segments[2] == "stats" && require("GET")) {
    Json stats = Json::array();
    for (kserve::Model model : kserve::kModels) {
      stats.push_back(StatisticsJson(statistics_->Get(model)));
    }
    return reply_and_return(JsonReply(200, {{"model_stats", stats}}));
  }
  const std::string& name = segments[2];
  std::string version;
  size_t next = 3;
  if (segments.size() >= 5 && segments[3] == "versions") {
    version = segments[4];
    next = 5;
  }
  const std::string action = next < segments.size() ? segments[next] : "";
  if (next + 1 < segments.size()) return not_found();

  if (action == "infer") {
    if (!require("POST")) return not_found();
    return Infer(connection, name, version, front_end_, statistics_, options_.shared_memory);
  }
  if (!require("GET")) return not_found();
  absl::StatusOr<kserve::Model> model = kserve::FindModel(name, version);
  // Readiness of a model not served: "not ready", Triton's 400 and words for
  // any model that is not ready (to r26.06), not "no such endpoint".
  if (!model.ok() && action == "ready") {
    return reply_and_return(JsonReply(400, {{"error", "Model version not ready"}}));
  }
  if (!model.ok()) return reply_and_return(ErrorReply(model.status()));
  if (action.empty()) return reply_and_return(JsonReply(200, MetadataJson(*model)));
  if (action == "ready") return reply_and_return(EmptyReply(draining ? 503 : 200));
  if (action == "config") return reply_and_return(JsonReply(200, ConfigJson(*model)));
  if (action == "stats") {
    return reply_and_return(JsonReply(
        200, {{"model_stats", Json::array({StatisticsJson(statistics_->Get(*model))})}}));
  }
  return not_found();
}

namespace {

// A register call's JSON body into `call` (of its kind): byte_size, and key
// and offset (system) or device_id and raw_handle {"b64": ...} (cuda).
absl::Status ParseRegisterBody(mg_connection* connection, kserve::SharedMemoryCall* call) {
  const mg_request_info* info = mg_get_request_info(connection);
  constexpr int64_t kMaxRegisterBody = 64 * 1024;  // a register body is a few fields
  if (info->content_length < 0 || info->content_length > kMaxRegisterBody) {
    return absl::InvalidArgumentError(absl::StrCat("request body: a JSON object of at most ",
                                                   kMaxRegisterBody,
                                                   " bytes with Content-Length is required"));
  }
  std::string body(static_cast<size_t>(info->content_length), '\0');
  const size_t read = ReadBody(connection, &body);
  const Json request = Json::parse(body.begin(), body.begin() + read, nullptr, false);
  if (read != body.size() || request.is_discarded() || !request.is_object()) {
    return absl::InvalidArgumentError("request body: not a JSON object");
  }
  auto integer = [&](const char* key, bool required, int64_t* out) -> absl::Status {
    auto value = request.find(key);
    if (value == request.end()) {
      return required ? absl::InvalidArgumentError(absl::StrCat(key, ": missing"))
                      : absl::OkStatus();
    }
    if (!value->is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(key, ": expected an integer"));
    }
    *out = value->is_number_unsigned()
               ? static_cast<int64_t>(std::min<uint64_t>(value->get<uint64_t>(),
                                                         std::numeric_limits<int64_t>::max()))
               : value->get<int64_t>();
    return absl::OkStatus();
  };
  SOFTMAX_RETURN_IF_ERROR(integer("byte_size", true, &call->byte_size));
  if (call->kind == SharedMemoryKind::kSystem) {
    SOFTMAX_RETURN_IF_ERROR(integer("offset", false, &call->offset));
    auto key = request.find("key");
    if (key == request.end() || !key->is_string()) {
      return absl::InvalidArgumentError("key: expected a string");
    }
    call->key = key->get<std::string>();
    return absl::OkStatus();
  }
  SOFTMAX_RETURN_IF_ERROR(integer("device_id", true, &call->device));
  auto handle = request.find("raw_handle");
  if (handle == request.end() || !handle->is_object() || !handle->contains("b64") ||
      !(*handle)["b64"].is_string() ||
      !absl::Base64Unescape((*handle)["b64"].get<std::string>(), &call->raw_handle)) {
    return absl::InvalidArgumentError(
        "raw_handle: expected {\"b64\": the cudaIpcMemHandle_t in base64}");
  }
  return absl::OkStatus();
}

}  // namespace

// /v2/{system,cuda}sharedmemory[/region/NAME]/{status,register,unregister}
// (Triton's shared-memory extensions over HTTP).
int KServeHttpServer::SharedMemory(mg_connection* connection, const std::string& method,
                                   const std::vector<std::string>& segments) {
  const SharedMemoryKind kind = segments[1] == "cudasharedmemory" ? SharedMemoryKind::kCuda
                                                                  : SharedMemoryKind::kSystem;
  auto reply = [connection](const Reply& r) {
    Send(connection, r);
    return r.status;
  };
  std::string name;
  std::string action;
  if (segments.size() == 3) {
    action = segments[2];
  } else if (segments.size() == 5 && segments[2] == "region") {
    name = segments[3];
    action = segments[4];
  }
  const bool known = (action == "status" && method == "GET") ||
                     (action == "unregister" && method == "POST") ||
                     (action == "register" && method == "POST" && !name.empty());
  if (!known) {
    return reply(ErrorReply(absl::NotFoundError(absl::StrCat(
        "no endpoint ", method, " /", absl::StrJoin(segments, "/"),
        " (see the shared-memory extensions of the KServe v2 HTTP API)"))));
  }
  using kserve::SharedMemoryCall;
  SharedMemoryCall call;
  call.kind = kind;
  call.name = name;
  call.action = action == "status"       ? SharedMemoryCall::Action::kStatus
                : action == "unregister" ? SharedMemoryCall::Action::kUnregister
                                         : SharedMemoryCall::Action::kRegister;
  if (call.action == SharedMemoryCall::Action::kRegister && options_.shared_memory != nullptr) {
    const absl::Status parsed = ParseRegisterBody(connection, &call);
    if (!parsed.ok()) return reply(ErrorReply(parsed));
  }
  absl::StatusOr<std::vector<SharedMemoryRegionStatus>> regions =
      kserve::RunSharedMemoryCall(call, options_.shared_memory);
  if (!regions.ok()) return reply(ErrorReply(regions.status()));
  if (call.action != SharedMemoryCall::Action::kStatus) return reply(EmptyReply(200));
  Json out = Json::array();
  for (const SharedMemoryRegionStatus& region : *regions) {
    if (kind == SharedMemoryKind::kSystem) {
      out.push_back({{"name", region.name},
                     {"key", region.key},
                     {"offset", region.offset},
                     {"byte_size", region.byte_size}});
    } else {
      out.push_back(
          {{"name", region.name}, {"device_id", region.device}, {"byte_size", region.byte_size}});
    }
  }
  return reply(JsonReply(200, out));
}

}  // namespace softmax::server
