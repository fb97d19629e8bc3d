#include "server/rpc/kserve_http.h"

#include <civetweb.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <cstring>
#include <algorithm>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/civetweb_stop.h"
#include "server/logging/log.h"
#include "server/rpc/status_util.h"

namespace softmax::server {
namespace {

using Json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

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
  mg_response_header_start(connection, reply.status);
  mg_response_header_add(connection, "Content-Type",
                         reply.binary_reply ? "application/octet-stream" : "application/json",
                         -1);
  const std::string length = std::to_string(reply.body.size() + binary);
  mg_response_header_add(connection, "Content-Length", length.c_str(), -1);
  if (reply.binary_reply) {
    const std::string header = std::to_string(reply.body.size());
    mg_response_header_add(connection, "Inference-Header-Content-Length", header.c_str(), -1);
  }
  mg_response_header_send(connection);
  if (!reply.body.empty()) mg_write(connection, reply.body.data(), reply.body.size());
  if (binary > 0) {
    const char* data = reply.binary_data != nullptr ? reply.binary_data : reply.binary.data();
    mg_write(connection, data, binary);
  }
}

Json MetadataJson(kserve::Model model) {
  const inference::ModelMetadataResponse metadata = kserve::Metadata(model);
  auto tensors = [](const auto& list) {
    Json out = Json::array();
    for (const auto& tensor : list) {
      out.push_back({{"name", tensor.name()},
                     {"datatype", tensor.datatype()},
                     {"shape", std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end())}});
    }
    return out;
  };
  return {{"name", metadata.name()},
          {"versions", std::vector<std::string>(metadata.versions().begin(),
                                                metadata.versions().end())},
          {"platform", metadata.platform()},
          {"inputs", tensors(metadata.inputs())},
          {"outputs", tensors(metadata.outputs())}};
}

Json ConfigJson(kserve::Model model) {
  const inference::ModelConfig config = kserve::Config(model);
  auto tensors = [](const auto& list) {
    Json out = Json::array();
    for (const auto& tensor : list) {
      out.push_back({{"name", tensor.name()},
                     {"data_type", inference::DataType_Name(tensor.data_type())},
                     {"dims", std::vector<int64_t>(tensor.dims().begin(), tensor.dims().end())}});
    }
    return out;
  };
  return {{"name", config.name()},
          {"platform", config.platform()},
          {"backend", config.backend()},
          {"version_policy", {{"latest", {{"num_versions", 1}}}}},
          {"max_batch_size", config.max_batch_size()},
          {"input", tensors(config.input())},
          {"output", tensors(config.output())},
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
  v1::SoftmaxRequest request;
  v1::SoftmaxResponse response;
  OutputView view;
  absl::Status status;
  absl::Notification done;
  std::atomic<bool> abandoned{false};
};

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
        if (!value.is_number_integer()) {
          return absl::InvalidArgumentError("parameters.axis: expected an integer");
        }
        parts->axis = value.get<int64_t>();
      } else if (name == "temperature") {
        if (!value.is_number()) {
          return absl::InvalidArgumentError("parameters.temperature: expected a number");
        }
        parts->temperature = value.get<double>();
      } else if (name == "binary_data_output") {
        if (!value.is_boolean()) {
          return absl::InvalidArgumentError("parameters.binary_data_output: expected a boolean");
        }
        options->binary_output = value.get<bool>();
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
      if (auto p = output.find("parameters"); p != output.end() && p->is_object()) {
        if (auto binary = p->find("binary_data"); binary != p->end() && binary->is_boolean()) {
          options->binary_output = options->binary_output || binary->get<bool>();
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

// POST .../infer: reads the body, answers it; returns the HTTP status sent.
int Infer(mg_connection* connection, const std::string& name, const std::string& version,
          SoftmaxServiceImpl* softmax, kserve::ModelStatistics* statistics,
          int64_t max_tensor_bytes) {
  const SteadyClock::time_point start = SteadyClock::now();
  int64_t data_bytes = 0;
  std::optional<kserve::Model> known_model;
  auto finish = [&](const Reply& reply, const absl::Status& status,
                    const RequestTiming* timing) {
    Send(connection, reply);
    const int64_t elapsed =
        std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - start)
            .count();
    if (known_model.has_value()) {
      if (status.ok()) {
        statistics->RecordSuccess(*known_model, elapsed, *timing);
      } else {
        statistics->RecordFailure(*known_model, elapsed);
      }
    }
    if (Metrics* metrics = softmax->metrics(); metrics != nullptr) {
      metrics->RecordRequest(RpcMethod::kHttpInfer, status.code(),
                             static_cast<double>(elapsed) * 1e-9, 2 * data_bytes);
    }
    logging::LogAccess("http_infer", status.code(), 2 * data_bytes,
                       static_cast<double>(elapsed) * 1e-9, [connection] {
                         const mg_request_info* info = mg_get_request_info(connection);
                         return absl::StrCat(info->remote_addr, ":", info->remote_port);
                       });
    return reply.status;
  };
  auto fail = [&](const absl::Status& status) {
    return finish(ErrorReply(status), status, nullptr);
  };

  absl::StatusOr<kserve::Model> model = kserve::FindModel(name, version);
  if (!model.ok()) return fail(model.status());
  known_model = *model;

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
  size_t read = 0;
  while (read < body.size()) {
    const int n = mg_read(connection, body.data() + read, body.size() - read);
    if (n <= 0) break;
    read += static_cast<size_t>(n);
  }
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

  kserve::InferRequestParts parts;
  parts.model_name = name;
  parts.model_version = version;
  HttpInferOptions options;
  absl::Status status = ParseHttpInferRequest(body, header_length, &parts, &options);
  body = std::string();
  data_bytes = static_cast<int64_t>(parts.input_data.size());
  auto call = std::make_shared<HttpCall>();
  kserve::Model built = *model;
  if (status.ok()) status = kserve::BuildSoftmaxRequest(&parts, &built, &call->request);
  if (!status.ok()) return fail(status);

  softmax->RequestsStarted(1);
  status = kserve::RenameInputFields(
      softmax->Dispatch(
          &call->request, &call->response, &call->view,
          std::chrono::system_clock::now() + kHttpRequestTimeout,
          [raw = call.get()] { return raw->abandoned.load(std::memory_order_relaxed); },
          [call](const absl::Status& outcome) {
            call->status = outcome;
            call->done.Notify();
          }),
      parts.data_field);
  if (!status.ok()) {
    softmax->RequestsEnded(1);
    return fail(status);
  }
  // The batcher drops the request at its deadline; the margin covers a batch
  // already computing then.
  if (!call->done.WaitForNotificationWithTimeout(
          absl::FromChrono(kHttpRequestTimeout) + absl::Seconds(10))) {
    call->abandoned.store(true);
    softmax->RequestsEnded(1);
    return fail(absl::DeadlineExceededError("the request was not answered in time"));
  }
  softmax->RequestsEnded(1);
  if (!call->status.ok()) return fail(call->status);

  const auto dtype = static_cast<DType>(static_cast<int>(call->request.input().dtype()));
  const char* out_data = call->view.data != nullptr ? call->view.data
                                                    : call->response.output().data().data();
  const int64_t out_bytes = call->view.data != nullptr
                                ? call->view.bytes
                                : static_cast<int64_t>(call->response.output().data().size());
  Json output = {{"name", kserve::kOutputName},
                 {"datatype", kserve::DatatypeName(dtype)},
                 {"shape", std::vector<int64_t>(call->request.input().shape().begin(),
                                                call->request.input().shape().end())}};
  Reply reply;
  if (options.binary_output) {
    output["parameters"] = {{"binary_data_size", out_bytes}};
    reply.binary_reply = true;
    reply.binary_data = out_data;
    reply.binary_size = static_cast<size_t>(out_bytes);
  } else {
    output["data"] = OutputJsonData(out_data, out_bytes, dtype);
  }
  Json response = {{"model_name", kserve::ModelName(*model)},
                   {"model_version", kserve::kModelVersion},
                   {"outputs", Json::array({output})}};
  if (!call->request.request_id().empty()) response["id"] = call->request.request_id();
  reply.body = response.dump();
  RequestTiming timing;
  timing.queue_ns = call->response.timing().queue_ns();
  timing.compute_ns = call->response.timing().compute_ns();
  return finish(reply, absl::OkStatus(), &timing);
}

int HandleRequest(mg_connection* connection, void* server) {
  return static_cast<KServeHttpServer*>(server)->Handle(connection);
}

}  // namespace

KServeHttpServer::KServeHttpServer(const HttpServerOptions& options, SoftmaxServiceImpl* softmax,
                                   kserve::ModelStatistics* statistics)
    : options_(options), softmax_(softmax), statistics_(statistics) {}

KServeHttpServer::~KServeHttpServer() { Stop(); }

absl::StatusOr<std::unique_ptr<KServeHttpServer>> KServeHttpServer::Start(
    const HttpServerOptions& options, SoftmaxServiceImpl* softmax,
    kserve::ModelStatistics* statistics) {
  std::unique_ptr<KServeHttpServer> server(new KServeHttpServer(options, softmax, statistics));
  const std::string threads = std::to_string(kHttpThreads);
  const char* civet_options[] = {"listening_ports", options.address.c_str(),
                                 "num_threads", threads.c_str(),
                                 "enable_keep_alive", "yes",
                                 "tcp_nodelay", "1",
                                 nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = [](const mg_connection*, const char*) { return 1; };  // quiet
  server->context_ = mg_start(&callbacks, nullptr, civet_options);
  if (server->context_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("http: cannot listen on ", options.address));
  }
  mg_set_request_handler(server->context_, "/v2", &HandleRequest, server.get());
  mg_server_port ports[4];
  const int count = mg_get_server_ports(server->context_, 4, ports);
  if (count < 1) {
    return absl::UnavailableError(absl::StrCat("http: cannot listen on ", options.address));
  }
  const size_t colon = options.address.rfind(':');
  const std::string host =
      colon == std::string::npos ? options.address : options.address.substr(0, colon);
  server->bound_address_ = absl::StrCat(host, ":", ports[0].port);
  return server;
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
  const bool draining = softmax_->draining();

  if (segments.size() == 1) {
    if (!require("GET")) return not_found();
    Json extensions = Json::array();
    for (const char* extension : kserve::kExtensions) extensions.push_back(extension);
    return reply_and_return(JsonReply(200, {{"name", kserve::kServerName},
                                            {"version", options_.server_version},
                                            {"extensions", extensions}}));
  }
  if (segments[1] == "health" && segments.size() == 3 && require("GET")) {
    if (segments[2] == "live") return reply_and_return(EmptyReply(200));
    if (segments[2] == "ready") return reply_and_return(EmptyReply(draining ? 503 : 200));
    return not_found();
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
    return Infer(connection, name, version, softmax_, statistics_, options_.max_tensor_bytes);
  }
  if (!require("GET")) return not_found();
  absl::StatusOr<kserve::Model> model = kserve::FindModel(name, version);
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

}  // namespace softmax::server
