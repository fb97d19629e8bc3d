// The load engine of `softmax-client load`: offers load to a softmax-server
// and measures it.
//
// Two ways to offer load:
//   closed loop  `concurrency` requests always in flight, spread over
//                `connections` channels; each completion sends the next.
//   open loop    `rate` requests per second, evenly spaced or Poisson, sent
//                whether or not earlier ones have finished. Latency counts
//                from each request's intended send time, so time a request
//                spends waiting behind a slow server (or a slow client) is
//                counted instead of hidden.
// Calls use gRPC's callback API (unary), or one ClientBidiReactor per
// connection (stream, client/load/stream.h), so hundreds of requests in
// flight need no thread each. --protocol=http runs a thread per keep-alive
// HTTP/1.1 connection (client/load/http_loop.h), each carrying one request at
// a time; requests wait for a free connection in one queue, oldest first.
// The engine itself (client/load/engine.cc) paces and admits requests, runs the
// unary calls, and accounts every answer; the stream and HTTP transports call
// back into it through client/load/run_interface.h.
//
// Payloads are built before the run (client/load/payload.h: a few random
// tensors per mix entry, chosen by weight from a precomputed schedule), so
// the hot path makes no random data. Latencies go into LatencyHistograms (one
// per connection, merged for the report); no per-request records are kept.
// The engine prints nothing: the caller renders the LoadReport and the
// LoadProgress samples (client/load/report.h).
//
// Thread-safety: RunLoad may be called from any thread, and concurrently; each
// call owns every object it creates and returns after all its calls have
// finished.
#ifndef SOFTMAX_CLIENT_LOAD_ENGINE_H_
#define SOFTMAX_CLIENT_LOAD_ENGINE_H_

#include <atomic>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/load/options.h"
#include "client/load/report.h"

namespace softmax::client {

// How the caller watches and stops a run in progress.
struct LoadMonitor {
  // When set and it becomes true (e.g. from a SIGINT handler), the run stops
  // sending, waits for what is in flight, and reports what it measured.
  // Must outlive the RunLoad call.
  const std::atomic<bool>* stop_requested = nullptr;
  // When set, called every `progress_interval` from a thread of the run's
  // own, never concurrently with itself; it must not block for long.
  std::function<void(const LoadProgress&)> on_progress;
  absl::Duration progress_interval = absl::Seconds(1);  // finite, > 0
};

// Runs the load described by `options` and returns what it measured.
// INVALID_ARGUMENT when the options fail ValidateLoadOptions, a mix entry
// does not fit `axis`, or a progress callback comes without a finite,
// positive interval; UNAVAILABLE when a connection is not up within
// connect_timeout. Failures of individual calls are counted in the report,
// not returned. A run that cannot go on (a stream that ends for good while
// there is load left to send, e.g. its server is gone for longer than
// kStreamReopenPatience) stops and says why in the report's ended_early.
absl::StatusOr<LoadReport> RunLoad(const LoadOptions& options,
                                   const LoadMonitor& monitor = LoadMonitor());

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_LOAD_ENGINE_H_
