// How `softmax-client load --protocol=http` carries its requests: one thread
// per keep-alive HTTP/1.1 connection (client/load/http.h), fed from one queue.
//
// HTTP/1.1 has no multiplexing, so each connection carries one request at a
// time. Every request waits in one queue, oldest first, for the next free
// connection; each connection's thread takes one, sends it, blocks for its
// answer, accounts it through the run's LoadRunInterface
// (client/load/run_interface.h) and takes the next. Closed loop: each of the
// run's `concurrency` callers queues its next request (intended now) when its
// last one is answered, so callers beyond the connections wait in the queue
// and that wait counts in their latency. Open loop: the run's sender queues
// requests at their intended times, and closes the queue when it stops.
//
// Thread-safety: Queue and Close may be called from any thread, concurrently
// with the connection threads. Start and Join are called once each, from the
// thread that owns the loop. Ownership: the loop owns its connections and
// threads; `run` must outlive it.
#ifndef SOFTMAX_CLIENT_LOAD_HTTP_LOOP_H_
#define SOFTMAX_CLIENT_LOAD_HTTP_LOOP_H_

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "client/load/http.h"
#include "client/load/payload.h"
#include "client/load/run_interface.h"

namespace softmax::client {

class HttpLoadLoop {
 public:
  // REQUIRES: `connections` is not empty.
  HttpLoadLoop(LoadRunInterface* run, std::vector<std::unique_ptr<HttpConnection>> connections);
  // Joins the connection threads if Join has not.
  ~HttpLoadLoop();
  HttpLoadLoop(const HttpLoadLoop&) = delete;
  HttpLoadLoop& operator=(const HttpLoadLoop&) = delete;

  int connections() const { return static_cast<int>(connections_.size()); }

  // Starts a thread per connection; each calls the run's UnitDone when the
  // queue is closed and empty. Closed loop (`closed_loop_callers` > 0): that
  // many callers each queue their first request now, and the queue closes
  // when the last of them is refused by the run's Admit. Open loop
  // (`closed_loop_callers` 0): requests come from Queue until Close.
  // REQUIRES: the run counts connections() units running.
  void Start(int closed_loop_callers);
  // Open loop: queues a request for `payload`, intended at `intended`.
  void Queue(const LoadPayload* payload, LoadClock::time_point intended, bool measured);
  // Open loop: nothing more will be queued; the threads finish what is queued.
  void Close();
  // Waits for the connection threads to end.
  void Join();

 private:
  struct QueuedRequest {
    const LoadPayload* payload = nullptr;
    LoadClock::time_point intended;
    bool measured = false;
  };

  // Closed loop: a caller sends its next request, or stops for good.
  void NextCallerRequest();
  void ConnectionLoop(int connection);

  LoadRunInterface* const run_;
  const std::vector<std::unique_ptr<HttpConnection>> connections_;
  bool closed_loop_ = false;  // set by Start, before the threads
  std::vector<std::thread> threads_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<QueuedRequest> queue_;  // GUARDED_BY(mutex_)
  bool queue_closed_ = false;        // GUARDED_BY(mutex_); nothing more comes
  int callers_ = 0;                  // GUARDED_BY(mutex_); closed loop, still sending
};

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_LOAD_HTTP_LOOP_H_
