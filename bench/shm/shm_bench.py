#!/usr/bin/env python3
"""Shared memory against plain gRPC, on a GPU host: perf_analyzer drives the
KServe gRPC endpoint of softmax-server with tensors in the request (plain),
in system shared memory and in CUDA shared memory (perf_analyzer's
--shared-memory=none|system|cuda: it fills its regions once and reuses them),
at each payload and concurrency, beside the device's copy bandwidth (torch,
same run) and the --device=none echo server over plain gRPC.

Effective GB/s = (input + output bytes) x requests/s: the bytes delivered to
the callers per second. Validates first: one request of each payload through
each path is checked against a float64 softmax (tritonclient, shared-memory
utilities); a failed check stops the run.

Usage (from the checkout root):
  python3 -m bench.shm.shm_bench --bundle=DIR --perf-analyzer=PATH --out=DIR
      [--payloads=...] [--concurrency=1,16] [--interval-ms=1500]
Writes OUT/results.json, OUT/table.md and OUT/plot.png; prints the table.
"""

import argparse
import csv
import json
import os
import subprocess
import sys

import numpy as np

from bench.lib import reference
from bench.lib.server import Server

PAYLOADS = {  # name: (model, shape, numpy storage, bytes per element)
    "1x1024 fp32": ("softmax", (1, 1024), np.float32),
    "64x32000 bf16": ("softmax_bf16", (64, 32000), np.uint16),
    "4096x4096 fp32": ("softmax", (4096, 4096), np.float32),
    "1x16M fp32": ("softmax", (1, 1 << 24), np.float32),
}
PATHS = ["none", "system", "cuda"]


def start_server(bundle, device, log_path):
    """The bundle's softmax-server on `device`, gRPC (KServe included) and metrics."""
    return Server(os.path.join(bundle, "softmax-server"), device=device, http=False,
                  log_path=log_path, startup_timeout=120)


def copy_bandwidth():
    """Device-to-device copy of 2 GiB with torch, GB/s with read + write counted."""
    import torch
    x = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    best = 0.0
    for _ in range(10):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        y.copy_(x)
        end.record()
        end.synchronize()
        best = max(best, 2 * x.numel() / (start.elapsed_time(end) * 1e-3) / 1e9)
    del x, y
    torch.cuda.empty_cache()
    return best


def validate(address, payload):
    """One request through each path, checked against the float64 reference
    under bench.lib.reference's tolerance contract."""
    import tritonclient.grpc as grpcclient
    import tritonclient.utils.shared_memory as sysshm
    if "cuda" in PATHS:
        import tritonclient.utils.cuda_shared_memory as cudashm
    model, shape, storage = PAYLOADS[payload]
    rows = min(shape[0], 8)
    shape = (rows, shape[1])
    rng = np.random.default_rng(5)
    values = rng.normal(scale=3, size=shape).astype(np.float32)
    if storage is np.uint16:  # bf16 bits, rounded to nearest even
        data = reference.float_to_bfloat16_bits(values)
        exact = reference.bfloat16_bits_to_float(data)
        dtype_name = "bfloat16"
    else:
        data, exact, dtype_name = values, values, "float32"
    expected = reference.softmax(exact)
    dtype = "BF16" if storage is np.uint16 else "FP32"
    client = grpcclient.InferenceServerClient(address)
    nbytes = data.nbytes

    def decode(array):
        if storage is np.uint16:
            return reference.bfloat16_bits_to_float(array).astype(np.float64)
        return array.astype(np.float64)

    for path in PATHS:
        tensor = grpcclient.InferInput("INPUT", list(shape), dtype)
        outputs = None
        handles = []
        if path == "none" and storage is np.uint16:
            tensor._raw_content = data.tobytes()  # bf16 bits as they are
        elif path == "none":
            tensor.set_data_from_numpy(data)
        elif path == "system":
            h_in = sysshm.create_shared_memory_region("v_in", "/softmax_bench_in", nbytes)
            h_out = sysshm.create_shared_memory_region("v_out", "/softmax_bench_out", nbytes)
            handles = [("system", h_in), ("system", h_out)]
            sysshm.set_shared_memory_region(h_in, [data])
            client.register_system_shared_memory("v_in", "/softmax_bench_in", nbytes)
            client.register_system_shared_memory("v_out", "/softmax_bench_out", nbytes)
        else:
            h_in = cudashm.create_shared_memory_region("v_in", nbytes, 0)
            h_out = cudashm.create_shared_memory_region("v_out", nbytes, 0)
            handles = [("cuda", h_in), ("cuda", h_out)]
            cudashm.set_shared_memory_region(h_in, [data])
            client.register_cuda_shared_memory("v_in", cudashm.get_raw_handle(h_in), 0, nbytes)
            client.register_cuda_shared_memory("v_out", cudashm.get_raw_handle(h_out), 0, nbytes)
        if path != "none":
            tensor.set_shared_memory("v_in", nbytes)
            out = grpcclient.InferRequestedOutput("OUTPUT")
            out.set_shared_memory("v_out", nbytes)
            outputs = [out]
        result = client.infer(model, [tensor], outputs=outputs)
        if path == "none":
            raw = result.get_response().raw_output_contents[0]
            got = decode(np.frombuffer(raw, dtype=storage).reshape(shape))
        elif path == "system":
            got = decode(sysshm.get_contents_as_numpy(handles[1][1], storage, list(shape)))
        else:
            got = decode(cudashm.get_contents_as_numpy(handles[1][1], storage, list(shape)))
        problem = reference.mismatch(got, expected, dtype_name)
        error = reference.max_relative_error(got, expected)
        if path == "system":
            client.unregister_system_shared_memory()
        elif path == "cuda":
            client.unregister_cuda_shared_memory()
        for kind, handle in handles:
            if kind == "system":
                sysshm.destroy_shared_memory_region(handle)
            else:
                cudashm.destroy_shared_memory_region(handle)
        if problem is not None:
            raise AssertionError(f"{payload} via {path}: {problem}")
        print(f"validated {payload} via {path}: max relative error {error:.2e}", flush=True)
    client.close()


def perf_analyzer(pa, address, payload, path, concurrency, interval_ms, out_dir):
    model, shape, storage = PAYLOADS[payload]
    nbytes = int(np.prod(shape)) * np.dtype(storage).itemsize
    name = f"{payload.replace(' ', '_')}-{path}-c{concurrency}"
    csv_path = os.path.join(out_dir, f"{name}.csv")
    args = [pa, "-m", model, "-i", "grpc", "-u", address,
            "--shape", f"INPUT:{shape[0]},{shape[1]}",
            "--concurrency-range", f"{concurrency}:{concurrency}",
            "--input-data", "zero", "--shared-memory", path,
            "--measurement-interval", str(interval_ms), "--stability-percentage", "50",
            "--max-trials", "6", "-f", csv_path]
    if path != "none":
        args += ["--output-shared-memory-size", str(nbytes)]
    with open(os.path.join(out_dir, f"{name}.log"), "w") as log:
        try:
            rc = subprocess.call(args, stdout=log, stderr=subprocess.STDOUT, timeout=60)
        except subprocess.TimeoutExpired:
            rc = "timeout"
    row = {"payload": payload, "path": path, "concurrency": concurrency, "bytes": nbytes,
           "rc": rc}
    if rc == 0 and os.path.exists(csv_path):
        with open(csv_path) as f:
            record = next(csv.DictReader(f))
        row["requests_per_s"] = float(record["Inferences/Second"])
        row["p50_us"] = float(record["p50 latency"])
        row["p99_us"] = float(record["p99 latency"])
        row["gb_per_s"] = 2 * nbytes * row["requests_per_s"] / 1e9
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True)
    parser.add_argument("--perf-analyzer", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--payloads", default=",".join(PAYLOADS))
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--interval-ms", type=int, default=1500)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    payloads = args.payloads.split(",")
    concurrencies = [int(c) for c in args.concurrency.split(",")]

    copy = copy_bandwidth()
    print(f"device copy: {copy:.0f} GB/s", flush=True)
    rows = []
    echo = start_server(args.bundle, "none", os.path.join(logs, "server-echo.log"))
    try:
        row = perf_analyzer(args.perf_analyzer, echo.grpc_address, "1x1024 fp32", "none", 1,
                            args.interval_ms, logs)
        row["server"] = "echo"
        rows.append(row)
    finally:
        echo.close()
    server = start_server(args.bundle, "cuda:0", os.path.join(logs, "server-cuda.log"))
    address = server.grpc_address
    try:
        for payload in payloads:
            validate(address, payload)
        for payload in payloads:
            for concurrency in concurrencies:
                for path in PATHS:
                    row = perf_analyzer(args.perf_analyzer, address, payload, path, concurrency,
                                        args.interval_ms, logs)
                    row["server"] = "cuda"
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        server.close()

    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"copy_gb_per_s": copy, "rows": rows}, f, indent=1)
    table = render(copy, rows, concurrencies, payloads)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table)
    print(table)
    plot(copy, rows, concurrencies, os.path.join(args.out, "plot.png"))


def render(copy, rows, concurrencies, payloads):
    lines = [f"Device copy bandwidth (torch, 2 GiB, read + write): {copy:.0f} GB/s", ""]
    echo = [r for r in rows if r.get("server") == "echo" and "p50_us" in r]
    if echo:
        lines.append(f"Echo server (--device=none), 1x1024 fp32, plain gRPC, c=1: "
                     f"p50 {echo[0]['p50_us']:.0f} us, {echo[0]['requests_per_s']:.0f} req/s")
        lines.append("")
    lines.append("| payload | c | path | req/s | GB/s (in+out) | x plain | x copy | p50 us | p99 us |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for payload in payloads:
        for c in concurrencies:
            plain = next((r for r in rows if r.get("server") == "cuda" and r["payload"] == payload
                          and r["concurrency"] == c and r["path"] == "none"), {})
            for path in PATHS:
                r = next((r for r in rows if r.get("server") == "cuda" and r["payload"] == payload
                          and r["concurrency"] == c and r["path"] == path), None)
                if r is None:
                    continue
                if "gb_per_s" not in r:
                    lines.append(f"| {payload} | {c} | {path} | failed (rc {r['rc']}) |||||||")
                    continue
                ratio = r["gb_per_s"] / plain["gb_per_s"] if plain.get("gb_per_s") else float("nan")
                lines.append(f"| {payload} | {c} | {path} | {r['requests_per_s']:.0f} | "
                             f"{r['gb_per_s']:.1f} | {ratio:.1f} | {r['gb_per_s'] / copy:.2f} | "
                             f"{r['p50_us']:.0f} | {r['p99_us']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(copy, rows, concurrencies, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(concurrencies), figsize=(6 * len(concurrencies), 4.5),
                             squeeze=False)
    for ax, c in zip(axes[0], concurrencies):
        for p in PATHS:
            points = sorted((r["bytes"], r["gb_per_s"]) for r in rows
                            if r.get("server") == "cuda" and r["concurrency"] == c
                            and r["path"] == p and "gb_per_s" in r)
            if points:
                ax.plot(*zip(*points), marker="o", label={"none": "plain gRPC"}.get(p, f"{p} shm"))
        ax.axhline(copy, color="grey", linestyle="--", label="device copy")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tensor bytes (input)")
        ax.set_ylabel("GB/s delivered (input + output)")
        ax.set_title(f"softmax-server on the H200, {c} caller(s)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
