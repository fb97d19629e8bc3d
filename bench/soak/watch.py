"""The soak's watch on the server: samples its memory, threads and
descriptors (from /proc) and its own accounting (from /metrics) every few
seconds, judges whether each series stayed flat after the warm-up, and
plots them.

Flat, for a gauge (RSS, pinned staging, device memory), means that its
level at the end is within the tolerance of its level right after the
warm-up, a level being the median of the samples in the first (last) fifth
of the time after the warm-up: bursts of abuse raise a gauge for a few
seconds in every minute, which a median passes over, while memory that
stays behind raises the level. The highest sample after the warm-up against
the highest during it (which holds one burst) is reported beside, not
judged. For a counter (the allocators' backing allocations), flat means it
grew by at most the tolerance (relative) after the warm-up. Threads and
descriptors are recorded, not judged (they follow the bursts' connections).
"""

import os
import re
import statistics
import threading
import time
import urllib.request

SAMPLE_LINE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

# name in a sample -> (what, kind); judged series only.
JUDGED = {
    "rss_bytes": ("RSS", "gauge"),
    "pinned_bytes": ("pinned staging (in use + cached)", "gauge"),
    "device_bytes": ("device memory (in use + cached)", "gauge"),
    "device_backing_allocations": ("device backing allocations", "counter"),
    "pinned_backing_allocations": ("pinned backing allocations", "counter"),
}


def parse_metrics(text):
    """{(name, frozenset of labels): value} of a Prometheus text page."""
    values = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE_LINE.match(line)
        if not match:
            continue
        labels = frozenset(LABEL.findall(match.group(2) or ""))
        try:
            values[(match.group(1), labels)] = float(match.group(3))
        except ValueError:
            continue
    return values


def metric_sum(values, name, **labels):
    """Sum of the samples of `name` with `labels`; None when there is none."""
    wanted = set(labels.items())
    found = [v for (n, ls), v in values.items() if n == name and wanted <= ls]
    return sum(found) if found else None


def scrape(metrics_address, timeout=10.0):
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=timeout) as r:
        return parse_metrics(r.read().decode())


def server_metrics(metrics_address, timeout=10.0):
    """The figures the soak follows, from one scrape."""
    values = scrape(metrics_address, timeout)
    device_in_use = metric_sum(values, "softmax_allocator_in_use_bytes", memory="device")
    device_cached = metric_sum(values, "softmax_allocator_cached_bytes", memory="device")
    return {
        "softmax_held_bytes": metric_sum(values, "softmax_held_bytes"),
        "pinned_bytes": metric_sum(values, "softmax_pinned_staging_bytes"),
        "device_bytes": None if device_in_use is None else device_in_use + (device_cached or 0),
        "device_in_use_bytes": device_in_use,
        "device_backing_allocations": metric_sum(
            values, "softmax_allocator_backing_allocations_total", memory="device"),
        "pinned_backing_allocations": metric_sum(
            values, "softmax_allocator_backing_allocations_total", memory="pinned"),
        "pinned_in_use_bytes": metric_sum(values, "softmax_allocator_in_use_bytes",
                                          memory="pinned"),
        "server_requests": metric_sum(values, "softmax_requests_total"),
    }


def process_status(pid):
    """RSS bytes, threads and open descriptors of `pid` from /proc."""
    rss = threads = None
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return {"rss_bytes": rss, "threads": threads, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


# A failed scrape is tried once more after this pause before it counts: on a
# loaded 2-core host one scrape during the half-open burst was closed without
# an answer after 2 s while the next answered (a Prometheus scraper would see
# one missed interval).
SCRAPE_RETRY_PAUSE_S = 0.2


class Sampler(threading.Thread):
    """Samples every `every_s` seconds until `stop` is set. A scrape that
    fails is tried once more; one that fails twice is recorded (its metrics
    None) and counted, one that the retry answers is listed apart."""

    def __init__(self, pid, metrics_address, every_s, stop, extra, started):
        super().__init__(name="sampler", daemon=True)
        self.pid = pid
        self.metrics_address = metrics_address
        self.every_s = every_s
        self.stop = stop
        self.extra = extra  # () -> dict of the load's figures, added to each sample
        self.started = started
        self.samples = []
        self.failed_scrapes = []
        self.retried_scrapes = []
        self.crashed = None

    def sample(self):
        entry = {"t": round(time.monotonic() - self.started, 3)}
        entry.update(process_status(self.pid))
        try:
            entry.update(server_metrics(self.metrics_address))
        except OSError as error:
            time.sleep(SCRAPE_RETRY_PAUSE_S)
            try:
                entry.update(server_metrics(self.metrics_address))
                self.retried_scrapes.append(f"t={entry['t']}: {error}")
            except OSError as again:
                self.failed_scrapes.append(f"t={entry['t']}: {error}; again: {again}")
        entry.update(self.extra())
        self.samples.append(entry)

    def run(self):
        try:
            next_at = time.monotonic()
            while not self.stop.is_set():
                self.sample()
                next_at += self.every_s
                self.stop.wait(max(0.0, next_at - time.monotonic()))
        except Exception as error:  # e.g. the server died: /proc/PID is gone
            self.crashed = f"{type(error).__name__}: {error}"


def judge(samples, warmup_s, tolerance):
    """One verdict per judged series: {name: {...figures, "ok": bool|None}}
    (None: the series has no samples, e.g. no allocator on the CPU)."""
    verdicts = {}
    samples = [s for s in samples if not s.get("after_load")]  # judged under load only
    for name, (what, kind) in JUDGED.items():
        warm = [s[name] for s in samples if s["t"] < warmup_s and s.get(name) is not None]
        after = [s[name] for s in samples if s["t"] >= warmup_s and s.get(name) is not None]
        verdict = {"what": what, "kind": kind, "ok": None}
        verdicts[name] = verdict
        if not warm or not after:
            continue
        verdict.update(start=after[0], end=after[-1])
        if kind == "counter":
            base = warm[-1]
            verdict["growth"] = (after[-1] - base) / max(base, 1.0)
            verdict["ok"] = verdict["growth"] <= tolerance
            continue
        fifth = max(1, len(after) // 5)
        verdict.update(warmup_peak=max(warm), peak=max(after),
                       level_start=statistics.median(after[:fifth]),
                       level_end=statistics.median(after[-fifth:]))
        verdict["peak_growth"] = verdict["peak"] / max(verdict["warmup_peak"], 1.0) - 1
        verdict["growth"] = verdict["level_end"] / max(verdict["level_start"], 1.0) - 1
        verdict["ok"] = verdict["growth"] <= tolerance
    return verdicts


def plot(samples, burst_windows, warmup_s, title, path):
    """RSS, pinned staging, device memory and held bytes against time, with
    the bursts shaded; the request rate below. False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # missing, or built against another NumPy than the one loaded
        return False
    t = [s["t"] / 60 for s in samples]
    fig, (memory, rate) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True,
                                       gridspec_kw={"height_ratios": [3, 1]})
    for key, label in (("rss_bytes", "RSS"), ("pinned_bytes", "pinned staging"),
                       ("device_bytes", "device memory (allocator)"),
                       ("softmax_held_bytes", "held by requests (softmax_held_bytes)")):
        points = [(x, s[key] / 2**20) for x, s in zip(t, samples) if s.get(key) is not None]
        if points:
            memory.plot(*zip(*points), label=label, linewidth=1.2)
    for axes in (memory, rate):
        for start, end in burst_windows:
            axes.axvspan(start / 60, end / 60, color="tab:red", alpha=0.12, linewidth=0)
        axes.axvline(warmup_s / 60, color="grey", linestyle="--", linewidth=1)
    memory.set_ylabel("MiB")
    memory.set_ylim(bottom=0)
    memory.legend(loc="lower right", fontsize=8)
    memory.set_title(title, fontsize=10)
    memory.text(warmup_s / 60, memory.get_ylim()[1] * 0.97, " end of warm-up", fontsize=8,
                va="top", color="grey")
    rates = []
    for before, now in zip(samples, samples[1:]):
        elapsed = now["t"] - before["t"]
        if elapsed > 0 and now.get("server_requests") is not None and \
                before.get("server_requests") is not None:
            rates.append((now["t"] / 60,
                          (now["server_requests"] - before["server_requests"]) / elapsed))
    if rates:
        rate.plot(*zip(*rates), color="tab:green", linewidth=1)
    rate.set_ylabel("server requests/s\n(abuse included)")
    rate.set_xlabel("minutes (bursts of abuse shaded)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    # Plots a soak.json written where matplotlib was missing: watch.py JSON PNG
    import json
    import sys
    with open(sys.argv[1]) as f:
        report = json.load(f)
    title = (f"softmax-server soak, --device={report['settings']['device']}: "
             f"{report['answers']:,} answers, {report['failures'] and 'FAILED' or 'passed'}")
    sys.exit(0 if plot(report["samples"], report["burst_windows_s"],
                       report["settings"]["warmup_s"], title, sys.argv[2]) else 1)
