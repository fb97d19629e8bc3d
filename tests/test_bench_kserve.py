"""bench/kserve/pa_bench.py's watch over perf_analyzer, without perf_analyzer:
a stand-in process that holds memory shows that the peak resident memory is
recorded (its own or a wrapper's child's), that a process past the memory
limit or the time limit is stopped with its whole session, and that the
perf_analyzer command carries --max-threads in --async mode only.
"""

import argparse
import shlex
import sys
import time

import pytest

MIB = 1 << 20


@pytest.fixture(scope="module")
def pa_bench():
    from bench.kserve import pa_bench
    return pa_bench


def holder(mib, seconds, code=0):
    """A Python process that touches `mib` MiB, holds them `seconds`, exits `code`."""
    return [sys.executable, "-c",
            f"import sys, time; b = bytearray({mib} << 20); b[::4096] = b'x' * len(b[::4096]); "
            f"time.sleep({seconds}); sys.exit({code})"]


def test_exit_code_and_peak(pa_bench, tmp_path):
    log = tmp_path / "point.log"
    code, peak = pa_bench.run_watched(holder(200, 1.0, code=3), str(log), 30, 4 << 30)
    assert code == 3
    assert 200 * MIB <= peak < 400 * MIB
    assert log.read_text().startswith(sys.executable)


def test_wrapper_child_counted(pa_bench, tmp_path):
    # A shell that does not exec: the memory is its child's.
    command = ["/bin/sh", "-c", shlex.join(holder(200, 1.0)) + "; true"]
    code, peak = pa_bench.run_watched(command, str(tmp_path / "point.log"), 30, 4 << 30)
    assert code == 0
    assert peak >= 200 * MIB


def test_memory_limit_stops_the_session(pa_bench, tmp_path):
    log = tmp_path / "point.log"
    started = time.monotonic()
    code, peak = pa_bench.run_watched(holder(300, 60), str(log), 60, 100 * MIB)
    assert code == "memory limit"
    assert peak > 100 * MIB
    assert time.monotonic() - started < 20
    assert "stopped, memory limit" in log.read_text()


def test_timeout_stops_the_session(pa_bench, tmp_path):
    started = time.monotonic()
    code, _ = pa_bench.run_watched(["/bin/sleep", "60"], str(tmp_path / "point.log"), 0.5,
                                   4 << 30)
    assert code == "timeout"
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_max_threads_with_async_only(pa_bench, mode):
    args = argparse.Namespace(perf_analyzer="perf_analyzer", pa_interval_ms=1000,
                              pa_stability=100, pa_max_trials=6, pa_mode=mode,
                              pa_max_threads=1, pa_arg=[])
    command = pa_bench.pa_command(args, "softmax_bf16", "grpc", "127.0.0.1:1", "in.json", 1,
                                  16, "out.csv")
    assert f"--{mode}" in command
    if mode == "async":
        assert command[command.index("--max-threads") + 1] == "1"
    else:
        assert "--max-threads" not in command
