"""Every malformed request is INVALID_ARGUMENT with a message naming the
field, on the unary RPC."""

import math

import grpc
import numpy as np
import pytest

from e2e_util import encode, request, softmax_pb2


def expect_invalid(stub, req, field):
    with pytest.raises(grpc.RpcError) as caught:
        stub.Softmax(req, timeout=10)
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert field in error.details(), f"{field!r} not named in {error.details()!r}"
    return error.details()


def tensor(dtype=softmax_pb2.DTYPE_FLOAT32, shape=(2, 3), data=None, itemsize=4):
    if data is None:
        data = bytes(itemsize * math.prod(shape))
    return softmax_pb2.Tensor(dtype=dtype, shape=list(shape), data=data)


@pytest.mark.parametrize("delta", [-1, 1, -24])
def test_byte_count_mismatch(stub, delta):
    good = bytes(24)
    data = good[:delta] if delta < 0 else good + bytes(delta)
    expect_invalid(stub, request(tensor=tensor(data=data)), "input.data")


def test_byte_count_mismatch_half_types(stub):
    for dtype in (softmax_pb2.DTYPE_FLOAT16, softmax_pb2.DTYPE_BFLOAT16):
        # 24 bytes would be right for float32, not for a 2-byte type.
        expect_invalid(stub, request(tensor=tensor(dtype=dtype, data=bytes(24))), "input.data")


def test_unspecified_dtype(stub):
    expect_invalid(stub, request(tensor=tensor(dtype=softmax_pb2.DTYPE_UNSPECIFIED)),
                   "input.dtype")


def test_unknown_dtype_value(stub):
    expect_invalid(stub, request(tensor=tensor(dtype=7)), "input.dtype")


def test_missing_input_is_rejected(stub):
    # No tensor at all: dtype unspecified.
    expect_invalid(stub, softmax_pb2.SoftmaxRequest(request_id="x"), "input.dtype")


@pytest.mark.parametrize("shape,index", [((2, -3), 1), ((-1,), 0), ((4, 5, -2), 2)])
def test_negative_dimension(stub, shape, index):
    req = request(tensor=softmax_pb2.Tensor(dtype=softmax_pb2.DTYPE_FLOAT32, shape=list(shape),
                                            data=b""))
    expect_invalid(stub, req, f"input.shape[{index}]")


@pytest.mark.parametrize("shape", [(2**32, 2**32), (2**62, 4), (2**31, 2**31, 2**31)])
def test_element_count_overflow(stub, shape):
    req = request(tensor=softmax_pb2.Tensor(dtype=softmax_pb2.DTYPE_FLOAT32, shape=list(shape),
                                            data=bytes(16)))
    expect_invalid(stub, req, "input.shape")


def test_byte_count_overflow(stub):
    # 2^62 elements fit int64, 2^62 * 4 bytes do not.
    req = request(tensor=softmax_pb2.Tensor(dtype=softmax_pb2.DTYPE_FLOAT32, shape=[2**62],
                                            data=bytes(16)))
    expect_invalid(stub, req, "input")


@pytest.mark.parametrize("shape,axis", [((2, 3), 2), ((2, 3), -3), ((5,), 1), ((), 1),
                                        ((), -2), ((2, 3), 2**31 - 1), ((2, 3), -2**31)])
def test_axis_out_of_range(stub, shape, axis):
    req = request(np.zeros(shape), axis=axis)
    expect_invalid(stub, req, "axis")


@pytest.mark.parametrize("temperature", [0.0, -0.0, -1.0, float("nan"), float("inf"),
                                         float("-inf")])
def test_bad_temperature(stub, temperature):
    req = request(np.zeros((2, 3)), temperature=temperature)
    expect_invalid(stub, req, "temperature")


def test_tensor_over_max_tensor_bytes(start_server):
    server = start_server("--max_tensor_bytes=4096")
    stub = server.stub()
    # Exactly at the limit: fine.
    stub.Softmax(request(np.zeros((1024,))), timeout=10)
    # Just over: reaches validation (gRPC's own limit has headroom) and names the input.
    details = expect_invalid(stub, request(np.zeros((1025,))), "input")
    assert "max_tensor_bytes" in details or "4096" in details, details
    # Far over: refused, by validation or by gRPC's message limit derived from the flag.
    with pytest.raises(grpc.RpcError) as caught:
        stub.Softmax(request(np.zeros((1 << 20,))), timeout=10)
    assert caught.value.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                   grpc.StatusCode.RESOURCE_EXHAUSTED), caught.value


def test_server_keeps_serving_after_bad_requests(stub):
    for _ in range(20):
        with pytest.raises(grpc.RpcError):
            stub.Softmax(request(tensor=tensor(data=bytes(3))), timeout=10)
    response = stub.Softmax(request(np.zeros((2, 3))), timeout=10)
    assert len(response.output.data) == 24
