"""--max_connection_age_s: what a fleet needs so that callers spread over
replicas added later. A connection is sent a GOAWAY at its age (gRPC adds
+-10% jitter) and its calls finish on it; a stream ends with a retryable
UNAVAILABLE once the messages it read are answered; a unary caller on one
channel never sees a failure across the reconnections."""

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
def server():
    process = e2e_util.Server(f"--max_connection_age_s={AGE_S}")
    try:
        yield process
    finally:
        process.kill()


def test_an_idle_connection_gets_a_goaway_at_its_age(server):
    connection = h2_util.Connection(server.grpc_address, timeout=10)
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


def test_unary_calls_on_one_channel_never_fail_across_reconnections(server):
    stub = server.stub()
    values = np.random.default_rng(1).normal(size=(2, 64)).astype(np.float32)
    expected = reference_softmax(values, -1, 1.0, False)
    deadline = time.monotonic() + 3.5 * AGE_S
    calls = 0
    while time.monotonic() < deadline:
        response = stub.Softmax(request(values), timeout=10)
        assert_close(decode(response.output), expected, "float32")
        calls += 1
    assert calls > 10


def test_a_long_stream_ends_retryably_at_its_age_with_every_read_message_answered(server):
    """The stream stops reading at its age and answers what it read; the
    client sees UNAVAILABLE telling it to reopen, and nothing it sent was
    computed without an answer (the server's count of stream answers is the
    number of answers received)."""
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


def test_no_maximum_age_when_zero(start_server):
    server = start_server("--max_connection_age_s=0")
    connection = h2_util.Connection(server.grpc_address, timeout=0.5)
    frames = []
    try:
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            try:
                frames.append(connection.read_frame()[0])
            except OSError:  # timeout: nothing more is coming
                pass
    finally:
        connection.close()
    assert h2_util.GOAWAY not in frames
