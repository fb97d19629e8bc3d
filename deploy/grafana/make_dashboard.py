#!/usr/bin/env python3
"""Writes dashboards/softmax-serve.json, the Grafana dashboard for softmax-serve.

Panels are listed once here (title, unit, PromQL) so the dashboard and the
README's panel table cannot drift apart: `make_dashboard.py --markdown` prints
that table.
"""
import json
import sys
from pathlib import Path

DS = {"type": "prometheus", "uid": "prometheus"}

# (title, unit, [(legend, PromQL)], description)
PANELS = [
    ("Throughput", "reqps",
     [("{{method}} {{code}}", 'sum by (method, code) (rate(softmax_requests_total[$__rate_interval]))')],
     "Requests answered per second, by method and gRPC status code."),
    ("Errors", "reqps",
     [("{{code}}", 'sum by (code) (rate(softmax_requests_total{code!="OK"}[$__rate_interval]))')],
     "Failed requests per second by code: INVALID_ARGUMENT is the caller's; UNAVAILABLE a full queue; INTERNAL a device fault."),
    ("Request latency p50 / p99", "s",
     [("p50", 'histogram_quantile(0.5, sum by (le) (rate(softmax_request_duration_seconds_bucket[$__rate_interval])))'),
      ("p99", 'histogram_quantile(0.99, sum by (le) (rate(softmax_request_duration_seconds_bucket[$__rate_interval])))')],
     "End-to-end latency, request received to response sent."),
    ("Queue and compute time p99", "s",
     [("queue p99", 'histogram_quantile(0.99, sum by (le) (rate(softmax_queue_duration_seconds_bucket[$__rate_interval])))'),
      ("compute p99", 'histogram_quantile(0.99, sum by (le) (rate(softmax_compute_duration_seconds_bucket[$__rate_interval])))')],
     "Time waiting for a batch against the compute time of the batch a request rode in."),
    ("Achieved bandwidth vs peak", "Bps",
     [("kernel (mean per batch)", 'sum(rate(softmax_batch_bandwidth_bytes_per_second_sum[$__rate_interval])) / sum(rate(softmax_batch_bandwidth_bytes_per_second_count[$__rate_interval]))'),
      ("request (mean)", 'sum(rate(softmax_request_bandwidth_bytes_per_second_sum[$__rate_interval])) / sum(rate(softmax_request_bandwidth_bytes_per_second_count[$__rate_interval]))'),
      ("device peak", 'max(softmax_device_peak_bandwidth_bytes_per_second)')],
     "Bytes read + written per batch over kernel time, per request over latency, against the device's peak."),
    ("Batch size", "short",
     [("requests per batch", 'sum(rate(softmax_batch_requests_sum[$__rate_interval])) / sum(rate(softmax_batch_requests_count[$__rate_interval]))'),
      ("rows per batch", 'sum(rate(softmax_batch_rows_sum[$__rate_interval])) / sum(rate(softmax_batch_rows_count[$__rate_interval]))'),
      ("kernel launches/s", 'sum(rate(softmax_kernel_launches_total[$__rate_interval]))')],
     "Mean requests and rows per batch, and kernel launches per second."),
    ("Queue depth", "short",
     [("queued requests", 'sum(softmax_queued_requests)'),
      ("capacity", 'sum(softmax_queue_capacity_requests)')],
     "Requests admitted and waiting for a batch, against the admission limit."),
    ("Allocator memory", "bytes",
     [("{{memory}} in use", 'sum by (memory) (softmax_allocator_in_use_bytes)'),
      ("{{memory}} cached", 'sum by (memory) (softmax_allocator_cached_bytes)'),
      ("{{memory}} peak", 'sum by (memory) (softmax_allocator_peak_bytes)')],
     "Device and pinned staging memory held by the caching allocator."),
]


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
    else:
        out = Path(__file__).resolve().parent / "dashboards" / "softmax-serve.json"
        out.write_text(json.dumps(dashboard(), indent=2) + "\n")
        print(out)
