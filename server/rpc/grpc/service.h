// softmax.v1.SoftmaxService on the gRPC callback API. On gRPC's threads the
// handlers authenticate, parse, validate, assemble chunks and hand requests
// to Admission, never waiting for compute. An RPC is finished by the thread
// that completes its request: a scheduler slot thread or one of the
// batcher's completion threads once computed, the handler's own thread for a
// refusal or in echo mode (--device=none), the drain for a held refusal.
//
// Unary `Softmax`: errors are gRPC statuses. `SoftmaxStream`: reads
// continuously; every request's response (or per-request `error`) is written
// in completion order, one write in flight at a time; the stream finishes OK
// after the client's writes-done once every response is written. A stream
// stops reading while `max_stream_pending` of its responses are unwritten
// (flow control against clients that write without reading). A big tensor
// may come in chunks (softmax.proto: chunk_offset, more_chunks): assembled
// per request_id (server/rpc/grpc/chunk_assembler.h), computed whole, and
// answered in chunks that reference the output instead of copying it.
//
// Both methods take and give raw byte buffers (server/rpc/grpc/wire.h): requests are
// parsed here, and a response may reference its output where the backend
// left it (OutputView) instead of a copy. On the wire nothing differs.
// Each request becomes an InferenceRequest (softmax_v1.h) and enters the
// scheduler through Submit (dispatch.h), that is through the server's
// Admission, as every other front-end's do.
//
// Thread-safety: gRPC calls the service from its own threads.
#ifndef SOFTMAX_SERVER_RPC_GRPC_SERVICE_H_
#define SOFTMAX_SERVER_RPC_GRPC_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "server/rpc/dispatch.h"
#include "server/rpc/front_end.h"
#include "softmax/v1/softmax.grpc.pb.h"

namespace softmax::server {

// Both methods on the callback API, with raw byte buffers (see above).
using RawSoftmaxService = v1::SoftmaxService::WithRawCallbackMethod_Softmax<
    v1::SoftmaxService::WithRawCallbackMethod_SoftmaxStream<v1::SoftmaxService::Service>>;

class SoftmaxServiceImpl final : public RawSoftmaxService {
 public:
  // `front_end`'s pointees must outlive the gRPC server this service is
  // registered with.
  explicit SoftmaxServiceImpl(const FrontEnd& front_end) : front_end_(front_end) {}

  grpc::ServerUnaryReactor* Softmax(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* SoftmaxStream(
      grpc::CallbackServerContext* context) override;

  const FrontEnd& front_end() const { return front_end_; }

 private:
  const FrontEnd front_end_;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_GRPC_SERVICE_H_
