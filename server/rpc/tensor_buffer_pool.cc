#include "server/rpc/tensor_buffer_pool.h"

#include <utility>

namespace softmax::server {

TensorBufferPool::TensorBufferPool(size_t max_idle_bytes) : max_idle_bytes_(max_idle_bytes) {}

std::string TensorBufferPool::Take(size_t bytes) {
  std::string buffer;
  if (bytes < kMinPooledBytes) return buffer;
  {
    absl::MutexLock lock(&mu_);
    ++taken_;
    size_t best = idle_.size();
    for (size_t i = 0; i < idle_.size(); ++i) {
      if (idle_[i].capacity() >= bytes &&
          (best == idle_.size() || idle_[i].capacity() < idle_[best].capacity())) {
        best = i;
      }
    }
    if (best != idle_.size()) {
      buffer.swap(idle_[best]);
      idle_[best].swap(idle_.back());
      idle_.pop_back();
      idle_bytes_ -= buffer.capacity();
      return buffer;
    }
  }
  buffer.reserve(bytes);
  return buffer;
}

void TensorBufferPool::Give(std::string buffer) {
  const size_t capacity = buffer.capacity();
  if (capacity < kMinPooledBytes) return;
  buffer.clear();
  absl::MutexLock lock(&mu_);
  if (taken_ == 0) return;  // freed on return
  --taken_;
  if (idle_bytes_ + capacity > max_idle_bytes_) return;
  idle_bytes_ += capacity;
  idle_.push_back(std::move(buffer));
}

OutputView TensorBufferPool::LendAsView(const std::shared_ptr<TensorBufferPool>& pool,
                                        std::string data) {
  auto* owned = new std::string(std::move(data));
  OutputView view;
  view.data = owned->data();
  view.bytes = static_cast<int64_t>(owned->size());
  view.owner = std::shared_ptr<const void>(owned, [pool](std::string* string) {
    pool->Give(std::move(*string));
    delete string;
  });
  return view;
}

size_t TensorBufferPool::idle_buffers() {
  absl::MutexLock lock(&mu_);
  return idle_.size();
}

size_t TensorBufferPool::idle_bytes() {
  absl::MutexLock lock(&mu_);
  return idle_bytes_;
}

}  // namespace softmax::server
