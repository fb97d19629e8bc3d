"""`softmax-client load --stream` against a server that ends every stream at
its maximum age (--max_stream_age_s): the client reopens each stream, sends
again exactly what it left unanswered, and runs its whole duration with every
request answered once, on softmax.v1's SoftmaxStream and on KServe's
ModelStreamInfer. A server that is gone for good ends the run non-zero, saying
why, instead of ending it early in silence. (The pip client's Client.stream is
tested the same way in test_python_client.py.)"""

import json
import signal
import threading
import time

import pytest

import e2e_util

STREAM_AGE_S = 2
DURATION_S = 8

# What softmax_requests_total calls each protocol's stream.
STREAM_METHOD = {"softmax.v1": "SoftmaxStream", "kserve": "ModelStreamInfer"}


@pytest.fixture
def aging_server(start_server):
    """A server whose streams end at STREAM_AGE_S and whose connections are
    rotated as often, so reopened streams also find new connections."""
    return start_server(f"--max_stream_age_s={STREAM_AGE_S}",
                        f"--max_connection_age_s={STREAM_AGE_S}")


def run_load(server, tmp_path, *args, timeout=60):
    path = tmp_path / "report.json"
    start = time.monotonic()
    result = e2e_util.run_load(server.grpc_address, "--quiet", f"--json={path}", *args,
                               timeout=timeout)
    wall = time.monotonic() - start
    report = json.loads(path.read_text()) if path.exists() else None
    return result, report, wall


@pytest.mark.parametrize("protocol", ["softmax.v1", "kserve"])
def test_load_stream_runs_its_whole_duration_across_stream_ends(aging_server, tmp_path,
                                                                protocol):
    method = STREAM_METHOD[protocol]
    before = e2e_util.requests_counted(aging_server, "OK", method)
    result, report, wall = run_load(
        aging_server, tmp_path, f"--protocol={protocol}", "--stream", "--verify",
        f"--duration={DURATION_S}s", "--warmup=500ms", "--concurrency=8", "--connections=2",
        "--mix=1x1024:float32:3,4x1000:bfloat16:1")
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    # The whole duration: the measured phase ends with the last answer.
    assert wall >= DURATION_S + 0.5, result.stdout
    assert report["elapsed_s"] >= DURATION_S - 0.5, report
    assert report["ended_early"] == ""
    assert report["errors"] == 0 and report["warmup_errors"] == 0, report["errors_by_code"]
    assert report["mismatches"] == 0, report["first_mismatch"]
    answered = report["requests"] + report["warmup_requests"]
    assert report["verified"] == answered > 0
    # Each of the two streams ends about every STREAM_AGE_S.
    assert report["stream_reopens"] >= 2, report
    assert report["resent_requests"] >= report["resent_after_loss"] >= 0
    assert report["stream_reopens"] > report["streams_lost"] >= 0
    # Every request answered once. The server's own ends (its trailer says
    # so) leave nothing computed unanswered, so after them nothing is
    # computed twice: the server computed exactly what the client accounted
    # (a duplicate or stray answer would also count as a mismatch above). A
    # stream the transport lost instead (a connection reset as the
    # connection ages: 3 of 16 runs beside other end-to-end tests on a
    # 2-core host) may take answers already computed with it; those
    # requests, resent, are computed twice, never more often than resent.
    computed = e2e_util.requests_counted(aging_server, "OK", method) - before
    assert answered <= computed <= answered + report["resent_after_loss"], (computed, answered,
                                                                           report)
    if report["streams_lost"] == 0:
        assert computed == answered, (computed, answered, report)
    assert f"streams:      {report['stream_reopens']} reopened" in result.stdout


def test_load_stream_rides_through_a_restart_on_the_same_port(start_server, tmp_path):
    """SIGTERM drains the server (its streams end with UNAVAILABLE); a new one
    starts on the same port a moment later: the open loop goes on, nothing
    lost, the requests of the gap answered late."""
    first = start_server()
    address = first.grpc_address
    outcome = {}

    def load():
        outcome["result"] = run_load(first, tmp_path, "--stream", "--verify", "--rate=200",
                                     "--duration=6s", "--warmup=0", "--shape=2x256")

    thread = threading.Thread(target=load)
    thread.start()
    time.sleep(2.0)
    assert first.stop(signal.SIGTERM) == 0
    start_server(f"--grpc_address={address}")
    thread.join(timeout=60)
    result, report, _ = outcome["result"]
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert report["errors"] == 0, report["errors_by_code"]
    assert report["mismatches"] == 0, report["first_mismatch"]
    assert report["requests"] == 1200  # constant arrivals: rate x duration
    assert report["stream_reopens"] >= 1, report


def test_load_stream_against_a_server_gone_for_good_exits_1_saying_why(start_server,
                                                                       tmp_path):
    server = start_server()
    outcome = {}

    def load():
        outcome["result"] = run_load(server, tmp_path, "--stream", "--concurrency=4",
                                     "--duration=60s", "--warmup=0", "--shape=2x256")

    thread = threading.Thread(target=load)
    thread.start()
    time.sleep(1.0)
    server.kill()
    thread.join(timeout=60)
    result, report, wall = outcome["result"]
    assert result.returncode == 1, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "the run ended early" in result.stderr and "got no answer" in result.stderr, (
        result.stderr)
    assert "got no answer" in report["ended_early"]
    assert report["errors_by_code"].get("UNAVAILABLE", 0) > 0
    # kStreamReopenPatience (10 s) after the kill, not the 60 s asked for.
    assert wall < 25, wall
