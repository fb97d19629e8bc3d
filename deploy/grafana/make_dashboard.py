#!/usr/bin/env python3
"""Writes dashboards/softmax-serve.json, the Grafana dashboard for softmax-serve.

Panels are listed once here (title, unit, PromQL) so the dashboard and the
panel table of docs/metrics.md cannot drift apart: `make_dashboard.py --markdown` prints
that table.
"""
import json
import sys
from pathlib import Path

# Every panel queries the datasource the `datasource` variable picks, so the
# dashboard imports into any Grafana, and only the replicas the `instance`
# variable selects (all by default; under Kubernetes service discovery each
# pod is an instance).
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'instance=~"$instance"'
RATE = "[$__rate_interval]"

# (title, unit, [(legend, PromQL)], description)
PANELS = [
    ("Throughput", "reqps",
     [("{{method}} {{code}}", f'sum by (method, code) (rate(softmax_requests_total{{{SEL}}}{RATE}))')],
     "Requests answered per second, by method and gRPC status code."),
    ("Throughput per replica", "reqps",
     [("{{instance}}", f'sum by (instance) (rate(softmax_requests_total{{{SEL}}}{RATE}))')],
     "Requests answered per second by each replica: a replica far from the others is unbalanced (clients pinned to one connection) or unhealthy."),
    ("Errors", "reqps",
     [("{{code}}", f'sum by (code) (rate(softmax_requests_total{{{SEL}, code!="OK"}}{RATE}))')],
     "Failed requests per second by code: INVALID_ARGUMENT is the caller's; UNAVAILABLE a full queue or a drain; INTERNAL a device fault."),
    ("Request latency p50 / p99", "s",
     [("p50", f'histogram_quantile(0.5, sum by (le) (rate(softmax_request_duration_seconds_bucket{{{SEL}}}{RATE})))'),
      ("p99", f'histogram_quantile(0.99, sum by (le) (rate(softmax_request_duration_seconds_bucket{{{SEL}}}{RATE})))')],
     "End-to-end latency over the selected replicas, request received to response sent."),
    ("Request latency p99 per replica", "s",
     [("{{instance}}", f'histogram_quantile(0.99, sum by (instance, le) (rate(softmax_request_duration_seconds_bucket{{{SEL}}}{RATE})))')],
     "p99 latency of each replica (what SoftmaxLatencyP99High alerts on)."),
    ("Queue and compute time p99", "s",
     [("queue p99", f'histogram_quantile(0.99, sum by (le) (rate(softmax_queue_duration_seconds_bucket{{{SEL}}}{RATE})))'),
      ("compute p99", f'histogram_quantile(0.99, sum by (le) (rate(softmax_compute_duration_seconds_bucket{{{SEL}}}{RATE})))')],
     "Time waiting for a batch against the compute time of the batch a request rode in."),
    ("Achieved bandwidth vs peak", "Bps",
     [("kernel (mean per batch)", f'sum(rate(softmax_batch_bandwidth_bytes_per_second_sum{{{SEL}}}{RATE})) / sum(rate(softmax_batch_bandwidth_bytes_per_second_count{{{SEL}}}{RATE}))'),
      ("request (mean)", f'sum(rate(softmax_request_bandwidth_bytes_per_second_sum{{{SEL}}}{RATE})) / sum(rate(softmax_request_bandwidth_bytes_per_second_count{{{SEL}}}{RATE}))'),
      ("device peak", f'max(softmax_device_peak_bandwidth_bytes_per_second{{{SEL}}})')],
     "Bytes read + written per batch over kernel time, per request over latency, against the device's peak."),
    ("Batch size", "short",
     [("requests per batch", f'sum(rate(softmax_batch_requests_sum{{{SEL}}}{RATE})) / sum(rate(softmax_batch_requests_count{{{SEL}}}{RATE}))'),
      ("rows per batch", f'sum(rate(softmax_batch_rows_sum{{{SEL}}}{RATE})) / sum(rate(softmax_batch_rows_count{{{SEL}}}{RATE}))'),
      ("kernel launches/s", f'sum(rate(softmax_kernel_launches_total{{{SEL}}}{RATE}))')],
     "Mean requests and rows per batch, and kernel launches per second."),
    ("Queue depth per replica", "short",
     [("{{instance}} queued", f'sum by (instance) (softmax_queued_requests{{{SEL}}})'),
      ("{{instance}} capacity", f'sum by (instance) (softmax_queue_capacity_requests{{{SEL}}})')],
     "Requests admitted and waiting for a batch on each replica, against its admission limit."),
    ("Autoscaling signals per replica", "short",
     [("{{instance}} queue/compute", f'max by (instance) (softmax:queue_to_compute:ratio_rate1m{{{SEL}}})'),
      ("{{instance}} held/budget", f'max by (instance) (softmax:held_bytes:ratio_avg1m{{{SEL}}})')],
     "What the HPA and KEDA scale on (the recording rules in deploy/prometheus/autoscaling.yml): seconds queued per second of compute (target 0.5) and the share of --max_held_bytes held (target 0.25), over the last minute."),
    ("Serving replicas", "short",
     [("serving", f'sum(softmax_serving{{{SEL}}})'),
      ("scraped", f'count(softmax_build_info{{{SEL}}})')],
     "Replicas whose health is SERVING, against those Prometheus scrapes; a gap is a replica draining or faulted."),
    ("Allocator memory", "bytes",
     [("{{instance}} {{memory}} in use", f'sum by (instance, memory) (softmax_allocator_in_use_bytes{{{SEL}}})'),
      ("{{instance}} {{memory}} cached", f'sum by (instance, memory) (softmax_allocator_cached_bytes{{{SEL}}})'),
      ("{{instance}} {{memory}} peak", f'sum by (instance, memory) (softmax_allocator_peak_bytes{{{SEL}}})')],
     "Device and pinned staging memory held by each replica's caching allocator."),
    ("GPU utilization", "percentunit",
     [("{{instance}} {{device}}", f'softmax_gpu_utilization_ratio{{{SEL}}}')],
     "Fraction of time a kernel ran on each GPU (NVML)."),
    ("GPU memory", "bytes",
     [("{{instance}} {{device}} used", f'softmax_gpu_memory_used_bytes{{{SEL}}}'),
      ("{{instance}} {{device}} total", f'softmax_gpu_memory_total_bytes{{{SEL}}}')],
     "Device memory used by every process on each GPU, against its size (NVML)."),
    ("GPU power", "watt",
     [("{{instance}} {{device}}", f'softmax_gpu_power_watts{{{SEL}}}'),
      ("{{instance}} {{device}} limit", f'softmax_gpu_power_limit_watts{{{SEL}}}')],
     "Board power draw against the enforced limit (NVML)."),
    ("GPU temperature and SM clock", "celsius",
     [("{{instance}} {{device}} temperature", f'softmax_gpu_temperature_celsius{{{SEL}}}'),
      ("{{instance}} {{device}} SM clock (GHz)", f'softmax_gpu_sm_clock_hertz{{{SEL}}} / 1e9')],
     "Core temperature and current SM clock (NVML)."),
    ("GPU clock throttling", "short",
     [("{{instance}} {{device}} {{reason}}", f'softmax_gpu_clock_throttle_reasons{{{SEL}, reason!="gpu_idle"}} == 1')],
     "Reasons holding each GPU's clocks down now (power cap, thermal, ...); idle is left out."),
]

# Template variables: the Prometheus datasource, and the replicas (instance
# label) that softmax_build_info, exported by every server, names.
TEMPLATING = {"list": [
    {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
     "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []},
    {"name": "instance", "label": "Replica", "type": "query", "datasource": DS,
     "definition": "label_values(softmax_build_info, instance)",
     "query": {"query": "label_values(softmax_build_info, instance)", "refId": "instance"},
     "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*",
     "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
     "sort": 1, "hide": 0, "regex": "", "options": []},
]}


def panel(index, title, unit, targets, description):
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
            for i, (legend, expr) in enumerate(targets)
        ],
    }


def dashboard():
    return {
        "uid": "softmax-serve",
        "title": "softmax-serve",
        "tags": ["softmax-serve"],
        "timezone": "browser",
        "schemaVersion": 38,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": TEMPLATING,
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }


def markdown():
    lines = ["| panel | what it shows | PromQL |", "|---|---|---|"]
    for title, _, targets, description in PANELS:
        exprs = "<br>".join(f"`{expr.replace('|', '&#124;')}`" for _, expr in targets)
        lines.append(f"| {title} | {description} | {exprs} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] == ["--markdown"]:
        print(markdown())
    elif sys.argv[1:] == ["--print"]:
        print(json.dumps(dashboard(), indent=2))
    else:
        out = Path(__file__).resolve().parent / "dashboards" / "softmax-serve.json"
        out.write_text(json.dumps(dashboard(), indent=2) + "\n")
        print(out)
