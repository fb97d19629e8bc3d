#!/usr/bin/env python3
"""Ragged tables (many tensors in one launch) through several builds of the library.

    python3 -m kernels.bench.ragged_tables A.so B.so [...]

Seven tables per dtype: the benchmark's mix (64 tensors of 1..63 rows and 16..20,000
columns, softmax_bench.py's ragged case), the same with columns rounded up to 16
bytes, 64 views at odd element offsets (input and output apart), another seed,
64 tensors of up to 4,000 columns, 24 of up to 65,536, and 60 tensors of up to 2,000
columns beside 4 of 1..8 rows and 20,000..65,536 columns (a flat table launch beside the
long rows' launches). Each build's launch is
validated against float64 (elements off), its output bits compared with the first
build's (elements that differ), then timed (triton.testing.do_bench, median, L2
flushed) beside a device copy of the same bytes. Prints one line per table:
time, fraction of copy and speed-up over the first build for each build.
"""
import os
import random
import sys

import torch

from kernels.bench import softmax_bench as sb

DTYPES = ["float32", "float16", "bfloat16"]


def mix(seed, align=False, offsets=False, max_n=20000, count=64):
    """Shapes of a table, and the generator of its views' offsets (None: no offsets)."""
    rng = random.Random(seed)
    shapes = [(rng.randint(1, 63), rng.randint(16, max_n)) for _ in range(count)]
    if align:
        shapes = [(m, (n + 7) // 8 * 8) for m, n in shapes]
    return shapes, (rng if offsets else None)


def build(shapes, dtype_name, rng):
    torch_dtype, code = sb.DTYPES[dtype_name]
    xs, ys = [], []
    for m, n in shapes:
        if rng is None:
            x = torch.randn(m, n, device="cuda").to(torch_dtype)
            y = torch.empty_like(x)
        else:
            a, b = rng.randint(0, 7), rng.randint(0, 7)
            x = torch.randn(m * n + a, device="cuda").to(torch_dtype)[a:].view(m, n)
            y = torch.empty(m * n + b, device="cuda", dtype=torch_dtype)[b:].view(m, n)
        xs.append(x)
        ys.append(y)
    return xs, ys, code


def short_and_long(seed):
    """Many short tensors and a few long ones: more flat rows than row_staged rows."""
    rng = random.Random(seed)
    shapes = [(rng.randint(1, 63), rng.randint(16, 2000)) for _ in range(60)]
    shapes += [(rng.randint(1, 8), rng.randint(20000, 65536)) for _ in range(4)]
    return shapes, None


TABLES = [("mix0", mix(0)), ("mix0_aligned", mix(0, align=True)),
          ("mix1_offsets", mix(1, offsets=True)), ("mix2", mix(2)),
          ("short_mix3", mix(3, max_n=4000)), ("long_mix4", mix(4, max_n=65536, count=24)),
          ("short_long5", short_and_long(5))]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    libs = [(os.path.basename(p).split(".")[0], sb.Ours(p)) for p in sys.argv[1:]]
    for dtype_name in DTYPES:
        for name, (shapes, rng) in TABLES:
            xs, ys, code = build(shapes, dtype_name, rng)
            nbytes = sum(x.numel() * x.element_size() for x in xs)
            first_bits, cells = None, []
            for lib_name, ours in libs:
                run, _ = ours.prepare(code, [(x, y, x.shape[0], x.shape[1], 1) for x, y in zip(xs, ys)])
                for y in ys:
                    y.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                bad = sum(sb.check(y, x, -1, dtype_name)[1] for x, y in zip(xs, ys))
                bits = torch.cat([y.reshape(-1).view(torch.int16 if y.element_size() == 2 else torch.int32)
                                  for y in ys])
                if first_bits is None:
                    first_bits = bits.clone()
                differ = int((bits != first_bits).sum())
                cells.append((lib_name, sb.median_ms(run) * 1000, bad, differ))
            fx = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            fy = torch.empty_like(fx)
            copy_us = sb.median_ms(lambda: fy.copy_(fx)) * 1000
            base_us = cells[0][1]
            print(f"{dtype_name:9s} {name:13s} {nbytes / 1e6:6.1f} MB copy {copy_us:6.1f} us | " + " | ".join(
                f"{n} {us:6.1f} us {copy_us / us:.2f} of copy x{base_us / us:.2f} off {bad} differ {differ}"
                for n, us, bad, differ in cells), flush=True)
            del xs, ys, fx, fy
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
