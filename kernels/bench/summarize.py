#!/usr/bin/env python3
"""Prints the markdown tables of a softmax_bench.json (used for results/README.md)."""
import json
import math
import sys


def main(path):
    rows = json.load(open(path))
    print("| case | dtype | shape | kernel | ours | torch | triton | copy | ours/copy | ours/best peer |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        peers = [v for v in (r.get("torch_gbps"), r.get("triton_gbps")) if v]
        best = max(peers) if peers else None
        shape = f"{r['M']} x {r['N']}" if r["N"] else f"{r['tensors']} tensors, {r['elements']} elements"
        if r.get("dim") == 0:
            shape = f"dim 0 of [{r['M']}, {r['N']}]"
        f = lambda v: f"{v:.0f}" if v else "-"
        print(f"| {r['case']} | {r['dtype']} | {shape} | {r.get('ours_kernels') or r.get('ours_path', '')} | {f(r['ours_gbps'])} | "
              f"{f(r.get('torch_gbps'))} | {f(r.get('triton_gbps'))} | {f(r['copy_gbps'])} | "
              f"{r['ours_gbps'] / r['copy_gbps']:.3f} | {r['ours_gbps'] / best:.3f} |")
    print()
    for name, keep in (("sweep", ("sweep",)), ("huge rows and non-last axes", ("huge", "axis")),
                       ("ragged", ("ragged",))):
        sel = [r for r in rows if r["case"] in keep]
        if not sel:
            continue
        oc = [r["ours_gbps"] / r["copy_gbps"] for r in sel]
        op = [r["ours_gbps"] / max(v for v in (r.get("torch_gbps"), r.get("triton_gbps")) if v) for r in sel]
        g = lambda v: math.exp(sum(map(math.log, v)) / len(v))
        print(f"- {name}: ours/copy min {min(oc):.3f}, geometric mean {g(oc):.3f}; "
              f"ours/best peer min {min(op):.3f}, geometric mean {g(op):.3f}")
    for r in rows:
        if r["case"] == "ragged":
            print(f"- ragged {r['dtype']}: ours {r['ours_ms'] * 1000:.1f} us in one launch, "
                  f"64 torch calls {r['torch_ms'] * 1000:.1f} us (ratio {r['ours_ms'] / r['torch_ms']:.3f}), "
                  f"copy of the same bytes {r['copy_ms'] * 1000:.1f} us")


if __name__ == "__main__":
    main(sys.argv[1])
