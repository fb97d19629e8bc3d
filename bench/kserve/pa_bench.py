#!/usr/bin/env python3
"""perf_analyzer against softmax-serve's KServe v2 endpoints (gRPC and HTTP),
beside softmax-client load on softmax.v1, and the same perf_analyzer command
against Triton Inference Server (PyTriton serving torch.softmax).

For every payload (1 x 1024 float32, 8 x 4096 float16, 64 x 32000 bfloat16)
and concurrency (1, 16, 64, 256):

  load           softmax-client load on softmax.v1 (bench/service/run.py's
                 settings: min(concurrency, 8) connections, closed loop)
  pa-grpc        perf_analyzer -i grpc on inference.GRPCInferenceService
                 (every perf_analyzer call --async --max-threads 1 unless
                 --pa-mode=sync; its peak memory is sampled and capped)
  pa-http        perf_analyzer -i http (binary tensors) on the HTTP port
  pytriton-grpc  perf_analyzer -i grpc on PyTriton (pytriton-http with
                 --peer-protocols=grpc,http)

perf_analyzer reads its input from --input-data, a JSON file of the raw
tensor bytes (b64) of random normal values, so FP16 and BF16 travel as real
numbers of their type (perf_analyzer would otherwise send random bytes, NaNs
among them). Our models are addressed by type (softmax, softmax_fp16,
softmax_bf16; shape [rows, cols]); PyTriton's models carry the same names
with a batch dimension, so the command differs only in the URL and in
`-b rows` with the row shape.

Validate, then time: before any point, each server's answers to each payload
over each protocol are compared with a float64 reference (and softmax.v1's
with `softmax-client load --verify`); a failed check is reported in the table
and makes the run exit non-zero (the points are timed all the same, as
bench/service/run.py does).

Servers start once: PyTriton first (it boots while ours is checked), its
points, then it stops; then ours, each point's three drivers back to back.
results.json (rewritten after every point), results.csv, table.md and
plot.png land in --out; logs under --out/logs.
"""
import argparse
import base64
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np

from bench.kserve import summarise
from bench.lib import load, reference
from bench.lib.server import Server, find_binaries
from bench.service import run as service_run

HERE = os.path.dirname(os.path.abspath(__file__))

PAYLOADS = ["1x1024:float32", "8x4096:float16", "64x32000:bfloat16"]
MODELS = {"float32": "softmax", "float16": "softmax_fp16", "bfloat16": "softmax_bf16"}
DATATYPES = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16"}
# PyTriton has no BF16 NumPy dtype: its softmax_bf16 takes the bits as UINT16.
PEER_DATATYPES = {"float32": "FP32", "float16": "FP16", "bfloat16": "UINT16"}
MAX_DRIVER_FAILURES = 3
# perf_analyzer's resident memory is sampled this often (seconds) for its peak
# and for --pa-memory-limit-gb.
RSS_SAMPLE_S = 0.2


def parse_payload(spec):
    dims, _, dtype = spec.partition(":")
    rows, cols = (int(d) for d in dims.split("x"))
    return rows, cols, dtype


def make_input(spec, seed):
    """(values as float32, exactly representable in the payload's type; raw
    little-endian bytes of the payload's type)."""
    rows, cols, dtype = parse_payload(spec)
    values = np.random.default_rng(seed).normal(0.0, 2.0, size=(rows, cols)).astype(np.float32)
    if dtype == "float16":
        half = values.astype("<f2")
        return half.astype(np.float32), half.tobytes()
    if dtype == "bfloat16":
        bits = reference.float_to_bfloat16_bits(values).astype("<u2")
        return reference.bfloat16_bits_to_float(bits), bits.tobytes()
    return values, values.astype("<f4").tobytes()


def write_pa_data(path, raw, shape):
    with open(path, "w") as f:
        json.dump({"data": [{"INPUT": {"content": {"b64": base64.b64encode(raw).decode()},
                                       "shape": list(shape)}}]}, f)


# ------------------------------------------------------------------ servers

class PeerServer:
    """pytriton_peer.py in a session of its own (tritonserver and the model
    stubs are its children), stopped with its whole process group."""

    def __init__(self, python, backend, port_base, log_path):
        self.log = open(log_path, "w")
        self.port_base = port_base
        self.grpc = f"127.0.0.1:{port_base + 1}"
        self.http = f"127.0.0.1:{port_base}"
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [python, os.path.join(HERE, "pytriton_peer.py"), f"--backend={backend}",
             f"--port-base={port_base}"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)

    def wait_ready(self, timeout):
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if all(http_ok(f"http://{self.http}/v2/models/{m}/ready") for m in MODELS.values()):
                return True
            time.sleep(0.5)
        return False

    def stop(self):
        # PyTriton waits out open connections for 30 s on SIGINT; the figures
        # are taken, so the group goes at once.
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()
        self.log.close()


def http_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


# ------------------------------------------------------------------ validation

def check_answers(kind, url, spec, values, peer):
    """One inference over `kind` (grpc | http) with tritonclient, compared
    with the float64 reference under bench.lib.reference's tolerance contract.
    Returns a dict with ok, the largest errors and, when not ok, the problem."""
    rows, cols, dtype = parse_payload(spec)
    model = MODELS[dtype]
    if kind == "grpc":
        import tritonclient.grpc as tc
    else:
        import tritonclient.http as tc
    if peer and dtype == "bfloat16":
        datatype, candidates = "UINT16", [reference.float_to_bfloat16_bits(values)]
    else:
        datatype = DATATYPES[dtype]
        candidates = [values.astype(np.float16) if dtype == "float16" else values]
        if dtype == "bfloat16":
            try:  # tritonclient >= 2.70 takes BF16 as ml_dtypes.bfloat16 only,
                import ml_dtypes  # older ones float32 (each word's upper half kept)
                candidates.insert(0, values.astype(ml_dtypes.bfloat16))
            except ImportError:
                pass
    from tritonclient.utils import InferenceServerException
    binary = {"binary_data": True} if kind == "http" else {}
    client = tc.InferenceServerClient(url)
    try:
        tensor = tc.InferInput("INPUT", [rows, cols], datatype)
        for index, data in enumerate(candidates):
            try:
                tensor.set_data_from_numpy(data, **binary)
                break
            except InferenceServerException:  # this tritonclient wants the next form
                if index + 1 == len(candidates):
                    raise
        outputs = [tc.InferRequestedOutput("OUTPUT", **binary)]
        result = client.infer(model, [tensor], outputs=outputs)
        out = result.as_numpy("OUTPUT")
    except Exception as error:  # noqa: BLE001 - any failure fails the check
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}
    finally:
        client.close()
    if out.dtype == np.uint16:
        out = reference.bfloat16_bits_to_float(out)
    out = np.asarray(out.astype(np.float32), dtype=np.float64).reshape(rows, cols)
    ref = reference.softmax(values)
    problem = reference.mismatch(out, ref, dtype)
    check = {"ok": problem is None, "max_abs_error": float(np.abs(out - ref).max()),
             "max_rel_error": reference.max_relative_error(out, ref)}
    if problem is not None:
        check["error"] = problem
    return check


# ------------------------------------------------------------------ drivers

def pa_command(args, model, protocol, url, data_path, batch, concurrency, csv_path):
    command = [args.perf_analyzer, "-m", model, "-i", protocol, "-u", url,
               "--input-data", data_path, "--concurrency-range", f"{concurrency}:{concurrency}",
               "--measurement-interval", str(args.pa_interval_ms),
               "--stability-percentage", str(args.pa_stability),
               "--max-trials", str(args.pa_max_trials), f"--{args.pa_mode}", "-f", csv_path]
    if args.pa_mode == "async":  # sync mode runs one thread per request in flight
        command += ["--max-threads", str(args.pa_max_threads)]
    if batch > 1:
        command += ["-b", str(batch)]
    return command + args.pa_arg


def parse_pa(csv_path, stdout, concurrency, batch):
    """perf_analyzer's figures for the point: its CSV row, else its summary."""
    figures = {}
    if os.path.exists(csv_path):
        with open(csv_path, newline="") as f:
            for row in csv.DictReader(f):
                if (row.get("Concurrency") or "").strip() != str(concurrency):
                    continue
                if not row.get("Inferences/Second") or not row.get("p99 latency"):
                    continue
                figures = {"infer_per_s": float(row["Inferences/Second"])}
                for column, key in (("p50 latency", "p50_ms"), ("p90 latency", "p90_ms"),
                                    ("p99 latency", "p99_ms"), ("Avg latency", "avg_ms")):
                    if row.get(column):  # microseconds
                        figures[key] = float(row[column]) / 1e3
    if not figures:
        throughput = re.findall(r"Throughput: ([\d.]+) infer/sec", stdout)
        p99 = re.findall(r"p99 latency: (\d+) usec", stdout)
        if throughput and p99:
            figures = {"infer_per_s": float(throughput[-1]), "p99_ms": float(p99[-1]) / 1e3}
    if figures:
        # perf_analyzer counts inferences: rows of the batch dimension per request.
        figures["requests_per_s"] = figures["infer_per_s"] / batch
    return figures


def resident_bytes(pid):
    """VmRSS of `pid` and of its descendants (a wrapper script's perf_analyzer
    is its child); 0 once they are gone."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    pending += [int(child) for child in f.read().split()]
        except (OSError, ValueError):
            continue
    return total


def machine_memory_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemTotal")


def run_watched(command, log_path, timeout, memory_limit):
    """Runs `command` in a session of its own, its output (after the command
    line) in `log_path`, sampling its resident memory. Ends the session past
    `timeout` seconds or `memory_limit` bytes. Returns (exit code, or "timeout"
    or "memory limit"; peak resident bytes)."""
    with open(log_path, "w") as log:
        log.write(" ".join(command) + "\n\n")
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        peak = 0
        while True:
            try:
                return process.wait(timeout=RSS_SAMPLE_S), peak
            except subprocess.TimeoutExpired:
                pass
            peak = max(peak, resident_bytes(process.pid))
            if peak > memory_limit or time.monotonic() > deadline:
                reason = "memory limit" if peak > memory_limit else "timeout"
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                log.write(f"\n[pa_bench: stopped, {reason}: peak resident "
                          f"{peak / (1 << 30):.2f} GiB]\n")
                return reason, peak


def run_pa_point(args, logs, server, protocol, url, spec, concurrency, data_path, batch):
    rows, cols, dtype = parse_payload(spec)
    name = f"{server}-pa-{protocol}-{rows}x{cols}-{dtype}-c{concurrency}"
    csv_path = os.path.join(logs, name + ".csv")
    command = pa_command(args, MODELS[dtype], protocol, url, data_path, batch, concurrency,
                         csv_path)
    entry = {"server": server, "driver": f"pa-{protocol}" if server == "ours" else
             f"pytriton-{protocol}", "protocol": f"kserve-{protocol}", "payload": spec,
             "concurrency": concurrency, "command": " ".join(["perf_analyzer"] + command[1:])}
    if not args.perf_analyzer:
        entry.update(ok=False, skipped="perf_analyzer not found")
        return entry
    started = time.monotonic()
    log_path = os.path.join(logs, name + ".log")
    code, peak_rss = run_watched(command, log_path, args.pa_timeout,
                                 args.pa_memory_limit_gb * (1 << 30))
    with open(log_path, errors="replace") as f:
        stdout = f.read()
    figures = parse_pa(csv_path, stdout, concurrency, batch)
    entry.update(figures, exit_code=code, seconds=round(time.monotonic() - started, 1),
                 peak_rss_mb=round(peak_rss / (1 << 20)), ok=code == 0 and bool(figures))
    if not entry["ok"]:
        tail = [line for line in stdout.strip().splitlines() if line.strip()][-3:]
        entry["error"] = " | ".join(tail)
    return entry


def run_load_point(args, logs, address, spec, concurrency):
    settings = argparse.Namespace(connections=args.connections, warmup=args.load_warmup,
                                  duration=args.load_duration, timeout_ms=600000, stream=False,
                                  big_bytes=16 << 20, big_requests=16)
    load_args = service_run.point_args(settings, spec, concurrency)
    entry = {"server": "ours", "driver": "load", "protocol": "softmax.v1", "payload": spec,
             "concurrency": concurrency, "command": "softmax-client load " + " ".join(load_args)}
    _, result, report = load.run_load(args.client, address, load_args,
                                      os.path.join(logs, "load-point.json"))
    if report is None:
        entry.update(ok=False, exit_code=result.returncode, error=result.stderr.strip()[-300:])
        return entry
    entry.update(ok=result.returncode == 0 and report["errors"] == 0,
                 exit_code=result.returncode, requests_per_s=report["requests_per_s"],
                 p50_ms=report["latency_us"]["p50"] / 1e3,
                 p90_ms=report["latency_us"]["p90"] / 1e3,
                 p99_ms=report["latency_us"]["p99"] / 1e3, errors=report["errors"],
                 report=report)
    return entry


def show(entry):
    label = f"   {entry['payload']:>18} c={entry['concurrency']:<4} {entry['driver']:>14}"
    if entry.get("ok"):
        print(f"{label} {entry['requests_per_s']:>11,.1f} req/s  p99 "
              f"{entry['p99_ms']:9.3f} ms", flush=True)
    else:
        reason = str(entry.get("skipped") or entry.get("error"))
        print(f"{label} FAILED: {reason[-240:]}", flush=True)


# ------------------------------------------------------------------ main

def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", help="release bundle folder (launchers inside)")
    parser.add_argument("--server", help="softmax-server binary (default: the bundle's)")
    parser.add_argument("--client", help="softmax-client binary (default: the bundle's)")
    parser.add_argument("--perf-analyzer", default=None,
                        help="perf_analyzer binary (default: on PATH; none: its points fail)")
    parser.add_argument("--device", default="cuda", help="our server's --device")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="extra flag for our server (repeatable)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--payloads", default=",".join(PAYLOADS))
    parser.add_argument("--concurrency", default="1,16,64,256")
    parser.add_argument("--drivers", default="load,pa-grpc,pa-http",
                        help="drivers on our server, of load, pa-grpc, pa-http")
    parser.add_argument("--peer", choices=["torch", "numpy", "none"], default="torch",
                        help="PyTriton peer's backend; none: no peer")
    parser.add_argument("--peer-protocols", default="grpc")
    parser.add_argument("--peer-port-base", type=int, default=8000)
    parser.add_argument("--peer-python", default=sys.executable)
    parser.add_argument("--peer-start-timeout", type=float, default=240)
    # perf_analyzer keeps a copy of every request's input and output tensors
    # until its window is summarised, and copies them twice more then, so the
    # window's length times the rate sets its memory (README.md); 1 s holds
    # two thirds of what the earlier 1.5 s did.
    parser.add_argument("--pa-interval-ms", type=int, default=1000)
    # Stable once three windows are within this many percent of their mean:
    # 100 accepts the first three, so a point takes about three windows.
    parser.add_argument("--pa-stability", type=int, default=100)
    parser.add_argument("--pa-max-trials", type=int, default=6)
    # Synchronous perf_analyzer (a thread per request in flight) stretched its
    # windows 3-5x against this server and stalled over HTTP at 32 callers and
    # more (echo server, Debian 12); --async ran the same points in 8-9 s.
    parser.add_argument("--pa-mode", choices=["async", "sync"], default="async",
                        help="perf_analyzer's --async or --sync, for every driver")
    # One worker thread: perf_analyzer then records every request under one
    # lock, which its summary holds while copying the window's records, so
    # sending pauses for that copy. With its default 4 threads the summary
    # fell behind and memory grew without bound (echo server, 2 cores:
    # 8 x 4096 at 16 callers 8 GB; 64 x 32000 15 GB, no window in 45 s); with
    # 1 thread every 8 x 4096 and 64 x 32000 point at 16 and 64 callers, gRPC
    # and HTTP, ended in 5-9 s under 2.9 GB, at higher rates (README.md).
    parser.add_argument("--pa-max-threads", type=int, default=1,
                        help="perf_analyzer's --max-threads in --async mode")
    parser.add_argument("--pa-memory-limit-gb", type=float, default=None,
                        help="perf_analyzer is stopped past this resident memory (GiB; "
                        "default: half the machine's memory)")
    parser.add_argument("--pa-arg", action="append", default=[],
                        help="extra perf_analyzer flag (repeatable), e.g. -v")
    parser.add_argument("--pa-timeout", type=float, default=60,
                        help="seconds one perf_analyzer call may take")
    parser.add_argument("--load-duration", type=float, default=2.0)
    parser.add_argument("--load-warmup", type=float, default=0.5)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--deadline", type=float, default=0,
                        help="seconds after which remaining points are skipped (0: none)")
    args = parser.parse_args()

    started = time.monotonic()
    out = os.path.abspath(args.out)
    logs = os.path.join(out, "logs")
    os.makedirs(logs, exist_ok=True)
    bundle_server, bundle_client = find_binaries(args.bundle)
    args.server = args.server or bundle_server
    args.client = args.client or bundle_client
    if args.pa_memory_limit_gb is None:
        args.pa_memory_limit_gb = machine_memory_bytes() / 2 / (1 << 30)
    if args.perf_analyzer is None:
        from shutil import which
        args.perf_analyzer = which("perf_analyzer")
    payloads = [p for p in args.payloads.split(",") if p]
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    drivers = [d for d in args.drivers.split(",") if d]

    results = {"settings": {k: v for k, v in vars(args).items()},
               "machine": service_run.machine_description(),
               "revision": service_run.git_revision(), "validation": [], "points": []}

    def save():
        results["seconds"] = round(time.monotonic() - started, 1)
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)

    def out_of_time():
        return args.deadline and time.monotonic() - started > args.deadline

    failures = {}

    def given_up(driver):
        # A driver that failed MAX_DRIVER_FAILURES points is not tried further
        # (a perf_analyzer that cannot drive a server would eat the time budget).
        return failures.get(driver, 0) >= MAX_DRIVER_FAILURES

    def record(entry):
        results["points"].append(entry)
        if not entry.get("ok"):
            failures[entry["driver"]] = failures.get(entry["driver"], 0) + 1
        show(entry)
        save()

    peer = None
    if args.peer != "none":
        peer = PeerServer(args.peer_python, args.peer, args.peer_port_base,
                          os.path.join(logs, "pytriton.log"))

    inputs, data_ours, data_peer = {}, {}, {}
    for index, spec in enumerate(payloads):
        rows, cols, _ = parse_payload(spec)
        values, raw = make_input(spec, seed=index + 1)
        inputs[spec] = values
        data_ours[spec] = os.path.join(logs, f"input-{rows}x{cols}.json")
        write_pa_data(data_ours[spec], raw, [rows, cols])
        # PyTriton's requests: one row's data, repeated -b rows times.
        data_peer[spec] = os.path.join(logs, f"input-row-{rows}x{cols}.json")
        write_pa_data(data_peer[spec], raw[:len(raw) // rows], [cols])

    ours = Server(args.server, *args.server_arg, device=args.device, metrics=False,
                  log_path=os.path.join(logs, "server.log"))
    failed = False

    def validate(server, kind, url, spec):
        """check_answers recorded and printed; True when the answers matched."""
        check = check_answers(kind, url, spec, inputs[spec], peer=server == "pytriton")
        check.update(server=server, protocol=f"kserve-{kind}", payload=spec)
        results["validation"].append(check)
        print(f"   check {spec} {server} kserve-{kind}: {'ok' if check['ok'] else 'FAILED'} "
              f"{check}", flush=True)
        return check["ok"]

    try:
        print(f"== softmax-serve: gRPC {ours.grpc_address}, HTTP {ours.http_address}", flush=True)
        for spec in payloads:
            for kind, url in (("grpc", ours.grpc_address), ("http", ours.http_address)):
                failed |= not validate("ours", kind, url, spec)
            verify = service_run.verify_payload(
                argparse.Namespace(big_bytes=16 << 20, timeout_ms=600000), args.client,
                ours.grpc_address, spec, logs)
            verify.update(server="ours", protocol="softmax.v1", payload=spec)
            results["validation"].append(verify)
            failed |= not verify["ok"]
        save()
        if failed:
            print("validation FAILED (timed all the same, as bench/service/run.py does; "
                  "the run exits non-zero)", file=sys.stderr)

        if peer is not None:
            ready = peer.wait_ready(args.peer_start_timeout)
            boot = round(time.monotonic() - peer.started, 1)
            results["peer_start_s"] = boot
            print(f"== PyTriton: {'ready' if ready else 'NOT READY'} after {boot} s", flush=True)
            peer_protocols = [p for p in args.peer_protocols.split(",") if p]
            if ready:
                for spec in payloads:
                    for kind in peer_protocols:
                        url = peer.grpc if kind == "grpc" else peer.http
                        failed |= not validate("pytriton", kind, url, spec)
                save()
            if ready:
                for spec in payloads:
                    rows = parse_payload(spec)[0]
                    for concurrency in concurrencies:
                        for kind in peer_protocols:
                            if out_of_time() or given_up(f"pytriton-{kind}"):
                                continue
                            url = peer.grpc if kind == "grpc" else peer.http
                            record(run_pa_point(args, logs, "pytriton", kind, url, spec,
                                                concurrency, data_peer[spec], rows))
            peer.stop()
            peer = None

        for spec in payloads:
            for concurrency in concurrencies:
                for driver in drivers:
                    if out_of_time() or given_up(driver):
                        continue
                    if driver == "load":
                        entry = run_load_point(args, logs, ours.grpc_address, spec, concurrency)
                    else:
                        kind = driver.split("-", 1)[1]
                        url = ours.grpc_address if kind == "grpc" else ours.http_address
                        entry = run_pa_point(args, logs, "ours", kind, url, spec, concurrency,
                                             data_ours[spec], 1)
                    record(entry)
    finally:
        if peer is not None:
            peer.stop()
        ours.close()
        save()
        for path in list(data_ours.values()) + list(data_peer.values()):
            os.unlink(path)  # megabytes of base64, made again from the seeds

    summarise.main([os.path.join(out, "results.json"), "--out", out])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
