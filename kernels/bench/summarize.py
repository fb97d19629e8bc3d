#!/usr/bin/env python3
"""Prints the markdown tables of a softmax_bench.json (for bench/results/README.md).

    python3 -m kernels.bench.summarize softmax_bench.json
"""
import json
import math
import sys

PEERS = ["quack", "liger_cutedsl", "liger_triton", "flashinfer", "torch_compile", "torch", "triton"]
LIBRARIES = ["quack", "liger_cutedsl", "liger_triton", "flashinfer"]


def geomean(v):
    return math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")


def best(r, names):
    found = [(r[f"{p}_gbps"], p) for p in names if r.get(f"{p}_gbps")]
    return max(found) if found else (None, None)


def main(path):
    rows = json.load(open(path))
    copy = lambda r: r["copy_gbps"]
    f = lambda v: f"{v:.0f}" if v else "-"
    ratio = lambda a, b: f"{a / b:.2f}" if a and b else "-"
    # Other builds timed beside ours (--variant NAME=lib): ours / each, per point.
    variants = sorted({k[len("variant_"):-len("_gbps")] for r in rows for k in r
                       if k.startswith("variant_") and k.endswith("_gbps")})
    print("| case | dtype | shape | kernels | ours | copy | QuACK | Liger CuTe | Liger Triton "
          "| FlashInfer | torch.compile | torch | ours / copy | ours / best peer (which) |"
          + "".join(f" ours / {v} |" for v in variants))
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|" + "---:|" * len(variants))
    for r in rows:
        shape = f"{r['M']} x {r['N']}" if r["N"] else f"{r['tensors']} tensors"
        if r.get("dim") == 0:
            shape = f"dim 0 of [{r['M']}, {r['N']}]"
        gb, name = best(r, PEERS)
        print(f"| {r['case']} | {r['dtype']} | {shape} | {r.get('ours_kernels') or ''} "
              f"| {f(r.get('ours_gbps'))} | {f(copy(r))} "
              + "".join(f"| {f(r.get(p + '_gbps'))} " for p in
                        ("quack", "liger_cutedsl", "liger_triton", "flashinfer", "torch_compile",
                         "torch"))
              + f"| {ratio(r.get('ours_gbps'), copy(r))} | {ratio(r.get('ours_gbps'), gb)} ({name}) |"
              + "".join(f" {ratio(r.get('ours_gbps'), r.get(f'variant_{v}_gbps'))} |"
                        for v in variants))
    print()
    for v in variants:
        line = []
        for label, keep in (("sweep", ("sweep",)), ("huge", ("huge",)), ("axis", ("axis",)),
                            ("ragged", ("ragged",))):
            q = [r["ours_gbps"] / r[f"variant_{v}_gbps"] for r in rows if r["case"] in keep
                 and r.get("ours_gbps") and r.get(f"variant_{v}_gbps")]
            if q:
                line.append(f"{label} {geomean(q):.3f} ({min(q):.3f}-{max(q):.3f}, {len(q)} points)")
        print(f"- ours / {v}, geometric mean (range): " + "; ".join(line))
    for label, keep in (("sweep", ("sweep",)), ("huge rows and non-last axes", ("huge", "axis")),
                        ("ragged", ("ragged",))):
        sel = [r for r in rows if r["case"] in keep and r.get("ours_gbps")]
        if not sel:
            continue
        oc = [r["ours_gbps"] / copy(r) for r in sel]
        op = [r["ours_gbps"] / best(r, PEERS)[0] for r in sel if best(r, PEERS)[0]]
        print(f"- {label} ({len(sel)} points): ours/copy min {min(oc, default=float('nan')):.3f}, "
              f"geometric mean {geomean(oc):.3f}; ours/best peer min "
              f"{min(op, default=float('nan')):.3f}, geometric mean {geomean(op):.3f}")
    vs = [(r["ours_gbps"] / best(r, LIBRARIES)[0], r) for r in rows
          if r.get("ours_gbps") and best(r, LIBRARIES)[0]]
    if vs:
        worst = min(vs, key=lambda t: t[0])
        print(f"- where QuACK, Liger or FlashInfer runs ({len(vs)} points): ours / best of them min "
              f"{worst[0]:.3f} ({worst[1]['dtype']} N={worst[1]['N']}), geometric mean "
              f"{geomean([v for v, _ in vs]):.3f}; below 0.98 at "
              + (", ".join(f"{r['dtype']} {r['N']} ({v:.2f})" for v, r in vs if v < 0.98)
                 or "no point"))
    for r in rows:
        if r["case"] == "ragged" and r.get("torch_ms"):
            print(f"- ragged {r['dtype']}: ours {r['ours_ms'] * 1000:.1f} us in one launch, "
                  f"64 torch calls {r['torch_ms'] * 1000:.1f} us (ratio {r['ours_ms'] / r['torch_ms']:.3f})")


if __name__ == "__main__":
    main(sys.argv[1])
