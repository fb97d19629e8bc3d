#!/usr/bin/env python3
"""softmax.v1 against the Open Inference Protocol (KServe v2) over gRPC
(ModelInfer) and over HTTP/REST with binary tensors (POST
/v2/models/{model}/infer) on one server, driven by the same client
(`softmax-client load --protocol=softmax.v1|kserve|http`), so that the ratios
measure the protocol and nothing else.

Validate, then time: each payload is first checked over every protocol
(`--verify`, every answer against the float64 reference; against the echo,
--device=none, whose answers are the inputs, every answer must merely
arrive without error). Then each point
runs --rounds rounds; a round times the protocols back to back, the order
reversed every other round, and each ratio of a point is the median of the
per-round ratios of requests per second: KServe gRPC / softmax.v1 and
HTTP / KServe gRPC.

Connections: the gRPC protocols multiplex, so C callers share min(C, 8)
connections (bench/service/run.py's setting); HTTP/1.1 carries one request
per connection, so http gets C connections, one per caller, and the server
sees C requests in flight over every protocol.

Usage (from the checkout root):
  python3 -m bench.kserve.protocols --bundle=DIR [--device=cuda]
      [--protocols=softmax.v1,kserve,http] [--points=1x1024:float32@256,...]
      [--rounds=3] [--duration=3] [--out=DIR]
Prints a Markdown table; writes protocols.json under --out.
"""

import argparse
import json
import os
import statistics
import sys

from bench.lib.load import run_load
from bench.lib.server import Server, find_binaries

PROTOCOLS = ("softmax.v1", "kserve", "http")
# Table headings.
NAMES = {"softmax.v1": "softmax.v1", "kserve": "KServe gRPC", "http": "KServe HTTP"}
# Per-round ratios reported: (numerator, denominator) protocols.
RATIOS = (("kserve", "softmax.v1"), ("http", "kserve"))
# The two target points: the small-request rate and a large payload.
DEFAULT_POINTS = "1x1024:float32@256,64x32000:bfloat16@16"
# gRPC connections per point, as the service benchmark uses: min(callers, this).
CONNECTIONS = 8


def parse_points(text):
    points = []
    for item in text.split(","):
        spec, concurrency = item.split("@")
        points.append((spec, int(concurrency)))
    return points


def parse_protocols(text):
    protocols = [p for p in text.split(",") if p]
    unknown = [p for p in protocols if p not in PROTOCOLS]
    if unknown or not protocols or len(set(protocols)) != len(protocols):
        raise argparse.ArgumentTypeError(
            f"want distinct protocols among {', '.join(PROTOCOLS)}, got {text!r}")
    return tuple(protocols)


def connections(protocol, concurrency):
    """One HTTP/1.1 connection per caller; the gRPC ones multiplex."""
    return concurrency if protocol == "http" else min(concurrency, CONNECTIONS)


def load(client, server, protocol, spec, concurrency, extra, work):
    args = [f"--protocol={protocol}", f"--mix={spec}", f"--concurrency={concurrency}",
            f"--connections={connections(protocol, concurrency)}", *extra]
    address = server.http_address if protocol == "http" else server.grpc_address
    _, result, report = run_load(client, address, args, os.path.join(work, "point.json"))
    return result, report, "softmax-client load " + " ".join(args)


def ratio_key(numerator, denominator):
    return f"{numerator}/{denominator}"


def format_table(protocols, results):
    """The Markdown table: req/s (p99 ms) per protocol, then each ratio's
    median with its rounds in parentheses."""
    ratios = [(n, d) for n, d in RATIOS if n in protocols and d in protocols]
    heading = (["payload", "callers"]
               + [f"{NAMES[p]} req/s (p99 ms)" for p in protocols]
               + [f"{NAMES[n]} / {NAMES[d]}, median (rounds)" for n, d in ratios])
    lines = ["", "| " + " | ".join(heading) + " |",
             "|---|---:|" + "---:|" * len(protocols) + "---|" * len(ratios)]
    for e in results:
        cells = [e["payload"], str(e["concurrency"])]
        for protocol in protocols:
            p = e.get(protocol)
            cells.append(f"{p['requests_per_s']:,.0f} ({p['p99_ms']:.2f})" if p else "failed")
        for n, d in ratios:
            ratio = e["ratios"].get(ratio_key(n, d), {})
            if ratio.get("median") is None:
                cells.append("-")
            else:
                rounds = ", ".join(f"{r:.3f}" for r in ratio["rounds"])
                cells.append(f"{ratio['median']:.3f} ({rounds})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", required=True,
                        help="release bundle (make gpu-bundle), or a build's bin folder: "
                             "where softmax-server and softmax-client are")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--protocols", type=parse_protocols, default=PROTOCOLS,
                        help="comma-separated, timed in this order (reversed every other "
                             "round); default softmax.v1,kserve,http")
    parser.add_argument("--points", default=DEFAULT_POINTS,
                        help="comma-separated PAYLOAD@CALLERS, PAYLOAD as --mix takes it")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per round")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    server_bin, client_bin = find_binaries(args.bundle)
    protocols = args.protocols
    server = Server(server_bin, device=args.device, http="http" in protocols, metrics=False,
                    log_path=os.path.join(args.out, "server.log"))
    results, failed = [], False
    try:
        for spec, concurrency in parse_points(args.points):
            echo = args.device == "none"
            for protocol in protocols:
                result, report, _ = load(client_bin, server, protocol, spec, 2,
                                         ["--requests=32", "--warmup=0",
                                          *([] if echo else ["--verify"])], args.out)
                ok = (result.returncode == 0 and report is not None and report["ok"] == 32
                      and report["mismatches"] == 0)
                print(f"{'answered' if echo else 'verify'} {spec} {protocol}: "
                      f"{'ok' if ok else 'FAILED'}", flush=True)
                if not ok:
                    print(result.stdout + result.stderr, file=sys.stderr)
                    failed = True
            if failed:
                break
            rounds = {p: [] for p in protocols}
            commands = {}
            for r in range(args.rounds):
                for protocol in (protocols if r % 2 == 0 else protocols[::-1]):
                    _, report, commands[protocol] = load(
                        client_bin, server, protocol, spec, concurrency,
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
            entry = {"payload": spec, "concurrency": concurrency, "commands": commands,
                     "ratios": {}}
            for numerator, denominator in RATIOS:
                if numerator not in protocols or denominator not in protocols:
                    continue
                per_round = [n["requests_per_s"] / d["requests_per_s"]
                             for n, d in zip(rounds[numerator], rounds[denominator])
                             if n and d and d["requests_per_s"] > 0]
                entry["ratios"][ratio_key(numerator, denominator)] = {
                    "median": statistics.median(per_round) if per_round else None,
                    "rounds": per_round}
            for protocol in protocols:
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
        server.close()

    print(format_table(protocols, results))
    with open(os.path.join(args.out, "protocols.json"), "w") as f:
        json.dump({"device": args.device, "rounds": args.rounds, "duration_s": args.duration,
                   "protocols": list(protocols), "points": results}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
