#include "server/rpc/tensor_buffer_pool.h"

#include <memory>
#include <string>
#include <utility>

#include <gtest/gtest.h>

namespace softmax::server {
namespace {

constexpr size_t kMin = TensorBufferPool::kMinPooledBytes;

TEST(TensorBufferPoolTest, SmallRequestsAreLeftToMalloc) {
  TensorBufferPool pool(size_t{1} << 30);
  std::string large = pool.Take(kMin);  // one taken out, so one may come back
  std::string small = pool.Take(kMin - 1);
  EXPECT_LT(small.capacity(), kMin);
  small.assign(1 << 20, 'x');
  pool.Give(std::move(small));
  EXPECT_EQ(pool.idle_buffers(), 0u);
}

TEST(TensorBufferPoolTest, ANewBufferIsReservedToTheRequestedSize) {
  TensorBufferPool pool(size_t{1} << 30);
  const std::string buffer = pool.Take(kMin + 12345);
  EXPECT_TRUE(buffer.empty());
  EXPECT_GE(buffer.capacity(), kMin + 12345);
  // Not protobuf's 50 MB reservation followed by doubling.
  EXPECT_LT(buffer.capacity(), kMin + 12345 + 4096);
}

TEST(TensorBufferPoolTest, AGivenBufferComesBackEmptyWithItsMemory) {
  TensorBufferPool pool(size_t{1} << 30);
  std::string buffer = pool.Take(kMin);
  buffer.assign(kMin, 'a');
  const char* memory = buffer.data();
  pool.Give(std::move(buffer));
  EXPECT_EQ(pool.idle_buffers(), 1u);
  EXPECT_GE(pool.idle_bytes(), kMin);

  std::string again = pool.Take(kMin / 2 + kMin / 2);
  EXPECT_TRUE(again.empty());
  EXPECT_EQ(again.data(), memory);
  EXPECT_EQ(pool.idle_buffers(), 0u);
  EXPECT_EQ(pool.idle_bytes(), 0u);
}

TEST(TensorBufferPoolTest, TakeChoosesTheSmallestBufferThatFits) {
  TensorBufferPool pool(size_t{1} << 30);
  std::string large = pool.Take(3 * kMin);
  std::string medium = pool.Take(2 * kMin);
  std::string small = pool.Take(kMin);
  const char* medium_memory = medium.data();
  pool.Give(std::move(large));
  pool.Give(std::move(small));
  pool.Give(std::move(medium));
  const std::string taken = pool.Take(kMin + 1);
  EXPECT_EQ(taken.data(), medium_memory);
  EXPECT_EQ(pool.idle_buffers(), 2u);
  // Nothing idle is large enough: a new buffer.
  const std::string fresh = pool.Take(4 * kMin);
  EXPECT_GE(fresh.capacity(), 4 * kMin);
  EXPECT_EQ(pool.idle_buffers(), 2u);
}

TEST(TensorBufferPoolTest, IdleCapacityStaysWithinTheLimit) {
  TensorBufferPool pool(2 * kMin + kMin / 2);
  std::string a = pool.Take(kMin);
  std::string b = pool.Take(kMin);
  std::string c = pool.Take(kMin);
  pool.Give(std::move(a));
  pool.Give(std::move(b));
  pool.Give(std::move(c));  // over the limit: freed
  EXPECT_EQ(pool.idle_buffers(), 2u);
  EXPECT_LE(pool.idle_bytes(), 2 * kMin + kMin / 2);
}

TEST(TensorBufferPoolTest, BuffersBeyondThoseTakenOutAreFreed) {
  TensorBufferPool pool(size_t{1} << 30);
  std::string foreign(kMin, 'f');
  pool.Give(std::move(foreign));
  EXPECT_EQ(pool.idle_buffers(), 0u);
  // A call takes one buffer and gives back two (its input, and an output it
  // allocated itself): one is kept.
  std::string input = pool.Take(kMin);
  std::string output(kMin, 'o');
  pool.Give(std::move(output));
  pool.Give(std::move(input));
  EXPECT_EQ(pool.idle_buffers(), 1u);
  // The next such call reuses it, and the pool stays at one.
  input = pool.Take(kMin);
  EXPECT_EQ(pool.idle_buffers(), 0u);
  pool.Give(std::string(kMin, 'o'));
  pool.Give(std::move(input));
  EXPECT_EQ(pool.idle_buffers(), 1u);
}

TEST(TensorBufferPoolTest, ALentViewReturnsItsBufferWhenTheLastReferenceGoes) {
  auto pool = std::make_shared<TensorBufferPool>(size_t{1} << 30);
  std::string data = pool->Take(kMin);
  data.assign(kMin, 'v');
  const char* memory = data.data();
  OutputView view = TensorBufferPool::LendAsView(pool, std::move(data));
  EXPECT_EQ(view.data, memory);
  EXPECT_EQ(view.bytes, static_cast<int64_t>(kMin));
  EXPECT_EQ(view.data[kMin - 1], 'v');
  std::shared_ptr<const void> held = view.owner;  // as gRPC's slice would
  view = OutputView{};
  EXPECT_EQ(pool->idle_buffers(), 0u);
  held.reset();
  EXPECT_EQ(pool->idle_buffers(), 1u);
  EXPECT_EQ(pool->Take(kMin).data(), memory);
}

}  // namespace
}  // namespace softmax::server
