#include "server/rpc/dispatch.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "server/metrics/metrics.h"
#include "server/rpc/top_k.h"

namespace softmax::server {
namespace {

// What a request with a top K needs to finish its answer.
struct TopKAnswer {
  int64_t k = 0;
  bool full_output = false;
  DType dtype = DType::kFloat32;
  SoftmaxShape shape;
  int axis = 0;
};

// Finishes `result`: a top K the backend computed (`fused`) needs its dims
// only. In echo mode selects the top K of the whole output, the input itself
// (in `view` when lent, else in `buffer`), and drops it unless asked.
void FinishTopK(const TopKAnswer& answer, const std::vector<int64_t>& dims, bool fused,
                TensorBufferPool* pool, std::string* buffer, OutputView* view,
                TopKResult* result) {
  result->dims = TopKDims(dims, answer.axis, answer.k);
  if (fused) return;
  const char* data = view != nullptr && view->data != nullptr ? view->data : buffer->data();
  const int64_t count = answer.shape.rows() * answer.k;
  result->values.resize(static_cast<size_t>(count * ItemSize(answer.dtype)));
  std::vector<int64_t> indices(static_cast<size_t>(count));
  SelectTopK(data, answer.dtype, answer.shape, answer.k, result->values.data(), indices.data());
  result->indices.resize(indices.size() * sizeof(int64_t));
  // Little-endian on every host this builds for (x86-64, aarch64).
  std::memcpy(result->indices.data(), indices.data(), result->indices.size());
  if (answer.full_output) return;
  if (view != nullptr) *view = OutputView{};
  if (pool != nullptr) {
    pool->Give(std::move(*buffer));
  } else {
    std::string().swap(*buffer);
  }
}

}  // namespace

void Submit(const FrontEnd& front_end, InferenceRequest request, const FieldNames& names,
            Responder responder, Admission::Admitted* admitted) {
  if (absl::Status valid = ValidateRequest(&request, front_end.limits, names); !valid.ok()) {
    responder.done(valid, RequestTiming{});
    return;
  }
  Admission& admission = *front_end.admission;
  // A pooled input stays with the request until the call is done and goes
  // back to the pool, instead of being freed by the batcher once staged.
  if (std::string* input = request.input.buffer; input != nullptr) {
    request.input.buffer_is_movable = input->capacity() < TensorBufferPool::kMinPooledBytes;
  }
  // Echo answers carry no timing worth a histogram.
  Metrics* metrics = admission.echo() ? nullptr : front_end.metrics;
  if (request.top_k == 0 && metrics == nullptr) {
    admission.Submit(std::move(request), std::move(responder), admitted);
    return;
  }
  TopKAnswer top_k{request.top_k, request.full_output, request.dtype, request.tensor.shape,
                   request.tensor.axis};
  std::vector<int64_t> dims;
  if (request.top_k != 0) dims = request.dims;
  // As Admission decides it: the backend computes the top K; echo answers
  // with the input, selected here.
  const bool fused = !admission.echo();
  responder.done = [metrics, top_k, fused, dims = std::move(dims), pool = front_end.buffers,
                    buffer = request.output.buffer, view = request.output.view,
                    result = request.output.top_k,
                    done = std::move(responder.done)](const absl::Status& status,
                                                      const RequestTiming& timing) {
    if (metrics != nullptr) metrics->RecordRequestTiming(timing);
    if (status.ok() && top_k.k != 0 && result != nullptr) {
      FinishTopK(top_k, dims, fused, pool.get(), buffer, view, result);
    }
    done(status, timing);
  };
  admission.Submit(std::move(request), std::move(responder), admitted);
}

}  // namespace softmax::server
