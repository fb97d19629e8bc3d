#!/usr/bin/env python3
"""Transport benchmark: payload GB/s of plain gRPC against request size, for
the echo server (--device=none) and a computing server, beside raw loopback
TCP measured in the same run (bench/transport/tcp_ceiling).

For every variant (a pair of softmax-server / softmax-client binaries, e.g.
the code before and after a change, with optional client arguments) and every
server device, one server starts up front on a kernel-picked port and stays
up (variants of the same server binary share it). --chunk-bytes adds, beside
the last variant (unary calls), the same binaries on SoftmaxStream with each
tensor whole and in chunks of each given size (`load --stream
--chunk_bytes=N`). Then:
  1. validate: a short `load --verify` run per checked size against each
     variant's computing server (every response against the float64 CPU
     reference); the script exits non-zero when one fails;
  2. time: `softmax-client load` in closed loop, --callers requests in flight
     over as many connections, one float32 tensor of 1 x (size / 4) per
     request, for each size; within a size the variants alternate which goes
     first from round to round;
  3. the ceiling: tcp_ceiling in echo mode (the same pattern without gRPC)
     at every size over --callers connections, and in stream mode (one
     direction, one connection and --callers connections).
Payload GB/s is the load client's: request plus response tensor bytes per
second; tcp_ceiling's echo counts the same way, its stream one direction.

Writes to --out: results.json (every load report and ceiling figure),
table.md (the table printed last) and plot.png (GB/s per connection against
request size; matplotlib).

Example (the GPU machine, a bundle carrying the code before in before/):
  python3 -m bench.transport.run --lib-dir=$B/lib --tcp-ceiling=$B/bin/tcp_ceiling \\
      --variant=before:before/softmax-server:before/softmax-client \\
      --variant=after:$B/bin/softmax-server:$B/bin/softmax-client \\
      --devices=none,cuda --out=$OUT/transport
Locally, from a build tree, with defaults (build/bin, --devices=none,cpu).
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

from bench.lib import load
from bench.lib.server import REPO, Server

DEFAULT_SIZES = "64K,256K,1M,4M,16M,64M"
DEFAULT_CHUNKS = "1M"


def parse_size(text):
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
    number = text[:-1] if scale != 1 else text
    return int(number) * scale


def size_label(size):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}iB"
    return f"{size} B"


def shape_of(size):
    """A 1 x N float32 tensor of `size` bytes."""
    if size % 4:
        raise ValueError(f"size {size} is not a whole number of float32 elements")
    return f"1x{size // 4}:float32"


def run_ceiling(binary, mode, size, connections, seconds, json_path, env):
    command = [binary, f"--mode={mode}", f"--bytes={size}", f"--connections={connections}",
               f"--seconds={seconds}", f"--json={json_path}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    figures = None
    if os.path.exists(json_path):
        with open(json_path) as f:
            figures = json.load(f)
        os.unlink(json_path)
    if result.returncode != 0 or figures is None or not figures.get("valid"):
        print(f"tcp_ceiling failed: {' '.join(command)}\n{result.stdout}{result.stderr}",
              file=sys.stderr)
        return None
    return figures


def fmt(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def per_connection(report, callers):
    if report is None or report.get("ok", 0) == 0 or report.get("errors"):
        return None
    return report["payload_gb_per_s"] / callers


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:SERVER_BIN:CLIENT_BIN[:CLIENT_ARGS] (repeatable; "
                             "CLIENT_ARGS space-separated; default "
                             "current:build/bin/softmax-server:build/bin/softmax-client)")
    parser.add_argument("--chunk-bytes", default=DEFAULT_CHUNKS,
                        help="chunk sizes (K/M suffixes, comma-separated) for the variants "
                             "added beside the last one: NAME-stream (whole tensors on the "
                             f"stream) and NAME-chunkSIZE; empty adds none (default "
                             f"{DEFAULT_CHUNKS})")
    parser.add_argument("--lib-dir", default="",
                        help="prepended to LD_LIBRARY_PATH of every process (a bundle's lib/)")
    parser.add_argument("--tcp-ceiling", default=os.path.join(REPO, "build", "bin", "tcp_ceiling"))
    parser.add_argument("--devices", default="none,cpu",
                        help="server devices, comma-separated (none = the echo)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES,
                        help=f"request tensor sizes in bytes, K/M suffixes (default {DEFAULT_SIZES})")
    parser.add_argument("--verify-sizes", default="64K,4M,64M",
                        help="sizes checked against the reference before timing")
    parser.add_argument("--callers", type=int, default=4,
                        help="requests in flight, each on its own connection (default 4)")
    parser.add_argument("--duration", type=float, default=2.0, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per point")
    parser.add_argument("--rounds", type=int, default=1, help="rounds per point (median kept)")
    parser.add_argument("--ceiling-seconds", type=float, default=1.5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ)
    if args.lib_dir:
        env["LD_LIBRARY_PATH"] = args.lib_dir + (
            ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    variants = []
    for spec in args.variant or [
            "current:" + os.path.join(REPO, "build", "bin", "softmax-server") + ":" +
            os.path.join(REPO, "build", "bin", "softmax-client")]:
        name, server, client, *extra = spec.split(":", 3)
        variants.append({"name": name, "server": server, "client": client,
                         "args": extra[0].split() if extra else []})
    chunks = [parse_size(s) for s in args.chunk_bytes.split(",") if s]
    if chunks:
        last = variants[-1]
        variants.append(dict(last, name=last["name"] + "-stream", args=last["args"] + ["--stream"]))
        for chunk in chunks:
            label = size_label(chunk).replace(" ", "").replace("iB", "")
            variants.append(dict(last, name=f"{last['name']}-chunk{label}",
                                 args=last["args"] + ["--stream", f"--chunk_bytes={chunk}"]))
    devices = [d for d in args.devices.split(",") if d]
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    verify_sizes = [parse_size(s) for s in args.verify_sizes.split(",") if s]
    computing = [d for d in devices if d != "none"]
    work = args.out

    results = {"settings": vars(args), "started": datetime.datetime.now().isoformat(),
               "machine": {"host": platform.node(), "cpus": os.cpu_count(),
                           "os": platform.platform()},
               "load": [], "verify": [], "ceiling": []}
    servers = {}
    failed = False
    try:
        for variant in variants:
            for device in devices:
                if (variant["server"], device) not in servers:
                    servers[(variant["server"], device)] = Server(
                        variant["server"], device=device, http=False, metrics=False,
                        log_path=os.path.join(work, f"server-{variant['name']}-"
                                              f"{device.replace(':', '-')}.log"),
                        env=env)

        # 1. Validate.
        for variant in variants:
            for device in computing:
                address = servers[(variant["server"], device)].grpc_address
                for size in verify_sizes:
                    command, result, report = load.run_load(
                        variant["client"], address,
                        [f"--mix={shape_of(size)}", "--concurrency=2", "--connections=2",
                         "--warmup=0", "--requests=4", "--verify", *variant["args"]],
                        os.path.join(work, "verify.json"), timeout=600, env=env)
                    ok = (result.returncode == 0 and report is not None and
                          report["verified"] > 0 and report["mismatches"] == 0 and
                          report["errors"] == 0)
                    failed |= not ok
                    results["verify"].append({"variant": variant["name"], "device": device,
                                              "bytes": size, "ok": ok,
                                              "verified": report and report["verified"]})
                    print(f"verify {variant['name']:>8} {device:>6} {size_label(size):>8}: "
                          f"{'ok' if ok else 'FAILED'}", flush=True)
                    if not ok:
                        print(result.stdout + result.stderr, file=sys.stderr)
        if failed:
            print("run.py: validation failed; not timing", file=sys.stderr)
            return 1

        # 2. Time.
        for size in sizes:
            for device in devices:
                rounds = {v["name"]: [] for v in variants}
                for round_index in range(args.rounds):
                    order = variants if round_index % 2 == 0 else variants[::-1]
                    for variant in order:
                        load_args = [f"--mix={shape_of(size)}", f"--concurrency={args.callers}",
                                     f"--connections={args.callers}",
                                     f"--warmup={args.warmup}s", f"--duration={args.duration}s",
                                     f"--label={variant['name']}/{device}/r{round_index}",
                                     *variant["args"]]
                        command, result, report = load.run_load(
                            variant["client"],
                            servers[(variant["server"], device)].grpc_address, load_args,
                            os.path.join(work, "point.json"), timeout=600, env=env)
                        rounds[variant["name"]].append(report)
                        gbps = report and report["payload_gb_per_s"]
                        print(f"{size_label(size):>8} {device:>6} {variant['name']:>8} "
                              f"r{round_index}: {fmt(gbps, 3)} GB/s "
                              f"({report and report['requests_per_s']:.1f} req/s, errors "
                              f"{report and report['errors']})", flush=True)
                for variant in variants:
                    measured = [r for r in rounds[variant["name"]] if r is not None]
                    measured.sort(key=lambda r: r["payload_gb_per_s"])
                    median = measured[(len(measured) - 1) // 2] if measured else None
                    results["load"].append({
                        "variant": variant["name"], "device": device, "bytes": size,
                        "rounds": rounds[variant["name"]], "report": median,
                        "gb_per_s_per_connection": per_connection(median, args.callers)})

        # 3. The ceiling.
        for size in sizes:
            figures = run_ceiling(args.tcp_ceiling, "echo", size, args.callers,
                                  args.ceiling_seconds, os.path.join(work, "tcp.json"), env)
            results["ceiling"].append({"mode": "echo", "bytes": size, "figures": figures})
            print(f"{size_label(size):>8} tcp echo x{args.callers}: "
                  f"{fmt(figures and figures['gb_per_s'], 3)} GB/s", flush=True)
        for connections in sorted({1, args.callers}):
            figures = run_ceiling(args.tcp_ceiling, "stream", 1 << 20, connections,
                                  args.ceiling_seconds, os.path.join(work, "tcp.json"), env)
            results["ceiling"].append({"mode": "stream", "connections": connections,
                                       "figures": figures})
            print(f"tcp stream x{connections}: {fmt(figures and figures['gb_per_s'], 3)} GB/s",
                  flush=True)
    finally:
        for server in servers.values():
            server.close()

    with open(os.path.join(work, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    table = write_table(results, variants, devices, sizes, args)
    with open(os.path.join(work, "table.md"), "w") as f:
        f.write(table + "\n")
    write_plot(os.path.join(work, "plot.png"), results, variants, devices, sizes, args)
    print(table)
    return 0


def lookup(results, variant, device, size):
    for entry in results["load"]:
        if (entry["variant"], entry["device"], entry["bytes"]) == (variant, device, size):
            return entry["gb_per_s_per_connection"]
    return None


def ceiling(results, mode, size=None, connections=None):
    for entry in results["ceiling"]:
        if entry["mode"] != mode or entry["figures"] is None:
            continue
        if size is not None and entry.get("bytes") != size:
            continue
        if connections is not None and entry.get("connections") != connections:
            continue
        return entry["figures"]["gb_per_s_per_connection"]
    return None


def write_table(results, variants, devices, sizes, args):
    columns = [(v["name"], d) for d in devices for v in variants]
    header = "| request | " + " | ".join(f"{d} {v}" for v, d in columns) + " | TCP echo |"
    lines = [
        f"GB/s of payload per connection ({args.callers} callers on {args.callers} connections; "
        "request + response tensor bytes per second, divided by the connections)",
        "",
        header,
        "|---:|" + "---:|" * (len(columns) + 1),
    ]
    for size in sizes:
        cells = [fmt(lookup(results, v, d, size)) for v, d in columns]
        lines.append(f"| {size_label(size)} | " + " | ".join(cells) +
                     f" | {fmt(ceiling(results, 'echo', size=size))} |")
    single = ceiling(results, "stream", connections=1)
    several = ceiling(results, "stream", connections=args.callers)
    lines += ["", f"Raw TCP stream, one direction: {fmt(single)} GB/s on one connection, "
              f"{fmt(several)} GB/s per connection over {args.callers}."]
    # The targets: 64 MiB at least as fast per connection as 4 MiB, and at
    # least half the single raw TCP stream.
    big, mid = max(sizes), 4 << 20
    if mid in sizes:
        lines.append("")
        for v in variants:
            for d in devices:
                b, m = lookup(results, v["name"], d, big), lookup(results, v["name"], d, mid)
                if b is None or m is None:
                    continue
                versus_tcp = f", {b / single:.2f}x the TCP stream" if single else ""
                lines.append(f"- {d} {v['name']}: {size_label(big)} / {size_label(mid)} = "
                             f"{b / m:.2f}{versus_tcp}")
    return "\n".join(lines)


def write_plot(path, results, variants, devices, sizes, args):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("run.py: matplotlib missing; no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    markers = ["o", "s", "^", "D", "v", "x"]
    index = 0
    for device in devices:
        for variant in variants:
            points = [(s, lookup(results, variant["name"], device, s)) for s in sizes]
            points = [(s, g) for s, g in points if g is not None]
            # The first of several variants (the code before) dashed.
            ax.plot([s for s, _ in points], [g for _, g in points],
                    marker=markers[index % len(markers)],
                    linestyle="--" if variant is variants[0] and len(variants) > 1 else "-",
                    label=f"gRPC {device} ({variant['name']})")
            index += 1
    echo = [(s, ceiling(results, "echo", size=s)) for s in sizes]
    echo = [(s, g) for s, g in echo if g is not None]
    ax.plot([s for s, _ in echo], [g for _, g in echo], "k:", label="raw TCP echo")
    single = ceiling(results, "stream", connections=1)
    if single:
        ax.axhline(single, color="grey", linewidth=1, label="raw TCP stream, 1 connection")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([size_label(s) for s in sizes])
    ax.set_xlabel("request tensor size")
    ax.set_ylabel(f"payload GB/s per connection ({args.callers} callers)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
