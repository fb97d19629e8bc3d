"""Starting softmax-server for benchmarks and end-to-end tests, and learning
the ports it listens on.

A Server is one softmax-server process on loopback whose ports the kernel
picks; the addresses come from the JSON file the server writes once every
listener is up (--listening_file: grpc, http, metrics, pid, version,
revision), never from its log. Binaries older than that flag (before
revision ad3f940) cannot be started here: bench/service/ab.sh and
bench/transport/rounds.sh compare such revisions on fixed ports.

Thread safety: a Server is used from one thread at a time.
"""

import json
import os
import signal
import subprocess
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

def read_listening(path):
    """The --listening_file at `path` as a dict, or None while the server has
    not written it (it renames the whole file into place, so a file that
    exists is complete)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def wait_for_listening(path, process, timeout):
    """Polls for the --listening_file at `path` of the server `process` (a
    Popen) for up to `timeout` seconds: its dict once written, None when the
    process exits first or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listening = read_listening(path)
        if listening is not None:
            return listening
        if process.poll() is not None:
            return None
        time.sleep(0.02)
    return None


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


def add_server_arguments(parser, device="cpu", client=False):
    """Adds a script's flags for the server it starts: --device (default
    `device`), --bundle and --server (and --client when `client`), which
    find_binaries reads, and --server-arg, extra server flags (repeatable)
    that the script passes after its own."""
    parser.add_argument("--device", default=device,
                        help=f"the server's --device: cpu | cuda | cuda:N | auto (default {device})")
    parser.add_argument("--bundle", help="a release bundle folder (launchers inside)")
    parser.add_argument("--server", help="softmax-server binary (default: SOFTMAX_SERVER_BIN, "
                        "else build/bin/)")
    if client:
        parser.add_argument("--client", help="softmax-client binary (default: "
                            "SOFTMAX_CLIENT_BIN, else build/bin/)")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra softmax-server flag, after the script's own (repeatable; "
                             "e.g. --max_batch_rows=1024)")


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
    .listening holds the whole --listening_file (pid, version, revision too).
    """

    def __init__(self, binary, *extra_args, device="cpu", http=True, metrics=True,
                 log_path=None, env=None, prefix=(), preexec_fn=None, startup_timeout=60.0):
        if log_path is None:
            self.log = tempfile.NamedTemporaryFile(
                mode="w+", prefix="softmax-server-", suffix=".log", delete=False)
            self._own_log = True
        else:
            self.log = open(log_path, "w")
            self._own_log = False
        self.log_path = self.log.name
        self.listening_path = f"{self.log_path}.listening.json"
        if os.path.exists(self.listening_path):
            os.unlink(self.listening_path)  # a previous run's, beside a log_path given again
        self.args = [*prefix, binary, "--grpc_address=127.0.0.1:0",
                     "--metrics_address=127.0.0.1:0" if metrics else "--metrics_address=",
                     "--http_address=127.0.0.1:0" if http else "--http_address=",
                     f"--device={device}", f"--listening_file={self.listening_path}",
                     *extra_args]
        self.process = subprocess.Popen(
            self.args, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=preexec_fn, env=None if env is None else {**os.environ, **env})
        self.listening = wait_for_listening(self.listening_path, self.process, startup_timeout)
        if self.listening is not None:
            self.grpc_address, self.http_address, self.metrics_address = (
                self.listening["grpc"], self.listening["http"], self.listening["metrics"])
            return
        output = self.output()
        self.kill()
        raise RuntimeError(
            f"softmax-server did not write its --listening_file (exit code "
            f"{self.process.returncode}); args {self.args}; output:\n{output}")

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
        if os.path.exists(self.listening_path):
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
