#include "client/load/stream_ledger.h"

namespace softmax::client {

void StreamLedger::Queue(const StreamRequest& request) { queued_.push_back(request); }

uint64_t StreamLedger::TakeNext(StreamRequest* request) {
  *request = queued_.front();
  queued_.pop_front();
  const uint64_t id = next_id_++;
  in_flight_.emplace_hint(in_flight_.end(), id, *request);
  return id;
}

const StreamRequest* StreamLedger::Find(uint64_t id) const {
  auto it = in_flight_.find(id);
  return it == in_flight_.end() ? nullptr : &it->second;
}

bool StreamLedger::Answer(uint64_t id, StreamRequest* request) {
  auto it = in_flight_.find(id);
  if (it == in_flight_.end()) return false;
  *request = it->second;
  in_flight_.erase(it);
  return true;
}

int64_t StreamLedger::RequeueInFlight() {
  const int64_t count = static_cast<int64_t>(in_flight_.size());
  for (auto it = in_flight_.rbegin(); it != in_flight_.rend(); ++it) {
    queued_.push_front(it->second);
  }
  in_flight_.clear();
  return count;
}

std::vector<StreamRequest> StreamLedger::TakeAll() {
  std::vector<StreamRequest> all;
  all.reserve(in_flight_.size() + queued_.size());
  for (const auto& [id, request] : in_flight_) all.push_back(request);
  all.insert(all.end(), queued_.begin(), queued_.end());
  in_flight_.clear();
  queued_.clear();
  return all;
}

}  // namespace softmax::client
