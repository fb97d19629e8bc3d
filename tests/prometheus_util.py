"""Debian's real Prometheus for the end-to-end tests (test_metrics,
test_autoscale): started on a config the test writes, its TSDB and log in a
folder of the test's, on a free loopback port, and its HTTP API."""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path


def tool(name):
    path = shutil.which(name) or f"/usr/bin/{name}"
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{name} not found; install Debian's prometheus package "
                           "(scripts/install-deps.sh installs it)")
    return path


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """prometheus on `config`, its TSDB and log in `folder`, on a free
    loopback port; ready (/-/ready) when the constructor returns."""

    def __init__(self, config, folder, startup_timeout=60.0):
        self.log = open(Path(folder) / "prometheus.log", "w+")
        self.process = None
        # A port picked free may be taken before Prometheus binds it: retry.
        for _ in range(3):
            self.address = f"127.0.0.1:{free_port()}"
            self.process = subprocess.Popen(
                [tool("prometheus"), f"--config.file={config}",
                 f"--storage.tsdb.path={Path(folder) / 'data'}",
                 f"--web.listen-address={self.address}"],
                stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + startup_timeout
            while time.monotonic() < deadline and self.process.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://{self.address}/-/ready",
                                                timeout=2) as r:
                        if r.status == 200:
                            return
                except OSError:
                    pass
                time.sleep(0.2)
            if self.process.poll() is None:
                break  # running but never ready: do not retry
        output = self.output()
        self.stop()
        raise RuntimeError(f"prometheus did not become ready; output:\n{output}")

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def api(self, path, **params):
        """GET /api/v1/<path>?<params> (a list value repeats its parameter) ->
        the answer's data."""
        url = f"http://{self.address}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params, True)
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.log.close()
