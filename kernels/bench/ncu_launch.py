#!/usr/bin/env python3
"""One launch of the library for Nsight Compute to profile: a warm-up launch,
then the launch between cudaProfilerStart/Stop (profile it with
`ncu --profile-from-start off`).

    python3 -m kernels.bench.ncu_launch LIB DTYPE M N [INNER]

LIB: libsoftmax_kernels_c.so; DTYPE: float32, float16 or bfloat16; an M x N
tensor of standard normal values, softmax over its last axis; with INNER, an
M x N x INNER tensor, softmax over N (INNER > 1: a non-last axis).
"""
import sys

import torch

from kernels.bench import softmax_bench


def main():
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    lib, dtype_name, m, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    inner = int(sys.argv[5]) if len(sys.argv) == 6 else 1
    torch_dtype, code = softmax_bench.DTYPES[dtype_name]
    x = torch.randn(m, n, inner, device="cuda", dtype=torch_dtype)
    y = torch.empty_like(x)
    run, _ = softmax_bench.Ours(lib).prepare(code, [(x, y, m, n, inner)])
    print("kernels", run.kernels, flush=True)
    run()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
