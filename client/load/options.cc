#include "client/load/options.h"

#include <cmath>
#include <fstream>
#include <initializer_list>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/load/http_wire.h"
#include "client/tensor.h"

namespace softmax::client {

absl::StatusOr<LoadShape> ParseLoadShape(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  if (parts.size() < 2 || parts.size() > 3 || parts[0].empty() || parts[1].empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mix entry \"", text,
        "\": want DIMS:DTYPE[:WEIGHT] with DIMS joined by 'x', e.g. 8x4096:float16:2"));
  }
  LoadShape shape;
  absl::StatusOr<std::vector<int64_t>> dims = ParseShape(parts[0]);
  if (!dims.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mix entry \"", text, "\": ", dims.status().message()));
  }
  shape.dims = *std::move(dims);
  absl::StatusOr<v1::DType> dtype = ParseDType(parts[1]);
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mix entry \"", text, "\": ", dtype.status().message()));
  }
  shape.dtype = *dtype;
  if (parts.size() == 3) {
    if (!absl::SimpleAtod(parts[2], &shape.weight) || !(shape.weight > 0) ||
        std::isinf(shape.weight)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mix entry \"", text, "\": weight \"", parts[2], "\" is not a finite number > 0"));
    }
  }
  absl::StatusOr<int64_t> elements = ElementCount(shape.dims);
  if (!elements.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mix entry \"", text, "\": ", elements.status().message()));
  }
  return shape;
}

absl::StatusOr<std::vector<LoadShape>> ParseLoadMix(absl::string_view text) {
  std::vector<LoadShape> shapes;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    absl::StatusOr<LoadShape> shape = ParseLoadShape(entry);
    if (!shape.ok()) return shape.status();
    shapes.push_back(*std::move(shape));
  }
  if (shapes.empty()) return absl::InvalidArgumentError("mix: no entries");
  return shapes;
}

absl::StatusOr<std::vector<LoadShape>> ReadLoadMixFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open mix file ", path));
  std::vector<LoadShape> shapes;
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    absl::string_view content = line;
    content = content.substr(0, content.find('#'));
    content = absl::StripAsciiWhitespace(content);
    if (content.empty()) continue;
    absl::StatusOr<LoadShape> shape = ParseLoadShape(content);
    if (!shape.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", number, ": ", shape.status().message()));
    }
    shapes.push_back(*std::move(shape));
  }
  if (shapes.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no mix entries"));
  return shapes;
}

std::string FormatLoadShape(const LoadShape& shape) {
  return absl::StrCat(absl::StrJoin(shape.dims, "x"), ":", WireDTypeName(shape.dtype), ":",
                      absl::StrFormat("%g", shape.weight));
}

namespace {

// Sets *value to the value named `text` in `names` and returns true; or sets
// *error to `want` and returns false.
template <typename T>
bool ParseNamed(absl::string_view text,
                std::initializer_list<std::pair<absl::string_view, T>> names, const char* want,
                T* value, std::string* error) {
  for (const auto& [name, named] : names) {
    if (text == name) {
      *value = named;
      return true;
    }
  }
  *error = want;
  return false;
}

}  // namespace

bool AbslParseFlag(absl::string_view text, Arrival* arrival, std::string* error) {
  return ParseNamed(text, {{"constant", Arrival::kConstant}, {"poisson", Arrival::kPoisson}},
                    "want constant or poisson", arrival, error);
}

std::string AbslUnparseFlag(Arrival arrival) {
  return arrival == Arrival::kPoisson ? "poisson" : "constant";
}

bool AbslParseFlag(absl::string_view text, LoadProtocol* protocol, std::string* error) {
  return ParseNamed(text,
                    {{"softmax.v1", LoadProtocol::kSoftmaxV1},
                     {"kserve", LoadProtocol::kKserve},
                     {"http", LoadProtocol::kHttp}},
                    "want softmax.v1, kserve or http", protocol, error);
}

std::string AbslUnparseFlag(LoadProtocol protocol) {
  switch (protocol) {
    case LoadProtocol::kKserve: return "kserve";
    case LoadProtocol::kHttp: return "http";
    default: return "softmax.v1";
  }
}

absl::Status ValidateLoadOptions(const LoadOptions& options) {
  if (options.max_message_bytes < 1) {
    return absl::InvalidArgumentError("--max_message_bytes must be >= 1");
  }
  if (options.connections < 1) return absl::InvalidArgumentError("--connections must be >= 1");
  if (options.concurrency < 1) return absl::InvalidArgumentError("--concurrency must be >= 1");
  if (!(options.rate >= 0) || std::isinf(options.rate)) {
    return absl::InvalidArgumentError("--rate must be a finite number >= 0");
  }
  if (options.max_outstanding < 1) {
    return absl::InvalidArgumentError("--max_outstanding must be >= 1");
  }
  if (options.duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--duration must be > 0");
  }
  if (options.requests < 0) return absl::InvalidArgumentError("--requests must be >= 0");
  if (options.requests == 0 && options.duration == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError("an unlimited --duration needs --requests");
  }
  if (options.warmup < absl::ZeroDuration() || options.warmup == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError("--warmup must be finite and >= 0");
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--timeout_ms must be >= 0");
  }
  if (options.connect_timeout <= absl::ZeroDuration() ||
      options.connect_timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError("--connect_timeout must be finite and > 0");
  }
  if (options.protocol == LoadProtocol::kHttp && options.stream) {
    return absl::InvalidArgumentError(absl::StrCat("--stream is not available with --protocol=",
                                                   AbslUnparseFlag(options.protocol)));
  }
  if (options.chunk_bytes < 0) {
    return absl::InvalidArgumentError("--chunk_bytes must be >= 0");
  }
  if (options.chunk_bytes > 0 && !options.stream) {
    return absl::InvalidArgumentError("--chunk_bytes needs --stream");
  }
  if (options.chunk_bytes > 0 && options.protocol != LoadProtocol::kSoftmaxV1) {
    return absl::InvalidArgumentError("--chunk_bytes needs --protocol=softmax.v1");
  }
  if (options.top_k < 0) return absl::InvalidArgumentError("--top_k must be >= 0");
  if (options.top_k > 0 && options.protocol != LoadProtocol::kSoftmaxV1) {
    return absl::InvalidArgumentError("--top_k needs --protocol=softmax.v1");
  }
  if (options.protocol == LoadProtocol::kHttp) {
    if (absl::Status target = ParseHttpTarget(options.target).status(); !target.ok()) {
      return target;
    }
  }
  if (options.shapes.empty()) {
    return absl::InvalidArgumentError("no payload: give --shape or --mix");
  }
  for (const LoadShape& shape : options.shapes) {
    if (!(shape.weight > 0) || std::isinf(shape.weight)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mix: weight of ", FormatLoadShape(shape), " must be finite and > 0"));
    }
  }
  if (options.payloads_per_shape < 1) {
    return absl::InvalidArgumentError("--payloads_per_shape must be >= 1");
  }
  if (!(options.temperature > 0) || std::isinf(options.temperature)) {
    return absl::InvalidArgumentError("--temperature must be finite and > 0");
  }
  return absl::OkStatus();
}

}  // namespace softmax::client
