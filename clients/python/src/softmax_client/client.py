"""The softmax-serve client: NumPy arrays to softmax.v1 requests and back.

Dtypes: float32 and float16 arrays travel as themselves. bfloat16 arrays
travel as bfloat16 when `ml_dtypes` is installed (pip install
"softmax-serve-client[bfloat16]"): pass an ml_dtypes.bfloat16 array and get
one back. Without ml_dtypes NumPy has no bfloat16, so bfloat16 data is raw
uint16 bits (the high half of each float32): a uint16 array is sent as
bfloat16 and its result comes back as uint16 bits too. Other dtypes are
refused with TypeError rather than cast silently.

Thread-safety: a Client may be shared by threads; each call is independent.
A StreamResults is read by one thread at a time.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from softmax_client._generated import softmax_pb2

try:  # optional: NumPy has no bfloat16 of its own
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    _ml_dtypes = None  # type: ignore[assignment]

SERVICE = "softmax.v1.SoftmaxService"
_UNARY = f"/{SERVICE}/Softmax"
_STREAM = f"/{SERVICE}/SoftmaxStream"


def bfloat16_dtype() -> Optional[np.dtype]:
    """ml_dtypes' bfloat16 dtype, or None when ml_dtypes is not installed."""
    return np.dtype(_ml_dtypes.bfloat16) if _ml_dtypes is not None else None


class SoftmaxError(Exception):
    """A failed request: `code` is the grpc.StatusCode, `details` the
    server's message (naming the offending field for INVALID_ARGUMENT)."""

    def __init__(self, code: grpc.StatusCode, details: str, request_id: str = ""):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.request_id = request_id


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """gRPC's retry policy (gRFC A6), applied by the channel to every call of
    the service: a call that fails with a retryable code before any response
    arrived is sent again after an exponential, jittered backoff. UNAVAILABLE
    is what a draining or restarting server (and a full admission queue)
    answers, so retrying it rides through a rolling update. CANCELLED is
    retried too: a call that reaches a server in the instant it shuts down,
    before any handler took it, is answered CANCELLED by gRPC core
    (grpc/grpc#41785), and softmax is a pure function, so sending it again is
    safe (a call the caller cancels itself is never retried). gRPC caps
    max_attempts at 5. A stream is retried only until its first response."""

    max_attempts: int = 5
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    backoff_multiplier: float = 2.0
    retryable_codes: Tuple[str, ...] = ("UNAVAILABLE", "CANCELLED")

    def method_config(self) -> Dict[str, Any]:
        return {
            "maxAttempts": self.max_attempts,
            "initialBackoff": f"{self.initial_backoff_s}s",
            "maxBackoff": f"{self.max_backoff_s}s",
            "backoffMultiplier": self.backoff_multiplier,
            "retryableStatusCodes": list(self.retryable_codes),
        }


DEFAULT_RETRY_POLICY = RetryPolicy()

# On a stream, tensors larger than this travel in chunks of this size by
# default (softmax.proto: chunk_offset, more_chunks), so that no message
# nears gRPC's usual 4 MiB limits on the way. The C++ load client moved
# 64 MiB tensors so at 1.5-1.6x whole messages on the H200 host; this
# client's own copies bound it: 0.26-0.27 GB/s against 0.23-0.26 whole
# (2-core host, echo, one caller, 3 rounds).
DEFAULT_CHUNK_BYTES = 1 << 20


# A stream the server ends with UNAVAILABLE (its maximum stream age, a drain,
# a reset, a replica gone) is reopened at once; one that ends again without an
# answer waits this long first, doubling up to the maximum, so that a
# restarting server is not flooded.
REOPEN_BACKOFF_S = 0.05
REOPEN_BACKOFF_MAX_S = 1.0
# A restarted replica listens again within seconds (its lame duck is 0.5 s):
# a stream that gets no answer for this long raises, whatever its deadline.
REOPEN_PATIENCE_S = 10.0
# The trailer with which the server says it ended a stream itself (maximum
# age, drain), having answered every message it read: what is sent again
# after it was never computed. Without it the transport ended the stream.
STREAM_END_KEY = "softmax-stream-end"


@dataclasses.dataclass
class StreamResult:
    """One answer on a stream: `index` is the request's position in the
    iterable given to Client.stream; exactly one of `output`, `top_k` (a
    request with top_k: (values, indices), as Client.softmax returns them)
    and `error` is set."""

    index: int
    output: Optional[np.ndarray]
    error: Optional[SoftmaxError]
    timing: Any = None  # softmax.v1.Timing of the batch it rode in
    top_k: Optional[Tuple[np.ndarray, np.ndarray]] = None


def service_config(retry: Optional[RetryPolicy], load_balancing: str) -> str:
    """The JSON service config the channel is created with."""
    method: Dict[str, Any] = {"name": [{"service": SERVICE}]}
    if retry is not None:
        method["retryPolicy"] = retry.method_config()
    return json.dumps({"loadBalancingConfig": [{load_balancing: {}}],
                       "methodConfig": [method]})


# ------------------------------------------------------------------ tensors

_WIRE_DTYPES = {
    np.dtype(np.float32): softmax_pb2.DTYPE_FLOAT32,
    np.dtype(np.float16): softmax_pb2.DTYPE_FLOAT16,
    np.dtype(np.uint16): softmax_pb2.DTYPE_BFLOAT16,  # raw bfloat16 bits
}


def to_tensor(array: np.ndarray) -> "softmax_pb2.Tensor":
    """A softmax.v1.Tensor holding `array` (little-endian, row-major)."""
    array = np.asarray(array)
    if _ml_dtypes is not None and array.dtype == bfloat16_dtype():
        wire, raw = softmax_pb2.DTYPE_BFLOAT16, array.view(np.uint16)
    elif array.dtype.newbyteorder("=") in _WIRE_DTYPES:
        wire, raw = _WIRE_DTYPES[array.dtype.newbyteorder("=")], array
    else:
        raise TypeError(
            f"softmax-serve takes float32, float16 or bfloat16 arrays, not {array.dtype} "
            "(cast it; bfloat16 is ml_dtypes.bfloat16, or uint16 bits without ml_dtypes)")
    data = np.ascontiguousarray(raw).astype(raw.dtype.newbyteorder("<"), copy=False).tobytes()
    return softmax_pb2.Tensor(dtype=wire, shape=list(array.shape), data=data)


def from_tensor(tensor: "softmax_pb2.Tensor", like: np.dtype) -> np.ndarray:
    """The array a softmax.v1.Tensor holds, with the dtype the caller sent."""
    wire = {softmax_pb2.DTYPE_FLOAT32: "<f4", softmax_pb2.DTYPE_FLOAT16: "<f2",
            softmax_pb2.DTYPE_BFLOAT16: "<u2"}.get(tensor.dtype)
    if wire is None:
        raise SoftmaxError(grpc.StatusCode.INTERNAL, f"response tensor has dtype {tensor.dtype}")
    flat = np.frombuffer(tensor.data, dtype=wire).astype(np.dtype(wire).newbyteorder("="))
    if tensor.dtype == softmax_pb2.DTYPE_BFLOAT16 and like != np.dtype(np.uint16):
        flat = flat.view(like)
    return flat.reshape(tuple(tensor.shape))


# ------------------------------------------------------------------- client

class _Token(grpc.AuthMetadataPlugin):
    def __init__(self, token: str):
        self._metadata = (("authorization", f"Bearer {token}"),)

    def __call__(self, context, callback):
        callback(self._metadata, None)


class Client:
    """A channel to one softmax-serve target.

    Args:
      target: a gRPC target: "host:port", "dns:///svc.ns:50051" (every
        address the name resolves to, e.g. a headless Kubernetes Service) or
        "ipv4:10.0.0.1:50051,10.0.0.2:50051".
      tls: False for plaintext; True for TLS with the system's roots; or
        ready grpc.ChannelCredentials (private CA, client certificates).
      token: sent as "authorization: Bearer <token>" on every call (over TLS
        as call credentials; on a plaintext channel as plain metadata, meant
        for a trusted network or a local proxy only).
      timeout: default deadline of each call, in seconds (None: none).
      retry: the retry policy for UNAVAILABLE; None turns retries off.
      load_balancing: "round_robin" (default: calls spread over every
        address of the target, and a draining one is left at once) or
        "pick_first".
      wait_for_ready: queue calls while no server is reachable (until their
        deadline) instead of failing them fast with UNAVAILABLE.
      chunk_bytes: on streams (stream, softmax_many), a tensor of more bytes
        than this is sent in chunks of this size and its answer, which the
        server sends back in chunks as large, is put back together here;
        0 sends every tensor whole. Unary calls (softmax) always send it
        whole.
      options: extra grpc channel options.

    Message sizes are unlimited on both sides of the channel; the server
    enforces its own --max_tensor_bytes.
    """

    def __init__(self, target: str, *, tls: Union[bool, grpc.ChannelCredentials] = False,
                 token: Optional[str] = None, timeout: Optional[float] = 60.0,
                 retry: Optional[RetryPolicy] = DEFAULT_RETRY_POLICY,
                 load_balancing: str = "round_robin", wait_for_ready: bool = False,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 options: Sequence[Tuple[str, Any]] = ()):
        if chunk_bytes < 0:
            raise ValueError(f"chunk_bytes must be >= 0, not {chunk_bytes}")
        self._chunk_bytes = int(chunk_bytes)
        channel_options: List[Tuple[str, Any]] = [
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            ("grpc.enable_retries", 1 if retry is not None else 0),
            ("grpc.service_config", service_config(retry, load_balancing)),
            *options,
        ]
        self._metadata: Tuple[Tuple[str, str], ...] = ()
        if tls:
            credentials = (tls if isinstance(tls, grpc.ChannelCredentials)
                           else grpc.ssl_channel_credentials())
            if token:
                credentials = grpc.composite_channel_credentials(
                    credentials, grpc.metadata_call_credentials(_Token(token)))
            self._channel = grpc.secure_channel(target, credentials, options=channel_options)
        else:
            if token:
                self._metadata = (("authorization", f"Bearer {token}"),)
            self._channel = grpc.insecure_channel(target, options=channel_options)
        self._timeout = timeout
        self._wait_for_ready = wait_for_ready
        # Totals over every stream of this client (StreamResults' counts).
        self._counts_lock = threading.Lock()
        self.stream_reopens = 0
        self.resent_requests = 0
        self.streams_lost = 0
        self.resent_after_loss = 0
        serialize = softmax_pb2.SoftmaxRequest.SerializeToString
        parse = softmax_pb2.SoftmaxResponse.FromString
        self._unary = self._channel.unary_unary(_UNARY, request_serializer=serialize,
                                                response_deserializer=parse)
        self._stream = self._channel.stream_stream(_STREAM, request_serializer=serialize,
                                                   response_deserializer=parse)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        self._channel.close()

    @property
    def channel(self) -> grpc.Channel:
        """The underlying channel (for health checks and the like)."""
        return self._channel

    def _deadline(self, timeout: Optional[float]) -> Optional[float]:
        return self._timeout if timeout is None else timeout

    def softmax(self, array: np.ndarray, axis: int = -1, temperature: float = 1.0,
                log: bool = False, *, top_k: int = 0, timeout: Optional[float] = None
                ) -> Union[np.ndarray, Tuple[np.ndarray, np.ndarray]]:
        """softmax(array / temperature) along `axis` (log-softmax when `log`),
        computed by the server in float32 or wider; returns an array of the
        input's shape and dtype.

        With `top_k` = K > 0 only the K largest values of each row along
        `axis` come back: returns (values, indices), both of the input's
        shape with that axis K long, values in the input's dtype and indices
        int64, sorted by value descending, equal values lower index first
        (the same for a row whatever else the server batched with it).

        Raises SoftmaxError with the server's gRPC code: INVALID_ARGUMENT for
        a bad axis or temperature or a tensor over --max_tensor_bytes,
        DEADLINE_EXCEEDED past `timeout` seconds (default: the client's),
        UNAVAILABLE once retries are spent; TypeError for an unsupported
        dtype before anything is sent."""
        array = np.asarray(array)
        request = _request(array, axis, temperature, log)
        request.top_k = int(top_k)
        try:
            response = self._unary(request, timeout=self._deadline(timeout),
                                   metadata=self._metadata or None,
                                   wait_for_ready=self._wait_for_ready)
        except grpc.RpcError as error:
            raise SoftmaxError(error.code(), error.details() or "") from None
        if top_k > 0:
            return _top_k_arrays(response.top_k, array.dtype)
        return from_tensor(response.output, array.dtype)

    def stream(self, arrays: Iterable[Union[np.ndarray, Tuple[np.ndarray, Dict[str, Any]]]],
               *, timeout: Optional[float] = None) -> "StreamResults":
        """Sends every array on a SoftmaxStream and yields a StreamResult per
        array as answers arrive (the server may answer out of order; `index`
        says which request each is). An item is an array or (array, kwargs)
        with kwargs among axis / temperature / log / top_k (its result then
        carries `top_k` instead of `output`). A bad request gets a
        result carrying its error and the stream goes on.

        A stream the server ends with UNAVAILABLE (its maximum stream age, a
        drain; also a reset or a lost connection) is reopened and the requests
        it left unanswered are sent again, whole: every array gets exactly
        one result. The returned iterator counts that in `reopens` and
        `resent_requests` (the Client adds them up in `stream_reopens` and
        `resent_requests`); of those, `streams_lost` and `resent_after_loss`
        count the streams the transport lost rather than the server ended
        (no `softmax-stream-end` trailer), after which the server may compute
        a resent request twice. Reopening stops at the deadline, or once no
        answer came for REOPEN_PATIENCE_S; any other failure of the stream
        raises SoftmaxError at once. `timeout` bounds the whole stream,
        reopens included."""
        return StreamResults(self, arrays, self._deadline(timeout))

    def _count_reopen(self, resent: int, lost: bool) -> None:
        with self._counts_lock:
            self.stream_reopens += 1
            self.resent_requests += resent
            if lost:
                self.streams_lost += 1
                self.resent_after_loss += resent

    def softmax_many(self, arrays: Iterable[np.ndarray], axis: int = -1,
                     temperature: float = 1.0, log: bool = False, *,
                     timeout: Optional[float] = None) -> List[np.ndarray]:
        """Every array through one stream, results in the arrays' order;
        raises the first request's SoftmaxError if any failed."""
        items = [(a, {"axis": axis, "temperature": temperature, "log": log}) for a in arrays]
        results: List[Optional[np.ndarray]] = [None] * len(items)
        for result in self.stream(items, timeout=timeout):
            if result.error is not None:
                raise result.error
            results[result.index] = result.output
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:
            raise SoftmaxError(grpc.StatusCode.INTERNAL, f"no answer for requests {missing[:5]}")
        return results  # type: ignore[return-value]


class StreamResults:
    """What Client.stream returns: an iterator of StreamResult that reopens
    the stream when the server ends it with UNAVAILABLE. `reopens` counts the
    streams opened again, `resent_requests` the requests sent again on them
    (those the stream before left unanswered); `streams_lost` and
    `resent_after_loss` the part of those after ends the server did not say
    it made (STREAM_END_KEY). The stream opens on the first next(); close()
    cancels it."""

    def __init__(self, client: "Client", arrays: Iterable[Any], timeout: Optional[float]):
        self.reopens = 0
        self.resent_requests = 0
        self.streams_lost = 0
        self.resent_after_loss = 0
        self._results = self._run(client, _RequestFeed(arrays, client._chunk_bytes), timeout)

    def __iter__(self) -> "StreamResults":
        return self

    def __next__(self) -> StreamResult:
        return next(self._results)

    def close(self) -> None:
        self._results.close()

    def _run(self, client: "Client", feed: "_RequestFeed",
             timeout: Optional[float]) -> Iterator[StreamResult]:
        deadline = None if timeout is None else time.monotonic() + timeout
        backoff = 0.0
        unanswered_since: Optional[float] = None  # no answer since then
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise SoftmaxError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   "the stream's deadline passed while reopening it")
            call = client._stream(feed.messages(), timeout=remaining,
                                  metadata=client._metadata or None,
                                  wait_for_ready=client._wait_for_ready)
            answered = False
            # Answers arriving in chunks: request_id -> (first chunk, parts, bytes).
            assembling: Dict[str, Tuple[Any, List[bytes], int]] = {}
            try:
                for response in call:
                    result = self._take(response, feed, assembling)
                    if result is None:
                        continue
                    answered, unanswered_since, backoff = True, None, 0.0
                    yield result
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE:
                    raise SoftmaxError(error.code(), error.details() or "") from None
                details = error.details() or ""
                lost = not any(key == STREAM_END_KEY
                               for key, _ in (error.trailing_metadata() or ()))
            except BaseException:  # the caller stopped reading, or a bad answer
                call.cancel()
                raise
            else:
                if assembling:
                    raise SoftmaxError(grpc.StatusCode.INTERNAL,
                                       f"the stream ended within the answers to requests "
                                       f"{sorted(int(i) for i in assembling)[:5]}")
                if not feed.done():
                    raise SoftmaxError(grpc.StatusCode.INTERNAL,
                                       f"the stream ended OK without answering requests "
                                       f"{feed.unanswered()[:5]}")
                return
            # UNAVAILABLE: what this stream left unanswered goes on the next;
            # a partly received answer is dropped with `assembling`.
            if feed.done():
                return
            now = time.monotonic()
            if not answered and unanswered_since is None:
                unanswered_since = now
            if unanswered_since is not None and now - unanswered_since > REOPEN_PATIENCE_S:
                raise SoftmaxError(grpc.StatusCode.UNAVAILABLE,
                                   f"no answer for {REOPEN_PATIENCE_S:g} s of reopening the "
                                   f"stream: {details}")
            if deadline is not None and now + backoff >= deadline:
                raise SoftmaxError(grpc.StatusCode.UNAVAILABLE,
                                   f"the stream's deadline leaves no time to reopen it: {details}")
            resent = feed.requeue()
            self.reopens += 1
            self.resent_requests += resent
            if lost:
                self.streams_lost += 1
                self.resent_after_loss += resent
            client._count_reopen(resent, lost)
            time.sleep(backoff)
            backoff = min(REOPEN_BACKOFF_MAX_S, max(REOPEN_BACKOFF_S, 2 * backoff))

    @staticmethod
    def _take(response: Any, feed: "_RequestFeed",
              assembling: Dict[str, Tuple[Any, List[bytes], int]]) -> Optional[StreamResult]:
        """The result `response` completes, or None for a chunk of an answer
        that goes on."""
        index = int(response.request_id)
        if response.error.code:
            assembling.pop(response.request_id, None)
            error = SoftmaxError(_status_code(response.error.code), response.error.message,
                                 response.request_id)
            feed.answered(index)
            return StreamResult(index, None, error, response.timing)
        output = response.output
        if response.chunk_offset or response.more_chunks:
            first, parts, received = assembling.pop(response.request_id, (response, [], 0))
            if response.chunk_offset != received:
                raise SoftmaxError(
                    grpc.StatusCode.INTERNAL,
                    f"answer to request {index}: chunk at offset "
                    f"{response.chunk_offset}, expected {received}", response.request_id)
            parts.append(response.output.data)
            received += len(response.output.data)
            if response.more_chunks:
                assembling[response.request_id] = (first, parts, received)
                return None
            output = softmax_pb2.Tensor(dtype=first.output.dtype, shape=first.output.shape,
                                        data=b"".join(parts))
            response = first
        dtype = feed.answered(index)
        if response.HasField("top_k"):
            return StreamResult(index, None, None, response.timing,
                                _top_k_arrays(response.top_k, dtype))
        return StreamResult(index, from_tensor(output, dtype), None, response.timing)


class _RequestFeed:
    """The requests of one Client.stream across the gRPC streams that carry
    it: each stream's messages() first sends again what the stream before
    left unanswered (oldest first), then takes new items from the caller's
    iterable. Every item stays here until its answer arrives. Thread-safe:
    gRPC reads messages() on a thread of its own, and a stream that ended may
    still be reading its own while the next one starts; it stops at the next
    item (requeue() makes it stale), and an item it took is sent again. The
    caller's iterable is read under a lock of its own (`_pull_lock`), never
    under `_lock`: an iterable that waits for an earlier answer before it
    yields the next array must not keep answered() waiting."""

    def __init__(self, arrays: Iterable[Any], chunk_bytes: int):
        self._arrays = iter(arrays)
        self._chunk_bytes = chunk_bytes
        self._pull_lock = threading.Lock()  # taken before _lock, never after
        self._lock = threading.Lock()
        self._generation = 0
        self._next_index = 0
        self._exhausted = False
        self._unanswered: Dict[int, Tuple[np.ndarray, Dict[str, Any]]] = {}
        self._resend: "collections.deque[int]" = collections.deque()

    def messages(self) -> Iterator["softmax_pb2.SoftmaxRequest"]:
        with self._lock:
            generation = self._generation
        while True:
            with self._lock:
                if generation != self._generation:
                    return  # a newer stream sends from here on
                if self._resend:
                    index = self._resend.popleft()
                    array, kwargs = self._unanswered[index]
                elif self._exhausted:
                    return
                else:
                    index = None
            if index is None:
                with self._pull_lock:
                    try:
                        item = next(self._arrays)
                    except StopIteration:
                        with self._lock:
                            self._exhausted = True
                        continue  # what a stale stream took may wait in _resend
                    array, kwargs = item if isinstance(item, tuple) else (item, {})
                    array = np.asarray(array)
                    with self._lock:
                        index = self._next_index
                        self._next_index += 1
                        self._unanswered[index] = (array, kwargs)
                        if generation != self._generation:
                            # A newer stream took over while this one waited
                            # for the item: that stream sends it.
                            self._resend.append(index)
                            return
            yield from _chunks(_request(array, request_id=str(index), **kwargs),
                               self._chunk_bytes)

    def answered(self, index: int) -> np.dtype:
        """Forgets request `index`, answered; returns its array's dtype."""
        with self._lock:
            item = self._unanswered.pop(index, None)
        if item is None:
            raise SoftmaxError(grpc.StatusCode.INTERNAL,
                               f"an answer to request {index}, which awaits none", str(index))
        return item[0].dtype

    def requeue(self) -> int:
        """The stream ended: every unanswered request is to be sent again on
        the next one. Returns how many."""
        with self._lock:
            self._generation += 1
            self._resend = collections.deque(sorted(self._unanswered))
            return len(self._resend)

    def unanswered(self) -> List[int]:
        with self._lock:
            return sorted(self._unanswered)

    def done(self) -> bool:
        """Every item taken and answered."""
        with self._lock:
            return self._exhausted and not self._unanswered


def _status_code(value: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return code
    return grpc.StatusCode.UNKNOWN


def _chunks(request: "softmax_pb2.SoftmaxRequest",
            chunk_bytes: int) -> Iterator["softmax_pb2.SoftmaxRequest"]:
    """`request` itself, or its messages in chunks of `chunk_bytes` (the
    first carries everything but the rest of the data; the later ones their
    data, offset and more_chunks) when its data is larger."""
    data = request.input.data
    if chunk_bytes <= 0 or len(data) <= chunk_bytes:
        yield request
        return
    view = memoryview(data)
    request.input.data = bytes(view[:chunk_bytes])
    request.more_chunks = True
    yield request
    for offset in range(chunk_bytes, len(data), chunk_bytes):
        yield softmax_pb2.SoftmaxRequest(
            request_id=request.request_id, chunk_offset=offset,
            input=softmax_pb2.Tensor(data=bytes(view[offset:offset + chunk_bytes])),
            more_chunks=offset + chunk_bytes < len(data))


def _request(array: np.ndarray, axis: int = -1, temperature: float = 1.0, log: bool = False,
             request_id: str = "", top_k: int = 0) -> "softmax_pb2.SoftmaxRequest":
    return softmax_pb2.SoftmaxRequest(request_id=request_id, input=to_tensor(array),
                                      axis=int(axis), temperature=float(temperature),
                                      log=bool(log), top_k=int(top_k))


def _top_k_arrays(top_k: "softmax_pb2.TopK",
                  like: np.dtype) -> Tuple[np.ndarray, np.ndarray]:
    """(values, indices) of a softmax.v1 TopK: values in the caller's dtype,
    indices int64, both of the values' shape."""
    values = from_tensor(top_k.values, like)
    indices = np.frombuffer(top_k.indices, dtype="<i8").astype(np.int64)
    return values, indices.reshape(values.shape)
