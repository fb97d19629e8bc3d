#!/usr/bin/env python3
"""Times builds of the library side by side on a named set of shapes; bits against the first.

    python3 -m kernels.bench.ab_shapes SET A.so B.so ...

SET is `unaligned` (rows that do not start on 16 bytes, with aligned controls),
`split` (long rows of the split path, one to sixteen at a time), `cached` (aligned rows
of 640 KiB-24 MiB, beyond the staged path), `persistent` (one tensor of many rows of
1025-3584 vectors, row_staged's), `long` (aligned rows
around the staged and split_staged kernels' border), `staged` (the sweep's staged and
split_staged points), `shares` (16-bit rows of 60-128 KiB, around the clusters of 30-32
KiB shares), `axis` (softmax over a non-last axis), `onepass` (the axis set's
strided_staged shapes, and columns that take several tiles per cluster), `twopass` (the
axis shapes of strided_stats and strided_normalize, unaligned ones among them) or `wide`
(float32 columns around strided_staged's 256-byte tiles). Each line: the kernels
the first build runs, then per build GB/s (2 x bytes / time), its fraction of a copy of
the same bytes timed in the same call, its speed against the first build (xN) and, where
any element's bits differ from the first build's output or fails the float64 check,
`!bB dD` (B invalid, D differing). Timer: softmax_bench.py's (median, L2 flushed).
Needs a GPU and torch.
"""
import math
import os
import sys

import torch

from kernels.bench import softmax_bench as sb

# (dtype, rows, n[, 0 for softmax over dim 0 of [rows, n]]) or (dtype, (shape), dim)
SETS = {
    "unaligned": [
        ("float32", 4096, 50257), ("float16", 4096, 50257), ("bfloat16", 4096, 50257),
        ("float32", 4096, 50256), ("float16", 4096, 50256),
        ("float32", 1024, 100003), ("float16", 2048, 100003), ("float32", 1024, 100000),
        ("float16", 2048, 100000),
        ("float32", 16384, 4097), ("float16", 16384, 4097), ("float16", 65536, 1001),
        ("float32", 65536, 1001), ("float16", 262144, 129), ("float16", 1048576, 33),
        ("bfloat16", 32768, 2049), ("float32", 262144, 255), ("float32", 1048576, 33),
        ("float32", 4, 16777217), ("float16", 4, 16777217), ("float32", 100000, 301, 0),
        ("float16", 100000, 300, 0),
        ("float32", 64, 1000003), ("float16", 64, 1000003), ("float32", 64, 1000000),
    ],
    "axis": [
        ("float32", (4096, 65536), 0), ("float16", (4096, 65536), 0),
        ("float32", (8192, 32768), 0), ("float32", (16384, 4096), 0),
        ("float16", (16384, 4096), 0), ("float32", (65536, 4096), 0),
        ("float16", (65536, 4096), 0), ("bfloat16", (65536, 4096), 0),
        ("float32", (200000, 512), 0), ("float16", (8, 30000, 1024), 1),
        ("float32", (4, 20000, 2048), 1), ("float32", (1048576, 256), 0),
        ("bfloat16", (4096, 65536), 0), ("float16", (8192, 32768), 0),
        ("float32", (2048, 65536), 0), ("float16", (1024, 262144), 0),
    ],
    "onepass": [
        ("float32", (4096, 65536), 0), ("float16", (4096, 65536), 0), ("bfloat16", (4096, 65536), 0),
        ("float32", (8192, 32768), 0), ("float16", (8192, 32768), 0),
        ("float32", (16384, 4096), 0), ("float16", (16384, 4096), 0),
        ("float32", (2048, 65536), 0), ("float16", (1024, 262144), 0),
        ("float32", (4, 20000, 2048), 1), ("float16", (300, 262144), 0),
        ("float16", (2048, 131072), 0), ("float32", (1024, 65536), 0),
    ],
    "twopass": [
        ("float32", (65536, 4096), 0), ("float16", (65536, 4096), 0), ("bfloat16", (65536, 4096), 0),
        ("float32", (1048576, 256), 0), ("float16", (1048576, 256), 0),
        ("bfloat16", (1048576, 256), 0), ("float32", (200000, 512), 0),
        ("float16", (262144, 1024), 0), ("float32", (100000, 301), 0),
        ("float16", (100000, 300), 0), ("float16", (8, 30000, 1024), 1),
    ],
    "wide": [
        ("float32", (2048, 65536), 0), ("float32", (1024, 65536), 0),
        ("float32", (1536, 65536), 0), ("float32", (2048, 16384), 0),
        ("float32", (2048, 131072), 0), ("float32", (1000, 65536), 0),
        ("float32", (512, 262144), 0), ("float32", (4, 2048, 8192), 1),
        ("float32", (4096, 65536), 0), ("float16", (2048, 65536), 0),
    ],
    "long": [
        ("float32", 1024, 262144), ("float32", 512, 262144), ("float32", 2048, 196608),
        ("float32", 1024, 229376), ("float32", 1024, 163840), ("float32", 4096, 65536),
        ("float32", 256, 1048576), ("float16", 1024, 262144), ("float16", 512, 524288),
        ("bfloat16", 512, 524288),
    ],
    "staged": [
        ("float32", 32768, 8192), ("float32", 16384, 16384), ("float32", 8192, 32768),
        ("float32", 4096, 65536), ("float32", 1024, 262144), ("float16", 4096, 65536),
        ("float16", 1024, 262144), ("bfloat16", 4096, 65536), ("bfloat16", 1024, 262144),
        ("bfloat16", 16384, 16384), ("float32", 256, 1048576), ("float16", 256, 1048576),
        ("bfloat16", 256, 1048576), ("float32", 128, 2097152),
    ],
    "shares": [
        ("float16", 8192, 32768), ("bfloat16", 8192, 32768), ("float16", 8738, 30720),
        ("bfloat16", 8456, 31744), ("float16", 8738, 30712), ("float16", 8190, 32776),
        ("float16", 6553, 40960), ("float16", 5965, 45000), ("float16", 5461, 49152),
        ("float16", 4681, 57344), ("float16", 4369, 61440), ("float16", 4096, 65536),
        ("bfloat16", 4096, 65536), ("bfloat16", 6144, 45000),
    ],
    "cached": [
        ("float32", 1024, 163840), ("float32", 2048, 196604), ("float32", 512, 524288),
        ("float32", 256, 1048576), ("float32", 128, 2097152), ("float32", 64, 4194304),
        ("float32", 32, 6291456), ("float16", 512, 524288), ("float16", 256, 1048576),
        ("bfloat16", 256, 1048576), ("float16", 64, 8388608), ("float32", 1024, 262144),
    ],
    "persistent": [
        ("float32", 16384, 4097), ("float32", 8192, 8193), ("float32", 4096, 14335),
        ("float16", 16384, 16384), ("bfloat16", 16384, 16384), ("bfloat16", 8192, 24576),
        ("float16", 8192, 20001), ("float16", 4096, 28671), ("float32", 1000, 4097),
    ],
    "split": [
        ("float32", 1, 16777216), ("float16", 1, 16777216), ("float32", 1, 8388608),
        ("float32", 4, 8388608), ("bfloat16", 2, 33554432), ("float32", 2, 8388609),
        ("float32", 16, 16777215),
    ],
}


def bits(t):
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in SETS:
        sys.exit(__doc__)
    libs = [(os.path.basename(p).split(".")[0], sb.Ours(p)) for p in sys.argv[2:]]
    compare(SETS[sys.argv[1]], libs)


def compare(shapes, libs):
    print("%-9s %-20s %-28s" % ("dtype", "shape", "kernels") +
          "".join("%16s" % n for n, _ in libs) + "   copy")
    for entry in shapes:
        if isinstance(entry[1], tuple):
            dt, dims, dim = entry
        else:
            dt, dims, dim = entry[0], entry[1:3], entry[3] if len(entry) > 3 else 1
        dim %= len(dims)
        outer, n, inner = math.prod(dims[:dim]), dims[dim], math.prod(dims[dim + 1:])
        torch_dtype, code = sb.DTYPES[dt]
        x = torch.randn(*dims, device="cuda").to(torch_dtype)
        nbytes = x.numel() * x.element_size()
        cells, first, kernels = [], None, ""
        for _, lib in libs:
            y = torch.full_like(x, float("nan"))
            run, _ = lib.prepare(code, [(x, y, outer, n, inner)])
            kernels = kernels or (run.kernels or "")
            run()
            torch.cuda.synchronize()
            _, bad = sb.check(y, x, dim, dt)
            diff = 0 if first is None else int((bits(y) != bits(first)).sum())
            if first is None:
                first = y.clone()
            cells.append((sb.median_ms(run), bad, diff))
            del y
        z = torch.empty_like(x)
        copy_ms = sb.median_ms(lambda: z.copy_(x))
        label = "x".join(str(d) for d in dims) + ("" if dim == len(dims) - 1 else " d%d" % dim)
        line = "%-9s %-20s %-28s" % (dt, label, kernels[:28])
        for i, (ms, bad, diff) in enumerate(cells):
            line += "%9.1f %5.3f" % (2 * nbytes / ms / 1e6, copy_ms / ms)
            line += (" x%5.3f" % (cells[0][0] / ms)) if i else ""
            line += "" if bad == 0 and diff == 0 else "!b%d d%d" % (bad, diff)
        line += "  %7.1f" % (2 * nbytes / copy_ms / 1e6)
        print(line, flush=True)
        del x, z, first
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
