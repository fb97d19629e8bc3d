#include "server/rpc/grpc/chunk_assembler.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "server/scheduling/admission.h"

namespace softmax::server {
namespace {

// What a test keeps with a first chunk: the message itself.
using Held = std::unique_ptr<v1::SoftmaxRequest>;
using Assembler = ChunkAssembler<Held>;
using Kind = Assembler::Kind;

constexpr int64_t kElements = 1000;  // float32: 4000 bytes

std::string Bytes(int64_t begin, int64_t end) {
  std::string bytes;
  for (int64_t i = begin; i < end; ++i) bytes.push_back(static_cast<char>(i * 7 + 3));
  return bytes;
}

Held First(const std::string& id, int64_t bytes, int64_t elements = kElements) {
  auto request = std::make_unique<v1::SoftmaxRequest>();
  request->set_request_id(id);
  request->mutable_input()->set_dtype(v1::DTYPE_FLOAT32);
  request->mutable_input()->add_shape(2);
  request->mutable_input()->add_shape(elements / 2);
  request->mutable_input()->set_data(Bytes(0, bytes));
  request->set_axis(1);
  request->set_temperature(2.0f);
  request->set_more_chunks(true);
  return request;
}

Held Later(const std::string& id, int64_t offset, int64_t end, bool more) {
  auto request = std::make_unique<v1::SoftmaxRequest>();
  request->set_request_id(id);
  request->mutable_input()->set_data(Bytes(offset, end));
  request->set_chunk_offset(offset);
  request->set_more_chunks(more);
  return request;
}

Assembler::Step Offer(Assembler& assembler, Held held) {
  v1::SoftmaxRequest* request = held.get();
  return assembler.Offer(request, &held);
}

void ExpectError(const Assembler::Step& step, absl::StatusCode code, const std::string& part,
                 bool owned) {
  ASSERT_EQ(step.kind, Kind::kFailed);
  EXPECT_EQ(step.error.code(), code) << step.error;
  EXPECT_NE(step.error.message().find(part), absl::string_view::npos) << step.error;
  EXPECT_EQ(step.owner.has_value(), owned);
}

class ChunkAssemblerTest : public ::testing::Test {
 protected:
  RequestLimits limits_;
  TensorBufferPool pool_{size_t{1} << 30};
  Assembler assembler_{limits_, nullptr, &pool_};
};

TEST_F(ChunkAssemblerTest, WholeRequestsPassThrough) {
  Held whole = First("a", 4000);
  whole->set_more_chunks(false);
  EXPECT_EQ(Offer(assembler_, std::move(whole)).kind, Kind::kWhole);
  EXPECT_EQ(assembler_.assembling(), 0);
}

TEST_F(ChunkAssemblerTest, AssemblesInterleavedTensors) {
  EXPECT_EQ(Offer(assembler_, First("a", 1000)).kind, Kind::kStarted);
  EXPECT_EQ(Offer(assembler_, First("b", 0)).kind, Kind::kStarted);
  Held whole = First("c", 4000);
  whole->set_more_chunks(false);
  EXPECT_EQ(Offer(assembler_, std::move(whole)).kind, Kind::kWhole);
  EXPECT_EQ(Offer(assembler_, Later("b", 0, 3000, true)).kind, Kind::kAppended);
  EXPECT_EQ(Offer(assembler_, Later("a", 1000, 2500, true)).kind, Kind::kAppended);
  EXPECT_EQ(assembler_.assembling(), 2);
  Assembler::Step a = Offer(assembler_, Later("a", 2500, 4000, false));
  ASSERT_EQ(a.kind, Kind::kComplete);
  ASSERT_TRUE(a.owner.has_value());
  const v1::SoftmaxRequest& request = **a.owner;
  EXPECT_EQ(request.input().data(), Bytes(0, 4000));
  EXPECT_EQ(request.axis(), 1);
  EXPECT_EQ(request.temperature(), 2.0f);
  EXPECT_EQ(a.largest_chunk, 1500);
  Assembler::Step b = Offer(assembler_, Later("b", 3000, 4000, false));
  ASSERT_EQ(b.kind, Kind::kComplete);
  EXPECT_EQ((*b.owner)->input().data(), Bytes(0, 4000));
  EXPECT_EQ(b.largest_chunk, 3000);
  EXPECT_EQ(assembler_.assembling(), 0);
}

TEST_F(ChunkAssemblerTest, GapFailsOnceAndDropsTheRest) {
  Offer(assembler_, First("a", 1000));
  ExpectError(Offer(assembler_, Later("a", 2000, 3000, true)),
              absl::StatusCode::kInvalidArgument, "expected 1000", /*owned=*/true);
  EXPECT_EQ(Offer(assembler_, Later("a", 3000, 3500, true)).kind, Kind::kDropped);
  EXPECT_EQ(Offer(assembler_, Later("a", 3500, 4000, false)).kind, Kind::kDropped);
  // The sequence is over: a new chunk at an offset > 0 is unknown again.
  ExpectError(Offer(assembler_, Later("a", 100, 200, true)), absl::StatusCode::kInvalidArgument,
              "no tensor being assembled", /*owned=*/false);
}

TEST_F(ChunkAssemblerTest, OverlapFails) {
  Offer(assembler_, First("a", 1000));
  ExpectError(Offer(assembler_, Later("a", 500, 1500, false)),
              absl::StatusCode::kInvalidArgument, "without gaps or overlaps", true);
  EXPECT_EQ(assembler_.assembling(), 0);
}

TEST_F(ChunkAssemblerTest, BytesBeyondTheShapeFail) {
  ExpectError(Offer(assembler_, First("a", 4001)), absl::StatusCode::kInvalidArgument,
              "beyond the 4000 bytes", false);
  Offer(assembler_, First("b", 1000));
  ExpectError(Offer(assembler_, Later("b", 1000, 4100, true)),
              absl::StatusCode::kInvalidArgument, "beyond the 4000 bytes", true);
}

TEST_F(ChunkAssemblerTest, TensorBeyondTheLimitFails) {
  limits_.max_tensor_bytes = 1000;
  Assembler assembler(limits_, nullptr, &pool_);
  ExpectError(Offer(assembler, First("a", 10)), absl::StatusCode::kInvalidArgument,
              "--max_tensor_bytes", false);
  EXPECT_EQ(Offer(assembler, Later("a", 10, 20, false)).kind, Kind::kDropped);
}

TEST_F(ChunkAssemblerTest, ShortLastChunkFails) {
  Offer(assembler_, First("a", 1000));
  ExpectError(Offer(assembler_, Later("a", 1000, 3999, false)),
              absl::StatusCode::kInvalidArgument, "more_chunks: false after 3999 of the 4000",
              true);
}

TEST_F(ChunkAssemblerTest, UnknownAndFinishedIdsFail) {
  ExpectError(Offer(assembler_, Later("x", 1000, 2000, false)),
              absl::StatusCode::kInvalidArgument, "no tensor being assembled", false);
  Offer(assembler_, First("a", 1000));
  ASSERT_EQ(Offer(assembler_, Later("a", 1000, 4000, false)).kind, Kind::kComplete);
  ExpectError(Offer(assembler_, Later("a", 4000, 4001, false)),
              absl::StatusCode::kInvalidArgument, "already complete", false);
}

TEST_F(ChunkAssemblerTest, HeaderFieldsOnLaterChunksFail) {
  Offer(assembler_, First("a", 1000));
  Held later = Later("a", 1000, 2000, true);
  later->set_log(true);
  ExpectError(Offer(assembler_, std::move(later)), absl::StatusCode::kInvalidArgument,
              "first chunk only", true);
}

TEST_F(ChunkAssemblerTest, ChunksNeedARequestId) {
  ExpectError(Offer(assembler_, First("", 1000)), absl::StatusCode::kInvalidArgument,
              "request_id", false);
}

TEST_F(ChunkAssemblerTest, StreamEndingMidTensorFailsEachOnce) {
  Offer(assembler_, First("a", 1000));
  Offer(assembler_, First("b", 1000));
  std::vector<Assembler::Step> ended = assembler_.End();
  ASSERT_EQ(ended.size(), 2u);
  for (const Assembler::Step& step : ended) {
    ExpectError(step, absl::StatusCode::kInvalidArgument, "the stream ended after 1000", true);
  }
  EXPECT_TRUE(assembler_.End().empty());
}

TEST_F(ChunkAssemblerTest, BoundsTensorsBeingAssembled) {
  for (int i = 0; i < kMaxAssemblingTensorsPerStream; ++i) {
    ASSERT_EQ(Offer(assembler_, First(absl::StrCat("t", i), 10)).kind, Kind::kStarted);
  }
  ExpectError(Offer(assembler_, First("one-too-many", 10)), absl::StatusCode::kInvalidArgument,
              "already has 16", false);
  // The others are unaffected.
  EXPECT_EQ(Offer(assembler_, Later("t0", 10, 4000, false)).kind, Kind::kComplete);
}

TEST_F(ChunkAssemblerTest, PartialBytesCountAgainstTheBudget) {
  MemoryBudget budget(10000);
  AdmissionOptions options;
  options.echo = true;
  options.budget = &budget;
  Admission admission(options, nullptr);
  Assembler assembler(
      limits_, [&admission](int64_t bytes) { return admission.Reserve(bytes); }, &pool_);
  ASSERT_EQ(Offer(assembler, First("a", 100)).kind, Kind::kStarted);
  EXPECT_EQ(budget.held(), 8000);  // input and output
  ExpectError(Offer(assembler, First("b", 100)), absl::StatusCode::kUnavailable,
              "--max_held_bytes", false);
  Assembler::Step done = Offer(assembler, Later("a", 100, 4000, false));
  ASSERT_EQ(done.kind, Kind::kComplete);
  EXPECT_EQ(budget.held(), 8000);  // now the request's, until it is answered
  done.lease.reset();
  EXPECT_EQ(budget.held(), 0);
  // A failed tensor gives its share back at once.
  Offer(assembler, First("c", 100));
  Offer(assembler, Later("c", 50, 60, true));
  EXPECT_EQ(budget.held(), 0);
}

TEST_F(ChunkAssemblerTest, LargeTensorsUseThePool) {
  const int64_t elements = int64_t{40} << 18;  // 40 MiB of float32
  Assembler::Step started = Offer(assembler_, First("big", 1 << 20, elements));
  ASSERT_EQ(started.kind, Kind::kStarted);
  Assembler::Step done =
      Offer(assembler_, Later("big", 1 << 20, elements * 4, false));
  ASSERT_EQ(done.kind, Kind::kComplete);
  std::string data = std::move(*(*done.owner)->mutable_input()->mutable_data());
  EXPECT_EQ(static_cast<int64_t>(data.size()), elements * 4);
  pool_.Give(std::move(data));
  EXPECT_EQ(pool_.idle_buffers(), 1u);  // taken from the pool, so kept by it
}

// A backend's staging, as the stage callback hands it out: counts the
// buffers alive, and gives none below `min_bytes`.
struct FakeStaging {
  int64_t min_bytes = 0;
  std::shared_ptr<int> alive = std::make_shared<int>(0);
  StagingBuffer operator()(int64_t bytes) const {
    if (bytes < min_bytes) return {};
    auto buffer = std::make_shared<std::vector<char>>(static_cast<size_t>(bytes), '\0');
    ++*alive;
    StagingBuffer staging;
    staging.data = buffer->data();
    staging.bytes = bytes;
    staging.owner = std::shared_ptr<const void>(
        buffer.get(), [buffer, alive = alive](const void*) mutable {
          --*alive;
          buffer.reset();
        });
    return staging;
  }
};

TEST_F(ChunkAssemblerTest, AssemblesIntoTheBackendsStaging) {
  FakeStaging staging;
  Assembler assembler(limits_, nullptr, &pool_, staging);
  ASSERT_EQ(Offer(assembler, First("a", 1000)).kind, Kind::kStarted);
  EXPECT_EQ(*staging.alive, 1);
  ASSERT_EQ(Offer(assembler, Later("a", 1000, 2500, true)).kind, Kind::kAppended);
  Assembler::Step done = Offer(assembler, Later("a", 2500, 4000, false));
  ASSERT_EQ(done.kind, Kind::kComplete);
  ASSERT_NE(done.staged.data, nullptr);
  EXPECT_EQ(done.staged.bytes, 4000);
  EXPECT_EQ(std::string(done.staged.data, 4000), Bytes(0, 4000));
  // The request carries the header only; its data is in the staging.
  EXPECT_TRUE((*done.owner)->input().data().empty());
  EXPECT_EQ((*done.owner)->input().shape_size(), 2);
  done.staged = StagingBuffer{};
  EXPECT_EQ(*staging.alive, 0);
}

TEST_F(ChunkAssemblerTest, FailedAndUnfinishedTensorsGiveTheirStagingBack) {
  FakeStaging staging;
  Assembler assembler(limits_, nullptr, &pool_, staging);
  Offer(assembler, First("gap", 1000));
  Offer(assembler, First("open", 1000));
  EXPECT_EQ(*staging.alive, 2);
  ExpectError(Offer(assembler, Later("gap", 1500, 2000, true)), absl::StatusCode::kInvalidArgument,
              "expected 1000", true);
  EXPECT_EQ(*staging.alive, 1);
  EXPECT_EQ(assembler.End().size(), 1u);
  EXPECT_EQ(*staging.alive, 0);
}

TEST_F(ChunkAssemblerTest, TensorsTheBackendDeclinesAreAssembledInTheRequest) {
  FakeStaging staging;
  staging.min_bytes = 8000;  // more than the 4000-byte tensor
  Assembler assembler(limits_, nullptr, &pool_, staging);
  Offer(assembler, First("a", 1000));
  Assembler::Step done = Offer(assembler, Later("a", 1000, 4000, false));
  ASSERT_EQ(done.kind, Kind::kComplete);
  EXPECT_EQ(done.staged.data, nullptr);
  EXPECT_EQ((*done.owner)->input().data(), Bytes(0, 4000));
}

// A later chunk read without a full parse (ReadLaterChunk) is appended as a
// parsed one is, with the same checks; an id with nothing being assembled
// is left to the full parse.
TEST_F(ChunkAssemblerTest, LaterChunksReadInPlaceAreAppended) {
  auto view = [](const std::string& id, int64_t offset, int64_t end, bool more) {
    ChunkView chunk;
    chunk.request_id = id;
    chunk.chunk_offset = offset;
    chunk.more_chunks = more;
    static std::vector<std::string> kept;  // the pieces' bytes
    kept.push_back(Bytes(offset, end));
    const std::string& bytes = kept.back();
    const size_t half = bytes.size() / 2;
    chunk.data = {absl::string_view(bytes).substr(0, half), absl::string_view(bytes).substr(half)};
    chunk.data_bytes = end - offset;
    return chunk;
  };
  for (bool staged : {false, true}) {
    FakeStaging staging;
    Assembler assembler(limits_, nullptr, &pool_, staged ? Assembler::Stage(staging) : nullptr);
    EXPECT_FALSE(assembler.OfferLater(view("a", 1000, 2000, true)).has_value());
    ASSERT_EQ(Offer(assembler, First("a", 1000)).kind, Kind::kStarted);
    std::optional<Assembler::Step> gap = assembler.OfferLater(view("a", 1500, 2000, true));
    ASSERT_TRUE(gap.has_value());
    ExpectError(*gap, absl::StatusCode::kInvalidArgument, "expected 1000", true);
    ASSERT_EQ(Offer(assembler, First("a", 1000)).kind, Kind::kStarted);
    std::optional<Assembler::Step> more = assembler.OfferLater(view("a", 1000, 2500, true));
    ASSERT_TRUE(more.has_value());
    EXPECT_EQ(more->kind, Kind::kAppended);
    std::optional<Assembler::Step> done = assembler.OfferLater(view("a", 2500, 4000, false));
    ASSERT_TRUE(done.has_value());
    ASSERT_EQ(done->kind, Kind::kComplete);
    if (staged) {
      ASSERT_NE(done->staged.data, nullptr);
      EXPECT_EQ(std::string(done->staged.data, 4000), Bytes(0, 4000));
    } else {
      EXPECT_EQ((*done->owner)->input().data(), Bytes(0, 4000));
    }
    EXPECT_EQ(done->largest_chunk, 1500);
  }
}

}  // namespace
}  // namespace softmax::server
