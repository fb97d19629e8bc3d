// ChunkAssembler: puts together the chunked requests of one SoftmaxStream
// (the rules are in proto/softmax/v1/softmax.proto, SoftmaxRequest's
// chunk_offset and more_chunks).
//
// A stream's messages are offered in the order they were read. The first
// chunk of a tensor is kept, with what the caller keeps beside it (`Held`:
// its stream entry and completion), and the data of every later chunk is
// appended to it, into one buffer sized from the shape at the first chunk
// (from the TensorBufferPool when it is large), or straight into a backend's
// staging when the caller's `stage` gives some (Backend::AllocateStaging:
// the GPU's pinned memory, which then needs no copy at admission). The
// tensor's input and output bytes are reserved through `reserve`
// (Admission::Reserve) from the first chunk on; the lease goes with the
// completed request to its submission (dispatch.h). Every malformed sequence
// yields exactly one error, for the request it belongs to; later chunks of a
// failed request_id are dropped, without a response, up to its last chunk.
//
// Thread-safety: not thread-safe. One per stream, used by its read path,
// which gRPC runs one read at a time.
#ifndef SOFTMAX_SERVER_RPC_GRPC_CHUNK_ASSEMBLER_H_
#define SOFTMAX_SERVER_RPC_GRPC_CHUNK_ASSEMBLER_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/chunk_wire.h"
#include "server/rpc/tensor_buffer_pool.h"
#include "server/rpc/softmax_v1.h"
#include "server/rpc/validation.h"
#include "server/scheduling/backend.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::server {

// Tensors one stream may have partly assembled at once: enough for a caller
// to interleave several big tensors, few enough that a stream cannot hold
// more than this many times --max_tensor_bytes when no budget is set.
inline constexpr int kMaxAssemblingTensorsPerStream = 16;
// Failed request_ids a stream remembers, to drop their later chunks without
// a response each (an id costs at most kMaxRequestIdBytes).
inline constexpr int kMaxFailedChunkedIdsPerStream = 1024;

// True when `request` is part of a chunked request (not a whole one).
inline bool IsChunk(const v1::SoftmaxRequest& request) {
  return request.chunk_offset() != 0 || request.more_chunks();
}

template <typename Held>
class ChunkAssembler {
 public:
  enum class Kind {
    kWhole,     // not a chunk: handle the message as an ordinary request
    kStarted,   // a first chunk: the message and its Held are kept
    kAppended,  // a later chunk, appended: no response of its own
    kComplete,  // the last chunk, appended: `owner`'s request is whole
    kFailed,    // `error` is the one response of this request (see owner)
    kDropped,   // a later chunk of a request that failed: no response
  };
  struct Step {
    Kind kind = Kind::kWhole;
    absl::Status error;  // kFailed
    // kComplete, and kFailed of a tensor started earlier: the first chunk's
    // Held, to be dispatched or answered with `error`. For kFailed without
    // an owner, the offered message's own Held gets the error.
    std::optional<Held> owner;
    int64_t largest_chunk = 0;           // kComplete: bytes of its largest chunk
    std::shared_ptr<const void> lease;   // kComplete: its share of the budget
    // kComplete: where the tensor was assembled when `stage` gave memory
    // (the owner's request then holds no data); empty otherwise.
    StagingBuffer staged;
  };
  // Memory for a tensor of the given bytes, or StagingBuffer{} for none.
  using Stage = std::function<StagingBuffer(int64_t bytes)>;

  // A tensor's share of the memory budget (Admission::Reserve): a lease,
  // null when there is no budget, or the refusal.
  using Reserve = std::function<absl::StatusOr<std::shared_ptr<const void>>(int64_t bytes)>;

  // `pool` may be null and must outlive the assembler. `reserve` and
  // `stage` may be empty (no budget; every tensor is assembled in its
  // request).
  ChunkAssembler(const RequestLimits& limits, Reserve reserve, TensorBufferPool* pool,
                 Stage stage = nullptr)
      : limits_(limits), reserve_(std::move(reserve)), pool_(pool), stage_(std::move(stage)) {}

  // Offers the stream's next message. `request` is the message, parsed; for
  // kStarted, `*held` is moved into the assembler and `request` must stay
  // valid as long as it (it lives inside what `held` owns). For every other
  // kind `held` is left to the caller.
  Step Offer(v1::SoftmaxRequest* request, Held* held) {
    const std::string& id = request->request_id();
    if (auto it = assembling_.find(id); it != assembling_.end()) {
      return Continue(it, request);
    }
    if (auto it = failed_.find(id); it != failed_.end()) {
      // A message at offset 0 starts afresh (a whole request or a new first
      // chunk); anything else belongs to the failed sequence.
      const bool later_chunk = request->chunk_offset() != 0;
      if (!later_chunk || !request->more_chunks()) failed_.erase(it);
      if (later_chunk) return Of(Kind::kDropped);
    }
    if (!IsChunk(*request)) return Of(Kind::kWhole);
    if (id.empty()) return Fail(request, "request_id: required on a chunked request");
    if (request->chunk_offset() != 0) {
      return Fail(request, absl::StrCat("chunk_offset: ", request->chunk_offset(),
                                        ", but request_id \"", Printable(id),
                                        "\" has no tensor being assembled on this stream "
                                        "(its first chunk must have chunk_offset 0; or it is "
                                        "already complete)"));
    }
    if (static_cast<int>(assembling_.size()) >= kMaxAssemblingTensorsPerStream) {
      return Fail(request, absl::StrCat("more_chunks: this stream already has ",
                                        kMaxAssemblingTensorsPerStream,
                                        " chunked tensors being assembled; send their last "
                                        "chunks first"));
    }
    InferenceRequest header;
    absl::Status checked = HeaderFromSoftmaxV1(*request, &header);
    if (checked.ok()) checked = ValidateHeader(&header, limits_, kSoftmaxV1Fields);
    if (!checked.ok()) return Fail(request, checked);
    const int64_t total = header.tensor.bytes;
    const int64_t first = static_cast<int64_t>(request->input().data().size());
    if (first > total) return Fail(request, Beyond(id, 0, first, total));
    std::shared_ptr<const void> lease;
    if (reserve_) {
      absl::StatusOr<std::shared_ptr<const void>> reserved = reserve_(2 * total);
      if (!reserved.ok()) return Fail(request, reserved.status());
      lease = *std::move(reserved);
    }
    StagingBuffer staging = stage_ ? stage_(total) : StagingBuffer{};
    std::string* field = request->mutable_input()->mutable_data();
    if (staging.data != nullptr && staging.bytes >= total) {
      std::memcpy(staging.data, field->data(), static_cast<size_t>(first));
      field->clear();
      staging.bytes = total;
    } else {
      staging = StagingBuffer{};
      std::string data =
          pool_ != nullptr ? pool_->Take(static_cast<size_t>(total)) : std::string();
      data.reserve(static_cast<size_t>(total));
      data.append(*field);
      field->swap(data);
      if (pool_ != nullptr) pool_->Give(std::move(data));
    }
    Assembly assembly{std::move(*held), request,          std::move(lease), total,
                      first,            first,            std::move(staging)};
    assembling_.emplace(id, std::move(assembly));
    return Of(Kind::kStarted);
  }

  // Offers a later chunk read without a full parse (ReadLaterChunk): its
  // data is copied from where it lies. Nothing when its request_id has no
  // tensor being assembled: the caller then parses the message and Offers
  // it, which handles the rest (failed ids, errors).
  std::optional<Step> OfferLater(const ChunkView& chunk) {
    auto it = assembling_.find(chunk.request_id);
    if (it == assembling_.end()) return std::nullopt;
    return Continue(it, chunk.chunk_offset, chunk.data_bytes, chunk.more_chunks,
                    /*header_fields=*/false, chunk);
  }

  // The stream's reads ended: one kFailed step (with its owner) for every
  // tensor still being assembled.
  std::vector<Step> End() {
    std::vector<Step> steps;
    for (auto& [id, assembly] : assembling_) {
      Step step = Of(Kind::kFailed);
      step.error = absl::InvalidArgumentError(absl::StrCat(
          "more_chunks: the stream ended after ", assembly.received, " of the ", assembly.total,
          " bytes of request_id \"", Printable(id), "\""));
      step.owner.emplace(std::move(assembly.held));
      steps.push_back(std::move(step));
    }
    assembling_.clear();
    failed_.clear();
    return steps;
  }

  int assembling() const { return static_cast<int>(assembling_.size()); }

 private:
  struct Assembly {
    Held held;
    v1::SoftmaxRequest* request;  // the first chunk's, inside `held`
    std::shared_ptr<const void> lease;
    int64_t total;     // bytes the tensor must have
    int64_t received;  // bytes appended so far
    int64_t largest_chunk;
    StagingBuffer staging;  // data null: assembled in request's input.data
  };
  using Map = absl::flat_hash_map<std::string, Assembly>;

  static Step Of(Kind kind) {
    Step step;
    step.kind = kind;
    return step;
  }

  // The data of a parsed chunk, in the shape of a ChunkView's.
  struct MessageData {
    absl::string_view data;
    void CopyTo(char* out) const { std::memcpy(out, data.data(), data.size()); }
    void AppendTo(std::string* out) const { out->append(data.data(), data.size()); }
  };

  Step Continue(typename Map::iterator it, v1::SoftmaxRequest* chunk) {
    const v1::Tensor& input = chunk->input();
    const bool header_fields = input.dtype() != v1::DTYPE_UNSPECIFIED || input.shape_size() > 0 ||
                               chunk->has_axis() || chunk->has_temperature() || chunk->log() ||
                               chunk->top_k() != 0 || chunk->full_output();
    return Continue(it, chunk->chunk_offset(), static_cast<int64_t>(input.data().size()),
                    chunk->more_chunks(), header_fields, MessageData{input.data()});
  }

  // `data` has CopyTo(char*) and AppendTo(std::string*) of its `bytes`.
  template <typename Data>
  Step Continue(typename Map::iterator it, int64_t offset, int64_t bytes, bool more,
                bool header_fields, const Data& data) {
    Assembly& assembly = it->second;
    const std::string& id = it->first;
    std::string problem;
    if (header_fields) {
      problem = absl::StrCat("chunk at chunk_offset ", offset, " of request_id \"",
                             Printable(id),
                             "\": input.dtype, input.shape, axis, temperature, log, top_k and "
                             "full_output belong on the first chunk only");
    } else if (offset != assembly.received) {
      problem = absl::StrCat("chunk_offset: ", offset, " for request_id \"", Printable(id),
                             "\", expected ", assembly.received,
                             " (chunks must follow each other without gaps or overlaps)");
    } else if (bytes > assembly.total - assembly.received) {
      problem = Beyond(id, offset, bytes, assembly.total);
    } else if (!more && assembly.received + bytes != assembly.total) {
      problem = absl::StrCat("more_chunks: false after ", assembly.received + bytes, " of the ",
                             assembly.total, " bytes of request_id \"", Printable(id), "\"");
    }
    if (!problem.empty()) {
      Step step = Of(Kind::kFailed);
      step.error = absl::InvalidArgumentError(problem);
      step.owner.emplace(std::move(assembly.held));
      std::string failed_id = id;
      assembling_.erase(it);
      if (more) Remember(std::move(failed_id));
      return step;
    }
    if (assembly.staging.data != nullptr) {
      data.CopyTo(assembly.staging.data + assembly.received);
    } else {
      data.AppendTo(assembly.request->mutable_input()->mutable_data());
    }
    assembly.received += bytes;
    assembly.largest_chunk = std::max(assembly.largest_chunk, bytes);
    if (more) return Of(Kind::kAppended);
    Step step = Of(Kind::kComplete);
    step.owner.emplace(std::move(assembly.held));
    step.largest_chunk = assembly.largest_chunk;
    step.lease = std::move(assembly.lease);
    step.staged = std::move(assembly.staging);
    assembling_.erase(it);
    return step;
  }

  Step Fail(const v1::SoftmaxRequest* request, absl::Status status) {
    // Later chunks of this id are dropped up to its last (not for an empty
    // id, which cannot be told apart from other callers' whole requests).
    if (request->more_chunks() && !request->request_id().empty()) {
      Remember(request->request_id());
    }
    Step step = Of(Kind::kFailed);
    step.error = std::move(status);
    return step;
  }
  Step Fail(const v1::SoftmaxRequest* request, const std::string& message) {
    return Fail(request, absl::InvalidArgumentError(message));
  }

  void Remember(std::string id) {
    if (static_cast<int>(failed_.size()) < kMaxFailedChunkedIdsPerStream) {
      failed_.insert(std::move(id));
    }
  }

  static std::string Beyond(const std::string& id, int64_t offset, int64_t bytes,
                            int64_t total) {
    return absl::StrCat("input.data: chunk of ", bytes, " bytes at chunk_offset ", offset,
                        " of request_id \"", Printable(id), "\" goes beyond the ", total,
                        " bytes of its shape");
  }

  // An id as an error message may quote it (the response echoes only valid ones).
  static std::string Printable(const std::string& id) {
    return id.size() <= kMaxRequestIdBytes && IsValidUtf8(id) ? id : "(invalid)";
  }

  const RequestLimits limits_;
  const Reserve reserve_;
  TensorBufferPool* const pool_;
  const Stage stage_;
  Map assembling_;
  absl::flat_hash_set<std::string> failed_;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_GRPC_CHUNK_ASSEMBLER_H_
