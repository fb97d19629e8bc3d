// The Open Inference Protocol (KServe v2, with Triton's extensions): the part
// both front-ends share, free of any transport. The gRPC service
// (kserve_grpc.h) and the HTTP server (kserve_http.h) each turn their wire
// form into an InferRequestParts, call BuildInferenceRequest, and submit the
// result (dispatch.h): the same validation and Admission as every other
// protocol's, so requests of every protocol batch together.
//
// Models: `softmax` and `log_softmax` (and their `_fp16` / `_bf16`
// variants, see Model), version "1" (an empty version means "1"). One input of any name (metadata calls it INPUT), FP32 / FP16 / BF16,
// any shape; one output, OUTPUT, of the input's type and shape. Request
// parameters `axis` (int64, default -1), `temperature` (double, default 1)
// and `top_k` (TOP_K_VALUES and TOP_K_INDICES instead of OUTPUT); an
// output's `classification` (Triton's extension) answers OUTPUT as BYTES.
//
// Errors are absl::Status values naming the KServe field: INVALID_ARGUMENT
// for a bad request (validation.h names KServe's fields, FieldNamesFor),
// NOT_FOUND for an unknown model or version.
//
// Thread-safety: free functions are pure; ModelStatistics is thread-safe.
#ifndef SOFTMAX_SERVER_RPC_KSERVE_H_
#define SOFTMAX_SERVER_RPC_KSERVE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "inference/grpc_service.pb.h"
#include "kernels/dtype.h"
#include "server/metrics/metrics.h"
#include "server/rpc/validation.h"
#include "server/scheduling/inference_request.h"
#include "server/shm/shared_memory.h"

namespace softmax::server::kserve {

// What ServerMetadata and GET /v2 report.
inline constexpr char kServerName[] = "softmax-serve";
inline constexpr char kInputName[] = "INPUT";
inline constexpr char kOutputName[] = "OUTPUT";
// With the request parameter top_k: the K largest values of each row along
// the axis (the output's datatype) and their indices (INT64), shaped as the
// input with the axis K long, as softmax.v1's top_k answers them.
inline constexpr char kTopKValuesName[] = "TOP_K_VALUES";
inline constexpr char kTopKIndicesName[] = "TOP_K_INDICES";
inline constexpr char kModelVersion[] = "1";
inline constexpr char kPlatform[] = "softmax-serve";
// The extensions always served (Triton's names); see Extensions().
// Repository, trace and logging are not among them.
inline constexpr std::array<const char*, 4> kExtensions = {
    "binary_tensor_data", "classification", "model_configuration", "statistics"};

// The served models, indexing ModelStatistics. Every one accepts FP32,
// FP16 and BF16. `softmax` and `log_softmax` advertise FP32 in metadata and
// configuration; the `_fp16` / `_bf16` variants compute the same and
// advertise their type, for tools that generate inputs from the metadata
// (perf_analyzer), as a Triton deployment would serve one model per type.
enum class Model {
  kSoftmax = 0,
  kLogSoftmax = 1,
  kSoftmaxFp16 = 2,
  kLogSoftmaxFp16 = 3,
  kSoftmaxBf16 = 4,
  kLogSoftmaxBf16 = 5,
};
inline constexpr int kModelCount = 6;
inline constexpr std::array<Model, kModelCount> kModels = {
    Model::kSoftmax,     Model::kLogSoftmax,     Model::kSoftmaxFp16,
    Model::kLogSoftmaxFp16, Model::kSoftmaxBf16, Model::kLogSoftmaxBf16};
const char* ModelName(Model model);
// log_softmax (any variant) rather than softmax.
bool IsLog(Model model);
// The datatype metadata and configuration show for the model's tensors.
DType AdvertisedType(Model model);

// The model called `name` at `version` ("" or "1"); NOT_FOUND naming what is
// served otherwise.
absl::StatusOr<Model> FindModel(absl::string_view name, absl::string_view version);

// "FP32" / "FP16" / "BF16" <-> DType; INVALID_ARGUMENT naming `field` for
// any other datatype.
absl::StatusOr<DType> ParseDatatype(absl::string_view datatype, absl::string_view field);
const char* DatatypeName(DType dtype);

// A tensor's place in a shared-memory region: the parameters
// shared_memory_region, shared_memory_byte_size and shared_memory_offset.
struct RegionRef {
  std::string name;
  int64_t byte_size = 0;
  int64_t offset = 0;
  std::string field;  // its parameters on the wire, for messages
};

// The RegionRef of a tensor's parameters as read from the wire (each one
// when present); none when no region is named. INVALID_ARGUMENT naming
// `field` (e.g. "inputs[0].parameters") for a size or offset without a
// region, or a region without a size.
absl::StatusOr<std::optional<RegionRef>> MakeRegionRef(std::optional<std::string> region,
                                                       std::optional<int64_t> byte_size,
                                                       std::optional<int64_t> offset,
                                                       absl::string_view field);

// One inference request as either front-end extracted it.
struct InferRequestParts {
  std::string model_name;
  std::string model_version;
  std::string id;
  // How many input tensors the request carried: exactly one is accepted.
  int input_count = 0;
  std::string input_datatype;
  std::vector<int64_t> input_shape;
  // The input's bytes, little-endian row-major, gathered by the front-end
  // from raw or typed contents. The InferenceRequest's input is a view of
  // it (BuildInferenceRequest).
  std::string input_data;
  // The wire field that carried input_data, for messages (e.g.
  // "raw_input_contents[0]", "inputs[0].contents.fp32_contents").
  std::string data_field = "raw_input_contents[0]";
  // The names of the requested outputs (empty: all, i.e. OUTPUT).
  std::vector<std::string> requested_outputs;
  std::optional<int64_t> axis;
  std::optional<double> temperature;
  // The input read from, and the output written into, shared memory
  // (then input_data is empty, and the response carries no output bytes).
  std::optional<RegionRef> input_region;
  std::optional<RegionRef> output_region;
  // TOP_K_VALUES and TOP_K_INDICES written into shared memory (with top_k):
  // the response then carries their metadata without data.
  std::optional<RegionRef> top_k_values_region;
  std::optional<RegionRef> top_k_indices_region;
  // The requested output's `classification` parameter (Triton's
  // classification extension): answer the top K of each row as BYTES.
  std::optional<int64_t> classification;
  // The request parameter `top_k`: answer TOP_K_VALUES and TOP_K_INDICES.
  std::optional<int64_t> top_k;
};

// What one output of an answer holds.
enum class AnswerOutput {
  kOutput,          // OUTPUT: the whole softmax
  kClassification,  // OUTPUT as BYTES "<value>:<index>" (classification)
  kTopKValues,      // TOP_K_VALUES
  kTopKIndices,     // TOP_K_INDICES
};

// The outputs the answer to `parts` carries, in order: OUTPUT (as
// classification with that parameter) by default; with parameter top_k
// (> 0), TOP_K_VALUES and TOP_K_INDICES, or those of them the request
// names, in its order. INVALID_ARGUMENT naming the field for an unknown
// output, a TOP_K_* output without top_k, OUTPUT with top_k, or top_k
// with classification.
absl::StatusOr<std::vector<AnswerOutput>> AnswerOutputs(const InferRequestParts& parts);

// Records `region`, read from the parameters of the requested output
// `output_name`, in `parts`: TOP_K_VALUES' and TOP_K_INDICES' own regions,
// output_region for any other name (AnswerOutputs names unknown outputs).
void SetOutputRegion(absl::string_view output_name, RegionRef region, InferRequestParts* parts);

// Where TOP_K_VALUES and TOP_K_INDICES are written in the caller's shared
// memory (null: in the response), bound by BindRegions.
struct TopKRegions {
  char* values = nullptr;
  char* indices = nullptr;
};

// Looks up `parts`' regions in `shared_memory` (may be null: none served)
// and points `request`'s input or output, or `top_k_regions`, at them;
// `leases` keep the regions mapped until the request is answered. Call
// after BuildInferenceRequest. NOT_FOUND for an unknown region,
// INVALID_ARGUMENT for a range outside its region, a top K region smaller
// than its tensor (naming its shared_memory_byte_size) or in GPU memory
// (validation checks the output's size against the shape).
absl::Status BindRegions(const InferRequestParts& parts, const SharedMemoryManager* shared_memory,
                         InferenceRequest* request, TopKRegions* top_k_regions,
                         std::vector<std::shared_ptr<const void>>* leases);

// Copies `top_k`'s values and indices into the regions bound for them.
void WriteTopKRegions(const TopKResult& top_k, const TopKRegions& regions);

// One call of the system or CUDA shared-memory extension (register,
// unregister or status), as either front-end parsed it from its wire form.
struct SharedMemoryCall {
  enum class Action { kStatus, kRegister, kUnregister };
  Action action = Action::kStatus;
  SharedMemoryKind kind = SharedMemoryKind::kSystem;
  // The region; empty for unregister and status means every region of kind.
  std::string name;
  // Register's arguments: key and offset (system), raw_handle (the
  // cudaIpcMemHandle_t's bytes) and device (cuda), byte_size (both).
  std::string key;
  int64_t offset = 0;
  std::string raw_handle;
  int64_t device = 0;
  int64_t byte_size = 0;
};

// Runs `call` against `shared_memory` (null: shared memory is not served)
// and returns the regions a status call lists (empty for the others).
// UNIMPLEMENTED when shared memory is off (as Triton answers an extension it
// does not serve); otherwise SharedMemoryManager's errors.
absl::StatusOr<std::vector<SharedMemoryRegionStatus>> RunSharedMemoryCall(
    const SharedMemoryCall& call, SharedMemoryManager* shared_memory);

// The extensions ServerMetadata and GET /v2 list: kExtensions, and the
// shared-memory ones `shared_memory` allows.
std::vector<std::string> Extensions(const SharedMemoryManager* shared_memory);

// Checks what is KServe's own in `parts` (model, input count, datatype,
// requested outputs, parameter ranges) and fills `out` for submission
// (dispatch.h), which checks the rest (shape, byte count, limits) with
// FieldNamesFor(*parts). `*model` receives the model. out's id and input are
// views of `parts` (its input.buffer is &parts->input_data), which must
// live until the request is answered; its output is the caller's to point.
// On error the request must not be submitted.
absl::Status BuildInferenceRequest(InferRequestParts* parts, Model* model,
                                   InferenceRequest* out);

// KServe's names for the fields validation names, with `parts`' data field
// (the returned names view it).
FieldNames FieldNamesFor(const InferRequestParts& parts);

// Triton's classification extension: a requested output with parameter
// `classification` = K (> 0) is answered as a BYTES tensor of the input's
// shape with the axis's dimension replaced by min(K, the axis's length)
// ([rows, K] for a matrix), each element "<value>:<index>": the K largest
// values of the row along the axis (softmax.v1's top_k: ties lower index
// first) and their indices, the value written as Triton does
// (std::to_string of the value widened to float: "%f").
std::string ClassificationString(float value, int64_t index);

// The elements of `top_k`'s classification answer (values of `dtype`),
// row-major.
std::vector<std::string> ClassificationStrings(const TopKResult& top_k, DType dtype);

// The same as a BYTES tensor's bytes on the wire (raw_output_contents, HTTP
// binary data): each element as a 4-byte little-endian length and its bytes.
std::string SerializeBytesTensor(const std::vector<std::string>& elements);

// Typed contents -> little-endian bytes of `dtype`: FP32 takes fp32_contents
// only; FP16 / BF16 have no typed field and take raw contents only.
// INVALID_ARGUMENT naming `field` otherwise.
absl::StatusOr<std::string> BytesFromContents(const inference::InferTensorContents& contents,
                                              DType dtype, absl::string_view field);

// True when `contents` holds any value.
bool HasContents(const inference::InferTensorContents& contents);

// The metadata and configuration of `model`, as gRPC returns them (HTTP
// converts them to JSON).
inference::ModelMetadataResponse Metadata(Model model);
inference::ModelConfig Config(Model model);

// Per-model counts and cumulative durations (Triton's statistics extension)
// for requests of both KServe front-ends. softmax.v1 requests are not a
// model's and are not counted here (the Prometheus families count all).
class ModelStatistics {
 public:
  // A request answered OK: `total_ns` from receipt to answer, with the
  // batcher's timing.
  void RecordSuccess(Model model, int64_t total_ns, const RequestTiming& timing);
  // A request that failed after its model was known.
  void RecordFailure(Model model, int64_t total_ns);
  // The statistics of `model`, as ModelStatistics returns them.
  inference::ModelStatistics Get(Model model) const;

 private:
  struct Counters {
    std::atomic<uint64_t> success_count{0}, success_ns{0};
    std::atomic<uint64_t> fail_count{0}, fail_ns{0};
    std::atomic<uint64_t> queue_ns{0}, compute_ns{0};
    std::atomic<uint64_t> last_inference_ms{0};
  };
  std::array<Counters, kModelCount> models_;
};

// The HTTP status of a canonical code, as the KServe HTTP API uses them.
int HttpStatus(absl::StatusCode code);

}  // namespace softmax::server::kserve

#endif  // SOFTMAX_SERVER_RPC_KSERVE_H_
