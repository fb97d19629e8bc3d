"""kernels/bench/stage_peers.sh on made-up wheels (no network): a wheel over
the repack size travels as NAME.tar.xz, FlashInfer without its other backends'
sources, and the transfer folders stay within their sizes, a file that does not
fit split into parts that join back (as run_h200.sh joins them) byte for byte."""

import io
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "kernels" / "bench" / "stage_peers.sh"
MIB = 1 << 20


def wheel(path, files):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)


def test_stage_peers_repacks_trims_and_splits(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    small = {"quack/__init__.py": b"x = 1\n", "quack_kernels-0.6.5.dist-info/METADATA": b"m"}
    wheel(wheels / "quack_kernels-0.6.5-py3-none-any.whl", small)
    payload = os.urandom(MIB + MIB // 2)  # incompressible: it must be split
    big = "nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64"
    wheel(wheels / (big + ".whl"), {"nvidia_cutlass_dsl/lib/libbig.so": payload})
    flashinfer = {
        "flashinfer/__init__.py": b"", "flashinfer/sampling.py": b"def softmax(): pass\n",
        "flashinfer/jit/sampling.py": b"", "flashinfer/data/csrc/sampling.cu": b"kernel",
        "flashinfer/data/csrc/cake_softmax.cu": b"other", "flashinfer/data/csrc/kda/big.cu": b"o",
        "flashinfer/data/include/flashinfer/sampling.cuh": b"h",
        "flashinfer/experimental/cake/kernel.cu": b"o",
        "flashinfer_python-0.7.4.dist-info/METADATA": b"m",
    }
    wheel(wheels / "flashinfer_python-0.7.4-py3-none-any.whl", flashinfer)

    out = tmp_path / "out"
    env = dict(os.environ, WHEELS=str(wheels), FIRST_MIB="1", REST_MIB="1", REPACK_MIB="1")
    subprocess.run(["bash", str(SCRIPT), str(out)], env=env, check=True, timeout=120)

    folders = sorted(p for p in out.iterdir() if p.name.startswith("t"))
    assert [p.name for p in folders] == ["t1", "t2"]
    for folder in folders:
        assert sum(f.stat().st_size for f in folder.iterdir()) <= MIB
    files = {f.name: f for folder in folders for f in folder.iterdir()}
    assert "quack_kernels-0.6.5-py3-none-any.whl" in files
    assert not any(name.endswith(big + ".whl") for name in files)

    # Parts in name order across the folders, joined: the repacked wheel's files.
    parts = sorted(n for n in files if n.startswith(big + ".tar.xz.part-"))
    assert len(parts) >= 2
    joined = b"".join(files[n].read_bytes() for n in parts)
    with tarfile.open(fileobj=io.BytesIO(joined)) as t:
        assert t.extractfile("./nvidia_cutlass_dsl/lib/libbig.so").read() == payload

    with tarfile.open(files["flashinfer_python-0.7.4-py3-none-any.tar.xz"]) as t:
        names = {n.lstrip("./") for n in t.getnames() if t.getmember(n).isfile()}
    assert names == {"flashinfer/__init__.py", "flashinfer/sampling.py", "flashinfer/jit/sampling.py",
                     "flashinfer/data/csrc/sampling.cu",
                     "flashinfer/data/include/flashinfer/sampling.cuh",
                     "flashinfer_python-0.7.4.dist-info/METADATA"}
