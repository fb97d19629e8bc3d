"""In-tree PEP 517 backend: setuptools, plus grpcio-tools as a build
requirement only where no `protoc` of 3.20 or newer is on PATH (protobuf
runtimes of 3.20 and later load that generated code; a system protoc keeps the
generated code in step with the system's protobuf runtime)."""
import os
import re
import shutil
import subprocess
from typing import List, Optional

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (the other PEP 517 hooks)


def usable_protoc() -> Optional[str]:
    """Path of the protoc to run, or None to use grpcio-tools."""
    explicit = os.environ.get("SOFTMAX_PROTOC")
    if explicit:
        return explicit
    protoc = shutil.which("protoc")
    if not protoc:
        return None
    try:
        version = subprocess.run([protoc, "--version"], capture_output=True, text=True,
                                 check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"(\d+)\.(\d+)", version)
    if not match:
        return None
    major, minor = int(match.group(1)), int(match.group(2))
    # protoc 3.21 prints "libprotoc 3.21.12"; from 22 on it prints "libprotoc 25.1".
    return protoc if (major, minor) >= (3, 20) else None


def _generator() -> List[str]:
    return [] if usable_protoc() else ["grpcio-tools"]


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + _generator()


def get_requires_for_build_editable(config_settings=None):
    return _setuptools.get_requires_for_build_editable(config_settings) + _generator()
