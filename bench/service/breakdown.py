#!/usr/bin/env python3
"""Where the server's time went, from bench/service/run.py results.

Reads one or more results.json files (each a folder of run.py's output, or
the file itself) and prints, per payload, concurrency and label, every
round's requests/s and the means of the responses' timing: queue (admission
to the batch's submit), dispatch (submit to the start of its compute),
compute, of which kernels (the GPU's own time), and requests per batch. A
label is the folder's name with the --strip prefix removed, or the device
for the echo, so A/B folders line up side by side.

Usage:
  breakdown.py [--strip=PREFIX] [--markdown] RESULTS...
e.g. breakdown.py --strip=ab-idle- ab-idle-*/
in the unpacked gpu-check.tgz of `scripts/gpu-check.sh BUNDLE OUT ab-idle`.
"""

import argparse
import json
import os
import re
import sys


def load(path):
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    with open(path) as f:
        return path, json.load(f)


def label_of(path, device, strip):
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    if device == "none":
        return "none"
    return re.sub(f"^{re.escape(strip)}", "", folder) if strip else folder


def rows(paths, strip):
    """(payload, concurrency, label, round, report) for every round found."""
    out = []
    for path in paths:
        path, data = load(path)
        for point in data.get("points", []):
            for index, report in enumerate(point.get("rounds", [])):
                out.append((point["payload"], point["concurrency"],
                            label_of(path, point["device"], strip), index, report))
    return out


def fields(report):
    batch = report.get("batch", {})
    return [report.get("requests_per_s", 0.0), batch.get("mean_queue_us", 0.0),
            batch.get("mean_dispatch_us", 0.0), batch.get("mean_compute_us", 0.0),
            batch.get("mean_kernel_us", 0.0), batch.get("mean_requests", 0.0)]


HEADER = ["payload", "c", "label", "req/s", "queue us", "dispatch us", "compute us",
          "kernels us", "req/batch"]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strip", default="", help="prefix removed from folder names")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    parser.add_argument("results", nargs="+")
    args = parser.parse_args(argv)
    found = rows(args.results, args.strip)
    if not found:
        print("breakdown: no rounds in the results given", file=sys.stderr)
        return 1
    # Settings together, their rounds (folders named ROUND-SETTING) in order.
    found.sort(key=lambda r: (r[0], r[1], r[2] != "none", re.sub(r"^\d+-", "", r[2]), r[2],
                              r[3]))
    if args.markdown:
        print("| " + " | ".join(HEADER) + " |")
        print("|---|---:|---|" + "---:|" * (len(HEADER) - 3))
    else:
        print("%-18s %5s %-22s %10s %9s %11s %11s %11s %9s" % tuple(HEADER))
    for payload, c, label, _, report in found:
        rps, queue, dispatch, compute, kernels, per_batch = fields(report)
        if args.markdown:
            print(f"| {payload} | {c} | {label} | {rps:,.0f} | {queue:.1f} | {dispatch:.1f} | "
                  f"{compute:.1f} | {kernels:.1f} | {per_batch:.2f} |")
        else:
            print("%-18s %5d %-22s %10.0f %9.1f %11.1f %11.1f %11.1f %9.2f"
                  % (payload, c, label, rps, queue, dispatch, compute, kernels, per_batch))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
