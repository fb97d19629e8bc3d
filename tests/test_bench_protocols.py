"""End-to-end test of bench/kserve/protocols.py on the CPU backend: softmax.v1,
KServe gRPC and KServe HTTP timed by the same client against one server in
alternating rounds; every protocol verified first, the table has a column per
protocol and the two ratios, and each ratio in protocols.json is the median of
its per-round ratios. HTTP gets one connection per caller, gRPC at most 8."""

import json
import os
import statistics
import subprocess
import sys

import pytest

import e2e_util
from bench.lib.markdown import table_rows

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALLERS = 12


def bin_dir():
    """protocols.py takes the folder holding both binaries."""
    folder = os.path.dirname(os.path.abspath(e2e_util.SERVER_BIN))
    if os.path.dirname(os.path.abspath(e2e_util.CLIENT_BIN)) != folder:
        pytest.skip("softmax-server and softmax-client are in different folders")
    return folder


def run_protocols(tmp_path, *args, device="cpu"):
    command = [sys.executable, "-m", "bench.kserve.protocols", f"--bundle={bin_dir()}",
               f"--device={device}", f"--points=2x256:float32@{CALLERS}", "--duration=0.4",
               "--warmup=0.1", f"--out={tmp_path}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=150, cwd=REPO)


def test_three_protocols_with_both_ratios(tmp_path):
    result = run_protocols(tmp_path, "--rounds=2")
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    for protocol in ("softmax.v1", "kserve", "http"):
        assert f"verify 2x256:float32 {protocol}: ok" in result.stdout
    report = json.loads((tmp_path / "protocols.json").read_text())
    assert report["protocols"] == ["softmax.v1", "kserve", "http"]
    (point,) = report["points"]
    for protocol in ("softmax.v1", "kserve", "http"):
        assert point[protocol]["requests_per_s"] > 0, protocol
    assert f"--connections={CALLERS}" in point["commands"]["http"]
    assert "--connections=8" in point["commands"]["kserve"]
    assert set(point["ratios"]) == {"kserve/softmax.v1", "http/kserve"}
    for ratio in point["ratios"].values():
        assert len(ratio["rounds"]) == 2
        assert ratio["median"] == pytest.approx(statistics.median(ratio["rounds"]))
    (row,) = table_rows(result.stdout)
    assert row["callers"] == str(CALLERS)
    assert row["KServe HTTP req/s (p99 ms)"].split()[0] != "failed"
    assert row["KServe HTTP / KServe gRPC, median (rounds)"].startswith(
        f"{point['ratios']['http/kserve']['median']:.3f} (")


def test_without_http_the_server_needs_no_http_port(tmp_path):
    result = run_protocols(tmp_path, "--rounds=1", "--protocols=softmax.v1,kserve")
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "http" not in json.loads((tmp_path / "protocols.json").read_text())["points"][0]
    (row,) = table_rows(result.stdout)
    assert set(row) == {"payload", "callers", "softmax.v1 req/s (p99 ms)",
                        "KServe gRPC req/s (p99 ms)",
                        "KServe gRPC / softmax.v1, median (rounds)"}


def test_the_echo_is_checked_for_answers_not_values(tmp_path):
    # --device=none returns the inputs, which --verify would refuse.
    result = run_protocols(tmp_path, "--rounds=1", "--protocols=http", device="none")
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "answered 2x256:float32 http: ok" in result.stdout
    assert json.loads((tmp_path / "protocols.json").read_text())["points"][0]["http"][
        "requests_per_s"] > 0


def test_unknown_protocol_is_a_usage_error(tmp_path):
    result = run_protocols(tmp_path, "--protocols=softmax.v1,grpc")
    assert result.returncode == 2
    assert "want distinct protocols among softmax.v1, kserve, http" in result.stderr
