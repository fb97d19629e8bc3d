"""What hostile or unlucky clients do to the transport: each case is a
regression test of one way the server fell over (issue 17), at a scale that
runs in seconds on loopback."""

import socket
import subprocess

import grpc
import numpy as np
import pytest

import e2e_util
import h2_util
from e2e_util import metric_value, request, requests_counted, scrape_metrics, wait_for

SOFTMAX_PATH = "/softmax.v1.SoftmaxService/Softmax"


def test_unary_call_reset_before_its_message_arrived_counts_cancelled(server):
    """A unary call whose client resets it halfway through the message is
    CANCELLED in the metrics, not INVALID_ARGUMENT (which blames the caller)."""
    cancelled = requests_counted(server, "CANCELLED")
    invalid = requests_counted(server, "INVALID_ARGUMENT")
    connection = h2_util.Connection(server.grpc_address)
    try:
        for stream_id in (1, 3, 5):
            connection.headers(stream_id, SOFTMAX_PATH)
            # The gRPC prefix announces 1,000 bytes; 10 arrive, then the reset.
            connection.data(stream_id, h2_util.grpc_message(b"\x0a" * 10, declared_length=1000))
            connection.reset(stream_id)
        wait_for(lambda: requests_counted(server, "CANCELLED") >= cancelled + 3, 10,
                 "three CANCELLED unary calls")
    finally:
        connection.close()
    assert requests_counted(server, "INVALID_ARGUMENT") == invalid


def test_deadline_drop_is_labelled_deadline_exceeded(start_server):
    """A request whose deadline passes while it is queued is dropped as
    deadline_exceeded (gRPC also marks such a call cancelled; the deadline
    is the cause). Also fails when deadlines do not reach the batcher."""
    server = start_server("--max_queue_delay_us=1500000", "--dispatch_when_idle=false")
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
    result = subprocess.run(
        [e2e_util.SERVER_BIN, f"--grpc_address={server.grpc_address}", "--metrics_address=",
         "--device=cpu"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 1, result.stderr
    assert "cannot listen" in result.stderr and "listening" not in result.stderr.replace(
        "cannot listen", ""), result.stderr
