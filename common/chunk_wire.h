// ReadLaterChunk: reads a later chunk of a tensor sent in chunks
// (softmax.v1's SoftmaxRequest and SoftmaxResponse, chunk_offset > 0)
// straight from the message's gRPC slices, handing out its data as the
// pieces where they lie instead of a string of their own. The receiver then
// copies each byte once, into where the tensor is assembled; protobuf's
// parser would first copy it into the message. The H200 echo of 64 MiB in
// chunks of 1 MiB spent 27% of its samples in memcpy so, 18% this way.
//
// Only the plain shape of a later chunk is read so: request_id, the tensor
// (input / output) holding nothing but data, chunk_offset and more_chunks,
// each at most once. Anything else (other fields, a first chunk, bytes that
// do not parse) returns false and the caller parses the message in full,
// which gives every other case its usual handling and error. The slices
// are the message's own bytes: the server enables no compression
// (server/rpc/grpc/grpc_server.cc), so none reaches it or its callers compressed.
#ifndef SOFTMAX_COMMON_CHUNK_WIRE_H_
#define SOFTMAX_COMMON_CHUNK_WIRE_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/strings/string_view.h"

namespace softmax {

// Field numbers of a chunk's message type (softmax.proto).
struct ChunkFields {
  uint32_t request_id;
  uint32_t tensor;  // input (requests) or output (responses)
  uint32_t data;    // Tensor.data
  uint32_t chunk_offset;
  uint32_t more_chunks;
};
inline constexpr ChunkFields kRequestChunkFields{1, 2, 3, 6, 7};
inline constexpr ChunkFields kResponseChunkFields{1, 2, 3, 5, 6};

// A request_id longer than this is not read here (the full parse rejects it).
inline constexpr uint64_t kMaxChunkIdBytes = 1024;

struct ChunkView {
  std::vector<grpc::Slice> slices;  // the message's; `data` points into them
  std::string request_id;
  int64_t chunk_offset = 0;
  bool more_chunks = false;
  std::vector<absl::string_view> data;  // the tensor's data, in order
  int64_t data_bytes = 0;

  // Copies the data to `out`, which has room for data_bytes.
  void CopyTo(char* out) const {
    for (absl::string_view piece : data) {
      std::memcpy(out, piece.data(), piece.size());
      out += piece.size();
    }
  }
  void AppendTo(std::string* out) const {
    for (absl::string_view piece : data) out->append(piece.data(), piece.size());
  }
};

namespace chunk_wire_internal {

// Protobuf's wire format over a sequence of slices.
class Cursor {
 public:
  explicit Cursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {}

  uint64_t consumed() const { return consumed_; }

  bool Varint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte = 0;
      if (!Byte(&byte)) return false;
      *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  // The next `length` bytes, as pieces of the slices.
  bool Pieces(uint64_t length, std::vector<absl::string_view>* out) {
    while (length > 0) {
      if (!Available()) return false;
      const grpc::Slice& slice = slices_[index_];
      const size_t take = static_cast<size_t>(std::min<uint64_t>(length, slice.size() - position_));
      out->emplace_back(reinterpret_cast<const char*>(slice.begin()) + position_, take);
      position_ += take;
      consumed_ += take;
      length -= take;
    }
    return true;
  }

 private:
  bool Available() {
    while (index_ < slices_.size() && position_ == slices_[index_].size()) {
      ++index_;
      position_ = 0;
    }
    return index_ < slices_.size();
  }
  bool Byte(uint8_t* byte) {
    if (!Available()) return false;
    *byte = slices_[index_].begin()[position_++];
    ++consumed_;
    return true;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t position_ = 0;
  uint64_t consumed_ = 0;
};

constexpr uint32_t kVarint = 0;
constexpr uint32_t kLengthDelimited = 2;

}  // namespace chunk_wire_internal

// True when `buffer` is a later chunk of the plain shape above; then `view`
// holds it (and references to the buffer's slices). `buffer` is not consumed.
inline bool ReadLaterChunk(const grpc::ByteBuffer& buffer, const ChunkFields& fields,
                           ChunkView* view) {
  using chunk_wire_internal::kLengthDelimited;
  using chunk_wire_internal::kVarint;
  *view = ChunkView{};
  if (!buffer.Valid() || !buffer.Dump(&view->slices).ok()) return false;
  const uint64_t total = buffer.Length();
  chunk_wire_internal::Cursor cursor(view->slices);
  bool seen_id = false, seen_tensor = false, seen_offset = false, seen_more = false;
  std::vector<absl::string_view> pieces;
  while (cursor.consumed() < total) {
    uint64_t tag = 0;
    if (!cursor.Varint(&tag)) return false;
    const uint64_t field = tag >> 3;
    const uint32_t wire_type = static_cast<uint32_t>(tag & 7);
    uint64_t value = 0;
    if (field == fields.request_id && wire_type == kLengthDelimited && !seen_id) {
      seen_id = true;
      if (!cursor.Varint(&value) || value > kMaxChunkIdBytes) return false;
      pieces.clear();
      if (!cursor.Pieces(value, &pieces)) return false;
      for (absl::string_view piece : pieces) view->request_id.append(piece.data(), piece.size());
    } else if (field == fields.tensor && wire_type == kLengthDelimited && !seen_tensor) {
      seen_tensor = true;
      if (!cursor.Varint(&value) || value > total - cursor.consumed()) return false;
      const uint64_t end = cursor.consumed() + value;
      if (value == 0) continue;  // a tensor with no data
      uint64_t inner = 0, length = 0;
      if (!cursor.Varint(&inner) || inner != (uint64_t{fields.data} << 3 | kLengthDelimited) ||
          !cursor.Varint(&length) || cursor.consumed() + length != end ||
          !cursor.Pieces(length, &view->data)) {
        return false;
      }
      view->data_bytes = static_cast<int64_t>(length);
    } else if (field == fields.chunk_offset && wire_type == kVarint && !seen_offset) {
      seen_offset = true;
      if (!cursor.Varint(&value)) return false;
      view->chunk_offset = static_cast<int64_t>(value);
    } else if (field == fields.more_chunks && wire_type == kVarint && !seen_more) {
      seen_more = true;
      if (!cursor.Varint(&value)) return false;
      view->more_chunks = value != 0;
    } else {
      return false;
    }
  }
  return cursor.consumed() == total && view->chunk_offset > 0;
}

}  // namespace softmax

#endif  // SOFTMAX_COMMON_CHUNK_WIRE_H_
