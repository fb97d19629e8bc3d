"""One run of `softmax-client load` and its JSON report.

The load client measures; this wrapper only builds its command line, runs
it, and reads back the report it wrote with --json.
"""

import collections
import json
import os
import subprocess
import tempfile

# command: the argument list run; result: its subprocess.CompletedProcess
# (stdout and stderr as text); report: the --json report as a dict, or None
# when the client wrote none.
LoadRun = collections.namedtuple("LoadRun", "command result report")


def run_load(client, target, load_args, json_path=None, csv_path=None, timeout=900,
             env=None, prefix=()):
    """Runs `client load --target=TARGET --quiet --json=... LOAD_ARGS` and
    returns a LoadRun. The report goes through `json_path` (removed after
    reading; a temporary file when None); with `csv_path` the client also
    appends its CSV rows there. `env` replaces the client's environment,
    `prefix` goes before the binary (e.g. taskset). Raises
    subprocess.TimeoutExpired past `timeout` seconds; a non-zero exit is
    the caller's to judge (result.returncode)."""
    temporary = None
    if json_path is None:
        temporary = tempfile.NamedTemporaryFile(prefix="softmax-load-", suffix=".json",
                                                delete=False)
        temporary.close()
        json_path = temporary.name
        os.unlink(json_path)
    command = [*prefix, client, "load", f"--target={target}", "--quiet",
               f"--json={json_path}", *load_args]
    if csv_path:
        command.append(f"--csv={csv_path}")
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    report = None
    if os.path.exists(json_path):
        try:
            with open(json_path) as f:
                report = json.load(f)
        except ValueError:
            report = None
        os.unlink(json_path)
    return LoadRun(command, result, report)
