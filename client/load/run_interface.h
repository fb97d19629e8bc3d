// What a load transport asks of the run it works for. The run (RunLoad's,
// client/load/engine.cc) paces requests and accounts their answers; the
// transports that carry requests on threads or reactors of their own, the
// gRPC stream worker (client/load/stream.h) and the HTTP connection loops
// (client/load/http_loop.h), call back into it through this interface.
//
// The protocol of one request: Admit says whether it is sent at all and in
// which phase; NextPayload says what to send; CallStarted counts it in before
// it is queued or sent; Complete accounts its answer (or failure) exactly
// once; CallFinished counts it out after that. A transport unit (a stream, an
// HTTP connection's thread) calls UnitDone once, after its last CallFinished,
// and touches nothing of the run afterwards on threads of its own: the run
// may be destroyed as soon as every unit is done and nothing is outstanding.
// A unit that cannot go on while the run still needs it calls Abort first:
// the run then stops and says why, rather than end early unexplained.
//
// Thread-safety: every method may be called from any thread, concurrently.
#ifndef SOFTMAX_CLIENT_LOAD_RUN_INTERFACE_H_
#define SOFTMAX_CLIENT_LOAD_RUN_INTERFACE_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "client/load/payload.h"
#include "softmax/v1/softmax.pb.h"

namespace softmax::client {

// The clock of intended send times and latencies.
using LoadClock = std::chrono::steady_clock;

class LoadRunInterface {
 public:
  virtual ~LoadRunInterface() = default;

  // Whether a request intended for `intended` is sent; sets `*measured` when
  // it belongs to the measured phase (else it is warm-up). Once it says no,
  // it says no to every later request.
  virtual bool Admit(LoadClock::time_point intended, bool* measured) = 0;
  // The payload of the next request, by the run's schedule. The pointer stays
  // valid for the whole run.
  virtual const LoadPayload* NextPayload() = 0;
  // Accounts one finished request sent on `connection`: `code` is 0 or a gRPC
  // status code, `response` the answer when `code` is 0, else null.
  virtual void Complete(int connection, const LoadPayload& payload,
                        LoadClock::time_point intended, bool measured, int code,
                        const v1::SoftmaxResponse* response) = 0;
  // A stream answered with a request_id it was never sent (counted as a
  // mismatch).
  virtual void RecordUnmatched(const std::string& request_id) = 0;

  // A stream that ended with UNAVAILABLE was reopened, `resent` requests that
  // it left unanswered to be written again on the new one. `lost`: the
  // transport ended it, not the server (common/stream_end.h), so some of
  // those may have been computed already and will be computed again.
  virtual void StreamReopened(int64_t resent, bool lost) = 0;
  // A unit cannot go on: the run stops sending (as Admit's no does) and
  // reports `why` (the first reason given, when several are).
  virtual void Abort(const std::string& why) = 0;

  // A request is sent or queued, and not yet accounted.
  virtual void CallStarted() = 0;
  // A request counted in by CallStarted has been accounted.
  virtual void CallFinished() = 0;
  // A transport unit has finished for good.
  virtual void UnitDone() = 0;
};

}  // namespace softmax::client

#endif  // SOFTMAX_CLIENT_LOAD_RUN_INTERFACE_H_
