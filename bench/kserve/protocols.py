#!/usr/bin/env python3
"""softmax.v1 against the Open Inference Protocol (KServe v2 ModelInfer) on one
server, driven by the same client (`softmax-client load --protocol=...`), so
that the ratio measures the protocol and nothing else.

Validate, then time: each payload is first checked over both protocols
(`--verify`, every answer against the float64 reference). Then each point
runs --rounds rounds; a round times both protocols back to back, the order
alternating between rounds, and the point's ratio is the median of the
per-round ratios (kserve / softmax.v1 requests per second).

Usage:
  protocols.py --bundle=DIR [--device=cuda] [--points=1x1024:float32@256,...]
               [--rounds=3] [--duration=3] [--out=DIR]
Prints a Markdown table; writes protocols.json under --out.
"""

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "service"))
import run as service  # noqa: E402  (bench/service/run.py: Server, run_load)

PROTOCOLS = ("softmax.v1", "kserve")
# The two target points: the small-request rate and a large payload.
DEFAULT_POINTS = "1x1024:float32@256,64x32000:bfloat16@16"
# Connections per point, as the service benchmark uses: min(callers, this).
CONNECTIONS = 8


def parse_points(text):
    points = []
    for item in text.split(","):
        spec, concurrency = item.split("@")
        points.append((spec, int(concurrency)))
    return points


def load(client, address, protocol, spec, concurrency, extra, work):
    args = [f"--protocol={protocol}", f"--mix={spec}", f"--concurrency={concurrency}",
            f"--connections={min(concurrency, CONNECTIONS)}", *extra]
    result, report = service.run_load(client, address, args, os.path.join(work, "point.json"))
    return result, report, "softmax-client load " + " ".join(args)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", required=True, help="release bundle (make gpu-bundle)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--points", default=DEFAULT_POINTS,
                        help="comma-separated PAYLOAD@CALLERS, PAYLOAD as --mix takes it")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per round")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    server_bin = os.path.join(args.bundle, "softmax-server")
    client_bin = os.path.join(args.bundle, "softmax-client")
    server = service.Server(server_bin, args.device, [], os.path.join(args.out, "server.log"))
    results, failed = [], False
    try:
        for spec, concurrency in parse_points(args.points):
            for protocol in PROTOCOLS:
                result, report, _ = load(client_bin, server.address, protocol, spec, 2,
                                         ["--requests=32", "--warmup=0", "--verify"], args.out)
                ok = result.returncode == 0 and report is not None and report["mismatches"] == 0
                print(f"verify {spec} {protocol}: {'ok' if ok else 'FAILED'}", flush=True)
                if not ok:
                    print(result.stdout + result.stderr, file=sys.stderr)
                    failed = True
            if failed:
                break
            rounds = {p: [] for p in PROTOCOLS}
            commands = {}
            for r in range(args.rounds):
                for protocol in (PROTOCOLS if r % 2 == 0 else PROTOCOLS[::-1]):
                    _, report, commands[protocol] = load(
                        client_bin, server.address, protocol, spec, concurrency,
                        [f"--duration={args.duration}s", f"--warmup={args.warmup}s"], args.out)
                    rounds[protocol].append(report)
                    prefix = f"  {spec} c={concurrency} r{r} {protocol:>10}:"
                    if report is None or report["errors"]:
                        failed = True
                    if report is None:
                        print(f"{prefix} FAILED (no report)", flush=True)
                        continue
                    print(f"{prefix} {report['requests_per_s']:,.0f} req/s p99 "
                          f"{report['latency_us']['p99'] / 1e3:.2f} ms errors {report['errors']}",
                          flush=True)
            ratios = [k["requests_per_s"] / v["requests_per_s"]
                      for v, k in zip(rounds["softmax.v1"], rounds["kserve"]) if v and k]
            entry = {"payload": spec, "concurrency": concurrency, "ratios": ratios,
                     "ratio": statistics.median(ratios) if ratios else None,
                     "commands": commands}
            for protocol in PROTOCOLS:
                ok = [r for r in rounds[protocol] if r]
                if not ok:
                    break
                entry[protocol] = {
                    "requests_per_s": statistics.median(r["requests_per_s"] for r in ok),
                    "p99_ms": statistics.median(r["latency_us"]["p99"] / 1e3 for r in ok),
                    "gb_per_s": statistics.median(r["payload_gb_per_s"] for r in ok),
                }
            results.append(entry)
    finally:
        server.stop()

    print("\n| payload | callers | softmax.v1 req/s (p99 ms) | KServe gRPC req/s (p99 ms) "
          "| KServe / v1, median (rounds) |")
    print("|---|---:|---:|---:|---|")
    for e in results:
        if any(protocol not in e for protocol in PROTOCOLS):
            print(f"| {e['payload']} | {e['concurrency']} | failed | failed | - |")
            continue
        v, k = e["softmax.v1"], e["kserve"]
        print(f"| {e['payload']} | {e['concurrency']} | {v['requests_per_s']:,.0f} "
              f"({v['p99_ms']:.2f}) | {k['requests_per_s']:,.0f} ({k['p99_ms']:.2f}) | "
              f"{e['ratio']:.3f} ({', '.join(f'{r:.3f}' for r in e['ratios'])}) |")
    with open(os.path.join(args.out, "protocols.json"), "w") as f:
        json.dump({"device": args.device, "rounds": args.rounds, "duration_s": args.duration,
                   "points": results}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
