"""A softmax-serve fleet behind the real Envoy (deploy/envoy/envoy.yaml, run
by tests/fleet_util.py): each replica in a network namespace of its own with
an address of its own (or on loopback addresses where namespaces are
refused: the output says which), on the CPU backend. softmax-client load
(with --verify) and the Python client are the callers that retry; beside
them callers that change nothing (grpcio without a service config,
tritonclient unary and stream, curl) count every failed call and reconnect.

What a fleet must do, each asserted here: spread the load evenly; lose no
call through a rolling restart (every protocol and caller, and a stream that
reopens and loses no answer, none twice); hold no unary call behind a
connection a stream keeps open after its replica's GOAWAY; retry around a
replica that dies and eject it, then
take it back; give replicas added by rewriting the endpoint files their
share within 10 s, also from callers holding one connection and from
callers that balance themselves (gRPC round_robin, moved by the servers'
connection age); under three times the load it sustains, end the excess
fast with a retryable code and keep the accepted calls' latency bounded;
cut off a rapid-reset (CVE-2023-44487) connection at Envoy while the
replicas keep answering others; hand each try the caller's deadline or the
per-try timeout, whichever is shorter, and a stream the caller's deadline
whole.

Under CI=true a fall-back (replicas on loopback addresses, a caller that
cannot run here) fails the test instead of testing less.

Bounds are generous for a busy 2-core host (CI): each one is stated with the
figure measured on such a host beside it.
"""

import contextlib
import datetime
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import numpy as np
import pytest

import e2e_util
import fleet_util
from bench.lib import h2 as h2_util
from e2e_util import assert_close, reference_softmax

_ENVOY_REASON = fleet_util.envoy_unusable_reason()
pytestmark = pytest.mark.skipif(_ENVOY_REASON is not None, reason=f"Envoy: {_ENVOY_REASON}")


def _server_has_flag(flag):
    result = e2e_util.run_server("--help", timeout=30)
    return f"--{flag} " in result.stdout + result.stderr


# The opt-in connection age (the replicas' default is none, what a fleet
# behind Envoy runs): every connection gets a GOAWAY after about this long,
# so callers that balance over the replicas themselves re-resolve and reach
# new ones. Given where a test needs that, or the rotations it brings.
CONNECTION_AGE_S = 2
HAS_CONNECTION_AGE = _server_has_flag("max_connection_age_s")
AGE_ARGS = [f"--max_connection_age_s={CONNECTION_AGE_S}"] if HAS_CONNECTION_AGE else []
# CI runs this file as root on a host that has network namespaces and
# cgroups: there a fallback (loopback addresses, a caller or a CPU bound that
# cannot be had) fails the test instead of testing less.
IN_CI = os.environ.get("CI") == "true"


def fall_back(note):
    """A part of the fleet this host cannot give: a failure under CI, a
    printed note elsewhere."""
    if IN_CI:
        pytest.fail(f"{note} (CI=true: the fleet test must run whole there)")
    print(f"fall-back: {note}")


def note_fallbacks(fleet):
    print(f"fleet: {fleet.mode} ({fleet.mode_note}); envoy "
          f"{fleet_util.envoy_version(fleet.envoy.binary)}")
    if fleet.mode != "namespaces":
        fall_back(f"replicas on loopback addresses, not namespaces: {fleet.mode_note}")


@pytest.fixture
def fleet3():
    with fleet_util.start_fleet(3) as fleet:
        note_fallbacks(fleet)
        yield fleet


# ------------------------------------------------------------------ callers

class Load:
    """softmax-client load in the background; .result() waits and returns
    its JSON report."""

    def __init__(self, target, protocol="softmax.v1", duration_s=5.0, concurrency=8,
                 connections=1, shape="1x256", rate=None, timeout_ms=20000, extra=()):
        self.report_path = tempfile.mktemp(prefix="softmax-fleet-load-", suffix=".json")
        args = [f"--protocol={protocol}", f"--shape={shape}", "--verify", "--quiet",
                f"--duration={duration_s}s", "--warmup=0s", f"--connections={connections}",
                f"--timeout_ms={timeout_ms}", f"--json={self.report_path}", *extra]
        if rate:
            args += [f"--rate={rate}", "--arrival=poisson"]
        else:
            args.append(f"--concurrency={concurrency}")
        self.argv = e2e_util.load_command(target, *args)
        self.process = e2e_util.start_load(target, *args, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT)

    def result(self, timeout=120):
        output, _ = self.process.communicate(timeout=timeout)
        try:
            with open(self.report_path) as f:
                report = json.load(f)
        except (OSError, ValueError):
            raise AssertionError(f"{' '.join(self.argv)}: exit {self.process.returncode}, "
                                 f"no report:\n{output}")
        finally:
            if os.path.exists(self.report_path):
                os.unlink(self.report_path)
        report["exit_code"] = self.process.returncode
        report["output"] = output
        return report


def _utc_now():
    """The time as Envoy's access log writes it (UTC, milliseconds)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def failed_calls(fleet):
    """Envoy's access-log lines of calls that did not end OK."""
    return [line for line in fleet.envoy.output().splitlines() if "] failed " in line]


def assert_no_failure(report, what):
    assert report["errors"] == 0 and report["mismatches"] == 0 and report["exit_code"] == 0, (
        f"{what}: {report['errors']} failed ({report['errors_by_code']}), "
        f"{report['mismatches']} wrong, exit {report['exit_code']}:\n{report['output']}")
    assert report["ok"] > 0, f"{what}: no call answered:\n{report['output']}"


class StreamCaller:
    """A SoftmaxStream caller through Envoy that keeps `window` requests
    unanswered, checks every answer against the reference, and when the
    stream ends (a draining replica ends it UNAVAILABLE once it answered
    what it read) reopens it and sends again what had no answer. After
    stop(), `lost` counts requests never answered, `duplicates` answers to
    a request already answered (or never sent) and `wrong` the answers
    that did not match; assert_clean() fails on any of them."""

    def __init__(self, target, window=4, shape=(2, 64)):
        import grpc
        from softmax.v1 import softmax_pb2_grpc
        self.channel = grpc.insecure_channel(target, options=e2e_util.CHANNEL_OPTIONS)
        self.stub = softmax_pb2_grpc.SoftmaxServiceStub(self.channel)
        self.window, self.shape = window, shape
        self.answered, self.reopened, self.lost = 0, 0, None
        self.wrong, self.stream_ends, self.duplicates = [], [], []
        self.error_answers = []  # answers in band with an error, "code: message"
        self._stop = threading.Event()
        self._give_up_at = float("inf")
        self._rng = np.random.default_rng(5)
        self._next_id = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _new(self, unanswered, outgoing):
        values = self._rng.normal(size=self.shape).astype(np.float32)
        request_id = str(self._next_id)
        self._next_id += 1
        unanswered[request_id] = values
        outgoing.put(e2e_util.request(values, request_id=request_id))

    def _run(self):
        unanswered = {}  # request_id -> input, sent without an answer yet
        while not (self._stop.is_set() and not unanswered) and \
                time.monotonic() < self._give_up_at:
            outgoing = queue.Queue()
            for request_id, values in unanswered.items():
                outgoing.put(e2e_util.request(values, request_id=request_id))
            while len(unanswered) < self.window and not self._stop.is_set():
                self._new(unanswered, outgoing)
            call = self.stub.SoftmaxStream(iter(outgoing.get, None), timeout=60)
            try:
                for response in call:
                    values = unanswered.pop(response.request_id, None)
                    if values is None:
                        # Answered already (on this stream or one before
                        # it), or never sent: the resend lost track.
                        self.duplicates.append(response.request_id)
                        continue
                    if response.error.code:
                        # An answer in band that says it failed: a failure
                        # the caller sees, counted; UNAVAILABLE (retryable)
                        # is sent again, on this stream or the next.
                        self.error_answers.append(
                            f"{response.error.code}: {response.error.message}"[:200])
                        if response.error.code == 14:  # UNAVAILABLE
                            unanswered[response.request_id] = values
                            outgoing.put(e2e_util.request(values,
                                                          request_id=response.request_id))
                        continue
                    try:
                        assert_close(e2e_util.decode(response.output),
                                     reference_softmax(values), "float32", "stream answer")
                    except AssertionError as error:
                        self.wrong.append(str(error))
                    self.answered += 1
                    if not self._stop.is_set():
                        self._new(unanswered, outgoing)
                    elif not unanswered:
                        outgoing.put(None)  # half-close: the stream ends OK
                self.stream_ends.append("OK")
            except Exception as error:  # noqa: BLE001 - the stream ended; reopen it
                code = error.code() if hasattr(error, "code") else None
                self.stream_ends.append(str(code) if code is not None else repr(error)[:100])
            finally:
                outgoing.put(None)
            if unanswered:
                self.reopened += 1
        self.lost = len(unanswered)

    def stop(self, timeout=30):
        """Stops sending new requests and waits for the unanswered ones."""
        self._give_up_at = time.monotonic() + timeout
        self._stop.set()
        self._thread.join(timeout + 10)
        assert not self._thread.is_alive(), "the stream caller did not finish"
        self.channel.close()

    def summary(self):
        return (f"stream (reopens, resends): {self.answered} answers, {self.lost} never "
                f"answered, {len(self.duplicates)} twice, {len(self.wrong)} wrong, "
                f"{len(self.error_answers)} errors in band "
                f"{sorted(set(self.error_answers))[:3]}; reopened {self.reopened} times; its "
                f"ends: {sorted(set(self.stream_ends))}")

    def assert_clean(self):
        """Every request answered once and right; an error in band only
        UNAVAILABLE (sent again and then answered); the stream ended only
        by its replica (UNAVAILABLE) or by its caller (OK)."""
        assert self.lost == 0 and not self.duplicates and not self.wrong, (
            self.summary(), self.duplicates[:5], self.wrong[:3])
        assert all(e.startswith("14:") for e in self.error_answers), self.summary()
        assert set(self.stream_ends) <= {"OK", "StatusCode.UNAVAILABLE"}, self.summary()


class PlainCaller:
    """Callers that change nothing: `threads` threads calling through Envoy
    back to back, with no retry of their own. Each counts its calls, its
    failed calls (any error, or a wrong answer: both are failures to the
    caller) and its reconnects (a connection to Envoy made again), and
    keeps every call's latency. Subclasses provide connect() (per thread)
    and call(connection), which raises on a failure."""

    name = "plain"

    def __init__(self, target, threads=2, shape=(1, 64)):
        self.target = target
        self.values = np.random.default_rng(7).normal(size=shape).astype(np.float32)
        self.expected = reference_softmax(self.values)
        self.ok, self.reconnects = 0, 0
        self.failed, self.latencies_s = [], []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True)
                         for _ in range(threads)]
        for thread in self._threads:
            thread.start()

    def _run(self):
        connection = self.connect()
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    self.call(connection)
                    error = None
                except Exception as caught:  # noqa: BLE001 - every failure counts
                    error = f"{type(caught).__name__}: {caught}"[:300]
                took = time.monotonic() - started
                with self._lock:
                    self.latencies_s.append(took)
                    if error is None:
                        self.ok += 1
                    else:
                        self.failed.append(error)
        finally:
            self.close(connection)

    def connect(self):
        raise NotImplementedError

    def call(self, connection):
        raise NotImplementedError

    def close(self, connection):
        pass

    def check(self, output):
        assert_close(np.asarray(output, dtype=np.float32).reshape(self.expected.shape),
                     self.expected, "float32", f"{self.name} answer")

    def count_reconnects(self, channel):
        """Counts each READY of a grpcio channel after its first."""
        readies = [0]

        def on_state(state):
            import grpc
            if state == grpc.ChannelConnectivity.READY:
                readies[0] += 1
                if readies[0] > 1:
                    with self._lock:
                        self.reconnects += 1

        channel.subscribe(on_state, try_to_connect=True)
        return on_state

    def stop(self):
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
            assert not thread.is_alive(), f"{self.name}: a caller thread did not finish"

    @property
    def max_ms(self):
        return 1000 * max(self.latencies_s) if self.latencies_s else None

    def summary(self):
        latencies = sorted(self.latencies_s)
        return (f"{self.name}: {self.ok} calls, {len(self.failed)} failed, "
                f"{self.reconnects} reconnects; latency p50 "
                f"{1000 * _quantile(latencies, 0.5):.1f} ms, max {self.max_ms:.1f} ms")

    def assert_clean(self):
        assert not self.failed and self.ok > 0, (self.summary(), self.failed[:3])


class GrpcUnaryCaller(PlainCaller):
    """softmax.v1 Softmax over plain grpcio: one channel per thread, no
    service config, no retry policy (gRPC's transparent retry of a call
    that never left the client is all it has)."""

    name = "grpcio unary"

    def connect(self):
        import grpc
        from softmax.v1 import softmax_pb2_grpc
        channel = grpc.insecure_channel(self.target)
        watcher = self.count_reconnects(channel)
        return channel, watcher, softmax_pb2_grpc.SoftmaxServiceStub(channel)

    def call(self, connection):
        response = connection[2].Softmax(e2e_util.request(self.values), timeout=30)
        self.check(e2e_util.decode(response.output))

    def close(self, connection):
        connection[0].unsubscribe(connection[1])
        connection[0].close()


class TritonUnaryCaller(PlainCaller):
    """KServe gRPC ModelInfer through tritonclient, as its users call it."""

    name = "tritonclient unary"

    def connect(self):
        import tritonclient.grpc as triton_grpc
        client = triton_grpc.InferenceServerClient(url=self.target)
        self.count_reconnects(client._channel)  # tritonclient keeps its grpcio channel here
        tensor = triton_grpc.InferInput("INPUT", list(self.values.shape), "FP32")
        tensor.set_data_from_numpy(self.values)
        return client, tensor

    def call(self, connection):
        client, tensor = connection
        result = client.infer("softmax", [tensor], client_timeout=30)
        self.check(result.as_numpy("OUTPUT"))

    def close(self, connection):
        connection[0].close()


class TritonStreamCaller(PlainCaller):
    """KServe gRPC ModelStreamInfer through tritonclient: one stream per
    thread, one request at a time on it (sent, answered, the next). A
    request whose stream ended before it was answered is a failed call; the
    stream is then started again, as a tritonclient user must (its stream
    is dead after an error), and that is a reconnect. A drain ends a stream
    (DESIGN.md's contract: answered first), so a stream end is counted in
    `stream_ends` with its error."""

    name = "tritonclient stream"

    def __init__(self, *args, **kwargs):
        self.stream_ends = []
        super().__init__(*args, **kwargs)

    def connect(self):
        import tritonclient.grpc as triton_grpc
        client = triton_grpc.InferenceServerClient(url=self.target)
        tensor = triton_grpc.InferInput("INPUT", list(self.values.shape), "FP32")
        tensor.set_data_from_numpy(self.values)
        state = {"client": client, "tensor": tensor, "next": 0}
        self._start_stream(state)
        return state

    @staticmethod
    def _start_stream(state):
        answers = state["answers"] = queue.Queue()
        state["client"].start_stream(callback=lambda result, error: answers.put((result, error)))

    def _restart(self, state, why):
        with self._lock:
            self.stream_ends.append(why[:120])
            self.reconnects += 1
        with contextlib.suppress(Exception):
            state["client"].stop_stream(cancel_requests=True)
        self._start_stream(state)

    def call(self, state):
        request_id = str(state["next"])
        state["next"] += 1
        try:
            state["client"].async_stream_infer("softmax", [state["tensor"]],
                                               request_id=request_id)
            result, error = state["answers"].get(timeout=30)
        except queue.Empty:
            raise AssertionError(f"request {request_id}: no answer in 30 s") from None
        except Exception as caught:  # noqa: BLE001 - the stream ended before it was sent
            # tritonclient refuses a request on an ended stream; the end's
            # own error waits in the callback's queue.
            try:
                error = state["answers"].get_nowait()[1] or caught
            except queue.Empty:
                error = caught
        if error is not None:
            self._restart(state, str(error))
            raise AssertionError(f"request {request_id}: the stream ended: {error}")
        assert result.get_response().id == request_id, (result.get_response().id, request_id)
        self.check(result.as_numpy("OUTPUT"))

    def summary(self):
        return (f"{super().summary()}; its stream ended {len(self.stream_ends)} times: "
                f"{sorted(set(self.stream_ends))[:3]}")

    def assert_clean(self, ends=("UNAVAILABLE",)):
        """A stream ended by its replica (drained: UNAVAILABLE; killed: the
        reset Envoy passes on, which gRPC reads as INTERNAL) loses at most
        the one request it had in flight (not read by the replica, so not
        computed); nothing else may fail."""
        assert self.ok > 0, self.summary()
        assert len(self.failed) <= len(self.stream_ends), (self.summary(), self.failed[:3])
        for end in self.stream_ends:
            assert any(kind in end for kind in ends), (self.summary(), self.stream_ends)

    def close(self, state):
        with contextlib.suppress(Exception):
            state["client"].stop_stream(cancel_requests=True)
        state["client"].close()


class CurlCaller(PlainCaller):
    """KServe HTTP POST /v2/models/softmax/infer by curl, 50 calls per curl
    run on one keep-alive connection (num_connects tells each new one
    after the first: a reconnect). A call fails on any status but 200 or a
    wrong answer; curl itself does not retry."""

    name = "curl HTTP"
    CALLS_PER_RUN = 50

    def connect(self):
        body = json.dumps({"inputs": [{"name": "INPUT", "shape": list(self.values.shape),
                                       "datatype": "FP32",
                                       "data": self.values.ravel().tolist()}]})
        return body

    def _run(self):
        url = f"http://{self.target}/v2/models/softmax/infer"
        body = self.connect()
        marker = "\n@@curl "
        while not self._stop.is_set():
            argv = ["curl", "-sS", "-H", "Content-Type: application/json",
                    "--data-binary", body,
                    "-w", "\\n@@curl %{http_code} %{num_connects} %{time_total}\\n"]
            result = subprocess.run(argv + [url] * self.CALLS_PER_RUN, capture_output=True,
                                    text=True, timeout=120)
            parts = result.stdout.split(marker)
            # body, marker + status line, body, marker + status line, ...
            transfers = [(parts[0] if i == 0 else parts[i].split("\n", 1)[-1],
                          parts[i + 1].split("\n", 1)[0]) for i in range(len(parts) - 1)]
            with self._lock:
                for index, (answer, status) in enumerate(transfers):
                    code, connects, seconds = status.split()
                    self.latencies_s.append(float(seconds))
                    if int(connects) and index > 0:
                        self.reconnects += 1
                    try:
                        assert code == "200", f"HTTP {code}: {answer[:200]}"
                        self.check(json.loads(answer)["outputs"][0]["data"])
                        self.ok += 1
                    except (AssertionError, ValueError, KeyError) as error:
                        self.failed.append(str(error)[:300])
                missing = self.CALLS_PER_RUN - len(transfers)
                if missing:
                    self.failed += [f"curl exit {result.returncode}: "
                                    f"{result.stderr[-300:]}"] * missing


def plain_callers(envoy):
    """One of each plain caller through `envoy`."""
    return [GrpcUnaryCaller(envoy.softmax_address),
            TritonUnaryCaller(envoy.kserve_grpc_address),
            TritonStreamCaller(envoy.kserve_grpc_address),
            CurlCaller(envoy.http_address, threads=1)]


# ------------------------------------------------------------------- spread

def replica_counts(fleet, method):
    return [r.requests_total(method=method) for r in fleet.replicas]


def test_spread_is_even_over_three_replicas(fleet3):
    before = replica_counts(fleet3, "Softmax")
    report = Load(fleet3.envoy.softmax_address, duration_s=4, concurrency=16,
                  connections=2).result()
    assert_no_failure(report, "through Envoy")
    after = replica_counts(fleet3, "Softmax")
    counts = [b - a for a, b in zip(before, after)]
    mean = sum(counts) / len(counts)
    print(f"spread: {report['ok']} calls, {report['requests_per_s']:.0f}/s, per replica "
          f"{counts} ({[round(c / mean - 1, 3) for c in counts]} from the mean)")
    assert sum(counts) == report["ok"] + report["warmup_requests"]
    for count in counts:
        assert abs(count / mean - 1) <= 0.20, counts


# ---------------------------------------------------------- rolling restart

def test_rolling_restart_fails_no_call(fleet3):
    """Each replica in turn: SIGTERM, drained exit, started again on its
    address, back in Envoy's rotation; meanwhile unary softmax.v1, KServe
    gRPC, KServe HTTP and a stream call through Envoy without pause."""
    envoy = fleet3.envoy
    duration = 20
    loads = {
        "softmax.v1": Load(envoy.softmax_address, duration_s=duration, concurrency=4),
        "kserve gRPC": Load(envoy.kserve_grpc_address, protocol="kserve",
                            duration_s=duration, concurrency=4),
        "kserve HTTP": Load(envoy.http_address, protocol="http", duration_s=duration,
                            concurrency=4, connections=4),
    }
    stream = StreamCaller(envoy.softmax_address)
    plain = plain_callers(envoy)
    started = time.monotonic()
    timings = []
    try:
        time.sleep(1.5)
        for replica in fleet3.replicas:
            t0 = time.monotonic()
            code = replica.restart()
            assert code == 0, f"replica {replica.index} exited {code}:\n{replica.output()}"
            t1 = time.monotonic()
            back = fleet3.wait_in_rotation([replica], timeout=20)
            timings.append((round(t1 - t0, 2), round(back, 2)))
        elapsed = time.monotonic() - started
        assert elapsed < duration - 1, (
            f"the restarts took {elapsed:.1f} s, longer than the load ran", timings)
    finally:
        reports = {name: load.result() for name, load in loads.items()}
        for caller in plain:
            caller.stop()
        stream.stop()
    print(f"rolling restart: (drain and start s, back in rotation s) per replica {timings}")
    print("  envoy's failed calls:", *failed_calls(fleet3), sep="\n    ")
    for name, report in reports.items():
        print(f"  {name}: {report['ok']} calls, {report['errors']} failed, "
              f"p99 {report['latency_us']['p99'] / 1000:.1f} ms")
        assert_no_failure(report, name)
    print(f"  {stream.summary()}")
    for caller in plain:
        print(f"  {caller.summary()}")
    stream.assert_clean()
    for caller in plain:
        caller.assert_clean()
    assert stream.answered > 100
    # A stream through Envoy ends only by its replica's drain: never by a
    # timeout of Envoy's (a per-try timeout passed on as grpc-timeout ended
    # every stream after 5 s).
    assert "StatusCode.DEADLINE_EXCEEDED" not in stream.stream_ends, stream.stream_ends
    assert stream.reopened >= 1, "no stream was ended by a drain: the test did not test it"


# The clusters of unary calls: the ones a drain's refusals reach.
UNARY_CLUSTERS = (fleet_util.GRPC_CLUSTER, fleet_util.HTTP_CLUSTER)


def _marked_down(fleet, replica):
    """True when the unary clusters' health checks hold `replica` failed."""
    ports = {fleet_util.GRPC_CLUSTER: replica.grpc_port,
             fleet_util.HTTP_CLUSTER: replica.http_port}
    return all("failed_active_hc" in fleet.envoy.hosts(cluster).get(
        f"{replica.address}:{ports[cluster]}", "") for cluster in UNARY_CLUSTERS)


def test_rolling_restart_of_two_replicas_fails_no_plain_call():
    """Two replicas, each in turn: SIGTERM, drained exit, started again
    once Envoy's health checks hold it down (a pod slower to come back than
    two failed checks), back in rotation; plain callers (grpcio,
    tritonclient, curl: no retries of their own) lose no call. A replica
    back from a restart is both health-checked up and un-ejected: two
    changes within Envoy's default update_merge_window (1 s), and the second
    reached Envoy's workers up to 1 s after /clusters showed the replica
    healthy; the other replica drained in that second had every try of a
    call (3, URX, one host): 85-109 calls failed at these callers in 3
    runs, none with update_merge_window 0."""
    with fleet_util.start_fleet(2) as fleet:
        note_fallbacks(fleet)
        envoy = fleet.envoy
        callers = [GrpcUnaryCaller(envoy.softmax_address),
                   TritonUnaryCaller(envoy.kserve_grpc_address),
                   CurlCaller(envoy.http_address, threads=1)]
        try:
            time.sleep(1.0)
            for replica in fleet.replicas:
                code = replica.stop(signal.SIGTERM)
                assert code == 0, f"replica {replica.index} exited {code}:\n{replica.output()}"
                e2e_util.wait_for(lambda: _marked_down(fleet, replica), 10,
                                  f"replica {replica.index} down in Envoy's health checks",
                                  interval=0.05)
                replica.start()
                fleet.wait_in_rotation([replica], timeout=20, clusters=UNARY_CLUSTERS)
        finally:
            for caller in callers:
                caller.stop()
        print("rolling restart of 2 replicas; envoy's failed calls:",
              *failed_calls(fleet)[:10], sep="\n    ")
        for caller in callers:
            print(f"  {caller.summary()}")
        for caller in callers:
            caller.assert_clean()


# ------------------------------------------ streams beside a draining connection

# The stall deploy/envoy/envoy.yaml's unary cluster is shaped against: a
# replica's GOAWAY leaves Envoy's connection to it draining until its last
# call ends, and that connection still counts against per_host_thresholds'
# max_connections; with a limit of 1 and streams on the same connections,
# new unary calls to that replica waited as pending until the stream ended.
# Stated bound, with the figures measured on a 2-core host: this test's
# unary callers' max latency 318-520 ms over 3 runs with the shipped
# envoy.yaml (a drain's retries and a busy host's scheduling), 2,933 ms with
# the configuration before it (one cluster, one connection per replica).
UNARY_MAX_MS = 1000


def test_streams_hold_no_unary_call_behind_a_draining_connection():
    """Streams (SoftmaxStream, ModelStreamInfer) stay open through Envoy
    while the replicas' connections rotate at their age (2 s, the opt-in
    --max_connection_age_s) and each replica restarts; plain unary callers
    beside them (grpcio and tritonclient, no retries of their own) lose no
    call and none waits behind a draining connection."""
    with fleet_util.start_fleet(3, server_args=AGE_ARGS, envoy_concurrency=1) as fleet:
        note_fallbacks(fleet)
        envoy = fleet.envoy
        stream = StreamCaller(envoy.softmax_address)
        triton_stream = TritonStreamCaller(envoy.kserve_grpc_address, threads=1)
        unary = [GrpcUnaryCaller(envoy.softmax_address, threads=4),
                 TritonUnaryCaller(envoy.kserve_grpc_address, threads=2)]
        # When each replica got its SIGTERM and was back, on the clock of
        # Envoy's access log (a failed call's START_TIME plus its ms).
        restarts = []
        try:
            time.sleep(5)  # two rotations of every connection
            for replica in fleet.replicas:
                sigterm = _utc_now()
                code = replica.restart()
                assert code == 0, f"replica {replica.index} exited {code}:\n{replica.output()}"
                fleet.wait_in_rotation([replica], timeout=20)
                restarts.append(f"replica {replica.index} {replica.address}: SIGTERM {sigterm}, "
                                f"back {_utc_now()}")
            time.sleep(3)
        finally:
            for caller in unary + [triton_stream]:
                caller.stop()
            stream.stop()
        envoy_failed = failed_calls(fleet)
        rotated = {cluster: envoy.stats(f"cluster.{cluster}.upstream_cx_close_notify").get(
            f"cluster.{cluster}.upstream_cx_close_notify", 0)
            for cluster in (fleet_util.GRPC_CLUSTER, fleet_util.STREAM_CLUSTER)}
    print("streams beside draining connections (age 2 s, 1 Envoy worker):")
    print("  restarts:", *restarts, sep="\n    ")
    print("  envoy's failed calls:", *envoy_failed[:10], sep="\n    ")
    for caller in unary:
        print(f"  {caller.summary()}")
        for failure in sorted(set(f.split("debug_error_string")[0] for f in caller.failed))[:3]:
            print(f"    {failure}")
    print(f"  {stream.summary()}")
    print(f"  {triton_stream.summary()}")
    print(f"  connections closed by a replica's GOAWAY: {rotated}")
    stream.assert_clean()
    triton_stream.assert_clean()
    assert min(rotated.values()) >= 3, f"too few connection rotations to test: {rotated}"
    for caller in unary:
        caller.assert_clean()
        assert caller.max_ms < UNARY_MAX_MS, caller.summary()


# ------------------------------------------------------------ replica death

# Stated bounds (measured on a 2-core host: ejected 0.0x s after SIGKILL,
# back 1-2 s after the restart; the ejection lasts base_ejection_time = 5 s).
EJECTED_WITHIN_S = 3.0
BACK_WITHIN_S = 10.0


def test_replica_death_is_retried_and_ejected(fleet3):
    victim = fleet3.replicas[0]
    load = Load(fleet3.envoy.softmax_address, duration_s=9, concurrency=16, connections=2)
    plain = plain_callers(fleet3.envoy)
    try:
        time.sleep(1.5)
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(timeout=10)
        ejected = fleet3.wait_out_of_rotation(victim, timeout=EJECTED_WITHIN_S)
        time.sleep(1.0)
        victim.start()
        back = fleet3.wait_in_rotation([victim], timeout=BACK_WITHIN_S)
    finally:
        report = load.result()
        for caller in plain:
            caller.stop()
    flags = fleet3.envoy.stats("cluster.softmax_grpc.")
    print(f"replica death: out of rotation {ejected:.2f} s after SIGKILL, back {back:.2f} s "
          f"after its restart; {report['ok']} calls, {report['errors']} failed; envoy retries "
          f"{flags.get('cluster.softmax_grpc.upstream_rq_retry', 0)}, ejections "
          f"{flags.get('cluster.softmax_grpc.outlier_detection.ejections_enforced_total', 0)}")
    print("  envoy's failed calls:", *failed_calls(fleet3), sep="\n    ")
    for caller in plain:
        print(f"  {caller.summary()}")
    assert_no_failure(report, "unary calls through Envoy across a SIGKILL")
    for caller in plain:
        if isinstance(caller, TritonStreamCaller):
            caller.assert_clean(ends=("UNAVAILABLE", "RST_STREAM"))
        else:
            caller.assert_clean()


# ----------------------------------------------------------------- scale-up

@pytest.fixture(scope="module")
def python_client_dir():
    """clients/python installed into a temporary folder."""
    folder = tempfile.mkdtemp(prefix="softmax-fleet-client-")
    try:
        yield e2e_util.install_python_client(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


SPREAD_WITHIN_S = 10.0


def test_scale_up_spreads_within_10_s(python_client_dir):
    if not HAS_CONNECTION_AGE:
        pytest.skip("softmax-server has no --max_connection_age_s: callers that balance "
                    "themselves would never reach new replicas")
    with fleet_util.start_fleet(2, server_args=AGE_ARGS) as fleet:
        note_fallbacks(fleet)
        duration = 18
        # Through Envoy on one long-lived connection: KServe gRPC, so that
        # each replica's ModelInfer count is this caller's.
        envoy_load = Load(fleet.envoy.kserve_grpc_address, protocol="kserve",
                          duration_s=duration, concurrency=8, connections=1)
        direct = fleet_util.start_round_robin_caller(fleet, python_client_dir, duration)
        if direct is None:
            fall_back("scale-up: no namespace or mount namespace for a resolving caller here; "
                      "only the Envoy caller is checked")
        try:
            time.sleep(3)
            fleet.add_replica(publish=False)
            fleet.add_replica(publish=False)
            fleet.publish(fleet.replicas)
            timeline = fleet_util.sample_counts(fleet, ("ModelInfer", "Softmax"), 14)
        finally:
            report = envoy_load.result()
            direct_result = None
            if direct is not None:
                out, err = direct.communicate(timeout=60)
                assert direct.returncode == 0, err
                direct_result = json.loads(out.strip().splitlines()[-1])
        assert_no_failure(report, "KServe gRPC through Envoy")
        callers = {"ModelInfer": "one connection to Envoy"}
        if direct_result is not None:
            assert direct_result["failed"] == [], direct_result["failed"][:3]
            assert direct_result["ok"] > 0
            callers["Softmax"] = "gRPC round_robin straight to the replicas"
        for method, caller in callers.items():
            when, delta = fleet_util.time_to_share(timeline[method], new=[2, 3])
            print(f"scale-up 2 -> 4, {caller}: the new replicas took their share "
                  f"{when if when is None else round(when, 2)} s after the endpoint files "
                  f"were rewritten (calls per replica in that 1 s window: {delta})")
            assert when is not None and when <= SPREAD_WITHIN_S, (caller, timeline[method])


# ----------------------------------------------------------------- overload

# Replicas whose every call takes this long, however many are in flight
# (fleet_util.FIXED_LATENCY_REPLICA: the wait costs no CPU). The shipped
# envoy.yaml is sized for GPU replicas: 16 connections x 64 streams = 1,024
# calls in flight per replica, 1,024 more waiting cluster-wide. Replicas of
# real CPU work cannot be pushed to those limits from a 2-core host (measured
# with 3 unbounded replicas and --max_queued_requests=64: 6,664 calls/s
# offered were mostly answered, the replicas' own queue refusing the rest;
# at a twentieth of a core each, calls waited to their 5 s deadline); replicas
# that take time instead of cores reach them with 2,304 calls/s for 3 s.
OVERLOAD_LATENCY_S = 4.0
OVERLOAD_REPLICAS = 3
OVERLOAD_SHAPE = "1x64"
# Refusals at Envoy: measured median 0 ms, max 0-20 ms on a 2-core host.
REFUSED_WITHIN_MS = 1000
# What the host may add to an accepted call's latency under this load.
HOST_LAG_S = 1.5


def _quantile(values, q):
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def _shipped_limits():
    """(calls in flight per replica, calls waiting cluster-wide) of the
    shipped envoy.yaml's unary cluster."""
    import yaml
    config = yaml.safe_load(fleet_util.ENVOY_CONFIG.read_text())
    grpc = fleet_util.cluster(config, fleet_util.GRPC_CLUSTER)
    streams = grpc["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"][
        "explicit_http_config"]["http2_protocol_options"]["max_concurrent_streams"]
    connections = grpc["circuit_breakers"]["per_host_thresholds"][0]["max_connections"]
    pending = grpc["circuit_breakers"]["thresholds"][0]["max_pending_requests"]
    return connections * streams, pending


def _peaks(fleet):
    """The most calls each stand-in replica held at once."""
    return [max([int(n) for n in re.findall(r"peak in flight (\d+)", r.output())] or [0])
            for r in fleet.replicas]


def test_overload_ends_excess_fast():
    """The shipped envoy.yaml, unchanged, in front of replicas that take
    OVERLOAD_LATENCY_S per call: three times what the fleet sustains is
    offered for 3 s. Envoy fills each replica to its limit, queues its
    pending limit, and refuses the rest at once (UNAVAILABLE); every
    accepted call is answered right, within its latency plus the wait of the
    pending queue."""
    per_replica, pending = _shipped_limits()
    in_flight = OVERLOAD_REPLICAS * per_replica
    sustained_rate = in_flight / OVERLOAD_LATENCY_S
    rate = 3 * sustained_rate
    # A call queued in Envoy gets the slot of a call in flight before it came
    # (there are more of those than calls queued), so it waits at most one
    # latency before its own (measured: max 7.0 s at 4 s per call).
    accepted_bound_s = 2 * OVERLOAD_LATENCY_S + HOST_LAG_S
    with fleet_util.start_fleet(
            OVERLOAD_REPLICAS,
            replica_type=fleet_util.fixed_latency_replica(OVERLOAD_LATENCY_S)) as fleet:
        note_fallbacks(fleet)
        # 8 connections: Envoy takes 1,024 streams on each from a caller.
        over = Load(fleet.envoy.softmax_address, duration_s=3, rate=rate, connections=8,
                    shape=OVERLOAD_SHAPE, timeout_ms=20000,
                    extra=[f"--max_outstanding={2 * (in_flight + pending)}"]).result()
        refused_ms = sorted(int(line.rsplit("ms=", 1)[1]) for line in failed_calls(fleet)
                            if "/softmax.v1.SoftmaxService/Softmax " in line)
        overflow = sum(fleet.envoy.stats(
            f"cluster.{fleet_util.GRPC_CLUSTER}.upstream_rq_pending_overflow").values())
        peaks = _peaks(fleet)
    codes = over["errors_by_code"]
    print(f"overload, the shipped envoy.yaml ({per_replica} calls in flight per replica, "
          f"{pending} pending), {OVERLOAD_REPLICAS} replicas of {OVERLOAD_LATENCY_S} s per call "
          f"(sustain {sustained_rate:.0f}/s): offered {rate:.0f}/s for 3 s "
          f"({over['requests']} calls): {over['ok']} answered, refused {codes}, "
          f"Envoy's pending overflows {overflow}; most in flight per replica {peaks}; "
          f"refusals at Envoy: median {_quantile(refused_ms, 0.5)} ms, p99 "
          f"{_quantile(refused_ms, 0.99)} ms, max {_quantile(refused_ms, 1.0)} ms; answered "
          f"p50 {over['latency_us']['p50'] / 1e6:.2f} s, p99 {over['latency_us']['p99'] / 1e6:.2f} s, "
          f"max {over['latency_us']['max'] / 1e6:.2f} s (bound {accepted_bound_s:.2f} s)")
    assert over["mismatches"] == 0
    assert over["ok"] + over["errors"] == over["requests"] + over["warmup_requests"], over
    assert set(codes) <= {"UNAVAILABLE"}, codes
    assert over["errors"] > 0 and overflow >= over["errors"], (over["errors"], overflow)
    # Envoy's limits, not the replicas, bounded the calls: each replica held
    # at most its share and was filled to (nearly) it.
    assert all(peak <= per_replica for peak in peaks), peaks
    assert sum(peaks) >= 0.9 * in_flight, peaks
    assert over["ok"] >= in_flight + pending, over["ok"]
    assert refused_ms and refused_ms[-1] <= REFUSED_WITHIN_MS, refused_ms[-10:]
    assert over["latency_us"]["max"] / 1e6 <= accepted_bound_s, over["latency_us"]


# -------------------------------------------------------------- rapid reset

def test_rapid_reset_is_cut_off_by_envoy(fleet3):
    """HEADERS + RST_STREAM pairs on one connection to Envoy: Envoy closes
    it (its premature-reset limit: half of 100 streams reset within 1 s),
    again on every new connection, while a caller keeps its answers."""
    envoy = fleet3.envoy
    load = Load(envoy.softmax_address, duration_s=5, concurrency=4)
    closed_after, started = [], time.monotonic()
    try:
        time.sleep(0.5)
        while time.monotonic() - started < 3.5 and len(closed_after) < 20:
            connection = h2_util.Connection(envoy.softmax_address)
            sent = 0
            try:
                for batch in range(100):
                    frames = b""
                    for _ in range(10):
                        stream_id = 2 * sent + 1
                        frames += h2_util.frame(h2_util.HEADERS, h2_util.END_HEADERS, stream_id,
                                                _headers_block())
                        frames += h2_util.frame(h2_util.RST_STREAM, 0, stream_id,
                                                (h2_util.CANCEL).to_bytes(4, "big"))
                        sent += 1
                    connection.sock.sendall(frames)
                    # A pause per 10 pairs lets the count of pairs sent
                    # follow what Envoy has read.
                    time.sleep(0.005)
                    if connection.closed_by_peer():
                        break
            except (ConnectionError, OSError):
                pass
            finally:
                connection.close()
            closed_after.append(sent)
    finally:
        report = load.result()
    premature = envoy.stats("http.softmax_v1.downstream_rq_too_many_premature_resets")
    count = sum(premature.values())
    # The overload manager is on and watches Envoy's heap (the gauge is in
    # percent of envoy.yaml's 2 GiB); the flood came nowhere near its actions.
    pressure = envoy.stats("overload.envoy.resource_monitors.fixed_heap.pressure")
    print(f"rapid reset: {len(closed_after)} connections, each closed by Envoy after at most "
          f"{max(closed_after)} pairs sent ({closed_after[:10]}); Envoy's premature-reset "
          f"closes: {count}; the other caller: {report['ok']} calls, {report['errors']} failed")
    cancelled = sum(r.requests_total(code="CANCELLED")
                    for r in fleet3.replicas)
    print(f"  calls the replicas saw cancelled: {cancelled}; Envoy's heap pressure: {pressure}")
    assert pressure and max(pressure.values()) < 85, pressure
    assert count == len(closed_after) >= 5, (count, closed_after)
    # Envoy closes at 50 premature resets; what was in flight on the wire
    # (10 pairs a batch) comes on top. Measured: 60-120 pairs.
    assert max(closed_after) <= 500, closed_after
    assert_no_failure(report, "a caller beside the rapid reset")


_BLOCK = None


def _headers_block():
    global _BLOCK
    if _BLOCK is None:
        _BLOCK = b"".join(h2_util._literal(n, v) for n, v in (
            (":method", "POST"), (":scheme", "http"),
            (":path", "/softmax.v1.SoftmaxService/Softmax"), (":authority", "fleet"),
            ("content-type", "application/grpc"), ("te", "trailers")))
    return _BLOCK


# ------------------------------------------------------------ per-try timeout

def test_each_try_gets_the_callers_deadline_or_the_per_try_timeout():
    """Envoy passes the caller's grpc-timeout on to the replica, cut to the
    route's per-try timeout (5 s), and a stream's whole (none without one: a
    stream lives as long as its caller keeps it): a stand-in replica
    (in-process gRPC, healthy by its health service) records the deadline
    each call arrives with."""
    from concurrent import futures

    import grpc

    seen = []

    def softmax(request, context):
        seen.append(context.time_remaining())
        return request

    streams_seen = []

    def stream(requests, context):
        streams_seen.append(context.time_remaining())
        for request in requests:
            yield request

    def health(request, context):
        return b"\x08\x01"  # HealthCheckResponse{status: SERVING}

    stand_in = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    stand_in.add_generic_rpc_handlers([
        grpc.method_handlers_generic_handler("softmax.v1.SoftmaxService", {
            "Softmax": grpc.unary_unary_rpc_method_handler(softmax),
            "SoftmaxStream": grpc.stream_stream_rpc_method_handler(stream)}),
        grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
            "Check": grpc.unary_unary_rpc_method_handler(health)})])
    port = stand_in.add_insecure_port("127.0.0.1:0")
    stand_in.start()
    try:
        with fleet_util.start_fleet(0) as fleet:
            fleet_util.envoy_endpoints.write(fleet.endpoints_dir, [("127.0.0.1", port, port)])
            e2e_util.wait_for(
                lambda: fleet.envoy.hosts(fleet_util.GRPC_CLUSTER).get(f"127.0.0.1:{port}")
                == "healthy", 20, "the stand-in healthy in Envoy", interval=0.05)
            call = grpc.insecure_channel(fleet.envoy.softmax_address).unary_unary(
                "/softmax.v1.SoftmaxService/Softmax")
            for deadline in (3.0, 20.0):
                assert call(b"", timeout=deadline) == b""
            # A stream gets the caller's deadline whole, or none without one.
            open_stream = grpc.insecure_channel(fleet.envoy.softmax_address).stream_stream(
                "/softmax.v1.SoftmaxService/SoftmaxStream")
            for deadline in (20.0, None):
                assert list(open_stream(iter([b"", b""]), timeout=deadline)) == [b"", b""]
    finally:
        stand_in.stop(0)
    print(f"per-try timeout: a 3 s caller deadline reached the replica as {seen[0]:.2f} s, "
          f"a 20 s one as {seen[1]:.2f} s")
    # gRPC writes a grpc-timeout of 1-10 s in 10 ms units, rounded up: a 3 s
    # deadline may leave the caller as 3.01 s (a replica saw 3.009 s).
    assert 2.0 < seen[0] <= 3.02, seen
    assert 4.0 < seen[1] <= 5.0, seen
    print(f"  a stream with a 20 s deadline reached it as {streams_seen[0]:.2f} s, one without "
          f"as {streams_seen[1]:.3g} s")
    # grpcio reports no deadline as ~2^63 ns; 20 s leaves the caller rounded up (20.1 s seen).
    assert 19.0 < streams_seen[0] <= 20.2 and streams_seen[1] > 1e6, streams_seen
