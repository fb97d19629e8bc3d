#include "client/load/http_loop.h"

#include <string>
#include <utility>

#include "softmax/v1/softmax.pb.h"

namespace softmax::client {

HttpLoadLoop::HttpLoadLoop(LoadRunInterface* run,
                           std::vector<std::unique_ptr<HttpConnection>> connections)
    : run_(run), connections_(std::move(connections)) {}

HttpLoadLoop::~HttpLoadLoop() { Join(); }

void HttpLoadLoop::Start(int closed_loop_callers) {
  closed_loop_ = closed_loop_callers > 0;
  for (int c = 0; c < connections(); ++c) {
    threads_.emplace_back([this, c] { ConnectionLoop(c); });
  }
  if (!closed_loop_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    callers_ = closed_loop_callers;
  }
  for (int i = 0; i < closed_loop_callers; ++i) NextCallerRequest();
}

void HttpLoadLoop::Queue(const LoadPayload* payload, LoadClock::time_point intended,
                         bool measured) {
  run_->CallStarted();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(QueuedRequest{payload, intended, measured});
  }
  cv_.notify_one();
}

void HttpLoadLoop::Close() {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_closed_ = true;
  cv_.notify_all();
}

void HttpLoadLoop::Join() {
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

void HttpLoadLoop::NextCallerRequest() {
  const LoadClock::time_point now = LoadClock::now();
  bool measured = false;
  if (run_->Admit(now, &measured)) {
    Queue(run_->NextPayload(), now, measured);
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (--callers_ == 0) {
    queue_closed_ = true;
    cv_.notify_all();
  }
}

void HttpLoadLoop::ConnectionLoop(int connection) {
  v1::SoftmaxResponse response;  // reused: keeps its output's buffer
  std::string error;
  while (true) {
    QueuedRequest request;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return !queue_.empty() || queue_closed_; });
      if (queue_.empty()) break;
      request = queue_.front();
      queue_.pop_front();
    }
    const int code = connections_[connection]->Post(*request.payload->http, &response, &error);
    run_->Complete(connection, *request.payload, request.intended, request.measured, code,
                   code == 0 ? &response : nullptr);
    // The caller's next request is queued before this one is counted out, so
    // the count of outstanding requests reaches zero only at the end.
    if (closed_loop_) NextCallerRequest();
    run_->CallFinished();
  }
  run_->UnitDone();
}

}  // namespace softmax::client
