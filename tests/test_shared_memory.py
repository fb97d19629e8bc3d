"""Triton's shared-memory extensions, driven by tritonclient's own utilities
(tritonclient.utils.shared_memory and .cuda_shared_memory) over gRPC and HTTP:
register, infer from and into regions for every dtype against the float64
reference, status, unregister, every bad name, offset and size, a region
unregistered under load, the metrics, and --shared_memory=off.

System shared memory runs on the CPU backend everywhere and on the GPU (where
the kernels read and write the registered pages in place) when there is one;
CUDA shared memory runs only on a GPU and skips, with the reason, elsewhere."""

import itertools
import os
import threading
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest

import e2e_util
from e2e_util import assert_close, reference_softmax

try:
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http
    import tritonclient.utils.shared_memory as system_shm
    from tritonclient.utils import InferenceServerException
except ImportError as error:  # pragma: no cover - the venv lacks it
    raise ImportError("tritonclient is missing from the test venv: run 'make venv'") from error

DATATYPES = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16"}
STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
_keys = itertools.count()


@pytest.fixture(scope="module")
def server(device_server):
    return device_server


@pytest.fixture(params=["grpc", "http"])
def protocol(request, grpc_client, http_client):
    """(client, its module) for each protocol in turn."""
    return (grpc_client, triton_grpc) if request.param == "grpc" else (http_client, triton_http)


class Region:
    """A POSIX shared-memory region of the test process, destroyed at exit."""

    def __init__(self, byte_size):
        self.name = f"region-{os.getpid()}-{next(_keys)}"
        self.key = f"/softmax-test-{os.getpid()}-{next(_keys)}"
        self.byte_size = byte_size
        self.handle = system_shm.create_shared_memory_region(self.name, self.key, byte_size)

    def write(self, array, offset=0):
        system_shm.set_shared_memory_region(self.handle, [np.ascontiguousarray(array)], offset)

    def read(self, dtype, shape, offset=0):
        return system_shm.get_contents_as_numpy(self.handle, dtype, shape, offset)

    def destroy(self):
        system_shm.destroy_shared_memory_region(self.handle)


@pytest.fixture
def regions():
    made = []

    def make(byte_size):
        region = Region(byte_size)
        made.append(region)
        return region

    yield make
    for region in made:
        region.destroy()


def stored(values, dtype):
    """`values` as the bytes a caller stores for `dtype` (bf16 as uint16 bits)."""
    if dtype == "bfloat16":
        return e2e_util.float_to_bfloat16_bits(values)
    return values.astype(STORAGE[dtype])


def as_float(array, dtype):
    if dtype == "bfloat16":
        return e2e_util.bfloat16_bits_to_float(array).astype(np.float64)
    return array.astype(np.float64)


def representable(values, dtype):
    return as_float(stored(values, dtype), dtype)


def infer(client, module, values_shape, dtype, input_region=None, output_region=None,
          input_data=None, model="softmax", parameters=None, input_offset=0, output_offset=0,
          input_bytes=None, output_bytes=None):
    tensor = module.InferInput("INPUT", list(values_shape), DATATYPES[dtype])
    nbytes = int(np.prod(values_shape)) * np.dtype(STORAGE[dtype]).itemsize
    if input_region is not None:
        tensor.set_shared_memory(input_region.name,
                                 nbytes if input_bytes is None else input_bytes, input_offset)
    else:
        tensor.set_data_from_numpy(input_data)
    outputs = None
    if output_region is not None:
        out = module.InferRequestedOutput("OUTPUT")
        out.set_shared_memory(output_region.name,
                              nbytes if output_bytes is None else output_bytes, output_offset)
        outputs = [out]
    return client.infer(model, [tensor], outputs=outputs, parameters=parameters)


# ------------------------------------------------------------------ compute

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("log", [False, True])
def test_infers_from_and_into_system_regions(protocol, regions, dtype, log):
    client, module = protocol
    rng = np.random.default_rng(7)
    shape = (3, 5, 70)
    values = rng.normal(scale=4, size=shape).astype(np.float32)
    nbytes = values.size * np.dtype(STORAGE[dtype]).itemsize
    # Both tensors in one region, at offsets, as perf_analyzer lays them out.
    region = regions(4096 + 2 * nbytes)
    region.write(stored(values, dtype), offset=64)
    client.register_system_shared_memory(region.name, region.key, region.byte_size)
    try:
        out_offset = 64 + ((nbytes + 255) // 256) * 256
        result = infer(client, module, shape, dtype, input_region=region, output_region=region,
                       input_offset=64, output_offset=out_offset,
                       model="log_softmax" if log else "softmax",
                       parameters={"axis": 1})
        output = result.get_output("OUTPUT")
        assert output is not None
        if module is triton_grpc:
            # No bytes, but an (empty) entry parallel to the outputs, which
            # Triton's C++ client indexes by position.
            assert list(result.get_response().raw_output_contents) == [b""]
        got = as_float(region.read(STORAGE[dtype], shape, offset=out_offset), dtype)
        expected = reference_softmax(representable(values, dtype), axis=1, log=log)
        assert_close(got, expected, dtype, f"{dtype} log={log}")
        # The input is untouched.
        np.testing.assert_array_equal(region.read(STORAGE[dtype], shape, offset=64),
                                      stored(values, dtype))
    finally:
        client.unregister_system_shared_memory(region.name)


def test_one_end_in_a_region_the_other_in_the_message(grpc_client, regions):
    values = np.random.default_rng(1).normal(size=(4, 33)).astype(np.float32)
    region = regions(values.nbytes)
    region.write(values)
    grpc_client.register_system_shared_memory(region.name, region.key, region.byte_size)
    try:
        # Input from the region, output in the response.
        result = infer(grpc_client, triton_grpc, values.shape, "float32", input_region=region)
        assert_close(result.as_numpy("OUTPUT"), reference_softmax(values), "float32")
        # Input in the request, output into the region.
        doubled = values * 2
        infer(grpc_client, triton_grpc, values.shape, "float32", input_data=doubled,
              output_region=region)
        assert_close(region.read(np.float32, values.shape), reference_softmax(doubled), "float32")
    finally:
        grpc_client.unregister_system_shared_memory(region.name)


# ------------------------------------------------------ top K into regions

def infer_top_k(client, module, values, dtype, k, values_region=None, indices_region=None,
                values_bytes=None, values_offset=0, classification_region=None):
    """The parameter top_k = k over `values`; TOP_K_VALUES and TOP_K_INDICES
    requested, each into its region when given (or OUTPUT with class_count
    into classification_region)."""
    tensor = module.InferInput("INPUT", list(values.shape), DATATYPES[dtype])
    # tritonclient takes BF16 as float32 values.
    tensor.set_data_from_numpy(representable(values, dtype).astype(np.float32)
                               if dtype == "bfloat16" else stored(values, dtype))
    if classification_region is not None:
        # tritonclient refuses this itself ("shared memory can't be set on
        # classification output"); the parameters are set by hand.
        out = module.InferRequestedOutput("OUTPUT", class_count=k)
        if module is triton_grpc:
            out._output.parameters["shared_memory_region"].string_param = \
                classification_region.name
            out._output.parameters["shared_memory_byte_size"].int64_param = 1024
        else:
            out._parameters["shared_memory_region"] = classification_region.name
            out._parameters["shared_memory_byte_size"] = 1024
        return client.infer("softmax", [tensor], outputs=[out])
    rows = int(np.prod(values.shape[:-1]))
    outputs = []
    for name, region, nbytes, offset in (
            ("TOP_K_VALUES", values_region,
             rows * k * np.dtype(STORAGE[dtype]).itemsize if values_bytes is None
             else values_bytes, values_offset),
            ("TOP_K_INDICES", indices_region, rows * k * 8, 0)):
        out = module.InferRequestedOutput(name)
        if region is not None:
            out.set_shared_memory(region.name, nbytes, offset)
        outputs.append(out)
    return client.infer("softmax", [tensor], outputs=outputs, parameters={"top_k": k})


def region_parameters(result, module, name):
    """The shared-memory parameters the response gives for output `name`."""
    output = result.get_output(name)
    if module is triton_grpc:
        parameters = output.parameters
        return {key: getattr(parameters[key], parameters[key].WhichOneof("parameter_choice"))
                for key in parameters}
    return output.get("parameters", {})


def data_in_response(result, module, name):
    """Whether the response carries bytes or values for output `name`."""
    if module is triton_grpc:
        response = result.get_response()
        index = [output.name for output in response.outputs].index(name)
        return len(response.raw_output_contents[index]) > 0
    output = result.get_output(name)
    return "data" in output or "binary_data_size" in output.get("parameters", {})


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_top_k_into_system_regions(protocol, regions, dtype):
    """TOP_K_VALUES and TOP_K_INDICES written into the caller's regions (one
    at an offset, one output in a region and the other in the response) are
    the top K the same request returns without regions."""
    client, module = protocol
    rng = np.random.default_rng(11)
    values = rng.standard_normal((3, 200)).astype(np.float32)
    k = 5
    plain = infer_top_k(client, module, values, dtype, k)
    want_values = plain.as_numpy("TOP_K_VALUES")
    want_indices = plain.as_numpy("TOP_K_INDICES")
    assert want_values.shape == want_indices.shape == (3, k)

    values_region, indices_region = regions(4096), regions(4096)
    client.register_system_shared_memory(values_region.name, values_region.key, 4096)
    client.register_system_shared_memory(indices_region.name, indices_region.key, 4096)
    try:
        values_region.write(np.full(1024, 0xAB, dtype=np.uint8))
        result = infer_top_k(client, module, values, dtype, k, values_region=values_region,
                             indices_region=indices_region, values_offset=64)
        for name, region in (("TOP_K_VALUES", values_region),
                             ("TOP_K_INDICES", indices_region)):
            parameters = region_parameters(result, module, name)
            assert parameters["shared_memory_region"] == region.name, parameters
            assert not data_in_response(result, module, name), name
        assert region_parameters(result, module, "TOP_K_VALUES")["shared_memory_offset"] == 64
        got_values = values_region.read(STORAGE[dtype], [3, k], offset=64)
        np.testing.assert_array_equal(as_float(got_values, dtype),
                                      want_values.astype(np.float64))
        np.testing.assert_array_equal(indices_region.read(np.int64, [3, k]), want_indices)
        # The bytes before the offset are the caller's, untouched.
        assert (values_region.read(np.uint8, [64]) == 0xAB).all()

        # Only the indices into a region: the values come in the response.
        result = infer_top_k(client, module, values, dtype, k, indices_region=indices_region)
        np.testing.assert_array_equal(result.as_numpy("TOP_K_VALUES"), want_values)
        assert "shared_memory_region" not in region_parameters(result, module, "TOP_K_VALUES")
        np.testing.assert_array_equal(indices_region.read(np.int64, [3, k]), want_indices)
    finally:
        client.unregister_system_shared_memory(values_region.name)
        client.unregister_system_shared_memory(indices_region.name)


def test_top_k_regions_too_small_or_with_classification_are_refused(protocol, regions):
    client, module = protocol
    values = np.ones((3, 64), dtype=np.float32)
    region = regions(4096)
    client.register_system_shared_memory(region.name, region.key, 4096)
    try:
        # 3 rows of K = 5 float32: 60 bytes.
        expect_error(lambda: infer_top_k(client, module, values, "float32", 5,
                                         values_region=region, values_bytes=56),
                     "INVALID_ARGUMENT", 400,
                     "outputs[0].parameters.shared_memory_byte_size: 56 bytes",
                     "smaller than TOP_K_VALUES's 60 bytes")
        # As Triton (and its client): no classification into shared memory.
        expect_error(lambda: infer_top_k(client, module, values, "float32", 5,
                                         classification_region=region),
                     "INVALID_ARGUMENT", 400, "'shared_memory_region' and 'classification'")
    finally:
        client.unregister_system_shared_memory(region.name)


# ------------------------------------------------------ status, unregister

def test_status_lists_regions_and_unregister_without_a_name_drops_all(protocol, regions):
    client, _ = protocol
    a, b = regions(1024), regions(4096)
    client.register_system_shared_memory(a.name, a.key, 1000, offset=24)
    client.register_system_shared_memory(b.name, b.key, 4096)
    status = client.get_system_shared_memory_status()
    if isinstance(status, list):  # HTTP: a JSON array
        by_name = {r["name"]: r for r in status}
    else:
        by_name = {name: {"key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                   for name, r in status.regions.items()}
    assert by_name[a.name]["key"] == a.key
    assert int(by_name[a.name]["offset"]) == 24
    assert int(by_name[a.name]["byte_size"]) == 1000
    assert int(by_name[b.name]["byte_size"]) == 4096
    client.unregister_system_shared_memory()
    status = client.get_system_shared_memory_status()
    assert len(status if isinstance(status, list) else status.regions) == 0


def test_metrics_count_registered_regions(server, grpc_client, regions):
    def regions_metric():
        text = urllib.request.urlopen(f"http://{server.metrics_address}/metrics",
                                      timeout=10).read().decode()
        return (e2e_util.metric_value(text, "softmax_shared_memory_regions", {"kind": "system"}),
                e2e_util.metric_value(text, "softmax_shared_memory_bytes", {"kind": "system"}))

    before = regions_metric()
    region = regions(8192)
    grpc_client.register_system_shared_memory(region.name, region.key, 8192)
    assert regions_metric() == (before[0] + 1, before[1] + 8192)
    grpc_client.unregister_system_shared_memory(region.name)
    assert regions_metric() == before


# ------------------------------------------------------------ bad requests

def expect_error(call, grpc_code, http_status, *fragments):
    with pytest.raises(InferenceServerException) as error:
        call()
    status = str(error.value.status())
    assert status in (f"StatusCode.{grpc_code}", str(http_status)), (status, str(error.value))
    for fragment in fragments:
        assert fragment in error.value.message(), error.value.message()


def test_bad_registrations_are_refused(protocol, regions):
    client, _ = protocol
    region = regions(1024)
    expect_error(lambda: client.register_system_shared_memory("x", "/softmax-no-such-key", 64),
                 "NOT_FOUND", 404, "no shared-memory object")
    expect_error(lambda: client.register_system_shared_memory("x", region.key, 1025),
                 "INVALID_ARGUMENT", 400, "beyond the 1024 bytes")
    expect_error(lambda: client.register_system_shared_memory("x", region.key, 64, offset=1000),
                 "INVALID_ARGUMENT", 400, "beyond")
    client.register_system_shared_memory(region.name, region.key, 1024)
    try:
        expect_error(lambda: client.register_system_shared_memory(region.name, region.key, 64),
                     "ALREADY_EXISTS", 409, "already registered")
    finally:
        client.unregister_system_shared_memory(region.name)
    expect_error(lambda: client.unregister_system_shared_memory(region.name),
                 "NOT_FOUND", 404, region.name)
    expect_error(lambda: client.get_system_shared_memory_status(region.name),
                 "NOT_FOUND", 404, region.name)


def test_a_cpu_server_refuses_cuda_regions(server, grpc_client):
    if "--device=cpu" not in server.args:
        pytest.skip("the GPU server's CUDA regions are tested below")
    expect_error(lambda: grpc_client.register_cuda_shared_memory("c", b"\0" * 64, 0, 64),
                 "INVALID_ARGUMENT", 400, "no GPU")


@pytest.mark.parametrize("case", ["unknown region", "offset outside", "size past the end",
                                  "input size not the tensor's", "output region too small",
                                  "offset overflows", "size without region",
                                  "region and data both"])
def test_bad_tensor_references_are_refused(protocol, regions, case):
    client, module = protocol
    values = np.ones((2, 64), dtype=np.float32)
    region = regions(1024)
    region.write(values)
    client.register_system_shared_memory(region.name, region.key, 1024)
    try:
        def call():
            if case == "unknown region":
                ghost = Region.__new__(Region)
                ghost.name = "no-such-region"
                return infer(client, module, values.shape, "float32", input_region=ghost)
            if case == "offset outside":
                return infer(client, module, values.shape, "float32", input_region=region,
                             input_offset=1024)
            if case == "size past the end":
                return infer(client, module, values.shape, "float32", input_region=region,
                             input_offset=600)
            if case == "input size not the tensor's":
                return infer(client, module, values.shape, "float32", input_region=region,
                             input_bytes=256)
            if case == "output region too small":
                return infer(client, module, values.shape, "float32", input_data=values,
                             output_region=region, output_bytes=256)
            if case == "offset overflows":
                return infer(client, module, values.shape, "float32", input_region=region,
                             input_offset=8, input_bytes=2**63 - 4)
            if case == "size without region":
                tensor = module.InferInput("INPUT", list(values.shape), "FP32")
                tensor.set_data_from_numpy(values)
                tensor._parameters = getattr(tensor, "_parameters", {})
                if module is triton_grpc:
                    tensor._input.parameters["shared_memory_byte_size"].int64_param = 512
                else:
                    tensor._parameters["shared_memory_byte_size"] = 512
                return client.infer("softmax", [tensor])
            tensor = module.InferInput("INPUT", list(values.shape), "FP32")
            tensor.set_data_from_numpy(values)
            if module is triton_grpc:
                tensor._input.parameters["shared_memory_region"].string_param = region.name
                tensor._input.parameters["shared_memory_byte_size"].int64_param = 512
            else:
                tensor._parameters["shared_memory_region"] = region.name
                tensor._parameters["shared_memory_byte_size"] = 512
            return client.infer("softmax", [tensor])

        code, http, fragment = {
            "unknown region": ("NOT_FOUND", 404, "no-such-region"),
            "offset outside": ("INVALID_ARGUMENT", 400, "shared_memory_offset"),
            "size past the end": ("INVALID_ARGUMENT", 400, "past the end"),
            "input size not the tensor's": ("INVALID_ARGUMENT", 400, "expected 512 bytes"),
            "output region too small": ("INVALID_ARGUMENT", 400, "smaller than the output"),
            "offset overflows": ("INVALID_ARGUMENT", 400, "shared_memory_byte_size"),
            "size without region": ("INVALID_ARGUMENT", 400, "without shared_memory_region"),
            "region and data both": ("INVALID_ARGUMENT", 400, "both in shared memory"),
        }[case]
        expect_error(call, code, http, fragment)
        # Nothing was written past the region, and the server still serves.
        result = infer(client, module, values.shape, "float32", input_region=region)
        assert_close(result.as_numpy("OUTPUT"), reference_softmax(values), "float32")
    finally:
        client.unregister_system_shared_memory(region.name)


def test_a_region_unregistered_under_load(grpc_client, server, regions):
    """Callers keep inferring from a region while it is unregistered: each
    request is answered exactly once, correctly or NOT_FOUND, and the
    unregistration returns once none uses it."""
    shape = (64, 1024)
    values = np.random.default_rng(3).normal(size=shape).astype(np.float32)
    region = regions(values.nbytes)
    region.write(values)
    grpc_client.register_system_shared_memory(region.name, region.key, region.byte_size)
    expected = reference_softmax(values)
    outcomes = {"ok": 0, "not_found": 0}
    lock = threading.Lock()
    stop = threading.Event()
    errors = []

    def caller():
        client = triton_grpc.InferenceServerClient(server.grpc_address)
        try:
            while not stop.is_set():
                try:
                    result = infer(client, triton_grpc, shape, "float32", input_region=region)
                    assert_close(result.as_numpy("OUTPUT"), expected, "float32")
                    key = "ok"
                except InferenceServerException as error:
                    if "NOT_FOUND" not in str(error.status()):
                        errors.append(str(error))
                    key = "not_found"
                with lock:
                    outcomes[key] += 1
        finally:
            client.close()

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for t in threads:
        t.start()
    e2e_util.wait_for(lambda: outcomes["ok"] >= 50, 30, "requests served from the region")
    grpc_client.unregister_system_shared_memory(region.name)
    e2e_util.wait_for(lambda: outcomes["not_found"] >= 20, 30, "requests refused after")
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors[:3]
    assert outcomes["ok"] >= 50 and outcomes["not_found"] >= 20
    assert grpc_client.is_server_ready()


def test_queued_input_bytes_are_bounded_by_half_of_max_held_bytes(start_server, regions):
    """Requests whose tensors are all in shared memory hold nothing in the
    memory budget, so the queue's own bound on input bytes, half of
    --max_held_bytes, is what refuses them: with 200, three queued 32-byte
    requests (96 bytes) leave no room for a fourth."""
    server = start_server("--max_held_bytes=200", "--max_queue_delay_us=60000000",
                          "--max_batch_rows=1000000", env=e2e_util.HOLD_IN_QUEUE)
    assert e2e_util.metric_value(e2e_util.scrape_metrics(server.metrics_address),
                                 "softmax_queue_capacity_bytes") == 100
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    shape, nbytes = (1, 8), 32
    region = regions(5 * nbytes)
    region.write(np.zeros(shape, np.float32))
    client.register_system_shared_memory(region.name, region.key, region.byte_size)

    def request(index):
        tensor = triton_grpc.InferInput("INPUT", list(shape), "FP32")
        tensor.set_shared_memory(region.name, nbytes, 0)
        output = triton_grpc.InferRequestedOutput("OUTPUT")
        output.set_shared_memory(region.name, nbytes, (index + 1) * nbytes)
        return [tensor], [output]

    answered = []
    try:
        for i in range(3):
            inputs, outputs = request(i)
            client.async_infer("softmax", inputs, lambda *reply: answered.append(reply),
                               outputs=outputs, client_timeout=60)
        e2e_util.wait_for(lambda: (e2e_util.metric_value(
            e2e_util.scrape_metrics(server.metrics_address), "softmax_queued_requests") or 0) >= 3,
            10, "three requests to be queued")
        inputs, outputs = request(3)
        with pytest.raises(InferenceServerException) as error:
            client.infer("softmax", inputs, outputs=outputs, client_timeout=10)
        assert error.value.status() == "StatusCode.UNAVAILABLE", error.value
        assert "request queue full" in error.value.message(), error.value
        assert "100 bytes" in error.value.message(), error.value
        assert not answered
    finally:
        client.close()


def test_shared_memory_off(start_server, regions):
    process = start_server("--shared_memory=off")
    client = triton_grpc.InferenceServerClient(process.grpc_address)
    try:
        assert "system_shared_memory" not in client.get_server_metadata(as_json=True)["extensions"]
        region = regions(64)
        expect_error(lambda: client.register_system_shared_memory(region.name, region.key, 64),
                     "UNIMPLEMENTED", 501, "--shared_memory=off")
    finally:
        client.close()


def test_metadata_lists_the_extensions(grpc_client, http_client):
    for metadata in (grpc_client.get_server_metadata(as_json=True),
                     http_client.get_server_metadata()):
        assert "system_shared_memory" in metadata["extensions"]
        assert "cuda_shared_memory" in metadata["extensions"]


# ------------------------------------------------------------ CUDA regions

@pytest.fixture(scope="module")
def cuda_server():
    with e2e_util.start_on_device("cuda") as process:
        yield process


@pytest.fixture(scope="module")
def cuda_shm():
    try:
        import tritonclient.utils.cuda_shared_memory as module
    except Exception as error:  # pragma: no cover - CUDA's Python bindings are absent
        pytest.skip(f"tritonclient's cuda_shared_memory cannot load: {error}")
    return module


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,axis", [((8, 4096), -1), ((2, 3, 70000), -1), ((16, 5, 3), 1)])
@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_cuda_regions_every_dtype(cuda_server, cuda_shm, dtype, shape, axis, proto):
    module = triton_grpc if proto == "grpc" else triton_http
    address = cuda_server.grpc_address if proto == "grpc" else cuda_server.http_address
    client = module.InferenceServerClient(address)
    values = np.random.default_rng(11).normal(scale=3, size=shape).astype(np.float32)
    data = stored(values, dtype)
    nbytes = data.nbytes
    name_in, name_out = f"cin-{next(_keys)}", f"cout-{next(_keys)}"
    h_in = cuda_shm.create_shared_memory_region(name_in, nbytes, 0)
    h_out = cuda_shm.create_shared_memory_region(name_out, nbytes, 0)
    try:
        cuda_shm.set_shared_memory_region(h_in, [data])
        client.register_cuda_shared_memory(name_in, cuda_shm.get_raw_handle(h_in), 0, nbytes)
        client.register_cuda_shared_memory(name_out, cuda_shm.get_raw_handle(h_out), 0, nbytes)
        tensor = module.InferInput("INPUT", list(shape), DATATYPES[dtype])
        tensor.set_shared_memory(name_in, nbytes)
        out = module.InferRequestedOutput("OUTPUT")
        out.set_shared_memory(name_out, nbytes)
        client.infer("softmax", [tensor], outputs=[out], parameters={"axis": axis})
        got = as_float(cuda_shm.get_contents_as_numpy(h_out, STORAGE[dtype], list(shape)), dtype)
        assert_close(got, reference_softmax(representable(values, dtype), axis=axis), dtype,
                     f"cuda {dtype} {shape}")
        # The input in the region, the output in the response (and the
        # reverse), large enough for the server's pinned staging of inputs.
        plain_in = module.InferInput("INPUT", list(shape), DATATYPES[dtype])
        plain_in.set_shared_memory(name_in, nbytes)
        result = client.infer("softmax", [plain_in], parameters={"axis": axis})
        if proto == "grpc":
            raw = result.get_response().raw_output_contents[0]
        else:  # the binary output's bytes, as tritonclient received them
            start = result._output_name_to_buffer_map["OUTPUT"]
            raw = result._buffer[start:start + nbytes]
        got = as_float(np.frombuffer(raw, dtype=STORAGE[dtype]).reshape(shape), dtype)
        assert_close(got, reference_softmax(representable(values, dtype), axis=axis), dtype,
                     f"cuda in, response out {dtype} {shape}")
        status = client.get_cuda_shared_memory_status()
        names = ([r["name"] for r in status] if isinstance(status, list)
                 else list(status.regions.keys()))
        assert name_in in names and name_out in names
        # A CUDA tensor at an offset the kernels cannot load from.
        tensor.set_shared_memory(name_in, nbytes - 4, 4)
        expect_error(lambda: client.infer("softmax", [tensor]), "INVALID_ARGUMENT", 400,
                     "shared_memory_offset")
        # Larger than the allocation behind the handle.
        expect_error(lambda: client.register_cuda_shared_memory(
            "too-big", cuda_shm.get_raw_handle(h_in), 0, nbytes + (64 << 20)),
            "INVALID_ARGUMENT", 400, "byte_size")
        expect_error(lambda: client.register_cuda_shared_memory(
            "other-gpu", cuda_shm.get_raw_handle(h_in), 7, nbytes),
            "INVALID_ARGUMENT", 400, "device_id")
    finally:
        client.unregister_cuda_shared_memory()
        cuda_shm.destroy_shared_memory_region(h_in)
        cuda_shm.destroy_shared_memory_region(h_out)
        client.close()


@pytest.mark.parametrize("kind,path,body,status,fragment", [
    ("system", "region/r/register", b"{not json", 400, "not a JSON object"),
    ("system", "region/r/register", b'{"byte_size": 64}', 400, "key"),
    ("system", "region/r/register", b'{"key": "/k", "byte_size": "64"}', 400, "byte_size"),
    ("cuda", "region/r/register", b'{"raw_handle": {"b64": "%%%"}, "device_id": 0, '
                                  b'"byte_size": 64}', 400, "raw_handle"),
    ("cuda", "region/r/register", b'{"raw_handle": "AAAA", "device_id": 0, "byte_size": 64}',
     400, "raw_handle"),
    ("system", "region/r/frobnicate", b"{}", 404, "no endpoint"),
])
def test_bad_http_registration_bodies_are_refused(server, kind, path, body, status, fragment):
    request = urllib.request.Request(
        f"http://{server.http_address}/v2/{kind}sharedmemory/{path}", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(request, timeout=10)
    assert error.value.code == status
    assert fragment in error.value.read().decode()
