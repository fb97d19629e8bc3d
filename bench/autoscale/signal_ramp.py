#!/usr/bin/env python3
"""Which load signal rises first: one softmax-server (CPU backend) under an
open-loop load ramp, the candidate autoscaling signals read from its /metrics
beside what the callers see at each step.

The server runs on one CPU (taskset, so the CPU backend has one worker) and
`softmax-client load` on another, so the client is never the bottleneck.
First a closed-loop run with 64 callers measures what the replica sustains
(C requests/s, with the batches that many callers make);
then open-loop Poisson steps offer fractions of C, lowest first, each for
--step_s seconds after a pause that lets the queue empty. Per step:

  queue/compute   increase of softmax_queue_duration_seconds_sum over the
                  increase of softmax_compute_duration_seconds_sum: what the
                  recording rule softmax:queue_to_compute:ratio_rate1m
                  computes (deploy/prometheus/autoscaling.yml)
  queued/cap      softmax_queued_requests / softmax_queue_capacity_requests,
                  mean and max of samples every 50 ms (the gauge a scrape sees)
  held/limit      softmax_held_bytes / softmax_held_bytes_limit, mean of samples
  queue/rest      the same queue seconds over the rest of the requests'
                  seconds in the server (softmax_request_duration_seconds_sum
                  less the queue's): transport, parsing, copies and compute
  in flight       increase of softmax_request_duration_seconds_sum over the
                  step's length (Little's law: mean requests in the server)
  p50, p99        the client's latency percentiles (from each request's
                  intended send time), and its UNAVAILABLE (rejected) count

    python3 -m bench.autoscale.signal_ramp [--shape=16x16384:float32] [--step_s=6]

--closed_loop=SHAPE,SHAPE,... instead prints, per payload, the queue/compute
and queue/rest ratios with one caller (nearly idle) and with 64 (saturated).
--device=cuda runs the GPU backend (give the server and the client a few CPUs
each, e.g. --server_cpu=0-3 --client_cpu=4-11).

Binaries: SOFTMAX_SERVER_BIN / SOFTMAX_CLIENT_BIN, else build/bin/. Needs two
CPUs and only the Python standard library.
"""

import argparse
import re
import sys
import threading
import time
import urllib.request

from bench.lib.load import run_load
from bench.lib.server import Server, find_binaries

SAMPLE = re.compile(r"^([a-z_]+)(\{[^}]*\})? (\S+)$", re.M)


def scrape(address):
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        text = r.read().decode()
    values = {}  # each name's samples summed over their labels
    for name, _, value in SAMPLE.findall(text):
        values[name] = values.get(name, 0.0) + float(value)
    return values


def start_server(server_cpu, device, extra):
    """softmax-server on CPUs `server_cpu` (taskset), gRPC and metrics only."""
    try:
        return Server(find_binaries()[0], *extra, device=device, http=False,
                      prefix=["taskset", "-c", server_cpu], startup_timeout=30)
    except RuntimeError as error:
        sys.exit(str(error))


CONNECTIONS = 1  # --connections, set from the command line


def load(client_cpu, target, shape, duration, rate=None, concurrency=None):
    """The report of one load run on CPUs `client_cpu` (exits without one)."""
    args = [f"--mix={shape}", f"--duration={duration}s", f"--connections={CONNECTIONS}",
            "--warmup=0s", "--timeout_ms=60000"]
    if rate:
        args += [f"--rate={rate:.1f}", "--arrival=poisson"]
    else:
        args += [f"--concurrency={concurrency}"]
    command, result, report = run_load(find_binaries()[1], target, args,
                                       prefix=["taskset", "-c", client_cpu])
    if report is None:
        sys.exit(f"load wrote no report ({result.returncode}): {' '.join(command)}\n"
                 f"{result.stderr}")
    return report


class Sampler(threading.Thread):
    """Samples the queue and held-bytes gauges every 50 ms."""

    def __init__(self, address):
        super().__init__(daemon=True)
        self.address, self.stop, self.samples = address, threading.Event(), []

    def run(self):
        while not self.stop.is_set():
            m = scrape(self.address)
            self.samples.append((m["softmax_queued_requests"] / m["softmax_queue_capacity_requests"],
                                 m["softmax_held_bytes"] / m["softmax_held_bytes_limit"]))
            time.sleep(0.05)


def closed_loop_table(options, target, metrics):
    print("| payload | callers | req/s | p50 ms | queue/compute | queue/rest |")
    print("|---|---|---|---|---|---|")
    for shape in options.closed_loop.split(","):
        load(options.client_cpu, target, shape, 1, concurrency=8)  # warm-up
        for callers in (1, 64):
            before = scrape(metrics)
            report = load(options.client_cpu, target, shape, 3, concurrency=callers)
            after = scrape(metrics)
            queue = (after["softmax_queue_duration_seconds_sum"] -
                     before["softmax_queue_duration_seconds_sum"])
            compute = (after["softmax_compute_duration_seconds_sum"] -
                       before["softmax_compute_duration_seconds_sum"])
            rest = (after["softmax_request_duration_seconds_sum"] -
                    before["softmax_request_duration_seconds_sum"]) - queue
            print(f"| {shape} | {callers} | {report['requests_per_s']:.0f} | "
                  f"{report['latency_us']['p50'] / 1e3:.3f} | {queue / compute:.3f} | "
                  f"{queue / rest:.3f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="16x16384:float32", help="load --mix entry")
    parser.add_argument("--step_s", type=float, default=6.0)
    parser.add_argument("--fractions", default="0.2,0.4,0.6,0.7,0.8,0.9,1.0,1.1,1.3,1.6,2.0,3.0")
    parser.add_argument("--server_cpu", default="0")
    parser.add_argument("--client_cpu", default="1")
    parser.add_argument("--server_args", default="", help="extra server flags, space-separated")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--connections", type=int, default=1,
                        help="the client's connections (one carries about 1-2.6 GB/s)")
    parser.add_argument("--closed_loop", default="", help="payloads: the one/64-caller table")
    options = parser.parse_args()
    global CONNECTIONS
    CONNECTIONS = options.connections

    server = start_server(options.server_cpu, options.device, options.server_args.split())
    target, metrics = server.grpc_address, server.metrics_address
    try:
        if options.closed_loop:
            closed_loop_table(options, target, metrics)
            return
        load(options.client_cpu, target, options.shape, 2, concurrency=64)  # warm-up
        capacity = load(options.client_cpu, target, options.shape, 5,
                        concurrency=64)["requests_per_s"]
        print(f"shape {options.shape}: the replica sustains C = {capacity:.0f} requests/s "
              f"(closed loop, 64 callers: batches as large as that load makes them)")
        print("| offered | req/s | p50 ms | p99 ms | rejected | queue/compute | queue/rest | "
              "queued/cap mean (max) | held/limit mean | in flight |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for fraction in map(float, options.fractions.split(",")):
            time.sleep(1.0)
            before, started = scrape(metrics), time.monotonic()
            sampler = Sampler(metrics)
            sampler.start()
            report = load(options.client_cpu, target, options.shape, options.step_s,
                          rate=fraction * capacity)
            sampler.stop.set()
            sampler.join()
            after, elapsed = scrape(metrics), time.monotonic() - started

            def delta(name):
                return after[name] - before[name]

            queue = delta("softmax_queue_duration_seconds_sum")
            compute = delta("softmax_compute_duration_seconds_sum")
            rest = delta("softmax_request_duration_seconds_sum") - queue
            queued = [q for q, _ in sampler.samples]
            held = [h for _, h in sampler.samples]
            latency = report["latency_us"]
            rejected = report["errors_by_code"].get("UNAVAILABLE", 0)
            print(f"| {fraction:.1f} C | {report['requests_per_s']:.0f} | "
                  f"{latency['p50'] / 1e3:.2f} | {latency['p99'] / 1e3:.2f} | {rejected} | "
                  f"{queue / compute if compute else 0:.3f} | "
                  f"{queue / rest if rest > 0 else 0:.3f} | "
                  f"{sum(queued) / len(queued):.4f} ({max(queued):.4f}) | "
                  f"{sum(held) / len(held):.5f} | "
                  f"{delta('softmax_request_duration_seconds_sum') / elapsed:.2f} |",
                  flush=True)
            # Let an overloaded queue empty before the next step.
            while scrape(metrics)["softmax_queued_requests"] > 0:
                time.sleep(0.2)
    finally:
        server.kill()


if __name__ == "__main__":
    main()
