"""The sample outputs of the README and docs/ come from real runs: each block between
<!-- sample:NAME:begin --> and <!-- sample:NAME:end --> holds a command (a
```sh or ```python block, calling localhost:50051) and the output it printed.
Here each command runs against a real server (CPU backend) and its output
must match the document's block in everything but the figures (timings, sums,
ids: every number is compared as "N").

    SOFTMAX_README_WRITE=1 ctest -R e2e.readme    # rewrites the blocks from this run
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import e2e_util

ROOT = Path(__file__).resolve().parent.parent
# The README and the documents behind it.
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SAMPLE = re.compile(
    r"(<!-- sample:(?P<name>[\w-]+):begin -->\n```(?P<language>sh|python)\n(?P<command>.*?)```\n"
    r"```\n)(?P<output>.*?)(```\n<!-- sample:(?P=name):end -->)", re.S)
NUMBER = re.compile(r"[-+]?\d+(?:\.\d*)?(?:e[-+]?\d+)?")


def samples():
    """{name: (document, match)} of every sample block."""
    found = [(m.group("name"), path, m) for path in DOCUMENTS
             for m in SAMPLE.finditer(path.read_text())]
    names = [name for name, _, _ in found]
    assert len(names) == len(set(names)), f"a sample name stands twice: {names}"
    return {name: (path, m) for name, path, m in found}


def shape(text):
    """`text` without its figures and with runs of blanks as one space."""
    return [re.sub(r"\s+", " ", NUMBER.sub("N", line)).strip() for line in text.splitlines()]


def run_sample(match, server):
    command = match.group("command").replace("localhost:50051", server.grpc_address)
    if match.group("language") == "sh":
        command = command.replace("build/bin/softmax-client", e2e_util.CLIENT_BIN)
        args = ["bash", "-c", "set -euo pipefail\n" + command]
    else:
        command = command.replace('"build/python"', repr(os.environ["SOFTMAX_PYTHON_DIR"]))
        args = [sys.executable, "-c", command]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd="/")
    assert result.returncode == 0, (match.group("name"), result.stdout, result.stderr)
    return result.stdout


def test_readme_has_the_samples():
    assert {"quick-start", "softmax-client", "python-grpcio"} <= set(samples())


@pytest.mark.parametrize("name", ["quick-start", "softmax-client", "python-grpcio"])
def test_sample_output_matches_a_real_run(server, name):
    path, match = samples()[name]
    output = run_sample(match, server)
    if os.environ.get("SOFTMAX_README_WRITE"):
        text = path.read_text()
        path.write_text(text[:match.start("output")] + output + text[match.end("output"):])
        return
    assert shape(output) == shape(match.group("output")), (
        f"{path.name} sample {name} is out of date (SOFTMAX_README_WRITE=1 rewrites it); "
        f"this run printed:\n{output}")
