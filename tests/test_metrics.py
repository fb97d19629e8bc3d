"""The server's metrics as a real Prometheus sees them: a softmax-server (CPU
backend) and Debian's prometheus, both started here on free loopback ports
(Prometheus with a temporary config and data folder, scraping every second and
loading deploy/prometheus/alerts.yml). A known number of good and bad
requests, unary and on a stream; then Prometheus's HTTP query API must report
exactly those counts, and promtool must accept the scraped text and the alert
rules."""

import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

import e2e_util
from e2e_util import request, scrape_metrics
import prometheus_util
from prometheus_util import tool

REPO = Path(__file__).resolve().parent.parent
ALERT_RULES = REPO / "deploy" / "prometheus" / "alerts.yml"
AUTOSCALING_RULES = REPO / "deploy" / "prometheus" / "autoscaling.yml"

# What the test sends; the server is fresh, so the counts are exact.
UNARY_OK, UNARY_BAD = 25, 7
STREAM_OK, STREAM_BAD = 15, 5
UNARY_SHAPE, STREAM_SHAPE = (3, 64), (2, 32)


class Prometheus(prometheus_util.Prometheus):
    """/usr/bin/prometheus scraping one target every second, with the alert
    rules loaded; its config and TSDB live in a temporary folder."""

    def __init__(self, target, startup_timeout=60.0):
        self.folder = tempfile.TemporaryDirectory(prefix="softmax-prometheus-")
        config = Path(self.folder.name) / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  evaluation_interval: 1s\n"
            "rule_files:\n"
            f"  - {json.dumps(str(ALERT_RULES))}\n"
            f"  - {json.dumps(str(AUTOSCALING_RULES))}\n"
            "scrape_configs:\n"
            "  - job_name: softmax-serve\n"
            "    static_configs:\n"
            f"      - targets: [{json.dumps(target)}]\n")
        super().__init__(config, self.folder.name, startup_timeout)

    def query(self, expr):
        """Instant query -> {frozenset(label items): value} (labels without
        __name__); a scalar result under the key frozenset()."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return {frozenset(): float(data["result"][1])}
        return {frozenset((k, v) for k, v in series["metric"].items() if k != "__name__"):
                float(series["value"][1]) for series in data["result"]}

    def value(self, expr):
        """The single value of `expr`, or None when it has no result."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr}: several series {result}"
        return next(iter(result.values())) if result else None

    def stop(self):
        super().stop()
        self.folder.cleanup()


def wait_until(predicate, timeout, what):
    """Polls `predicate` (returning a truthy value when satisfied) and returns
    its last result; raises with `what` on timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}; last: {last}")


@pytest.fixture(scope="module")
def prometheus(server):
    process = Prometheus(server.metrics_address)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def traffic(server, prometheus):
    """Sends the known requests once, then waits until Prometheus has scraped
    all of them."""
    stub = server.stub()
    rng = np.random.default_rng(5)
    for i in range(UNARY_OK):
        stub.Softmax(request(rng.normal(size=UNARY_SHAPE), request_id=f"u{i}"), timeout=30)
    for i in range(UNARY_BAD):
        with pytest.raises(grpc.RpcError) as error:
            stub.Softmax(request(np.zeros(UNARY_SHAPE), temperature=-1.0), timeout=30)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stream_requests = [request(rng.normal(size=STREAM_SHAPE), request_id=f"s{i}")
                       for i in range(STREAM_OK)]
    stream_requests += [request(np.zeros(STREAM_SHAPE), request_id=f"b{i}", axis=7)
                        for i in range(STREAM_BAD)]
    responses = list(stub.SoftmaxStream(iter(stream_requests), timeout=30))
    assert len(responses) == STREAM_OK + STREAM_BAD
    assert sum(r.error.code == 0 for r in responses) == STREAM_OK
    assert sum(r.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
               for r in responses) == STREAM_BAD

    total = UNARY_OK + UNARY_BAD + STREAM_OK + STREAM_BAD
    wait_until(lambda: prometheus.value("sum(softmax_requests_total)") == total, 60,
               f"Prometheus to scrape {total} requests")
    return total


def test_request_counters_match_what_was_sent(prometheus, traffic):
    counts = prometheus.query("softmax_requests_total")
    by_method_code = {dict(labels)["method"] + "/" + dict(labels)["code"]: value
                      for labels, value in counts.items()}
    assert by_method_code == {
        "Softmax/OK": UNARY_OK,
        "Softmax/INVALID_ARGUMENT": UNARY_BAD,
        "SoftmaxStream/OK": STREAM_OK,
        "SoftmaxStream/INVALID_ARGUMENT": STREAM_BAD,
        # The KServe v2 methods' OK series exist from the start.
        "ModelInfer/OK": 0,
        "ModelStreamInfer/OK": 0,
        "http_infer/OK": 0,
    }
    for labels in counts:
        assert dict(labels)["job"] == "softmax-serve"


def test_latency_histograms_count_every_request(prometheus, traffic):
    durations = {dict(labels)["method"]: value for labels, value in
                 prometheus.query("softmax_request_duration_seconds_count").items()}
    assert durations == {"Softmax": UNARY_OK + UNARY_BAD,
                         "SoftmaxStream": STREAM_OK + STREAM_BAD,
                         "ModelInfer": 0, "ModelStreamInfer": 0, "http_infer": 0}
    # The +Inf bucket is the count; every observation is under the 10 s bucket.
    assert prometheus.value(
        'sum(softmax_request_duration_seconds_bucket{le="+Inf"})') == traffic
    assert prometheus.value('sum(softmax_request_duration_seconds_bucket{le="10"})') == traffic
    # Only requests that reached the batcher (the good ones) have queue and
    # compute times and a bandwidth.
    good = UNARY_OK + STREAM_OK
    assert prometheus.value("softmax_queue_duration_seconds_count") == good
    assert prometheus.value("softmax_compute_duration_seconds_count") == good
    assert prometheus.value("softmax_request_bandwidth_bytes_per_second_count") == good
    # Quantiles come out of the buckets in the histogram's range.
    p99 = prometheus.value(
        "histogram_quantile(0.99, sum by (le) (softmax_request_duration_seconds_bucket))")
    assert 1e-5 <= p99 <= 10, p99
    # Queue time is part of the latency: their sums are ordered.
    assert (prometheus.value("softmax_queue_duration_seconds_sum")
            < prometheus.value("sum(softmax_request_duration_seconds_sum)"))


def test_batch_histograms_are_consistent(prometheus, traffic):
    batches = prometheus.value("sum(softmax_batches_total)")
    assert batches > 0
    assert prometheus.value('softmax_batches_total{outcome="error"}') == 0
    assert prometheus.value("softmax_batch_requests_count") == batches
    assert prometheus.value("softmax_batch_rows_count") == batches
    assert prometheus.value("softmax_batch_bandwidth_bytes_per_second_count") == batches
    # Every good request rode in exactly one batch, with all its rows.
    assert prometheus.value("softmax_batch_requests_sum") == UNARY_OK + STREAM_OK
    assert (prometheus.value("softmax_batch_rows_sum")
            == UNARY_OK * UNARY_SHAPE[0] + STREAM_OK * STREAM_SHAPE[0])
    assert prometheus.value("softmax_batch_bandwidth_bytes_per_second_sum") > 0
    # The CPU backend launches no kernels.
    assert prometheus.value("softmax_kernel_launches_total") == 0


def test_gauges_and_info(prometheus, server, traffic):
    assert prometheus.value('up{job="softmax-serve"}') == 1
    assert prometheus.value("softmax_serving") == 1
    assert prometheus.value("softmax_queued_requests") == 0
    assert prometheus.value("softmax_queue_capacity_requests") == 8192
    assert prometheus.value("softmax_queue_capacity_bytes") == 4 << 30
    assert prometheus.value("softmax_rejected_requests_total") == 0
    devices = prometheus.query("softmax_device_info")
    assert len(devices) == 1
    labels, value = next(iter(devices.items()))
    labels = dict(labels)
    assert value == 1
    assert labels["device"] == "cpu" and labels["name"], labels
    assert int(labels["multiprocessors"]) >= 1
    builds = prometheus.query("softmax_build_info")
    assert len(builds) == 1
    labels = dict(next(iter(builds)))
    assert labels["version"].count(".") == 2 and labels["revision"], labels
    # The CPU backend has no caching allocator, and no GPU for NVML to read.
    assert prometheus.query("softmax_allocator_in_use_bytes") == {}
    assert prometheus.query('{__name__=~"softmax_gpu_.+"}') == {}


def test_alert_rules_load_and_evaluate(prometheus, traffic):
    def groups_evaluated():
        groups = prometheus.api("rules")["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        return groups if rules and all(rule["health"] == "ok" for rule in rules) else None

    groups = wait_until(groups_evaluated, 30, "every alert rule to be evaluated")
    by_name = {group["name"]: group for group in groups}
    assert sorted(by_name) == ["softmax-envoy", "softmax-serve", "softmax-serve-autoscaling"]
    rules = by_name["softmax-serve"]["rules"]
    # The autoscaling signals' recording rules evaluate on this replica's series.
    for recording in by_name["softmax-serve-autoscaling"]["rules"]:
        assert recording["type"] == "recording" and not recording.get("lastError"), recording
    # Envoy's alerts load and evaluate without error, with no Envoy scraped
    # here (tests/test_deploy.py's promtool unit tests fire them).
    for rule in by_name["softmax-envoy"]["rules"]:
        assert rule["type"] == "alerting" and not rule.get("lastError"), rule
        assert rule["state"] == "inactive", rule
    assert sorted(rule["name"] for rule in rules) == [
        "SoftmaxGpuClocksThrottled", "SoftmaxGpuUnusable", "SoftmaxLatencyP99High",
        "SoftmaxNotServing", "SoftmaxQueueNearFull", "SoftmaxServerErrorRateHigh"]
    for rule in rules:
        assert rule["type"] == "alerting"
        assert not rule.get("lastError"), rule
    # A serving server with an empty queue and only callers' errors
    # (INVALID_ARGUMENT) trips none of these. (The latency rule depends on
    # this machine's speed, so its state is not asserted.)
    states = {rule["name"]: rule["state"] for rule in rules}
    for name in ("SoftmaxNotServing", "SoftmaxQueueNearFull", "SoftmaxServerErrorRateHigh",
                 "SoftmaxGpuClocksThrottled", "SoftmaxGpuUnusable"):
        assert states[name] == "inactive", states


def test_promtool_accepts_the_scraped_text(server, traffic):
    text = scrape_metrics(server.metrics_address)
    result = subprocess.run([tool("promtool"), "check", "metrics"], input=text,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", (
        result.stdout + result.stderr)


def test_promtool_accepts_the_alert_rules():
    result = subprocess.run([tool("promtool"), "check", "rules", str(ALERT_RULES)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    # Six for the replicas, four for Envoy.
    assert "SUCCESS: 10 rules found" in result.stdout, result.stdout


def test_empty_metrics_address_turns_metrics_off(start_server):
    server = start_server("--metrics_address=")
    assert server.metrics_address == "off"
    response = server.stub().Softmax(request(np.zeros((1, 8))), timeout=30)
    assert len(response.output.data) == 8 * 4


def test_request_bandwidth_counts_input_plus_output_bytes(start_server):
    """softmax_request_bandwidth_bytes_per_second observes, per OK request,
    (input + output bytes) / latency, where the latency is the very value
    softmax_request_duration_seconds observes for that request. So on a
    server that answers one request at a time, the bandwidth observed times
    the duration observed is the bytes counted: 2 x the tensor (input and
    an output of the same size) on every method, whatever the machine's
    speed. Counting the bytes once (the input alone) gives 1 x."""
    triton_grpc = pytest.importorskip("tritonclient.grpc")
    server = start_server()
    values = np.random.default_rng(7).normal(size=(64, 1000)).astype(np.float32)
    tensor_bytes = values.nbytes  # 256,000

    def softmax():
        server.stub().Softmax(request(values), timeout=30)

    def softmax_stream():
        assert len(list(server.stub().SoftmaxStream(iter([request(values)]), timeout=30))) == 1

    def model_infer_request():
        message = triton_grpc.service_pb2.ModelInferRequest(model_name="softmax")
        message.inputs.add(name="INPUT", datatype="FP32", shape=list(values.shape))
        message.raw_input_contents.append(values.tobytes())
        return message

    def model_infer():
        stub = triton_grpc.service_pb2_grpc.GRPCInferenceServiceStub(server.channel())
        stub.ModelInfer(model_infer_request(), timeout=30)

    def model_stream_infer():
        stub = triton_grpc.service_pb2_grpc.GRPCInferenceServiceStub(server.channel())
        responses = list(stub.ModelStreamInfer(iter([model_infer_request()]), timeout=30))
        assert len(responses) == 1 and not responses[0].error_message, responses

    def http_infer():
        header = json.dumps({"inputs": [{
            "name": "INPUT", "datatype": "FP32", "shape": list(values.shape),
            "parameters": {"binary_data_size": tensor_bytes}}]}).encode()
        body = header + values.tobytes()
        call = urllib.request.Request(
            f"http://{server.http_address}/v2/models/softmax/infer", data=body, method="POST",
            headers={"Inference-Header-Content-Length": str(len(header)),
                     "Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(call, timeout=30) as response:
            assert response.status == 200

    def observed(method):
        text = scrape_metrics(server.metrics_address)
        name = "softmax_request_bandwidth_bytes_per_second"
        return (e2e_util.metric_value(text, f"{name}_count") or 0,
                e2e_util.metric_value(text, f"{name}_sum") or 0,
                e2e_util.metric_value(text, "softmax_request_duration_seconds_count",
                                      {"method": method}) or 0,
                e2e_util.metric_value(text, "softmax_request_duration_seconds_sum",
                                      {"method": method}) or 0)

    for method, call in (("Softmax", softmax), ("SoftmaxStream", softmax_stream),
                         ("ModelInfer", model_infer), ("ModelStreamInfer", model_stream_infer),
                         ("http_infer", http_infer)):
        before = observed(method)
        # Called once each, so a method's duration sum is that one latency
        # (the text format gives it 6 significant digits).
        assert before[2] == 0, (method, before)
        call()

        def recorded():
            now = observed(method)
            return now if now[2] == before[2] + 1 else None

        # The answer can reach the caller just before the server records it.
        after = wait_until(recorded, 10, f"{method}'s latency recorded")
        assert after[0] == before[0] + 1, (method, before, after)
        bandwidth = after[1] - before[1]
        seconds = after[3] - before[3]
        assert seconds > 0, (method, before, after)
        assert bandwidth * seconds == pytest.approx(2 * tensor_bytes, rel=1e-3), (
            f"{method}: {bandwidth:.4g} B/s over {seconds:.4g} s is "
            f"{bandwidth * seconds:.6g} B; sent {tensor_bytes} B, answered as many")


def load_dashboard():
    return json.loads(
        (REPO / "deploy" / "grafana" / "dashboards" / "softmax-serve.json").read_text())


def dashboard_exprs(dashboard):
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_dashboard_is_what_make_dashboard_writes():
    result = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "grafana" / "make_dashboard.py"), "--print"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == load_dashboard(), (
        "deploy/grafana/dashboards/softmax-serve.json is stale: run "
        "python3 deploy/grafana/make_dashboard.py")


def test_dashboard_variables_pick_datasource_and_replicas(prometheus, server, traffic):
    """No hard-coded datasource: every panel and query uses ${datasource};
    every query is restricted to the replicas of $instance, whose values
    (label_values(softmax_build_info, instance)) Prometheus knows."""
    dashboard = load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    instance = variables["instance"]
    assert instance["type"] == "query" and instance["multi"] and instance["includeAll"]
    assert instance["datasource"]["uid"] == "${datasource}"
    match = re.fullmatch(r"label_values\((\w+), instance\)", instance["definition"])
    assert match, instance["definition"]
    values = prometheus.api("label/instance/values", **{"match[]": match.group(1)})
    assert values == [server.metrics_address]
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            # Every metric selector of the query carries the instance matcher.
            selectors = re.findall(r"\b(softmax[_:][\w:]+)(\{[^}]*\})?", target["expr"])
            assert selectors, target["expr"]
            for name, labels in selectors:
                assert 'instance=~"$instance"' in labels, (panel["title"], name, target["expr"])
    # Per-replica panels break their series out by instance.
    titles = {panel["title"]: panel for panel in dashboard["panels"]}
    for title in ("Throughput per replica", "Request latency p99 per replica",
                  "Queue depth per replica", "Autoscaling signals per replica"):
        assert all("by (instance" in t["expr"] for t in titles[title]["targets"]), title
    for name in ("softmax_gpu_utilization_ratio", "softmax_gpu_memory_used_bytes",
                 "softmax_gpu_memory_total_bytes", "softmax_gpu_power_watts",
                 "softmax_gpu_temperature_celsius", "softmax_gpu_sm_clock_hertz",
                 "softmax_gpu_clock_throttle_reasons"):
        assert any(name in expr for expr in dashboard_exprs(dashboard)), name


@pytest.mark.parametrize("instance", ["all", "this", "other"])
def test_dashboard_queries_run_and_see_data(prometheus, server, traffic, instance):
    """Every PromQL expression of the Grafana dashboard parses in Prometheus,
    and those that do not depend on a GPU return data for this server, with
    $instance at All (Grafana's ".*") or at this server, and none for another
    replica."""
    # Grafana escapes a regex variable's value for the PromQL string literal.
    value = {"all": ".*", "this": re.escape(server.metrics_address).replace("\\", "\\\\"),
             "other": "10.0.0.1:9464"}[instance]
    gpu_only = ("softmax_device_peak_bandwidth", "softmax_allocator_", "softmax_kernel_",
                "softmax_gpu_")
    exprs = dashboard_exprs(load_dashboard())
    assert len(exprs) >= 8
    for expr in exprs:
        # Grafana's $__rate_interval: at least four scrape intervals.
        query = expr.replace("$__rate_interval", "1m").replace("$instance", value)
        prometheus.query(query)  # fails on a syntax error
        if instance == "other":
            assert prometheus.query(query) in ({}, {frozenset(): 0.0}), query
        elif not any(name in expr for name in gpu_only):
            # rate() needs two scrapes of a series inside the window.
            wait_until(lambda: prometheus.query(query), 15, f"data for {expr}")
