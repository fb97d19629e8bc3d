"""The float64 softmax reference and the one tolerance contract that every
test and benchmark checks answers with, and the bfloat16 rounding that
turns float32 inputs into what a bfloat16 tensor carries.

The contract, elementwise: |y - ref| <= ATOL + RTOL[dtype] * |ref|, NaN
exactly where the reference is NaN, infinities equal. RTOL is per type of
the output tensor: a half type rounds each output to 11 (float16) or 8
(bfloat16) significant bits. Needs only NumPy; softmax() and
outside_tolerance() also take torch tensors (the GPU benchmarks under
kernels/bench check outputs of hundreds of MiB where they lie).
"""

import numpy as np

RTOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
ATOL = 1e-6


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def softmax(x, axis=-1, temperature=1.0, log=False):
    """float64 softmax (log-softmax with log=True) of `x` over `axis`, with
    torch's semantics: a row holding NaN, or only -inf, gives NaN. The
    temperature is rounded to float32 first, as the wire carries it. A torch
    tensor gives a float64 tensor on its own device (torch's softmax, whose
    semantics these are); anything else a NumPy array."""
    temperature = np.float64(np.float32(temperature))
    if _is_torch(x):
        z = x.double() / float(temperature)
        return z.log_softmax(dim=axis) if log else z.softmax(dim=axis)
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0:
        return softmax(x.reshape(1), 0, temperature, log).reshape(())
    if x.size == 0:
        return x.copy()
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        z = x / temperature
        m = np.max(z, axis=axis, keepdims=True)
        shifted = z - m
        total = np.sum(np.exp(shifted), axis=axis, keepdims=True)
        return shifted - np.log(total) if log else np.exp(shifted) / total


def mismatch(actual, expected, dtype):
    """None when `actual` meets the contract against `expected` for outputs
    of `dtype`, else a sentence saying where it does not."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        return f"shape {actual.shape} != {expected.shape}"
    nan_expected = np.isnan(expected)
    if not np.array_equal(np.isnan(actual), nan_expected):
        return (f"NaN positions differ: expected {np.argwhere(nan_expected)[:5].tolist()}, "
                f"got {np.argwhere(np.isnan(actual))[:5].tolist()}")
    inf = np.isinf(expected) | np.isinf(actual)
    if not np.array_equal(actual[inf], expected[inf]):
        return "infinities differ"
    finite = ~nan_expected & ~inf
    error = np.abs(actual[finite] - expected[finite])
    bound = ATOL + RTOL[dtype] * np.abs(expected[finite])
    bad = error > bound
    if not bad.any():
        return None
    i = int(np.argmax(error - bound))
    return (f"{int(bad.sum())} of {int(finite.sum())} elements outside tolerance; worst "
            f"|{actual[finite][i]} - {expected[finite][i]}| = {error[i]} > {bound[i]}")


def outside_tolerance(actual, expected, dtype):
    """How many elements of `actual` break the contract against `expected`
    (outputs of `dtype`): both NumPy arrays, or both torch tensors on one
    device, of one shape. The count where mismatch() would need the whole
    sentence (and a copy to the host)."""
    if not _is_torch(expected):
        actual = np.asarray(actual, dtype=np.float64)
        expected = np.asarray(expected, dtype=np.float64)
    else:
        actual = actual.double()
    with np.errstate(invalid="ignore"):
        ok = ((actual == expected)
              | ((abs(actual - expected) <= ATOL + RTOL[dtype] * abs(expected))
                 & (abs(expected) != float("inf")))
              | ((actual != actual) & (expected != expected)))
    return int((~ok).sum())


def assert_close(actual, expected, dtype, what=""):
    """Raises AssertionError, prefixed with `what`, where mismatch() finds one."""
    problem = mismatch(actual, expected, dtype)
    if problem is not None:
        raise AssertionError(f"{what}: {problem}")


def max_relative_error(actual, expected):
    """max |y - ref| / (ATOL + |ref|) over finite elements: a figure to
    report beside the verdict, not the verdict."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    finite = np.isfinite(actual) & np.isfinite(expected)
    if not finite.any():
        return 0.0
    return float(np.max(np.abs(actual[finite] - expected[finite])
                        / (ATOL + np.abs(expected[finite]))))


def float_to_bfloat16_bits(values):
    """float32 array -> uint16 bfloat16 bits, round to nearest even, NaN kept."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    return np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def bfloat16_bits_to_float(bits):
    """uint16 bfloat16 bits -> float32 array (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def representable(values, dtype):
    """`values` rounded to `dtype`, as float32: what the server receives."""
    values = np.asarray(values, dtype=np.float32)
    if dtype == "float16":
        return values.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return bfloat16_bits_to_float(float_to_bfloat16_bits(values))
    return values
