#!/usr/bin/env python3
"""Two-pass huge rows: one launch of all rows against a launch per row.

    python3 -m kernels.bench.huge_rows LIB.so

One launch runs pass 1 over every row, then pass 2; a launch per row runs each row's
pass 2 right after its pass 1 (its tail still in L2). Same bits either way (parts of
fixed size; checked). Prints GB/s (2 x bytes / time) of a copy and of each, with the
fraction of copy. Timer: softmax_bench.py's (median, L2 flushed). Needs a GPU and torch.
"""
import sys

import torch

from kernels.bench import softmax_bench as sb

lib = sb.Ours(sys.argv[1] if len(sys.argv) > 1 else "build/lib/libsoftmax_kernels_c.so")
for dt in ["float32", "float16"]:
    for rows, n in [(16, 1 << 24), (4, 1 << 26), (1, 1 << 24), (8, 1 << 23)]:
        torch_dtype, code = sb.DTYPES[dt]
        x = torch.randn(rows, n, device="cuda").to(torch_dtype)
        y = torch.empty_like(x)
        y2 = torch.empty_like(x)
        nbytes = x.numel() * x.element_size()
        run_all, _ = lib.prepare(code, [(x, y, rows, n, 1)])
        runs = [lib.prepare(code, [(x[r], y2[r], 1, n, 1)])[0] for r in range(rows)]

        def per_row():
            for f in runs:
                f()
        run_all(); per_row(); torch.cuda.synchronize()
        same = bool(torch.equal(y.view(torch.int16 if x.element_size() == 2 else torch.int32),
                                y2.view(torch.int16 if x.element_size() == 2 else torch.int32)))
        c = sb.median_ms(lambda: y.copy_(x))
        a = sb.median_ms(run_all)
        b = sb.median_ms(per_row)
        print("%-8s %3d x %9d  %-40s copy %6.0f  one launch %6.0f (%.3f)  a launch per row %6.0f (%.3f)  same bits %s"
              % (dt, rows, n, run_all.kernels, sb.gbps(nbytes, c), sb.gbps(nbytes, a), c / a,
                 sb.gbps(nbytes, b), c / b, same), flush=True)
        del x, y, y2
        torch.cuda.empty_cache()
