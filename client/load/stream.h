// The gRPC stream transport of `softmax-client load --stream`: one stream per
// connection (softmax.v1's SoftmaxStream, or KServe's ModelStreamInfer with
// --protocol=kserve), on gRPC's callback API, reopened when the server ends
// it with UNAVAILABLE.
//
// A LoadStreamWorker is the load of one connection; each gRPC stream that
// carries it is one ClientBidiReactor (an attempt). Requests queue for the
// single write gRPC allows outstanding at a time; each is sent with an id of
// its own (request_id, or the KServe request's id), and answers are matched
// to requests by that id (the server may answer in any order). With
// --chunk_bytes (softmax.v1) a request goes out as its payload's chunks, one
// after another before any other request's, and its answer is reassembled
// from the chunks that come back. Closed loop (`window` > 0): each answer
// sends the next request on the same stream, so `window` are in flight. Open
// loop (`window` 0): the run's sender thread calls Send. The stream
// half-closes once it is told to Close and nothing is queued or in flight.
//
// Reopening: a gRPC stream that ends with UNAVAILABLE (the server's maximum
// stream age, a drain, a reset or a replica gone, as gRPC reports them) has
// answered what it read; what it left unanswered, a partly received chunked
// answer included, is written again whole on a new stream
// (client/load/stream_ledger.h), so no request is lost or answered twice.
// The first reopen is immediate; a stream that ends again without an answer
// backs off (kStreamReopenBackoffInitial doubling to kStreamReopenBackoffMax),
// and one that gets no answer for kStreamReopenPatience gives up: what is
// left fails with the stream's status and the run is stopped with the reason
// (LoadRunInterface::Abort). A stream that ends with any other status, or
// that is Cancelled, is not reopened: the run is stopped likewise unless the
// stream had nothing more to do.
//
// Every request is accounted through the run's LoadRunInterface
// (client/load/run_interface.h); the worker calls its UnitDone once, after
// its last stream ended for good.
//
// Thread-safety: Send, Close and Cancel may be called from any thread,
// concurrently with gRPC's reactions; the reactions themselves are run by
// gRPC, one read and one write path at a time, and one stream at a time.
// Ownership: the caller owns the worker and must keep it, `run` and `stub`
// alive until the run has seen the worker's UnitDone.
#ifndef SOFTMAX_CLIENT_LOAD_STREAM_H_
#define SOFTMAX_CLIENT_LOAD_STREAM_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "client/load/options.h"
#include "client/load/payload.h"
#include "client/load/run_interface.h"
#include "client/load/stream_ledger.h"
#include "inference/grpc_service.pb.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::client {

// A server that ends a stream at its age or drains is answered at once; a
// stream that ends again without an answer waits this long before the next
// reopen, doubling up to the maximum, so a restarting server is not flooded.
inline constexpr std::chrono::milliseconds kStreamReopenBackoffInitial{50};
inline constexpr std::chrono::milliseconds kStreamReopenBackoffMax{1000};
// A restarted replica listens again within seconds (its lame duck is 0.5 s):
// a stream that gets no answer for this long reports its server gone.
inline constexpr std::chrono::seconds kStreamReopenPatience{10};

class LoadStreamWorker {
 public:
  // `protocol` is kSoftmaxV1 (SoftmaxStream) or kKserve (ModelStreamInfer);
  // `connection` the index the run accounts this stream's requests under;
  // `window` the requests kept in flight in a closed loop, 0 in an open loop.
  LoadStreamWorker(LoadRunInterface* run, grpc::GenericStub* stub, LoadProtocol protocol,
                   int connection, int window);
  ~LoadStreamWorker();

  // Opens the stream and, in a closed loop, sends the first `window`
  // requests. Call once.
  void Start();
  // Open loop: sends a request for `payload`, intended at `intended`.
  void Send(const LoadPayload* payload, LoadClock::time_point intended, bool measured);
  // No more requests will be sent; finish once the in-flight ones answered.
  void Close();
  // Ends the stream now (e.g. it did not drain in time) and reopens it no
  // more; what is left fails.
  void Cancel();

 private:
  class Attempt;
  friend class Attempt;

  // Read path of the current attempt.
  void OnRead(grpc::ByteBuffer* buffer, Attempt* attempt);
  // The attempt's last read failed: its stream is ending, and nothing more
  // may be written on it.
  void OnReadEnded(Attempt* attempt);
  // Writes what may go now, then reads the attempt's next message.
  void ReadNext(Attempt* attempt);
  // The current attempt ended with `status`; `ended_by_server` when the
  // server said it ended it (common/stream_end.h).
  void OnAttemptDone(const grpc::Status& status, bool answered, bool ended_by_server);
  void OnWriteDone(bool ok);

  // The answer to `id` is complete, or failed with `code`: accounted, and
  // the next request goes out.
  void FinishAnswer(uint64_t id, int code, const v1::SoftmaxResponse* answer);
  // Looks up `id` in flight.
  bool FindInFlight(uint64_t id, StreamRequest* request);
  void SendNextClosedLoop();
  // Queues `request` (counted in already) or, once the worker has ended for
  // good, fails it at once.
  void QueueOrFail(const StreamRequest& request);
  // Opens a new gRPC stream for what is queued. REQUIRES: mutex_ held.
  void OpenLocked();
  // The thread of delayed reopens (reopener_): waits for reopen_at_, then
  // opens the next stream, or ends the worker when it was cancelled. (A
  // grpc::Alarm per reopen would have to outlive its own callback, which a
  // stream ending at once, or the run ending on that callback's UnitDone,
  // does not allow; the worker's own thread is joined by its destructor.)
  void ReopenLoop();
  // Ends the worker: `why` (when not empty) stops the run with that reason,
  // `failed` (taken out of the ledger) fail with `code`, then UnitDone.
  // REQUIRES: mutex_ not held; ended_ set.
  void EndForGood(std::vector<StreamRequest> failed, int code, const std::string& why);
  // A response message that keeps its output's buffer (read path only).
  std::unique_ptr<v1::SoftmaxResponse> TakeSpare();
  // Drops answers being reassembled (their stream ended).
  void DropAssembling();
  // REQUIRES: mutex_ held.
  void MaybeWriteLocked();

  LoadRunInterface* const run_;
  grpc::GenericStub* const stub_;
  const bool kserve_;
  const int connection_;
  const int window_;  // closed loop: requests in flight; 0 in the open loop

  // Read path: touched only by the current attempt's reactions.
  v1::SoftmaxResponse read_;  // reused: keeps its output's buffer
  inference::ModelStreamInferResponse kserve_read_;  // likewise, --protocol=kserve
  // --chunk_bytes: answers being reassembled by request id, and finished
  // ones kept for their buffers.
  std::unordered_map<uint64_t, std::unique_ptr<v1::SoftmaxResponse>> assembling_;
  std::vector<std::unique_ptr<v1::SoftmaxResponse>> spare_;

  std::mutex mutex_;
  StreamLedger ledger_;                   // GUARDED_BY(mutex_)
  std::shared_ptr<Attempt> attempt_;      // GUARDED_BY(mutex_); null between streams
  // A delayed reopen: when, how many requests it sends again, and whether
  // the transport lost the stream it replaces.
  std::optional<LoadClock::time_point> reopen_at_;  // GUARDED_BY(mutex_)
  int64_t reopen_resent_ = 0;             // GUARDED_BY(mutex_)
  bool reopen_lost_ = false;              // GUARDED_BY(mutex_)
  bool stopping_ = false;                 // GUARDED_BY(mutex_); the destructor runs
  std::condition_variable reopen_wake_;   // with mutex_: reopen_at_, cancelled_, stopping_
  std::thread reopener_;                  // started at the first delayed reopen
  grpc::ByteBuffer write_;                // GUARDED_BY(mutex_) while writing_
  // A chunked request whose later chunks are still to be written.
  const LoadPayload* sending_ = nullptr;  // GUARDED_BY(mutex_)
  size_t next_chunk_ = 0;                 // GUARDED_BY(mutex_)
  std::string sending_id_;                // GUARDED_BY(mutex_)
  bool writing_ = false;                  // GUARDED_BY(mutex_)
  bool writes_done_ = false;              // GUARDED_BY(mutex_)
  bool broken_ = false;                   // GUARDED_BY(mutex_); no write may start
  bool closing_ = false;                  // GUARDED_BY(mutex_)
  bool cancelled_ = false;                // GUARDED_BY(mutex_)
  bool ended_ = false;                    // GUARDED_BY(mutex_); for good
  // Why the current attempt was cancelled from the read path (a message
  // that does not parse); empty otherwise.
  std::string read_failure_;              // GUARDED_BY(mutex_)
  // Since when no stream has given an answer; unset while they do.
  std::optional<LoadClock::time_point> unanswered_since_;  // GUARDED_BY(mutex_)
  std::chrono::milliseconds backoff_{0};  // GUARDED_BY(mutex_)
};

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_LOAD_STREAM_H_
