"""End-to-end test of bench/service/run.py (python -m bench.service.run) on
the CPU backend: a tiny sweep in alternating rounds against the computing
server and the echo, checking that every round's report is kept, that the
table's ratio is the median of the per-round ratios recorded in
results.json, and that results.csv holds one row per load run. Needs no GPU
and no matplotlib (the plot is then left out).
"""

import csv
import json
import os
import statistics
import subprocess
import sys

import e2e_util
from bench.lib.markdown import table_rows

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVICE = os.path.join(REPO, "bench", "service")
BREAKDOWN_PY = os.path.join(SERVICE, "breakdown.py")
PAYLOAD = "1x256:float32"
CONCURRENCIES = [1, 4]
ROUNDS = 2
DEVICES = ["cpu", "none"]


def test_rounds_sweep(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "bench.service.run", f"--server={e2e_util.SERVER_BIN}",
               f"--client={e2e_util.CLIENT_BIN}", "--device=cpu",
               "--server-arg=--max_batch_rows=1024", f"--payloads={PAYLOAD}",
               f"--concurrency={','.join(map(str, CONCURRENCIES))}", f"--rounds={ROUNDS}",
               "--duration=0.3", "--warmup=0.1", f"--out={out}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"

    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["rounds"] == ROUNDS
    # --server-arg reaches the servers' command lines, recorded with the run.
    assert "--max_batch_rows=1024" in data["meta"]["server_args"]
    assert data["meta"]["verification"][PAYLOAD]["ok"]
    points = {(p["device"], p["payload"], p["concurrency"]): p for p in data["points"]}
    for device in DEVICES:
        for c in CONCURRENCIES:
            entry = points[(device, PAYLOAD, c)]
            assert entry["exit_code"] == 0
            assert not entry.get("skipped")
            assert entry["command"].startswith("softmax-client load ")
            assert len(entry["rounds"]) == ROUNDS
            for index, report in enumerate(entry["rounds"]):
                assert report["ok"] > 0
                assert report["errors"] == 0
                assert report["label"] == f"{device}/r{index}"
            # The median round stands for the point.
            assert entry["report"] in entry["rounds"]
            assert entry["report"] == entry["rounds"][entry["median_round"]]

    rows = {int(row["concurrency"]): row for row in table_rows((out / "table.md").read_text())}
    assert sorted(rows) == CONCURRENCIES
    for c in CONCURRENCIES:
        ours, echo = points[("cpu", PAYLOAD, c)], points[("none", PAYLOAD, c)]
        # Each round's ratio compares the two servers within that round.
        ratios = [mine["requests_per_s"] / theirs["requests_per_s"]
                  for mine, theirs in zip(ours["rounds"], echo["rounds"])]
        assert ours["ratios"] == ratios
        assert ours["ratio"] == statistics.median(ratios)
        row = rows[c]
        assert row["payload"] == PAYLOAD
        assert row["cpu/none"] == f"{statistics.median(ratios):.2f}"
        assert row["min-max"] == f"{min(ratios):.2f}-{max(ratios):.2f}"
        # The req/s columns come from the median rounds.
        assert row["cpu req/s"] == f"{ours['report']['requests_per_s']:,.1f}"
        assert row["none req/s"] == f"{echo['report']['requests_per_s']:,.1f}"
    assert "median of the per-round ratios" in (out / "table.md").read_text()

    with open(out / "results.csv", newline="") as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == len(DEVICES) * len(CONCURRENCIES) * ROUNDS
    assert sorted(row["label"] for row in csv_rows) == sorted(
        f"{device}/r{index}" for device in DEVICES for _ in CONCURRENCIES
        for index in range(ROUNDS))
    # Rounds alternate which server runs first: per point, round 0 starts with
    # the computing server and round 1 with the echo.
    for c in CONCURRENCIES:
        labels = [row["label"] for row in csv_rows if int(row["concurrency"]) == c]
        assert labels == ["cpu/r0", "none/r0", "none/r1", "cpu/r1"]

    # breakdown.py: one row per round, the computing server's with the means
    # of its responses' timing (the CPU backend's kernels are its compute).
    result = subprocess.run([sys.executable, BREAKDOWN_PY, "--markdown", str(out)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith(f"| {PAYLOAD} ")]
    assert len(lines) == len(DEVICES) * len(CONCURRENCIES) * ROUNDS
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    for c in CONCURRENCIES:
        for device, label in (("cpu", "out"), ("none", "none")):
            mine = [row for row in cells if row[1] == str(c) and row[2] == label]
            assert [row[3] for row in mine] == [
                f"{report['requests_per_s']:,.0f}"
                for report in points[(device, PAYLOAD, c)]["rounds"]]
            for row, report in zip(mine, points[(device, PAYLOAD, c)]["rounds"]):
                assert row[6] == f"{report['batch']['mean_compute_us']:.1f}"
                assert row[7] == f"{report['batch']['mean_kernel_us']:.1f}"
                if device == "cpu":
                    assert float(row[6]) > 0 and row[6] == row[7]


def test_ab_rounds_alternate(tmp_path):
    """bench/service/ab.sh: every variant and the echo run every point in every
    mode, in the order given in odd rounds and reversed in even ones."""
    import socket
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    bundle = os.path.dirname(os.path.dirname(e2e_util.SERVER_BIN))
    ab_sh = os.path.join(SERVICE, "ab.sh")
    env = dict(os.environ, DEV="cpu", DURATION="0.3s", WARMUP="0.1s", PORT=str(port),
               POINTS="1x64:float32:4 1x32:float16:2:stream 1x64:float32:4:unary:--top_k=3")
    result = subprocess.run(["bash", ab_sh, bundle, str(tmp_path), "2",
                             f"a={e2e_util.SERVER_BIN}", f"b={e2e_util.SERVER_BIN}"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    lines = [line.split() for line in (tmp_path / "ab.txt").read_text().splitlines()]
    runs = [(round_, server, mode, point) for round_, server, mode, point, *_ in lines]
    expected = []
    for round_, order in (("1", ["a", "b", "none"]), ("2", ["none", "b", "a"])):
        for server in order:
            expected += [(round_, server, "unary", "1x64:float32:4"),
                         (round_, server, "stream", "1x64:float32:4"),
                         (round_, server, "stream", "1x32:float16:2"),
                         (round_, server, "unary", "1x64:float32:4:--top_k=3")]
    assert runs == expected
    for _, _, _, _, rate, p50, p99, errors in lines:
        assert float(rate) > 0 and 0 < float(p50) <= float(p99) and errors == "0"
    # ab_table.py: one row per mode, point and server, ratios to the named servers.
    table = subprocess.run([sys.executable, "-m", "bench.service.ab_table", str(tmp_path / "ab.txt"),
                            "--ratio-to", "a", "none"],
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert table.returncode == 0, table.stdout + table.stderr
    rows = [line for line in table.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 3 * 4, table.stdout  # the header, 3 servers at 4 (mode, point) pairs
    assert "| unary | 1x64:float32:4:--top_k=3 | b |" in table.stdout
    assert "2 rounds" in table.stdout
