"""make_cpu_limit, the fleet harness's CPU bound (a pod's CPU limit), on
whichever cgroup version this host has. Apart from the fleet's files: it
needs no Envoy, so it runs wherever cgroups can be made (the GPU machine
included)."""

import os
import subprocess
import sys
import time

import pytest

import fleet_util


def _process_cpu_s(pid):
    """User + system CPU seconds of a process (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_cpu_limit_holds_a_process_to_its_share():
    """make_cpu_limit, on whichever cgroup version the host has (v1's
    cpu.cfs_quota_us, or v2's cpu.max under a cgroup.subtree_control that
    hands the cpu controller down): a process spinning on a core inside it
    gets its share of a core and no more."""
    share = 0.2
    folder = fleet_util.make_cpu_limit(
        f"{fleet_util.NAMESPACE_PREFIX}{os.getpid()}-share", share)
    if folder is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no cgroup can hold a process to a share of a core (CI=true)")
        pytest.skip("no cgroup can hold a process to a share of a core here")
    version = "v1" if folder.startswith(fleet_util.CGROUP_CPU_V1) else "v2"
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with open(os.path.join(folder, "cgroup.procs"), "w") as f:
            f.write(str(spin.pid))
        started, cpu_before = time.monotonic(), _process_cpu_s(spin.pid)
        time.sleep(2)
        used = (_process_cpu_s(spin.pid) - cpu_before) / (time.monotonic() - started)
        throttled = fleet_util.cpu_stat(folder).get("nr_throttled", 0)
    finally:
        spin.kill()
        spin.wait()
        fleet_util.remove_cpu_limit(folder)
    print(f"cgroup {version} ({folder}): a spinning process held to {share} core used "
          f"{used:.3f} core, throttled in {throttled} periods")
    assert throttled > 0
    assert 0.02 < used <= 1.5 * share, used
