"""pytest fixtures for softmax-serve's end-to-end tests."""

import shutil
import subprocess

import pytest

import e2e_util


# ------------------------------------------------------------------ sanitizers
# A sanitizer report fails the test during which it was written; one written
# later (a module's server stopping at the end) fails the run. Reports are
# printed whole, with the process's stack.

_reported = set()


def _new_sanitizer_reports():
    reports = {path: text for path, text in e2e_util.sanitizer_reports().items()
               if path not in _reported}
    _reported.update(reports)
    return reports


def _describe(reports):
    return "\n".join(f"--- {path}\n{text}" for path, text in reports.items())


def pytest_sessionstart(session):
    """Under SOFTMAX_SANITIZED, refuses to run against binaries that carry no
    sanitizer runtime: such a run would pass without having checked
    anything."""
    if not e2e_util.SANITIZED:
        return
    for binary in (e2e_util.SERVER_BIN, e2e_util.CLIENT_BIN):
        libraries = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
        if "libasan" not in libraries or "libubsan" not in libraries:
            raise pytest.UsageError(
                f"SOFTMAX_SANITIZED=1 but {binary} is not linked with libasan and libubsan")


@pytest.fixture(autouse=True)
def no_sanitizer_report():
    yield
    reports = _new_sanitizer_reports()
    if reports:
        pytest.fail(f"sanitizer report(s) during this test:\n{_describe(reports)}",
                    pytrace=False)


def pytest_sessionfinish(session, exitstatus):
    if not e2e_util.SANITIZED:
        return
    reports = _new_sanitizer_reports()
    if reports:
        print(f"\nsanitizer report(s) after the last test:\n{_describe(reports)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shutil.rmtree(e2e_util.SANITIZER_REPORT_DIR, ignore_errors=True)


@pytest.fixture(scope="module")
def server():
    """A softmax-server on the CPU backend, shared by a module's tests."""
    with e2e_util.Server() as process:
        yield process


@pytest.fixture(scope="module", params=["cpu", "cuda"])
def device_server(request):
    """A softmax-server on each backend in turn: the CPU always, the GPU when
    this build has CUDA and the machine a GPU (skipped with the reason
    otherwise). Modules that want both override `server` with this."""
    with e2e_util.start_on_device(request.param) as process:
        yield process


@pytest.fixture
def start_server():
    """Factory for servers with extra flags; every one is killed at the end."""
    started = []

    def start(*args, **kwargs):
        process = e2e_util.Server(*args, **kwargs)
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            process.kill()


@pytest.fixture(scope="module")
def grpc_client(server):
    """tritonclient.grpc's client of `server` (the test venv has tritonclient)."""
    import tritonclient.grpc as triton_grpc
    with triton_grpc.InferenceServerClient(server.grpc_address) as client:
        yield client


@pytest.fixture(scope="module")
def http_client(server):
    """tritonclient.http's client of `server` (the test venv has tritonclient)."""
    import tritonclient.http as triton_http
    with triton_http.InferenceServerClient(server.http_address) as client:
        yield client


@pytest.fixture(scope="module")
def stub(server):
    channel = server.channel()
    try:
        yield e2e_util.softmax_pb2_grpc.SoftmaxServiceStub(channel)
    finally:
        channel.close()
