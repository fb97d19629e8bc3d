#!/usr/bin/env python3
"""Soak: softmax-server under a mixed load for a long time, with periodic
bursts of abuse, watching that every answer is right, every request is
answered once, and memory stays flat.

The normal load (traffic.py): --callers closed-loop callers dealt
round-robin over softmax.v1 unary, softmax.v1 bidirectional streams, and,
when tritonclient is installed, KServe v2 over gRPC and over HTTP; float32,
float16 and bfloat16; small and large shapes, some reduced over a non-last
axis; softmax and log-softmax; temperatures. Every answer is checked
against the float64 reference (bench.lib.reference).

The bursts (abuse.py): at half the warm-up, then every --burst-every
seconds, the cases of tests/test_abuse.py at a small scale: connections
advertising a zero receive window that send calls and read nothing (past
the server's --max_held_bytes), rapid reset, calls reset halfway through
their message, idle connections without a preface, half-open HTTP
connections on /metrics and the KServe port, bad request_ids, a tensor past
--max_tensor_bytes and a gzip bomb. Meanwhile the normal load may see only
right answers or the retryable UNAVAILABLE / RESOURCE_EXHAUSTED.

The watch (watch.py): every --sample-every seconds, the server's RSS,
threads and descriptors (/proc) and, from /metrics, the bytes requests hold
(softmax_held_bytes), the pinned staging and device memory of the caching
allocators and their backing allocations (GPU backend only).

FAILS (exit 1, the failed checks listed under the table) on any wrong
answer; any request without exactly one answer; any error code other than
the retryable two, or a retryable one outside a burst; an abuse case
answered otherwise than promised; a /metrics scrape that fails twice in a
row (one answered on the retry is listed in the notes); the server
dying or exiting non-zero on SIGTERM; bytes still held once the load stops;
RSS, pinned or device memory, or the backing allocations not flat after the
warm-up (watch.py says how that is judged; default: within 5% from minute 2
to the end).

Writes to --out: soak.json (every sample, the verdicts, the counts, the
abuse outcomes, the settings), soak.png (memory against time; needs
matplotlib), server.log.

Binaries: --bundle DIR (a release bundle), or --server, or
SOFTMAX_SERVER_BIN, else build/bin/ of this checkout. The generated
softmax.v1 stubs come from PYTHONPATH: build/python, or the bundle's python/
(`make gpu-bundle` puts them there).

Examples (from the checkout root):
  PYTHONPATH=build/python build/venv/bin/python -m bench.soak.soak --device=cpu \
      --duration=30m --out=/tmp/soak
  PYTHONPATH=$B/python python3 -m bench.soak.soak --bundle=$B --device=cuda --duration=8m \
      --out=$OUT/soak
"""

import argparse
import datetime
import json
import os
import platform
import signal
import sys
import threading
import time

from bench.lib.server import Server, add_server_arguments, find_binaries
from bench.soak import watch
MIB = 1 << 20
# The server's limits during the soak: small enough that the bursts reach
# them (the zero-window readers ask for 1.25x --max_held_bytes; a 24 MiB
# tensor is past the tensor limit), large enough for the normal load's 8 MiB
# tensors (many callers in flight want more: --server-arg=--max_held_bytes=...).
SERVER_ARGS = [f"--max_tensor_bytes={16 * MIB}", f"--max_held_bytes={128 * MIB}"]
TOO_BIG_BYTES = 24 * MIB
RETRYABLE_WINDOW_LINGER_S = 5.0


def seconds(text):
    """'90', '90s', '8.5m', '1h' -> seconds."""
    scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:], None)
    return float(text[:-1]) * scale if scale else float(text)


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    add_server_arguments(parser)
    parser.add_argument("--duration", type=seconds, default=1800.0,
                        help="how long the load runs: seconds, or with s/m/h (default 30m)")
    parser.add_argument("--warmup", type=seconds,
                        help="samples before this are the reference, not judged "
                             "(default: 2m, or a quarter of --duration when shorter than 8m)")
    parser.add_argument("--callers", type=int, default=4,
                        help="closed-loop callers, dealt round-robin over the protocols")
    parser.add_argument("--pause-ms", type=float, default=0.0,
                        help="each caller's pause between calls (to leave cores to others)")
    parser.add_argument("--burst-every", type=seconds, default=60.0,
                        help="seconds between the starts of abuse bursts")
    parser.add_argument("--no-abuse", action="store_true",
                        help="no abuse bursts, and the server with its default limits: every "
                             "call of every caller must then succeed (the soak of default flags)")
    parser.add_argument("--sample-every", type=seconds, default=2.0)
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="growth allowed after the warm-up (0.05 = 5%%)")
    parser.add_argument("--bulk-callers", type=int, default=0,
                        help="also run softmax-client load --verify with this many callers "
                             "(half unary, half streamed): C++ callers, for the many calls "
                             "in flight a GPU sees (default 0)")
    parser.add_argument("--no-kserve", action="store_true",
                        help="softmax.v1 traffic only (also when tritonclient is missing)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True, help="output folder")
    args = parser.parse_args()
    if args.warmup is None:
        args.warmup = 120.0 if args.duration >= 480 else args.duration / 4
    if not 0 < args.warmup < args.duration:
        parser.error("--warmup must be positive and shorter than --duration")
    return args


def locate(args):
    """(server binary, client binary): the client beside the server."""
    if args.bundle:
        server, client = find_binaries(args.bundle)
    else:
        server = find_binaries(server=args.server)[0]
        client = os.path.join(os.path.dirname(server), "softmax-client")
    return os.path.abspath(server), os.path.abspath(client)


def stubs_missing():
    """None when the softmax.v1 stubs import, else why not."""
    try:
        from softmax.v1 import softmax_pb2_grpc  # noqa: F401
    except ImportError as error:
        return str(error)
    return None


class Context:
    """What the abuse cases need to reach the server."""

    def __init__(self, server, held_limit):
        self.grpc = server.grpc_address
        self.http = server.http_address
        self.metrics = server.metrics_address
        self.held_limit = held_limit
        self.too_big_bytes = TOO_BIG_BYTES

    def scrape(self):
        try:
            return watch.server_metrics(self.metrics)
        except OSError:
            return {}


def flag_value(server_args, name):
    value = None
    for arg in server_args:
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
    return value


def wait_held_released(metrics_address, timeout):
    """softmax_held_bytes once it is 0, or its last value after `timeout`."""
    deadline = time.monotonic() + timeout
    held = None
    while time.monotonic() < deadline:
        try:
            held = watch.server_metrics(metrics_address)["softmax_held_bytes"]
        except OSError:
            held = None
        if held == 0:
            return 0
        time.sleep(0.2)
    return held


def fmt_bytes(value):
    return "n/a" if value is None else f"{value / MIB:,.1f} MiB"


def fmt_value(verdict, key):
    value = verdict.get(key)
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if verdict["kind"] == "counter" else fmt_bytes(value)


def print_report(report):
    settings = report["settings"]
    print(f"\nsoak: {settings['device']}, {settings['duration_s'] / 60:.1f} min "
          f"(warm-up {settings['warmup_s'] / 60:.1f} min), {settings['callers']} callers, "
          f"{report['bursts']} abuse bursts"
          f"{'' if settings.get('abuse', True) else ' (none asked for: default flags)'}, "
          f"{len(report['samples'])} samples")
    print("\n| series | level after warm-up | level at the end | growth | peak: warm-up, after "
          "| verdict |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for verdict in report["verdicts"].values():
        if verdict["ok"] is None:
            print(f"| {verdict['what']} | n/a | n/a | | | not measured |")
            continue
        if verdict["kind"] == "counter":
            start, end, peaks = fmt_value(verdict, "start"), fmt_value(verdict, "end"), ""
        else:
            start, end = fmt_value(verdict, "level_start"), fmt_value(verdict, "level_end")
            peaks = f"{fmt_value(verdict, 'warmup_peak')}, {fmt_value(verdict, 'peak')}"
        print(f"| {verdict['what']} | {start} | {end} | {verdict['growth']:+.1%} | {peaks} | "
              f"{'flat' if verdict['ok'] else 'GROWS'} |")
    print("\n| protocol | right | wrong | errors in bursts | errors otherwise |")
    print("| --- | ---: | ---: | --- | --- |")
    for protocol, row in report["by_protocol"].items():
        def codes(phase):
            found = row["errors"].get(phase, {})
            return ", ".join(f"{code} {n:,}" for code, n in sorted(found.items())) or "0"
        if "any" in row["errors"]:  # the bulk load: phases not told apart
            print(f"| {protocol} | {row['ok']:,} | {row['wrong']:,} | "
                  f"{codes('any')} (either) | |")
            continue
        print(f"| {protocol} | {row['ok']:,} | {row['wrong']:,} | {codes('burst')} | "
              f"{codes('steady')} |")
    for protocol, entry in report.get("long_streams", {}).items():
        print(f"\n{protocol}: one stream, open {entry['lived_s']} s, {entry['sent']:,} requests "
              f"sent, {entry['answered']:,} answered"
              + (f"; ENDED EARLY: {entry['ended_early']}" if entry["ended_early"] else
                 ", never ended by the server"))
    extremes = report["extremes"]
    print(f"\nRSS {fmt_bytes(extremes['rss_first'])} at the first sample, "
          f"{fmt_bytes(extremes['rss_at_warmup'])} at the end of the warm-up, "
          f"{fmt_bytes(extremes['rss_last'])} at the last under load; levels (medians of a "
          f"fifth) in the table; threads {extremes['threads']}, descriptors {extremes['fds']}")
    for note in report["notes"]:
        print(f"note: {note}")
    if report["failures"]:
        print("\nFAILED:")
        for failure in report["failures"]:
            print(f"  - {failure}")
    else:
        print("\nPASSED")


def main():
    args = parse_args()
    server_bin, client_bin = locate(args)
    missing = stubs_missing()
    if missing:
        sys.exit(f"soak.py: the softmax.v1 Python stubs do not import ({missing}); put their "
                 "folder on PYTHONPATH (build/python, or the bundle's python/)")
    from bench.soak import abuse, traffic

    os.makedirs(args.out, exist_ok=True)
    notes = []
    with_kserve = not args.no_kserve
    if with_kserve:
        missing = traffic.kserve_available()
        if missing:
            with_kserve = False
            notes.append(f"KServe traffic skipped: tritonclient unusable ({missing})")
    server_args = ([] if args.no_abuse else SERVER_ARGS) + args.server_arg
    held_limit = int(flag_value(server_args, "max_held_bytes") or 0)

    log_path = os.path.join(args.out, "server.log")
    server = Server(server_bin, *server_args, device=args.device, log_path=log_path)
    print(f"soak: server pid {server.process.pid} grpc={server.grpc_address} "
          f"http={server.http_address} metrics={server.metrics_address}; {args.duration / 60:.1f} min, warm-up "
          f"{args.warmup / 60:.1f} min, protocols {traffic.protocols(with_kserve)}", flush=True)
    started = time.monotonic()
    stop = threading.Event()
    bursts = abuse.Bursts(linger_s=RETRYABLE_WINDOW_LINGER_S)
    tally = traffic.Tally(bursts)
    sampler = watch.Sampler(
        server.process.pid, server.metrics_address, args.sample_every, stop,
        lambda: {"answered": tally.total(), "burst": bursts.active()}, started)
    sampler.start()
    endpoints = {"grpc": server.grpc_address, "http": server.http_address}
    callers = traffic.start_callers(args.callers, endpoints, tally, stop,
                                    args.pause_ms / 1e3, with_kserve, args.seed)
    # In the soak of default flags, one stream per streaming protocol lives
    # the whole soak and is never reopened (with bursts, an in-band refusal
    # on tritonclient's stream names no request, so it could not be told apart).
    long_streams = (traffic.start_long_streams(endpoints, tally, stop, with_kserve)
                    if args.no_abuse else [])
    bulk = None
    if args.bulk_callers:
        bulk = traffic.BulkLoad(client_bin, server.grpc_address, args.bulk_callers, args.duration,
                                args.out)
    abuser = abuse.Abuser(Context(server, held_limit), bursts, stop,
                          first_s=args.warmup / 2, every_s=args.burst_every)
    if not args.no_abuse:
        abuser.start()

    failures = []
    next_report = started + 60
    # A soak stopped from outside (SIGTERM: a time limit) takes its server and
    # load processes down with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        try:
            while time.monotonic() - started < args.duration:
                if server.process.poll() is not None:
                    failures.append(
                        f"the server exited ({server.process.returncode}) during the soak")
                    break
                time.sleep(min(1.0, max(0.0, args.duration - (time.monotonic() - started))))
                if time.monotonic() >= next_report:
                    next_report += 60
                    # What a run stopped from outside (a time limit) leaves behind.
                    with open(os.path.join(args.out, "soak.partial.json"), "w") as f:
                        json.dump({"samples": list(sampler.samples), "counts": tally.snapshot(),
                                   "abuse": abuser.results}, f, default=str)
                    last = sampler.samples[-1] if sampler.samples else {}
                    print(f"  {(time.monotonic() - started) / 60:5.1f} min: {tally.total():,} "
                          f"answers, {tally.total('ok'):,} right, RSS "
                          f"{fmt_bytes(last.get('rss_bytes'))}, pinned "
                          f"{fmt_bytes(last.get('pinned_bytes'))}, device "
                          f"{fmt_bytes(last.get('device_bytes'))}, held "
                          f"{fmt_bytes(last.get('softmax_held_bytes'))}", flush=True)
        except BaseException:
            if bulk:
                bulk.kill()
            raise
        finally:
            stop.set()
            stuck = traffic.wait_callers(callers + long_streams, traffic.CALL_TIMEOUT_S + 10)
            if abuser.is_alive():
                abuser.join(timeout=120)
            sampler.join(timeout=30)
            bulk_results = bulk.finish(traffic.CALL_TIMEOUT_S + 30) if bulk else []
        if stuck:
            failures.append(f"callers still waiting for an answer: {stuck}")
        alive = server.process.poll() is None
        held_after = wait_held_released(server.metrics_address, 15) if alive else None
        if alive:
            sampler.sample()  # the last sample, with the load stopped (not judged)
            sampler.samples[-1]["after_load"] = True
        server.close()
    except BaseException:
        stop.set()
        if bulk:
            bulk.kill()
        server.close()
        raise
    exit_code = server.process.returncode

    # ------------------------------------------------------------- verdicts
    samples = sampler.samples
    burst_windows = [[round(s - started, 3), round((e or time.monotonic()) - started, 3)]
                     for s, e in bursts.windows]
    verdicts = watch.judge(samples, args.warmup, args.tolerance)
    by_protocol = {}
    for row in tally.snapshot():
        entry = by_protocol.setdefault(row["protocol"], {
            "ok": 0, "wrong": 0, "errors": {"burst": {}, "steady": {}}})
        if row["outcome"] in ("ok", "wrong"):
            entry[row["outcome"]] += row["count"]
        else:
            phase = entry["errors"][row["phase"]]
            phase[row["outcome"]] = phase.get(row["outcome"], 0) + row["count"]

    for protocol, bulk_report, code, output in bulk_results:
        if bulk_report is None:
            failures.append(f"{protocol}: softmax-client load wrote no report (exit {code}): "
                            f"{output.strip()[-300:]}")
            continue
        entry = by_protocol.setdefault(protocol, {
            "ok": 0, "wrong": 0, "errors": {"burst": {}, "steady": {}, "any": {}}})
        entry["ok"] = bulk_report["ok"] - bulk_report["mismatches"]
        entry["wrong"] = bulk_report["mismatches"]
        entry["errors"]["any"] = dict(bulk_report["errors_by_code"])
        if args.no_abuse and bulk_report["errors"]:
            failures.append(f"{protocol}: {bulk_report['errors']} failed calls "
                            f"({bulk_report['errors_by_code']})")
        if args.no_abuse and code != 0:  # (with bursts: exit 1 for their refusals)
            failures.append(f"{protocol}: softmax-client load exited {code}: "
                            f"{output.strip()[-300:]}")
        if bulk_report["mismatches"]:
            failures.append(f"{protocol}: {bulk_report['mismatches']} wrong answers "
                            f"({bulk_report['first_mismatch']})")
        if bulk_report["verified"] != bulk_report["ok"]:
            failures.append(f"{protocol}: {bulk_report['ok']} answers, "
                            f"{bulk_report['verified']} verified")
    if tally.total("wrong"):
        failures.append(f"{tally.total('wrong')} wrong answers")
    wrong = sum(row["wrong"] for row in by_protocol.values())
    answers = sum(row["ok"] + row["wrong"] + sum(n for codes in row["errors"].values()
                                                   for n in codes.values())
                  for row in by_protocol.values())
    for outcome in ("unanswered", "duplicate"):
        if tally.total(outcome):
            failures.append(f"{tally.total(outcome)} requests {outcome}")
    for protocol, entry in by_protocol.items():
        for phase, codes in entry["errors"].items():
            for code, n in codes.items():
                if code in traffic.BROKEN:
                    continue
                if code not in traffic.RETRYABLE:
                    failures.append(f"{protocol}: {n} x {code} ({phase})")
                elif phase == "steady":  # ("any": the bulk load's, phase unknown)
                    failures.append(f"{protocol}: {n} x {code} outside the abuse bursts")
    long_protocols = [s.protocol for s in long_streams]
    for protocol in traffic.protocols(with_kserve) + [r[0] for r in bulk_results] + long_protocols:
        if not by_protocol.get(protocol, {}).get("ok"):
            failures.append(f"{protocol}: no right answer at all")
    failures += [f"abuse {text}" for text in abuser.unexpected()]
    if not bursts.windows and not args.no_abuse:
        failures.append("no abuse burst ran")
    for stream in long_streams:
        if stream.ended_early:
            failures.append(f"{stream.protocol}: the stream ended before the soak: "
                            f"{stream.ended_early}")
    for name, thread in ([("sampler", sampler), ("abuse", abuser)] + [(c.name, c) for c in callers]
                         + [(s.name, s) for s in long_streams]):
        if thread.crashed:
            failures.append(f"{name} crashed: {thread.crashed}")
    failures += [f"/metrics scrape failed at {text}" for text in sampler.failed_scrapes]
    if alive and held_after != 0:
        failures.append(f"softmax_held_bytes {held_after} once the load stopped (expected 0)")
    if alive and exit_code != 0:
        failures.append(f"the server exited {exit_code} on SIGTERM")
    for name, verdict in verdicts.items():
        if verdict["ok"] is False:
            failures.append(f"{verdict['what']} not flat after the warm-up: "
                            f"{verdict['growth']:+.1%} > {args.tolerance:.0%}")
    if verdicts["rss_bytes"]["ok"] is None:
        failures.append("too few samples to judge RSS")

    under_load = [s for s in samples if not s.get("after_load")]
    after = [s for s in under_load if s["t"] >= args.warmup]
    warm = [s for s in under_load if s["t"] < args.warmup]
    extremes = {
        "rss_first": samples[0]["rss_bytes"] if samples else None,
        "rss_at_warmup": warm[-1]["rss_bytes"] if warm else None,
        "rss_last": under_load[-1]["rss_bytes"] if under_load else None,
        "rss_growth": verdicts["rss_bytes"].get("growth") or 0.0,
        "threads": f"{min(s['threads'] for s in samples)}-{max(s['threads'] for s in samples)}"
        if samples else "n/a",
        "fds": f"{min(s['fds'] for s in samples)}-{max(s['fds'] for s in samples)}"
        if samples else "n/a",
    }
    if after:
        extremes["rss_start_after_warmup"] = after[0]["rss_bytes"]
    # Failures first (their detail is what a reader needs), then the rest.
    notes += sorted(tally.examples, key=lambda e: "(steady" not in e and " wrong " not in e)
    notes += [f"/metrics scrape at {text}; the retry answered" for text in sampler.retried_scrapes]
    report = {
        "settings": {
            "device": args.device, "duration_s": args.duration, "warmup_s": args.warmup,
            "callers": args.callers, "pause_ms": args.pause_ms,
            "burst_every_s": args.burst_every, "sample_every_s": args.sample_every,
            "tolerance": args.tolerance, "abuse": not args.no_abuse,
            "protocols": traffic.protocols(with_kserve) + long_protocols,
            "server_args": server.args[1:], "server_binary": server_bin,
            "command": " ".join(sys.argv),
            "host": platform.node(), "cpus": os.cpu_count(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
        "bursts": len(bursts.windows),
        "long_streams": {s.protocol: s.summary() for s in long_streams},
        "burst_windows_s": burst_windows,
        "verdicts": verdicts,
        "by_protocol": by_protocol,
        "answers": answers,
        "wrong": wrong,
        "abuse": abuser.results,
        "extremes": extremes,
        "held_bytes_after_load": held_after,
        "server_exit_code": exit_code,
        "notes": notes,
        "failures": failures,
        "samples": samples,
    }
    with open(os.path.join(args.out, "soak.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    if os.path.exists(os.path.join(args.out, "soak.partial.json")):
        os.unlink(os.path.join(args.out, "soak.partial.json"))
    title = (f"softmax-server soak, --device={args.device}: {answers:,} answers, "
             f"{wrong} wrong, {len(bursts.windows)} abuse bursts")
    if not watch.plot(samples, burst_windows, args.warmup, title,
                      os.path.join(args.out, "soak.png")):
        notes.append("matplotlib missing: no plot (`python3 -m bench.soak.watch soak.json soak.png` "
                     "makes it where matplotlib is)")
    print_report(report)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
