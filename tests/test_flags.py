"""softmax-server's flags: --help lists exactly the server's own flags, the
table in docs/server.md is what the help text gives, --version names the version and
revision, --flagfile is read, and --listening_file tells where the server
listens."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

import e2e_util

ROOT = pathlib.Path(__file__).resolve().parent.parent
from scripts import flags_table

EXPECTED = {
    "grpc_address", "http_address", "metrics_address", "device", "max_tensor_bytes",
    "max_batch_rows", "max_batch_bytes", "max_queue_delay_us", "max_queued_requests",
    "max_held_bytes", "max_concurrent_streams", "max_connection_age_s", "max_stream_age_s", "tls_cert_file", "tls_key_file",
    "tls_client_ca_file", "auth_tokens_file", "reflection", "shared_memory", "shutdown_grace_s",
    "log_format", "access_log_one_in", "listening_file",
}


def test_help_lists_the_servers_flags_and_nothing_else():
    flags = flags_table.flags_from_help(e2e_util.SERVER_BIN)
    assert {name for name, _, _ in flags} == EXPECTED
    for name, help_text, default in flags:
        assert help_text, name
        assert default, name


def test_readme_table_matches_the_help_text():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "flags_table.py"),
                             e2e_util.SERVER_BIN, "--check", str(ROOT / "docs" / "server.md")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


def test_version_names_version_and_revision():
    result = e2e_util.run_server("--version", timeout=30)
    assert result.returncode == 0
    assert result.stdout.startswith("softmax-server 0."), result.stdout
    assert "(revision " in result.stdout and "Debug build" not in result.stdout
    allocator = re.search(r", allocator (tcmalloc|glibc)\)", result.stdout)
    assert allocator, result.stdout
    # The allocator it names is the one it loads.
    linked = subprocess.run(["ldd", e2e_util.SERVER_BIN], capture_output=True, text=True,
                            timeout=30).stdout
    assert ("libtcmalloc" in linked) == (allocator.group(1) == "tcmalloc"), linked


def test_flagfile_is_read(tmp_path):
    flagfile = tmp_path / "flags"
    flagfile.write_text("# a comment\n--device=tpu\n")
    result = e2e_util.run_server(f"--flagfile={flagfile}", "--grpc_address=127.0.0.1:0",
                                 "--metrics_address=", timeout=30)
    # The file's --device reached the server: it refuses the value, naming it.
    assert result.returncode == 1, result.stderr
    assert '--device: expected' in result.stderr and '"tpu"' in result.stderr, result.stderr


# Flags the server no longer has, each now a constant or derived: the CUDA
# tuning knobs (constants in server/cuda/cuda_backend.h), the idle dispatch
# (always on), the queue's byte bound (half of --max_held_bytes), the CPU
# threads (every core the process may use), the device memory cap (none), the
# lame duck (kLameDuck in server/server.cc).
REMOVED = ["cuda_streams", "dispatch_when_idle", "max_queued_bytes", "cpu_threads",
           "cuda_memory_limit_bytes", "lame_duck_ms"]


@pytest.mark.parametrize("name", REMOVED)
def test_removed_tuning_flags_are_refused(name):
    value = "false" if name == "dispatch_when_idle" else "1"
    result = e2e_util.run_server(f"--{name}={value}", "--metrics_address=", timeout=30)
    assert result.returncode == 1, result.stderr
    assert f"Unknown command line flag '{name}'" in result.stderr, result.stderr
    assert "listening" not in result.stderr


def test_removed_flags_are_refused_from_a_flagfile(tmp_path):
    flagfile = tmp_path / "flags"
    flagfile.write_text("--lame_duck_ms=1000\n")
    result = e2e_util.run_server(f"--flagfile={flagfile}", "--metrics_address=", timeout=30)
    assert result.returncode == 1, result.stderr
    assert "Unknown command line flag 'lame_duck_ms'" in result.stderr, result.stderr


@pytest.mark.parametrize("flag", ["max_connection_age_s", "max_stream_age_s"])
@pytest.mark.parametrize("value", ["-1", "2073601"])
def test_connection_age_out_of_range_is_refused_naming_the_flag(flag, value):
    result = e2e_util.run_server(f"--{flag}={value}", "--device=cpu", "--grpc_address=127.0.0.1:0",
                                 "--http_address=", "--metrics_address=", timeout=30)
    assert result.returncode == 1, result.stderr
    assert f"--{flag}: 0 (no maximum) to 2073600" in result.stderr, result.stderr
    assert "listening" not in result.stderr


def test_listening_file_names_the_bound_addresses_pid_and_revision(start_server):
    """--listening_file: the addresses the "listening" line names, with the
    ports the kernel picked for :0 (the harness starts every server so), the
    server's pid, and the version and revision --version prints."""
    server = start_server()
    listening = server.listening
    assert set(listening) == {"grpc", "http", "metrics", "pid", "version", "revision"}
    line = re.search(r"softmax-server: listening grpc=(\S+) http=(\S+) metrics=(\S+)",
                     server.output())
    assert line and line.groups() == (listening["grpc"], listening["http"],
                                      listening["metrics"]), server.output()
    for name in ("grpc", "http", "metrics"):
        host, port = listening[name].rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0, listening
    assert listening["pid"] == server.process.pid
    version = e2e_util.run_server("--version", timeout=30).stdout
    assert version.startswith(f"softmax-server {listening['version']} "
                              f"(revision {listening['revision']},"), (version, listening)
    assert e2e_util.health_check(server.channel()) == "SERVING"
    off = start_server("--http_address=", "--metrics_address=")
    assert (off.listening["http"], off.listening["metrics"]) == ("off", "off")


def test_listening_file_it_cannot_write_fails_the_start(tmp_path):
    path = tmp_path / "no-such-folder" / "listening.json"
    result = e2e_util.run_server("--device=cpu", "--grpc_address=127.0.0.1:0", "--http_address=",
                                 "--metrics_address=", f"--listening_file={path}", timeout=30)
    assert result.returncode == 1, result.stderr
    assert f"--listening_file={path}: cannot create" in result.stderr, result.stderr
    assert not path.exists()
