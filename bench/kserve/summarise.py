#!/usr/bin/env python3
"""Summarises pa_bench.py's results.json: table.md (requests/s and p99 per
payload, concurrency and driver, the ratios the targets name, and each
target met or missed), results.csv (one row per measured point) and
plot.png (requests/s and p99 against concurrency). Prints the table.

  python3 -m bench.kserve.summarise RESULTS_JSON [--out DIR]
      (DIR: the JSON's folder by default)

Needs matplotlib for the plot only (skipped, with a note, without it).
"""
import argparse
import csv
import json
import os
import sys

from bench.lib import plot as lib_plot

SERIES = [  # (driver, label)
    ("load", "softmax.v1, load client"),
    ("pa-grpc", "KServe gRPC, perf_analyzer"),
    ("pa-http", "KServe HTTP, perf_analyzer"),
    ("pytriton-grpc", "PyTriton gRPC, perf_analyzer"),
    ("pytriton-http", "PyTriton HTTP, perf_analyzer"),
]
# The targets: (payload, concurrency) points and thresholds.
GRPC_VS_V1_POINTS = [("1x1024:float32", 256), ("64x32000:bfloat16", 16)]
GRPC_VS_V1_MIN = 0.9
HTTP_VS_GRPC_PAYLOAD = "64x32000:bfloat16"
HTTP_VS_GRPC_MIN = 0.7


def fmt(value, digits=1):
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def index_points(results):
    points = {}
    for entry in results["points"]:
        points[(entry["driver"], entry["payload"], entry["concurrency"])] = entry
    return points


def rate(points, driver, payload, concurrency):
    entry = points.get((driver, payload, concurrency))
    return entry.get("requests_per_s") if entry and entry.get("ok") else None


def ratio(a, b):
    return a / b if a is not None and b else None


def cell(points, driver, payload, concurrency):
    entry = points.get((driver, payload, concurrency))
    if entry is None:
        return "-"
    if not entry.get("ok"):
        reason = entry.get("skipped") or entry.get("error") or f"exit {entry.get('exit_code')}"
        return "failed" if len(reason) > 60 else f"failed ({reason})"
    return f"{fmt(entry['requests_per_s'])} ({fmt(entry.get('p99_ms'), 2)})"


def table(results):
    points = index_points(results)
    drivers = [d for d, _ in SERIES if any(k[0] == d for k in points)]
    payloads = list(dict.fromkeys(e["payload"] for e in results["points"]))
    concurrencies = sorted({e["concurrency"] for e in results["points"]})
    labels = dict(SERIES)
    head = (["payload", "c"] + [labels[d] + " req/s (p99 ms)" for d in drivers]
            + ["gRPC / v1", "HTTP / gRPC", "gRPC / PyTriton"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for payload in payloads:
        for c in concurrencies:
            grpc = rate(points, "pa-grpc", payload, c)
            row = [payload, str(c)] + [cell(points, d, payload, c) for d in drivers]
            row += [fmt(ratio(grpc, rate(points, "load", payload, c)), 2),
                    fmt(ratio(rate(points, "pa-http", payload, c), grpc), 2),
                    fmt(ratio(grpc, rate(points, "pytriton-grpc", payload, c)), 2)]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines), points, payloads, concurrencies


def verdict(ok):
    return "met" if ok else "missed"


def targets(points, payloads, concurrencies):
    lines = []
    for payload, c in GRPC_VS_V1_POINTS:
        r = ratio(rate(points, "pa-grpc", payload, c), rate(points, "load", payload, c))
        lines.append(f"- KServe gRPC within 10% of softmax.v1 at {payload}, c={c}: "
                     f"{fmt(r, 2)} -> " + ("not measured" if r is None else
                                            verdict(r >= GRPC_VS_V1_MIN)))
    ratios = [(c, ratio(rate(points, "pa-http", HTTP_VS_GRPC_PAYLOAD, c),
                        rate(points, "pa-grpc", HTTP_VS_GRPC_PAYLOAD, c))) for c in concurrencies]
    measured = [r for _, r in ratios if r is not None]
    lines.append(f"- HTTP binary at least {HTTP_VS_GRPC_MIN}x KServe gRPC at "
                 f"{HTTP_VS_GRPC_PAYLOAD}: " + ", ".join(f"c={c} {fmt(r, 2)}" for c, r in ratios)
                 + " -> " + ("not measured" if not measured else
                             verdict(len(measured) == len(ratios)
                                     and min(measured) >= HTTP_VS_GRPC_MIN)))
    for driver, name in (("pa-grpc", "KServe gRPC"), ("pa-http", "KServe HTTP")):
        ahead, behind, peer_failed, missing = 0, [], [], []
        for payload in payloads:
            for c in concurrencies:
                mine = rate(points, driver, payload, c)
                peer_entry = points.get(("pytriton-grpc", payload, c))
                theirs = rate(points, "pytriton-grpc", payload, c)
                if mine is None or peer_entry is None:
                    missing.append(f"{payload} c={c}")
                elif theirs is None:
                    peer_failed.append(f"{payload} c={c}")
                elif mine > theirs:
                    ahead += 1
                else:
                    behind.append(f"{payload} c={c} ({fmt(mine / theirs, 2)})")
        total = len(payloads) * len(concurrencies)
        text = (f"- {name} ahead of PyTriton (gRPC) at every point: ahead at {ahead} of "
                f"{total}")
        if peer_failed:
            text += f"; PyTriton failed at {', '.join(peer_failed)}"
        if behind:
            text += f"; behind at {', '.join(behind)}"
        if missing:
            text += f"; not measured at {', '.join(missing)}"
        if behind:
            lines.append(text + " -> missed")
        elif missing:
            lines.append(text + " -> not measured everywhere")
        else:
            lines.append(text + " -> met")
    return "\n".join(lines)


def write_csv(results, path):
    fields = ["server", "driver", "protocol", "payload", "concurrency", "requests_per_s",
              "infer_per_s", "p50_ms", "p90_ms", "p99_ms", "avg_ms", "peak_rss_mb", "ok", "exit_code",
              "error", "command"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for entry in results["points"]:
            writer.writerow(entry)


def plot(points, payloads, concurrencies, path):
    series = []
    for index, (driver, label) in enumerate(SERIES):
        by_payload = {}
        for payload in payloads:
            for c in concurrencies:
                entry = points.get((driver, payload, c))
                if entry and entry.get("ok"):
                    by_payload.setdefault(payload, []).append(
                        (c, entry["requests_per_s"], entry["p99_ms"]))
        # One colour per driver in every panel; PyTriton's lines dashed.
        style = "o--" if driver.startswith("pytriton") else "o-"
        series.append(lib_plot.Series(label, style, f"C{index}", by_payload))
    if not lib_plot.throughput_and_p99(path, payloads, concurrencies, series,
                                       column_width=5, height=8):
        return "no plot: matplotlib is missing"
    return f"plot: {path}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    with open(args.results) as f:
        results = json.load(f)
    out = args.out or os.path.dirname(os.path.abspath(args.results))
    text, points, payloads, concurrencies = table(results)
    checks = results.get("validation", [])
    failed_checks = [c for c in checks if not c.get("ok")]
    body = ["Requests/s (p99 ms) per point; perf_analyzer's inferences/s are divided by "
            "the rows of PyTriton's batch dimension (-b), so every column counts requests.",
            "", text, "", "Targets:", "", targets(points, payloads, concurrencies), "",
            f"Answers checked against the float64 reference before timing: {len(checks)} "
            f"checks, {len(failed_checks)} failed"
            + ("." if not failed_checks else ": " + "; ".join(
                f"{c.get('server')} {c.get('protocol')} {c.get('payload')} "
                f"({c.get('error') or c.get('max_rel_error') or c.get('mismatches')})"
                for c in failed_checks) + ". FIGURES OF A FAILED CHECK DO NOT COUNT.")]
    if results.get("peer_start_s") is not None:
        body.append(f"PyTriton start-up: {results['peer_start_s']} s.")
    markdown = "\n".join(body) + "\n"
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(markdown)
    write_csv(results, os.path.join(out, "results.csv"))
    print(markdown)
    if payloads:
        print(plot(points, payloads, concurrencies, os.path.join(out, "plot.png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
