"""Starting softmax-server for benchmarks and end-to-end tests, and learning
the ports it listens on.

A Server is one softmax-server process on loopback whose ports the kernel
picks. With listening_file=True the addresses come from the JSON file the
server writes once it listens (--listening_file); otherwise, for binaries of
revisions that may predate that flag (a benchmark comparing two), from the
line it logs then, in either log format:

  softmax-server: listening grpc=127.0.0.1:41251 http=off metrics=127.0.0.1:40017
  {"msg":"listening","grpc":"127.0.0.1:41251","http":"off","metrics":"..."}

Thread safety: a Server is used from one thread at a time.
"""

import collections
import json
import os
import re
import signal
import subprocess
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

_LISTENING_TEXT = re.compile(
    r"softmax-server: listening grpc=(\S+) (?:http=(\S+) )?metrics=(\S+)")
_LISTENING_JSON = re.compile(
    r'"msg":"listening","grpc":"([^"]+)","http":"([^"]+)","metrics":"([^"]+)"')

# Each address as the server printed it: "off" for a listener turned off.
Listening = collections.namedtuple("Listening", "grpc http metrics")


def parse_listening(output):
    """The addresses of the first "listening" line in `output` (text or JSON
    log format), or None when there is none yet."""
    match = _LISTENING_TEXT.search(output) or _LISTENING_JSON.search(output)
    if match is None:
        return None
    grpc_address, http_address, metrics_address = match.groups()
    return Listening(grpc_address, http_address or "off", metrics_address)


def find_binaries(bundle=None, server=None, client=None):
    """(softmax-server, softmax-client) paths: a release bundle's launchers
    when `bundle` is given, else `server` / `client`, else the environment's
    SOFTMAX_SERVER_BIN / SOFTMAX_CLIENT_BIN, else build/bin/ of this
    checkout."""
    if bundle:
        return os.path.join(bundle, "softmax-server"), os.path.join(bundle, "softmax-client")
    return (server or os.environ.get("SOFTMAX_SERVER_BIN")
            or os.path.join(REPO, "build", "bin", "softmax-server"),
            client or os.environ.get("SOFTMAX_CLIENT_BIN")
            or os.path.join(REPO, "build", "bin", "softmax-client"))


class Server:
    """One softmax-server process on loopback with kernel-picked ports.

    The constructor returns once the server listens, with .grpc_address,
    .http_address and .metrics_address set ("off" for a listener turned off
    with http=False / metrics=False); it raises RuntimeError, with the
    server's output, when the server exits or stays silent for
    `startup_timeout` seconds. stop() asks for an orderly exit and returns
    the exit code; kill() is the always-safe cleanup.

    `log_path`: where the server's output goes (a temporary file, removed by
    kill(), when None). `env`: variables added to the server's environment.
    `prefix`: arguments put before the binary (e.g. ["taskset", "-c", "0"]).
    `listening_file`: learn the addresses from --listening_file (beside the
    log; .listening then holds the whole file: pid, version, revision too)
    instead of the log line.
    """

    def __init__(self, binary, *extra_args, device="cpu", http=True, metrics=True,
                 log_path=None, env=None, prefix=(), preexec_fn=None, startup_timeout=60.0,
                 listening_file=False):
        if log_path is None:
            self.log = tempfile.NamedTemporaryFile(
                mode="w+", prefix="softmax-server-", suffix=".log", delete=False)
            self._own_log = True
        else:
            self.log = open(log_path, "w")
            self._own_log = False
        self.log_path = self.log.name
        self.args = [*prefix, binary, "--grpc_address=127.0.0.1:0",
                     "--metrics_address=127.0.0.1:0" if metrics else "--metrics_address=",
                     "--http_address=127.0.0.1:0" if http else "--http_address=",
                     f"--device={device}", *extra_args]
        self.listening_path = f"{self.log_path}.listening.json" if listening_file else None
        if self.listening_path:
            self.args.append(f"--listening_file={self.listening_path}")
        self.listening = None
        self.process = subprocess.Popen(
            self.args, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=preexec_fn, env=None if env is None else {**os.environ, **env})
        self.grpc_address = self.http_address = self.metrics_address = None
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline:
            listening = self._read_listening()
            if listening:
                self.grpc_address, self.http_address, self.metrics_address = listening
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.02)
        output = self.output()
        self.kill()
        raise RuntimeError(
            f"softmax-server did not report 'listening' (exit code "
            f"{self.process.returncode}); args {self.args}; output:\n{output}")

    def _read_listening(self):
        """The addresses the server listens on, or None while it does not yet."""
        if self.listening_path is None:
            return parse_listening(self.output())
        try:
            with open(self.listening_path, encoding="utf-8") as f:
                self.listening = json.load(f)  # whole: the server renames it into place
        except FileNotFoundError:
            return None
        return Listening(self.listening["grpc"], self.listening["http"],
                         self.listening["metrics"])

    def output(self):
        """Everything the server has written so far."""
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=60.0):
        """Sends `sig` and waits up to `timeout` s for the exit; returns the
        exit code. Raises subprocess.TimeoutExpired when the server is still
        running then (kill() remains to be called)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)

    def kill(self):
        """Ends the server however it is doing (SIGKILL when still running)
        and closes its log; a temporary log is removed."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.log.close()
        if self._own_log and os.path.exists(self.log_path):
            os.unlink(self.log_path)
        if self.listening_path and os.path.exists(self.listening_path):
            os.unlink(self.listening_path)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.kill()

    def close(self):
        """The benchmarks' cleanup: an orderly stop (SIGTERM, up to 60 s),
        then kill()."""
        try:
            self.stop()
        except subprocess.TimeoutExpired:
            pass
        self.kill()
