"""Generates softmax_client/_generated/softmax_pb2.py (and its .pyi) from the wire contract
while the package is built, so no generated code sits in the source tree.

The contract is looked up, in order, at $SOFTMAX_PROTO_ROOT, this folder's
proto/ (where an sdist carries a copy) and ../../proto (the repository).
The generator is `protoc` from PATH when it is 3.20 or newer (its output then
matches the protobuf runtime of the same distribution, e.g. Debian's
protobuf-compiler and python3-protobuf), otherwise grpcio-tools' bundled
protoc; $SOFTMAX_PROTOC names a protoc to use instead. Only message classes
are generated: the client builds its gRPC calls itself, so it does not depend
on the gRPC stub generator's version.
"""
import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PROTO = Path("softmax") / "v1" / "softmax.proto"


def _build_backend():
    """The in-tree backend (build_backend/), loaded from its file: pip puts it on the path
    for the build hooks, but not for `python setup.py sdist`."""
    spec = importlib.util.spec_from_file_location(
        "softmax_client_build", HERE / "build_backend" / "softmax_client_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def proto_root() -> Path:
    candidates = [os.environ.get("SOFTMAX_PROTO_ROOT"), HERE / "proto", HERE.parent.parent / "proto"]
    for candidate in candidates:
        if candidate and (Path(candidate) / PROTO).is_file():
            return Path(candidate)
    raise RuntimeError(
        f"softmax-serve-client: {PROTO} not found in {[str(c) for c in candidates if c]}; "
        "build from the softmax-serve repository or from its sdist, or set SOFTMAX_PROTO_ROOT")


def generate(out_dir: Path) -> None:
    root = proto_root()
    with tempfile.TemporaryDirectory() as tmp:
        # The .pyi beside the module types the message classes for checkers.
        args = [f"--proto_path={root}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                str(root / PROTO)]
        protoc = _build_backend().usable_protoc()
        if protoc:
            subprocess.run([protoc, *args], check=True)
        else:
            from grpc_tools import protoc as grpc_tools_protoc
            if grpc_tools_protoc.main(["protoc", *args]) != 0:
                raise RuntimeError("grpcio-tools' protoc failed on " + str(root / PROTO))
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in ("softmax_pb2.py", "softmax_pb2.pyi"):
            shutil.copy(Path(tmp) / "softmax" / "v1" / name, out_dir / name)
    (out_dir / "__init__.py").write_text(
        '"""Message classes generated from softmax/v1/softmax.proto at build time."""\n')


class BuildPyWithProto(build_py):
    def run(self) -> None:
        super().run()
        generate(Path(self.build_lib) / "softmax_client" / "_generated")


class SdistWithProto(sdist):
    """Carries the contract inside the sdist, so a wheel builds from it alone."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        target = Path(base_dir) / "proto" / PROTO
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(proto_root() / PROTO, target)


setup(cmdclass={"build_py": BuildPyWithProto, "sdist": SdistWithProto})
