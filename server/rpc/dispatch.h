// From an InferenceRequest to Admission: the one path every front-end's
// request takes (softmax.v1 unary and stream, KServe gRPC and HTTP), so
// requests of every protocol are validated alike and batch together.
//
// Thread-safety: thread-safe; each request's pointees belong to its call.
#ifndef SOFTMAX_SERVER_RPC_DISPATCH_H_
#define SOFTMAX_SERVER_RPC_DISPATCH_H_

#include <memory>

#include "server/rpc/front_end.h"
#include "server/rpc/validation.h"
#include "server/scheduling/inference_request.h"

namespace softmax::server {

// Validates `request` (ValidateRequest, its errors naming `names`) and
// submits it to front_end.admission (Admission::Submit). `responder.done`
// is called exactly once, possibly before Submit returns: with the
// validation error (never held), a refusal (held as the responder asks),
// or the outcome. On OK the output is in request.output (its buffer, view or
// region) and, for a request with top_k, the top K in request.output.top_k,
// computed by the backend (Segment::top_k; no whole output unless
// full_output). In echo mode it is selected from the echoed input on the
// thread that answers (top_k.h), and the input kept as the output only with
// full_output (else the view is emptied and the buffer given back to
// front_end.buffers). The request's input buffer may have been moved into
// the output: callers must not read it after submitting.
// `admitted` as for Admission::Submit.
void Submit(const FrontEnd& front_end, InferenceRequest request, const FieldNames& names,
            Responder responder, Admission::Admitted* admitted = nullptr);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_DISPATCH_H_
