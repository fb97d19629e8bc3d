// Recycles the byte strings of large tensors between calls.
//
// glibc's malloc serves blocks above its mmap threshold (dynamic, at most
// 32 MiB on 64-bit) with a fresh mmap and unmaps them on free, so every
// 64 MiB request paid for 16,384 page faults (the kernel zeroing each page)
// and the unmap each time it parsed a tensor into a new string: on a 2-core
// host the echo moved 0.95 GB/s of payload at 32 MiB and 0.15 GB/s at
// 64 MiB. Strings that large are taken from here instead, already faulted
// in, and given back when their call is done. Smaller ones are left to
// malloc, which recycles them itself (below its trim threshold).
//
// Thread-safety: every method may be called from any thread.
#ifndef SOFTMAX_SERVER_RPC_TENSOR_BUFFER_POOL_H_
#define SOFTMAX_SERVER_RPC_TENSOR_BUFFER_POOL_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/malloc_tuning.h"
#include "server/scheduling/backend.h"

namespace softmax::server {

class TensorBufferPool {
 public:
  // Buffers below this go to malloc, which recycles them without faulting
  // them in again. From glibc's trim threshold up it does not: a freed 16 MiB
  // buffer at a heap's top went back to the system and the next one faulted
  // its pages in (2-core host, echo, 16 MiB at 4 callers: about 2,100 faults
  // per request pooled from 32 MiB up, 430 from 16 MiB up, 1.22-1.55x the
  // requests/s in 3 alternating rounds). The server on tcmalloc keeps the
  // pool: its page heap also hands freed spans back at each trim, and running
  // without the pool there was not measured.
  static constexpr size_t kMinPooledBytes = static_cast<size_t>(kTrimThresholdBytes);

  // Keeps at most `max_idle_bytes` of capacity idle; a buffer given back
  // beyond that is freed.
  explicit TensorBufferPool(size_t max_idle_bytes);
  TensorBufferPool(const TensorBufferPool&) = delete;
  TensorBufferPool& operator=(const TensorBufferPool&) = delete;

  // An empty string whose capacity is at least `bytes`: the smallest idle
  // one that fits, else a new one reserved to exactly `bytes` (protobuf's
  // parser would otherwise reserve 50 MB and then double). For `bytes` below
  // kMinPooledBytes, an empty string (malloc's business).
  std::string Take(size_t bytes);

  // Keeps `buffer` for a later Take when its capacity is at least
  // kMinPooledBytes, fewer buffers were given back than taken out, and the
  // idle total stays within the limit; else frees it. The second rule keeps
  // the pool from filling up with buffers a call allocated itself (the CPU
  // backend's outputs, given back beside the inputs they were computed from):
  // it never holds more than the calls of the busiest moment took out.
  void Give(std::string buffer);

  // Moves `data` into an OutputView whose owner gives the string back to
  // `pool` once the last reference (gRPC's, after the response is sent)
  // goes: the response references the bytes instead of copying them.
  static OutputView LendAsView(const std::shared_ptr<TensorBufferPool>& pool, std::string data);

  // Idle buffers and their capacity, for tests.
  size_t idle_buffers();
  size_t idle_bytes();

 private:
  const size_t max_idle_bytes_;
  absl::Mutex mu_;
  std::vector<std::string> idle_ ABSL_GUARDED_BY(mu_);
  size_t idle_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Buffers taken out and not given back yet.
  size_t taken_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_TENSOR_BUFFER_POOL_H_
