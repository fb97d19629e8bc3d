"""Connection management as callers that changed nothing see it.

With the default flags the server ends no connection and no stream on its
own initiative while its caller keeps it: a plain grpcio stream and a
tritonclient stream live on, and unary callers without a retry policy never
fail. `--max_connection_age_s` (opt-in) sends each connection a GOAWAY at
its age (gRPC adds +-10% jitter) so that callers balancing by themselves
reconnect; the calls and streams open on it live on. `--max_stream_age_s`
(opt-in) ends a stream at its age with a retryable UNAVAILABLE once the
messages it read are answered."""

import queue
import threading
import time

import grpc
import numpy as np
import pytest

import e2e_util
from bench.lib import h2 as h2_util
from e2e_util import assert_close, decode, reference_softmax, request, requests_counted

AGE_S = 1


@pytest.fixture(scope="module")
def aged_server():
    with e2e_util.Server(f"--max_connection_age_s={AGE_S}") as process:
        yield process


@pytest.fixture(scope="module")
def default_server():
    with e2e_util.Server() as process:
        yield process


def _frames_for(address, seconds):
    connection = h2_util.Connection(address, timeout=0.5)
    frames = []
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                frames.append(connection.read_frame()[0])
            except OSError:  # timeout: nothing more is coming
                pass
    finally:
        connection.close()
    return frames


class OpenStream:
    """A SoftmaxStream fed from a queue: send() one request, answers land in
    `answers` (request_id -> response) from a reader thread; `error` holds
    the RpcError that ended it, if one did."""

    def __init__(self, stub):
        self._outgoing = queue.Queue()
        self.answers, self.error = {}, None
        self._call = stub.SoftmaxStream(iter(self._outgoing.get, None), timeout=120)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        try:
            for response in self._call:
                assert response.request_id not in self.answers, response.request_id
                self.answers[response.request_id] = response
        except grpc.RpcError as error:
            self.error = error

    def send(self, message):
        self._outgoing.put(message)

    def close(self, timeout=30):
        self._outgoing.put(None)
        self._reader.join(timeout)
        assert not self._reader.is_alive(), "the stream did not end after the caller closed it"


def _keep_stream_open(stub, seconds, values, expected):
    """One stream, a request every 50 ms for `seconds`: every answer right,
    none missing, the stream ended by nobody but the caller."""
    stream = OpenStream(stub)
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end and stream.error is None:
        stream.send(request(values, request_id=f"keep-{sent}"))
        sent += 1
        time.sleep(0.05)
    stream.close()
    assert stream.error is None, (stream.error.code(), stream.error.details())
    assert sorted(stream.answers) == sorted(f"keep-{i}" for i in range(sent))
    for response in stream.answers.values():
        assert not response.error.code, response.error.message
        assert_close(decode(response.output), expected, "float32")
    return sent


def test_default_flags_send_no_goaway(default_server):
    assert h2_util.GOAWAY not in _frames_for(default_server.grpc_address, 2.5)


def test_an_idle_connection_gets_a_goaway_at_its_age(aged_server):
    connection = h2_util.Connection(aged_server.grpc_address, timeout=10)
    start = time.monotonic()
    try:
        while True:
            kind, _, _, _ = connection.read_frame()
            if kind == h2_util.GOAWAY:
                break
        waited = time.monotonic() - start
    finally:
        connection.close()
    # The age with its +10% jitter, plus a busy 2-core host's slack.
    assert 0.8 * AGE_S <= waited <= 1.1 * AGE_S + 2.0, waited


def test_unary_calls_on_one_channel_never_fail_across_reconnections(aged_server):
    stub = aged_server.stub()
    values = np.random.default_rng(1).normal(size=(2, 64)).astype(np.float32)
    expected = reference_softmax(values, -1, 1.0, False)
    deadline = time.monotonic() + 3.5 * AGE_S
    calls = 0
    while time.monotonic() < deadline:
        response = stub.Softmax(request(values), timeout=10)
        assert_close(decode(response.output), expected, "float32")
        calls += 1
    assert calls > 10


def test_a_stream_outlives_its_connections_age(aged_server):
    """The connection gets its GOAWAY at the age, but the stream open on it
    is the caller's: it goes on answering until the caller closes it."""
    values = np.random.default_rng(3).normal(size=(1, 32)).astype(np.float32)
    expected = reference_softmax(values, -1, 1.0, False)
    assert _keep_stream_open(aged_server.stub(), 4 * AGE_S, values, expected) > 20


def test_with_default_flags_a_grpcio_stream_and_a_tritonclient_stream_live_on(default_server):
    """What a Triton streaming caller does, unchanged: one stream kept open
    for several seconds beside a plain grpcio stream; neither is ended."""
    tritonclient = pytest.importorskip("tritonclient.grpc")
    values = np.random.default_rng(4).normal(size=(2, 16)).astype(np.float32)
    expected = reference_softmax(values, -1, 1.0, False)
    results, errors = {}, []
    client = tritonclient.InferenceServerClient(default_server.grpc_address)

    def callback(result, error):
        if error is not None:
            errors.append(error)
        else:
            results[result.get_response().id] = result.as_numpy("OUTPUT")

    client.start_stream(callback=callback)
    sent = []
    grpcio_sent = []
    grpcio = threading.Thread(target=lambda: grpcio_sent.append(
        _keep_stream_open(default_server.stub(), 4.0, values, expected)))
    grpcio.start()
    end = time.monotonic() + 4.0
    while time.monotonic() < end and not errors:
        tensor = tritonclient.InferInput("INPUT", list(values.shape), "FP32")
        tensor.set_data_from_numpy(values)
        sent.append(f"t{len(sent)}")
        client.async_stream_infer("softmax", [tensor], request_id=sent[-1])
        time.sleep(0.05)
    wait_until = time.monotonic() + 10
    while len(results) < len(sent) and not errors and time.monotonic() < wait_until:
        time.sleep(0.05)
    client.stop_stream()
    client.close()
    grpcio.join(30)
    assert not errors, [str(e) for e in errors]
    assert sorted(results) == sorted(sent) and len(sent) > 20
    for output in results.values():
        assert_close(output, expected, "float32")
    assert grpcio_sent and grpcio_sent[0] > 20


def test_unary_callers_without_retries_never_fail_with_default_flags(default_server):
    """Eight grpcio callers with no retry policy, each on a channel of its
    own, call back to back for a few seconds: no call fails."""
    values = np.random.default_rng(5).normal(size=(4, 256)).astype(np.float32)
    expected = reference_softmax(values, -1, 1.0, False)
    failures, counts = [], []

    def caller():
        channel = grpc.insecure_channel(default_server.grpc_address,
                                        options=[("grpc.enable_retries", 0)])
        from softmax.v1 import softmax_pb2_grpc
        stub = softmax_pb2_grpc.SoftmaxServiceStub(channel)
        calls = 0
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            try:
                response = stub.Softmax(request(values), timeout=10)
                assert_close(decode(response.output), expected, "float32")
                calls += 1
            except grpc.RpcError as error:
                failures.append((error.code(), error.details()))
        counts.append(calls)
        channel.close()

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == [], failures[:5]
    assert len(counts) == 8 and min(counts) > 5, counts


def test_a_long_stream_ends_retryably_at_its_stream_age_with_every_read_message_answered(
        start_server):
    """--max_stream_age_s: the stream stops reading at its age and answers
    what it read; the client sees UNAVAILABLE telling it to reopen, and
    nothing it sent was computed without an answer (the server's count of
    stream answers is the number of answers received)."""
    server = start_server(f"--max_stream_age_s={AGE_S}")
    stub = server.stub()
    values = np.random.default_rng(2).normal(size=(1, 32)).astype(np.float32)
    expected = reference_softmax(values, -1, 1.0, False)
    before = requests_counted(server, "OK", method="SoftmaxStream")
    stop = threading.Event()

    def requests():
        i = 0
        while not stop.is_set():
            yield request(values, request_id=f"age-{i}")
            i += 1
            time.sleep(0.005)

    answers = []
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as ended:
        for response in stub.SoftmaxStream(requests(), timeout=30):
            assert not response.error.code, response.error.message
            assert_close(decode(response.output), expected, "float32")
            answers.append(response.request_id)
    stop.set()
    lived = time.monotonic() - start
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "maximum age" in ended.value.details()
    assert AGE_S * 0.9 <= lived <= AGE_S + 5.0, lived
    assert len(answers) == len(set(answers)) > 10
    # Every message the server took was answered: none is lost in between.
    time.sleep(0.5)
    assert requests_counted(server, "OK", method="SoftmaxStream") - before == len(answers)
