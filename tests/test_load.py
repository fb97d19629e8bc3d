"""End-to-end tests of `softmax-client load` against a real CPU-backend
softmax-server: closed and open loop, unary and streaming, every response
verified against the float64 reference, and the JSON / CSV reports checked
for consistency (counts add up, percentiles ordered, rates match counts)."""

import csv
import json
import re

import pytest

import e2e_util


def run_load(server, *args, timeout=120):
    """Runs `softmax-client load` against `server` (its HTTP port with
    --protocol=http); returns the process."""
    target = server.http_address if "--protocol=http" in args else server.grpc_address
    return e2e_util.run_load(target, "--quiet", *args, timeout=timeout)


def load_report(server, tmp_path, *args, expect_rc=0):
    path = tmp_path / "report.json"
    result = run_load(server, f"--json={path}", *args)
    assert result.returncode == expect_rc, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    report = json.loads(path.read_text())
    check_consistent(report)
    return report, result


def check_consistent(report):
    assert report["requests"] == report["ok"] + report["errors"]
    assert report["errors"] == sum(report["errors_by_code"].values())
    latency = report["latency_us"]
    assert latency["count"] == report["ok"]
    if report["ok"] == 0:
        return
    assert 0 < latency["min"] <= latency["p50"] <= latency["p90"] <= latency["p99"]
    assert latency["p99"] <= latency["p99.9"] <= latency["max"]
    assert latency["min"] <= latency["mean"] <= latency["max"]
    elapsed = report["elapsed_s"]
    assert elapsed > 0
    assert report["requests_per_s"] == pytest.approx(report["requests"] / elapsed, rel=1e-4)
    assert report["rows_per_s"] == pytest.approx(report["rows"] / elapsed, rel=1e-4)
    assert report["payload_gb_per_s"] == pytest.approx(
        report["payload_bytes"] / elapsed / 1e9, rel=1e-4)


def check_clean(report):
    """No failed requests, every response checked and within tolerance."""
    assert report["errors"] == 0, report["errors_by_code"]
    assert report["warmup_errors"] == 0
    assert report["mismatches"] == 0, report["first_mismatch"]
    assert report["verified"] == report["requests"] + report["warmup_requests"]
    assert report["requests"] > 0


MIX = ["--mix=1x1024:float32:3,8x4096:float16:1,4x1000:bfloat16:1"]


def test_closed_loop_unary(server, tmp_path):
    report, result = load_report(server, tmp_path, "--concurrency=16", "--connections=2",
                                 "--duration=2s", "--warmup=500ms", "--verify", *MIX)
    check_clean(report)
    assert report["mode"] == "closed" and not report["stream"]
    assert report["concurrency"] == 16
    assert report["shapes"] == ["1x1024:float32:3", "8x4096:float16:1", "4x1000:bfloat16:1"]
    # The server batches concurrent requests: at least one request per batch.
    assert report["batch"]["mean_requests"] >= 1
    assert report["batch"]["mean_rows"] >= 1
    # The CPU backend's kernels are its compute; it times the wait for its slot.
    assert report["batch"]["mean_kernel_us"] == pytest.approx(report["batch"]["mean_compute_us"])
    assert report["batch"]["mean_kernel_us"] > 0
    assert report["batch"]["mean_dispatch_us"] > 0
    assert "latency (ms): p50" in result.stdout
    assert re.search(r"compute [\d.]+ us \(kernels [\d.]+ us, dispatch [\d.]+ us\)", result.stdout)


def test_closed_loop_stream_log_softmax(server, tmp_path):
    report, _ = load_report(server, tmp_path, "--stream", "--concurrency=8",
                            "--connections=2", "--duration=2s", "--warmup=500ms", "--verify",
                            "--log", "--temperature=0.7", *MIX)
    check_clean(report)
    assert report["stream"]


def test_open_loop_constant_rate(server, tmp_path):
    report, _ = load_report(server, tmp_path, "--rate=300", "--arrival=constant",
                            "--duration=2s", "--warmup=500ms", "--verify",
                            "--shape=2x512", "--dtype=float32")
    check_clean(report)
    assert report["mode"] == "open"
    assert report["offered_rate"] == 300
    # Constant arrivals: exactly rate x duration intended send times each phase.
    assert report["requests"] == 600
    assert report["warmup_requests"] == 150
    assert report["rows"] == 2 * report["ok"]
    assert report["payload_bytes"] == report["ok"] * 2 * (2 * 512 * 4)


def test_open_loop_poisson_stream(server, tmp_path):
    report, _ = load_report(server, tmp_path, "--rate=400", "--arrival=poisson", "--stream",
                            "--connections=2", "--duration=2s", "--warmup=500ms", "--verify",
                            *MIX)
    check_clean(report)
    assert report["mode"] == "open" and report["stream"]
    # 800 expected; a Poisson count has standard deviation sqrt(800) ~ 28.
    assert 650 < report["requests"] < 950


def test_kserve_protocol_closed_and_open_loop(server, tmp_path):
    # One client for both protocols: ModelInfer on softmax / log_softmax with
    # axis and temperature as parameters, every answer checked.
    before = e2e_util.metric_value(e2e_util.scrape_metrics(server.metrics_address),
                                   "softmax_requests_total",
                                   {"method": "ModelInfer", "code": "OK"}) or 0
    report, result = load_report(server, tmp_path, "--protocol=kserve", "--concurrency=8",
                                 "--connections=2", "--requests=300", "--warmup=0", "--verify",
                                 "--log", "--temperature=0.7", "--axis=0", *MIX)
    check_clean(report)
    assert report["protocol"] == "kserve" and not report["stream"]
    assert "(kserve ModelInfer, unary)" in result.stdout
    report, _ = load_report(server, tmp_path, "--protocol=kserve", "--rate=200",
                            "--requests=100", "--warmup=0", "--verify", "--shape=4x1000",
                            "--dtype=bfloat16")
    check_clean(report)
    after = e2e_util.metric_value(e2e_util.scrape_metrics(server.metrics_address),
                                  "softmax_requests_total", {"method": "ModelInfer", "code": "OK"})
    assert after - before == 400


def test_kserve_protocol_verify_fails_against_echo_server(start_server, tmp_path):
    echo = start_server(device="none")
    report, _ = load_report(echo, tmp_path, "--protocol=kserve", "--requests=20",
                            "--warmup=0", "--verify", expect_rc=1)
    assert report["mismatches"] == 20


def http_infer_ok(server):
    return e2e_util.metric_value(e2e_util.scrape_metrics(server.metrics_address),
                                 "softmax_requests_total",
                                 {"method": "http_infer", "code": "OK"}) or 0


def test_http_protocol_closed_and_open_loop(server, tmp_path):
    # The same client over HTTP/REST with binary tensors: 8 callers over 2
    # HTTP/1.1 connections (6 wait for a free one at any time), every answer
    # checked against the float64 reference.
    before = http_infer_ok(server)
    report, result = load_report(server, tmp_path, "--protocol=http", "--concurrency=8",
                                 "--connections=2", "--requests=300", "--warmup=0", "--verify",
                                 "--log", "--temperature=0.7", "--axis=0", *MIX)
    check_clean(report)
    assert report["protocol"] == "http" and not report["stream"]
    assert report["connections"] == 2 and report["concurrency"] == 8
    assert report["requests"] == 300
    assert "(http POST /v2/models/{model}/infer, binary data)" in result.stdout
    report, _ = load_report(server, tmp_path, "--protocol=http", "--rate=200", "--connections=2",
                            "--requests=100", "--warmup=0", "--verify", "--shape=4x1000",
                            "--dtype=bfloat16")
    check_clean(report)
    assert report["mode"] == "open"
    assert report["payload_bytes"] == 100 * 2 * (4 * 1000 * 2)
    # Every request reached the server's HTTP endpoint, not its gRPC one.
    assert http_infer_ok(server) - before == 400


def test_http_protocol_many_callers_over_few_connections(server, tmp_path):
    report, _ = load_report(server, tmp_path, "--protocol=http", "--concurrency=64",
                            "--connections=3", "--duration=1s", "--warmup=200ms", "--verify",
                            "--mix=2x4096:float32")
    check_clean(report)
    assert report["connections"] == 3


def test_http_protocol_counts_refusals_by_their_code(start_server, tmp_path):
    # The server answers 400 {"error": ...} for a tensor over its limit;
    # the client counts it as INVALID_ARGUMENT, as gRPC would report it.
    small = start_server("--max_tensor_bytes=4096")
    report, result = load_report(small, tmp_path, "--protocol=http", "--requests=10",
                                 "--warmup=0", "--shape=2x1024", "--dtype=float32")
    assert report["errors"] == 10 and report["ok"] == 0
    assert report["errors_by_code"] == {"INVALID_ARGUMENT": 10}


def test_http_protocol_on_the_grpc_port_says_which_port(server):
    result = e2e_util.run_load(server.grpc_address, "--quiet", "--protocol=http",
                               "--requests=10", "--connect_timeout=5s", timeout=60)
    assert result.returncode == 1
    assert "UNAVAILABLE" in result.stderr and "--http_address" in result.stderr, result.stderr


def test_unknown_protocol_is_refused(server):
    result = run_load(server, "--requests=10", "--protocol=rest")
    assert result.returncode != 0, result.stderr
    assert "want softmax.v1, kserve or http" in result.stderr, result.stderr


def test_request_count_limit(server, tmp_path):
    report, _ = load_report(server, tmp_path, "--requests=500", "--concurrency=8",
                            "--warmup=0", "--verify")
    check_clean(report)
    assert report["requests"] == 500
    assert report["warmup_requests"] == 0


@pytest.mark.parametrize("protocol", ["softmax.v1", "http"])
def test_verify_fails_against_echo_server(start_server, tmp_path, protocol):
    echo = start_server(device="none")
    report, result = load_report(echo, tmp_path, f"--protocol={protocol}", "--requests=50",
                                 "--concurrency=4", "--warmup=0", "--verify", expect_rc=1)
    assert report["ok"] == 50
    assert report["mismatches"] == 50
    assert "out of tolerance" in report["first_mismatch"]
    assert "verify failed" in result.stderr


def test_echo_server_without_verify_measures_the_transport(start_server, tmp_path):
    echo = start_server(device="none")
    report, _ = load_report(echo, tmp_path, "--concurrency=8", "--duration=1s", "--warmup=200ms",
                            "--mix=8x4096:float16")
    assert report["errors"] == 0
    assert report["requests"] > 0
    assert report["payload_bytes"] == report["ok"] * 2 * (8 * 4096 * 2)


def test_chunked_stream_verified(server, tmp_path):
    # Chunks that split elements, tensors of one chunk and of several, and
    # answers that come back in several chunks (at least 64 KiB each).
    report, _ = load_report(server, tmp_path, "--stream", "--chunk_bytes=70001",
                            "--concurrency=4", "--connections=2", "--requests=40", "--warmup=0",
                            "--verify", "--mix=2x50000:float32,3x30000:float16,1x100:bfloat16")
    check_clean(report)


def test_chunked_stream_verify_fails_against_echo_server(start_server, tmp_path):
    echo = start_server(device="none")
    report, _ = load_report(echo, tmp_path, "--stream", "--chunk_bytes=100000", "--requests=8",
                            "--concurrency=2", "--warmup=0", "--verify", "--mix=2x50000:float32",
                            expect_rc=1)
    assert report["ok"] == 8
    assert report["mismatches"] == 8
    assert report["payload_bytes"] == 8 * 2 * (2 * 50000 * 4)


def test_chunk_bytes_needs_the_stream(server):
    result = run_load(server, "--chunk_bytes=1000", "--requests=1")
    assert result.returncode != 0
    assert "--chunk_bytes needs --stream" in result.stderr


def test_csv_appends_one_row_per_run(server, tmp_path):
    path = tmp_path / "runs.csv"
    for concurrency in (1, 4):
        result = run_load(server, f"--csv={path}", f"--concurrency={concurrency}",
                          "--requests=100", "--warmup=0", "--label=cpu")
        assert result.returncode == 0, result.stderr
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["concurrency"] for row in rows] == ["1", "4"]
    for row in rows:
        assert row["label"] == "cpu"
        assert int(row["requests"]) == 100 == int(row["ok"]) + int(row["errors"])
        assert float(row["p50_us"]) <= float(row["p99_us"]) <= float(row["max_us"])


def test_bad_arguments_exit_2(server):
    result = run_load(server, "--concurrency=0")
    assert result.returncode == 2
    assert "--concurrency" in result.stderr


def test_unreachable_server_exits_1(tmp_path):
    result = e2e_util.run_load("127.0.0.1:1", "--quiet", "--duration=1s",
                               "--connect_timeout=1s", timeout=60)
    assert result.returncode == 1
    assert "UNAVAILABLE" in result.stderr


def test_shape_and_dtype_make_a_single_payload(server, tmp_path):
    report, _ = load_report(server, tmp_path, "--shape=3x100", "--dtype=bfloat16",
                            "--requests=40", "--concurrency=4", "--warmup=0", "--verify")
    check_clean(report)
    assert report["shapes"] == ["3x100:bfloat16:1"]
    assert report["rows"] == 3 * report["ok"]
    assert report["payload_bytes"] == report["ok"] * 2 * (3 * 100 * 2)


def test_mix_file_adds_to_mix(server, tmp_path):
    mix_file = tmp_path / "mix.txt"
    mix_file.write_text("# two more entries\n2x64:float16:2\n\n1x1K:bf16  # 1024 wide\n")
    report, _ = load_report(server, tmp_path, "--mix=1x128:float32", f"--mix_file={mix_file}",
                            "--requests=80", "--concurrency=4", "--warmup=0", "--verify")
    check_clean(report)
    assert report["shapes"] == ["1x128:float32:1", "2x64:float16:2", "1x1024:bfloat16:1"]
    # Weights 1:2:1 over 80 requests: 20 + 40 x 2 + 20 rows.
    assert report["rows"] == 20 + 80 + 20


def test_http_target_must_be_plain_http(server):
    result = e2e_util.run_load("https://127.0.0.1:8443", "--quiet", "--protocol=http",
                               "--requests=10", timeout=60)
    assert result.returncode == 2
    assert "--target=https://127.0.0.1:8443: this client speaks plain HTTP" in result.stderr


@pytest.mark.parametrize("args,expected", [
    (["--shape=1x1024:float32"], "--mix=1x1024:float32"),
    (["--mix=1x8:float32", "--shape=4x4"], "do not combine"),
    (["--mix=2,1024:float16"], "mix entry \"2\""),
    (["--mix_file=/nonexistent/mix.txt"], "cannot open"),
    (["--check"], "--check does not apply to load"),
    (["--duration=0s"], "--duration"),
    (["--requests=-1"], "--requests"),
    (["--timeout_ms=-5"], "--timeout_ms"),
    (["--protocol=kserve", "--stream", "--chunk_bytes=1000"],
     "--chunk_bytes needs --protocol=softmax.v1"),
    (["--protocol=http", "--stream"], "--stream is not available with --protocol=http"),
])
def test_usage_errors_name_the_flag(server, args, expected):
    result = run_load(server, "--requests=10", *args)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr, result.stderr
