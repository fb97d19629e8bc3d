"""The fused top K (LaunchSoftmaxTopK) beside its peers, one timer, one run.

For each shape (64 x 32000, 8 x 131072, 1024 x 4096, and --shapes), dtype and
K: validates ours (indices equal to a stable descending sort of the input,
values within the reference tolerance of the float64 softmax there), then
times with triton.testing.do_bench (median, L2 flushed):

  ours       libsoftmax_kernels_c.so softmax_top_k_launch (ctypes)
  torch      torch.softmax + torch.topk
  flashinfer flashinfer.top_k on the logits + torch.logsumexp (the row's
             statistics, which top_k alone does not give); where importable
  read       the read-only ceiling: the faster of torch.amax and torch.sum
             over the rows (reads each input byte once, writes M values)

Bandwidth counts the input bytes read once (M * N * item) over the median
time. Prints a table (ours / read ceiling, ours / best peer) and writes JSON.

Run on the GPU machine from the checkout root:
  python3 -m kernels.bench.top_k_bench --lib build/kernels/libsoftmax_kernels_c.so --out DIR
"""
import argparse
import ctypes
import json
import math
import os
import sys

import torch

from bench.lib import reference

DTYPES = {"float32": (torch.float32, 1), "float16": (torch.float16, 2), "bfloat16": (torch.bfloat16, 3)}


class CTopKSegment(ctypes.Structure):
    _fields_ = [("input", ctypes.c_uint64), ("values", ctypes.c_uint64), ("indices", ctypes.c_uint64),
                ("outer", ctypes.c_int64), ("n", ctypes.c_int64), ("inner", ctypes.c_int64),
                ("k", ctypes.c_int64), ("temperature", ctypes.c_float), ("log", ctypes.c_int32)]


class Ours:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.softmax_top_k_launch.restype = ctypes.c_int
        self.lib.softmax_top_k_launch.argtypes = [ctypes.c_int, ctypes.POINTER(CTopKSegment), ctypes.c_int,
                                                  ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self.lib.softmax_top_k_scratch_bytes.restype = ctypes.c_size_t
        self.lib.softmax_top_k_scratch_bytes.argtypes = [ctypes.c_int, ctypes.POINTER(CTopKSegment), ctypes.c_int]

    def prepare(self, x, k, code):
        m, n = x.shape
        values = torch.empty((m, k), dtype=x.dtype, device=x.device)
        indices = torch.empty((m, k), dtype=torch.int64, device=x.device)
        seg = CTopKSegment(x.data_ptr(), values.data_ptr(), indices.data_ptr(), m, n, 1, k, 1.0, 0)
        scratch_bytes = self.lib.softmax_top_k_scratch_bytes(code, ctypes.byref(seg), 1)
        scratch = torch.empty(max(scratch_bytes, 1), dtype=torch.uint8, device=x.device)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

        def run():
            rc = self.lib.softmax_top_k_launch(code, ctypes.byref(seg), 1, ctypes.c_void_p(scratch.data_ptr()),
                                               scratch_bytes, stream)
            if rc != 0:
                raise RuntimeError(f"softmax_top_k_launch returned {rc}")
            return values, indices

        return run


def torch_peer(x, k):
    def run():
        p = torch.softmax(x, dim=-1)
        return torch.topk(p, k, dim=-1)
    return run


def flashinfer_peer(x, k):
    import flashinfer  # noqa: F401  (unsupported where it does not import)

    def run():
        lse = torch.logsumexp(x.float(), dim=-1)
        out = flashinfer.top_k(x, k)
        return out, lse
    return run


def read_ceiling(x):
    return [lambda: torch.amax(x, dim=-1), lambda: torch.sum(x, dim=-1)]


def validate(x, values, indices, k, name):
    """Indices equal a stable descending sort; values within tolerance of the float64 softmax."""
    xf = x.double()
    expected = torch.sort(xf, dim=-1, descending=True, stable=True).indices[:, :k]
    if not torch.equal(indices.cpu(), expected.cpu()):
        bad = (indices.cpu() != expected.cpu()).nonzero()[:3].tolist()
        raise AssertionError(f"{name}: indices differ from the reference ranking at {bad}")
    ref = torch.softmax(xf, dim=-1).gather(-1, expected)
    bad = reference.outside_tolerance(values, ref, name)
    if bad:
        raise AssertionError(f"{name}: {bad} of {ref.numel()} values outside tolerance")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", required=True, help="libsoftmax_kernels_c.so")
    parser.add_argument("--shapes", default="64x32000,8x131072,1024x4096")
    parser.add_argument("--ks", default="5,64")
    parser.add_argument("--dtypes", default="float32,float16,bfloat16")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    from triton.testing import do_bench

    ours = Ours(args.lib)
    torch.manual_seed(66)
    rows = []
    for shape in args.shapes.split(","):
        m, n = (int(v) for v in shape.split("x"))
        for name in args.dtypes.split(","):
            dtype, code = DTYPES[name]
            x = torch.randn(m, n, device="cuda", dtype=torch.float32).mul_(2).to(dtype)
            read_bytes = m * n * x.element_size()
            read_ms = min(do_bench(f, warmup=25, rep=200) for f in read_ceiling(x))
            for k in (int(v) for v in args.ks.split(",")):
                row = {"shape": [m, n], "dtype": name, "k": k, "read_gbps": read_bytes / read_ms / 1e6}
                run = ours.prepare(x, k, code)
                values, indices = run()
                torch.cuda.synchronize()
                validate(x, values, indices, k, name)
                row["ours_gbps"] = read_bytes / do_bench(run, warmup=25, rep=200) / 1e6
                for peer, make in (("torch", torch_peer), ("flashinfer", flashinfer_peer)):
                    try:
                        f = make(x, k)
                        f()
                        row[f"{peer}_gbps"] = read_bytes / do_bench(f, warmup=25, rep=200) / 1e6
                    except Exception as error:  # a peer that cannot run here: recorded as such
                        row[f"{peer}_error"] = f"{type(error).__name__}: {error}"[:200]
                rows.append(row)
                print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "top_k_bench.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}; GB/s of input read once (M * N * item / median time)")
    print(f"{'shape':>12s} {'dtype':9s} {'K':>3s} {'ours':>7s} {'read':>7s} {'torch':>7s} {'flashinf':>8s} "
          f"{'o/read':>6s} {'o/peer':>6s}")
    for r in rows:
        peers = [r.get("torch_gbps"), r.get("flashinfer_gbps")]
        best = max((p for p in peers if p), default=float("nan"))
        print(f"{'x'.join(map(str, r['shape'])):>12s} {r['dtype']:9s} {r['k']:3d} {r['ours_gbps']:7.0f} "
              f"{r['read_gbps']:7.0f} {r.get('torch_gbps') or float('nan'):7.0f} "
              f"{r.get('flashinfer_gbps') or float('nan'):8.0f} {r['ours_gbps'] / r['read_gbps']:6.3f} "
              f"{r['ours_gbps'] / best:6.3f}")
    fl = [r for r in rows if "flashinfer_error" in r]
    if fl:
        print(f"flashinfer not run: {fl[0]['flashinfer_error']}")
    ratios = [r["ours_gbps"] / r["read_gbps"] for r in rows]
    print(f"ours / read ceiling: min {min(ratios):.3f} geomean "
          f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
