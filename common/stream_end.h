// The trailer by which the server says that it ended a stream itself, on
// both protocols' streams (softmax.v1's SoftmaxStream, KServe's
// ModelStreamInfer): `softmax-stream-end: max-age` (--max_stream_age_s) or
// `softmax-stream-end: draining` (shutdown), on an UNAVAILABLE status. With
// it, every message the server read was answered before the status, so a
// client may send again whatever it has no answer for, knowing that none of
// it was computed. An UNAVAILABLE without it comes from the transport (a
// connection reset, a replica gone), which may have taken answers already
// computed with it: sent again, those are computed twice.
#ifndef SOFTMAX_COMMON_STREAM_END_H_
#define SOFTMAX_COMMON_STREAM_END_H_

namespace softmax {

inline constexpr char kStreamEndKey[] = "softmax-stream-end";
inline constexpr char kStreamEndMaxAge[] = "max-age";
inline constexpr char kStreamEndDraining[] = "draining";

}  // namespace softmax

#endif  // SOFTMAX_COMMON_STREAM_END_H_
