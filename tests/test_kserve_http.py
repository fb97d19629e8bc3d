"""The Open Inference Protocol (KServe v2) over HTTP/REST, called with Triton's
own client (tritonclient.http) and with plain HTTP: health, metadata, config,
statistics, inference with JSON tensors and with the binary tensor data
extension for every dtype, shapes, axes, temperature and log against the
float64 reference, every bad request with its status, draining, metrics,
and the documented curl examples run as written."""

import json
import pathlib
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

import e2e_util
from e2e_util import assert_close, reference_softmax

try:
    import tritonclient.http as triton_http
    from tritonclient.utils import InferenceServerException
except ImportError as error:  # pragma: no cover - the venv lacks it
    raise ImportError("tritonclient is missing from the test venv: run 'make venv'") from error

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATATYPES = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16"}


def make_input(values, dtype, binary=True, name="INPUT"):
    tensor = triton_http.InferInput(name, list(values.shape), DATATYPES[dtype])
    tensor.set_data_from_numpy(values.astype(np.float16) if dtype == "float16" else values,
                               binary_data=binary)
    return tensor


@pytest.fixture(scope="module")
def client(server):
    c = triton_http.InferenceServerClient(server.http_address, concurrency=4)
    yield c
    c.close()


def http(server, method, path, body=None, headers=None):
    """(status, headers, body bytes) of one plain HTTP call."""
    request = urllib.request.Request(f"http://{server.http_address}{path}", data=body,
                                     method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def post_json(server, path, document):
    return http(server, "POST", path, json.dumps(document).encode(),
                {"Content-Type": "application/json"})


# ------------------------------------------------------------------ health

def test_health_metadata_config_and_statistics(server, client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("softmax") and client.is_model_ready("log_softmax", "1")
    metadata = client.get_server_metadata()
    assert metadata["name"] == "softmax-serve"
    assert {"binary_tensor_data", "statistics", "model_configuration"} <= set(
        metadata["extensions"])
    model = client.get_model_metadata("softmax")
    assert model["inputs"][0]["name"] == "INPUT" and model["outputs"][0]["name"] == "OUTPUT"
    config = client.get_model_config("log_softmax")
    assert config["name"] == "log_softmax" and config["max_batch_size"] == 0
    assert "dynamic_batching" in config
    assert config["input"][0]["dims"] == [-1, -1]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    stats = client.get_inference_statistics("softmax")["model_stats"]
    assert [s["name"] for s in stats] == ["softmax"]
    assert {s["name"] for s in client.get_inference_statistics()["model_stats"]} == {
        "softmax", "log_softmax", "softmax_fp16", "log_softmax_fp16", "softmax_bf16",
        "log_softmax_bf16"}
    assert client.get_model_metadata("log_softmax_bf16")["inputs"][0]["datatype"] == "BF16"
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/softmax/ready",
                 "/v2/models/softmax/versions/1/ready"):
        assert http(server, "GET", path)[0] == 200, path


@pytest.mark.parametrize("path,status", [
    ("/v2/models/resnet", 404), ("/v2/models/resnet/config", 404),
    ("/v2/models/softmax/versions/3", 404),
    ("/v2/models/softmax/explain", 404), ("/v2/nothing", 404), ("/v2/models/resnet/stats", 404),
])
def test_unknown_models_and_endpoints_are_404_with_an_error(server, path, status):
    got, headers, body = http(server, "GET", path)
    assert got == status
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body)["error"]


def test_a_model_not_served_is_not_ready_as_triton_answers(server):
    """/ready of a model or version not served is 400 (Triton's answer for
    any model that is not ready), not 404: tritonclient's is_model_ready
    then returns False."""
    got, _, body = http(server, "GET", "/v2/models/resnet/ready")
    assert (got, json.loads(body)) == (400, {"error": "Model version not ready"})
    assert http(server, "GET", "/v2/models/softmax/versions/3/ready")[0] == 400
    assert http(server, "GET", "/v2/models/softmax/ready")[0] == 200
    client = triton_http.InferenceServerClient(server.http_address)
    assert client.is_model_ready("resnet") is False
    assert client.is_model_ready("softmax") is True


# ----------------------------------------------------------------- compute

CASES = [((5,), -1), ((3, 40), -1), ((3, 40), 0), ((2, 3, 4), 1), ((2, 1, 700), -1),
         ((0, 3), -1)]


@pytest.mark.parametrize("dtype", list(DATATYPES))
@pytest.mark.parametrize("shape,axis", CASES)
@pytest.mark.parametrize("model", ["softmax", "log_softmax"])
def test_binary_infer_matches_the_reference(client, dtype, shape, axis, model):
    rng = np.random.default_rng(hash((dtype, shape, axis, model, "http")) % 2**32)
    values = e2e_util.representable(rng.normal(0, 3, size=shape), dtype)
    parameters = {"axis": axis} if axis != -1 else None
    result = client.infer(model, [make_input(values, dtype)], parameters=parameters,
                          request_id="h-1",
                          outputs=[triton_http.InferRequestedOutput("OUTPUT", binary_data=True)])
    response = result.get_response()
    assert response["model_name"] == model and response["id"] == "h-1"
    assert response["outputs"][0]["datatype"] == DATATYPES[dtype]
    assert response["outputs"][0]["shape"] == list(shape)
    assert_close(result.as_numpy("OUTPUT"),
                 reference_softmax(values, axis, 1.0, model == "log_softmax"), dtype,
                 f"{model} {dtype} {shape} axis {axis}")


def test_large_binary_tensor(client):
    values = e2e_util.representable(np.random.default_rng(6).normal(0, 4, size=(64, 32000)), "bfloat16")
    result = client.infer("softmax_bf16", [make_input(values, "bfloat16")], parameters={"axis": 0},
                          outputs=[triton_http.InferRequestedOutput("OUTPUT", binary_data=True)])
    assert_close(result.as_numpy("OUTPUT"), reference_softmax(values, 0), "bfloat16")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_json_tensors_in_and_out(client, dtype):
    values = e2e_util.representable(np.random.default_rng(4).normal(size=(3, 9)), dtype)
    result = client.infer("log_softmax", [make_input(values, dtype, binary=False)],
                          parameters={"temperature": 1.5},
                          outputs=[triton_http.InferRequestedOutput("OUTPUT", binary_data=False)])
    assert "data" in result.get_response()["outputs"][0]
    assert_close(result.as_numpy("OUTPUT"), reference_softmax(values, -1, 1.5, True), dtype)


def test_binary_data_output_parameter_and_default_json(server):
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],
                        "data": [[0.0, 0.0]]}]}
    status, headers, reply = post_json(server, "/v2/models/softmax/infer", body)
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(reply)["outputs"][0]["data"] == [0.5, 0.5]
    body["parameters"] = {"binary_data_output": True}
    status, headers, reply = post_json(server, "/v2/models/softmax/infer", body)
    assert status == 200
    header_length = int(headers["Inference-Header-Content-Length"])
    header = json.loads(reply[:header_length])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 8
    assert np.array_equal(np.frombuffer(reply[header_length:], "<f4"), [0.5, 0.5])


# ----------------------------------------------------------- bad requests

def binary_body(header, data):
    text = json.dumps(header).encode()
    return text + data, {"Inference-Header-Content-Length": str(len(text)),
                         "Content-Type": "application/octet-stream"}


def tensor(**fields):
    value = {"name": "INPUT", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]}
    value.update(fields)
    return {k: v for k, v in value.items() if v is not None}


BAD_JSON = [
    ("wrong datatype", {"inputs": [tensor(datatype="INT8")]}, 400, "inputs[0].datatype"),
    ("missing input", {"inputs": []}, 400, "inputs"),
    ("no inputs field", {}, 400, "inputs"),
    ("two inputs", {"inputs": [tensor(), tensor(name="B")]}, 400, "inputs"),
    ("unknown output", {"inputs": [tensor()], "outputs": [{"name": "LOGITS"}]}, 400,
     "outputs[0].name"),
    ("data count", {"inputs": [tensor(data=[1, 2, 3])]}, 400, "inputs[0].data"),
    ("data not numbers", {"inputs": [tensor(data=["a", "b", "c", "d"])]}, 400, "inputs[0].data"),
    ("missing data", {"inputs": [tensor(data=None)]}, 400, "inputs[0].data"),
    ("negative dim", {"inputs": [tensor(shape=[-2, 2])]}, 400, "inputs[0].shape[0]"),
    ("axis range", {"inputs": [tensor()], "parameters": {"axis": 2}}, 400, "axis"),
    ("axis type", {"inputs": [tensor()], "parameters": {"axis": "0"}}, 400, "parameters.axis"),
    ("temperature", {"inputs": [tensor()], "parameters": {"temperature": 0}}, 400,
     "temperature"),
    ("temperature negative", {"inputs": [tensor()], "parameters": {"temperature": -2.5}}, 400,
     "temperature"),
]


@pytest.mark.parametrize("sent", [20, 12], ids=["more bytes follow", "fewer bytes follow"])
def test_binary_data_size_other_than_the_bytes_that_follow_is_400(server, sent):
    """binary_data_size 16 (a [2, 2] FP32 tensor) with 20 or 12 bytes after
    the JSON header: refused naming the field and both sizes, whether the
    surplus would make a well-sized tensor (20: its first 16 bytes) or not."""
    header = {"inputs": [tensor(data=None, parameters={"binary_data_size": 16})]}
    body, headers = binary_body(header, np.arange(sent // 4, dtype=np.float32).tobytes())
    status, _, reply = http(server, "POST", "/v2/models/softmax/infer", body, headers)
    assert status == 400, reply
    error = json.loads(reply)["error"]
    assert f"inputs[0].parameters.binary_data_size: 16 bytes, but the body holds {sent}" in error


@pytest.mark.parametrize("name,body,status,field", BAD_JSON, ids=[c[0] for c in BAD_JSON])
def test_bad_json_requests(server, name, body, status, field):
    got, headers, reply = post_json(server, "/v2/models/softmax/infer", body)
    assert got == status, reply
    assert field in json.loads(reply)["error"], reply


def test_bad_binary_requests(server):
    header = {"inputs": [tensor(data=None, parameters={"binary_data_size": 16})]}
    body, headers = binary_body(header, bytes(12))
    status, _, reply = http(server, "POST", "/v2/models/softmax/infer", body, headers)
    assert status == 400 and "binary_data_size" in json.loads(reply)["error"]
    header["inputs"][0]["parameters"]["binary_data_size"] = 12
    body, headers = binary_body(header, bytes(12))
    status, _, reply = http(server, "POST", "/v2/models/softmax/infer", body, headers)
    assert status == 400 and "inputs[0] binary data" in json.loads(reply)["error"], reply
    both = {"inputs": [tensor(parameters={"binary_data_size": 16})]}
    body, headers = binary_body(both, bytes(16))
    status, _, reply = http(server, "POST", "/v2/models/softmax/infer", body, headers)
    assert status == 400 and "both" in json.loads(reply)["error"]
    body, headers = binary_body({"inputs": [tensor()]}, bytes(8))
    status, _, reply = http(server, "POST", "/v2/models/softmax/infer", body, headers)
    assert status == 400 and "binary" in json.loads(reply)["error"]
    headers["Inference-Header-Content-Length"] = "99999"
    status, _, reply = http(server, "POST", "/v2/models/softmax/infer", body, headers)
    assert status == 400 and "Inference-Header-Content-Length" in json.loads(reply)["error"]
    status, _, reply = http(server, "POST", "/v2/models/softmax/infer", b"{not json",
                            {"Content-Type": "application/json"})
    assert status == 400 and "JSON" in json.loads(reply)["error"]
    status, _, reply = post_json(server, "/v2/models/resnet/infer", {"inputs": [tensor()]})
    assert status == 404 and "resnet" in json.loads(reply)["error"]
    status, _, reply = post_json(server, "/v2/models/softmax/versions/2/infer",
                                 {"inputs": [tensor()]})
    assert status == 404
    # Still serving.
    status, _, reply = post_json(server, "/v2/models/softmax/infer",
                                 {"inputs": [tensor(data=[0, 0, 0, 0])]})
    assert status == 200 and json.loads(reply)["outputs"][0]["data"] == [0.5] * 4


def test_a_body_without_content_length_is_refused(server):
    import http.client
    host, port = server.http_address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("POST", "/v2/models/softmax/infer", body=iter([b'{"inputs": []}']),
                       headers={"Content-Type": "application/json"}, encode_chunked=True)
    response = connection.getresponse()
    assert response.status == 400
    assert "Content-Length" in json.loads(response.read())["error"]
    connection.close()


def test_tritonclient_sees_the_errors(client):
    with pytest.raises(InferenceServerException) as error:
        client.infer("softmax", [make_input(np.zeros((2, 2), np.float32), "float32")],
                     parameters={"temperature": -1.0})
    assert error.value.status() == "400" and "temperature" in error.value.message()
    with pytest.raises(InferenceServerException) as error:
        client.infer("nope", [make_input(np.zeros((2, 2), np.float32), "float32")])
    assert error.value.status() == "404"


def test_too_large_is_refused(start_server):
    server = start_server("--max_tensor_bytes=4096")
    body, headers = binary_body(
        {"inputs": [tensor(shape=[2, 1024], data=None, parameters={"binary_data_size": 8192})]},
        bytes(8192))
    status, _, reply = http(server, "POST", "/v2/models/softmax/infer", body, headers)
    assert status == 400 and "--max_tensor_bytes" in json.loads(reply)["error"]
    status, _, reply = http(server, "POST", "/v2/models/softmax/infer", bytes(10 << 20),
                            {"Content-Type": "application/json"})
    assert status == 400 and "limit" in json.loads(reply)["error"]


# ------------------------------------------- statistics, metrics, drain

def test_statistics_and_metrics_count_http_requests(server, client):
    before = client.get_inference_statistics("softmax")["model_stats"][0]["inference_count"]
    text = e2e_util.scrape_metrics(server.metrics_address)
    metric_before = e2e_util.metric_value(text, "softmax_requests_total",
                                          {"method": "http_infer", "code": "OK"}) or 0
    for _ in range(4):
        client.infer("softmax", [make_input(np.ones((2, 3), np.float32), "float32")])
    stats = client.get_inference_statistics("softmax")["model_stats"][0]
    assert stats["inference_count"] == before + 4
    assert stats["inference_stats"]["success"]["ns"] > 0
    text = e2e_util.scrape_metrics(server.metrics_address)
    assert e2e_util.metric_value(text, "softmax_requests_total",
                                 {"method": "http_infer", "code": "OK"}) == metric_before + 4


def test_http_disabled_with_an_empty_address(start_server):
    server = start_server("--http_address=")
    assert server.http_address == "off"


def test_draining_answers_503(start_server):
    """Within the lame duck (500 ms from SIGTERM; the HTTP endpoint closes
    after it): not ready, still live, inference answered 503."""
    server = start_server()
    assert http(server, "GET", "/v2/health/ready")[0] == 200
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    while http(server, "GET", "/v2/health/ready")[0] != 503:
        assert time.monotonic() - started < e2e_util.LAME_DUCK_S, "ready never turned 503"
        time.sleep(0.005)
    assert http(server, "GET", "/v2/health/live")[0] == 200
    status, _, reply = post_json(server, "/v2/models/softmax/infer", {"inputs": [tensor()]})
    assert status == 503 and "shutting down" in json.loads(reply)["error"]
    assert time.monotonic() - started < e2e_util.LAME_DUCK_S, (
        "the checks above must fall in the lame duck")
    assert server.process.wait(timeout=30) == 0


# ---------------------------------------------------- documented examples

def readme_curl_blocks():
    """The ```sh blocks of the KServe HTTP examples (docs/open-inference-protocol.md)."""
    text = (ROOT / "docs" / "open-inference-protocol.md").read_text()
    section = text[text.index("<!-- kserve-curl:begin -->"):text.index("<!-- kserve-curl:end -->")]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def test_readme_curl_examples_run_as_written(server):
    blocks = readme_curl_blocks()
    assert len(blocks) >= 3 and all("localhost:8000" in b for b in blocks), blocks
    for block in blocks:
        script = "set -euo pipefail\n" + block.replace("localhost:8000", server.http_address)
        result = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, (block, result.stdout, result.stderr)
        assert result.stdout.strip(), block


def test_expect_100_continue_is_answered_at_once(server):
    """libcurl (and so perf_analyzer -i http) sends large bodies only after
    "100 Continue": the server says it before reading the body, then answers
    with a whole response on the same connection, which stays usable."""
    import socket
    values = np.arange(16384, dtype=np.float32) / 1000
    header = json.dumps({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 16384],
                                     "parameters": {"binary_data_size": values.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    body = header + values.tobytes()
    host, port = server.http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for _ in range(2):  # twice on one keep-alive connection
            sock.sendall(b"POST /v2/models/softmax/infer HTTP/1.1\r\nHost: x\r\n"
                         b"Expect: 100-continue\r\nContent-Type: application/octet-stream\r\n"
                         b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
                         % (len(header), len(body)))
            start = time.monotonic()
            sock.settimeout(0.5)  # libcurl waits 1 s before sending anyway
            interim = sock.recv(64)
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n", interim
            assert time.monotonic() - start < 0.5
            sock.settimeout(10)
            sock.sendall(body)
            response = b""
            while b"\r\n\r\n" not in response:
                response += sock.recv(65536)
            head, rest = response.split(b"\r\n\r\n", 1)
            assert head.startswith(b"HTTP/1.1 200 OK"), head
            fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
            length = int(fields[b"Content-Length"])
            json_length = int(fields[b"Inference-Header-Content-Length"])
            while len(rest) < length:
                rest += sock.recv(1 << 20)
            assert len(rest) == length
            got = np.frombuffer(rest[json_length:], dtype=np.float32)
            assert_close(got, reference_softmax(values), "float32")


def test_idle_keep_alive_connections_stay_open_for_seconds_then_close(server):
    """A pooled client reuses its connection after a pause: the server keeps
    an idle keep-alive connection open for 5 s (civetweb's default closed it
    after 500 ms), then closes it so that idle clients do not hold worker
    threads for good."""
    import socket
    body = json.dumps({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 4],
                                   "data": [0, 0, 0, 0]}]}).encode()
    request = (b"POST /v2/models/softmax/infer HTTP/1.1\r\nHost: x\r\n"
               b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    def roundtrip(sock):
        sock.sendall(request)
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection instead of answering"
            response += chunk
        head, rest = response.split(b"\r\n\r\n", 1)
        fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
        while len(rest) < int(fields[b"Content-Length"]):
            rest += sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 200 OK"), head
        return json.loads(rest)["outputs"][0]["data"]

    host, port = server.http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        assert roundtrip(sock) == [0.25] * 4
        time.sleep(2.0)  # four times civetweb's default
        assert roundtrip(sock) == [0.25] * 4
        idle_since = time.monotonic()
        assert sock.recv(1) == b""  # closed by the server
        assert 4.0 < time.monotonic() - idle_since < 15.0
