"""The top K of each row (softmax.v1's top_k, the Open Inference Protocol's
classification extension): the indices against the input's ranking (equal
values lower index first), for K within the GPU's fused kernel and past it,
the values against the whole output and the float64 reference, in
every dtype, along every axis, unary, on streams and in chunks; the refusals naming
top_k; tritonclient's class_count over gRPC and HTTP (JSON and binary)
giving Triton's "<value>:<index>" strings; softmax-client --top_k."""

import concurrent.futures
import queue
import subprocess

import grpc
import numpy as np
import pytest

import e2e_util
from e2e_util import assert_close, decode, reference_softmax, request

try:
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    from tritonclient.utils import InferenceServerException
except ImportError as error:  # pragma: no cover - the venv lacks it
    raise ImportError("tritonclient is missing from the test venv: run 'make venv'") from error


def ranking(values, axis, k):
    """The first k indices of each row of `values` along `axis` in the
    promised order: NaN first, then by value descending, equal values lower
    index first; with the values at those indices."""
    moved = np.moveaxis(values, axis, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    order = np.empty((rows.shape[0], k), dtype=np.int64)
    index = np.arange(rows.shape[1])
    for r, row in enumerate(rows):
        nan = np.isnan(row)
        order[r] = np.lexsort((index, np.where(nan, 0.0, -row), ~nan))[:k]
    picked = np.take_along_axis(rows, order, axis=1)
    shape = moved.shape[:-1] + (k,)
    return (np.moveaxis(picked.reshape(shape), -1, axis),
            np.moveaxis(order.reshape(shape), -1, axis))


def top_k_of(response):
    values = decode(response.top_k.values)
    indices = np.frombuffer(response.top_k.indices, dtype="<i8").reshape(values.shape)
    return values, indices


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,axis,k", [((6, 1000), -1, 5), ((3, 17, 4), 1, 17),
                                          ((9, 5), 0, 2), ((7,), 0, 1), ((4, 300), -1, 100)])
@pytest.mark.parametrize("log", [False, True])
def test_top_k_is_the_inputs_ranking(stub, dtype, shape, axis, k, log):
    rng = np.random.default_rng(1)
    # Rounded to a coarse grid so that rows hold equal values.
    values = np.round(rng.normal(size=shape) * 8) / 4
    full = stub.Softmax(request(values, dtype, axis=axis, log=log, top_k=k, full_output=True),
                        timeout=30)
    output = decode(full.output)
    got_values, got_indices = top_k_of(full)
    _, want_indices = ranking(decode(request(values, dtype).input), axis, k)
    assert list(full.top_k.values.shape) == list(want_indices.shape)
    np.testing.assert_array_equal(got_indices, want_indices)
    assert_close(got_values, np.take_along_axis(output, got_indices, axis=axis), dtype,
                 f"{dtype} {shape} axis={axis} k={k} against the whole output")
    exact = reference_softmax(decode(request(values, dtype).input), axis=axis, log=log)
    assert_close(got_values, np.take_along_axis(exact, got_indices, axis=axis), dtype,
                 f"{dtype} {shape} axis={axis} k={k}")

    only = stub.Softmax(request(values, dtype, axis=axis, log=log, top_k=k), timeout=30)
    assert not only.HasField("output")
    assert only.top_k == full.top_k


def test_a_scalar_is_a_row_of_one(stub):
    response = stub.Softmax(request(np.float32(3.0), top_k=1, log=True), timeout=10)
    assert list(response.top_k.values.shape) == []
    values, indices = top_k_of(response)
    assert values == 0.0 and indices == 0


def test_ties_come_lower_index_first(stub):
    values = np.array([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    response = stub.Softmax(request(values, top_k=4), timeout=10)
    _, indices = top_k_of(response)
    np.testing.assert_array_equal(indices, [[1, 2, 4, 0], [0, 1, 2, 3]])


@pytest.mark.parametrize("dtype,shape", [("bfloat16", (64, 32000)), ("float16", (8, 4096)),
                                         ("float32", (3, 131072))])
def test_top_k_is_the_same_whatever_is_batched_beside_it(device_server, dtype, shape):
    """A tensor's top K alone, then flooded on four streams at once among
    random companions of its row length: the same bytes every time, on the
    CPU and (where there is one) the GPU."""
    x = np.random.default_rng(11).normal(size=shape) * 3
    channel = device_server.channel()
    stub = e2e_util.softmax_pb2_grpc.SoftmaxServiceStub(channel)
    alone = stub.Softmax(request(x, dtype, top_k=8), timeout=60).top_k

    def flood(seed):
        rng = np.random.default_rng(seed)
        messages = []
        for i in range(6):
            companion = rng.normal(size=(int(rng.integers(1, 32)), shape[-1])) * 3
            messages.append(request(companion, dtype, request_id=f"o{i}", top_k=8))
            messages.append(request(x, dtype, request_id=f"x{i}", top_k=8))
        return list(stub.SoftmaxStream(iter(messages), timeout=120))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = [a for stream in pool.map(flood, range(4)) for a in stream]
    channel.close()
    assert len(answers) == 48 and not any(a.HasField("error") for a in answers)
    differing = [a.request_id for a in answers if a.request_id[0] == "x" and a.top_k != alone]
    assert differing == [], f"{len(differing)} of 24 answers differ from the tensor's alone"


@pytest.mark.parametrize("k", [-1, 33])
def test_out_of_range_k_is_invalid_naming_top_k(stub, k):
    with pytest.raises(grpc.RpcError) as raised:
        stub.Softmax(request(np.zeros((2, 32)), top_k=k), timeout=10)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "top_k" in raised.value.details()


def test_stream_answers_top_k_and_errors_per_request(stub):
    x = np.random.default_rng(0).normal(size=(3, 50))
    messages = [request(x, request_id="good", top_k=3), request(x, request_id="bad", top_k=51)]
    answers = {r.request_id: r for r in stub.SoftmaxStream(iter(messages), timeout=10)}
    assert answers["good"].top_k.values.shape == [3, 3]
    assert answers["bad"].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "top_k" in answers["bad"].error.message
    # An error answer carries neither part of an answer (the top K's dtype is
    # set as the request is read, before validation refuses it).
    assert not answers["bad"].HasField("top_k") and not answers["bad"].HasField("output")


def test_chunked_requests_answer_top_k_in_one_message(stub):
    x = np.random.default_rng(2).normal(size=(4, 256)).astype(np.float32)
    whole = stub.Softmax(request(x, top_k=3), timeout=10)
    messages = e2e_util.chunks_of(request(x, request_id="c", top_k=3), 1024)
    assert len(messages) == 4
    (answer,) = list(stub.SoftmaxStream(iter(messages), timeout=10))
    assert not answer.HasField("error") and not answer.more_chunks
    assert not answer.HasField("output") and answer.top_k == whole.top_k

    # With full_output: the output's chunks, the first carrying the top K.
    messages = e2e_util.chunks_of(request(x, request_id="f", top_k=3, full_output=True), 1024)
    answers = list(stub.SoftmaxStream(iter(messages), timeout=10))
    assert answers[0].top_k == whole.top_k
    assert not any(a.HasField("top_k") for a in answers[1:])
    assert answers[-1].more_chunks is False
    data = b"".join(a.output.data for a in sorted(answers, key=lambda a: a.chunk_offset))
    full = stub.Softmax(request(x), timeout=10)
    assert data == full.output.data


# ------------------------------------------------------------ classification

def triton_strings(values, indices):
    """Triton's classification elements: std::to_string of the value
    ("%f" of it widened to double) and the index."""
    return np.array([b"%f:%d" % (float(v), int(i))
                     for v, i in zip(values.ravel(), indices.ravel())],
                    dtype=object).reshape(values.shape)


def expected_classes(stub, x, model_log, k, dtype="float32", axis=-1):
    response = stub.Softmax(request(x, dtype, log=model_log, top_k=k, axis=axis), timeout=10)
    return triton_strings(*top_k_of(response))


@pytest.mark.parametrize("model", ["softmax", "log_softmax"])
@pytest.mark.parametrize("datatype", ["FP32", "FP16"])
def test_tritonclient_grpc_class_count(server, stub, model, datatype):
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    assert "classification" in client.get_server_metadata(as_json=True)["extensions"]
    x = (np.random.default_rng(5).normal(size=(4, 300)) * 3).astype(np.float32)
    dtype = {"FP32": "float32", "FP16": "float16"}[datatype]
    inp = triton_grpc.InferInput("INPUT", list(x.shape), datatype)
    inp.set_data_from_numpy(x.astype(np.float16) if datatype == "FP16" else x)
    out = triton_grpc.InferRequestedOutput("OUTPUT", class_count=3)
    result = client.infer(model, [inp], outputs=[out])
    got = result.as_numpy("OUTPUT")
    assert result.get_output("OUTPUT").datatype == "BYTES"
    assert got.shape == (4, 3)
    np.testing.assert_array_equal(got, expected_classes(stub, x, model == "log_softmax", 3,
                                                        dtype))
    # More classes than the row has: all of them, as Triton answers.
    out = triton_grpc.InferRequestedOutput("OUTPUT", class_count=1000)
    assert client.infer(model, [inp], outputs=[out]).as_numpy("OUTPUT").shape == (4, 300)
    client.close()


def test_tritonclient_stream_class_count_and_top_k(server, stub):
    """ModelStreamInfer answers classification and top_k as ModelInfer does."""
    x = np.random.default_rng(10).normal(size=(3, 64)).astype(np.float32)
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    results = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    inp = triton_grpc.InferInput("INPUT", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    client.async_stream_infer("softmax", [inp], request_id="c",
                              outputs=[triton_grpc.InferRequestedOutput("OUTPUT", class_count=2)])
    client.async_stream_infer("softmax", [inp], request_id="k", parameters={"top_k": 2},
                              outputs=[triton_grpc.InferRequestedOutput("TOP_K_INDICES")])
    answers = {}
    for _ in range(2):
        result, error = results.get(timeout=10)
        assert error is None, error
        answers[result.get_response().id] = result
    client.stop_stream()
    client.close()
    want = expected_classes(stub, x, False, 2)
    np.testing.assert_array_equal(answers["c"].as_numpy("OUTPUT"), want)
    _, indices = top_k_of(stub.Softmax(request(x, top_k=2), timeout=10))
    np.testing.assert_array_equal(answers["k"].as_numpy("TOP_K_INDICES"), indices)


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_http_class_count(server, stub, binary):
    client = triton_http.InferenceServerClient(server.http_address)
    assert "classification" in client.get_server_metadata()["extensions"]
    x = np.random.default_rng(6).normal(size=(2, 3, 40)).astype(np.float32)
    inp = triton_http.InferInput("INPUT", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = triton_http.InferRequestedOutput("OUTPUT", binary_data=binary, class_count=4)
    result = client.infer("softmax", [inp], outputs=[out], parameters={"axis": 1})
    got = result.as_numpy("OUTPUT")
    assert result.get_output("OUTPUT")["datatype"] == "BYTES"
    # Along axis 1, whose 3 elements are fewer than the 4 classes asked.
    assert got.shape == (2, 3, 40)
    got = np.vectorize(lambda e: e if isinstance(e, bytes) else e.encode(), otypes=[object])(got)
    np.testing.assert_array_equal(got, expected_classes(stub, x, False, 3, axis=1))
    client.close()


@pytest.mark.parametrize("parameters,words", [
    ({"classification": 0}, "classification: expected a class count > 0"),
    ({"classification": 2, "shared_memory_region": "r", "shared_memory_byte_size": 64},
     "'classification'"),
])
def test_classification_refusals(server, parameters, words):
    """What tritonclient refuses before sending, sent raw: INVALID_ARGUMENT."""
    request = service_pb2.ModelInferRequest(model_name="softmax")
    request.inputs.add(name="INPUT", datatype="FP32", shape=[2, 8])
    request.raw_input_contents.append(np.zeros((2, 8), dtype="<f4").tobytes())
    output = request.outputs.add(name="OUTPUT")
    for name, value in parameters.items():
        if isinstance(value, str):
            output.parameters[name].string_param = value
        else:
            output.parameters[name].int64_param = value
    channel = server.channel()
    with pytest.raises(grpc.RpcError) as raised:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    channel.close()
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in raised.value.details(), raised.value.details()


@pytest.mark.parametrize("protocol", ["grpc", "http-binary", "http-json"])
def test_kserve_top_k_parameter_answers_numeric_tensors(server, stub, protocol):
    x = (np.random.default_rng(8).normal(size=(5, 200)) * 2).astype(np.float32)
    want = stub.Softmax(request(x, "float16", top_k=4, log=True), timeout=10)
    want_values, want_indices = top_k_of(want)
    if protocol == "grpc":
        client, module = triton_grpc.InferenceServerClient(server.grpc_address), triton_grpc
        outputs = [module.InferRequestedOutput("TOP_K_INDICES"),
                   module.InferRequestedOutput("TOP_K_VALUES")]
    else:
        client, module = triton_http.InferenceServerClient(server.http_address), triton_http
        binary = protocol == "http-binary"
        outputs = [module.InferRequestedOutput("TOP_K_INDICES", binary_data=binary),
                   module.InferRequestedOutput("TOP_K_VALUES", binary_data=binary)]
    inp = module.InferInput("INPUT", list(x.shape), "FP16")
    inp.set_data_from_numpy(x.astype(np.float16))
    result = client.infer("log_softmax", [inp], outputs=outputs, parameters={"top_k": 4})
    indices, values = result.as_numpy("TOP_K_INDICES"), result.as_numpy("TOP_K_VALUES")
    assert indices.dtype == np.int64 and values.dtype == np.float16
    np.testing.assert_array_equal(indices, want_indices)
    np.testing.assert_array_equal(values.astype(np.float64), want_values)
    # OUTPUT is not answered with top_k.
    with pytest.raises(InferenceServerException) as raised:
        client.infer("log_softmax", [inp], outputs=[module.InferRequestedOutput("OUTPUT")],
                     parameters={"top_k": 4})
    assert "outputs[0].name" in str(raised.value)
    client.close()


# ------------------------------------------------------------- softmax-client

def test_softmax_client_prints_the_ranking_and_checks_it(server):
    result = subprocess.run(
        [e2e_util.CLIENT_BIN, f"--target={server.grpc_address}", "--shape=3,1000",
         "--dtype=bfloat16", "--top_k=4", "--check"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "top_k:      [3, 4] bfloat16" in result.stdout, result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("row ")]
    assert len(rows) == 3 and all(line.count("@") == 4 for line in rows), result.stdout
    assert "check:      0 of 12 top-K values" in result.stdout, result.stdout


@pytest.mark.parametrize("stream", [[], ["--stream"], ["--stream", "--chunk_bytes=4096"]])
def test_load_drives_top_k_and_verifies_it(server, stream):
    result = e2e_util.run_load(
        server.grpc_address, "--shape=4,7,300", "--axis=1", "--dtype=float16", "--log",
        "--top_k=7", "--verify", "--requests=200", "--warmup=0s", *stream, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verify:       200 responses checked, 0 mismatched" in result.stdout, result.stdout
