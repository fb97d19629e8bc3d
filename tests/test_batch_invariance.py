"""Batch invariance end to end: a probe tensor's answer has the same bits
whatever else the server computes beside it and whichever protocol carries it.

Each probe (every dtype, softmax and log-softmax, both sides of the kernels'
path boundaries, the shapes an H200 run caught with other bits, a temperature
other than 1, non-last axes, rows of -inf, NaN, +inf, +-0 maxima, subnormals
and equal values) is asked once with the server idle: those bytes
are its reference. Then background callers flood the server over softmax.v1
unary with random tensors of mixed shapes, dtypes, axes and temperatures,
while every probe is sent again and again over every protocol: softmax.v1
unary, softmax.v1 stream, chunked stream, softmax.v1 unary asking the top K
(values and indices; a third of the flood asks a top K too), KServe gRPC and HTTP (binary
tensors, tritonclient), system shared memory over both and, on the GPU
backend, CUDA shared memory over both; every answer's
bytes must equal the reference's. The server runs with a short
--max_queue_delay_us so that probes ride in batches with the flood.

On the CPU backend (CI) the probes keep their row lengths with fewer rows.
Knobs, from the environment:
  SOFTMAX_INVARIANCE_ROUNDS   times each probe goes through each protocol
                              (default 5)
  SOFTMAX_INVARIANCE_SECONDS  stop starting probes after this long (default:
                              no limit); the summary says how many were done
  SOFTMAX_INVARIANCE_FLOOD    flood requests kept in flight (default 4 on the
                              CPU, 48 on a GPU)
Each run prints one summary line per device: answers compared and differing,
per protocol, the flood's size and how many probe answers shared a batch.
"""

import concurrent.futures
import json
import os
import re
import threading
import time

import grpc
import numpy as np
import pytest

import e2e_util
from e2e_util import chunks_of, decode, encode, reference_softmax, softmax_pb2, softmax_pb2_grpc

try:
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http
    import tritonclient.utils.shared_memory as system_shm
    TRITONCLIENT_MISSING = None
except ImportError as error:  # the GPU machine may run without it
    TRITONCLIENT_MISSING = f"tritonclient cannot be imported ({error})"
try:  # CUDA's Python bindings, where a GPU machine has them
    import tritonclient.utils.cuda_shared_memory as cuda_shm
    CUDA_SHM_MISSING = None
except Exception as error:  # noqa: BLE001 - any failure to load means "not here"
    CUDA_SHM_MISSING = f"tritonclient's cuda_shared_memory cannot load ({error})"

ROUNDS = int(os.environ.get("SOFTMAX_INVARIANCE_ROUNDS", "5"))
SECONDS = float(os.environ.get("SOFTMAX_INVARIANCE_SECONDS", "0")) or None
QUEUE_DELAY_US = 200
# tritonclient's CUDA shared-memory helpers create one global CUDA stream on
# first use without a lock: two threads there can each make one and one of
# them destroys it under the other's copy (segfaults in 3 of 4 probing
# processes on an H100). Every call to those helpers holds this lock.
CUDA_SHM_LOCK = threading.Lock()
DATATYPES = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16"}
BITS = {"float32": "<u4", "float16": "<u2", "bfloat16": "<u2"}
LOG_ATOL = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}

V1_PROTOCOLS = ["v1-unary", "v1-stream", "v1-chunked", "v1-top-k"]
KSERVE_PROTOCOLS = ["kserve-grpc", "kserve-http", "shm-grpc", "shm-http"]
# CUDA shared memory: the probe's input and output in device memory (GPU backend).
CUDA_SHM_PROTOCOLS = ["cudashm-grpc", "cudashm-http"]
# Messages of one probe on a stream call (compared separately).
STREAM_COPIES = 2
# The callers' channels retry UNAVAILABLE as a production caller does: a call
# that races a connection's GOAWAY at its --max_connection_age_s fails so
# without being computed (gRPC cannot always retry it on its own: 5 of
# 312,928 flood calls in three 290 s runs on the H200). Retried messages are kept
# up to the retry buffer's size, so it holds the largest tensor here.
RETRY_CHANNEL_OPTIONS = list(e2e_util.CHANNEL_OPTIONS) + [
    ("grpc.enable_retries", 1),
    ("grpc.per_rpc_retry_buffer_size", 64 << 20),
    ("grpc.retry_buffer_size", 256 << 20),
    ("grpc.service_config", json.dumps({"methodConfig": [{
        "name": [{}],
        "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
                        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]})),
]

# The lengths either side of the GPU kernels' path boundaries.
ROW_LENGTHS = [1, 31, 32, 1000, 1024, 1025, 4096, 8192, 8193, 16384, 32000, 40000, 65536]
# The CPU keeps each row length but no more rows than fit in this many elements.
CPU_PROBE_ELEMENTS = 65536


# Subnormal magnitudes of each dtype (bfloat16 shares float32's exponent range).
SUBNORMAL = {"float32": 1e-39, "float16": 3e-6, "bfloat16": 1e-39}


def special_rows(values, dtype, rng):
    """`values` (rows along the last axis) with its rows cycling through the
    values that the reductions meet at their edges: some -inf, all -inf, a
    NaN, a +inf, a maximum of +0 and -0, subnormals, all equal, and normal
    rows between them."""
    rows = np.array(values).reshape(-1, values.shape[-1])
    n = rows.shape[1]
    for r in range(rows.shape[0]):
        row = rows[r]
        kind = r % 8
        if kind == 1:
            row[::7] = -np.inf
        elif kind == 2:
            row[:] = -np.inf
        elif kind == 3:
            row[int(rng.integers(n))] = np.nan
        elif kind == 4:
            row[int(rng.integers(n))] = np.inf
        elif kind == 5:
            row[:] = -np.abs(row)
            row[rng.integers(n, size=max(1, n // 5))] = 0.0
            row[rng.integers(n, size=max(1, n // 5))] = -0.0
        elif kind == 6:
            row[:] = row * SUBNORMAL[dtype]
        elif kind == 7:
            row[:] = 1.5
    return rows.reshape(np.shape(values))


class Probe:
    def __init__(self, index, dtype, shape, axis=-1, temperature=1.0, log=False, special=False):
        self.index = index
        self.dtype = dtype
        self.shape = tuple(shape)
        self.axis = axis
        self.temperature = temperature
        self.log = log
        rng = np.random.default_rng(1000 + index)
        values = rng.normal(0, 3, size=self.shape).astype(np.float32)
        if special:  # the patterns go along the softmax axis
            moved = special_rows(np.moveaxis(values, axis, -1), dtype, rng)
            values = np.ascontiguousarray(np.moveaxis(moved, -1, axis))
        self.tensor = encode(values, dtype)
        self.data = self.tensor.data
        self.nbytes = len(self.data)
        self.reference = None  # the idle answer's bytes
        self.top_k = min(64 if index % 2 else 5, self.shape[axis])
        self.top_k_reference = None  # the idle top K's values and indices
        self.name = (f"{dtype}{list(self.shape)} axis={axis} T={temperature} "
                     f"{'log_softmax' if log else 'softmax'}{' special' if special else ''}")

    def request(self, request_id):
        fields = {}
        if self.axis != -1:
            fields["axis"] = self.axis
        if self.temperature != 1.0:
            fields["temperature"] = self.temperature
        return softmax_pb2.SoftmaxRequest(request_id=request_id, input=self.tensor,
                                          log=self.log, **fields)

    def top_k_request(self, request_id):
        request = self.request(request_id)
        request.top_k = self.top_k
        return request

    def kserve_parameters(self):
        parameters = {}
        if self.axis != -1:
            parameters["axis"] = self.axis
        if self.temperature != 1.0:
            parameters["temperature"] = self.temperature
        return parameters or None

    def model(self):
        return "log_softmax" if self.log else "softmax"


def probe_set(device):
    specs = []
    for dtype in DATATYPES:
        for n in ROW_LENGTHS:
            for log in (False, True):
                specs.append((dtype, (3, n), -1, 1.0, log))
    # The shapes that came back with other bits under load on the H200.
    for log in (False, True):
        for shape in ((2, 1024), (2, 2049), (16, 4096), (64, 32000)):
            specs.append(("float32", shape, -1, 1.0, log))
        for dtype in ("float16", "bfloat16"):
            for shape in ((2, 40000), (64, 32000)):
                specs.append((dtype, shape, -1, 1.0, log))
    # Temperatures other than 1, a 3-d last axis, non-last axes.
    specs += [
        ("float32", (4, 4096), -1, 0.7, False),
        ("bfloat16", (3, 8193), -1, 0.7, True),
        ("float16", (2, 1025), -1, 2.5, False),
        ("float32", (2, 3, 1024), -1, 1.0, True),
        ("float32", (4, 1000, 3), 1, 1.0, False),
        ("float16", (2, 33, 70), 0, 0.7, False),
        ("bfloat16", (8, 5, 3), 1, 1.0, True),
        ("float32", (3, 8193, 2), 1, 1.0, True),
    ]
    specs = [spec + (False,) for spec in specs]
    # Rows of -inf, NaN, +inf, +-0 maxima, subnormals and equal values
    # (special_rows) on both sides of the kernels' boundaries and along a
    # non-last axis.
    for dtype in DATATYPES:
        for i, n in enumerate((32, 1025, 8193, 32000)):
            log = i % 2 == 1
            specs.append((dtype, (8, n), -1, 0.7 if log else 1.0, log, True))
        specs.append((dtype, (8, 300, 4), 1, 1.0, False, True))
    probes = []
    for index, (dtype, shape, axis, temperature, log, special) in enumerate(specs):
        if device == "cpu" and axis == -1:
            n = shape[-1]
            rows = max(1, CPU_PROBE_ELEMENTS // n)
            if int(np.prod(shape)) // n > rows:
                shape = (rows,) + (1,) * (len(shape) - 2) + (n,)
        probes.append(Probe(index, dtype, shape, axis, temperature, log, special))
    return probes


def flood_requests(device, count=96, seed=5):
    """Random other tensors: mixed shapes (probe lengths among them), dtypes,
    axes, temperatures and ops."""
    rng = np.random.default_rng(seed)
    max_elements = 1 << 16 if device == "cpu" else 1 << 20
    requests = []
    for i in range(count):
        dtype = list(DATATYPES)[i % 3]
        if rng.random() < 0.5:
            n = int(rng.choice(ROW_LENGTHS + [2049, 70000]))
        else:
            n = int(rng.integers(1, 70000))
        rows = int(rng.integers(1, 65))
        rows = max(1, min(rows, max_elements // n))
        shape = [rows, n]
        axis = -1
        if rng.random() < 0.2 and n * rows <= max_elements // 2:
            shape = [rows, n, int(rng.integers(2, 5))]
            axis = 1
        values = rng.normal(0, float(rng.choice([0.5, 3, 20])), size=shape).astype(np.float32)
        requests.append(softmax_pb2.SoftmaxRequest(
            request_id=f"flood-{i}", input=encode(values, dtype), axis=axis,
            temperature=float(rng.choice([1.0, 0.5, 2.0, 0.7])), log=bool(rng.random() < 0.5),
            top_k=min(8, n) if i % 3 == 0 else 0))
    return requests


@pytest.fixture(scope="module", params=["cpu", "cuda"])
def server(request):
    """The server on each backend (the GPU one skips with the server's
    reason where there is none), with a short queue delay so that batches
    mix requests."""
    process = e2e_util.start_on_device(request.param, f"--max_queue_delay_us={QUEUE_DELAY_US}")
    try:
        yield request.param, process
    finally:
        process.kill()


# ------------------------------------------------------------------ protocols

def _stream_data(probe, stub, chunked, tag):
    """Bytes of each of STREAM_COPIES answers to `probe` on one stream call,
    whole or in chunks (the copies' chunks interleaved)."""
    requests = [probe.request(f"{tag}-{copy}") for copy in range(STREAM_COPIES)]
    if chunked:
        chunk_bytes = max(1, -(-probe.nbytes // 3))  # not aligned to the item size
        sequences = [chunks_of(r, chunk_bytes) for r in requests]
        messages = [m for group in zip(*sequences) for m in group]
    else:
        messages = requests
    answers = {}
    for response in stub.SoftmaxStream(iter(messages), timeout=120):
        assert response.error.code == 0, (probe.name, response.error)
        rid = response.request_id
        if rid not in answers:
            assert response.chunk_offset == 0, response
            answers[rid] = [bytearray(response.output.data), response.timing.batch_requests]
        else:
            assert response.chunk_offset == len(answers[rid][0]), (rid, response.chunk_offset)
            answers[rid][0] += response.output.data
    assert sorted(answers) == sorted(r.request_id for r in requests), answers.keys()
    return [(bytes(answers[r.request_id][0]), answers[r.request_id][1]) for r in requests]


def kserve_input(module, probe):
    """INPUT carrying the probe's bytes. tritonclient serializes BF16 from
    float32 one element at a time in Python (seconds for 2M elements), by
    truncation: the probe's values are bfloat16 already, so the same bytes
    are set directly (checked against tritonclient's own in a test below)."""
    tensor = module.InferInput("INPUT", list(probe.shape), DATATYPES[probe.dtype])
    if probe.dtype == "bfloat16":
        if module is triton_grpc:
            tensor._raw_content = probe.data
        else:
            tensor._raw_data = probe.data
            tensor._parameters["binary_data_size"] = probe.nbytes
    else:
        tensor.set_data_from_numpy(
            np.frombuffer(probe.data, dtype="<f4" if probe.dtype == "float32" else "<f2")
            .reshape(probe.shape))
    return tensor


class Prober:
    """One probing thread's clients and shared-memory region."""

    def __init__(self, server, index, region_bytes, kserve, cuda):
        self.channel = grpc.insecure_channel(server.grpc_address, options=RETRY_CHANNEL_OPTIONS)
        self.stub = softmax_pb2_grpc.SoftmaxServiceStub(self.channel)
        self.tag = f"probe{index}"
        self.calls = 0
        self.kserve = kserve
        if kserve:
            self.grpc = triton_grpc.InferenceServerClient(server.grpc_address,
                                                          channel_args=RETRY_CHANNEL_OPTIONS)
            self.http = triton_http.InferenceServerClient(server.http_address,
                                                          network_timeout=120.0)
            self.region_name = f"invariance-{os.getpid()}-{index}"
            self.region = system_shm.create_shared_memory_region(
                self.region_name, f"/softmax-invariance-{os.getpid()}-{index}", region_bytes)
            self.grpc.register_system_shared_memory(
                self.region_name, f"/softmax-invariance-{os.getpid()}-{index}", region_bytes)
        # Two device regions (input, output) of half the host region each.
        self.cuda_regions = []
        if cuda:
            for side in ("in", "out"):
                name = f"invariance-cuda-{side}-{os.getpid()}-{index}"
                with CUDA_SHM_LOCK:
                    handle = cuda_shm.create_shared_memory_region(name, region_bytes // 2, 0)
                self.cuda_regions.append((name, handle))
                self.grpc.register_cuda_shared_memory(
                    name, cuda_shm.get_raw_handle(handle), 0, region_bytes // 2)

    def close(self):
        if self.kserve:
            try:
                self.grpc.unregister_system_shared_memory(self.region_name)
                for name, _ in self.cuda_regions:
                    self.grpc.unregister_cuda_shared_memory(name)
            finally:
                for _, handle in self.cuda_regions:
                    with CUDA_SHM_LOCK:
                        cuda_shm.destroy_shared_memory_region(handle)
                system_shm.destroy_shared_memory_region(self.region)
                self.grpc.close()
                self.http.close()
        self.channel.close()

    def ask(self, probe, protocol, inputs):
        """[(answer bytes, requests in its batch or None)] for one call."""
        self.calls += 1
        rid = f"{self.tag}-{self.calls}"
        if protocol == "v1-unary":
            response = self.stub.Softmax(probe.request(rid), timeout=120)
            return [(response.output.data, response.timing.batch_requests)]
        if protocol == "v1-top-k":
            response = self.stub.Softmax(probe.top_k_request(rid), timeout=120)
            return [(top_k_bytes(response), response.timing.batch_requests)]
        if protocol in ("v1-stream", "v1-chunked"):
            return _stream_data(probe, self.stub, protocol == "v1-chunked", rid)
        if protocol == "kserve-grpc":
            result = self.grpc.infer(probe.model(), [inputs["grpc"]],
                                     parameters=probe.kserve_parameters(), client_timeout=120)
            return [(result.get_response().raw_output_contents[0], None)]
        if protocol == "kserve-http":
            result = self.http.infer(probe.model(), [inputs["http"]],
                                     outputs=[triton_http.InferRequestedOutput(
                                         "OUTPUT", binary_data=True)],
                                     parameters=probe.kserve_parameters())
            start = result._output_name_to_buffer_map["OUTPUT"]
            return [(bytes(result._buffer[start:start + probe.nbytes]), None)]
        module, client = ((triton_grpc, self.grpc) if protocol.endswith("-grpc")
                          else (triton_http, self.http))
        kwargs = {"client_timeout": 120} if module is triton_grpc else {}
        if protocol.startswith("cudashm"):
            # Input and output in device memory, the output poisoned first.
            (name_in, h_in), (name_out, h_out) = self.cuda_regions
            with CUDA_SHM_LOCK:
                cuda_shm.set_shared_memory_region(h_in, [np.frombuffer(probe.data, dtype=np.uint8)])
                cuda_shm.set_shared_memory_region(h_out, [np.full(probe.nbytes, 0xA5, dtype=np.uint8)])
            tensor = module.InferInput("INPUT", list(probe.shape), DATATYPES[probe.dtype])
            tensor.set_shared_memory(name_in, probe.nbytes)
            output = module.InferRequestedOutput("OUTPUT")
            output.set_shared_memory(name_out, probe.nbytes)
            client.infer(probe.model(), [tensor], outputs=[output],
                         parameters=probe.kserve_parameters(), **kwargs)
            with CUDA_SHM_LOCK:
                got = cuda_shm.get_contents_as_numpy(h_out, np.uint8, [probe.nbytes])
            return [(got.tobytes(), None)]
        # shm-grpc / shm-http: input at the region's start, output at the
        # next page, poisoned first so that a missing write cannot pass.
        out_offset = -(-probe.nbytes // 4096) * 4096
        system_shm.set_shared_memory_region(
            self.region, [np.frombuffer(probe.data, dtype=np.uint8)], 0)
        system_shm.set_shared_memory_region(
            self.region, [np.full(probe.nbytes, 0xA5, dtype=np.uint8)], out_offset)
        tensor = module.InferInput("INPUT", list(probe.shape), DATATYPES[probe.dtype])
        tensor.set_shared_memory(self.region_name, probe.nbytes, 0)
        output = module.InferRequestedOutput("OUTPUT")
        output.set_shared_memory(self.region_name, probe.nbytes, out_offset)
        client.infer(probe.model(), [tensor], outputs=[output],
                     parameters=probe.kserve_parameters(), **kwargs)
        got = system_shm.get_contents_as_numpy(self.region, np.uint8, [probe.nbytes], out_offset)
        return [(got.tobytes(), None)]


# ------------------------------------------------------------------ checks

def check_reference(probe, response):
    """The idle answer is a softmax of the probe (so that equal bits mean
    something) and rode alone."""
    assert response.timing.batch_requests == 1, (probe.name, response.timing)
    actual = decode(response.output)
    expected = reference_softmax(decode(probe.tensor), probe.axis, probe.temperature, probe.log)
    if probe.log:
        np.testing.assert_allclose(actual, expected, rtol=e2e_util.RTOL[probe.dtype],
                                   atol=LOG_ATOL[probe.dtype], err_msg=probe.name)
    else:
        e2e_util.assert_close(actual, expected, probe.dtype, probe.name)


def top_k_bytes(response):
    """A top-K answer's values and indices, as one byte string."""
    return response.top_k.values.data + response.top_k.indices


def describe_difference(probe, protocol, got):
    if protocol == "v1-top-k":
        return (f"{probe.name} top {probe.top_k} via {protocol}: other values or indices "
                f"({len(got)} bytes, {len(probe.top_k_reference)} idle)")
    if len(got) != probe.nbytes:
        return f"{probe.name} via {protocol}: {len(got)} bytes, expected {probe.nbytes}"
    want = np.frombuffer(probe.reference, dtype=BITS[probe.dtype])
    have = np.frombuffer(got, dtype=BITS[probe.dtype])
    differ = np.flatnonzero(want != have)
    i = int(differ[0])
    row = np.unravel_index(i, probe.shape)
    return (f"{probe.name} via {protocol}: {differ.size} element(s) with other bits, first at "
            f"{tuple(int(r) for r in row)}: {want[i]:#x} idle, {have[i]:#x} under load")


BUCKET_ONE = re.compile(r'^softmax_batch_requests_bucket\{[^}]*le="1(?:\.0)?"[^}]*\} (\S+)$',
                        re.MULTILINE)
COUNT = re.compile(r"^softmax_batch_requests_count(?:\{[^}]*\})? (\S+)$", re.MULTILINE)


def batch_histogram(server):
    """(batches, batches of one request) from softmax_batch_requests, summed
    over devices."""
    text = e2e_util.scrape_metrics(server.metrics_address)
    return (sum(float(v) for v in COUNT.findall(text)),
            sum(float(v) for v in BUCKET_ONE.findall(text)))


# ------------------------------------------------------------------ tests

def test_probe_bits_under_flood_on_every_protocol(server, capsys):
    device, process = server
    probes = probe_set(device)
    protocols = V1_PROTOCOLS + ([] if TRITONCLIENT_MISSING else KSERVE_PROTOCOLS)
    use_cuda_shm = device == "cuda" and not TRITONCLIENT_MISSING and not CUDA_SHM_MISSING
    if use_cuda_shm:
        protocols += CUDA_SHM_PROTOCOLS
    flood_in_flight = int(os.environ.get("SOFTMAX_INVARIANCE_FLOOD",
                                         "4" if device == "cpu" else "48"))
    probe_threads = 2 if device == "cpu" else min(8, os.cpu_count() or 1)

    # Reference bits, asked one at a time of the idle server.
    with process.channel() as channel:
        stub = softmax_pb2_grpc.SoftmaxServiceStub(channel)
        for probe in probes:
            response = stub.Softmax(probe.request(f"idle-{probe.index}"), timeout=120)
            check_reference(probe, response)
            probe.reference = response.output.data
            response = stub.Softmax(probe.top_k_request(f"idle-top-k-{probe.index}"), timeout=120)
            assert response.timing.batch_requests == 1, (probe.name, response.timing)
            rows = int(np.prod(probe.shape)) // probe.shape[probe.axis]
            assert len(response.top_k.indices) == 8 * rows * probe.top_k, probe.name
            probe.top_k_reference = top_k_bytes(response)

    inputs = {}
    if not TRITONCLIENT_MISSING:
        inputs = {p.index: {"grpc": kserve_input(triton_grpc, p),
                            "http": kserve_input(triton_http, p)} for p in probes}
    region_bytes = max(2 * (-(-p.nbytes // 4096) * 4096) for p in probes)
    probers = [Prober(process, i, region_bytes, not TRITONCLIENT_MISSING, use_cuda_shm)
               for i in range(probe_threads)]

    # The flood: background callers keep `flood_in_flight` unary requests of
    # other tensors in flight, each on a channel of its own.
    # Sent and received as bytes: the flood's answers are not looked at, and
    # parsing them in Python would hold the interpreter the probes need.
    pool = [r.SerializeToString() for r in flood_requests(device)]
    stop = threading.Event()
    flood_lock = threading.Lock()
    flood = {"answered": 0, "errors": []}

    def flooder(seed, depth):
        rng = np.random.default_rng(seed)
        with grpc.insecure_channel(process.grpc_address, options=RETRY_CHANNEL_OPTIONS) as channel:
            softmax = channel.unary_unary("/softmax.v1.SoftmaxService/Softmax",
                                          request_serializer=None, response_deserializer=None)
            while not stop.is_set():
                futures = [softmax.future(pool[int(rng.integers(len(pool)))], timeout=120)
                           for _ in range(depth)]
                for future in futures:
                    try:
                        future.result()
                        with flood_lock:
                            flood["answered"] += 1
                    except grpc.RpcError as error:
                        with flood_lock:
                            flood["errors"].append(f"{error.code()}: {error.details()}")
    flood_threads = max(1, flood_in_flight // 4)
    depths = [flood_in_flight // flood_threads + (i < flood_in_flight % flood_threads)
              for i in range(flood_threads)]
    flooders = [threading.Thread(target=flooder, args=(i, d), daemon=True)
                for i, d in enumerate(depths)]

    tasks = [(probe, protocol) for _ in range(ROUNDS) for probe in probes
             for protocol in protocols]
    order = np.random.default_rng(17).permutation(len(tasks))
    next_task = iter(order.tolist())
    task_lock = threading.Lock()
    stats = {p: [0, 0] for p in protocols}  # answers, differing
    shared = [0, 0]  # v1 probe answers whose batch held other requests, of all v1 answers
    differences = []
    differing_probes = {}  # name: answers with other bits
    started = time.monotonic()
    deadline = None if SECONDS is None else started + SECONDS

    def prober_loop(prober):
        while True:
            with task_lock:
                if deadline is not None and time.monotonic() > deadline:
                    return
                index = next(next_task, None)
            if index is None:
                return
            probe, protocol = tasks[index]
            answers = prober.ask(probe, protocol, inputs.get(probe.index))
            with task_lock:
                for data, batch_requests in answers:
                    stats[protocol][0] += 1
                    if batch_requests is not None:
                        shared[1] += 1
                        shared[0] += batch_requests > 1
                    reference = (probe.top_k_reference if protocol == "v1-top-k"
                                 else probe.reference)
                    if data != reference:
                        stats[protocol][1] += 1
                        differences.append(describe_difference(probe, protocol, data))
                        differing_probes[probe.name] = differing_probes.get(probe.name, 0) + 1

    try:
        before = batch_histogram(process)
        for thread in flooders:
            thread.start()
        e2e_util.wait_for(lambda: flood["answered"] >= 2 * flood_in_flight, 60,
                          "the flood to be under way")
        flood_at_start = flood["answered"]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(probers)) as executor:
            for future in [executor.submit(prober_loop, p) for p in probers]:
                future.result()
        flood_during = flood["answered"] - flood_at_start
        after = batch_histogram(process)
    finally:
        stop.set()
        for thread in flooders:
            thread.join(timeout=120)
        for prober in probers:
            prober.close()
    elapsed = time.monotonic() - started

    compared = sum(s[0] for s in stats.values())
    differing = sum(s[1] for s in stats.values())
    batches = after[0] - before[0]
    mixed = batches - (after[1] - before[1])
    per_protocol = ", ".join(f"{p} {s[0]}/{s[1]}" for p, s in stats.items())
    copies = {p: STREAM_COPIES if p in ("v1-stream", "v1-chunked") else 1 for p in protocols}
    complete = compared == ROUNDS * len(probes) * sum(copies.values())
    summary = (
        f"batch invariance on {device}: {compared} probe answers compared, {differing} "
        f"differing ({len(probes)} probes, {ROUNDS} rounds"
        f"{'' if complete else ', cut short by SOFTMAX_INVARIANCE_SECONDS'}; "
        f"per protocol answers/differing: {per_protocol}); flood {flood_during} requests "
        f"({flood_in_flight} in flight) while probing; {shared[0]} of {shared[1]} v1 probe "
        f"answers shared their batch; {mixed:.0f} of {batches:.0f} batches mixed; "
        f"{elapsed:.1f} s")
    if TRITONCLIENT_MISSING:
        summary += f"; KServe and shared memory not exercised: {TRITONCLIENT_MISSING}"
    elif device == "cuda" and CUDA_SHM_MISSING:
        summary += f"; CUDA shared memory not exercised: {CUDA_SHM_MISSING}"
    with capsys.disabled():
        print("\n" + summary)

    assert not flood["errors"], flood["errors"][:5]
    by_probe = "; ".join(f"{name}: {count}" for name, count in sorted(differing_probes.items()))
    assert not differences, (f"{summary}\n{len(differing_probes)} of {len(probes)} probes with "
                             f"other bits (answers): {by_probe}\n" + "\n".join(differences[:20]))
    assert flood_during > 0, summary
    assert shared[0] > 0, f"no probe answer shared a batch: {summary}"
    assert compared > 0, summary


def test_bf16_inputs_match_tritonclients_serialization():
    """kserve_input sets BF16 bytes directly: they are what tritonclient's
    own (truncating) serialization makes of the same values."""
    if TRITONCLIENT_MISSING:
        pytest.skip(TRITONCLIENT_MISSING)
    try:
        from tritonclient.utils import serialize_bf16_tensor
    except ImportError as error:  # newer tritonclient releases dropped it
        pytest.skip(f"this tritonclient has no serialize_bf16_tensor ({error})")
    probe = Probe(7, "bfloat16", (3, 257))
    values = e2e_util.bfloat16_bits_to_float(np.frombuffer(probe.data, dtype="<u2"))
    assert serialize_bf16_tensor(values.reshape(probe.shape)).item() == probe.data
