#!/usr/bin/env python3
"""Service benchmark: softmax-server computing softmax beside the same server
answering with --device=none (its input echoed straight from the reactor, the
transport's ceiling), driven by `softmax-client load` in closed loop over a
sweep of concurrencies and payloads. Server and client share the host and talk
over loopback.

For each payload it first checks correctness (a short `load --verify` run
against the computing server), then times every (device, payload,
concurrency) point, and writes to --out:
  results.json   every point's full load report plus the run's settings
  results.csv    one row per point (the client's CSV columns)
  table.md       softmax next to none, with the throughput ratio
  plot.png       requests/s and p99 latency against concurrency (matplotlib)

Binaries: --bundle DIR (a release bundle from deploy/make-bundle.sh, whose
launchers set up its libraries), or --server/--client, or the environment
variables SOFTMAX_SERVER_BIN / SOFTMAX_CLIENT_BIN, else build/bin/ of this
checkout. Needs only the Python standard library; matplotlib for the plot
(installed with Debian's python3-matplotlib when missing and --install-deps).

Examples:
  bench/service/run.py --device=cpu --duration=3 --out=bench/service/results/cpu
  bench/service/run.py --bundle=dist/softmax-serve-0.1.0-linux-x86_64 --device=cuda \\
      --out=$OUT/service-h200
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LISTENING = re.compile(r"softmax-server: listening grpc=(\S+) metrics=(\S+)")
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


def find_binaries(args):
    if args.bundle:
        return (os.path.join(args.bundle, "softmax-server"),
                os.path.join(args.bundle, "softmax-client"))
    server = args.server or os.environ.get("SOFTMAX_SERVER_BIN") or os.path.join(
        REPO, "build", "bin", "softmax-server")
    client = args.client or os.environ.get("SOFTMAX_CLIENT_BIN") or os.path.join(
        REPO, "build", "bin", "softmax-client")
    return server, client


class Server:
    """softmax-server on loopback with a kernel-picked port."""

    def __init__(self, binary, device, extra_args, log_path):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.args = [binary, "--grpc_address=127.0.0.1:0", "--metrics_address=",
                     f"--device={device}", *extra_args]
        self.process = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        self.address = None
        while time.monotonic() < deadline:
            match = LISTENING.search(self.output())
            if match:
                self.address = match.group(1)
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server did not start: {self.args}\n{self.output()}")

    def output(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def run_load(client, address, load_args, json_path, csv_path=None, timeout=900):
    command = [client, "load", f"--target={address}", "--quiet", f"--json={json_path}",
               *load_args]
    if csv_path:
        command.append(f"--csv={csv_path}")
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    report = None
    if os.path.exists(json_path):
        with open(json_path) as f:
            report = json.load(f)
        os.unlink(json_path)
    return result, report


def point_args(args, spec, concurrency):
    """`load` arguments for one point: big payloads run a request count
    instead of a duration."""
    connections = min(concurrency, args.connections)
    common = [f"--shape={spec}", f"--concurrency={concurrency}",
              f"--connections={connections}", f"--warmup={args.warmup}",
              f"--timeout_ms={args.timeout_ms}"]
    if args.stream:
        common.append("--stream")
    if payload_bytes(spec) > args.big_bytes:
        return common + [f"--requests={max(args.big_requests, 2 * concurrency)}"]
    return common + [f"--duration={args.duration}"]


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


def write_table(path, results, device, payloads, concurrencies):
    by_key = {(r["device"], r["payload"], r["concurrency"]): r for r in results}
    lines = [
        f"| payload | concurrency | {device} req/s | {device} GB/s | {device} p50 ms | "
        f"{device} p99 ms | none req/s | none GB/s | none p99 ms | {device}/none | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
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

            ratio = None
            if get(ours, "requests_per_s") and get(ceiling, "requests_per_s"):
                ratio = get(ours, "requests_per_s") / get(ceiling, "requests_per_s")
            notes = []
            for r in (ours, ceiling):
                if r is not None and r.get("skipped"):
                    if r["skipped"] not in notes:
                        notes.append(r["skipped"])
                elif r is not None and r.get("report") and r["report"]["errors"]:
                    notes.append(f"{r['device']}: {r['report']['errors']} errors "
                                 f"{r['report']['errors_by_code']}")
            lines.append(
                f"| {spec} | {c} | {fmt(get(ours, 'requests_per_s'))} | "
                f"{fmt(get(ours, 'payload_gb_per_s'), 3)} | "
                f"{fmt(get(ours, 'latency_us.p50', 1e-3), 3)} | "
                f"{fmt(get(ours, 'latency_us.p99', 1e-3), 3)} | "
                f"{fmt(get(ceiling, 'requests_per_s'))} | "
                f"{fmt(get(ceiling, 'payload_gb_per_s'), 3)} | "
                f"{fmt(get(ceiling, 'latency_us.p99', 1e-3), 3)} | "
                f"{fmt(ratio, 2)} | {'; '.join(notes)} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return "\n".join(lines)


def write_plot(path, results, device, payloads, concurrencies, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("run.py: matplotlib missing; no plot (apt-get install python3-matplotlib, or "
              "pass --install-deps)", file=sys.stderr)
        return False
    fig, axes = plt.subplots(2, len(payloads), figsize=(4.2 * len(payloads), 7.5),
                             squeeze=False)
    for column, spec in enumerate(payloads):
        for name, style in ((device, "o-"), ("none", "s--")):
            points = [r for r in results if r["device"] == name and r["payload"] == spec
                      and r.get("report") and r["report"]["ok"] > 0]
            points.sort(key=lambda r: r["concurrency"])
            xs = [r["concurrency"] for r in points]
            label = f"{name} (echo ceiling)" if name == "none" else f"softmax ({name})"
            axes[0][column].plot(xs, [r["report"]["requests_per_s"] for r in points], style,
                                 label=label)
            axes[1][column].plot(xs, [r["report"]["latency_us"]["p99"] / 1e3 for r in points],
                                 style, label=label)
        axes[0][column].set_title(spec)
        for row in range(2):
            ax = axes[row][column]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(concurrencies)
            ax.set_xticklabels([str(c) for c in concurrencies])
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xlabel("concurrency (requests in flight)")
        axes[0][column].set_ylabel("requests/s")
        axes[1][column].set_ylabel("p99 latency (ms)")
    axes[0][0].legend(loc="best", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu",
                        help="the computing backend: cpu | cuda | cuda:N | auto (default cpu)")
    parser.add_argument("--bundle", help="release bundle folder (launchers inside)")
    parser.add_argument("--server", help="softmax-server binary")
    parser.add_argument("--client", help="softmax-client binary")
    parser.add_argument("--out", default=os.path.join(REPO, "bench", "service", "results",
                                                      "latest"))
    parser.add_argument("--concurrency", default="1,16,64,256",
                        help="comma-separated closed-loop concurrencies")
    parser.add_argument("--payloads", default=",".join(DEFAULT_PAYLOADS),
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
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra softmax-server flag, repeatable (e.g. --cpu_threads=2)")
    parser.add_argument("--stream", action="store_true",
                        help="SoftmaxStream (one stream per connection) instead of unary calls")
    parser.add_argument("--skip-none", action="store_true",
                        help="only the computing server (no echo ceiling)")
    parser.add_argument("--install-deps", action="store_true",
                        help="apt-get install python3-matplotlib when it is missing")
    args = parser.parse_args()

    concurrencies = [int(c) for c in args.concurrency.split(",")]
    payloads = [p.strip() for p in args.payloads.split(",") if p.strip()]
    server_bin, client_bin = find_binaries(args)
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
    # Enough server queue for every point that runs.
    server_args = [f"--max_queued_bytes={int(2 * args.max_inflight_bytes)}", *args.server_arg]

    devices = [args.device] + ([] if args.skip_none else ["none"])
    results = []
    verification = {}
    started = time.time()
    for device in devices:
        server = Server(server_bin, device, server_args, os.path.join(work, f"{device}.log"))
        device_line = next((line for line in server.output().splitlines()
                            if "device=" in line), "")
        print(f"== {device}: {device_line.strip()} at {server.address}", flush=True)
        try:
            for spec in payloads:
                if device != "none":
                    # Validate before timing: every response of a short run
                    # checked against the float64 CPU reference.
                    result, report = run_load(
                        client_bin, server.address,
                        [f"--shape={spec}", "--concurrency=2", "--warmup=0",
                         f"--requests={2 if payload_bytes(spec) > args.big_bytes else 64}",
                         "--verify", f"--timeout_ms={args.timeout_ms}"],
                        os.path.join(work, "verify.json"))
                    ok = result.returncode == 0
                    verification[spec] = {"ok": ok, "verified": report and report["verified"],
                                          "mismatches": report and report["mismatches"]}
                    print(f"   verify {spec}: {'ok' if ok else 'FAILED'} "
                          f"({report and report['verified']} responses)", flush=True)
                    if not ok:
                        print(result.stdout + result.stderr, file=sys.stderr)
                for c in concurrencies:
                    entry = {"device": device, "payload": spec, "concurrency": c}
                    inflight = c * payload_bytes(spec)
                    if inflight > args.max_inflight_bytes:
                        entry["skipped"] = (f"skipped: {c} x {payload_bytes(spec) >> 20} MiB in "
                                            f"flight > --max-inflight-bytes")
                        results.append(entry)
                        print(f"   {spec:>20} c={c:<4} {entry['skipped']}", flush=True)
                        continue
                    load_args = point_args(args, spec, c) + [f"--label={device}"]
                    result, report = run_load(client_bin, server.address, load_args,
                                              os.path.join(work, "point.json"), csv_path)
                    entry["command"] = "softmax-client load " + " ".join(load_args)
                    entry["exit_code"] = result.returncode
                    entry["report"] = report
                    results.append(entry)
                    if report is None:
                        print(f"   {spec:>20} c={c:<4} FAILED: {result.stderr.strip()}",
                              flush=True)
                        continue
                    print(f"   {spec:>20} c={c:<4} {report['requests_per_s']:>11,.1f} req/s "
                          f"{report['payload_gb_per_s']:8.3f} GB/s  p50 "
                          f"{report['latency_us']['p50'] / 1e3:9.3f} ms  p99 "
                          f"{report['latency_us']['p99'] / 1e3:9.3f} ms  errors "
                          f"{report['errors']}", flush=True)
        finally:
            server.stop()

    command = " ".join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:])
    meta = {
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_revision": git_revision(),
        "machine": machine_description(),
        "device": args.device,
        "server_args": server_args,
        "settings": {k: v for k, v in vars(args).items() if k not in ("server_arg",)},
        "verification": verification,
        "wall_seconds": round(time.time() - started, 1),
    }
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"meta": meta, "points": results}, f, indent=1)
    table = write_table(os.path.join(args.out, "table.md"), results, args.device, payloads,
                        concurrencies)
    title = (f"softmax-server --device={args.device} vs --device=none, closed loop over "
             f"loopback; {meta['machine']['cpus']} CPUs {meta['machine']['cpu']}"
             + (f"; {meta['machine']['gpu']}" if meta['machine']['gpu'] else "")
             + f"; rev {meta['git_revision']}")
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
