"""The soak's abuse bursts: the hostile and unlucky clients of
tests/test_abuse.py, at a small scale, run one after another while the normal
load goes on. Each case records what the server answered; an answer other
than the one docs/clients.md promises is an `unexpected` entry, which fails the
soak. The frames of the raw HTTP/2 cases come from bench.lib.h2.
"""

import socket
import struct
import threading
import time
import urllib.request

import grpc
import numpy as np
from softmax.v1 import softmax_pb2, softmax_pb2_grpc

from bench.lib import h2, tensors

SOFTMAX_PATH = "/softmax.v1.SoftmaxService/Softmax"
STREAM_PATH = "/softmax.v1.SoftmaxService/SoftmaxStream"
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5
DEFAULT_WINDOW, DEFAULT_FRAME = 65535, 16384

# Per burst: connections that advertise a receive window of 0 send unary
# calls of 256 KiB, so that every answer stays in the server; as many calls
# as hold (in + out) this much more than --max_held_bytes (or 160 MiB when
# unbounded), at most this many per connection.
ZERO_WINDOW_OVERSHOOT = 1.25
ZERO_WINDOW_UNBOUNDED_BYTES = 160 << 20
ZERO_WINDOW_CALLS_PER_CONNECTION = 500
ZERO_WINDOW_HOLD_S = 4.0
RAPID_RESET_PAIRS = 1000
IDLE_CONNECTIONS = 200
HALF_OPEN_CONNECTIONS = 50
SEND_TIMEOUT_S = 30.0
HOLD_S = 2.0


class Bursts:
    """When bursts run: .active() is true from a burst's start until
    `linger_s` after its end (answers to the normal load in flight when it
    ended are still the burst's)."""

    def __init__(self, linger_s=5.0):
        self.linger_s = linger_s
        self._lock = threading.Lock()
        self._running = False
        self._until = 0.0
        self.windows = []  # [start, end] monotonic seconds of each burst

    def begin(self):
        with self._lock:
            self._running = True
            self.windows.append([time.monotonic(), None])

    def end(self):
        with self._lock:
            self._running = False
            self.windows[-1][1] = time.monotonic()
            self._until = time.monotonic() + self.linger_s

    def active(self):
        with self._lock:
            return self._running or time.monotonic() < self._until


def _raw_softmax_request(request_id_bytes, values):
    """A SoftmaxRequest on the wire whose request_id (field 1) is any bytes,
    which the Python protobuf library would refuse to encode."""
    body = tensors.request(values).SerializeToString()
    return (tensors.varint(1 << 3 | 2) + tensors.varint(len(request_id_bytes)) +
            request_id_bytes + body)


class ZeroWindowConnection:
    """An HTTP/2 connection that advertises an initial stream window of 0:
    the server may send its answers' HEADERS but never their DATA. Sends
    requests within the server's flow-control windows and acknowledges its
    SETTINGS and PINGs from a reader thread, so that the connection stays
    healthy while nothing is read."""

    def __init__(self, address):
        self.connection = h2.Connection(address, preface=False)
        # Long enough for a send into a busy server's full socket buffer.
        self.connection.sock.settimeout(SEND_TIMEOUT_S)
        self._send_lock = threading.Lock()
        self._window = threading.Condition()
        self.connection_window = DEFAULT_WINDOW
        self.initial_window = DEFAULT_WINDOW
        self.max_frame = DEFAULT_FRAME
        self.stream_windows = {}
        self.headers = set()       # streams whose answer began (HEADERS)
        self.trailers_only = set()  # streams answered with an error at once
        self.resets = set()
        self.goaway = False
        self._closed = False
        self._send(h2.PREFACE + h2.frame(
            h2.SETTINGS, 0, 0, struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, 0)))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _send(self, data):
        with self._send_lock:
            self.connection.sock.sendall(data)

    def _read(self):
        while not self._closed:
            try:
                kind, flags, stream_id, payload = self.connection.read_frame()
            except socket.timeout:
                continue
            except OSError:
                break
            with self._window:
                if kind == h2.SETTINGS and not flags & h2.ACK:
                    for i in range(0, len(payload), 6):
                        key, value = struct.unpack(">HI", payload[i:i + 6])
                        if key == SETTINGS_INITIAL_WINDOW_SIZE:
                            delta = value - self.initial_window
                            self.initial_window = value
                            for sid in self.stream_windows:
                                self.stream_windows[sid] += delta
                        elif key == SETTINGS_MAX_FRAME_SIZE:
                            self.max_frame = value
                    self._send(h2.frame(h2.SETTINGS, h2.ACK, 0))
                elif kind == h2.WINDOW_UPDATE:
                    increment = struct.unpack(">I", payload[:4])[0] & 0x7FFFFFFF
                    if stream_id == 0:
                        self.connection_window += increment
                    elif stream_id in self.stream_windows:
                        self.stream_windows[stream_id] += increment
                elif kind == h2.PING and not flags & h2.ACK:
                    self._send(h2.frame(h2.PING, h2.ACK, 0, payload))
                elif kind == h2.HEADERS:
                    self.headers.add(stream_id)
                    if flags & h2.END_STREAM:
                        self.trailers_only.add(stream_id)
                elif kind == h2.RST_STREAM:
                    self.resets.add(stream_id)
                elif kind == h2.GOAWAY:
                    self.goaway = True
                self._window.notify_all()

    def call(self, stream_id, body, timeout=10.0):
        """Sends one unary call, waiting for window as needed; False when the
        server's windows stayed shut for `timeout` seconds."""
        with self._window:
            self.stream_windows[stream_id] = self.initial_window
        with self._send_lock:
            self.connection.headers(stream_id, SOFTMAX_PATH)
        message = h2.grpc_message(body)
        at = 0
        deadline = time.monotonic() + timeout
        while at < len(message):
            with self._window:
                while min(self.connection_window, self.stream_windows[stream_id]) <= 0:
                    if self.goaway or not self._window.wait(deadline - time.monotonic()):
                        return False
                size = min(self.max_frame, self.connection_window,
                           self.stream_windows[stream_id], len(message) - at)
                self.connection_window -= size
                self.stream_windows[stream_id] -= size
            last = at + size == len(message)
            self._send(h2.frame(h2.DATA, h2.END_STREAM if last else 0,
                                     stream_id, message[at:at + size]))
            at += size
        return True

    def close(self):
        self._closed = True
        try:
            self.connection.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader
        except OSError:
            pass
        self.connection.close()
        self._reader.join(timeout=2)


def zero_window_readers(context):
    """Unary calls of 256 KiB from connections that read no answer: the
    server holds what its budget admits, refuses the rest, and lets all of
    it go once the connections close."""
    values = np.random.default_rng(3).normal(size=(64, 1024)).astype(np.float32)
    body = tensors.request(values).SerializeToString()
    target = context.held_limit * ZERO_WINDOW_OVERSHOOT or ZERO_WINDOW_UNBOUNDED_BYTES
    calls = -(-int(target) // (2 * values.nbytes))
    count = -(-calls // ZERO_WINDOW_CALLS_PER_CONNECTION)
    connections = [ZeroWindowConnection(context.grpc) for _ in range(count)]
    outcome = {"calls": 0, "sent": 0, "answer_headers": 0, "refused_at_once": 0,
               "max_held_bytes_seen": 0}
    try:
        for connection in connections:
            for i in range(-(-calls // count)):
                outcome["calls"] += 1
                if not connection.call(2 * i + 1, body):
                    break
                outcome["sent"] += 1
        deadline = time.monotonic() + ZERO_WINDOW_HOLD_S
        while time.monotonic() < deadline:
            held = context.scrape().get("softmax_held_bytes", 0)
            outcome["max_held_bytes_seen"] = max(outcome["max_held_bytes_seen"], held)
            time.sleep(0.5)
    finally:
        for connection in connections:
            outcome["answer_headers"] += len(connection.headers)
            outcome["refused_at_once"] += len(connection.trailers_only)
            connection.close()
    unexpected = []
    if outcome["sent"] < outcome["calls"]:
        unexpected.append(f"only {outcome['sent']} of {outcome['calls']} calls could be sent")
    limit = context.held_limit
    if limit and outcome["max_held_bytes_seen"] > limit + 2 * 2 * values.nbytes:
        unexpected.append(f"held {outcome['max_held_bytes_seen']} bytes > budget {limit}")
    return outcome, unexpected


def rapid_reset(context):
    """HEADERS + RST_STREAM pairs on one connection (CVE-2023-44487)."""
    connection = h2.Connection(context.grpc)
    try:
        for i in range(RAPID_RESET_PAIRS):
            connection.headers(2 * i + 1, SOFTMAX_PATH)
            connection.reset(2 * i + 1)
    except OSError as error:  # the server may close such a connection: fine
        return {"pairs": RAPID_RESET_PAIRS, "closed_by_server": str(error)}, []
    finally:
        connection.close()
    return {"pairs": RAPID_RESET_PAIRS}, []


def reset_before_message(context):
    """Unary calls reset halfway through their message."""
    connection = h2.Connection(context.grpc)
    try:
        connection.reset_unary_calls_halfway(SOFTMAX_PATH)
    finally:
        connection.close()
    return {"calls": 3}, []


def idle_connections(context):
    """Many TCP connections that never send the HTTP/2 preface, held a while."""
    host, port = context.grpc.rsplit(":", 1)
    sockets = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            sockets.append(socket.create_connection((host, int(port)), timeout=5))
        time.sleep(HOLD_S)
    finally:
        for sock in sockets:
            sock.close()
    return {"connections": len(sockets)}, []


def half_open_http(context):
    """HTTP requests whose headers never end, on /metrics and on the KServe
    HTTP port; /metrics must keep answering meanwhile."""
    held = []
    unexpected = []
    try:
        for address in filter(None, (context.metrics, context.http)):
            host, port = address.rsplit(":", 1)
            for _ in range(HALF_OPEN_CONNECTIONS):
                sock = socket.create_connection((host, int(port)), timeout=5)
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                held.append(sock)
        started = time.monotonic()
        try:
            with urllib.request.urlopen(f"http://{context.metrics}/metrics", timeout=5) as r:
                r.read()
        except OSError as error:
            unexpected.append(f"/metrics did not answer with half-open connections: {error}")
        scrape_s = time.monotonic() - started
    finally:
        for sock in held:
            sock.close()
    return {"connections": len(held), "scrape_s": round(scrape_s, 3)}, unexpected


def bad_request_ids(context):
    """request_id over 256 bytes (unary) and invalid UTF-8 (on a stream):
    INVALID_ARGUMENT, and the stream goes on."""
    values = np.zeros((1, 4), np.float32)
    unexpected = []
    with grpc.insecure_channel(context.grpc, options=tensors.CHANNEL_OPTIONS) as channel:
        try:
            channel.unary_unary(SOFTMAX_PATH)(_raw_softmax_request(b"x" * 300, values), timeout=30)
            unexpected.append("a 300-byte request_id was accepted")
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.INVALID_ARGUMENT:
                unexpected.append(f"300-byte request_id: {error.code().name}")
        good = tensors.request(values, request_id="good").SerializeToString()
        try:
            answers = list(channel.stream_stream(STREAM_PATH)(
                iter([_raw_softmax_request(b"\xff" * 3, values), good]), timeout=30))
            parsed = [softmax_pb2.SoftmaxResponse.FromString(a) for a in answers]
            codes = [p.error.code for p in parsed]
            if sorted(codes) != [0, grpc.StatusCode.INVALID_ARGUMENT.value[0]]:
                unexpected.append(f"stream with an invalid UTF-8 request_id: codes {codes}")
        except grpc.RpcError as error:
            unexpected.append(f"stream with an invalid UTF-8 request_id: {error.code().name}")
    return {"calls": 2}, unexpected


def too_big_tensors(context):
    """A tensor past --max_tensor_bytes, and a gzip bomb (refused before
    it is inflated)."""
    unexpected = []
    outcome = {}
    big = softmax_pb2.SoftmaxRequest(input=softmax_pb2.Tensor(
        dtype=softmax_pb2.DTYPE_FLOAT32, shape=[1, context.too_big_bytes // 4],
        data=bytes(context.too_big_bytes)))
    bomb = softmax_pb2.SoftmaxRequest(input=softmax_pb2.Tensor(
        dtype=softmax_pb2.DTYPE_FLOAT32, shape=[16, 1 << 20], data=bytes(64 << 20)))
    with grpc.insecure_channel(context.grpc, options=tensors.CHANNEL_OPTIONS) as channel:
        stub = softmax_pb2_grpc.SoftmaxServiceStub(channel)
        for name, request, compression, expected in (
                ("too_big", big, None, {"RESOURCE_EXHAUSTED", "INVALID_ARGUMENT"}),
                ("gzip_bomb", bomb, grpc.Compression.Gzip, {"UNIMPLEMENTED"})):
            try:
                stub.Softmax(request, timeout=60, compression=compression)
                outcome[name] = "OK"
            except grpc.RpcError as error:
                outcome[name] = error.code().name
            if outcome[name] not in expected:
                unexpected.append(f"{name}: {outcome[name]}, expected one of {sorted(expected)}")
    return outcome, unexpected


CASES = [zero_window_readers, rapid_reset, reset_before_message, idle_connections,
         half_open_http, bad_request_ids, too_big_tensors]


class Abuser(threading.Thread):
    """Runs every case once per burst: the first burst at `first_s`, then
    every `every_s` seconds, until `stop` is set."""

    def __init__(self, context, bursts, stop, first_s, every_s):
        super().__init__(name="abuse", daemon=True)
        self.context = context
        self.bursts = bursts
        self.stop = stop
        self.first_s = first_s
        self.every_s = every_s
        self.results = {case.__name__: {"runs": 0, "unexpected": [], "last": None}
                        for case in CASES}
        self.crashed = None

    def run(self):
        try:
            next_at = time.monotonic() + self.first_s
            while not self.stop.wait(max(0.0, next_at - time.monotonic())):
                self.bursts.begin()
                try:
                    for case in CASES:
                        if self.stop.is_set():
                            break
                        try:
                            outcome, unexpected = case(self.context)
                        except Exception as error:  # e.g. the server refused to connect
                            outcome, unexpected = None, [f"raised {type(error).__name__}: {error}"]
                        entry = self.results[case.__name__]
                        entry["runs"] += 1
                        entry["last"] = outcome
                        entry["unexpected"].extend(unexpected)
                finally:
                    self.bursts.end()
                next_at += self.every_s
                while next_at < time.monotonic():
                    next_at += self.every_s
        except Exception as error:  # a bug of the soak itself: reported, fails the run
            self.crashed = f"{type(error).__name__}: {error}"

    def unexpected(self):
        return [f"{name}: {text}" for name, entry in self.results.items()
                for text in entry["unexpected"]]
