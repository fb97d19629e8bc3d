#!/usr/bin/env python3
"""Where a ragged table's time goes: the host's call against the GPU's work.

    python3 -m kernels.bench.host_time LIB

For each table of ragged_tables.py in float32 and float16, the library's launch
(libsoftmax_kernels_c.so: planning, then every launch of the schedule) is
validated against float64, then timed three ways: the host's time per call with
nothing waited for (50 calls), the stream's time per call for 50 calls back to
back (CUDA events; where it equals the host's, the GPU waits for the host) and
the benchmark's median with L2 flushed (triton.testing.do_bench), beside a
device copy of the same bytes. Prints a markdown table.
"""
import sys
import time

import torch

from kernels.bench import ragged_tables as rt
from kernels.bench import softmax_bench as sb

CALLS = 50


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    ours = sb.Ours(sys.argv[1])
    print(torch.cuda.get_device_name())
    print()
    print("| table | dtype | kernels | host, us/call | back to back, us/call | "
          "median, us (L2 flushed) | copy, us | off |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for dtype_name in ["float32", "float16"]:
        for name, (shapes, rng) in rt.TABLES:
            xs, ys, code = rt.build(shapes, dtype_name, rng)
            run, _ = ours.prepare(code, [(x, y, x.shape[0], x.shape[1], 1) for x, y in zip(xs, ys)])
            run()
            torch.cuda.synchronize()
            bad = sum(sb.check(y, x, -1, dtype_name)[1] for x, y in zip(xs, ys))
            for _ in range(5):
                run()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(CALLS):
                run()
            host_us = (time.perf_counter() - t0) / CALLS * 1e6
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(CALLS):
                run()
            stop.record()
            torch.cuda.synchronize()
            stream_us = start.elapsed_time(stop) * 1000 / CALLS
            median_us = sb.median_ms(run) * 1000
            nbytes = sum(x.numel() * x.element_size() for x in xs)
            fx = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            fy = torch.empty_like(fx)
            copy_us = sb.median_ms(lambda: fy.copy_(fx)) * 1000
            print(f"| {name} | {dtype_name} | {run.kernels} | {host_us:.1f} | {stream_us:.1f} | "
                  f"{median_us:.1f} | {copy_us:.1f} | {bad} |", flush=True)
            del xs, ys, fx, fy
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
