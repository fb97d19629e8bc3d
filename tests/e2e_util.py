"""Helpers for softmax-serve's end-to-end tests: starting the real server
(bench.lib.server's launcher, with the sanitizers' checks), encoding tensors
(bench.lib.tensors), the float64 reference and the tolerance check
(bench.lib.reference), and the raw health / reflection calls (Debian ships
no grpc_health or grpc_reflection Python packages, so their few message
fields are encoded by hand here).

Paths come from the environment, set by tests/CMakeLists.txt:
  SOFTMAX_SERVER_BIN  the softmax-server binary
  SOFTMAX_CLIENT_BIN  the softmax-client binary
  SOFTMAX_PYTHON_DIR  the folder holding the generated softmax/v1 stubs
  SOFTMAX_SANITIZED   "1" when those binaries carry AddressSanitizer and UBSan
  PYTHONPATH          the checkout root (for bench.lib, scripts, deploy.envoy)
                      and SOFTMAX_PYTHON_DIR
"""

import importlib.machinery
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib import server as server_lib
from bench.lib.reference import (  # noqa: F401  (re-exported for the tests)
    ATOL, RTOL, assert_close, bfloat16_bits_to_float, float_to_bfloat16_bits,
    representable)
from bench.lib.reference import softmax as reference_softmax  # noqa: F401


def _required_env(name):
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(
            f"{name} is not set; run the end-to-end tests through ctest "
            "(cd build && ctest), which sets it")
    return value


SERVER_BIN = _required_env("SOFTMAX_SERVER_BIN")
CLIENT_BIN = _required_env("SOFTMAX_CLIENT_BIN")
PYTHON_DIR = _required_env("SOFTMAX_PYTHON_DIR")
REPO = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("softmax") is None:
    raise RuntimeError(f"the softmax/v1 stubs are not importable: put {PYTHON_DIR} "
                       "(SOFTMAX_PYTHON_DIR) on PYTHONPATH, as ctest does")

# Under the sanitizers every instrumented process started from here (server,
# softmax-client) writes its ASan and LeakSanitizer reports to files in one
# folder (log_path makes them <prefix>.<pid>), whatever the test does with its
# output or exit code; conftest.py fails the test, or the run, that leaves one
# there. UBSan's runtime, a library of its own beside ASan's in GCC's build,
# writes to stderr whatever log_path says: Server.kill() files a server's
# output there when it holds such a report, and softmax-client exits 1 on one.
SANITIZED = os.environ.get("SOFTMAX_SANITIZED") == "1"
SANITIZER_REPORT_DIR = None
if SANITIZED:
    SANITIZER_REPORT_DIR = tempfile.mkdtemp(prefix="softmax-sanitizer-")
    for _variable in ("ASAN_OPTIONS", "UBSAN_OPTIONS"):
        os.environ[_variable] = ":".join(
            filter(None, [os.environ.get(_variable, ""),
                          f"log_path={SANITIZER_REPORT_DIR}/report"]))


UBSAN_REPORT = re.compile(r"^\S+:\d+:\d+: runtime error: ", re.MULTILINE)


def sanitizer_reports():
    """{path: text} of every sanitizer report written so far (empty unless
    SANITIZED)."""
    if SANITIZER_REPORT_DIR is None:
        return {}
    reports = {}
    for name in sorted(os.listdir(SANITIZER_REPORT_DIR)):
        path = os.path.join(SANITIZER_REPORT_DIR, name)
        with open(path, encoding="utf-8", errors="replace") as f:
            reports[path] = f.read()
    return reports

import grpc  # noqa: E402
from softmax.v1 import softmax_pb2, softmax_pb2_grpc  # noqa: E402,F401

from bench.lib.tensors import (  # noqa: E402,F401  (re-exported for the tests)
    CHANNEL_OPTIONS, DTYPES, chunks_of, decode, encode, request, varint)


# The environment that makes softmax-server hold every request in its queue
# for --max_queue_delay_us, or until its batch fills, even on an idle device
# (a testing hook; the server otherwise forms a batch at once when none is in
# flight). Tests use it to have requests certainly queued: Server(env=...).
HOLD_IN_QUEUE = {"SOFTMAX_TEST_NO_IDLE_DISPATCH": "1"}
# The lame duck: from SIGTERM, new requests are refused UNAVAILABLE for this
# long before the listener may close (kLameDuck in server/server.cc).
LAME_DUCK_S = 0.5


class Server(server_lib.Server):
    """One softmax-server (SERVER_BIN) on loopback with every listener on a
    port picked by the kernel: bench.lib.server.Server, the addresses read
    from its --listening_file (.listening), plus channel() and stub(). `env` adds variables to the server's environment (e.g.
    HOLD_IN_QUEUE). Under the sanitizers kill() first asks for an orderly
    exit, so that LeakSanitizer checks what the server's whole life left
    behind, and files the output of a server that printed a UBSan report.
    """

    # An idle server exits about 1 s after SIGTERM under ASan (lame duck,
    # linger, listener shutdown, the leak check); one that is still draining
    # after this long is killed unchecked.
    SANITIZED_EXIT_TIMEOUT_S = 15.0

    def __init__(self, *extra_args, device="cpu", startup_timeout=30.0, preexec_fn=None,
                 env=None):
        super().__init__(SERVER_BIN, *extra_args, device=device, env=env,
                         preexec_fn=preexec_fn, startup_timeout=startup_timeout)

    def channel(self):
        return grpc.insecure_channel(self.grpc_address, options=CHANNEL_OPTIONS)

    def stub(self):
        return softmax_pb2_grpc.SoftmaxServiceStub(self.channel())

    def stop(self, sig=signal.SIGTERM, timeout=30.0):
        """Sends `sig` and waits for the exit; returns the exit code."""
        return super().stop(sig, timeout)

    def kill(self):
        if self.process.poll() is None and SANITIZED:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=self.SANITIZED_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        if SANITIZED:
            output = self.output()
            if UBSAN_REPORT.search(output):
                path = os.path.join(SANITIZER_REPORT_DIR, f"server-output.{self.process.pid}")
                with open(path, "w", encoding="utf-8") as f:
                    f.write(output)
        super().kill()


def start_on_device(device, *extra_args):
    """A Server on `device`. For a "cuda" device, skips the calling test (with
    the server's reason) when this build has no CUDA backend or the machine
    has no usable GPU; any other failure to start is an error."""
    import pytest
    try:
        return Server(*extra_args, device=device)
    except RuntimeError as error:
        reason = str(error)
        if device.startswith("cuda") and ("no CUDA backend" in reason or
                                          "no usable GPU" in reason or
                                          "GPU(s) visible" in reason):
            line = next((l for l in reason.splitlines()
                         if l.startswith("softmax-server: error")), reason)
            pytest.skip(f"CUDA backend not exercised: {line.strip()}")
        raise


def run_server(*args, timeout=30):
    """softmax-server run with exactly `args` (no addresses added) until it
    exits: the CompletedProcess, output as text. For starts that must fail;
    a server that serves is Server's."""
    return subprocess.run([SERVER_BIN, *args], capture_output=True, text=True,
                          timeout=timeout)


# ------------------------------------------------------- softmax-client load

def load_command(target, *args):
    """The argv of `softmax-client load --target=TARGET ARGS...`."""
    return [CLIENT_BIN, "load", f"--target={target}", *args]


def run_load(target, *args, timeout=120):
    """softmax-client load against `target` until it exits: the
    CompletedProcess, output as text (its exit code is the caller's to judge)."""
    return subprocess.run(load_command(target, *args), capture_output=True, text=True,
                          timeout=timeout)


def start_load(target, *args, **popen_args):
    """softmax-client load against `target` in the background: its Popen
    (text mode; `popen_args` as subprocess.Popen takes them, e.g. stdout)."""
    return subprocess.Popen(load_command(target, *args), text=True, **popen_args)


def loopback_cpu_args(args):
    """A manifest's server arguments ("--name=value") with the addresses moved
    to free loopback ports and the CPU for the GPU."""
    moved = []
    for arg in args:
        name, value = arg.split("=", 1)
        if name.endswith("_address"):
            value = "127.0.0.1:0"
        elif name == "--device":
            value = "cpu"
        moved.append(f"{name}={value}")
    return moved


# ------------------------------------------------------- hand-encoded protos

def _string_field(number, text):
    data = text.encode()
    return varint(number << 3 | 2) + varint(len(data)) + data


def parse_fields(data):
    """Minimal protobuf wire decoder: list of (field number, value), where a
    length-delimited value is bytes and a varint is int."""
    fields, at = [], 0

    def varint():
        nonlocal at
        value, shift = 0, 0
        while True:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while at < len(data):
        key = varint()
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            fields.append((number, varint()))
        elif wire_type == 2:
            length = varint()
            fields.append((number, bytes(data[at:at + length])))
            at += length
        elif wire_type == 1:
            at += 8
        elif wire_type == 5:
            at += 4
        else:
            raise ValueError(f"wire type {wire_type}")
    return fields


HEALTH_STATES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def health_check(channel, service="", timeout=5.0):
    """grpc.health.v1.Health/Check -> 'SERVING' | 'NOT_SERVING' | ...;
    raises grpc.RpcError on failure."""
    call = channel.unary_unary("/grpc.health.v1.Health/Check")
    request_bytes = _string_field(1, service) if service else b""
    response = call(request_bytes, timeout=timeout)
    status = dict(parse_fields(response)).get(1, 0)
    return HEALTH_STATES.get(status, str(status))


def reflection_services(channel, timeout=5.0):
    """Names listed by server reflection (grpc.reflection.v1alpha, the version
    gRPC 1.51 serves)."""
    call = channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    list_services = _string_field(7, "*")  # ServerReflectionRequest.list_services
    names = []
    for response in call(iter([list_services]), timeout=timeout):
        for number, value in parse_fields(response):
            if number == 6:  # list_services_response
                for inner_number, service in parse_fields(value):
                    if inner_number == 1:
                        names.extend(v.decode() for n, v in parse_fields(service) if n == 1)
            if number == 7:  # error_response
                raise AssertionError(f"reflection error: {parse_fields(value)}")
    return names


def reflection_file_for_symbol(channel, symbol, timeout=5.0):
    """The serialized FileDescriptorProtos reflection returns for `symbol`."""
    call = channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    request_bytes = _string_field(4, symbol)  # file_containing_symbol
    files = []
    for response in call(iter([request_bytes]), timeout=timeout):
        for number, value in parse_fields(response):
            if number == 4:  # file_descriptor_response
                files.extend(v for n, v in parse_fields(value) if n == 1)
            if number == 7:
                raise AssertionError(f"reflection error: {parse_fields(value)}")
    return files


def scrape_metrics(metrics_address, timeout=5.0):
    """The /metrics text of a server."""
    import urllib.request
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=timeout) as r:
        assert r.status == 200
        return r.read().decode()


def metric_value(text, name, labels=None):
    """Sum of the samples called `name` whose labels include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families
    total, found = 0.0, False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in (labels or {}).items()):
                total += sample.value
                found = True
    return total if found else None


# ------------------------------------------------------------ hardening helpers

def wait_for(predicate, timeout, what, interval=0.01):
    """Polls `predicate` until it returns a true value (returned) or `timeout`
    seconds pass (AssertionError naming `what`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def requests_counted(server, code, method="Softmax"):
    """softmax_requests_total for `method` and gRPC code name `code`."""
    return metric_value(scrape_metrics(server.metrics_address), "softmax_requests_total",
                        {"method": method, "code": code}) or 0


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(folder, name):
    """A self-signed CA valid for a day: folder/name.pem and name.key (P-256)."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", "1", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
             "-out", f"{name}.pem", cwd=folder)


def make_certificate(folder, ca, name, extensions):
    """folder/name.pem and name.key, signed by make_ca's `ca` in the same
    folder, with the openssl x509 `extensions` (e.g. subjectAltName=...)."""
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=folder)
    (folder / f"{name}.ext").write_text(extensions + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
             cwd=folder)


# ------------------------------------------------------ the Python client package

def install_python_client(folder):
    """clients/python built from a copy of its source (so the build writes
    nothing into the tree) and installed into `folder`/site offline
    (--no-build-isolation, the stubs generated by the system's protoc);
    returns that site folder, for a caller's PYTHONPATH or import_from().
    Raises RuntimeError with pip's output when the install fails."""
    source = Path(folder) / "source"
    shutil.copytree(REPO / "clients" / "python", source,
                    ignore=shutil.ignore_patterns("build", "dist", "*.egg-info"))
    target = Path(folder) / "site"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
         "--no-index", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, SOFTMAX_PROTO_ROOT=str(REPO / "proto")))
    if result.returncode != 0:
        raise RuntimeError(f"installing clients/python: {result.stdout}{result.stderr}")
    return target


def import_from(folder, name):
    """The top-level package `name` imported from `folder` alone (an
    install_python_client site), without adding `folder` to the module path.
    Raises ImportError when `folder` has no such package."""
    spec = importlib.machinery.PathFinder.find_spec(name, [str(folder)])
    if spec is None:
        raise ImportError(f"no package {name} in {folder}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
