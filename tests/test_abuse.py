"""What hostile or unlucky clients do to the transport: each case is a
regression test of one way the server fell over (issue 17), at a scale that
runs in seconds on loopback."""

import os
import socket
import time
import urllib.request

import grpc
import numpy as np
import pytest

import e2e_util
from bench.lib import h2 as h2_util
from e2e_util import metric_value, request, requests_counted, scrape_metrics, wait_for

SOFTMAX_PATH = "/softmax.v1.SoftmaxService/Softmax"


def test_unary_call_reset_before_its_message_arrived_counts_cancelled(server):
    """A unary call whose client resets it halfway through the message is
    CANCELLED in the metrics, not INVALID_ARGUMENT (which blames the caller)."""
    cancelled = requests_counted(server, "CANCELLED")
    invalid = requests_counted(server, "INVALID_ARGUMENT")
    connection = h2_util.Connection(server.grpc_address)
    try:
        connection.reset_unary_calls_halfway(SOFTMAX_PATH)
        wait_for(lambda: requests_counted(server, "CANCELLED") >= cancelled + 3, 10,
                 "three CANCELLED unary calls")
    finally:
        connection.close()
    assert requests_counted(server, "INVALID_ARGUMENT") == invalid


def test_deadline_drop_is_labelled_deadline_exceeded(start_server):
    """A request whose deadline passes while it is queued is dropped as
    deadline_exceeded (gRPC also marks such a call cancelled; the deadline
    is the cause). Also fails when deadlines do not reach the batcher."""
    server = start_server("--max_queue_delay_us=1500000", env=e2e_util.HOLD_IN_QUEUE)
    stub = server.stub()
    with pytest.raises(grpc.RpcError) as caught:
        stub.Softmax(request(np.zeros((1, 8))), timeout=0.3)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    def dropped(reason):
        return metric_value(scrape_metrics(server.metrics_address),
                            "softmax_dropped_requests_total", {"reason": reason}) or 0

    wait_for(lambda: dropped("deadline_exceeded") >= 1, 10, "the deadline drop")
    assert dropped("cancelled") == 0
    assert requests_counted(server, "DEADLINE_EXCEEDED") == 1


def test_occupied_grpc_port_fails_with_exit_1(server):
    """No SO_REUSEPORT: a second server on the first one's port must not
    start sharing it."""
    result = e2e_util.run_server(f"--grpc_address={server.grpc_address}",
                                 "--metrics_address=", "--device=cpu", timeout=30)
    assert result.returncode == 1, result.stderr
    assert "cannot listen" in result.stderr and "listening" not in result.stderr.replace(
        "cannot listen", ""), result.stderr


def _raw_request_bytes(request_id_bytes):
    """A SoftmaxRequest on the wire whose request_id (field 1) is any bytes,
    which the Python protobuf library would refuse to encode."""
    body = request(np.zeros((1, 4))).SerializeToString()
    return (e2e_util.varint(1 << 3 | 2) + e2e_util.varint(len(request_id_bytes)) +
            request_id_bytes + body)


@pytest.mark.parametrize("request_id", [b"x" * 257, b"\xff\xfe", b"ok\xc0\xaf"])
def test_bad_request_id_is_invalid_argument_unary(server, request_id):
    call = server.channel().unary_unary(SOFTMAX_PATH)
    with pytest.raises(grpc.RpcError) as caught:
        call(_raw_request_bytes(request_id), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    if len(request_id) > 256:  # invalid UTF-8 already fails protobuf's parse
        assert "request_id" in caught.value.details()


def test_bad_request_id_on_a_stream_is_an_error_response_not_echoed(server):
    """The stream goes on: the error response carries no request_id (an
    invalid one echoed would make the whole stream unparseable), and the
    next request is answered."""
    call = server.channel().stream_stream("/softmax.v1.SoftmaxService/SoftmaxStream")
    good = request(np.zeros((1, 4)), request_id="good").SerializeToString()
    responses = list(call(iter([_raw_request_bytes(b"\xff" * 3),
                                _raw_request_bytes(b"y" * 300), good]), timeout=10))
    parsed = [e2e_util.softmax_pb2.SoftmaxResponse.FromString(r) for r in responses]
    assert len(parsed) == 3
    errors = [p for p in parsed if p.error.code]
    assert len(errors) == 2
    for p in errors:
        assert p.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert p.request_id == ""
    assert any("request_id" in p.error.message for p in errors)
    assert [p.request_id for p in parsed if not p.error.code] == ["good"]


def test_max_concurrent_streams_is_advertised(start_server):
    for args, expected in (((), 1024), (("--max_concurrent_streams=7",), 7)):
        server = start_server(*args)
        connection = h2_util.Connection(server.grpc_address)
        try:
            settings = connection.server_settings()
        finally:
            connection.close()
        assert settings.get(h2_util.SETTINGS_MAX_CONCURRENT_STREAMS) == expected, settings


def test_connections_without_a_preface_are_closed_after_the_handshake_timeout(server):
    """Sockets that never send the HTTP/2 preface are closed within the 5 s
    handshake timeout (gRPC's default, 120 s, let them pile up)."""
    host, port = server.grpc_address.rsplit(":", 1)
    sockets = [socket.create_connection((host, int(port)), timeout=5) for _ in range(20)]
    try:
        for sock in sockets:
            assert h2_util.closed_by_peer(sock, timeout=8), "a silent connection was kept open"
    finally:
        for sock in sockets:
            sock.close()
    # The server still answers.
    server.stub().Softmax(request(np.zeros((1, 4))), timeout=10)


def _rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_compressed_request_is_refused_before_inflating(start_server):
    """A gzip bomb (64 MiB of zeros, about 64 KiB compressed) is refused with
    UNIMPLEMENTED without the server inflating it: RSS grows far less than
    the bomb's size, and the server keeps answering."""
    server = start_server("--max_tensor_bytes=134217728")
    stub = server.stub()
    stub.Softmax(request(np.zeros((1, 4))), timeout=10)  # warm up
    before = _rss_bytes(server.process.pid)
    bomb = request(tensor=e2e_util.softmax_pb2.Tensor(
        dtype=e2e_util.softmax_pb2.DTYPE_FLOAT32, shape=[16, 1 << 20], data=bytes(64 << 20)))
    for _ in range(4):
        with pytest.raises(grpc.RpcError) as caught:
            stub.Softmax(bomb, timeout=30, compression=grpc.Compression.Gzip)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED, caught.value
    assert _rss_bytes(server.process.pid) - before < (16 << 20)
    stub.Softmax(request(np.zeros((1, 4))), timeout=10)


def _open_file_limits(pid):
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return soft, hard
    raise AssertionError("no open-file limit")


def test_open_file_soft_limit_is_raised_to_the_hard_limit(tmp_path):
    """Started with a soft limit of 256 and a hard one of 4096, the server
    runs with 4096."""
    import resource

    def lower_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))

    with e2e_util.Server(preexec_fn=lower_limit) as started:
        assert _open_file_limits(started.process.pid) == ("4096", "4096")


def test_metrics_answer_with_50_half_open_connections_held(server):
    """Connections that send half a request and wait must not stall scrapes
    (two of them did, for about 20 s)."""
    host, port = server.metrics_address.rsplit(":", 1)
    held = []
    try:
        for _ in range(50):
            sock = socket.create_connection((host, int(port)), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # headers never end
            held.append(sock)
        for _ in range(3):
            text = scrape_metrics(server.metrics_address, timeout=3)
            assert "softmax_serving" in text
    finally:
        for sock in held:
            sock.close()


RAPID_RESET_PAIRS = 100_000
# The attacker sends a PING after every this many pairs and reads up to its
# ACK, so that at most this many pairs wait unread in the sockets; it never
# waits for a call. Without it, a server starved of CPU (a busy 2-core host)
# let the kernel's loopback buffers (megabytes) take 60,000-100,000 pairs of
# about 70 bytes before it had read them: the count below then measured the
# socket buffers, not the guard, and failed.
RAPID_RESET_PING_EVERY = 500


@pytest.mark.parametrize("path", [
    SOFTMAX_PATH,                                    # counted by its handler
    "/inference.GRPCInferenceService/ModelInfer",    # counted by its handler
    "/inference.GRPCInferenceService/ServerLive",    # a typed method: the interceptor
    "/softmax.v1.SoftmaxService/SoftmaxStream",      # a stream: its first read
    "/inference.GRPCInferenceService/ModelStreamInfer",  # the same reactor
    "/no.Such/Method",                               # no service: the interceptor
])
def test_rapid_reset_connection_is_cut_memory_bounded_and_given_back(server, path):
    """HEADERS + RST_STREAM pairs on one connection (CVE-2023-44487). Without
    a limit, 100,000 pairs took a replica from 23 MB to 1.8 GB here (1.95 GB
    on a 16-core host), ServerLive's still held 15 s after the close
    (bench/soak/rapid_reset.py). The server shuts the connection down once it has reset
    1,000 calls before their message (reset_guard.h): the client's writes
    fail long before 100,000 pairs, RSS stays within 256 MiB of where it was
    (a sanitizer build's calls are larger), returns within 64 MiB of it once
    the connection is gone (but under AddressSanitizer, whose quarantine
    keeps freed memory), and other callers are answered throughout."""
    stub = server.stub()
    stub.Softmax(request(np.zeros((1, 4))), timeout=10)
    before = _rss_bytes(server.process.pid)
    invalid = requests_counted(server, "INVALID_ARGUMENT")
    connection = h2_util.Connection(server.grpc_address, timeout=30)
    peak = before
    sent = 0
    try:
        for sent in range(RAPID_RESET_PAIRS):
            stream_id = 2 * sent + 1
            connection.headers(stream_id, path)
            connection.reset(stream_id)
            if sent % RAPID_RESET_PING_EVERY == RAPID_RESET_PING_EVERY - 1:
                connection.ping()
            if sent % 5000 == 0:
                peak = max(peak, _rss_bytes(server.process.pid))
        cut = False
    except TimeoutError:
        raise
    except OSError:  # broken pipe, reset, EOF: the server ended the connection
        cut = True
    finally:
        connection.close()
    peak = max(peak, _rss_bytes(server.process.pid))
    assert cut, f"{RAPID_RESET_PAIRS} pairs went through on one connection"
    assert sent < RAPID_RESET_PAIRS // 2, f"cut only after {sent} pairs"
    assert peak - before < (256 << 20), f"RSS grew {(peak - before) >> 20} MiB"
    stub.Softmax(request(np.zeros((1, 4))), timeout=10)
    # The backlog's memory goes back (the memory trimmer runs every 10 s);
    # AddressSanitizer's allocator keeps freed memory in its quarantine.
    if not e2e_util.SANITIZED:
        wait_for(lambda: _rss_bytes(server.process.pid) - before < (64 << 20), 30,
                 "RSS to come back within 64 MiB of where it was")
    assert requests_counted(server, "INVALID_ARGUMENT") == invalid
    assert "rapid reset" in server.output()


def _open_descriptors(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def _new_connection(server):
    """A channel with a connection of its own (grpcio shares connections
    between channels to one target unless told otherwise)."""
    return grpc.insecure_channel(
        server.grpc_address,
        options=[*e2e_util.CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)])


def test_server_recovers_after_running_out_of_file_descriptors(start_server):
    """With the open-file limit at 256, idle connections use up every
    descriptor. Meanwhile new callers fail fast (UNAVAILABLE, retryable)
    instead of waiting in the listen queue; once the connections close, a
    new caller is served at once. (gRPC 1.51 alone stops accepting for good
    after the first EMFILE.)"""
    import resource
    limit = 256

    def lower_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    server = start_server(preexec_fn=lower_limit)
    pid = server.process.pid
    host, port = server.grpc_address.rsplit(":", 1)
    stub = server.stub()
    stub.Softmax(request(np.zeros((1, 4))), timeout=10)
    idle = []
    try:
        for _ in range(limit + 64):
            idle.append(socket.create_connection((host, int(port)), timeout=5))
        # (Within the handshake timeout, 5 s, after which they would close.)
        wait_for(lambda: "Too many open files" in server.output(), 4,
                 "the descriptors to run out")
        # A new caller fails fast and retryably while none is free.
        fresh = _new_connection(server)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            e2e_util.softmax_pb2_grpc.SoftmaxServiceStub(fresh).Softmax(
                request(np.zeros((1, 4))), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
        assert time.monotonic() - started < 3
        fresh.close()
    finally:
        for sock in idle:
            sock.close()
    wait_for(lambda: _open_descriptors(pid) < limit // 2, 10, "the connections to close")
    # Served within a second, on a new connection and on the old channel.
    for channel in (_new_connection(server), None):
        caller = e2e_util.softmax_pb2_grpc.SoftmaxServiceStub(channel) if channel else stub
        response = caller.Softmax(request(np.array([[1.0, 2.0]])), timeout=1)
        e2e_util.assert_close(e2e_util.decode(response.output),
                              e2e_util.reference_softmax(np.array([[1.0, 2.0]])), "float32")
    # The HTTP endpoint and /metrics (civetweb) recover too.
    with urllib.request.urlopen(f"http://{server.http_address}/v2/health/ready",
                                timeout=2) as response:
        assert response.status == 200
    assert "softmax_requests_total" in scrape_metrics(server.metrics_address, timeout=2)
    assert server.process.poll() is None


def test_memory_budget_bounds_what_slow_readers_make_the_server_hold(start_server):
    """A caller streams 96 requests of 256 KiB and reads nothing: the server
    holds at most --max_held_bytes of their tensors (plus one request), refuses
    the rest UNAVAILABLE naming the budget, keeps its RSS bounded, and serves
    again once the answers are read."""
    limit = 4 << 20
    process = start_server(f"--max_held_bytes={limit}")
    values = np.random.default_rng(2).normal(size=(64, 1024)).astype(np.float32)  # 256 KiB
    count = 96
    # A caller that reads nothing takes in only its initial flow-control
    # window. gRPC's BDP probe would grow that window by megabytes, by how
    # much depending on timing, until the client's transport had read every
    # answer for it and the server held nothing (held == 0 on a busy 2-core
    # host): a fast reader, not the slow one this test is about.
    channel = grpc.insecure_channel(
        process.grpc_address, options=[*e2e_util.CHANNEL_OPTIONS, ("grpc.http2.bdp_probe", 0)])
    stub = e2e_util.softmax_pb2_grpc.SoftmaxServiceStub(channel)
    rss_before = _rss_bytes(process.process.pid)
    responses = stub.SoftmaxStream(
        iter([request(values, request_id=str(i)) for i in range(count)]), timeout=60)
    # Nothing read yet: the server answers what the budget admits and holds it.
    wait_for(lambda: (metric_value(scrape_metrics(process.metrics_address),
                                   "softmax_held_bytes") or 0) > 0, 10, "bytes held")
    time.sleep(0.5)
    held = metric_value(scrape_metrics(process.metrics_address), "softmax_held_bytes")
    assert 0 < held <= limit + 2 * values.nbytes, held
    assert metric_value(scrape_metrics(process.metrics_address),
                        "softmax_held_bytes_limit") == limit
    # Not under the sanitizers: ASan's quarantine keeps freed memory (up to
    # 256 MiB) out of reuse, so the answers already sent and freed still count
    # in RSS there; the held-bytes figure above is checked either way.
    if not e2e_util.SANITIZED:
        assert _rss_bytes(process.process.pid) - rss_before < limit + (64 << 20)
    ok, refused = 0, 0
    for response in responses:
        if response.HasField("error"):
            assert response.error.code == grpc.StatusCode.UNAVAILABLE.value[0], response.error
            assert "memory budget" in response.error.message
            refused += 1
        else:
            ok += 1
    assert ok + refused == count
    assert ok >= 4 and refused >= count // 2, (ok, refused)
    wait_for(lambda: metric_value(scrape_metrics(process.metrics_address),
                                  "softmax_held_bytes") == 0, 10, "the budget given back")
    answer = stub.Softmax(request(values), timeout=30)
    assert answer.output.shape == [64, 1024]
    channel.close()
