"""softmax-client against the real server: random and .npy inputs, .npy
outputs checked with NumPy against a float64 softmax, the stream path, and
the exit codes of failures."""

import os
import re
import subprocess

import numpy as np
import pytest

import e2e_util
from e2e_util import assert_close, bfloat16_bits_to_float, float_to_bfloat16_bits, reference_softmax


def run_client(server, *args, timeout=60):
    target = server.grpc_address if server else "127.0.0.1:1"
    return subprocess.run([e2e_util.CLIENT_BIN, f"--target={target}", *args],
                          capture_output=True, text=True, timeout=timeout)


def row_sums(stdout):
    match = re.search(r"row sums:\s+min (\S+)\s+max (\S+)", stdout)
    assert match, stdout
    return float(match.group(1)), float(match.group(2))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("stream", [False, True])
def test_random_tensor_summary(server, dtype, stream):
    args = ["--shape=4,1000", f"--dtype={dtype}", "--check", "--request_id=cli-1"]
    if stream:
        args.append("--stream")
    result = run_client(server, *args)
    assert result.returncode == 0, result.stderr + result.stdout
    out = result.stdout
    assert f"[4, 1000] {dtype}" in out, out
    assert "request_id: cli-1" in out
    assert "rows:       4 of length 1000" in out
    low, high = row_sums(out)
    tolerance = {"float32": 1e-5, "float16": 2e-2, "bfloat16": 0.1}[dtype]
    assert abs(low - 1) < tolerance and abs(high - 1) < tolerance, out
    assert re.search(r"check:\s+0 of 4000 elements", out), out
    assert re.search(r"server:\s+queue [\d.]+ ms\s+compute [\d.]+ ms \(kernels [\d.]+ ms, dispatch [\d.]+ ms\)\s+"
                     r"batch \d+ requests", out)


@pytest.mark.parametrize("axis,log,temperature", [(-1, False, 1.0), (0, True, 1.0),
                                                  (1, False, 0.5), (2, True, 2.0)])
def test_npy_float32_in_and_out(server, tmp_path, axis, log, temperature):
    x = np.random.default_rng(11).normal(0, 3, size=(3, 17, 9)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    args = [f"--input={tmp_path / 'x.npy'}", f"--output={tmp_path / 'y.npy'}", f"--axis={axis}",
            f"--temperature={temperature}", "--check"]
    if log:
        args.append("--log")
    result = run_client(server, *args)
    assert result.returncode == 0, result.stderr + result.stdout
    y = np.load(tmp_path / "y.npy")
    assert y.dtype == np.float32 and y.shape == x.shape
    assert_close(y, reference_softmax(x, axis, temperature, log), "float32", "cli npy")


def test_npy_float16_in_and_out(server, tmp_path):
    x = np.random.default_rng(12).normal(0, 2, size=(6, 50)).astype(np.float16)
    np.save(tmp_path / "x.npy", x)
    result = run_client(server, f"--input={tmp_path / 'x.npy'}", f"--output={tmp_path / 'y.npy'}")
    assert result.returncode == 0, result.stderr
    y = np.load(tmp_path / "y.npy")
    assert y.dtype == np.float16
    assert_close(y, reference_softmax(x.astype(np.float64)), "float16", "cli fp16")


def test_npy_bfloat16_bits_in_and_out(server, tmp_path):
    x = np.random.default_rng(13).normal(0, 2, size=(5, 64)).astype(np.float32)
    bits = float_to_bfloat16_bits(x)
    np.save(tmp_path / "x.npy", bits)  # uint16: bfloat16 bits
    result = run_client(server, f"--input={tmp_path / 'x.npy'}", f"--output={tmp_path / 'y.npy'}",
                        "--dtype=bfloat16")
    assert result.returncode == 0, result.stderr
    assert "'<u2' holding bfloat16 bits" in result.stdout
    y = np.load(tmp_path / "y.npy")
    assert y.dtype == np.uint16, "bfloat16 output is stored as its raw bits"
    assert_close(bfloat16_bits_to_float(y), reference_softmax(bfloat16_bits_to_float(bits)),
                 "bfloat16", "cli bf16")


def test_npy_float64_is_rounded_to_the_requested_dtype(server, tmp_path):
    x = np.random.default_rng(14).normal(size=(2, 3, 4))  # float64, np.save's default
    np.save(tmp_path / "x.npy", x)
    result = run_client(server, f"--input={tmp_path / 'x.npy'}", f"--output={tmp_path / 'y.npy'}",
                        "--dtype=float16", "--axis=1")
    assert result.returncode == 0, result.stderr
    y = np.load(tmp_path / "y.npy")
    assert y.dtype == np.float16
    assert_close(y, reference_softmax(x.astype(np.float16), axis=1), "float16", "f8 -> f16")


def test_npy_scalar_and_empty(server, tmp_path):
    np.save(tmp_path / "s.npy", np.float32(3.0))
    result = run_client(server, f"--input={tmp_path / 's.npy'}", f"--output={tmp_path / 'y.npy'}")
    assert result.returncode == 0, result.stderr
    y = np.load(tmp_path / "y.npy")
    assert y.shape == () and y == 1.0
    np.save(tmp_path / "e.npy", np.zeros((3, 0), dtype=np.float32))
    result = run_client(server, f"--input={tmp_path / 'e.npy'}", f"--output={tmp_path / 'y.npy'}")
    assert result.returncode == 0, result.stderr
    assert np.load(tmp_path / "y.npy").shape == (3, 0)


def test_bad_request_exits_1_with_status(server):
    result = run_client(server, "--shape=2,3", "--temperature=0")
    assert result.returncode == 1
    assert "INVALID_ARGUMENT" in result.stderr and "temperature" in result.stderr, result.stderr
    result = run_client(server, "--shape=2,3", "--axis=2", "--stream")
    assert result.returncode == 1
    assert "INVALID_ARGUMENT" in result.stderr and "axis" in result.stderr, result.stderr


def test_unreachable_server_exits_1(tmp_path):
    result = run_client(None, "--shape=2,3", "--timeout_ms=5000")
    assert result.returncode == 1
    assert "UNAVAILABLE" in result.stderr, result.stderr


def test_usage_errors_exit_2(server, tmp_path):
    assert run_client(server, "--dtype=int8").returncode == 2
    assert run_client(server, "--shape=2,x").returncode == 2
    assert run_client(server, f"--input={tmp_path / 'missing.npy'}").returncode == 2
    (tmp_path / "bad.npy").write_bytes(b"not a numpy file")
    result = run_client(server, f"--input={tmp_path / 'bad.npy'}")
    assert result.returncode == 2 and "npy" in result.stderr, result.stderr
    np.save(tmp_path / "i.npy", np.zeros(3, dtype=np.int32))
    result = run_client(server, f"--input={tmp_path / 'i.npy'}")
    assert result.returncode == 2 and "<i4" in result.stderr, result.stderr
    assert run_client(server, "no-such-mode").returncode == 2
    assert run_client(server, "load", "extra-word").returncode == 2


def test_help_lists_every_mode_and_each_flag_once():
    result = subprocess.run([e2e_util.CLIENT_BIN, "--help"], capture_output=True, text=True,
                            timeout=60)
    out = result.stdout
    for mode in ("softmax-client [call]", "softmax-client health", "softmax-client load"):
        assert mode in out, out
    flags = re.findall(r"^    --(\w+) \(", out, flags=re.MULTILINE)
    assert len(flags) == len(set(flags)), flags
    for flag in ("target", "shape", "input", "service", "concurrency", "rate", "mix", "verify",
                 "json", "csv", "duration", "warmup"):
        assert flag in flags, flags
    # A load-only flag says so at the start of its help text.
    assert re.search(r"--concurrency \(\[load\] ", out), out


def test_flags_of_another_mode_are_usage_errors(server):
    result = run_client(server, "--shape=2,3", "--concurrency=8")
    assert result.returncode == 2
    assert "--concurrency does not apply to call" in result.stderr, result.stderr
    result = subprocess.run([e2e_util.CLIENT_BIN, "health", f"--target={server.grpc_address}",
                             "--stream"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--stream does not apply to health" in result.stderr, result.stderr


def test_shape_takes_x_and_size_suffixes(server):
    result = run_client(server, "--shape=2x1K", "--check")
    assert result.returncode == 0, result.stderr
    assert "[2, 1024] float32" in result.stdout, result.stdout
