#include "server/rpc/dispatch.h"

#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/metrics/metrics.h"
#include "server/rpc/top_k.h"
#include "server/rpc/validation.h"

namespace softmax::server {
namespace {

void SetTiming(const RequestTiming& timing, v1::SoftmaxResponse* response) {
  v1::Timing* out = response->mutable_timing();
  out->set_queue_ns(timing.queue_ns);
  out->set_compute_ns(timing.compute_ns);
  out->set_batch_requests(timing.batch_requests);
  out->set_batch_rows(timing.batch_rows);
  out->set_kernel_ns(timing.kernel_ns);
  out->set_dispatch_ns(timing.dispatch_ns);
}

// What a request with a top K needs to finish its answer.
struct TopKAnswer {
  int64_t k = 0;
  bool full_output = false;
  DType dtype = DType::kFloat32;
  SoftmaxShape shape;
  std::vector<int64_t> dims;  // of the values and indices
};

// Replaces the whole output (in `view` when the backend lent one, else in
// the response) by its top K (top_k.h), and drops it unless asked for.
void FinishTopK(const TopKAnswer& answer, TensorBufferPool* pool, v1::SoftmaxResponse* response,
                OutputView* view) {
  const char* data = view != nullptr && view->data != nullptr ? view->data
                                                              : response->output().data().data();
  v1::TopK* top_k = response->mutable_top_k();
  v1::Tensor* values = top_k->mutable_values();
  values->set_dtype(response->output().dtype());
  values->mutable_shape()->Add(answer.dims.begin(), answer.dims.end());
  const int64_t count = answer.shape.rows() * answer.k;
  std::string* value_bytes = values->mutable_data();
  value_bytes->resize(static_cast<size_t>(count * ItemSize(answer.dtype)));
  std::vector<int64_t> indices(static_cast<size_t>(count));
  SelectTopK(data, answer.dtype, answer.shape, answer.k, value_bytes->data(), indices.data());
  std::string* index_bytes = top_k->mutable_indices();
  index_bytes->resize(indices.size() * sizeof(int64_t));
  // Little-endian on every host this builds for (x86-64, aarch64).
  std::memcpy(index_bytes->data(), indices.data(), index_bytes->size());
  if (answer.full_output) return;
  if (view != nullptr) *view = OutputView{};
  if (pool != nullptr) pool->Give(std::move(*response->mutable_output()->mutable_data()));
  response->clear_output();
}

}  // namespace

void RecycleBuffers(TensorBufferPool* pool, v1::SoftmaxRequest* request,
                    v1::SoftmaxResponse* response) {
  if (request->has_input()) pool->Give(std::move(*request->mutable_input()->mutable_data()));
  if (response->has_output()) pool->Give(std::move(*response->mutable_output()->mutable_data()));
}

void LendLargeOutput(const std::shared_ptr<TensorBufferPool>& pool,
                     v1::SoftmaxResponse* response, OutputView* view) {
  if (view->data != nullptr || !response->has_output() ||
      response->output().data().size() < TensorBufferPool::kMinPooledBytes) {
    return;
  }
  *view = TensorBufferPool::LendAsView(pool, std::move(*response->mutable_output()->mutable_data()));
  response->mutable_output()->clear_data();
}

absl::Status Dispatch(const FrontEnd& front_end, v1::SoftmaxRequest* request,
                      v1::SoftmaxResponse* response, OutputView* view,
                      std::chrono::system_clock::time_point deadline,
                      std::function<bool()> is_cancelled,
                      std::function<void(const absl::Status&)> done,
                      const ExternalTensors* external, std::shared_ptr<const void>* held) {
  Admission& admission = *front_end.admission;
  const ExternalTensors none;
  const ExternalTensors& ext = external != nullptr ? *external : none;
  std::optional<absl::string_view> external_input;
  if (ext.input != nullptr) external_input = absl::string_view(ext.input, ext.input_bytes);
  absl::StatusOr<ParsedRequest> parsed = ParseRequest(*request, front_end.limits, external_input);
  if (!parsed.ok()) return parsed.status();
  if (ext.output != nullptr && parsed->top_k != 0) {
    return absl::InvalidArgumentError(
        "top_k: a top K is not written into a shared-memory output region; leave the region "
        "out (the answer comes in the response) or ask for the whole output");
  }
  if (ext.output != nullptr && ext.output_bytes < parsed->bytes) {
    return absl::InvalidArgumentError(absl::StrCat("output.region: ", ext.output_bytes,
                                                   " bytes, smaller than the output's ",
                                                   parsed->bytes, " bytes"));
  }

  response->set_request_id(request->request_id());
  v1::Tensor* output = response->mutable_output();
  output->set_dtype(request->input().dtype());
  output->mutable_shape()->CopyFrom(request->input().shape());

  AdmissionRequest admitted;
  // The input and the output, each unless it is in a caller's region.
  admitted.held_bytes =
      (ext.input != nullptr ? 0 : parsed->bytes) + (ext.output != nullptr ? 0 : parsed->bytes);
  std::string* input = request->mutable_input()->mutable_data();
  if (ext.input == nullptr) admitted.input_string = input;
  auto item = std::make_unique<WorkItem>();
  item->segment.input = parsed->data.data();
  item->segment.bytes = parsed->bytes;
  item->segment.dtype = parsed->dtype;
  item->segment.shape = parsed->shape;
  item->segment.options = parsed->options;
  item->output = output->mutable_data();
  // A pooled input stays with the request until the call is done and goes
  // back to the pool, instead of being freed by the batcher once staged.
  item->input_buffer = input->capacity() >= TensorBufferPool::kMinPooledBytes ? nullptr : input;
  item->output_view = view;
  if (ext.input != nullptr) {
    item->input_buffer = nullptr;
    item->segment.input_memory = ext.input_memory;
    item->segment.input_device = ext.input_device;
    item->segment.staged = ext.input_staged;
  }
  if (ext.output != nullptr) {
    item->fixed_output = ext.output;
    item->output_view = nullptr;
    item->segment.output_memory = ext.output_memory;
    item->segment.output_device = ext.output_device;
  }
  item->deadline = deadline;
  item->is_cancelled = std::move(is_cancelled);
  // Echo answers carry no timing worth a histogram.
  Metrics* metrics = admission.echo() ? nullptr : front_end.metrics;
  std::optional<TopKAnswer> top_k;
  if (parsed->top_k != 0) {
    top_k = TopKAnswer{parsed->top_k, parsed->full_output, parsed->dtype, parsed->shape,
                       TopKDims(parsed->dims, parsed->axis, parsed->top_k)};
  }
  item->done = [response, metrics, view, top_k = std::move(top_k), pool = front_end.buffers,
                done = std::move(done)](const absl::Status& status, const RequestTiming& timing) {
    if (metrics != nullptr) metrics->RecordRequestTiming(timing);
    if (status.ok()) {
      SetTiming(timing, response);
      if (top_k.has_value()) FinishTopK(*top_k, pool.get(), response, view);
    }
    done(status);
  };
  admitted.item = std::move(item);
  return admission.Admit(std::move(admitted), held);
}

}  // namespace softmax::server
