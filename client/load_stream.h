// The gRPC stream transport of `softmax-client load --stream`: one
// SoftmaxStream per connection, on gRPC's callback API.
//
// A LoadStreamWorker is one ClientBidiReactor. Requests queue for the single
// write gRPC allows outstanding at a time; each is sent with a request_id of
// its own, and answers are matched to requests by that id (the server may
// answer in any order). With --chunk_bytes a request goes out as its
// payload's chunks, one after another before any other request's, and its
// answer is reassembled from the chunks that come back. Closed loop (`window`
// > 0): each answer sends the next request on the same stream, so `window`
// are in flight. Open loop (`window` 0): the run's sender thread calls Send.
// The stream half-closes once it is told to Close and nothing is pending or
// in flight; when it ends, whatever was never answered fails with the
// stream's status.
//
// Every request is accounted through the run's LoadRunInterface
// (client/load_run_interface.h), and the worker calls its UnitDone from
// OnDone.
//
// Thread-safety: Send, Close and Cancel may be called from any thread,
// concurrently with gRPC's reactions; the reactions themselves are run by
// gRPC, one read and one write path at a time. Ownership: the caller owns the
// worker and must keep it, `run` and `stub` alive until the run has seen the
// worker's UnitDone.
#ifndef SOFTMAX_CLIENT_LOAD_STREAM_H_
#define SOFTMAX_CLIENT_LOAD_STREAM_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "client/load_payload.h"
#include "client/load_run_interface.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::client {

class LoadStreamWorker final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `connection` is the index the run accounts this stream's requests under;
  // `window` the requests kept in flight in a closed loop, 0 in an open loop.
  LoadStreamWorker(LoadRunInterface* run, grpc::GenericStub* stub, int connection, int window);

  // Opens the stream and, in a closed loop, sends the first `window`
  // requests. Call once.
  void Start();
  // Open loop: sends a request for `payload`, intended at `intended`.
  void Send(const LoadPayload* payload, LoadClock::time_point intended, bool measured);
  // No more requests will be sent; finish once the in-flight ones answered.
  void Close();
  // Ends the stream now (e.g. it did not drain in time); OnDone fails what is
  // left.
  void Cancel();

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  struct InFlight {
    const LoadPayload* payload = nullptr;
    LoadClock::time_point intended;
    bool measured = false;
  };

  // The answer to `id` is complete, or failed with `code`: accounted, and
  // the next request goes out.
  void FinishAnswer(uint64_t id, const InFlight& call, int code,
                    const v1::SoftmaxResponse* answer);
  void ReadNext();
  void SendNextClosedLoop();
  // A response message that keeps its output's buffer (read path only).
  std::unique_ptr<v1::SoftmaxResponse> TakeSpare();
  // REQUIRES: mutex_ held.
  void MaybeWriteLocked();

  LoadRunInterface* const run_;
  grpc::GenericStub* const stub_;
  const int connection_;
  const int window_;  // closed loop: requests in flight; 0 in the open loop
  grpc::ClientContext context_;
  grpc::ByteBuffer read_buffer_;
  v1::SoftmaxResponse read_;    // reused: keeps its output's buffer
  grpc::ByteBuffer write_;      // GUARDED_BY(mutex_) while writing_
  // --chunk_bytes: answers being reassembled by request id, and finished
  // ones kept for their buffers. Touched by the read path only.
  std::unordered_map<uint64_t, std::unique_ptr<v1::SoftmaxResponse>> assembling_;
  std::vector<std::unique_ptr<v1::SoftmaxResponse>> spare_;

  std::mutex mutex_;
  std::deque<InFlight> pending_;                     // GUARDED_BY(mutex_)
  std::unordered_map<uint64_t, InFlight> in_flight_;  // GUARDED_BY(mutex_)
  uint64_t next_id_ = 0;                             // GUARDED_BY(mutex_)
  // A chunked request whose later chunks are still to be written.
  const LoadPayload* sending_ = nullptr;             // GUARDED_BY(mutex_)
  size_t next_chunk_ = 0;                            // GUARDED_BY(mutex_)
  std::string sending_id_;                           // GUARDED_BY(mutex_)
  bool writing_ = false;                             // GUARDED_BY(mutex_)
  bool closing_ = false;                             // GUARDED_BY(mutex_)
  bool writes_done_ = false;                         // GUARDED_BY(mutex_)
  bool broken_ = false;                              // GUARDED_BY(mutex_)
};

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_LOAD_STREAM_H_
