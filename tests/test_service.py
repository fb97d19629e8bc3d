"""Health, reflection, metrics and the unary error path around the service."""

import grpc
import os
import re
import subprocess
import time

import numpy as np
import pytest

import e2e_util
from e2e_util import health_check, metric_value, request, scrape_metrics


def test_health_serving(server):
    channel = server.channel()
    assert health_check(channel) == "SERVING"
    assert health_check(channel, "softmax.v1.SoftmaxService") == "SERVING"
    with pytest.raises(grpc.RpcError) as caught:
        health_check(channel, "no.such.Service")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_service(server):
    channel = server.channel()
    names = e2e_util.reflection_services(channel)
    assert "softmax.v1.SoftmaxService" in names
    assert "grpc.health.v1.Health" in names
    files = e2e_util.reflection_file_for_symbol(channel, "softmax.v1.SoftmaxService")
    assert any(b"softmax/v1/softmax.proto" in f and b"SoftmaxStream" in f for f in files)


def test_metrics_endpoint_counts_requests(server, stub):
    before = metric_value(scrape_metrics(server.metrics_address), "softmax_requests_total") or 0
    for _ in range(3):
        stub.Softmax(request(np.zeros((2, 8))), timeout=10)
    with pytest.raises(grpc.RpcError):
        stub.Softmax(request(np.zeros((2, 8)), temperature=-1.0), timeout=10)
    text = scrape_metrics(server.metrics_address)
    after = metric_value(text, "softmax_requests_total")
    assert after is not None, text[:2000]
    assert after - before >= 4
    # Text exposition parses, and batches were computed.
    assert metric_value(text, "softmax_batches_total") >= 1


def test_client_cli_health_mode(server):
    import subprocess
    result = subprocess.run([e2e_util.CLIENT_BIN, "health", f"--target={server.grpc_address}"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "SERVING"
    result = subprocess.run([e2e_util.CLIENT_BIN, "health", f"--target={server.grpc_address}",
                             "--service=softmax.v1.SoftmaxService"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stdout.strip() == "SERVING", result


def test_deadline_exceeded_is_reported_not_hung(start_server):
    # The batcher holds requests for 300 ms; a 50 ms deadline expires while
    # queued: the caller sees DEADLINE_EXCEEDED promptly, and the server drops
    # the request before compute and stays healthy.
    slow = start_server("--max_queue_delay_us=300000", env=e2e_util.HOLD_IN_QUEUE)
    stub = slow.stub()
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as caught:
        stub.Softmax(request(np.zeros((4, 4))), timeout=0.05)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 0.29
    assert len(stub.Softmax(request(np.zeros((4, 4))), timeout=10).output.data) == 64


def test_startup_logs_device_choice(server):
    output = server.output()
    assert "softmax-server: device=cpu" in output, output
    assert output.index("device=cpu") < output.index("listening grpc=")


@pytest.mark.parametrize("flag, message", [
    ("--max_batch_rows=0", "must be positive"),
    ("--max_queued_requests=0", "must be positive"),
    ("--max_held_bytes=-1", "--max_held_bytes: must be >= 0"),
    ("--shutdown_grace_s=-1", "must not be negative"),
    ("--max_queue_delay_us=99999999999", "--max_queue_delay_us: at most"),
    ("--device=tpu", "--device: expected"),
    ("--device=cuda:0,0", "--device: expected"),
])
def test_bad_flags_exit_1_with_a_message(flag, message):
    result = e2e_util.run_server("--grpc_address=127.0.0.1:0", "--metrics_address=", flag,
                                 timeout=30)
    assert result.returncode == 1, result.stderr
    assert message in result.stderr, result.stderr


def test_device_choice_without_a_usable_gpu(start_server):
    """--device=cuda never falls back: it exits 1 with the cause. --device=auto
    serves on the CPU, saying why; softmax_gpu_unusable appears only when a
    GPU was found (a /dev/nvidiaN node) but cannot be used."""
    try:
        result = e2e_util.run_server("--grpc_address=127.0.0.1:0", "--metrics_address=",
                                     "--http_address=", "--device=cuda", timeout=20)
    except subprocess.TimeoutExpired:
        pytest.skip("a usable GPU is present: --device=cuda serves")
    assert result.returncode == 1, result.stderr
    assert re.search(r"--device=cuda: (no usable GPU \(.+\)|this build has no CUDA backend)",
                     result.stderr), result.stderr
    server = start_server(device="auto")
    output = server.output()
    assert re.search(r"device=cpu .*\(auto: .+\)", output), output
    gpu_found = any(re.fullmatch(r"nvidia\d+", name) for name in os.listdir("/dev"))
    text = scrape_metrics(server.metrics_address)
    assert ("softmax_gpu_unusable{" in text) == gpu_found, text
    assert ("warning: --device=auto serves on the CPU" in output) == gpu_found, output


@pytest.mark.parametrize("flags, size, admitted", [
    (("--max_queued_requests=2",), 4, 2),
    # 32-byte requests hold 64 bytes each (input and output): three fit in 200.
    (("--max_held_bytes=200",), 8, 3),
])
def test_queue_bounds_reach_the_batcher(start_server, flags, size, admitted):
    """With requests held in the queue (a long batching delay), the request
    past --max_queued_requests / --max_held_bytes is refused UNAVAILABLE."""
    server = start_server("--max_queue_delay_us=60000000", "--max_batch_rows=1000000",
                          *flags, env=e2e_util.HOLD_IN_QUEUE)
    stub = server.stub()
    held = [stub.Softmax.future(request(np.zeros((1, size))), timeout=60)
            for _ in range(admitted)]
    e2e_util.wait_for(lambda: (metric_value(scrape_metrics(server.metrics_address),
                                            "softmax_queued_requests") or 0) >= admitted,
                      10, "the admitted requests to be queued")
    with pytest.raises(grpc.RpcError) as caught:
        stub.Softmax(request(np.zeros((1, size))), timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert all(not future.done() for future in held)
    for future in held:
        future.cancel()
