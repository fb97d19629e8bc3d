"""The GPU serving path end to end: softmax-server --device=cuda under
concurrent mixed-size callers (every answer checked against the float64
reference), one 1 GiB tensor, and a real GPU fault that must take the server
to NOT_SERVING and a non-zero exit.

Every test skips, quoting the server's reason, where the build has no CUDA
backend or the machine no GPU (as in CI).
"""

import concurrent.futures
import os
import random
import re
import time
import urllib.request

import grpc
import numpy as np
import pytest

import e2e_util
from e2e_util import softmax_pb2

# Log-softmax values near 0 carry the absolute error of (x - max - log sum).
LOG_ATOL = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}


def check(response, x, dtype, axis, temperature, log, what):
    expected = e2e_util.reference_softmax(
        e2e_util.decode(e2e_util.encode(x, dtype)), axis, temperature, log)
    actual = e2e_util.decode(response.output)
    if log:
        np.testing.assert_allclose(actual, expected, rtol=e2e_util.RTOL[dtype],
                                   atol=LOG_ATOL[dtype], err_msg=what)
    else:
        e2e_util.assert_close(actual, expected, dtype, what)


@pytest.fixture(scope="module")
def gpu_server():
    with e2e_util.start_on_device("cuda", "--max_queue_delay_us=200") as process:
        yield process


def test_concurrent_mixed_clients_match_reference(gpu_server):
    rng = np.random.default_rng(2026)
    cases = []
    for i in range(384):
        dtype = ["float32", "float16", "bfloat16"][i % 3]
        ndim = 1 + i % 3
        shape = [int(rng.integers(1, 9)) for _ in range(ndim - 1)] + [
            int(rng.choice([1, 7, 32, 100, 1000, 1024, 4097, 20000, 70000]))]
        axis = -1 if i % 5 else 0
        temperature = [1.0, 0.5, 2.0][i % 3]
        log = i % 4 == 0
        x = rng.normal(0, 3, size=shape).astype(np.float32)
        cases.append((x, dtype, axis, temperature, log))

    def call(index):
        x, dtype, axis, temperature, log = cases[index]
        stub = gpu_server.stub()
        request = softmax_pb2.SoftmaxRequest(
            request_id=str(index), input=e2e_util.encode(x, dtype), axis=axis,
            temperature=temperature, log=log)
        return index, stub.Softmax(request, timeout=60)

    batch_sizes = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=64) as pool:
        for index, response in pool.map(call, range(len(cases))):
            x, dtype, axis, temperature, log = cases[index]
            assert response.request_id == str(index)
            check(response, x, dtype, axis, temperature, log,
                  f"case {index}: {dtype} {x.shape} axis={axis} T={temperature} log={log}")
            batch_sizes.append(response.timing.batch_requests)
    # With 64 callers at once, requests must have shared launches.
    assert max(batch_sizes) > 1, batch_sizes


def test_stream_of_mixed_requests_on_gpu(gpu_server):
    rng = np.random.default_rng(7)
    inputs = {}

    def requests():
        for i in range(200):
            dtype = ["float32", "float16", "bfloat16"][i % 3]
            x = rng.normal(0, 2, size=(int(rng.integers(1, 5)), int(rng.integers(1, 5000))))
            inputs[str(i)] = (x.astype(np.float32), dtype)
            yield softmax_pb2.SoftmaxRequest(request_id=str(i), input=e2e_util.encode(x, dtype))

    seen = set()
    for response in gpu_server.stub().SoftmaxStream(requests(), timeout=120):
        assert not response.HasField("error"), response.error
        x, dtype = inputs[response.request_id]
        check(response, x, dtype, -1, 1.0, False, f"stream {response.request_id}")
        seen.add(response.request_id)
    assert seen == {str(i) for i in range(200)}


def test_one_gib_tensor(gpu_server):
    # 16 rows of 2^24 float32: 1 GiB in, 1 GiB out, larger than any batch.
    rows, n = 16, 1 << 24
    rng = np.random.default_rng(11)
    x = rng.standard_normal((rows, n), dtype=np.float32)
    request = softmax_pb2.SoftmaxRequest(
        request_id="big", input=softmax_pb2.Tensor(
            dtype=softmax_pb2.DTYPE_FLOAT32, shape=[rows, n], data=x.tobytes()))
    response = gpu_server.stub().Softmax(request, timeout=300)
    y = np.frombuffer(response.output.data, dtype="<f4").reshape(rows, n)
    for r in (0, 7, 15):  # the float64 reference row by row, to bound memory
        row = x[r].astype(np.float64)
        e = np.exp(row - row.max())
        expected = e / e.sum()
        bound = e2e_util.ATOL + e2e_util.RTOL["float32"] * np.abs(expected)
        assert np.all(np.abs(y[r] - expected) <= bound), f"row {r}"
    np.testing.assert_allclose(y.astype(np.float64).sum(axis=1), 1.0, rtol=1e-4)
    assert response.timing.batch_requests == 1


def test_gpu_health_metrics_read_through_nvml(gpu_server):
    # The scrape reads NVML per served GPU, labelled by the server's device
    # name: utilization, memory, power, temperature, SM clock, throttle reasons.
    text = e2e_util.scrape_metrics(gpu_server.metrics_address)
    labels = {"device": "cuda:0"}

    def value(name, **extra):
        v = e2e_util.metric_value(text, name, {**labels, **extra})
        assert v is not None, (name, text)
        return v

    total = value("softmax_gpu_memory_total_bytes")
    assert total >= 1 << 30, total
    assert 0 < value("softmax_gpu_memory_used_bytes") <= total
    for name in ("softmax_gpu_utilization_ratio", "softmax_gpu_memory_utilization_ratio"):
        assert 0.0 <= value(name) <= 1.0, name
    assert 1.0 <= value("softmax_gpu_power_watts") <= value("softmax_gpu_power_limit_watts")
    assert 5.0 <= value("softmax_gpu_temperature_celsius") <= 110.0
    assert 1e8 <= value("softmax_gpu_sm_clock_hertz") <= 5e9
    reasons = re.findall(r'softmax_gpu_clock_throttle_reasons\{[^}]*reason="(\w+)"[^}]*\} ([01])',
                         text)
    assert {"gpu_idle", "sw_power_cap", "hw_slowdown"} <= {r for r, _ in reasons}, reasons


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("model,dtype", [("softmax", "float32"), ("log_softmax_fp16", "float16")])
def test_open_inference_protocol_on_gpu(gpu_server, protocol, model, dtype):
    # KServe v2 answers on the GPU come from the output buffer by reference
    # (no copy into the response); concurrent callers batch together.
    triton = pytest.importorskip(f"tritonclient.{protocol}")
    address = gpu_server.grpc_address if protocol == "grpc" else gpu_server.http_address
    rng = np.random.default_rng(5)
    inputs = [(rng.standard_normal((8, 4096)) * 3).astype(dtype) for _ in range(24)]
    log = model.startswith("log_")

    def call(x):
        # One client per call: tritonclient.http's client is not thread-safe.
        client = triton.InferenceServerClient(address)
        tensor = triton.InferInput("INPUT", list(x.shape), "FP32" if dtype == "float32" else "FP16")
        if protocol == "http":
            tensor.set_data_from_numpy(x, binary_data=True)
            outputs = [triton.InferRequestedOutput("OUTPUT", binary_data=True)]
        else:
            tensor.set_data_from_numpy(x)
            outputs = [triton.InferRequestedOutput("OUTPUT")]
        kwargs = {"client_timeout": 60} if protocol == "grpc" else {}
        result = client.infer(model, [tensor], outputs=outputs, parameters={"temperature": 0.5},
                              **kwargs)
        client.close()
        y = result.as_numpy("OUTPUT")
        assert y.dtype == x.dtype and y.shape == x.shape
        expected = e2e_util.reference_softmax(x.astype(np.float32), -1, 0.5, log)
        if log:
            np.testing.assert_allclose(y.astype(np.float64), expected, rtol=e2e_util.RTOL[dtype],
                                       atol=LOG_ATOL[dtype])
        else:
            e2e_util.assert_close(y.astype(np.float32), expected, dtype, model)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(call, inputs))


def test_every_gpu_serves_under_one_scheduler():
    # --device=cuda:all: one backend per visible GPU. Concurrent callers are
    # answered correctly, and every GPU's batches are counted under its own
    # `device` label (with two or more GPUs, each must have run some).
    server = e2e_util.start_on_device("cuda:all")
    try:
        stub = server.stub()
        rng = np.random.default_rng(11)
        inputs = [rng.normal(size=(64, 4096)).astype(np.float32) for _ in range(16)]

        def call(x):
            response = stub.Softmax(
                softmax_pb2.SoftmaxRequest(input=e2e_util.encode(x, "float32")), timeout=60)
            check(response, x, "float32", -1, 1.0, False, "cuda:all")

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            for _ in range(8):
                list(pool.map(call, inputs))
        text = urllib.request.urlopen(f"http://{server.metrics_address}/metrics").read().decode()
        devices = re.findall(r'softmax_device_info\{[^}]*device="(cuda:\d+)"', text)
        assert devices, text
        for device in devices:
            ok = re.search(r'softmax_batches_total\{device="%s",outcome="ok"\} (\S+)' % device, text)
            assert ok is not None, (device, text)
            if len(devices) > 1:
                assert float(ok.group(1)) > 0, (device, text)
    finally:
        server.stop()


def test_gpu_fault_goes_not_serving_and_exits_nonzero():
    # After 3 batches the worker reads an address nothing maps: a real sticky
    # CUDA error. Requests in flight fail INTERNAL; the process exits 2.
    os.environ["SOFTMAX_TEST_INJECT_FAULT_AFTER_BATCHES"] = "3"
    try:
        server = e2e_util.start_on_device("cuda", "--max_queue_delay_us=0")
    finally:
        del os.environ["SOFTMAX_TEST_INJECT_FAULT_AFTER_BATCHES"]
    try:
        stub = server.stub()
        x = np.random.default_rng(3).normal(size=(4, 1024)).astype(np.float32)
        request = softmax_pb2.SoftmaxRequest(input=e2e_util.encode(x, "float32"))
        codes = []
        for _ in range(50):
            try:
                stub.Softmax(request, timeout=10)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as error:
                codes.append(error.code())
                if error.code() == grpc.StatusCode.INTERNAL:
                    assert "GPU" in error.details(), error.details()
            if server.process.poll() is not None:
                break
        assert codes[:2] == [grpc.StatusCode.OK, grpc.StatusCode.OK], codes
        assert grpc.StatusCode.INTERNAL in codes, codes

        def health_not_serving():
            try:
                return e2e_util.health_check(server.channel(), timeout=1) == "NOT_SERVING"
            except grpc.RpcError:
                return False

        # Health itself says NOT_SERVING during the fault's lame duck.
        e2e_util.wait_for(health_not_serving, 5, "health NOT_SERVING after the fault")
        assert server.process.wait(timeout=30) == 2, server.output()
        assert "fatal GPU error" in server.output()
        assert "NOT_SERVING" in server.output()
    finally:
        server.kill()
