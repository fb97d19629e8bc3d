"""The Open Inference Protocol (KServe v2) over gRPC, called with Triton's own
client (tritonclient.grpc) and, for what that client never sends (typed
contents, malformed requests), with its generated stubs: health, metadata,
config, statistics, inference for every dtype, shapes, axes, temperature and
log against the float64 reference, streaming, every bad request, the
RPCs left UNIMPLEMENTED, metrics, and softmax.v1 and KServe requests riding in
one batch."""

import queue
import signal
import threading
import time

import grpc
import numpy as np
import pytest

import e2e_util
from e2e_util import assert_close, reference_softmax

try:
    import tritonclient.grpc as triton_grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    from tritonclient.utils import InferenceServerException
except ImportError as error:  # pragma: no cover - the venv lacks it
    raise ImportError("tritonclient is missing from the test venv: run 'make venv'") from error

DATATYPES = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16"}
MODELS = {"softmax", "log_softmax", "softmax_fp16", "log_softmax_fp16", "softmax_bf16",
          "log_softmax_bf16"}


def make_input(values, dtype, name="INPUT"):
    tensor = triton_grpc.InferInput(name, list(values.shape), DATATYPES[dtype])
    tensor.set_data_from_numpy(values.astype(np.float16) if dtype == "float16" else values)
    return tensor


@pytest.fixture(scope="module")
def raw_stub(server):
    channel = server.channel()
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def infer_request(values, datatype="FP32", model="softmax", **fields):
    values = np.asarray(values, dtype=np.float32)
    request = service_pb2.ModelInferRequest(model_name=model, **fields)
    request.inputs.add(name="INPUT", datatype=datatype, shape=list(values.shape))
    request.raw_input_contents.append(values.tobytes())
    return request


# ------------------------------------------------------------------ health

def test_health_metadata_and_config(grpc_client):
    assert grpc_client.is_server_live()
    assert grpc_client.is_server_ready()
    assert grpc_client.is_model_ready("softmax")
    assert grpc_client.is_model_ready("log_softmax", "1")
    metadata = grpc_client.get_server_metadata(as_json=True)
    assert metadata["name"] == "softmax-serve"
    assert "statistics" in metadata["extensions"]
    assert "model_configuration" in metadata["extensions"]
    model = grpc_client.get_model_metadata("log_softmax", as_json=True)
    assert model["name"] == "log_softmax" and model["versions"] == ["1"]
    assert [t["name"] for t in model["inputs"]] == ["INPUT"]
    assert [t["name"] for t in model["outputs"]] == ["OUTPUT"]
    config = grpc_client.get_model_config("softmax").config
    assert config.name == "softmax"
    assert config.platform and config.backend
    assert config.max_batch_size == 0
    assert config.HasField("dynamic_batching")
    assert [i.name for i in config.input] == ["INPUT"]
    assert list(config.input[0].dims) == [-1, -1] and list(config.output[0].dims) == [-1, -1]
    assert config.input[0].data_type == config.output[0].data_type != 0


@pytest.mark.parametrize("model,datatype", [("softmax_fp16", "FP16"), ("log_softmax_bf16", "BF16"),
                                            ("softmax", "FP32")])
def test_typed_variants_advertise_their_datatype_and_compute_the_same(grpc_client, model,
                                                                     datatype):
    metadata = grpc_client.get_model_metadata(model, as_json=True)
    assert metadata["inputs"][0]["datatype"] == datatype
    assert metadata["outputs"][0]["datatype"] == datatype
    config = grpc_client.get_model_config(model, as_json=True)["config"]
    assert config["input"][0]["data_type"] == f"TYPE_{datatype}"
    dtype = {v: k for k, v in DATATYPES.items()}[datatype]
    values = e2e_util.representable(np.random.default_rng(8).normal(size=(3, 21)), dtype)
    for sent in (dtype, "float32"):  # every variant takes every type
        result = grpc_client.infer(model, [make_input(values, sent)])
        assert_close(result.as_numpy("OUTPUT"),
                     reference_softmax(values, -1, 1.0, model.startswith("log")), sent, model)


def test_a_model_not_served_is_not_ready_as_triton_answers(grpc_client):
    """ModelReady of a model (or version) not served is OK with ready false,
    as Triton answers it, so tritonclient's is_model_ready returns False."""
    assert grpc_client.is_model_ready("resnet") is False
    assert grpc_client.is_model_ready("softmax", "2") is False
    assert grpc_client.is_model_ready("softmax") is True


def test_unknown_model_is_not_found(grpc_client):
    for call in (lambda: grpc_client.get_model_metadata("resnet"),
                 lambda: grpc_client.get_model_config("resnet"),
                 lambda: grpc_client.get_model_metadata("softmax", "2"),
                 lambda: grpc_client.get_inference_statistics("resnet")):
        with pytest.raises(InferenceServerException) as error:
            call()
        assert error.value.status() == "StatusCode.NOT_FOUND", error.value
        assert "resnet" in error.value.message() or "version" in error.value.message()


@pytest.mark.parametrize("rpc,request_type", [
    ("RepositoryIndex", "RepositoryIndexRequest"),
    ("RepositoryModelLoad", "RepositoryModelLoadRequest"),
    ("RepositoryModelUnload", "RepositoryModelUnloadRequest"),
    ("TraceSetting", "TraceSettingRequest"),
    ("LogSettings", "LogSettingsRequest"),
])
def test_other_rpcs_are_unimplemented_naming_the_rpc(raw_stub, rpc, request_type):
    with pytest.raises(grpc.RpcError) as error:
        getattr(raw_stub, rpc)(getattr(service_pb2, request_type)(), timeout=10)
    assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert rpc in error.value.details()


# ----------------------------------------------------------------- compute

CASES = [((7,), -1), ((4, 33), -1), ((4, 33), 0), ((2, 3, 5), 1), ((3, 1, 1000), -1),
         ((1, 1), 0), ((0, 4), -1)]


@pytest.mark.parametrize("dtype", list(DATATYPES))
@pytest.mark.parametrize("shape,axis", CASES)
@pytest.mark.parametrize("model", ["softmax", "log_softmax"])
def test_infer_matches_the_reference(grpc_client, dtype, shape, axis, model):
    rng = np.random.default_rng(hash((dtype, shape, axis, model)) % 2**32)
    values = e2e_util.representable(rng.normal(0, 3, size=shape), dtype)
    parameters = {"axis": axis} if axis != -1 else None
    result = grpc_client.infer(model, [make_input(values, dtype, name="x")],
                               parameters=parameters, request_id="r-1")
    response = result.get_response()
    assert response.model_name == model and response.model_version == "1"
    assert response.id == "r-1"
    assert response.outputs[0].name == "OUTPUT"
    assert response.outputs[0].datatype == DATATYPES[dtype]
    assert list(response.outputs[0].shape) == list(shape)
    assert_close(result.as_numpy("OUTPUT"),
                 reference_softmax(values, axis, 1.0, model == "log_softmax"), dtype,
                 f"{model} {dtype} {shape} axis {axis}")


def test_large_tensor(grpc_client):
    values = e2e_util.representable(np.random.default_rng(6).normal(0, 4, size=(64, 32000)), "bfloat16")
    result = grpc_client.infer("log_softmax", [make_input(values, "bfloat16")])
    assert_close(result.as_numpy("OUTPUT"), reference_softmax(values, -1, 1.0, True), "bfloat16")


@pytest.mark.parametrize("temperature", [0.5, 2.0, 3])
def test_temperature(grpc_client, temperature):
    values = np.random.default_rng(1).normal(0, 2, size=(3, 50)).astype(np.float32)
    result = grpc_client.infer("softmax", [make_input(values, "float32")],
                               parameters={"temperature": temperature})
    assert_close(result.as_numpy("OUTPUT"), reference_softmax(values, -1, temperature),
                 "float32")


def test_typed_fp32_contents_and_requested_output(raw_stub):
    values = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, -1.0]], dtype=np.float32)
    request = service_pb2.ModelInferRequest(model_name="softmax", model_version="1", id="t")
    tensor = request.inputs.add(name="anything", datatype="FP32", shape=[2, 3])
    tensor.contents.fp32_contents.extend(values.ravel().tolist())
    request.outputs.add(name="OUTPUT")
    response = raw_stub.ModelInfer(request, timeout=10)
    output = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(2, 3)
    assert_close(output, reference_softmax(values), "float32")


# ----------------------------------------------------------- bad requests

def bad_requests():
    ok = np.zeros((2, 3), dtype=np.float32)
    cases = []

    def case(name, request, code, field):
        cases.append(pytest.param(request, code, field, id=name))

    r = infer_request(ok)
    r.inputs[0].datatype = "INT32"
    case("wrong datatype", r, "INVALID_ARGUMENT", "inputs[0].datatype")
    r = service_pb2.ModelInferRequest(model_name="softmax")
    case("missing input", r, "INVALID_ARGUMENT", "inputs")
    r = infer_request(ok)
    r.inputs.add(name="B", datatype="FP32", shape=[2, 3])
    r.raw_input_contents.append(ok.tobytes())
    case("two inputs", r, "INVALID_ARGUMENT", "inputs")
    r = infer_request(ok)
    r.outputs.add(name="PROBABILITIES")
    case("unknown output", r, "INVALID_ARGUMENT", "outputs[0].name")
    r = infer_request(ok)
    r.inputs[0].contents.fp32_contents.extend([0.0] * 6)
    case("contents and raw", r, "INVALID_ARGUMENT", "inputs[0].contents")
    r = infer_request(ok)
    r.raw_input_contents[0] = bytes(20)
    case("raw byte count", r, "INVALID_ARGUMENT", "raw_input_contents[0]")
    r = service_pb2.ModelInferRequest(model_name="softmax")
    r.inputs.add(name="INPUT", datatype="FP32", shape=[2, 3]).contents.fp32_contents.extend([1.0])
    case("contents count", r, "INVALID_ARGUMENT", "fp32_contents")
    r = service_pb2.ModelInferRequest(model_name="softmax")
    r.inputs.add(name="INPUT", datatype="FP16", shape=[1]).contents.fp32_contents.extend([1.0])
    case("typed FP16", r, "INVALID_ARGUMENT", "raw_input_contents")
    r = infer_request(ok)
    r.raw_input_contents.append(b"")
    case("raw entries", r, "INVALID_ARGUMENT", "raw_input_contents")
    r = infer_request(ok)
    r.inputs[0].shape[:] = [2, -3]
    case("negative dim", r, "INVALID_ARGUMENT", "inputs[0].shape[1]")
    r = infer_request(ok)
    r.parameters["axis"].int64_param = 2
    case("axis range", r, "INVALID_ARGUMENT", "axis")
    r = infer_request(ok)
    r.parameters["axis"].int64_param = 1 << 40
    case("axis int64", r, "INVALID_ARGUMENT", "axis")
    r = infer_request(ok)
    r.parameters["axis"].string_param = "0"
    case("axis type", r, "INVALID_ARGUMENT", "parameters.axis")
    for t in (0.0, -1.0, float("nan"), float("inf")):
        r = infer_request(ok)
        r.parameters["temperature"].double_param = t
        case(f"temperature {t}", r, "INVALID_ARGUMENT", "temperature")
    r = infer_request(ok, model="resnet")
    case("unknown model", r, "NOT_FOUND", "resnet")
    r = infer_request(ok, model_version="7")
    case("unknown version", r, "NOT_FOUND", "version")
    return cases


@pytest.mark.parametrize("request_message,code,field", bad_requests())
def test_bad_requests_are_refused_naming_the_field(raw_stub, request_message, code, field):
    with pytest.raises(grpc.RpcError) as error:
        raw_stub.ModelInfer(request_message, timeout=10)
    assert error.value.code().name == code, error.value.details()
    assert field in error.value.details(), error.value.details()
    # The server goes on serving.
    response = raw_stub.ModelInfer(infer_request(np.zeros((1, 2))), timeout=10)
    assert np.allclose(np.frombuffer(response.raw_output_contents[0], "<f4"), 0.5)


def test_bytes_that_are_no_message_are_refused(server):
    channel = server.channel()
    unary = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    with pytest.raises(grpc.RpcError) as error:
        unary(b"\xff\xff\xff", timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ModelInferRequest" in error.value.details()
    assert "wire format" in error.value.details(), error.value.details()
    stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
    good = infer_request(np.zeros((1, 2))).SerializeToString()
    replies = [service_pb2.ModelStreamInferResponse.FromString(r)
               for r in stream(iter([b"\xff\xff\xff", good]), timeout=10)]
    assert len(replies) == 2
    assert "ModelInferRequest" in replies[0].error_message
    assert replies[1].error_message == ""
    assert np.allclose(np.frombuffer(replies[1].infer_response.raw_output_contents[0], "<f4"),
                       0.5)
    channel.close()


def test_too_large_is_refused(start_server):
    server = start_server("--max_tensor_bytes=4096")
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    with pytest.raises(InferenceServerException) as error:
        client.infer("softmax", [make_input(np.zeros((2, 1024), np.float32), "float32")])
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "inputs[0]" in error.value.message() and "--max_tensor_bytes" in error.value.message()
    client.close()


# -------------------------------------------------------------- streaming

def test_stream_answers_every_request_and_goes_on_after_errors(grpc_client):
    results = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: results.put((result, error)))
    rng = np.random.default_rng(5)
    expected = {}
    try:
        for i in range(60):
            dtype = list(DATATYPES)[i % 3]
            model = "log_softmax" if i % 2 else "softmax"
            if i % 10 == 7:
                bad = make_input(np.zeros((2, 2), np.float32), "float32")
                grpc_client.async_stream_infer(model, [bad], request_id=f"s{i}",
                                               parameters={"temperature": -1.0})
                expected[f"s{i}"] = None
                continue
            values = e2e_util.representable(rng.normal(size=(3, 17)), dtype)
            grpc_client.async_stream_infer(model, [make_input(values, dtype)], request_id=f"s{i}")
            expected[f"s{i}"] = (reference_softmax(values, -1, 1.0, model == "log_softmax"),
                                 dtype)
        seen = set()
        errors = 0
        for _ in expected:
            result, error = results.get(timeout=30)
            if error is not None:
                assert "temperature" in error.message()
                errors += 1
                continue
            request_id = result.get_response().id
            assert request_id not in seen
            seen.add(request_id)
            reference, dtype = expected[request_id]
            assert_close(result.as_numpy("OUTPUT"), reference, dtype, request_id)
        assert errors == sum(1 for e in expected.values() if e is None)
        assert len(seen) == len(expected) - errors
    finally:
        grpc_client.stop_stream()


# ------------------------------------------------ statistics and metrics

def test_statistics_count_per_model(server):
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    before = client.get_inference_statistics("log_softmax", as_json=True)["model_stats"][0]
    count = int(before.get("inference_count", 0))
    for _ in range(3):
        client.infer("log_softmax", [make_input(np.ones((2, 4), np.float32), "float32")])
    with pytest.raises(InferenceServerException):
        client.infer("log_softmax", [make_input(np.ones((2, 4), np.float32), "float32")],
                     parameters={"axis": 9})
    stats = client.get_inference_statistics("log_softmax", as_json=True)["model_stats"][0]
    assert stats["name"] == "log_softmax" and stats["version"] == "1"
    assert int(stats["inference_count"]) == count + 3
    infer = stats["inference_stats"]
    assert int(infer["success"]["count"]) == count + 3 and int(infer["success"]["ns"]) > 0
    assert int(infer["fail"]["count"]) >= 1
    assert int(infer["compute_infer"]["count"]) == count + 3
    assert int(stats["last_inference"]) > 0
    every = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {s["name"] for s in every} == MODELS
    client.close()


def test_metrics_count_kserve_methods(server, grpc_client):
    text = e2e_util.scrape_metrics(server.metrics_address)
    before = e2e_util.metric_value(text, "softmax_requests_total",
                                   {"method": "ModelInfer", "code": "OK"}) or 0
    grpc_client.infer("softmax", [make_input(np.ones((1, 8), np.float32), "float32")])
    text = e2e_util.scrape_metrics(server.metrics_address)
    assert e2e_util.metric_value(text, "softmax_requests_total",
                                 {"method": "ModelInfer", "code": "OK"}) == before + 1
    assert e2e_util.metric_value(text, "softmax_request_duration_seconds_count",
                                 {"method": "ModelStreamInfer"}) is not None


def test_draining_is_not_ready_and_refuses_with_unavailable(start_server):
    """Within the lame duck (500 ms from SIGTERM, while the listener is still
    open): not ready, health NOT_SERVING, still live, inference refused
    UNAVAILABLE by the server itself."""
    server = start_server()
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    channel = server.channel()
    assert client.is_server_ready()
    # grpc.health.v1 answers for the KServe service too, as balancers ask it.
    assert e2e_util.health_check(channel, "inference.GRPCInferenceService") == "SERVING"
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    while client.is_server_ready():
        assert time.monotonic() - started < e2e_util.LAME_DUCK_S, "ServerReady never turned false"
        time.sleep(0.005)
    assert e2e_util.health_check(channel, "inference.GRPCInferenceService") == "NOT_SERVING"
    channel.close()
    assert client.is_server_live()
    assert not client.is_model_ready("softmax")
    with pytest.raises(InferenceServerException) as error:
        client.infer("softmax", [make_input(np.zeros((1, 2), np.float32), "float32")])
    assert error.value.status() == "StatusCode.UNAVAILABLE"
    assert "shutting down" in error.value.message(), error.value
    assert time.monotonic() - started < e2e_util.LAME_DUCK_S, (
        "the checks above must fall in the lame duck")
    client.close()
    assert server.process.wait(timeout=30) == 0


# ------------------------------------------------------ one shared batcher

def test_softmax_v1_and_kserve_requests_ride_in_one_batch(start_server):
    # Requests gather for a second (no dispatch on an idle device), so the two
    # sent together form one batch if, and only if, both protocols feed the
    # same batcher.
    server = start_server("--max_queue_delay_us=1000000", env=e2e_util.HOLD_IN_QUEUE)
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    stub = server.stub()
    values = np.random.default_rng(2).normal(size=(2, 16)).astype(np.float32)
    replies = {}

    def v1():
        replies["v1"] = stub.Softmax(e2e_util.request(values, "float32"), timeout=30)

    def kserve():
        replies["kserve"] = client.infer("softmax", [make_input(values, "float32")])

    threads = [threading.Thread(target=v1), threading.Thread(target=kserve)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert replies["v1"].timing.batch_requests == 2
    assert_close(replies["kserve"].as_numpy("OUTPUT"), reference_softmax(values), "float32")
    text = e2e_util.scrape_metrics(server.metrics_address)
    assert e2e_util.metric_value(text, "softmax_batch_requests_count") == 1
    assert e2e_util.metric_value(text, "softmax_batch_requests_sum") == 2
    client.close()


def test_mixed_load_batches_both_protocols_together(start_server):
    """Many callers of both protocols at once: every answer right, and
    softmax.v1 responses report batches holding more requests than the
    softmax.v1 callers alone could have put there."""
    server = start_server("--max_queue_delay_us=50000", env=e2e_util.HOLD_IN_QUEUE)
    values = np.random.default_rng(3).normal(size=(4, 64)).astype(np.float32)
    reference = reference_softmax(values)
    v1_callers, kserve_callers, rounds = 2, 6, 15
    batch_sizes, failures = [], []

    def v1():
        stub = server.stub()
        for _ in range(rounds):
            response = stub.Softmax(e2e_util.request(values, "float32"), timeout=30)
            batch_sizes.append(response.timing.batch_requests)
            assert_close(e2e_util.decode(response.output), reference, "float32")

    def kserve():
        client = triton_grpc.InferenceServerClient(server.grpc_address)
        for _ in range(rounds):
            result = client.infer("softmax", [make_input(values, "float32")])
            assert_close(result.as_numpy("OUTPUT"), reference, "float32")
        client.close()

    def run(target):
        try:
            target()
        except Exception as error:  # noqa: BLE001 - reported below
            failures.append(error)

    threads = [threading.Thread(target=run, args=(v1,)) for _ in range(v1_callers)]
    threads += [threading.Thread(target=run, args=(kserve,)) for _ in range(kserve_callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures
    assert max(batch_sizes) > v1_callers, batch_sizes


# ------------------------------------------------------------------ drain

def test_stream_is_answered_then_ended_with_unavailable_on_sigterm(start_server):
    """ModelStreamInfer drains as SoftmaxStream does: requests queued at
    SIGTERM are all answered, then the stream ends with UNAVAILABLE (retry
    elsewhere) although its client never half-closed, and the server exits
    within the lame duck + 1 s instead of waiting out the grace."""
    server = start_server("--max_queue_delay_us=60000000", "--max_batch_rows=1000000",
                          "--shutdown_grace_s=30", env=e2e_util.HOLD_IN_QUEUE)
    channel = server.channel()
    stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
    release = threading.Event()
    inputs = [np.random.default_rng(i).normal(size=(2, 16)) for i in range(5)]

    def requests():
        for i, x in enumerate(inputs):
            yield infer_request(x, id=f"s{i}").SerializeToString()
        release.wait(30)

    replies = stream(requests(), timeout=60)
    received = []
    try:
        deadline = time.monotonic() + 10
        while (e2e_util.metric_value(e2e_util.scrape_metrics(server.metrics_address),
                                     "softmax_queued_requests") or 0) < 5:
            assert time.monotonic() < deadline, "the stream's requests were never queued"
            time.sleep(0.01)
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        with pytest.raises(grpc.RpcError) as caught:
            for reply in replies:
                received.append(service_pb2.ModelStreamInferResponse.FromString(reply))
        # Ended by the server's drain, not by its connection going away.
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
        assert "shutting down" in caught.value.details(), caught.value
        assert server.process.wait(timeout=10) == 0, server.output()
        assert time.monotonic() - started <= e2e_util.LAME_DUCK_S + 1.0
    finally:
        release.set()
        channel.close()
    assert sorted(r.infer_response.id for r in received) == [f"s{i}" for i in range(5)]
    for reply in received:
        assert reply.error_message == ""
        values = np.frombuffer(reply.infer_response.raw_output_contents[0], "<f4")
        x = inputs[int(reply.infer_response.id[1:])]
        assert_close(values.reshape(x.shape), reference_softmax(x), "float32")
