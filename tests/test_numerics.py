"""Results of the real server, called from Python grpcio, against a float64
NumPy softmax: every dtype, axes first / middle / last, temperature, log,
NaN and -inf rows, zero-size dimensions, rows of length 1, scalars."""

import zlib

import numpy as np
import pytest

from e2e_util import assert_close, decode, encode, reference_softmax, request

DTYPES = ["float32", "float16", "bfloat16"]


@pytest.fixture(scope="module")
def server(device_server):
    """Every test here runs on the CPU backend and, where present, the GPU."""
    return device_server


def quantized(values, dtype):
    """The values the server actually receives after rounding to `dtype`."""
    return decode(encode(values, dtype))


def call_and_check(stub, values, dtype, axis=None, temperature=None, log=False,
                   request_id="r"):
    fields = {"log": log}
    if axis is not None:
        fields["axis"] = axis
    if temperature is not None:
        fields["temperature"] = temperature
    response = stub.Softmax(request(values, dtype, request_id=request_id, **fields), timeout=30)
    assert response.request_id == request_id
    assert response.output.dtype == encode(np.zeros(1), dtype).dtype
    assert list(response.output.shape) == list(np.shape(values))
    expected = reference_softmax(quantized(values, dtype), -1 if axis is None else axis,
                                 1.0 if temperature is None else temperature, log)
    actual = decode(response.output)
    assert_close(actual, expected, dtype,
                 f"{dtype} shape {np.shape(values)} axis {axis} T {temperature} log {log}")
    return response, actual


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("log", [False, True])
def test_every_dtype_axis_and_log(stub, dtype, axis, log):
    rng = np.random.default_rng(zlib.crc32(f"{dtype}{axis}{log}".encode()))
    values = rng.normal(0.0, 3.0, size=(5, 37, 11))
    _, actual = call_and_check(stub, values, dtype, axis=axis, log=log)
    sums = np.exp(actual).sum(axis=axis) if log else actual.sum(axis=axis)
    assert np.allclose(sums, 1.0, rtol=0, atol=0.05 if dtype == "bfloat16" else 0.01)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature", [0.25, 1.0, 3.5])
def test_temperature(stub, dtype, temperature):
    rng = np.random.default_rng(7)
    values = rng.normal(0.0, 2.0, size=(8, 300))
    call_and_check(stub, values, dtype, temperature=temperature)
    call_and_check(stub, values, dtype, temperature=temperature, log=True, axis=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 31, 32, 33, 1024, 4099, 70000])
def test_row_lengths(stub, dtype, n):
    rng = np.random.default_rng(n)
    rows = max(1, 20000 // n)
    values = rng.normal(0.0, 4.0, size=(rows, n))
    call_and_check(stub, values, dtype)


def test_defaults_are_last_axis_and_temperature_one(stub):
    values = np.random.default_rng(3).normal(size=(4, 6, 9))
    response = stub.Softmax(request(values, "float32"), timeout=30)
    assert_close(decode(response.output), reference_softmax(quantized(values, "float32")),
                 "float32", "defaults")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
def test_nan_and_infinity_rows_follow_torch(stub, dtype, log):
    values = np.array([
        [1.0, 2.0, 3.0, 4.0],
        [np.nan, 1.0, 2.0, 3.0],              # NaN anywhere -> NaN row
        [-np.inf, -np.inf, -np.inf, -np.inf],  # all -inf -> NaN row (as torch)
        [-np.inf, 0.0, 1.0, -np.inf],          # some -inf -> exact zeros (log: -inf)
        [np.inf, 0.0, 1.0, 2.0],               # +inf -> NaN row (inf - inf)
        [1e4, 1e4, -1e4, 0.0],                 # large, finite: no overflow
    ])
    _, actual = call_and_check(stub, values, dtype, log=log)
    assert np.isnan(actual[1]).all()
    assert np.isnan(actual[2]).all()
    if log:
        assert actual[3][0] == -np.inf and actual[3][3] == -np.inf
    else:
        assert actual[3][0] == 0.0 and actual[3][3] == 0.0
    assert np.isfinite(actual[5]).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", [((0,), 0), ((3, 0), 1), ((3, 0), 0), ((0, 5), -1),
                                        ((2, 0, 4), 1), ((2, 0, 4), 2)])
def test_zero_size_dimensions_give_empty_outputs(stub, dtype, shape, axis):
    response, actual = call_and_check(stub, np.zeros(shape), dtype, axis=axis)
    assert actual.size == 0
    assert response.output.data == b""


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_of_length_one(stub, dtype):
    values = np.array([[-3.0], [0.0], [7.5], [np.nan], [-np.inf]])
    _, actual = call_and_check(stub, values, dtype)
    np.testing.assert_array_equal(actual[:3, 0], [1.0, 1.0, 1.0])
    _, actual = call_and_check(stub, values, dtype, log=True)
    np.testing.assert_array_equal(actual[:3, 0], [0.0, 0.0, 0.0])
    # Axis of length 1 in the middle: every element is its own row.
    call_and_check(stub, np.random.default_rng(1).normal(size=(3, 1, 4)), dtype, axis=1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [None, 0, -1])
def test_scalar(stub, dtype, axis):
    response, actual = call_and_check(stub, np.array(2.5), dtype, axis=axis)
    assert list(response.output.shape) == []
    assert actual == 1.0
    _, actual = call_and_check(stub, np.array(2.5), dtype, axis=axis, log=True)
    assert actual == 0.0


def test_larger_tensor_than_grpc_default_limits(stub):
    # 8 MiB in and out: over gRPC's 4 MiB default receive limit on both sides.
    values = np.random.default_rng(5).normal(size=(512, 4096)).astype(np.float32)
    call_and_check(stub, values, "float32")


def test_timing_is_reported(stub):
    response, _ = call_and_check(stub, np.random.default_rng(2).normal(size=(64, 128)),
                                 "float32")
    timing = response.timing
    assert timing.queue_ns >= 0
    assert timing.compute_ns > 0
    assert timing.batch_requests >= 1
    assert timing.batch_rows >= 64


@pytest.mark.parametrize("n, expected_bits", [(3, 0x3EAB), (6, 0x3E2B)])
def test_bfloat16_outputs_round_to_nearest_even(stub, n, expected_bits):
    """softmax of n equal values is 1/n: float32 0x3EAAAAAB (n=3) and
    0x3E2AAAAB (n=6), whose low halves are above one half, so round to
    nearest even gives 0x3EAB / 0x3E2B where truncation gives 0x3EAA /
    0x3E2A (one ulp, inside the tolerance, so only exact bits catch it)."""
    response = stub.Softmax(request(np.zeros((2, n)), "bfloat16"), timeout=30)
    bits = np.frombuffer(response.output.data, dtype="<u2")
    assert bits.tolist() == [expected_bits] * (2 * n), [hex(b) for b in bits]
