"""The server's logs: --log_format=json writes one JSON object per line
(every line, start-up to exit), text lines carry a timestamp and a level, and
the access log (--access_log_one_in) writes one line per finished request or
stream message, one in N, with method, code, bytes, latency and peer, for
every front-end."""

import json
import re
import urllib.request

import grpc
import numpy as np
import pytest

import e2e_util
from e2e_util import request

try:
    from tritonclient.grpc import service_pb2, service_pb2_grpc
except ImportError as error:  # pragma: no cover - the venv lacks it
    raise RuntimeError("tritonclient missing: run 'make venv'") from error

TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z [IWE] (softmax-server|access): ")


def model_infer(server, values):
    channel = grpc.insecure_channel(server.grpc_address)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    message = service_pb2.ModelInferRequest(model_name="softmax")
    tensor = message.inputs.add(name="input", datatype="FP32", shape=list(values.shape))
    tensor.contents.fp32_contents.extend(values.ravel().tolist())
    stub.ModelInfer(message, timeout=10)
    channel.close()


def http_infer(server, values):
    body = json.dumps({"inputs": [{"name": "input", "shape": list(values.shape),
                                   "datatype": "FP32", "data": values.ravel().tolist()}]})
    call = urllib.request.Request(f"http://{server.http_address}/v2/models/softmax/infer",
                                  data=body.encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(call, timeout=10) as response:
        assert response.status == 200


def test_json_lines_and_an_access_line_per_request_of_every_front_end(start_server):
    server = start_server("--log_format=json", "--access_log_one_in=1")
    values = np.arange(6, dtype=np.float32).reshape(2, 3)  # 24 bytes in, 24 out
    stub = server.stub()
    stub.Softmax(request(values), timeout=10)
    with pytest.raises(grpc.RpcError):
        stub.Softmax(request(values, axis=5), timeout=10)  # INVALID_ARGUMENT
    list(stub.SoftmaxStream(iter([request(values), request(values)]), timeout=10))
    model_infer(server, values)
    http_infer(server, values)
    assert server.stop() == 0

    lines = server.output().splitlines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    for record in records:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", record["time"]), record
        assert record["level"] in ("info", "warning", "error"), record
    listening = next(r for r in records if r.get("msg") == "listening")
    assert listening["grpc"] == server.grpc_address
    assert listening["http"] == server.http_address
    assert records[-1]["msg"] == "stopped"

    access = [r for r in records if r["logger"] == "access"]
    assert [(r["method"], r["code"]) for r in access] == [
        ("Softmax", "OK"), ("Softmax", "INVALID_ARGUMENT"), ("SoftmaxStream", "OK"),
        ("SoftmaxStream", "OK"), ("ModelInfer", "OK"), ("http_infer", "OK")], access
    for record in access:
        assert record["latency_ms"] >= 0, record
        assert "127.0.0.1:" in record["peer"], record
        if record["code"] == "OK":
            assert record["bytes"] == 2 * values.nbytes, record


def test_access_log_writes_one_request_in_n(start_server):
    server = start_server("--access_log_one_in=4")
    stub = server.stub()
    for _ in range(12):
        stub.Softmax(request(np.ones((1, 8))), timeout=10)
    assert server.stop() == 0
    lines = server.output().splitlines()
    for line in lines:
        assert TEXT_LINE.match(line), line
    access = [line for line in lines if " I access: " in line]
    assert len(access) == 3, access
    assert re.search(r" I access: method=Softmax code=OK bytes=64 latency_ms=[0-9.e-]+ "
                     r"peer=ipv4:127\.0\.0\.1:\d+$", access[0]), access[0]


def test_every_device_computes_a_checked_softmax_before_the_server_listens(server):
    """Readiness tells the truth: the warm-up's checked softmax comes before
    the listener, so no probe passes before the device has computed."""
    output = server.output()
    warm = output.find("warm-up softmax checked backend=cpu")
    assert 0 <= warm < output.find("listening"), output


def test_no_access_log_by_default(server):
    server.stub().Softmax(request(np.ones((1, 4))), timeout=10)
    assert " access: " not in server.output()


@pytest.mark.parametrize("flag, message, logged", [
    # Refused by the flag parser, before any log line.
    ("--log_format=xml", "--log_format: expected text or json", False),
    ("--access_log_one_in=-1", "--access_log_one_in: must not be negative", True),
])
def test_bad_log_flags_exit_1(flag, message, logged):
    result = e2e_util.run_server("--grpc_address=127.0.0.1:0", "--metrics_address=",
                                 "--http_address=", flag, timeout=30)
    assert result.returncode == 1, result.stderr
    assert message in result.stderr, result.stderr
    assert bool(TEXT_LINE.match(result.stderr)) == logged, result.stderr
