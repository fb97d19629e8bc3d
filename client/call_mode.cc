#include "client/call_mode.h"

#include <iostream>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/exit_codes.h"
#include "client/npy.h"
#include "client/summary.h"
#include "client/tensor.h"
#include "kernels/cpu_softmax.h"

namespace softmax::client {

namespace {

// The reference's options for --check.
SoftmaxOptions ReferenceOptions(const CallModeOptions& options) {
  SoftmaxOptions softmax_options;
  softmax_options.temperature = options.temperature;
  softmax_options.log = options.log;
  return softmax_options;
}

// Prints --check's verdict on `comparison`: `checked` names what its
// elements are, `also` what else counts as a mismatch, `element` one of them
// in the failure line. Returns the exit code.
int ReportCheck(const Comparison& comparison, v1::DType dtype, absl::string_view checked,
                absl::string_view also, absl::string_view element) {
  std::cout << "check:      " << comparison.mismatches << " of " << comparison.elements << " "
            << checked << " outside |y-ref| <= 1e-6 + " << RelativeTolerance(dtype) << "*|ref|"
            << also << "; max abs error " << comparison.max_abs_error << "\n";
  if (comparison.mismatches > 0) {
    std::cerr << "softmax-client: check failed at " << element << " "
              << comparison.first_mismatch << ": expected " << comparison.first_expected
              << ", got " << comparison.first_actual << "\n";
    return kExitCheckFailed;
  }
  return kExitOk;
}

// The rest of RunCallMode for a top K answer: its ranking and --check.
int FinishTopK(const CallModeOptions& options, const v1::Tensor& input,
               const v1::SoftmaxResponse& response, const SoftmaxShape& view,
               absl::Duration round_trip) {
  if (absl::Status bytes = CheckTopKBytes(response.top_k(), input.dtype(), view, options.top_k);
      !bytes.ok()) {
    return ExitWithStatus(kExitRpcFailed,
                          absl::DataLossError(absl::StrCat("server returned a malformed top K: ",
                                                           bytes.message())));
  }
  std::cout << FormatTopKSummary(response, view, options.top_k, round_trip);
  if (!options.check) return kExitOk;
  return ReportCheck(CompareTopKWithReference(input, response.top_k(), view, options.top_k,
                                              ReferenceOptions(options)),
                     input.dtype(), "top-K values", " or ranked below a left-out index",
                     "top-K element");
}

}  // namespace

int RunCallMode(const CallModeOptions& options) {
  if (options.top_k > 0 && !options.output_path.empty()) {
    return ExitWithStatus(kExitUsage,
                          absl::InvalidArgumentError(
                              "--output: with --top_k there is no whole output to write"));
  }
  v1::SoftmaxRequest request;
  request.set_request_id(options.request_id);
  if (options.input_path.empty()) {
    RandomTensorOptions random;
    random.shape = options.shape;
    random.dtype = options.dtype.value_or(v1::DTYPE_FLOAT32);
    random.seed = options.seed;
    absl::StatusOr<v1::Tensor> tensor = MakeRandomTensor(random);
    if (!tensor.ok()) return ExitWithStatus(kExitUsage, tensor.status());
    *request.mutable_input() = *std::move(tensor);
  } else {
    absl::StatusOr<NpyArray> array = ReadNpyFile(options.input_path);
    if (!array.ok()) return ExitWithStatus(kExitUsage, array.status());
    absl::StatusOr<v1::Tensor> tensor = TensorFromNpy(*array, options.dtype);
    if (!tensor.ok()) return ExitWithStatus(kExitUsage, tensor.status());
    *request.mutable_input() = *std::move(tensor);
  }
  request.set_axis(options.axis);
  request.set_temperature(options.temperature);
  request.set_log(options.log);
  request.set_top_k(options.top_k);

  const v1::Tensor& input = request.input();
  std::cout << "input:      " << FormatShape(ShapeOf(input)) << " " << WireDTypeName(input.dtype())
            << " axis " << options.axis << " temperature " << options.temperature
            << (options.log ? " log" : "") << (options.call.stream ? " (stream)" : "")
            << (options.top_k > 0 ? absl::StrCat(" top_k ", options.top_k) : "") << "\n";

  std::shared_ptr<grpc::Channel> channel = CreateChannel(options.channel);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::SoftmaxResponse> response = CallSoftmax(channel, request, options.call);
  const absl::Duration round_trip = absl::Now() - start;
  if (!response.ok()) return ExitWithStatus(kExitRpcFailed, response.status());

  // The server validated the request, so the axis is in range here; a client
  // that lets a bad axis through still prints a summary of the flat output.
  absl::StatusOr<SoftmaxShape> view = ShapeAlongAxis(ShapeOf(input), options.axis);
  if (!view.ok()) return ExitWithStatus(kExitUsage, view.status());
  if (options.top_k > 0) return FinishTopK(options, input, *response, *view, round_trip);
  if (absl::Status bytes = CheckTensorBytes(response->output()); !bytes.ok()) {
    return ExitWithStatus(kExitRpcFailed,
                          absl::DataLossError(absl::StrCat("server returned a malformed output: ",
                                                           bytes.message())));
  }
  if (response->output().dtype() != input.dtype() ||
      ShapeOf(response->output()) != ShapeOf(input)) {
    return ExitWithStatus(kExitRpcFailed,
                          absl::DataLossError("output dtype or shape differs from input"));
  }
  std::cout << FormatSummary(*response, *view, options.log, round_trip);

  if (!options.output_path.empty()) {
    absl::Status written = WriteNpyFile(options.output_path, NpyFromTensor(response->output()));
    if (!written.ok()) return ExitWithStatus(kExitUsage, written);
    std::cout << "wrote:      " << options.output_path
              << (response->output().dtype() == v1::DTYPE_BFLOAT16
                      ? " ('<u2' holding bfloat16 bits)"
                      : "")
              << "\n";
  }

  if (!options.check) return kExitOk;
  return ReportCheck(
      CompareWithReference(input, response->output(), *view, ReferenceOptions(options)),
      input.dtype(), "elements", "", "element");
}

}  // namespace softmax::client
