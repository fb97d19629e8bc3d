"""The soak's normal load: callers in closed loop over softmax.v1 (unary and
bidirectional streams) and the KServe v2 endpoints (gRPC and HTTP, through
tritonclient when it is installed), each answer checked against the float64
reference of bench.lib.reference with its tolerance contract.

Every request is accounted for exactly once in a Tally: answered correctly,
answered wrongly, or failed with a code. A stream whose call ends before all
of its requests are answered counts each unanswered request under the call's
code, and a stream that ends OK with requests unanswered (or answered twice)
counts them as `unanswered` / `duplicate`, which fail the soak.
"""

import json
import os
import subprocess
import threading
import time

import grpc
import numpy as np
from softmax.v1 import softmax_pb2_grpc

from bench.lib import reference, tensors

# Codes the normal load may see while abuse bursts run: the server shedding
# load (memory budget, queue limits) or refusing a connection it has no room for.
RETRYABLE = {"UNAVAILABLE", "RESOURCE_EXHAUSTED"}
# Outcomes that fail the soak whenever they occur.
BROKEN = {"wrong", "unanswered", "duplicate"}

# HTTP statuses of the KServe endpoint, back to the gRPC code names
# (server/rpc/kserve.cc HttpStatus; 503 stands for both retryable codes).
HTTP_CODES = {"400": "INVALID_ARGUMENT", "401": "UNAUTHENTICATED", "403": "PERMISSION_DENIED",
              "404": "NOT_FOUND", "413": "RESOURCE_EXHAUSTED", "499": "CANCELLED",
              "500": "INTERNAL", "501": "UNIMPLEMENTED", "503": "UNAVAILABLE",
              "504": "DEADLINE_EXCEEDED"}
CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
DTYPES = ["float32", "float16", "bfloat16"]
KSERVE_DATATYPES = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16"}


def _bf16_for(client_module, values):
    """BF16 input values as this tritonclient takes them: float32 arrays up to
    2.5x, ml_dtypes.bfloat16 arrays from r26.06 on (which refuses float32)."""
    probe = client_module.InferInput("probe", [1], "BF16")
    try:
        probe.set_data_from_numpy(np.zeros(1, np.float32))
        return values
    except Exception:  # the newer client: InferenceServerException
        import ml_dtypes
        return values.astype(ml_dtypes.bfloat16)

# (shape, axis): small ones most of the time, then large ones, some reduced
# over a non-last axis. The largest is 8 MiB in float32.
SMALL_SHAPES = [((1, 1024), -1), ((8, 4096), -1), ((4, 33), 0), ((2, 3, 5), 1),
                ((16, 128, 8), 1), ((32, 1000), -1), ((3, 1, 1000), -1), ((7,), 0)]
LARGE_SHAPES = [((64, 32000), -1), ((1, 1 << 20), -1), ((256, 4096), 0),
                ((8, 2048, 32), 1)]
LARGE_SHARE = 0.1
STREAM_LENGTH = 8
# The bulk load's payloads (softmax-client load: the last axis only; the
# Python callers cover the others). Mostly small, some up to 8 MiB.
BULK_MIX = ("1x1024:float32:8,8x4096:float16:4,32x1000:bfloat16:4,64x32000:bfloat16:1,"
            "1x1M:float32:1,256x4096:float16:1,64x32000:float32:1")
# A generous deadline: the soak looks for lost answers, not for slow ones;
# a call still unanswered after a minute is a failure (DEADLINE_EXCEEDED).
CALL_TIMEOUT_S = 60


class Case:
    """One request's input and parameters, and how to check its answer."""

    def __init__(self, rng):
        shapes = LARGE_SHAPES if rng.random() < LARGE_SHARE else SMALL_SHAPES
        self.shape, self.axis = shapes[rng.integers(len(shapes))]
        self.dtype = DTYPES[rng.integers(len(DTYPES))]
        self.log = bool(rng.integers(2))
        self.temperature = float([1.0, 0.5, 2.0][rng.integers(3)])
        self.values = reference.representable(rng.normal(0, 3, size=self.shape), self.dtype)

    def describe(self):
        return (f"{'log_softmax' if self.log else 'softmax'} {self.dtype} {self.shape} "
                f"axis {self.axis} T={self.temperature}")

    def check(self, output):
        """None when `output` matches the reference, else the mismatch."""
        expected = reference.softmax(self.values, self.axis, self.temperature, self.log)
        try:
            reference.assert_close(output, expected, self.dtype, self.describe())
        except AssertionError as error:
            return str(error)
        return None

    def v1_request(self, request_id=""):
        return tensors.request(self.values, self.dtype, request_id=request_id, axis=self.axis,
                                temperature=self.temperature, log=self.log)


class Tally:
    """Counts of every request's outcome, per protocol, split by whether an
    abuse burst was running; thread-safe."""

    def __init__(self, bursts):
        self._bursts = bursts  # .active() -> bool
        self._lock = threading.Lock()
        self.counts = {}  # (protocol, outcome, "burst" | "steady") -> n
        # The first wrong answers and unexpected codes: the first of each
        # (protocol, outcome, phase) always, then others up to 20, so that a
        # rare failure keeps its detail however many expected refusals came first.
        self.examples = []
        self._start = time.monotonic()

    def add(self, protocol, outcome, n=1, detail=None):
        phase = "burst" if self._bursts.active() else "steady"
        with self._lock:
            key = (protocol, outcome, phase)
            first = key not in self.counts
            self.counts[key] = self.counts.get(key, 0) + n
            if detail and outcome not in ("ok",) and (first or len(self.examples) < 20):
                at = time.monotonic() - self._start
                self.examples.append(f"{protocol} {outcome} ({phase}, {at:.1f} s): {detail[:300]}")

    def total(self, outcome=None, phase=None, protocol=None):
        with self._lock:
            return sum(n for (p, o, ph), n in self.counts.items()
                       if (outcome is None or o == outcome) and (phase is None or ph == phase)
                       and (protocol is None or p == protocol))

    def snapshot(self):
        with self._lock:
            return [{"protocol": p, "outcome": o, "phase": ph, "count": n}
                    for (p, o, ph), n in sorted(self.counts.items())]


def _answered(tally, protocol, case, output):
    mismatch = case.check(output)
    if mismatch is None:
        tally.add(protocol, "ok")
    else:
        tally.add(protocol, "wrong", detail=mismatch)


class TrafficThread(threading.Thread):
    """A daemon thread sending one protocol's traffic (`_send`) until `stop`
    is set. An exception of its own, a bug of the soak, is kept in `crashed`
    and fails the run."""

    def __init__(self, name, protocol, endpoints, tally, stop, seed):
        super().__init__(name=name, daemon=True)
        self.protocol = protocol
        self.endpoints = endpoints
        self.tally = tally
        self.stop = stop
        self.rng = np.random.default_rng(seed)
        self.crashed = None

    def run(self):
        try:
            self._send()
        except Exception as error:  # a bug of the soak itself: reported, fails the run
            self.crashed = f"{type(error).__name__}: {error}"


class Caller(TrafficThread):
    """One closed-loop caller of one protocol, until `stop` is set."""

    def __init__(self, index, protocol, endpoints, tally, stop, pause_s, seed):
        super().__init__(f"caller-{index}-{protocol}", protocol, endpoints, tally, stop, seed)
        self.pause_s = pause_s

    def _send(self):
        step = getattr(self, "_" + self.protocol.replace("-", "_"))
        setup = getattr(self, "_setup_" + self.protocol.replace("-", "_"), None)
        state = setup() if setup else None
        while not self.stop.is_set():
            step(state)
            if self.pause_s:
                self.stop.wait(self.pause_s)

    # ------------------------------------------------------------- softmax.v1

    def _setup_v1_unary(self):
        channel = grpc.insecure_channel(self.endpoints["grpc"], options=tensors.CHANNEL_OPTIONS)
        return softmax_pb2_grpc.SoftmaxServiceStub(channel)

    _setup_v1_stream = _setup_v1_unary

    def _v1_unary(self, stub):
        case = Case(self.rng)
        try:
            response = stub.Softmax(case.v1_request(), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as error:
            self.tally.add("v1-unary", error.code().name, detail=error.details())
            return
        _answered(self.tally, "v1-unary", case, tensors.decode(response.output))

    def _v1_stream(self, stub):
        cases = {f"r{i}": Case(self.rng) for i in range(STREAM_LENGTH)}
        requests = [case.v1_request(request_id) for request_id, case in cases.items()]
        seen = set()
        try:
            for response in stub.SoftmaxStream(iter(requests), timeout=CALL_TIMEOUT_S):
                request_id = response.request_id
                if response.HasField("error"):
                    # An error response names its request unless the request_id
                    # itself was bad (never the case here).
                    name = CODE_NAMES.get(response.error.code, str(response.error.code))
                    self.tally.add("v1-stream", name, detail=response.error.message)
                elif request_id not in cases:
                    self.tally.add("v1-stream", "unanswered", detail=f"unknown id {request_id!r}")
                    continue
                elif request_id in seen:
                    self.tally.add("v1-stream", "duplicate", detail=request_id)
                    continue
                else:
                    _answered(self.tally, "v1-stream", cases[request_id],
                              tensors.decode(response.output))
                seen.add(request_id)
        except grpc.RpcError as error:
            missing = len(cases) - len(seen)
            if missing:
                self.tally.add("v1-stream", error.code().name, n=missing, detail=error.details())
            return
        missing = len(cases) - len(seen)
        if missing:
            self.tally.add("v1-stream", "unanswered", n=missing,
                           detail=f"stream ended OK with {missing} requests unanswered")

    # --------------------------------------------------------------- KServe v2

    def _kserve(self, client_module, client, binary):
        case = Case(self.rng)
        tensor = client_module.InferInput("INPUT", list(case.shape),
                                          KSERVE_DATATYPES[case.dtype])
        data = case.values.astype(np.float16) if case.dtype == "float16" else case.values
        if case.dtype == "bfloat16":
            data = _bf16_for(client_module, data)
        if binary:
            tensor.set_data_from_numpy(data, binary_data=True)
        else:
            tensor.set_data_from_numpy(data)
        parameters = {"axis": case.axis, "temperature": case.temperature}
        model = "log_softmax" if case.log else "softmax"
        protocol = "kserve-http" if binary else "kserve-grpc"
        try:
            if binary:  # (the HTTP client's deadline is its network_timeout)
                result = client.infer(model, [tensor], parameters=parameters)
            else:
                result = client.infer(model, [tensor], parameters=parameters,
                                      client_timeout=CALL_TIMEOUT_S)
        except self.triton_error as error:
            status = str(error.status() or "")
            code = status.replace("StatusCode.", "") if status.startswith("StatusCode.") \
                else HTTP_CODES.get(status, f"HTTP_{status or 'NONE'}")
            self.tally.add(protocol, code, detail=error.message())
            return
        except Exception as error:  # the connection broke: a transport failure
            self.tally.add(protocol, "TRANSPORT", detail=f"{type(error).__name__}: {error}")
            return
        _answered(self.tally, protocol, case, result.as_numpy("OUTPUT").astype(np.float64))

    def _setup_kserve_grpc(self):
        import tritonclient.grpc as triton_grpc
        from tritonclient.utils import InferenceServerException
        self.triton_error = InferenceServerException
        return triton_grpc, triton_grpc.InferenceServerClient(self.endpoints["grpc"])

    def _kserve_grpc(self, state):
        self._kserve(state[0], state[1], binary=False)

    def _setup_kserve_http(self):
        import tritonclient.http as triton_http
        from tritonclient.utils import InferenceServerException
        self.triton_error = InferenceServerException
        return triton_http, triton_http.InferenceServerClient(
            self.endpoints["http"], connection_timeout=CALL_TIMEOUT_S,
            network_timeout=CALL_TIMEOUT_S)

    def _kserve_http(self, state):
        self._kserve(state[0], state[1], binary=True)


def kserve_available():
    """None when tritonclient (grpc and http) imports, else why not."""
    try:
        import tritonclient.grpc  # noqa: F401
        import tritonclient.http  # noqa: F401
    except Exception as error:  # ImportError, or a protobuf/grpcio mismatch
        return f"{type(error).__name__}: {error}"
    return None


def protocols(with_kserve):
    return ["v1-unary", "v1-stream"] + (["kserve-grpc", "kserve-http"] if with_kserve else [])


def start_callers(count, endpoints, tally, stop, pause_s, with_kserve, seed=1):
    """`count` callers, the protocols dealt round-robin."""
    kinds = protocols(with_kserve)
    callers = [Caller(i, kinds[i % len(kinds)], endpoints, tally, stop, pause_s, seed + i)
               for i in range(count)]
    for caller in callers:
        caller.start()
    return callers


def wait_callers(callers, timeout):
    deadline = time.monotonic() + timeout
    for caller in callers:
        caller.join(max(0.0, deadline - time.monotonic()))
    return [c.name for c in callers if c.is_alive()]


class BulkLoad:
    """softmax-client load --verify in two processes, unary softmax and
    streamed log-softmax, for the calls in flight that a GPU server sees
    (the Python callers are few and bound by one core). Its errors are
    counted by code; which of them fell in a burst is not known."""

    def __init__(self, client_bin, address, callers, duration_s, work):
        self.runs = []
        for stream in (False, True):
            concurrency = max(1, callers // 2)
            protocol = "bulk-stream" if stream else "bulk-unary"
            json_path = os.path.join(work, f"{protocol}.json")
            if os.path.exists(json_path):
                os.unlink(json_path)
            command = [client_bin, "load", f"--target={address}", "--quiet",
                       f"--json={json_path}", f"--mix={BULK_MIX}",
                       f"--concurrency={concurrency}", f"--connections={min(concurrency, 8)}",
                       f"--duration={max(1, int(duration_s))}s", "--warmup=0", "--verify",
                       f"--timeout_ms={CALL_TIMEOUT_S * 1000}"]
            if stream:
                command += ["--stream", "--log"]
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, text=True)
            self.runs.append((protocol, command, json_path, process))

    def kill(self):
        for _, _, _, process in self.runs:
            if process.poll() is None:
                process.kill()

    def finish(self, timeout):
        """[(protocol, report or None, exit code, output)] once both are done."""
        results = []
        for protocol, command, json_path, process in self.runs:
            try:
                output, _ = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                output, _ = process.communicate()
            report = None
            if os.path.exists(json_path):
                with open(json_path) as f:
                    report = json.load(f)
            results.append((protocol, report, process.returncode, output[-2000:]))
        return results


# Requests a long-lived stream keeps unanswered at once.
LONG_STREAM_WINDOW = 4


class LongStream(TrafficThread):
    """One stream opened when the soak starts and kept open until it ends,
    as a Triton streaming caller keeps its stream: softmax.v1 SoftmaxStream
    through plain grpcio ("v1-long-stream"), or tritonclient's
    start_stream / async_stream_infer ("kserve-grpc-stream"). Neither
    reopens anything: the server must not end the stream while its caller
    keeps it. `LONG_STREAM_WINDOW` requests are kept unanswered; each answer
    is checked; when the soak stops, the stream stops sending, waits for
    what is unanswered and closes. A stream that ended early counts its
    unanswered requests under its code, and `ended_early` says when."""

    def __init__(self, protocol, endpoints, tally, stop, seed):
        super().__init__(f"long-stream-{protocol}", protocol, endpoints, tally, stop, seed)
        self.opened_at = None
        self.ended_at = None
        self.ended_early = None  # the stream's end before the soak stopped: why
        self.sent = 0
        self._cases = {}  # request_id -> Case, unanswered
        self._seen = set()
        self._lock = threading.Condition()
        self._failed = None  # the stream's own failure, once it came

    def _send(self):
        self.opened_at = time.monotonic()
        try:
            if self.protocol == "v1-long-stream":
                self._run_v1()
            else:
                self._run_kserve()
        finally:
            self.ended_at = time.monotonic()

    def summary(self):
        lived = (self.ended_at or time.monotonic()) - (self.opened_at or time.monotonic())
        return {"lived_s": round(lived, 1), "sent": self.sent, "answered": len(self._seen),
                "ended_early": self.ended_early}

    # Both: the window, and accounting of one answer.

    def _next_case(self):
        """Waits for room in the window; the next (request_id, Case), or None
        once the soak stops or the stream failed."""
        with self._lock:
            while (len(self._cases) >= LONG_STREAM_WINDOW and not self.stop.is_set()
                   and self._failed is None):
                self._lock.wait(0.5)
            if self.stop.is_set() or self._failed is not None:
                return None
            request_id = f"s{self.sent}"
            self.sent += 1
            case = Case(self.rng)
            self._cases[request_id] = case
            return request_id, case

    def _answer(self, request_id, output=None, error_code=None, detail=None):
        with self._lock:
            case = self._cases.pop(request_id, None)
            if case is None:
                outcome = "duplicate" if request_id in self._seen else "unanswered"
                self.tally.add(self.protocol, outcome, detail=f"answer to {request_id!r}")
            self._seen.add(request_id)
            self._lock.notify_all()
        if case is None:
            return
        if error_code is not None:
            self.tally.add(self.protocol, error_code, detail=detail)
        else:
            _answered(self.tally, self.protocol, case, output)

    def _fail(self, code, detail):
        """The stream itself ended with `code`: every unanswered request
        counts under it."""
        with self._lock:
            if self._failed is not None:
                return
            self._failed = code
            if not self.stop.is_set():
                at = time.monotonic() - self.opened_at
                self.ended_early = f"{code} after {at:.1f} s: {detail}"
            missing = len(self._cases)
            self._cases.clear()
            self._lock.notify_all()
        self.tally.add(self.protocol, code, n=max(1, missing), detail=detail)

    def _drain(self, timeout):
        """Waits until every request sent is answered (or the stream failed)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._cases and self._failed is None and time.monotonic() < deadline:
                self._lock.wait(0.5)
            return len(self._cases)

    # softmax.v1 through plain grpcio.

    def _run_v1(self):
        import queue
        channel = grpc.insecure_channel(self.endpoints["grpc"], options=tensors.CHANNEL_OPTIONS)
        stub = softmax_pb2_grpc.SoftmaxServiceStub(channel)
        outgoing = queue.Queue()  # None half-closes the stream
        def sender():
            while True:
                item = self._next_case()
                if item is None:
                    break
                request_id, case = item
                outgoing.put(case.v1_request(request_id))
            self._drain(CALL_TIMEOUT_S)
            outgoing.put(None)  # half-close: the server ends the stream OK

        writer = threading.Thread(target=sender, name=f"{self.name}-send", daemon=True)
        writer.start()
        try:
            for response in stub.SoftmaxStream(iter(outgoing.get, None)):
                if response.HasField("error"):
                    name = CODE_NAMES.get(response.error.code, str(response.error.code))
                    self._answer(response.request_id, error_code=name,
                                 detail=response.error.message)
                else:
                    self._answer(response.request_id, tensors.decode(response.output))
        except grpc.RpcError as error:
            self._fail(error.code().name, error.details())
        else:
            with self._lock:
                missing = len(self._cases)
            if missing or not self.stop.is_set():
                self._fail("unanswered", f"the stream ended OK with {missing} requests "
                                         "unanswered" + ("" if self.stop.is_set()
                                                         else ", before the soak stopped"))
        finally:
            writer.join(CALL_TIMEOUT_S)
            channel.close()

    # KServe v2 gRPC through tritonclient's stream.

    def _run_kserve(self):
        import tritonclient.grpc as triton_grpc
        client = triton_grpc.InferenceServerClient(self.endpoints["grpc"])

        def callback(result, error):
            if error is not None:
                response = result.get_response() if result is not None else None
                request_id = getattr(response, "id", "") if response is not None else ""
                status = str(error.status() or "")
                code = status.replace("StatusCode.", "") if status.startswith("StatusCode.") \
                    else "UNKNOWN"
                if request_id:
                    self._answer(request_id, error_code=code, detail=error.message())
                else:  # the stream itself broke (or an error naming no request)
                    self._fail(code, error.message())
                return
            self._answer(result.get_response().id,
                         result.as_numpy("OUTPUT").astype(np.float64))

        client.start_stream(callback=callback)
        try:
            while True:
                item = self._next_case()
                if item is None:
                    break
                request_id, case = item
                tensor = triton_grpc.InferInput("INPUT", list(case.shape),
                                                KSERVE_DATATYPES[case.dtype])
                data = case.values.astype(np.float16) if case.dtype == "float16" else case.values
                if case.dtype == "bfloat16":
                    data = _bf16_for(triton_grpc, data)
                tensor.set_data_from_numpy(data)
                try:
                    client.async_stream_infer(
                        "log_softmax" if case.log else "softmax", [tensor],
                        request_id=request_id,
                        parameters={"axis": case.axis, "temperature": case.temperature})
                except Exception as error:  # the stream is closed: it ended early
                    self._fail("UNAVAILABLE", f"{type(error).__name__}: {error}")
                    break
            self._drain(CALL_TIMEOUT_S)
        finally:
            with self._lock:
                missing = len(self._cases)
                failed = self._failed
            client.stop_stream()
            client.close()
            if missing and failed is None:
                self._fail("unanswered", f"{missing} requests unanswered when the soak stopped")


def long_stream_protocols(with_kserve):
    return ["v1-long-stream"] + (["kserve-grpc-stream"] if with_kserve else [])


def start_long_streams(endpoints, tally, stop, with_kserve, seed=101):
    streams = [LongStream(protocol, endpoints, tally, stop, seed + i)
               for i, protocol in enumerate(long_stream_protocols(with_kserve))]
    for stream in streams:
        stream.start()
    return streams
