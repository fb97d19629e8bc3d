"""bench/soak/soak.py in 20 seconds on the CPU backend: every protocol of the
normal load answered and verified, one abuse burst with every case answered
as promised, samples taken, and the report's counts consistent. (Whether
memory is flat needs minutes: the tolerance is opened wide here, and the
judging itself is checked on made-up samples.)"""

import json
import os
import subprocess
import sys

import e2e_util
from bench.soak import watch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_soak_smoke(tmp_path):
    out = tmp_path / "soak"
    command = [sys.executable, "-m", "bench.soak.soak", f"--server={e2e_util.SERVER_BIN}",
               "--device=cpu", "--duration=20", "--warmup=8", "--burst-every=30",
               "--sample-every=1", "--callers=4", "--bulk-callers=2", "--tolerance=100",
               f"--out={out}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=150, cwd=REPO)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "PASSED" in result.stdout
    report = json.loads((out / "soak.json").read_text())
    assert report["failures"] == [] and report["wrong"] == 0
    assert report["bursts"] == 1
    for case, entry in report["abuse"].items():
        assert entry["runs"] == 1 and entry["unexpected"] == [], (case, entry)
    assert report["abuse"]["too_big_tensors"]["last"]["gzip_bomb"] == "UNIMPLEMENTED"
    protocols = report["by_protocol"]
    assert set(protocols) == {"v1-unary", "v1-stream", "kserve-grpc", "kserve-http",
                              "bulk-unary", "bulk-stream"}
    for name, row in protocols.items():
        assert row["ok"] > 0, name
    samples = report["samples"]
    assert len(samples) >= 15
    assert all(s["rss_bytes"] > 0 and s["fds"] > 0 for s in samples)
    assert samples[-1]["softmax_held_bytes"] == 0
    assert report["verdicts"]["rss_bytes"]["ok"] is True
    assert report["verdicts"]["pinned_bytes"]["ok"] is None  # no allocator on the CPU


# The soak of default flags: long enough for four of the 30 s connection ages
# the server had by default before (a stream then died at 30 s).
DEFAULTS_SOAK_S = 130


def test_soak_of_default_flags_fails_no_call_and_keeps_every_stream(tmp_path):
    """The server with its default flags under unary, stream, KServe gRPC and
    KServe HTTP callers that never retry, a plain grpcio SoftmaxStream and a
    tritonclient stream that stay open the whole soak, and softmax-client
    load (unary and --stream): every call answered right, none failed, and
    neither long stream ended by the server."""
    out = tmp_path / "soak"
    command = [sys.executable, "-m", "bench.soak.soak", f"--server={e2e_util.SERVER_BIN}",
               "--device=cpu", f"--duration={DEFAULTS_SOAK_S}", "--warmup=30", "--no-abuse",
               "--sample-every=2", "--callers=4", "--bulk-callers=2", "--tolerance=100",
               f"--out={out}"]
    result = subprocess.run(command, capture_output=True, text=True,
                            timeout=DEFAULTS_SOAK_S + 150, cwd=REPO)
    print(result.stdout[-3000:])
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    report = json.loads((out / "soak.json").read_text())
    assert report["failures"] == [] and report["wrong"] == 0
    assert report["settings"]["abuse"] is False and report["bursts"] == 0
    # Default flags: the soak added none of its own.
    assert not [a for a in report["settings"]["server_args"]
                if a.startswith(("--max_", "--shutdown"))], report["settings"]["server_args"]
    for name, row in report["by_protocol"].items():
        assert row["ok"] > 0, name
        assert all(not codes for codes in row["errors"].values()), (name, row["errors"])
    streams = report["long_streams"]
    assert set(streams) == {"v1-long-stream", "kserve-grpc-stream"}, streams
    for name, entry in streams.items():
        assert entry["ended_early"] is None, (name, entry)
        assert entry["lived_s"] >= DEFAULTS_SOAK_S - 5, (name, entry)
        assert entry["answered"] == entry["sent"] > 50, (name, entry)


def _samples(values, every=2.0):
    return [{"t": i * every, "rss_bytes": v} for i, v in enumerate(values)]


def test_judge_passes_burst_spikes_and_fails_a_creep():
    # (warm-up: the first five samples, one of them a burst's spike)
    spikes = [100, 100, 160, 100, 100] + ([100] * 9 + [190]) * 5
    verdict = watch.judge(_samples(spikes), warmup_s=10, tolerance=0.05)["rss_bytes"]
    assert verdict["ok"] is True and verdict["peak"] == 190, verdict
    creep = [100] * 5 + [100 + i for i in range(50)]  # the level rises 40%
    verdict = watch.judge(_samples(creep), 10, 0.05)["rss_bytes"]
    assert verdict["ok"] is False and verdict["growth"] > 0.3, verdict
    backing = [{"t": i * 2.0, "pinned_backing_allocations": 3 + (i > 10) * i}
               for i in range(30)]
    assert watch.judge(backing, 10, 0.05)["pinned_backing_allocations"]["ok"] is False
    assert watch.judge(backing, 10, 0.05)["rss_bytes"]["ok"] is None


def test_a_rare_failure_keeps_its_detail_after_many_expected_refusals():
    from bench.soak import traffic

    class Bursts:
        on = True

        def active(self):
            return self.on

    bursts = Bursts()
    tally = traffic.Tally(bursts)
    for i in range(50):  # expected refusals in a burst fill the examples first
        tally.add("v1-unary", "UNAVAILABLE", detail=f"budget spent {i}")
    bursts.on = False
    tally.add("kserve-http", "TRANSPORT", detail="ConnectionResetError: reset by peer")
    tally.add("kserve-http", "TRANSPORT", detail="second of its kind")
    assert tally.total("TRANSPORT", "steady") == 2
    transport = [e for e in tally.examples if "TRANSPORT" in e]
    assert len(transport) == 1 and "ConnectionResetError" in transport[0], tally.examples
    assert "(steady, " in transport[0]
    assert len(tally.examples) == 21


def test_a_scrape_counts_as_failed_only_when_its_retry_fails_too(monkeypatch):
    outcomes = []

    def fake_metrics(address):
        if outcomes.pop(0):
            return {"softmax_held_bytes": 0.0}
        raise ConnectionError("Remote end closed connection without response")

    monkeypatch.setattr(watch, "server_metrics", fake_metrics)
    monkeypatch.setattr(watch, "SCRAPE_RETRY_PAUSE_S", 0.0)
    sampler = watch.Sampler(os.getpid(), "unused", 1.0, None, dict, 0.0)
    outcomes[:] = [True, False, True, False, False]
    for _ in range(3):
        sampler.sample()
    assert len(sampler.retried_scrapes) == 1
    assert len(sampler.failed_scrapes) == 1 and "again" in sampler.failed_scrapes[0]
    assert [s.get("softmax_held_bytes") for s in sampler.samples] == [0.0, 0.0, None]
    assert outcomes == []
