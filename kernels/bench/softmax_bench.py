#!/usr/bin/env python3
"""Softmax bandwidth on one GPU: this project's kernels beside its peers and a
device-to-device copy, in one process with one timer.

Providers:
  ours           libsoftmax_kernels_c.so through ctypes (--lib)
  torch          torch.softmax
  triton         a Triton kernel with one program per row (N <= 16384)
  quack          QuACK (quack-kernels, CuTe DSL): quack.softmax._softmax_fwd(x, out)
  liger_cutedsl  Liger: liger_kernel.functional.softmax(x, impl="nvidia-cutedsl")
  liger_triton   Liger: liger_kernel.functional.softmax(x, impl="nvidia-triton")
  flashinfer     FlashInfer (flashinfer-python): flashinfer.sampling.softmax(x, temperature=1.0)
  torch_compile  torch.compile(torch.softmax), static shapes, default mode
  copy           y.copy_(x): the ceiling

Usage (on the GPU machine; see kernels/README.md):
    python3 -m kernels.bench.softmax_bench --lib build/lib/libsoftmax_kernels_c.so --out DIR

GB/s = 2 * M * N * itemsize / median time (bytes read once + written once).
Every provider is validated against the float64 reference on fresh random
normal inputs before it is timed (bench.lib.reference's contract: |y - ref| <=
1e-6 + rtol |ref|, rtol 1e-5 / 2e-3 / 1.6e-2); one that fails is recorded as invalid and not timed. A peer
that cannot be imported, or raises for a point, is recorded as
"unsupported: <reason>" for that point; the run goes on.

FlashInfer returns float32 probabilities whatever the input dtype (it converts
float16/bfloat16 logits with logits.float() first), so its float16/bfloat16
times include that conversion and a float32 write; its GB/s counts the input
dtype's bytes like every provider's, and it is validated on its float32 output.
Only flashinfer.sampling is imported: when the package's own __init__ fails (it
imports many optional dependencies), a bare package module stands in for it. The
sampling kernels load from flashinfer/data/aot/sampling/sampling.so when that
file is there, else are JIT-compiled (nvcc, ninja) into ~/.cache/flashinfer
(FLASHINFER_WORKSPACE_BASE) on first use. FlashInfer 0.7.4 has no log_softmax
and no batch-invariant softmax (its batch_invariant=True mode covers GEMMs and
quantization on SM100/103/107 only), so it has one peer here.
Writes softmax_bench.json (one object per point) and softmax_bench.png.
"""
import argparse
import ctypes
import glob
import importlib
import importlib.util
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import types

import torch
import triton
import triton.language as tl

from bench.lib import reference
from bench.lib.cli import comma_list

# dtype name -> (torch dtype, the C entry point's dtype code)
DTYPES = {"float32": (torch.float32, 1), "float16": (torch.float16, 2),
          "bfloat16": (torch.bfloat16, 3)}
SWEEP_N = [32, 128, 512, 1000, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 262144, 1048576]
TRITON_MAX_N = 16384


class Segment(ctypes.Structure):
    _fields_ = [("input", ctypes.c_uint64), ("output", ctypes.c_uint64), ("outer", ctypes.c_int64),
                ("n", ctypes.c_int64), ("inner", ctypes.c_int64), ("temperature", ctypes.c_float),
                ("log", ctypes.c_int32)]


class Ours:
    """The project's kernels through libsoftmax_kernels_c.so."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.softmax_plan_string.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        self.lib.softmax_scratch_bytes.restype = ctypes.c_size_t
        self.lib.softmax_scratch_bytes.argtypes = [ctypes.c_int, ctypes.POINTER(Segment), ctypes.c_int]
        self.lib.softmax_path.argtypes = [ctypes.c_int, ctypes.POINTER(Segment)]
        self.lib.softmax_launch.argtypes = [ctypes.c_int, ctypes.POINTER(Segment), ctypes.c_int,
                                            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self.has_kernels = hasattr(self.lib, "softmax_launch_kernels")
        if self.has_kernels:
            self.lib.softmax_launch_kernels.argtypes = [ctypes.c_int, ctypes.POINTER(Segment),
                                                        ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]

    def kernels(self, dtype_code, segs, count):
        """The kernels a launch of these segments runs (e.g. "flat"), or None."""
        if not self.has_kernels:
            return None
        buf = ctypes.create_string_buffer(256)
        n = self.lib.softmax_launch_kernels(dtype_code, segs, count, buf, len(buf))
        return buf.value.decode() if n >= 0 else None

    def plan(self):
        buf = ctypes.create_string_buffer(1 << 16)
        n = self.lib.softmax_plan_string(buf, len(buf))
        if n < 0:
            raise RuntimeError(f"softmax_plan_string failed: cudaError {-n}")
        return buf.value.decode()

    def prepare(self, dtype_code, tensors):
        """tensors: list of (x, y, outer, n, inner). Returns a launch closure."""
        segs = (Segment * len(tensors))()
        for i, (x, y, outer, n, inner) in enumerate(tensors):
            segs[i] = Segment(x.data_ptr(), y.data_ptr(), outer, n, inner, 1.0, 0)
        scratch_bytes = self.lib.softmax_scratch_bytes(dtype_code, segs, len(tensors))
        scratch = torch.empty(max(scratch_bytes, 1), dtype=torch.uint8, device="cuda")
        paths = sorted({self.lib.softmax_path(dtype_code, ctypes.byref(segs[i]))
                        for i in range(len(tensors))})
        lib, count, ptr = self.lib, len(tensors), scratch.data_ptr()

        def run():
            err = lib.softmax_launch(dtype_code, segs, count, ptr, scratch_bytes, None)
            if err != 0:
                raise RuntimeError(f"softmax_launch failed: cudaError {err}")
        run.keep = (segs, scratch)
        run.kernels = self.kernels(dtype_code, segs, count)
        return run, paths


PATH_NAMES = ["warp_rows", "block_rows", "cluster_rows", "split_rows", "strided", "staged_rows"]


@triton.jit
def triton_softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    # One program per row; the row is held in registers (public tutorial style).
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    x = tl.load(in_ptr + row * in_stride + offsets, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    numerator = tl.exp(x)
    y = numerator / tl.sum(numerator, axis=0)
    tl.store(out_ptr + row * out_stride + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


def triton_softmax(x, y):
    m, n = x.shape
    block = triton.next_power_of_2(n)
    warps = 4 if block <= 2048 else (8 if block <= 8192 else 16)
    triton_softmax_kernel[(m,)](y, x, x.stride(0), y.stride(0), n, BLOCK_SIZE=block, num_warps=warps)


def median_ms(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def check(y, x, dim, dtype_name):
    """(valid, elements outside tolerance) of `y` against the float64
    reference of softmax(x) along `dim`, computed on the GPU."""
    bad = reference.outside_tolerance(y, reference.softmax(x, axis=dim), dtype_name)
    return bad == 0, bad


def gbps(nbytes, ms):
    return 2.0 * nbytes / (ms * 1e-3) / 1e9 if ms else None



# ---------------------------------------------------------------------------
# Peers. Each setup returns factory(x, y, dim) -> fn; fn() computes softmax of
# x along dim and returns the output tensor. A setup that raises makes every
# point of that peer "unsupported: <reason>"; a factory or first call that
# raises does so for its point.

PEERS = ["torch", "triton", "quack", "liger_cutedsl", "liger_triton", "flashinfer", "torch_compile"]
LIBRARY_PEERS = ("quack", "liger_cutedsl", "liger_triton", "flashinfer")  # summarize(): best of these
LABELS = {"ours": "softmax-serve", "torch": "torch.softmax", "triton": "Triton, one program per row",
          "quack": "QuACK", "liger_cutedsl": "Liger (CuTe DSL)", "liger_triton": "Liger (Triton)",
          "flashinfer": "FlashInfer", "torch_compile": "torch.compile", "copy": "device-to-device copy"}
STYLES = {"ours": "o-", "torch": "x-", "triton": "+-", "quack": "s-", "liger_cutedsl": "v-",
          "liger_triton": "^-", "flashinfer": "p-", "torch_compile": "D-", "copy": "k--"}
SMEM_PER_BLOCK = 232448  # sm_90 opt-in shared memory per block (227 KiB)


class Unsupported(Exception):
    """A peer that cannot run a point; the message is the reason."""


def short_error(e, limit=200):
    text = str(e) if isinstance(e, Unsupported) else f"{type(e).__name__}: {e}"
    text = " | ".join(l.strip() for l in text.splitlines() if l.strip())
    return text[:limit]


def last_axis_only(dim):
    if dim != -1:
        raise Unsupported("last axis only")


def setup_torch():
    return lambda x, y, dim: (lambda: torch.softmax(x, dim=dim))


def setup_triton():
    def factory(x, y, dim):
        last_axis_only(dim)
        if x.shape[-1] > TRITON_MAX_N:
            raise Unsupported(f"one program holds a row: N <= {TRITON_MAX_N}")
        return lambda: (triton_softmax(x, y), y)[1]
    return factory


def quack_cluster(n, itemsize):
    """QuACK 0.6.5's cluster size on sm_90 (quack/softmax.py, Softmax._set_cluster_n)."""
    limits = ([(16 << 10, 1), (32 << 10, 2), (64 << 10, 4), (128 << 10, 8)] if itemsize == 2
              else [(32 << 10, 1), (64 << 10, 2), (128 << 10, 4), (256 << 10, 8)])
    return next((c for lim, c in limits if n <= lim), 16)


def setup_quack():
    # importlib: quack/__init__.py rebinds the name quack.softmax to a function.
    module = importlib.import_module("quack.softmax")
    fwd = module._softmax_fwd

    def factory(x, y, dim):
        last_axis_only(dim)
        n, itemsize = x.shape[-1], x.element_size()
        if n % (16 // itemsize):
            raise Unsupported(f"N must be a multiple of {16 // itemsize}")
        share = n * itemsize // quack_cluster(n, itemsize)
        if share > SMEM_PER_BLOCK:
            raise Unsupported(f"a block's share of the row ({share >> 10} KiB) exceeds shared memory")
        return lambda: (fwd(x, y), y)[1]
    return factory


def liger_functional():
    # Strict: a requested implementation that cannot take the input raises
    # instead of falling back to another one.
    os.environ["LIGER_KERNEL_STRICT"] = "1"
    functional = importlib.import_module("liger_kernel.functional")
    if not hasattr(functional, "softmax"):
        raise Unsupported("this liger-kernel has no functional.softmax")
    return functional


def setup_liger(impl, max_n):
    functional = liger_functional()

    def factory(x, y, dim):
        last_axis_only(dim)
        if x.shape[-1] > max_n:
            raise Unsupported(f"Liger's {impl} softmax takes N <= {max_n}")
        return lambda: functional.softmax(x, impl=impl)
    return factory


def flashinfer_sampling():
    """flashinfer.sampling, without flashinfer/__init__.py when that cannot import (it
    imports cuda-tile, nccl4py, the cuDNN frontend and more, which softmax never uses):
    a bare package module with the package's path then stands in for it."""
    try:
        importlib.import_module("flashinfer")
    except Exception as e:  # noqa: BLE001
        full_error = short_error(e, 120)
        for key in [k for k in sys.modules if k == "flashinfer" or k.startswith("flashinfer.")]:
            del sys.modules[key]  # what the failed import left half-initialized
        spec = importlib.util.find_spec("flashinfer")
        if spec is None or not spec.submodule_search_locations:
            raise Unsupported("flashinfer (flashinfer-python) is not installed")
        package = types.ModuleType("flashinfer")
        package.__path__ = list(spec.submodule_search_locations)
        package.__file__, package.__spec__, package.__package__ = spec.origin, spec, "flashinfer"
        sys.modules["flashinfer"] = package
        try:
            return importlib.import_module("flashinfer.sampling")
        except Exception as e2:  # noqa: BLE001
            raise Unsupported(f"flashinfer.sampling: {short_error(e2, 120)} "
                              f"(import flashinfer: {full_error})") from e2
    return importlib.import_module("flashinfer.sampling")


def ninja_on_path():
    """FlashInfer's JIT runs `ninja` from PATH. A ninja wheel unpacked without pip leaves
    its binary in ninja-*.data/scripts/ without the execute bit: copy it out, onto PATH."""
    if shutil.which("ninja"):
        return
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        for found in glob.glob(os.path.join(entry or ".", "ninja-*.data", "scripts", "ninja")):
            bindir = tempfile.mkdtemp(prefix="ninja-")
            shutil.copy(found, os.path.join(bindir, "ninja"))
            os.chmod(os.path.join(bindir, "ninja"), 0o755)
            os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
            return


def setup_flashinfer():
    sampling = flashinfer_sampling()
    if not hasattr(sampling, "softmax"):
        raise Unsupported("this flashinfer has no sampling.softmax")
    softmax = sampling.softmax
    ninja_on_path()
    # Load (or JIT-compile, minutes) the kernels once here, so that a failure makes the
    # peer unsupported instead of retrying the build at every point.
    start = time.time()
    softmax(torch.randn(2, 64, device="cuda"), temperature=1.0)
    torch.cuda.synchronize()
    print(f"peer flashinfer: kernels loaded in {time.time() - start:.1f} s", flush=True)

    def factory(x, y, dim):
        last_axis_only(dim)
        if x.dim() != 2:
            raise Unsupported("2-D input only")
        # float32 output whatever x's dtype (see the module docstring); check() takes it as is.
        return lambda: softmax(x, temperature=1.0)
    return factory


def setup_torch_compile():
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(int(getattr(config, name)), 1024))
    compiled = {}

    def factory(x, y, dim):
        if dim not in compiled:
            compiled[dim] = torch.compile(lambda t: torch.softmax(t, dim=dim), dynamic=False)
        fn = compiled[dim]
        return lambda: fn(x)
    return factory


SETUP = {"torch": setup_torch, "triton": setup_triton, "quack": setup_quack,
         "liger_cutedsl": lambda: setup_liger("nvidia-cutedsl", 32768),
         "liger_triton": lambda: setup_liger("nvidia-triton", 65536),
         "flashinfer": setup_flashinfer, "torch_compile": setup_torch_compile}
FACTORIES = {}  # name -> factory, or "unsupported: ..." when the setup failed


def setup_peers(names):
    for name in names:
        try:
            FACTORIES[name] = SETUP[name]()
            print(f"peer {name}: ready", flush=True)
        except Exception as e:  # noqa: BLE001 - a missing peer is a result, not a crash
            FACTORIES[name] = "unsupported: " + short_error(e)
            print(f"peer {name}: {FACTORIES[name]}", flush=True)


VARIANTS = {}  # name -> Ours, extra builds timed beside "ours" (--variant)


def run_provider(name, fn, x, y, dim, dtype_name, fresh, nbytes, row, log_lines, label):
    """Validates fn on fresh inputs, then times it; records <name>_gbps/_ms/_status."""
    row[f"{name}_gbps"] = None
    try:
        y.fill_(float("nan"))
        fresh()
        out = fn()
        torch.cuda.synchronize()
        valid, bad = check(out if out is not None else y, x, dim, dtype_name)
        del out
    except Exception as e:  # noqa: BLE001
        if not torch.cuda.is_available():
            raise
        row[f"{name}_status"] = "unsupported: " + short_error(e)
        return
    if not valid:
        row[f"{name}_status"] = f"invalid: {bad} elements off"
        log_lines.append(f"INVALID {name} {label}: {bad} elements off")
        return
    ms = median_ms(fn)
    row[f"{name}_gbps"] = gbps(nbytes, ms)
    row[f"{name}_ms"] = ms
    row[f"{name}_status"] = "ok"


def measure_point(ours, case, dtype_name, shape, dim, log_lines, results):
    torch_dtype, code = DTYPES[dtype_name]
    x = torch.randn(shape, device="cuda", dtype=torch.float32).to(torch_dtype)
    y = torch.empty_like(x)
    nbytes = x.numel() * x.element_size()
    if dim == -1:
        outer, axis_n, inner = shape[0], shape[1], 1
    else:  # dim 0 of a 2-D tensor
        outer, axis_n, inner = 1, shape[0], shape[1]
    row = {"case": case, "dtype": dtype_name, "M": shape[0], "N": shape[1],
           "shape": list(shape), "dim": dim}

    def fresh():
        x.copy_(torch.randn(shape, device="cuda", dtype=torch.float32).to(torch_dtype))

    label = f"{case} {dtype_name} {list(shape)} dim {dim}"
    run_ours, paths = ours.prepare(code, [(x, y, outer, axis_n, inner)])
    row["ours_path"] = ",".join(PATH_NAMES[p] for p in paths)
    row["ours_kernels"] = run_ours.kernels
    run_provider("ours", lambda: (run_ours(), y)[1], x, y, dim, dtype_name, fresh, nbytes, row,
                 log_lines, label)
    for name in PEERS:
        factory = FACTORIES.get(name)
        if factory is None:
            continue
        if isinstance(factory, str):
            row[f"{name}_gbps"], row[f"{name}_status"] = None, factory
            continue
        try:
            fn = factory(x, y, dim)
        except Exception as e:  # noqa: BLE001 - Unsupported, or a peer's own error
            row[f"{name}_gbps"], row[f"{name}_status"] = None, "unsupported: " + short_error(e)
            continue
        run_provider(name, fn, x, y, dim, dtype_name, fresh, nbytes, row, log_lines, label)
    for vname, vlib in VARIANTS.items():
        run_v = vlib.prepare(code, [(x, y, outer, axis_n, inner)])[0]
        run_provider(f"variant_{vname}", lambda: (run_v(), y)[1], x, y, dim, dtype_name, fresh,
                     nbytes, row, log_lines, label)
    ms = median_ms(lambda: y.copy_(x))
    row["copy_gbps"] = gbps(nbytes, ms)
    row["copy_ms"] = ms
    results.append(row)
    del x, y
    torch.cuda.empty_cache()
    return row


def measure_ragged(ours, dtype_name, log_lines, results, seed=0):
    torch_dtype, code = DTYPES[dtype_name]
    rng = random.Random(seed)
    shapes = [(rng.randint(1, 63), rng.randint(16, 20000)) for _ in range(64)]
    xs = [torch.randn(s, device="cuda", dtype=torch.float32).to(torch_dtype) for s in shapes]
    ys = [torch.empty_like(x) for x in xs]
    nbytes = sum(x.numel() * x.element_size() for x in xs)
    run_ours, paths = ours.prepare(code, [(x, y, x.shape[0], x.shape[1], 1) for x, y in zip(xs, ys)])
    row = {"case": "ragged", "dtype": dtype_name, "M": sum(s[0] for s in shapes), "N": None,
           "tensors": len(shapes), "elements": sum(s[0] * s[1] for s in shapes),
           "ours_path": ",".join(PATH_NAMES[p] for p in paths),
           "ours_kernels": run_ours.kernels}

    def torch_all():
        return [torch.softmax(x, dim=-1) for x in xs]

    providers = [("ours", run_ours), ("torch", torch_all)]
    for vname, vlib in VARIANTS.items():
        providers.append((f"variant_{vname}", vlib.prepare(
            code, [(x, y, x.shape[0], x.shape[1], 1) for x, y in zip(xs, ys)])[0]))
    for name, fn in providers:
        for y in ys:
            y.fill_(float("nan"))
        out = fn()
        torch.cuda.synchronize()
        outs = out if name == "torch" else ys
        bad = sum(check(o, x, -1, dtype_name)[1] for o, x in zip(outs, xs))
        ms = median_ms(fn)
        row[f"{name}_gbps"] = gbps(nbytes, ms)
        row[f"{name}_ms"] = ms
        row[f"{name}_status"] = "ok" if bad == 0 else f"invalid: {bad} elements off"
        if bad:
            log_lines.append(f"INVALID {name} ragged {dtype_name}: {bad} elements off")
    # Diagnostics: the same launch restricted to the segments of each path.
    by_path = {}
    for x, y in zip(xs, ys):
        seg = Segment(x.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], 1, 1.0, 0)
        by_path.setdefault(ours.lib.softmax_path(code, ctypes.byref(seg)), []).append((x, y))
    for path, pairs in sorted(by_path.items()):
        fn, _ = ours.prepare(code, [(x, y, x.shape[0], x.shape[1], 1) for x, y in pairs])
        row[f"ours_{PATH_NAMES[path]}_only_us"] = median_ms(fn) * 1000
        row[f"ours_{PATH_NAMES[path]}_only_segments"] = len(pairs)
    log_lines.append("ragged %s parts: %s" % (dtype_name, {k: round(v, 1) if isinstance(v, float) else v
                                                            for k, v in row.items() if "_only_" in k}))
    flat_x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    flat_y = torch.empty_like(flat_x)
    ms = median_ms(lambda: flat_y.copy_(flat_x))
    row["copy_gbps"] = gbps(nbytes, ms)
    row["copy_ms"] = ms
    results.append(row)
    return row


def fmt(v, w=7):
    return f"{v:{w}.0f}" if isinstance(v, (int, float)) and v is not None else f"{'-':>{w}}"


def best_peer(r):
    """(name, GB/s) of the fastest valid peer at a point, or (None, None)."""
    peers = [(r.get(f"{p}_gbps"), p) for p in PEERS if r.get(f"{p}_gbps")]
    if not peers:
        return None, None
    gb, name = max(peers)
    return name, gb


def print_header():
    print(f"{'case':7s} {'dtype':9s} {'shape':>18s} {'kernel':>14s} {'ours':>7s} "
          + " ".join(f"{p[:7]:>7s}" for p in PEERS)
          + f" {'copy':>7s} {'ours/cp':>8s} {'ours/pr':>8s} best", flush=True)


def print_row(r):
    name, best = best_peer(r)
    ours = r.get("ours_gbps")
    oc = ours / r["copy_gbps"] if ours and r.get("copy_gbps") else float("nan")
    op = ours / best if ours and best else float("nan")
    shape = f"{r['M']}x{r['N']}" if r["N"] else f"{r.get('tensors')} tensors"
    if r.get("dim", -1) == 0:
        shape += " dim0"
    kernels = r.get("ours_kernels") or r.get("ours_path", "")
    print(f"{r['case']:7s} {r['dtype']:9s} {shape:>18s} {kernels[:14]:>14s} {fmt(ours)} "
          + " ".join(fmt(r.get(f"{p}_gbps")) for p in PEERS)
          + f" {fmt(r['copy_gbps'])} {oc:8.3f} {op:8.3f} {name or '-'}"
          + "".join(f"  {k[8:-5]}={v:.0f}" for k, v in r.items()
                    if k.startswith("variant_") and k.endswith("_gbps") and v), flush=True)


def geomean(v):
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else float("nan")


def summarize(results):
    lines = []
    groups = {"sweep": [r for r in results if r["case"] == "sweep"],
              "huge+axis": [r for r in results if r["case"] in ("huge", "axis")],
              "ragged": [r for r in results if r["case"] == "ragged"]}
    for name, rows in groups.items():
        rows = [r for r in rows if r.get("ours_gbps")]
        if not rows:
            continue
        oc = [r["ours_gbps"] / r["copy_gbps"] for r in rows]
        op = [r["ours_gbps"] / best_peer(r)[1] for r in rows if best_peer(r)[1]]
        lines.append(f"{name:10s} ours/copy min {min(oc):.3f} geomean {geomean(oc):.3f}   "
                     f"ours/best-peer min {min(op, default=float('nan')):.3f} "
                     f"geomean {geomean(op):.3f}")
    # Where QuACK, Liger or FlashInfer runs: ours against the best of them.
    vs = [r["ours_gbps"] / max(r[f"{p}_gbps"] for p in LIBRARY_PEERS if r.get(f"{p}_gbps"))
          for r in results if r.get("ours_gbps") and any(r.get(f"{p}_gbps") for p in LIBRARY_PEERS)]
    if vs:
        lines.append(f"vs QuACK/Liger/FlashInfer ({len(vs)} points): min {min(vs):.3f} "
                     f"geomean {geomean(vs):.3f}")
    return lines


def plot(results, path, device):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(18, 5), sharey=True)
    for ax, dtype_name in zip(axes, DTYPES):
        rows = sorted([r for r in results if r["case"] == "sweep" and r["dtype"] == dtype_name],
                      key=lambda r: r["N"])
        if not rows:
            continue
        ns = [r["N"] for r in rows]
        for name in ["ours"] + PEERS + ["copy"]:
            key, label, style = f"{name}_gbps", LABELS[name], STYLES[name]
            pts = [(n, r[key]) for n, r in zip(ns, rows) if r.get(key)]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (row length), M*N = 2^28")
        ax.set_title(f"softmax {dtype_name}, {device}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("GB/s (read + write)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lib", required=True, help="path of libsoftmax_kernels_c.so")
    parser.add_argument("--out", default=".", help="folder for JSON and PNG")
    parser.add_argument("--dtypes", type=comma_list(), default="float32,float16,bfloat16")
    parser.add_argument("--quick", action="store_true", help="M*N = 2^24, fewer points (smoke test)")
    parser.add_argument("--ns", type=comma_list(int), default="",
                        help="comma-separated row lengths of the sweep (default: the standard sweep)")
    parser.add_argument("--cases", type=comma_list(), default="sweep,huge,axis,ragged",
                        help="comma-separated cases to run (sweep, huge, axis, ragged)")
    parser.add_argument("--peers", type=comma_list(), default=",".join(PEERS),
                        help="comma-separated peers to run (default: all)")
    parser.add_argument("--budget-s", type=float, default=0,
                        help="stop starting new points after this many seconds (0: no limit)")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=path of another build of the library, timed beside ours "
                             "(every point)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    ours = Ours(args.lib)
    for spec in args.variant:
        name, path = spec.split("=", 1)
        VARIANTS[name] = Ours(path)
    print(ours.plan(), flush=True)
    device = torch.cuda.get_device_name()
    print(f"device: {device}  torch {torch.__version__}  triton {triton.__version__}")
    setup_peers(args.peers)
    versions = {}
    for dist in ("quack-kernels", "nvidia-cutlass-dsl", "liger-kernel", "flashinfer-python",
                 "apache-tvm-ffi"):
        try:
            from importlib import metadata
            versions[dist] = metadata.version(dist)
        except Exception:  # noqa: BLE001
            versions[dist] = None
    print(f"peer versions: {versions}", flush=True)
    total = 1 << (24 if args.quick else 28)
    dtypes = args.dtypes
    results, log_lines = [], []
    print_header()
    start = time.time()
    json_path = os.path.join(args.out, "softmax_bench.json")

    def show(row):  # print, and keep the JSON current so a cut-off run still reports
        row["device"] = device
        print_row(row)
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)

    def in_budget():
        if args.budget_s and time.time() - start > args.budget_s:
            log_lines.append(f"budget of {args.budget_s:.0f} s spent: later points skipped")
            return False
        return True

    huge = [(16, 1 << 24), (4, 1 << 26)] if not args.quick else [(4, 1 << 22)]
    axis = [(4096, 65536), (65536, 4096), (1048576, 256)] if not args.quick else [(4096, 4096)]
    cases = args.cases
    sweep_n = args.ns or SWEEP_N
    # dtype by dtype, so that a run cut short by --budget-s loses the last dtype's points
    for dtype_name in dtypes:
        for n in sweep_n if "sweep" in cases else []:
            if n <= total and in_budget():
                show(measure_point(ours, "sweep", dtype_name, (total // n, n), -1, log_lines, results))
        for shape in huge if "huge" in cases else []:
            if in_budget():
                show(measure_point(ours, "huge", dtype_name, shape, -1, log_lines, results))
        for shape in axis if "axis" in cases else []:
            if in_budget():
                show(measure_point(ours, "axis", dtype_name, shape, 0, log_lines, results))
        if "ragged" in cases and in_budget():
            show(measure_ragged(ours, dtype_name, log_lines, results))
    for line in log_lines:
        print(line)
    summary = summarize(results)
    invalid = [l for l in log_lines if l.startswith("INVALID")]
    for line in summary:
        print(line)
    with open(json_path, "w") as f:
        json.dump(results, f, indent=1)
    try:
        plot(results, os.path.join(args.out, "softmax_bench.png"), device)
    except Exception as e:  # the numbers matter more than the chart
        print(f"plot failed: {e}")
    print(f"done in {time.time() - start:.0f} s; invalid providers: {len(invalid)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
