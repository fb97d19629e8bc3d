// The requests of one `softmax-client load --stream` stream across the gRPC
// streams that carry it: queued to be written, or written under a request id
// and awaiting their answer. A gRPC stream may end before answering
// everything it was sent (the server's maximum stream age, a drain, a replica
// gone); the requests it left unanswered go back to the front of the queue,
// in the order they were first written, and are written again whole on the
// next gRPC stream under new ids. So every request gets exactly one answer
// accounted: an id is answered at most once, and an answer to an id that is
// no longer in flight is not taken for anyone's.
//
// Kept apart from the gRPC reactor (client/load/stream.h) so that this
// bookkeeping is tested without a server (load_stream_ledger_test.cc).
//
// Thread-safety: none; the stream worker calls it under its mutex.
#ifndef SOFTMAX_CLIENT_LOAD_STREAM_LEDGER_H_
#define SOFTMAX_CLIENT_LOAD_STREAM_LEDGER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "client/load/payload.h"
#include "client/load/run_interface.h"

namespace softmax::client {

// One request of a load stream, as the run admitted it.
struct StreamRequest {
  const LoadPayload* payload = nullptr;
  LoadClock::time_point intended;
  bool measured = false;
};

class StreamLedger {
 public:
  // Adds `request` behind everything queued.
  void Queue(const StreamRequest& request);
  bool HasQueued() const { return !queued_.empty(); }

  // Takes the oldest queued request: from now on it is in flight under the
  // returned id, which no other request of this ledger ever had.
  // REQUIRES: HasQueued().
  uint64_t TakeNext(StreamRequest* request);

  // The request in flight under `id`, or null when none is (never written,
  // answered already, or put back by RequeueInFlight).
  const StreamRequest* Find(uint64_t id) const;

  // The answer to `id` arrived: moves its request into `*request` and forgets
  // the id. false (and `*request` untouched) when `id` is not in flight.
  bool Answer(uint64_t id, StreamRequest* request);

  // The gRPC stream that carried the requests in flight ended: they go back
  // to the front of the queue, oldest first, ahead of the requests never
  // written. Returns how many went back.
  int64_t RequeueInFlight();

  // Removes and returns everything left, in flight (oldest first) then
  // queued: the stream ends for good and these fail.
  std::vector<StreamRequest> TakeAll();

  size_t in_flight() const { return in_flight_.size(); }
  size_t queued() const { return queued_.size(); }
  bool empty() const { return in_flight_.empty() && queued_.empty(); }

 private:
  // By id, which grows with every write: iteration is the order written.
  std::map<uint64_t, StreamRequest> in_flight_;
  std::deque<StreamRequest> queued_;
  uint64_t next_id_ = 0;
};

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_LOAD_STREAM_LEDGER_H_
