// The payloads of a `softmax-client load` run, and the check of their answers.
//
// A run sends a few prebuilt requests over and over: BuildLoadPayloads makes
// `payloads_per_shape` random tensors per mix entry (one for an entry larger
// than kLargeLoadPayloadBytes), serialises each once for the run's protocol,
// and lays out the order requests take them in, so the hot path makes no
// random data and serialises nothing. With --verify each payload carries its
// float64 reference (kernels/cpu_softmax.h), which CheckLoadOutput compares an
// answer with, by the one-shot client's per-element rule and tolerances.
//
// Thread-safety: a LoadPayload is immutable once built and is read by every
// call of the run at once; BuildLoadPayloads and CheckLoadOutput are pure
// functions of their arguments.
#ifndef SOFTMAX_CLIENT_LOAD_PAYLOAD_H_
#define SOFTMAX_CLIENT_LOAD_PAYLOAD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/load/http.h"
#include "client/load/options.h"
#include "client/load/wire.h"
#include "kernels/cpu_softmax.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::client {

// Random tensors larger than this are built once per mix entry, not
// payloads_per_shape times.
inline constexpr int64_t kLargeLoadPayloadBytes = int64_t{16} << 20;
// Entries in the precomputed payload schedule; requests cycle through it.
inline constexpr int kLoadScheduleLength = 1000;

// One prebuilt request and what the checks and counters need to know about
// it. Not copyable (it owns its serialised forms); movable until the run
// starts, after which calls hold pointers to it.
struct LoadPayload {
  // request_id left empty; the input's data is cleared once serialised into
  // `prepared` (gRPC) or `http`, which is what calls send. Its dtype and shape
  // stay, for the checks and messages.
  v1::SoftmaxRequest request;
  // softmax.v1 without chunk_bytes, and kserve: the request as sent (on a
  // stream, with its id added).
  std::unique_ptr<const PreparedRequest> prepared;
  // With options.chunk_bytes: the request's chunks, sent instead of `prepared`.
  std::vector<std::unique_ptr<const PreparedRequest>> chunks;
  // --protocol=http: the request as sent.
  std::unique_ptr<const HttpPreparedRequest> http;
  SoftmaxShape view;             // [outer, n, inner] along the request's axis
  int64_t rows = 0;
  int64_t tensor_bytes = 0;      // input data bytes (the output has as many)
  std::vector<double> expected;  // ReferenceSoftmax of the input; with options.verify only
};

// Builds the payloads of every entry of options.shapes, seeded from
// options.seed upwards, each prepared for options.protocol, and fills
// `schedule` (cleared first) with kLoadScheduleLength indices into them: a
// smooth weighted round-robin, each entry in proportion to its weight, evenly
// interleaved, its copies cycled. `http_base_url` is ParseHttpTarget's, used
// with LoadProtocol::kHttp only. INVALID_ARGUMENT when an entry does not fit
// options.axis or is too large to build.
// REQUIRES: options.shapes is not empty and its weights are > 0
// (ValidateLoadOptions).
absl::StatusOr<std::vector<LoadPayload>> BuildLoadPayloads(const LoadOptions& options,
                                                           const std::string& http_base_url,
                                                           std::vector<uint32_t>* schedule);

// Compares `output`, an answer to `payload`, with the payload's reference:
// dtype, shape and size first, then every element by
// WithinReferenceTolerance. Returns an empty string when it matches, else
// what is wrong (the count of elements out of tolerance and the first).
// REQUIRES: `payload` was built with options.verify.
std::string CheckLoadOutput(const LoadPayload& payload, const v1::Tensor& output);

// The same for the answer of a payload with top_k: its values and indices
// by CompareTopK's rule (client/summary.h).
std::string CheckLoadTopK(const LoadPayload& payload, const v1::TopK& top_k);

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_LOAD_PAYLOAD_H_
