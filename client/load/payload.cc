#include "client/load/payload.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/load/http_wire.h"
#include "client/summary.h"
#include "client/tensor.h"
#include "kernels/dtype.h"

namespace softmax::client {

absl::StatusOr<std::vector<LoadPayload>> BuildLoadPayloads(const LoadOptions& options,
                                                           const std::string& http_base_url,
                                                           std::vector<uint32_t>* schedule) {
  const std::vector<LoadShape>& shapes = options.shapes;
  std::vector<LoadPayload> payloads;
  std::vector<std::pair<size_t, size_t>> ranges;  // per shape: [first payload, count)
  uint64_t seed = options.seed;
  for (const LoadShape& shape : shapes) {
    absl::StatusOr<SoftmaxShape> view = ShapeAlongAxis(shape.dims, options.axis);
    if (!view.ok()) return view.status();
    absl::StatusOr<int64_t> elements = ElementCount(shape.dims);
    if (!elements.ok()) return elements.status();
    const int64_t bytes = *elements * WireItemSize(shape.dtype);
    const int copies =
        bytes > kLargeLoadPayloadBytes ? 1 : std::max(1, options.payloads_per_shape);
    ranges.emplace_back(payloads.size(), copies);
    for (int c = 0; c < copies; ++c) {
      RandomTensorOptions random;
      random.shape = shape.dims;
      random.dtype = shape.dtype;
      random.seed = seed++;
      absl::StatusOr<v1::Tensor> tensor = MakeRandomTensor(random);
      if (!tensor.ok()) return tensor.status();
      LoadPayload payload;
      *payload.request.mutable_input() = *std::move(tensor);
      if (options.axis != -1) payload.request.set_axis(options.axis);
      if (options.temperature != 1.0f) payload.request.set_temperature(options.temperature);
      payload.request.set_log(options.log);
      if (options.top_k > 0) {
        if (options.top_k > view->n) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--top_k=", options.top_k, " is larger than the axis of ",
              FormatLoadShape(shape), " (", view->n, ")"));
        }
        payload.request.set_top_k(options.top_k);
      }
      payload.view = *view;
      payload.rows = view->rows();
      payload.tensor_bytes = bytes;
      if (options.verify) {
        payload.expected.resize(static_cast<size_t>(*elements));
        SoftmaxOptions softmax_options;
        softmax_options.temperature = options.temperature;
        softmax_options.log = options.log;
        ReferenceSoftmax(payload.request.input().data().data(),
                         static_cast<DType>(shape.dtype), *view, softmax_options,
                         payload.expected.data());
      }
      switch (options.protocol) {
        case LoadProtocol::kSoftmaxV1:
          if (options.chunk_bytes > 0) {
            payload.chunks = PrepareChunks(payload.request, options.chunk_bytes);
          } else {
            payload.prepared = std::make_unique<const PreparedRequest>(payload.request);
          }
          break;
        case LoadProtocol::kKserve:
          payload.prepared =
              std::make_unique<const PreparedRequest>(KserveRequestOf(payload.request));
          break;
        case LoadProtocol::kHttp:
          payload.http = std::make_unique<const HttpPreparedRequest>(
              http_base_url, HttpInferRequestOf(payload.request));
          break;
      }
      std::string().swap(*payload.request.mutable_input()->mutable_data());
      payloads.push_back(std::move(payload));
    }
  }
  // Smooth weighted round-robin: each shape appears in proportion to its
  // weight, evenly interleaved; within a shape its copies are cycled.
  double total_weight = 0;
  for (const LoadShape& shape : shapes) total_weight += shape.weight;
  std::vector<double> credit(shapes.size(), 0.0);
  std::vector<size_t> uses(shapes.size(), 0);
  schedule->clear();
  for (int step = 0; step < kLoadScheduleLength; ++step) {
    size_t best = 0;
    for (size_t s = 0; s < shapes.size(); ++s) {
      credit[s] += shapes[s].weight;
      if (credit[s] > credit[best]) best = s;
    }
    credit[best] -= total_weight;
    const auto [first, count] = ranges[best];
    schedule->push_back(static_cast<uint32_t>(first + uses[best]++ % count));
  }
  return payloads;
}

std::string CheckLoadTopK(const LoadPayload& payload, const v1::TopK& top_k) {
  const int64_t k = payload.request.top_k();
  const v1::DType dtype = payload.request.input().dtype();
  if (absl::Status bytes = CheckTopKBytes(top_k, dtype, payload.view, k); !bytes.ok()) {
    return std::string(bytes.message());
  }
  const Comparison comparison =
      CompareTopK(payload.expected.data(), static_cast<DType>(dtype), top_k, payload.view, k);
  if (comparison.mismatches == 0) return "";
  return absl::StrFormat(
      "%d of %d top-K values out of tolerance or ranked below a left-out index; first: "
      "top-K element %d is %.9g, reference %.9g",
      comparison.mismatches, comparison.elements, comparison.first_mismatch,
      comparison.first_actual, comparison.first_expected);
}

std::string CheckLoadOutput(const LoadPayload& payload, const v1::Tensor& output) {
  const v1::Tensor& input = payload.request.input();
  if (output.dtype() != input.dtype()) {
    return absl::StrCat("dtype ", WireDTypeName(output.dtype()), " instead of ",
                        WireDTypeName(input.dtype()));
  }
  if (ShapeOf(output) != ShapeOf(input)) {
    return absl::StrCat("shape ", FormatShape(ShapeOf(output)), " instead of ",
                        FormatShape(ShapeOf(input)));
  }
  if (static_cast<int64_t>(output.data().size()) != payload.tensor_bytes) {
    return absl::StrCat(output.data().size(), " data bytes instead of ", payload.tensor_bytes);
  }
  const DType dtype = static_cast<DType>(output.dtype());
  const int64_t elements = static_cast<int64_t>(payload.expected.size());
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < elements; ++i) {
    const double want = payload.expected[i];
    const double got = LoadAsFloat(output.data().data(), dtype, i);
    const bool ok = WithinReferenceTolerance(got, want, dtype);
    if (!ok && bad++ == 0) {
      first = absl::StrFormat("element %d is %.9g, reference %.9g", i, got, want);
    }
  }
  if (bad == 0) return "";
  return absl::StrCat(bad, " of ", elements, " elements out of tolerance; first: ", first);
}

}  // namespace softmax::client
