#!/usr/bin/env python3
"""Service benchmark: softmax-server computing softmax beside the same server
answering with --device=none (its input echoed straight from the reactor, the
transport's ceiling), driven by `softmax-client load` in closed loop over a
sweep of concurrencies and payloads. Server and client share the host and talk
over loopback.

Both servers start once, up front, each on its own kernel-picked port, and
stay up for the whole run. For each payload it first checks correctness (a
short `load --verify` run against the computing server), then measures every
(payload, concurrency) point in --rounds rounds. A round times the computing
server and the echo back to back, and the order alternates between rounds
(round 0: computing then none; round 1: none then computing; ...), so neither
always goes first. The echo's own throughput drifts (by 10-30% over a minute,
or between fresh servers, on some hosts), so a ratio is only taken within a
round: each round's computing req/s over the same round's none req/s. A
point's ratio is the median of its per-round ratios; its req/s, GB/s and
latencies come from its median round by req/s (the lower middle one for an
even count). Writes to --out:
  results.json   every round's full load report per (device, payload,
                 concurrency), the median round's as "report", the
                 per-round ratios, plus the run's settings
  results.csv    one row per load run (the client's CSV columns; the label
                 is DEVICE/rN, N the round)
  table.md       softmax next to none, with the median ratio and its range
  plot.png       requests/s and p99 latency against concurrency, median
                 rounds (matplotlib)

Binaries: --bundle DIR (a release bundle from deploy/make-bundle.sh, whose
launchers set up its libraries), or --server/--client, or the environment
variables SOFTMAX_SERVER_BIN / SOFTMAX_CLIENT_BIN, else build/bin/ of this
checkout. Needs only the Python standard library; matplotlib for the plot
(installed with Debian's python3-matplotlib when missing and --install-deps).

Examples:
  python3 -m bench.service.run --device=cpu --duration=3 --out=/tmp/service-cpu
  python3 -m bench.service.run --bundle=dist/softmax-serve-0.1.0-linux-x86_64 --device=cuda \\
      --rounds=5 --out=$OUT/service-h200
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench.lib import load, plot
from bench.lib.cli import comma_list
from bench.lib.server import REPO, Server, add_server_arguments, find_binaries

DEFAULT_PAYLOADS = ["1x1024:float32", "8x4096:float16", "64x32000:bfloat16", "1x16M:float32"]
ITEM_SIZE = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2}


def payload_bytes(spec):
    """Request tensor bytes of a DIMSxDIMS:DTYPE payload."""
    dims, _, dtype = spec.partition(":")
    dtype = dtype.split(":")[0] or "float32"
    count = 1
    for dim in dims.split("x"):
        scale = 1
        if dim[-1] in "kK":
            scale, dim = 1 << 10, dim[:-1]
        elif dim[-1] in "mM":
            scale, dim = 1 << 20, dim[:-1]
        count *= int(dim) * scale
    return count * ITEM_SIZE[dtype]


def point_args(args, spec, concurrency):
    """`load` arguments for one point: big payloads run a request count
    instead of a duration."""
    connections = min(concurrency, args.connections)
    common = [f"--mix={spec}", f"--concurrency={concurrency}",
              f"--connections={connections}", f"--warmup={args.warmup}s",
              f"--timeout_ms={args.timeout_ms}"]
    if args.stream:
        common.append("--stream")
    if payload_bytes(spec) > args.big_bytes:
        return common + [f"--requests={max(args.big_requests, 2 * concurrency)}"]
    return common + [f"--duration={args.duration}s"]


def verify_payload(args, client_bin, address, spec, work):
    """Validates before timing: every response of a short run against the
    computing server checked against the float64 CPU reference."""
    _, result, report = load.run_load(
        client_bin, address,
        [f"--mix={spec}", "--concurrency=2", "--warmup=0",
         f"--requests={2 if payload_bytes(spec) > args.big_bytes else 64}",
         "--verify", f"--timeout_ms={args.timeout_ms}"],
        os.path.join(work, "verify.json"))
    ok = result.returncode == 0
    print(f"   verify {spec}: {'ok' if ok else 'FAILED'} "
          f"({report and report['verified']} responses)", flush=True)
    if not ok:
        print(result.stdout + result.stderr, file=sys.stderr)
    return {"ok": ok, "verified": report and report["verified"],
            "mismatches": report and report["mismatches"]}


def measure_point(args, client_bin, servers, devices, spec, concurrency, csv_path, work):
    """One (payload, concurrency) point: --rounds rounds, each timing every
    server back to back, the order alternating between rounds so that
    neither always runs first (on a warmer or cooler host). Returns one
    entry per device."""
    entries = {device: {"device": device, "payload": spec, "concurrency": concurrency}
               for device in devices}
    inflight = concurrency * payload_bytes(spec)
    if inflight > args.max_inflight_bytes:
        skipped = (f"skipped: {concurrency} x {payload_bytes(spec) >> 20} MiB in flight > "
                   f"--max-inflight-bytes")
        for entry in entries.values():
            entry["skipped"] = skipped
        print(f"   {spec:>20} c={concurrency:<4} {skipped}", flush=True)
        return list(entries.values())

    commands = {device: [] for device in devices}
    exit_codes = {device: [] for device in devices}
    for entry in entries.values():
        entry["rounds"] = []
    for round_index in range(args.rounds):
        order = devices if round_index % 2 == 0 else devices[::-1]
        for device in order:
            load_args = point_args(args, spec, concurrency) + [
                f"--label={device}/r{round_index}"]
            _, result, report = load.run_load(client_bin, servers[device].grpc_address,
                                              load_args, os.path.join(work, "point.json"),
                                              csv_path)
            commands[device].append("softmax-client load " + " ".join(load_args))
            exit_codes[device].append(result.returncode)
            entries[device]["rounds"].append(report)
            prefix = f"   {spec:>20} c={concurrency:<4} r{round_index} {device:>6}"
            if report is None:
                print(f"{prefix} FAILED: {result.stderr.strip()}", flush=True)
                continue
            print(f"{prefix} {report['requests_per_s']:>11,.1f} req/s "
                  f"{report['payload_gb_per_s']:8.3f} GB/s  p50 "
                  f"{report['latency_us']['p50'] / 1e3:9.3f} ms  p99 "
                  f"{report['latency_us']['p99'] / 1e3:9.3f} ms  errors "
                  f"{report['errors']}", flush=True)

    for device, entry in entries.items():
        # The median round stands for the point (consumers read "report");
        # the command is that round's, and the exit code the first failing
        # round's, if any.
        middle = median_round(entry["rounds"])
        shown = 0 if middle is None else middle
        entry["command"] = commands[device][shown]
        entry["exit_code"] = next((code for code in exit_codes[device] if code != 0), 0)
        entry["exit_codes"] = exit_codes[device]
        entry["median_round"] = middle
        entry["report"] = None if middle is None else entry["rounds"][middle]
    if len(devices) > 1:
        ours = entries[args.device]
        ours["ratios"] = round_ratios(ours, entries["none"])
        measured = [r for r in ours["ratios"] if r is not None]
        ours["ratio"] = statistics.median(measured) if measured else None
        print(f"   {spec:>20} c={concurrency:<4} {args.device}/none median "
              f"{fmt(ours['ratio'], 3)} over rounds {ratio_range(ours['ratios'])}", flush=True)
    return list(entries.values())


def machine_description():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = ""
    if shutil.which("nvidia-smi"):
        probe = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                                "--format=csv,noheader"], capture_output=True, text=True)
        gpu = probe.stdout.strip()
    return {"host": platform.node(), "cpu": cpu, "cpus": os.cpu_count(), "gpu": gpu,
            "os": platform.platform()}


def git_revision():
    try:
        # "-dirty" when the checkout has uncommitted changes (the binaries may
        # then not match the revision exactly).
        return subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty",
                               "--abbrev=12"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def fmt(value, digits=1):
    return "-" if value is None else f"{value:,.{digits}f}"


def median_round(reports):
    """Index of the median round by requests/s among the rounds that produced
    a report (the lower middle one for an even count), or None."""
    measured = [i for i, report in enumerate(reports) if report is not None]
    if not measured:
        return None
    measured.sort(key=lambda i: reports[i]["requests_per_s"])
    return measured[(len(measured) - 1) // 2]


def round_ratios(ours, ceiling):
    """Per round: the computing server's requests/s over the echo's in the
    same round (None where either is missing), so that a ratio never spans
    the drift between rounds."""
    ratios = []
    for mine, echo in zip(ours["rounds"], ceiling["rounds"]):
        if mine and echo and echo["requests_per_s"] > 0:
            ratios.append(mine["requests_per_s"] / echo["requests_per_s"])
        else:
            ratios.append(None)
    return ratios


def ratio_range(ratios):
    measured = [r for r in ratios or [] if r is not None]
    if not measured:
        return "-"
    low, high = min(measured), max(measured)
    return f"{low:.2f}" if len(measured) == 1 else f"{low:.2f}-{high:.2f}"


def method_note(device, rounds, with_echo=True):
    runs = f"Each point ran {rounds} round{'s' if rounds != 1 else ''}"
    if not with_echo:
        return (f"{runs} of {device} alone, without the echo; req/s, GB/s, p50 and p99 are from "
                f"the median round by req/s.")
    return (f"{runs}; a round measures {device} and none back to back, alternating which "
            f"goes first (round 0: {device} first). req/s, GB/s, p50 and p99 are from the "
            f"median round by req/s; {device}/none is the median of the per-round ratios "
            f"({device} req/s over the same round's none req/s), so it need not equal the "
            f"quotient of the two req/s columns, whose median rounds may differ; min-max is "
            f"the per-round ratios' range.")


def write_table(path, results, device, payloads, concurrencies, rounds, with_echo):
    by_key = {(r["device"], r["payload"], r["concurrency"]): r for r in results}
    lines = [
        f"| payload | concurrency | {device} req/s | {device} GB/s | {device} p50 ms | "
        f"{device} p99 ms | none req/s | none GB/s | none p99 ms | {device}/none | "
        f"min-max | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for spec in payloads:
        for c in concurrencies:
            ours = by_key.get((device, spec, c))
            ceiling = by_key.get(("none", spec, c))

            def get(r, key, scale=1.0):
                if r is None or r.get("report") is None:
                    return None
                value = r["report"]
                for part in key.split("."):
                    value = value[part]
                return value * scale

            ratios = (ours or {}).get("ratios")
            notes = []
            for r in (ours, ceiling):
                if r is None:
                    continue
                if r.get("skipped"):
                    if r["skipped"] not in notes:
                        notes.append(r["skipped"])
                    continue
                # Errors or failed runs in any round, not only the median one.
                for index, report in enumerate(r.get("rounds", [])):
                    if report is None:
                        notes.append(f"{r['device']} r{index}: no report")
                    elif report["errors"]:
                        notes.append(f"{r['device']} r{index}: {report['errors']} errors "
                                     f"{report['errors_by_code']}")
            lines.append(
                f"| {spec} | {c} | {fmt(get(ours, 'requests_per_s'))} | "
                f"{fmt(get(ours, 'payload_gb_per_s'), 3)} | "
                f"{fmt(get(ours, 'latency_us.p50', 1e-3), 3)} | "
                f"{fmt(get(ours, 'latency_us.p99', 1e-3), 3)} | "
                f"{fmt(get(ceiling, 'requests_per_s'))} | "
                f"{fmt(get(ceiling, 'payload_gb_per_s'), 3)} | "
                f"{fmt(get(ceiling, 'latency_us.p99', 1e-3), 3)} | "
                f"{fmt((ours or {}).get('ratio'), 2)} | {ratio_range(ratios)} | "
                f"{'; '.join(notes)} |")
    lines += ["", method_note(device, rounds, with_echo)]
    text = "\n".join(lines)
    with open(path, "w") as f:
        f.write(text + "\n")
    return text


def write_plot(path, results, device, payloads, concurrencies, title):
    """requests/s and p99 against concurrency for `device` and the echo, the
    median round of each point."""
    series = []
    for name, style in ((device, "o-"), ("none", "s--")):
        points = {}
        for r in results:
            if r["device"] == name and r.get("report") and r["report"]["ok"] > 0:
                points.setdefault(r["payload"], []).append(
                    (r["concurrency"], r["report"]["requests_per_s"],
                     r["report"]["latency_us"]["p99"] / 1e3))
        label = f"{name} (echo ceiling)" if name == "none" else f"softmax ({name})"
        series.append(plot.Series(label, style, None, points))
    if not plot.throughput_and_p99(path, payloads, concurrencies, series, title):
        print("run.py: matplotlib missing; no plot (apt-get install python3-matplotlib, or "
              "pass --install-deps)", file=sys.stderr)
        return False
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser, client=True)
    parser.add_argument("--out", required=True,
                        help="folder for results.json, results.csv, table.md, plot.png")
    parser.add_argument("--concurrency", type=comma_list(int), default="1,16,64,256",
                        help="comma-separated closed-loop concurrencies")
    parser.add_argument("--payloads", type=comma_list(), default=",".join(DEFAULT_PAYLOADS),
                        help="comma-separated DIMSxDIMS:DTYPE payloads (dims may end in K/M)")
    parser.add_argument("--duration", type=float, default=5.0,
                        help="measured seconds per point (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0,
                        help="warm-up seconds per point, excluded (default 1)")
    parser.add_argument("--connections", type=int, default=8,
                        help="connections per point: min(concurrency, this) (default 8)")
    parser.add_argument("--big-bytes", type=int, default=16 << 20,
                        help="payloads above this many bytes run a request count instead of "
                             "a duration (default 16 MiB)")
    parser.add_argument("--big-requests", type=int, default=16,
                        help="measured requests per big point: max(this, 2 x concurrency)")
    parser.add_argument("--max-inflight-bytes", type=float, default=8 * 2**30,
                        help="skip points whose concurrency x request bytes exceeds this "
                             "(client and server memory; default 8 GiB)")
    parser.add_argument("--timeout-ms", type=int, default=600000, dest="timeout_ms")
    parser.add_argument("--stream", action="store_true",
                        help="SoftmaxStream (one stream per connection) instead of unary calls")
    parser.add_argument("--skip-none", action="store_true",
                        help="only the computing server (no echo ceiling)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds per point, each timing the computing server and the "
                             "echo back to back in alternating order; the table shows the "
                             "median round and the median ratio (default 3)")
    parser.add_argument("--install-deps", action="store_true",
                        help="apt-get install python3-matplotlib when it is missing")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    concurrencies, payloads = args.concurrency, args.payloads
    server_bin, client_bin = find_binaries(args.bundle, args.server, args.client)
    for binary in (server_bin, client_bin):
        if not os.access(binary, os.X_OK):
            sys.exit(f"run.py: {binary} is not executable; build first or pass --bundle / "
                     "--server / --client")
    if args.install_deps:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                            "python3-matplotlib"], check=False)
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="softmax-bench-")
    csv_path = os.path.join(args.out, "results.csv")
    if os.path.exists(csv_path):
        os.unlink(csv_path)
    # Enough server memory budget for every point that runs: each request
    # holds its input and output, and half the budget bounds the queue's bytes.
    server_args = [f"--max_held_bytes={int(4 * args.max_inflight_bytes)}", *args.server_arg]

    # --device=none is its own ceiling: one server, no ratio.
    with_echo = not args.skip_none and args.device != "none"
    devices = [args.device] + (["none"] if with_echo else [])
    results = []
    verification = {}
    started = time.time()
    # Both servers up front, for the whole run: a round can then time them
    # back to back, a few seconds apart instead of a whole sweep apart.
    servers = {}
    try:
        for role, device in zip(("computing", "echo"), devices):
            server = Server(server_bin, *server_args, device=device, http=False,
                            metrics=False, log_path=os.path.join(work, f"{role}-{device}.log"))
            servers[device] = server
            device_line = next((line for line in server.output().splitlines()
                                if "device=" in line), "")
            print(f"== {device}: {device_line.strip()} at {server.grpc_address}", flush=True)
        for spec in payloads:
            verification[spec] = verify_payload(
                args, client_bin, servers[args.device].grpc_address, spec, work)
            for c in concurrencies:
                results += measure_point(args, client_bin, servers, devices, spec, c, csv_path,
                                         work)
    finally:
        for server in servers.values():
            server.close()

    command = " ".join(["python3 -m bench.service.run"] + sys.argv[1:])
    meta = {
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_revision": git_revision(),
        "machine": machine_description(),
        "device": args.device,
        "server_args": server_args,
        "settings": {k: v for k, v in vars(args).items() if k not in ("server_arg",)},
        "verification": verification,
        "rounds": args.rounds,
        "method": method_note(args.device, args.rounds, with_echo),
        "wall_seconds": round(time.time() - started, 1),
    }
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "points": results}, f, indent=1)
    table = write_table(os.path.join(args.out, "table.md"), results, args.device, payloads,
                        concurrencies, args.rounds, with_echo)
    title = (f"softmax-server --device={args.device} vs --device=none, closed loop over "
             f"loopback; {meta['machine']['cpus']} CPUs {meta['machine']['cpu']}"
             + (f"; {meta['machine']['gpu']}" if meta['machine']['gpu'] else "")
             + f"; rev {meta['git_revision']}; median of {args.rounds} rounds")
    # Each point's "report" is its median round, so the plot shows those.
    write_plot(os.path.join(args.out, "plot.png"), results, args.device, payloads,
               concurrencies, title)
    shutil.rmtree(work, ignore_errors=True)
    print()
    print(table)
    failed = [s for s, v in verification.items() if not v["ok"]]
    if failed:
        sys.exit(f"run.py: verification failed for {failed}")


if __name__ == "__main__":
    main()
