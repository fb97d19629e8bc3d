#!/usr/bin/env python3
"""Batching benchmark: many concurrent callers with small requests, served
with dynamic batching and with batching turned off (--max_batch_rows=1),
same server binary, same client, one run.

For each mode it starts softmax-server, checks correctness first (a short
`softmax-client load --verify` run: every response against the float64 CPU
reference), warms up, scrapes /metrics, runs the measured load, scrapes again,
and reports from the difference of the two scrapes:
  - rows and requests per kernel launch (softmax_batch_rows_sum /
    softmax_kernel_launches_total), batches, launches per second;
  - device and pinned memory obtained from CUDA (cudaMalloc / cudaHostAlloc)
    after warm-up: softmax_allocator_backing_allocations_total must not move;
and from the client: requests/s, p50/p99 latency, mean batch size seen in the
responses' timing. Writes results.json and table.md to --out.

  python3 -m bench.batching.run --bundle=dist/softmax-serve-0.1.0-linux-x86_64 \\
      --device=cuda --out=$OUT/batching
"""

import argparse
import json
import os
import re
import sys
import tempfile
import urllib.request

from bench.lib.load import run_load
from bench.lib.server import Server, find_binaries

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def scrape(address):
    """{(name, labels): value} of a /metrics page."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as page:
        text = page.read().decode()
    samples = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            samples[(match.group(1), match.group(2) or "")] = float(match.group(3))
    return samples


def total(samples, name, label_filter=""):
    return sum(v for (n, labels), v in samples.items() if n == name and label_filter in labels)


def load(client, address, args, json_path):
    """The report of a load run that must succeed (exits otherwise)."""
    command, result, report = run_load(client, address, args, json_path)
    if result.returncode != 0 or report is None:
        sys.exit(f"load failed ({result.returncode}): {' '.join(command)}\n"
                 f"{result.stdout}\n{result.stderr}")
    return report


def run_mode(name, server_bin, client_bin, device, extra, load_args, duration, workdir):
    try:
        server = Server(server_bin, *extra, device=device, http=False,
                        log_path=os.path.join(workdir, f"server-{name}.log"))
    except RuntimeError as error:
        sys.exit(str(error))
    try:
        # Correctness first: every response of a short run checked.
        load(client_bin, server.grpc_address,
             [*load_args, "--verify", "--duration=1s", "--warmup=0s"],
             os.path.join(workdir, f"verify-{name}.json"))
        load(client_bin, server.grpc_address, [*load_args, "--duration=2s", "--warmup=0s"],
             os.path.join(workdir, f"warmup-{name}.json"))
        before = scrape(server.metrics_address)
        report = load(client_bin, server.grpc_address,
                      [*load_args, f"--duration={duration}s", "--warmup=0s"],
                      os.path.join(workdir, f"load-{name}.json"))
        after = scrape(server.metrics_address)
    finally:
        server.close()

    def delta(metric, label_filter=""):
        return total(after, metric, label_filter) - total(before, metric, label_filter)

    launches = delta("softmax_kernel_launches_total")
    batches = delta("softmax_batches_total")
    rows = delta("softmax_batch_rows_sum")
    requests = delta("softmax_batch_requests_sum")
    return {
        "mode": name,
        "server_args": extra,
        "client": report,
        "kernel_launches": launches,
        "batches": batches,
        "rows_per_launch": rows / launches if launches else None,
        "requests_per_launch": requests / launches if launches else None,
        "launches_per_second": launches / duration,
        "backing_allocations_after_warmup": {
            memory: delta("softmax_allocator_backing_allocations_total", f'memory="{memory}"')
            for memory in ("device", "pinned")},
        "allocator_after": {
            f"{metric}{labels}": value for (metric, labels), value in after.items()
            if metric.startswith("softmax_allocator_")},
    }


def pick(report, path):
    """A value from the load client's JSON report by dotted key path."""
    node = report
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", help="release bundle folder (launchers inside)")
    parser.add_argument("--server", help="softmax-server binary (default: SOFTMAX_SERVER_BIN, "
                        "else build/bin/)")
    parser.add_argument("--client", help="softmax-client binary (default: SOFTMAX_CLIENT_BIN, "
                        "else build/bin/)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--shape", default="1x4096:float32")
    parser.add_argument("--duration", type=float, default=10)
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra flag for both servers (repeatable)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    server_bin, client_bin = find_binaries(args.bundle, args.server, args.client)
    os.makedirs(args.out, exist_ok=True)
    load_args = [f"--concurrency={args.concurrency}", f"--connections={args.connections}",
                 f"--mix={args.shape}"]
    modes = [("batched", list(args.server_arg)),
             ("unbatched", [*args.server_arg, "--max_batch_rows=1"])]
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        for name, extra in modes:
            results.append(run_mode(name, server_bin, client_bin, args.device, extra, load_args,
                                    args.duration, workdir))
            print(f"{name}: done", flush=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"device": args.device, "shape": args.shape,
                   "concurrency": args.concurrency, "connections": args.connections,
                   "duration_s": args.duration, "modes": results}, f, indent=2)

    rate = {r["mode"]: pick(r["client"], "requests_per_s") for r in results}
    lines = [f"# Batching: {args.concurrency} callers, {args.shape}, --device={args.device}",
             "", "| mode | requests/s | p50 ms | p99 ms | rows/launch | requests/launch | "
             "launches/s | mean batch (client) | device allocs after warm-up | "
             "pinned allocs after warm-up |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        c = r["client"]
        p50 = pick(c, "latency_us.p50")
        p99 = pick(c, "latency_us.p99")
        mean_batch = pick(c, "batch.mean_requests")
        allocs = r["backing_allocations_after_warmup"]
        def f(v, scale=1.0, digits=1):
            return "-" if v is None else f"{v * scale:.{digits}f}"
        lines.append(
            f"| {r['mode']} | {f(rate[r['mode']], 1, 0)} | {f(p50, 1e-3, 3)} | {f(p99, 1e-3, 3)} | "
            f"{f(r['rows_per_launch'])} | {f(r['requests_per_launch'])} | "
            f"{f(r['launches_per_second'], 1, 0)} | {f(mean_batch)} | "
            f"{allocs['device']:.0f} | {allocs['pinned']:.0f} |")
    if rate.get("batched") and rate.get("unbatched"):
        lines += ["", f"Throughput batched / unbatched: {rate['batched'] / rate['unbatched']:.2f}x"]
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
