// What a `softmax-client load` run is asked to do: the LoadOptions struct, the
// grammar of its payload mix ("1x1024:float32:3,8x4096:float16:1"), the
// arrival process as a flag type, and the validation of a whole set of
// options. The flags themselves are defined in client/main.cc, which fills a
// LoadOptions with these helpers; nothing here reads a flag.
//
// Thread-safety: plain values and pure functions; safe to call concurrently.
// ReadLoadMixFile reads the file system.
#ifndef SOFTMAX_CLIENT_LOAD_OPTIONS_H_
#define SOFTMAX_CLIENT_LOAD_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::client {

// One entry of the payload mix: tensors of `dims` and `dtype`, sent with
// relative frequency `weight`.
struct LoadShape {
  std::vector<int64_t> dims;
  v1::DType dtype = v1::DTYPE_FLOAT32;
  double weight = 1.0;  // relative frequency; finite and > 0
};

// Parses one mix entry "DIMS:DTYPE[:WEIGHT]", e.g. "8x4096:fp16:2.5". DIMS is
// ParseShape's grammar (client/tensor.h: "8x4096", "1x16M"); DTYPE is
// ParseDType's; WEIGHT defaults to 1. INVALID_ARGUMENT, naming the entry, on
// any error, including a missing dtype (so that "2,1024:fp16" split on its
// comma is refused instead of read as two entries).
absl::StatusOr<LoadShape> ParseLoadShape(absl::string_view text);

// Parses a comma-separated list of entries, e.g.
// "1x1024:float32:3,8x4096:float16:1". An empty list is INVALID_ARGUMENT.
absl::StatusOr<std::vector<LoadShape>> ParseLoadMix(absl::string_view text);

// Reads a mix file: one entry per line; blank lines and text after '#' are
// ignored. NOT_FOUND when the file cannot be opened; INVALID_ARGUMENT (naming
// path:line) for a bad entry or a file without entries.
absl::StatusOr<std::vector<LoadShape>> ReadLoadMixFile(const std::string& path);

// "1x1024:float32:3": the canonical label of an entry, as the reports print it.
std::string FormatLoadShape(const LoadShape& shape);

// How an open loop spaces its requests.
enum class Arrival {
  kConstant,  // exactly 1/rate apart: the least noisy offered load
  kPoisson,   // exponential gaps with mean 1/rate: independent callers
};

// "constant" | "poisson". Abseil flags find these by argument-dependent
// lookup, so Arrival can be the type of a flag.
bool AbslParseFlag(absl::string_view text, Arrival* arrival, std::string* error);
std::string AbslUnparseFlag(Arrival arrival);

// The API a load run calls.
enum class LoadProtocol {
  kSoftmaxV1,  // softmax.v1.SoftmaxService (Softmax, SoftmaxStream)
  kKserve,     // inference.GRPCInferenceService (ModelInfer, ModelStreamInfer)
  // POST /v2/models/{model}/infer, the Open Inference Protocol's HTTP/REST
  // endpoint, with binary tensor data both ways (client/load/http_wire.h),
  // over keep-alive HTTP/1.1 connections, one request at a time each.
  kHttp,
};

// "softmax.v1" | "kserve" | "http", for the --protocol flag.
bool AbslParseFlag(absl::string_view text, LoadProtocol* protocol, std::string* error);
std::string AbslUnparseFlag(LoadProtocol protocol);

// Everything that defines a load run. The defaults are those of a library
// caller; the command line's defaults are its flags' (client/main.cc), whose
// help texts say what each field means to a user.
struct LoadOptions {
  // host:port of the server's gRPC port, or of its HTTP port (--http_address)
  // with LoadProtocol::kHttp.
  std::string target = "localhost:50051";
  // Send/receive message size limit of every channel; with kHttp, the
  // largest response body accepted.
  int32_t max_message_bytes = INT32_MAX;
  // Channels, each its own TCP connection. A closed loop uses at most
  // `concurrency` of them. With kHttp each carries one request at a time and
  // requests beyond `connections` wait for the next free one.
  int connections = 1;
  // Closed loop: requests in flight at all times. Ignored when rate > 0.
  int concurrency = 1;
  // Open loop when > 0: requests per second offered regardless of progress;
  // latency counts from each request's intended send time.
  double rate = 0.0;
  Arrival arrival = Arrival::kConstant;
  // Open loop: sending pauses at this many requests in flight (the intended
  // times keep running, so the pause shows in latency). Bounds client memory.
  int max_outstanding = 100000;
  // Measured phase; sending stops at this or at `requests`, whichever comes
  // first. absl::InfiniteDuration() needs requests > 0.
  absl::Duration duration = absl::Seconds(10);
  // Measured requests to send; 0 = no limit.
  int64_t requests = 0;
  // Requests intended during this leading interval are left out of the
  // figures (still verified, and counted as warmup_*).
  absl::Duration warmup = absl::Seconds(1);
  LoadProtocol protocol = LoadProtocol::kSoftmaxV1;
  // true: one stream per connection (SoftmaxStream, or ModelStreamInfer with
  // kKserve), reopened when the server ends it; false: unary calls.
  bool stream = false;
  // With `stream` and kSoftmaxV1: > 0 sends each tensor in chunks of at most
  // this many bytes and reassembles the chunked answer; 0 sends it whole.
  int64_t chunk_bytes = 0;
  // The payload mix; at least one entry.
  std::vector<LoadShape> shapes;
  // Distinct random tensors per entry, cycled through; entries of more than
  // 16 MiB get one, to bound client memory.
  int payloads_per_shape = 4;
  uint64_t seed = 1;
  // Request fields sent with every payload.
  int axis = -1;
  float temperature = 1.0f;
  bool log = false;
  // > 0: ask for the K largest values of each row only (softmax.v1's top_k;
  // kSoftmaxV1 only), and verify those.
  int64_t top_k = 0;
  // Check every response against a float64 CPU reference (precomputed per
  // payload) with |y - ref| <= 1e-6 + rtol * |ref|. Costs client CPU.
  bool verify = false;
  // Per-call deadline; absl::InfiniteDuration() for none.
  absl::Duration timeout = absl::Seconds(60);
  // How long to wait for every connection before giving up.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Free text copied into the JSON and CSV reports (e.g. the server's device).
  std::string label;
};

// OK when `options` can be run; otherwise INVALID_ARGUMENT naming the
// command-line flag of the offending field (e.g. "--concurrency must be >= 1").
absl::Status ValidateLoadOptions(const LoadOptions& options);

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_LOAD_OPTIONS_H_
