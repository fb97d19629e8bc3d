"""The Open Inference Protocol (KServe v2) called with the KServe Python SDK's
own clients, `kserve.InferenceGRPCClient` and `kserve.InferenceRESTClient`
(protocol "v2"), as a KServe transformer or an application written against
KServe calls a predictor: server liveness and readiness, model readiness (a
served model is ready, an unknown one is not), inference of `softmax` and
`log_softmax` in FP32 (raw and typed / JSON tensors) and FP16 (raw or
binary; the SDK sends FP16 no other way) against the float64 reference,
the `axis` and `temperature` parameters, the top K (parameter top_k, and an
output's classification), and the SDK's errors for an unknown model and
invalid parameters.

The SDK has no BF16 (no NumPy type for it, and its gRPC response decoding
rejects the datatype), and its gRPC parameters are bool, int64 or string
only (its proto has no double_param), so temperature travels as an int64
over gRPC and as a JSON number over REST.

kserve 0.21 pins protobuf and grpcio versions that the test venv's
tritonclient cannot share, so this file runs in a venv of its own,
build/kserve-venv (`make venv`; tests/CMakeLists.txt runs it with that
interpreter). Both clients are asynchronous: each case runs its calls in an
event loop of its own, with a client opened and closed inside it."""

import asyncio
import importlib.metadata

import numpy as np
import pytest

import e2e_util
from e2e_util import assert_close, reference_softmax

try:
    import grpc
    import httpx
    from kserve import (InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest,
                        RESTConfig)
except ImportError as error:  # pragma: no cover - run outside the kserve venv
    pytest.skip(f"the KServe SDK cannot be imported ({error}); this file runs in "
                "build/kserve-venv, which 'make venv' creates", allow_module_level=True)

DATATYPES = {"float32": "FP32", "float16": "FP16"}
NUMPY = {"float32": np.float32, "float16": np.float16}


def grpc_call(server, call):
    """`await call(client)` with an InferenceGRPCClient on the server's gRPC
    port, in an event loop of its own."""
    async def main():
        async with InferenceGRPCClient(server.grpc_address, timeout=30) as client:
            return await call(client)
    return asyncio.run(main())


def rest_call(server, call):
    """`await call(client, base_url)` with a v2 InferenceRESTClient, in an
    event loop of its own."""
    async def main():
        async with InferenceRESTClient(RESTConfig(protocol="v2", timeout=30)) as client:
            return await call(client, f"http://{server.http_address}")
    return asyncio.run(main())


def infer(server, transport, request):
    if transport == "grpc":
        return grpc_call(server, lambda client: client.infer(request))
    return rest_call(server, lambda client, url: client.infer(url, request,
                                                              model_name=request.model_name))


def make_request(model, values, dtype, binary=True, parameters=None, request_id="sdk-1"):
    """An InferRequest with one input `x` from `values` sent as `dtype`: raw
    bytes (gRPC raw_input_contents, REST binary tensor data) when `binary`,
    else typed contents (gRPC fp32_contents, REST JSON data)."""
    tensor = InferInput("x", list(values.shape), DATATYPES[dtype])
    tensor.set_data_from_numpy(np.asarray(values, dtype=NUMPY[dtype]), binary_data=binary)
    return InferRequest(model, [tensor], request_id=request_id, parameters=parameters)


def test_the_sdk_is_kserve_0_21():
    assert importlib.metadata.version("kserve").startswith("0.21."), \
        importlib.metadata.version("kserve")


# ------------------------------------------------------------------ health

def test_grpc_server_live_ready_and_models_ready(server):
    async def calls(client):
        return (await client.is_server_live(), await client.is_server_ready(),
                [await client.is_model_ready(m) for m in ("softmax", "log_softmax",
                                                          "softmax_fp16", "log_softmax_bf16")])
    live, ready, models = grpc_call(server, calls)
    assert live is True and ready is True
    assert models == [True] * 4


def test_rest_server_live_and_ready(server):
    # The SDK reads {"live": true} / {"ready": true} from the body (what
    # KServe's own model server sends; an empty body is a JSONDecodeError)
    # and raises on any status but 2xx.
    async def calls(client, url):
        return await client.is_server_live(url), await client.is_server_ready(url)
    assert rest_call(server, calls) == (True, True)


def test_rest_models_ready(server):
    async def calls(client, url):
        return [await client.is_model_ready(url, m) for m in ("softmax", "log_softmax",
                                                              "softmax_fp16", "log_softmax_bf16")]
    assert rest_call(server, calls) == [True] * 4


def test_grpc_unknown_model_is_not_ready(server):
    # ModelReady for a model the server does not serve answers OK with
    # ready: false, as Triton's releases up to 26.06 do; the SDK then
    # returns False (it raises the RpcError of any non-OK status).
    assert grpc_call(server, lambda client: client.is_model_ready("nope")) is False


def test_rest_unknown_model_is_not_ready(server):
    # A 4xx from .../ready is False to the SDK (v2: success means ready).
    assert rest_call(server, lambda client, url: client.is_model_ready(url, "nope")) is False


# ----------------------------------------------------------------- compute

CASES = [((7,), -1), ((4, 33), -1), ((4, 33), 0), ((2, 3, 5), 1), ((1, 1), 0), ((3, 1, 1000), -1)]
# (transport, dtype, binary): FP16 travels raw only (the SDK refuses FP16 as
# typed gRPC contents or as JSON data).
ENCODINGS = [("grpc", "float32", True), ("grpc", "float32", False), ("grpc", "float16", True),
             ("rest", "float32", True), ("rest", "float32", False), ("rest", "float16", True)]


@pytest.mark.parametrize("transport,dtype,binary", ENCODINGS,
                         ids=[f"{t}-{d}-{'raw' if b else 'typed'}" for t, d, b in ENCODINGS])
@pytest.mark.parametrize("shape,axis", CASES)
@pytest.mark.parametrize("model", ["softmax", "log_softmax"])
def test_infer_matches_the_reference(server, transport, dtype, binary, shape, axis, model):
    rng = np.random.default_rng(hash((transport, dtype, binary, shape, axis, model)) % 2**32)
    values = e2e_util.representable(rng.normal(0, 3, size=shape), dtype)
    parameters = {"axis": axis} if axis != -1 else None
    request = make_request(model, values, dtype, binary, parameters, request_id="r-7")
    response = infer(server, transport, request)
    assert response.model_name == model
    assert response.id == "r-7"
    assert [o.name for o in response.outputs] == ["OUTPUT"]
    output = response.outputs[0]
    assert output.datatype == DATATYPES[dtype]
    assert list(output.shape) == list(shape)
    assert_close(output.as_numpy(), reference_softmax(values, axis, 1.0, model == "log_softmax"),
                 dtype, f"{transport} {model} {dtype} {shape} axis {axis}")


@pytest.mark.parametrize("dtype", list(DATATYPES))
def test_rest_binary_output(server, dtype):
    # binary_data_output: the outputs come back as binary tensor data after
    # the JSON header, which the SDK splits with Inference-Header-Content-Length.
    values = e2e_util.representable(np.random.default_rng(3).normal(0, 2, size=(5, 300)), dtype)
    request = make_request("log_softmax", values, dtype, parameters={"binary_data_output": True})
    headers = {}
    response = rest_call(server, lambda client, url: client.infer(
        url, request, model_name="log_softmax", response_headers=headers))
    header = int(headers["inference-header-content-length"])
    assert int(headers["content-length"]) == header + values.size * (4 if dtype == "float32" else 2)
    assert_close(response.outputs[0].as_numpy(), reference_softmax(values, -1, 1.0, True), dtype)


@pytest.mark.parametrize("transport", ["grpc", "rest"])
def test_large_tensor(server, transport):
    values = e2e_util.representable(np.random.default_rng(6).normal(0, 4, size=(16, 32000)),
                                    "float16")
    response = infer(server, transport, make_request("softmax", values, "float16"))
    assert_close(response.outputs[0].as_numpy(), reference_softmax(values), "float16")


@pytest.mark.parametrize("transport,temperature", [("grpc", 2), ("grpc", 3), ("rest", 0.5),
                                                   ("rest", 2.0), ("rest", 3)])
def test_temperature(server, transport, temperature):
    values = np.random.default_rng(1).normal(0, 2, size=(3, 50)).astype(np.float32)
    request = make_request("softmax", values, "float32",
                           parameters={"temperature": temperature, "axis": 1})
    response = infer(server, transport, request)
    assert_close(response.outputs[0].as_numpy(), reference_softmax(values, 1, temperature),
                 "float32")


# ------------------------------------------------------------------ errors

def grpc_error(server, request):
    with pytest.raises(grpc.RpcError) as error:
        infer(server, "grpc", request)
    return error.value.code(), error.value.details()


def rest_error(server, request):
    with pytest.raises(httpx.HTTPStatusError) as error:
        infer(server, "rest", request)
    return error.value.response.status_code, str(error.value)


VALUES = np.zeros((2, 3), dtype=np.float32)


def test_grpc_unknown_model(server):
    code, details = grpc_error(server, make_request("nope", VALUES, "float32"))
    assert code == grpc.StatusCode.NOT_FOUND, details
    assert "nope" in details


def test_rest_unknown_model(server):
    # The SDK's HTTPStatusError carries the server's {"error": ...} text.
    status, message = rest_error(server, make_request("nope", VALUES, "float32"))
    assert status == 404, message
    assert "nope" in message


@pytest.mark.parametrize("parameters,field", [({"axis": 2}, "axis"), ({"temperature": 0}, "temperature"),
                                              ({"temperature": -1}, "temperature")])
def test_invalid_parameters(server, parameters, field):
    code, details = grpc_error(server, make_request("softmax", VALUES, "float32",
                                                    parameters=dict(parameters)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and field in details, details
    status, message = rest_error(server, make_request("softmax", VALUES, "float32",
                                                      parameters=dict(parameters)))
    assert status == 400 and field in message, message


# ------------------------------------------------------------------- top K

def ranking(values, k):
    """The first k indices of each row (last axis) in the promised order:
    by input value descending, equal values lower index first."""
    index = np.arange(values.shape[-1])
    return np.stack([np.lexsort((index, -row))[:k] for row in values])


@pytest.mark.parametrize("transport", ["grpc", "rest"])
def test_top_k_and_classification(server, transport):
    """The request parameter top_k (TOP_K_VALUES, TOP_K_INDICES) and an
    output's classification parameter, as the SDK sends them: the indices
    of the input's ranking, the values of the whole output there."""
    from kserve.protocol.infer_type import RequestedOutput
    values = e2e_util.representable(np.random.default_rng(9).normal(0, 3, size=(4, 200)),
                                    "float32")
    whole = infer(server, transport, make_request("softmax", values, "float32"))
    output = whole.outputs[0].as_numpy()
    want = ranking(values, 3)

    request = make_request("softmax", values, "float32", parameters={"top_k": 3})
    request.request_outputs = [RequestedOutput("TOP_K_VALUES"), RequestedOutput("TOP_K_INDICES")]
    response = infer(server, transport, request)
    assert [o.name for o in response.outputs] == ["TOP_K_VALUES", "TOP_K_INDICES"]
    np.testing.assert_array_equal(response.outputs[1].as_numpy(), want)
    np.testing.assert_array_equal(response.outputs[0].as_numpy(),
                                  np.take_along_axis(output, want, axis=1))

    request = make_request("softmax", values, "float32")
    request.request_outputs = [RequestedOutput("OUTPUT", parameters={"classification": 3})]
    response = infer(server, transport, request)
    assert response.outputs[0].datatype == "BYTES"
    strings = [s.decode() if isinstance(s, bytes) else s
               for s in np.asarray(response.outputs[0].as_numpy()).ravel()]
    assert strings == [f"{float(output[r, i]):f}:{i}" for r in range(4) for i in want[r]]
