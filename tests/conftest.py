"""pytest fixtures for softmax-serve's end-to-end tests."""

import pytest

import e2e_util


@pytest.fixture(scope="module")
def server():
    """A softmax-server on the CPU backend, shared by a module's tests."""
    process = e2e_util.Server()
    try:
        yield process
    finally:
        process.kill()


@pytest.fixture(scope="module", params=["cpu", "cuda"])
def device_server(request):
    """A softmax-server on each backend in turn: the CPU always, the GPU when
    this build has CUDA and the machine a GPU (skipped with the reason
    otherwise). Modules that want both override `server` with this."""
    process = e2e_util.start_on_device(request.param)
    try:
        yield process
    finally:
        process.kill()


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
def stub(server):
    channel = server.channel()
    try:
        yield e2e_util.softmax_pb2_grpc.SoftmaxServiceStub(channel)
    finally:
        channel.close()
