#include "server/rpc/softmax_v1.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace softmax::server {

absl::StatusOr<DType> FromV1DType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return DType::kFloat32;
    case v1::DTYPE_FLOAT16: return DType::kFloat16;
    case v1::DTYPE_BFLOAT16: return DType::kBFloat16;
    case v1::DTYPE_UNSPECIFIED:
      return absl::InvalidArgumentError(
          "input.dtype: must be set (DTYPE_FLOAT32, DTYPE_FLOAT16 or DTYPE_BFLOAT16)");
    default: break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("input.dtype: unknown value ", static_cast<int>(dtype)));
}

absl::Status HeaderFromSoftmaxV1(const v1::SoftmaxRequest& request, InferenceRequest* out) {
  out->id = request.request_id();
  absl::StatusOr<DType> dtype = FromV1DType(request.input().dtype());
  if (!dtype.ok()) return dtype.status();
  out->dtype = *dtype;
  out->dims.assign(request.input().shape().begin(), request.input().shape().end());
  out->axis = request.has_axis() ? request.axis() : -1;
  if (request.has_temperature()) out->temperature = request.temperature();
  out->log = request.log();
  out->top_k = request.top_k();
  out->full_output = request.full_output();
  return absl::OkStatus();
}

absl::Status FromSoftmaxV1(v1::SoftmaxRequest* request, v1::SoftmaxResponse* response,
                           OutputView* view, TopKResult* top_k, InferenceRequest* out) {
  if (absl::Status header = HeaderFromSoftmaxV1(*request, out); !header.ok()) return header;
  std::string* data = request->mutable_input()->mutable_data();
  out->input.data = data->data();
  out->input.bytes = static_cast<int64_t>(data->size());
  out->input.buffer = data;
  out->output.buffer = response->mutable_output()->mutable_data();
  out->output.view = view;
  out->output.top_k = top_k;
  // The answer's fields that come from the request, set here, where the
  // request was just parsed: the thread that answers reads none of it.
  response->set_request_id(request->request_id());
  if (out->top_k == 0 || out->full_output) {
    v1::Tensor* output = response->mutable_output();
    output->set_dtype(request->input().dtype());
    output->mutable_shape()->CopyFrom(request->input().shape());
  }
  if (out->top_k > 0) {
    response->mutable_top_k()->mutable_values()->set_dtype(request->input().dtype());
  }
  return absl::OkStatus();
}

void FinishSoftmaxV1Response(const RequestTiming& timing, TopKResult* top_k,
                             v1::SoftmaxResponse* response) {
  // The output's dtype was set by FromSoftmaxV1 only when it was asked for.
  if (response->output().dtype() == v1::DTYPE_UNSPECIFIED) response->clear_output();
  v1::Timing* out = response->mutable_timing();
  out->set_queue_ns(timing.queue_ns);
  out->set_compute_ns(timing.compute_ns);
  out->set_batch_requests(timing.batch_requests);
  out->set_batch_rows(timing.batch_rows);
  out->set_kernel_ns(timing.kernel_ns);
  out->set_dispatch_ns(timing.dispatch_ns);
  if (response->has_top_k() && top_k != nullptr) {
    v1::TopK* answer = response->mutable_top_k();
    v1::Tensor* values = answer->mutable_values();
    values->mutable_shape()->Add(top_k->dims.begin(), top_k->dims.end());
    values->mutable_data()->swap(top_k->values);
    answer->mutable_indices()->swap(top_k->indices);
  }
}

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

}  // namespace softmax::server
