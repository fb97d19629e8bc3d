// MemoryBudget: one bound on the tensor bytes that requests hold in the
// server, from admission until their response is sent: the input and the
// output of every request queued, computing, or computed and not yet
// written to its caller. Past it a new request is refused (UNAVAILABLE,
// retryable: the server is busy, as with a full queue) before anything is
// allocated for it, so slow readers and floods cannot grow the server's
// memory without bound.
//
// Thread-safety: thread-safe; a lease may be released on any thread.
#ifndef SOFTMAX_SERVER_SCHEDULING_MEMORY_BUDGET_H_
#define SOFTMAX_SERVER_SCHEDULING_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

namespace softmax::server {

class MemoryBudget {
 public:
  // `limit_bytes` <= 0: no bound. `observer` (may be empty) receives the
  // bytes held after every change (the metrics' gauge).
  explicit MemoryBudget(int64_t limit_bytes, std::function<void(int64_t)> observer = {})
      : limit_(limit_bytes), observer_(std::move(observer)) {}

  // Reserves `bytes` until the returned lease is released; null when they
  // would pass the limit. A budget holding nothing always admits, so one
  // request may be as large as the tensor limit allows.
  std::shared_ptr<const void> TryReserve(int64_t bytes) {
    if (bytes <= 0) bytes = 0;
    int64_t held = held_.load(std::memory_order_relaxed);
    do {
      if (limit_ > 0 && held > 0 && held + bytes > limit_) return nullptr;
    } while (!held_.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
    Changed(held + bytes);
    return std::shared_ptr<const void>(this, [bytes](const MemoryBudget* budget) {
      const_cast<MemoryBudget*>(budget)->Release(bytes);
    });
  }

  int64_t held() const { return held_.load(std::memory_order_relaxed); }
  int64_t limit() const { return limit_; }

 private:
  void Release(int64_t bytes) {
    Changed(held_.fetch_sub(bytes, std::memory_order_relaxed) - bytes);
  }
  void Changed(int64_t held) {
    if (observer_) observer_(held);
  }

  const int64_t limit_;
  const std::function<void(int64_t)> observer_;
  std::atomic<int64_t> held_{0};
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_SCHEDULING_MEMORY_BUDGET_H_
