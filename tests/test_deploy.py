"""The deploy files as a platform team's checks see them: the Kubernetes
manifests (the replicas, Envoy in front of them, the HPA with its
prometheus-adapter rule) against the restricted Pod Security Standard and the
Kubernetes 1.37 API schemas (kubernetes-validate --strict) and checkov's
policies, the KEDA ScaledObject against KEDA's CRD schema; the KServe
manifest against KServe's CRD schemas, and its runtime's arguments against the
real server; the drain, probe, spread and autoscaling settings against each
other; the Dockerfile against hadolint and checkov; the alert rules against
their unit tests. The validators come from
PyPI into the venv `make venv` creates at $SOFTMAX_DEPLOY_VENV; nothing here
needs the network."""

import json
import os
import re
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "deploy" / "k8s" / "softmax-serve.yaml"
ENVOY_MANIFEST = REPO / "deploy" / "k8s" / "envoy.yaml"
ENVOY_CONFIG_MANIFEST = REPO / "deploy" / "k8s" / "envoy-config.yaml"
MAKE_ENVOY_CONFIG = "deploy.k8s.make_envoy_config"
MAKE_TLS_CONFIG = "deploy.envoy.make_tls_config"
HPA_MANIFEST = REPO / "deploy" / "k8s" / "autoscaling" / "hpa.yaml"
KEDA_MANIFEST = REPO / "deploy" / "k8s" / "autoscaling" / "keda.yaml"
MONITORING_MANIFEST = REPO / "deploy" / "k8s" / "monitoring.yaml"
ADAPTER_RULES = REPO / "deploy" / "k8s" / "autoscaling" / "adapter-rules.yaml"
MAKE_PROMETHEUS_RULE = "deploy.k8s.make_prometheus_rule"
K8S_SCHEMAS = REPO / "deploy" / "k8s" / "crd-schemas"
# Built-in kinds only (kubernetes-validate knows them), with their resource counts.
GATEWAY = REPO / "deploy" / "k8s" / "gateway"
K8S_BUILT_IN = {MANIFEST: 6, ENVOY_MANIFEST: 6, ENVOY_CONFIG_MANIFEST: 1, HPA_MANIFEST: 1,
                GATEWAY / "service.yaml": 1}
AUTOSCALING_RULES = REPO / "deploy" / "prometheus" / "autoscaling.yml"
SIGNALS = ["softmax:queue_to_compute:ratio_rate1m", "softmax:held_bytes:ratio_avg1m"]
# kLameDuck in server/server.cc, and the most an idle HTTP keep-alive connection
# adds to the exit (docs/server.md: Shutdown).
LAME_DUCK_S = 0.5
EXIT_AFTER_DRAIN_S = 2
KSERVE_MANIFEST = REPO / "deploy" / "kserve" / "softmax-serve.yaml"
KSERVE_SCHEMAS = REPO / "deploy" / "kserve" / "crd-schemas"
VALIDATE_CRD = REPO / "tests" / "validate_crd.py"
DOCKERFILE = REPO / "Dockerfile"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
ALERT_TESTS = REPO / "deploy" / "prometheus" / "alerts_test.yml"


def deploy_tool(name):
    venv = os.environ.get("SOFTMAX_DEPLOY_VENV", "")
    path = Path(venv) / "bin" / name
    if not path.is_file():
        raise RuntimeError(f"{path} missing: run 'make venv' (it installs kubernetes-validate "
                           "and checkov into the build folder's deploy-venv)")
    return str(path)


@pytest.fixture(scope="module")
def resources():
    documents = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in documents}


@pytest.fixture(scope="module")
def k8s():
    """Every resource of deploy/k8s/ (autoscaling/ included) by (kind, name)."""
    found = {}
    for path in (*K8S_BUILT_IN, KEDA_MANIFEST, MONITORING_MANIFEST):
        for d in yaml.safe_load_all(path.read_text()):
            if d:
                key = (d["kind"], d["metadata"]["name"])
                assert key not in found, key
                found[key] = d
    return found


@pytest.fixture(scope="module")
def kserve():
    documents = [d for d in yaml.safe_load_all(KSERVE_MANIFEST.read_text()) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in documents}


def project_version():
    match = re.search(r"project\(softmax_serve VERSION (\S+)",
                      (REPO / "CMakeLists.txt").read_text())
    return match.group(1)


def assert_restricted(pod):
    """The fields the "restricted" Pod Security Standard checks, on a pod spec."""
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    assert all("hostPath" not in v for v in pod.get("volumes", []))
    for container in pod["containers"] + pod.get("initContainers", []):
        context = container["securityContext"]
        assert context["runAsNonRoot"] is True, container["name"]
        assert isinstance(context["runAsUser"], int) and context["runAsUser"] > 0
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not context.get("privileged")


def test_pod_meets_the_restricted_profile(resources):
    namespace = resources[("Namespace", "softmax-serve")]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    deployment = resources[("Deployment", "softmax-serve")]
    assert deployment["metadata"]["namespace"] == "softmax-serve"
    assert_restricted(deployment["spec"]["template"]["spec"])


def test_image_is_pinned_to_the_release(resources):
    pod = resources[("Deployment", "softmax-serve")]["spec"]["template"]["spec"]
    for container in pod["containers"]:
        image = container["image"]
        assert "@sha256:" in image or image.endswith(":" + project_version()), image


def test_probes_resources_and_disruption_budget(resources):
    deployment = resources[("Deployment", "softmax-serve")]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == 50051, probe
    # Start-up may take a while (CUDA context, occupancy probe) before liveness counts.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60
    for kind in ("requests", "limits"):
        for resource in ("cpu", "memory", "nvidia.com/gpu"):
            assert resource in container["resources"][kind], (kind, resource)
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    shutdown_grace = int(next(a for a in container["args"] if a.startswith("--shutdown_grace_s="))
                         .split("=")[1])
    assert grace > shutdown_grace
    budget = resources[("PodDisruptionBudget", "softmax-serve")]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert budget["spec"]["selector"]["matchLabels"] == selector


def test_pods_tolerate_the_gpu_taint_and_go_to_gpu_nodes():
    """The usual GPU node pool: tainted nvidia.com/gpu (any value) NoSchedule,
    labelled nvidia.com/gpu.present=true by GPU Feature Discovery; the
    RuntimeClass is left to the clusters that need one, commented."""
    text = MANIFEST.read_text()
    (deployment,) = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists",
            "effect": "NoSchedule"} in pod["tolerations"]
    (term,) = pod["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "nvidia.com/gpu.present", "operator": "In",
            "values": ["true"]} in term["matchExpressions"]
    assert "runtimeClassName" not in pod
    assert re.search(r"^      # runtimeClassName: nvidia\b", text, re.M)


def test_rollout_needs_no_spare_gpu_and_agrees_with_the_budget(resources):
    """A surge pod would wait for a GPU that a full cluster does not have:
    the rollout takes one replica down at a time instead, as many as the
    PodDisruptionBudget lets a node drain take."""
    strategy = resources[("Deployment", "softmax-serve")]["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    budget = resources[("PodDisruptionBudget", "softmax-serve")]["spec"]
    assert budget["maxUnavailable"] == strategy["rollingUpdate"]["maxUnavailable"]


def test_site_values_are_listed_once_and_marked_where_set():
    """The header's list of what a cluster may change names exactly the
    fields marked "# SITE" in the manifest."""
    text = MANIFEST.read_text()
    listing = text.split('marked "# SITE"')[1].split("# They stay")[0]
    listed = re.findall(r"^#   (\w+) ", listing, re.M)
    marked = [re.match(r"\s*#?\s*(?:- )?(\w+)", line).group(1)
              for line in text.splitlines() if line.rstrip().endswith("# SITE")]
    assert listed and sorted(listed) == sorted(marked), (listed, marked)


def test_network_policy_covers_the_pods(resources):
    deployment = resources[("Deployment", "softmax-serve")]
    policy = resources[("NetworkPolicy", "softmax-serve")]
    assert policy["spec"]["podSelector"]["matchLabels"] == deployment["spec"]["selector"][
        "matchLabels"]
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert policy["spec"]["egress"] == []
    ports = sorted(p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"])
    assert ports == ["grpc", "http", "metrics"]
    service = resources[("Service", "softmax-serve")]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("manifest", K8S_BUILT_IN, ids=lambda p: p.name)
def test_kubernetes_validate_strict(manifest):
    result = subprocess.run([deploy_tool("kubernetes-validate"), "--strict", str(manifest)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "against version 1.37" in result.stdout, result.stdout
    assert result.stdout.count("passed for resource") == K8S_BUILT_IN[manifest], result.stdout


@pytest.mark.parametrize("manifest", K8S_BUILT_IN, ids=lambda p: p.name)
def test_checkov_finds_nothing(manifest):
    result = subprocess.run(
        [deploy_tool("checkov"), "--file", str(manifest), "--framework", "kubernetes",
         "--compact", "--quiet", "--skip-download"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    # checkov has no policy for a HorizontalPodAutoscaler: for hpa.yaml it
    # checks nothing and prints nothing.
    if manifest != HPA_MANIFEST:
        assert "Failed checks: 0" in result.stdout, result.stdout


def test_envoy_pod_meets_the_restricted_profile(k8s):
    assert_restricted(k8s[("Deployment", "softmax-envoy")]["spec"]["template"]["spec"])


# ------------------------------------------------ drain, spread, balancing

def test_termination_grace_covers_lame_duck_and_drain(k8s):
    """SIGTERM -> NOT_SERVING -> lame duck -> drain bounded by
    --shutdown_grace_s -> exit: the kubelet's SIGKILL must come after all of it."""
    pod = k8s[("Deployment", "softmax-serve")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = dict(a.lstrip("-").split("=", 1) for a in container["args"])
    drain_bound = LAME_DUCK_S + int(args["shutdown_grace_s"]) + EXIT_AFTER_DRAIN_S
    assert pod["terminationGracePeriodSeconds"] > drain_bound
    # No preStop: the server's own drain covers the endpoint change
    # (deploy/k8s/softmax-serve.yaml says why).
    assert "lifecycle" not in container
    # Readiness is the health service that goes NOT_SERVING at SIGTERM.
    assert container["readinessProbe"]["grpc"]["service"] == "softmax.v1.SoftmaxService"


def test_envoy_drains_its_listeners_before_it_stops(k8s):
    """The preStop hook asks the admin (its loopback address in the
    ConfigMap) for a graceful drain, then outlasts --drain-time-s; the grace
    period outlasts the hook. tests/test_fleet_drain.py runs the hook."""
    pod = k8s[("Deployment", "softmax-envoy")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = dict(a.lstrip("-").split("=", 1) for a in container["args"] if "=" in a)
    assert args["drain-strategy"] == "gradual"
    config = yaml.safe_load(k8s[("ConfigMap", "softmax-envoy")]["data"]["envoy.yaml"])
    admin = config["admin"]["address"]["socket_address"]
    assert admin["address"] == "127.0.0.1"
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["/bin/bash", "-c"]
    script = command[2]
    assert f"/dev/tcp/127.0.0.1/{admin['port_value']}" in script
    assert "POST /drain_listeners?graceful HTTP/1.1" in script
    (sleep,) = re.findall(r"^sleep (\d+)$", script, re.M)
    assert int(args["drain-time-s"]) < int(sleep) < pod["terminationGracePeriodSeconds"]


def test_envoy_scales_on_cpu_and_exposes_its_metrics(k8s):
    envoy = k8s[("Deployment", "softmax-envoy")]
    hpa = k8s[("HorizontalPodAutoscaler", "softmax-envoy")]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "softmax-envoy"}
    assert "replicas" not in envoy["spec"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    (container,) = envoy["spec"]["template"]["spec"]["containers"]
    assert "cpu" in container["resources"]["requests"]
    budget = k8s[("PodDisruptionBudget", "softmax-envoy")]
    assert budget["spec"]["maxUnavailable"] < hpa["spec"]["minReplicas"]
    # One pod at a time out, each draining before the next.
    assert hpa["spec"]["behavior"]["scaleDown"]["policies"] == [
        {"type": "Pods", "value": 1, "periodSeconds": 60}]
    # The metrics port is the ConfigMap's listener "metrics", scraped by
    # annotation and admitted from the scraper's namespace only.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for key in ("envoy.yaml", "envoy-tls.yaml"):
        config = yaml.safe_load(k8s[("ConfigMap", "softmax-envoy")]["data"][key])
        (metrics,) = [l for l in config["static_resources"]["listeners"]
                      if l["name"] == "metrics"]
        assert metrics["address"]["socket_address"]["port_value"] == ports["metrics"]
    annotations = envoy["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(ports["metrics"])
    assert annotations["prometheus.io/path"] == "/stats/prometheus"
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "metrics"}
    policy = k8s[("NetworkPolicy", "softmax-envoy")]["spec"]
    (scraper,) = [r for r in policy["ingress"] if {"port": "metrics", "protocol": "TCP"}
                  in r["ports"]]
    assert scraper["from"] == [{"namespaceSelector": {"matchLabels": {
        "softmax-serve.io/metrics-scraper": "true"}}}]
    assert scraper["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    # DNS: kube-dns pods, and NodeLocal DNSCache's link-local address.
    dns = [r for r in policy["egress"] if {"port": 53, "protocol": "UDP"} in r["ports"]]
    assert {"ipBlock": {"cidr": "169.254.20.10/32"}} in [t for r in dns for t in r["to"]]


def test_envoy_rotates_grpc_callers_connections_only(k8s):
    """max_connection_duration on the gRPC listeners (HTTP/2: GOAWAY, then
    the streams open on it live on; tests/test_fleet_drain.py), none on the
    HTTP/1.1 listener, which has no GOAWAY."""
    config = yaml.safe_load(k8s[("ConfigMap", "softmax-envoy")]["data"]["envoy.yaml"])
    ages = {}
    for listener in config["static_resources"]["listeners"]:
        manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
        ages[listener["name"]] = manager.get("common_http_protocol_options", {}).get(
            "max_connection_duration")
    assert ages == {"metrics": None, "softmax_v1": "60s", "kserve_grpc": "60s",
                    "kserve_http": None}, ages


def test_envoy_mounts_the_tls_secrets_where_envoy_tls_reads_them(k8s):
    from deploy.envoy import make_tls_config as tls
    pod = k8s[("Deployment", "softmax-envoy")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    assert {mounts[name]: secret["secretName"] for name, secret in secrets.items()} == {
        tls.FRONT_DIR: "softmax-front-tls", tls.REPLICAS_DIR: "softmax-envoy-client-tls"}
    assert all(secret["optional"] for secret in secrets.values())
    config = k8s[("ConfigMap", "softmax-envoy")]["data"]["envoy-tls.yaml"]
    files = set(re.findall(r"filename: (\S+)}", config))
    assert files == {f"{tls.FRONT_DIR}/tls.crt", f"{tls.FRONT_DIR}/tls.key",
                     f"{tls.REPLICAS_DIR}/tls.crt", f"{tls.REPLICAS_DIR}/tls.key",
                     f"{tls.REPLICAS_DIR}/ca.crt"}, files


@pytest.mark.parametrize("name", ["softmax-serve", "softmax-envoy"])
def test_pods_spread_across_nodes(k8s, name):
    template = k8s[("Deployment", name)]["spec"]["template"]
    constraints = template["spec"]["topologySpreadConstraints"]
    by_key = {c["topologyKey"]: c for c in constraints}
    node = by_key["kubernetes.io/hostname"]
    assert node["maxSkew"] == 1
    assert node["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert "pod-template-hash" in node.get("matchLabelKeys", [])


def test_services_headless_for_clients_and_through_envoy(k8s):
    replicas = k8s[("Deployment", "softmax-serve")]
    headless = k8s[("Service", "softmax-serve")]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == replicas["spec"]["selector"]["matchLabels"]
    front = k8s[("Service", "softmax-front")]
    envoy = k8s[("Deployment", "softmax-envoy")]
    assert front["spec"]["selector"] == envoy["spec"]["selector"]["matchLabels"]
    assert front["spec"].get("clusterIP") != "None"
    # The front Service's ports are Envoy's listeners (but the metrics one).
    config = yaml.safe_load(k8s[("ConfigMap", "softmax-envoy")]["data"]["envoy.yaml"])
    listeners = {l["address"]["socket_address"]["port_value"]
                 for l in config["static_resources"]["listeners"] if l["name"] != "metrics"}
    (container,) = envoy["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {ports[p["targetPort"]] for p in front["spec"]["ports"]} == listeners
    # Envoy resolves the headless Service, at the replicas' own ports.
    service_name = f"{headless['metadata']['name']}.{headless['metadata']['namespace']}.svc"
    server_ports = {p["containerPort"] for p in
                    replicas["spec"]["template"]["spec"]["containers"][0]["ports"]}
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"] == "envoy_admin":  # the metrics listener's way to the admin
            continue
        assert cluster["type"] == "STRICT_DNS", cluster["name"]
        (locality,) = cluster["load_assignment"]["endpoints"]
        (endpoint,) = locality["lb_endpoints"]
        address = endpoint["endpoint"]["address"]["socket_address"]
        assert address["address"].startswith(service_name + "."), address
        assert address["port_value"] in server_ports, address
    volume = envoy["spec"]["template"]["spec"]["volumes"][0]
    assert volume["configMap"]["name"] == "softmax-envoy"


@pytest.mark.parametrize("generator", [MAKE_TLS_CONFIG, MAKE_ENVOY_CONFIG],
                         ids=lambda m: m.rsplit(".", 1)[1] + ".py")
def test_envoy_config_map_is_up_to_date(generator):
    result = subprocess.run([sys.executable, "-m", generator, "--check"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_envoy_accepts_the_kubernetes_config(k8s, tmp_path):
    import fleet_util

    binary = fleet_util.envoy_binary()
    reason = fleet_util.envoy_unusable_reason(binary)
    assert reason is None, reason
    # envoy-tls.yaml's certificate files: any valid pair, here.
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=test",
                    "-keyout", str(tmp_path / "tls.key"), "-out", str(tmp_path / "tls.crt")],
                   check=True, capture_output=True, timeout=60)
    (tmp_path / "ca.crt").write_bytes((tmp_path / "tls.crt").read_bytes())
    for key, text in k8s[("ConfigMap", "softmax-envoy")]["data"].items():
        config = tmp_path / key
        config.write_text(re.sub(r"/etc/envoy-tls/\w+/", f"{tmp_path}/", text))
        result = subprocess.run([binary, "--mode", "validate", "-c", str(config)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and "OK" in result.stdout, (
            key, result.stdout + result.stderr)


def test_envoy_metrics_port_serves_stats_and_readiness_only(k8s, tmp_path):
    """The Kubernetes configuration run for real (listeners moved to free
    loopback ports): its metrics listener answers /stats/prometheus with the
    counters deploy/prometheus/alerts.yml reads, and nothing else of the admin."""
    import fleet_util

    config = yaml.safe_load(k8s[("ConfigMap", "softmax-envoy")]["data"]["envoy.yaml"])
    config["admin"]["address"]["socket_address"]["port_value"] = 0
    for listener in config["static_resources"]["listeners"]:
        listener["address"]["socket_address"] = {"address": "127.0.0.1", "port_value": 0}
    admin_path = tmp_path / "admin-address"
    path = tmp_path / "envoy.yaml"
    # The admin cluster's port follows the admin's, known once Envoy runs:
    # give the admin a fixed free port instead.
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        admin_port = s.getsockname()[1]
    config["admin"]["address"]["socket_address"]["port_value"] = admin_port
    (admin_cluster,) = [c for c in config["static_resources"]["clusters"]
                        if c["name"] == "envoy_admin"]
    admin_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"][
        "address"]["socket_address"]["port_value"] = admin_port
    path.write_text(yaml.safe_dump(config))
    process = subprocess.Popen([fleet_util.envoy_binary(), "-c", str(path), "--concurrency", "1",
                                "--disable-hot-restart", "--admin-address-path", str(admin_path),
                                "--log-level", "error"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import e2e_util
        e2e_util.wait_for(lambda: admin_path.exists() and admin_path.read_text().strip(), 30,
                          "Envoy's admin address")
        admin = f"http://{admin_path.read_text().strip()}"

        def metrics_port():
            # The admin answers before the listeners are up: until then the
            # metrics listener reports no port (0), or its port refuses.
            listeners = json.loads(urllib.request.urlopen(f"{admin}/listeners?format=json",
                                                          timeout=10).read())
            (metrics,) = [l["local_address"]["socket_address"] for l in
                          listeners["listener_statuses"] if l["name"] == "metrics"]
            port = metrics.get("port_value", 0)
            if not port:
                return None
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return None
            return port

        port = e2e_util.wait_for(metrics_port, 30, "Envoy's metrics listener")
        base = f"http://127.0.0.1:{port}"
        text = urllib.request.urlopen(f"{base}/stats/prometheus", timeout=10).read().decode()
        for name in ("envoy_cluster_upstream_rq_retry_overflow",
                     "envoy_cluster_outlier_detection_ejections_enforced_total",
                     "envoy_cluster_upstream_rq_pending_overflow",
                     "envoy_http_downstream_rq_too_many_premature_resets"):
            assert f"\n{name}{{" in text, name
        for path_, method in (("/clusters", "GET"), ("/config_dump", "GET"),
                              ("/quitquitquit", "POST"), ("/drain_listeners", "POST")):
            request = urllib.request.Request(base + path_, method=method)
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(request, timeout=10)
            assert caught.value.code == 404, path_
        assert process.poll() is None
    finally:
        process.kill()
        process.wait(timeout=10)


# ------------------------------------------------------------- autoscaling

def test_keda_scaled_object_matches_keda_crd_schema():
    result = subprocess.run([deploy_tool("python"), str(VALIDATE_CRD), str(K8S_SCHEMAS),
                             str(KEDA_MANIFEST)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ScaledObject/softmax-serve: passed" in result.stdout, result.stdout
    source = json.loads(K8S_SCHEMAS.joinpath("ScaledObject.json").read_text())["source"]
    assert source.startswith("kedacore/keda v"), source


@pytest.mark.parametrize("mistake, expected", [
    (lambda so: so["spec"].update(minReplicas=2), "minReplicas"),
    (lambda so: so["spec"].update(pollingInterval="15"), "spec.pollingInterval"),
    (lambda so: so["spec"]["triggers"][0].pop("type"), "'type' is a required property"),
    (lambda so: so["spec"].pop("scaleTargetRef"), "'scaleTargetRef' is a required property"),
])
def test_keda_schema_check_catches_mistakes(tmp_path, mistake, expected):
    scaled = yaml.safe_load(KEDA_MANIFEST.read_text())
    mistake(scaled)
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(scaled))
    result = subprocess.run([deploy_tool("python"), str(VALIDATE_CRD), str(K8S_SCHEMAS),
                             str(broken)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stdout and expected in result.stdout, result.stdout


# ------------------------------------------------------------ monitoring

def validate_k8s_crd(*manifests):
    return subprocess.run([deploy_tool("python"), str(VALIDATE_CRD), str(K8S_SCHEMAS),
                           *map(str, manifests)],
                          capture_output=True, text=True, timeout=120)


def test_monitoring_matches_prometheus_operator_crd_schemas():
    result = validate_k8s_crd(MONITORING_MANIFEST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PodMonitor/softmax-serve: passed" in result.stdout, result.stdout
    assert "PodMonitor/softmax-envoy: passed" in result.stdout, result.stdout
    assert "PrometheusRule/softmax-serve: passed" in result.stdout, result.stdout
    for kind in ("PodMonitor", "ServiceMonitor", "PrometheusRule"):
        source = json.loads(K8S_SCHEMAS.joinpath(f"{kind}.json").read_text())["source"]
        assert source.startswith("prometheus-operator/prometheus-operator v"), source


@pytest.mark.parametrize("mistake, expected", [
    (lambda r: r["PodMonitor"]["spec"]["podMetricsEndpoints"][0].update(intervall="15s"),
     "intervall"),
    (lambda r: r["PodMonitor"]["spec"].pop("selector"), "'selector' is a required property"),
    (lambda r: r["PrometheusRule"]["spec"]["groups"][0]["rules"][0].update(expr=None),
     "spec.groups.0.rules.0.expr"),
    (lambda r: r["PrometheusRule"]["spec"]["groups"][0].pop("name"),
     "'name' is a required property"),
])
def test_monitoring_schema_check_catches_mistakes(tmp_path, mistake, expected):
    assert_check_catches(validate_k8s_crd, MONITORING_MANIFEST, mistake, expected, tmp_path)


def assert_check_catches(validate, manifest, mistake, expected, tmp_path):
    """`validate` (validate_k8s_crd or validate_crd) fails `manifest` with
    `mistake` applied ({kind: document} changed in place), naming `expected`."""
    documents = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    mistake({d["kind"]: d for d in documents})
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump_all(documents))
    result = validate(broken)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stdout and expected in result.stdout, result.stdout


def test_prometheus_rule_is_up_to_date():
    result = subprocess.run([sys.executable, "-m", MAKE_PROMETHEUS_RULE, "--check"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_rule_holds_the_rule_files_and_promtool_accepts_it(k8s, tmp_path):
    groups = k8s[("PrometheusRule", "softmax-serve")]["spec"]["groups"]
    sources = [g for path in (ALERTS, AUTOSCALING_RULES)
               for g in yaml.safe_load(path.read_text())["groups"]]
    assert groups == sources
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    result = subprocess.run(["/usr/bin/promtool", "check", "rules", str(rules)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_pod_monitor_scrapes_the_replicas_metrics_port(k8s):
    monitor = k8s[("PodMonitor", "softmax-serve")]
    deployment = k8s[("Deployment", "softmax-serve")]
    template = deployment["spec"]["template"]
    assert monitor["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        template["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (container,) = template["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = dict(a.lstrip("-").split("=", 1) for a in container["args"])
    assert args["metrics_address"].endswith(f":{ports[endpoint['port']]}")
    assert endpoint["path"] == "/metrics"
    # The same interval as the hand-written configuration's, which the
    # recording rules' 1-minute windows are sized for.
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "kubernetes.yml").read_text())
    assert endpoint["interval"] == config["global"]["scrape_interval"]


def test_envoy_pod_monitor_scrapes_envoys_stats(k8s):
    """Envoy's counters from its pods' port named metrics, which serves
    /stats/prometheus (deploy/k8s/envoy.yaml)."""
    monitor = k8s[("PodMonitor", "softmax-envoy")]
    template = k8s[("Deployment", "softmax-envoy")]["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        template["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "metrics", "path": "/stats/prometheus", "interval": "15s"}


# The configuration prometheus-adapter's Helm chart renders with its default
# values (rules.default: true, no custom rules): the six default rules of
# prometheus-community/helm-charts charts/prometheus-adapter/templates/
# configmap.yaml (commit 05bf01b5028ee6dc636510132a7de9554b135b6e), as the
# `config.yaml` of its ConfigMap (tests/data/). The template appends
# `rules.custom` after them (toYaml, indented 4), which chart_config() does
# the same way.
CHART_DEFAULT_RULES = (Path(__file__).parent / "data" /
                       "prometheus-adapter-chart-default.yaml").read_text()


def adapter_rules_custom():
    """The prometheus-adapter rules of adapter-rules.yaml (a Helm values
    file: rules.custom)."""
    values = yaml.safe_load(ADAPTER_RULES.read_text())
    assert list(values) == ["rules"] and list(values["rules"]) == ["custom"], values
    return values["rules"]["custom"]


def chart_config(custom):
    """The adapter's config.yaml as the chart's template renders it with
    rules.default and these rules.custom."""
    appended = "".join(f"    {line}\n" for line in
                       yaml.safe_dump(custom, default_flow_style=False).splitlines())
    indented_default = "".join(f"    {line}\n" for line in CHART_DEFAULT_RULES.splitlines())
    return textwrap.dedent(indented_default + appended)


def test_adapter_rules_merge_into_the_charts_default_configuration():
    """The rules go beside a stock adapter's, never in place of them."""
    stock = yaml.safe_load(CHART_DEFAULT_RULES)["rules"]
    ours = adapter_rules_custom()
    merged = yaml.safe_load(chart_config(ours))
    assert list(merged) == ["rules"]
    assert merged["rules"] == stock + ours
    # Our series match no stock rule's name pattern that would serve them
    # under another name first: the stock rules skip colon-named (recorded)
    # series, and ours match only the recorded series.
    for rule in ours:
        (series,) = re.findall(r"^([\w:]+)\{", rule["seriesQuery"])
        assert re.fullmatch(rule["name"]["matches"], series)
        for template in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
            assert template in rule["metricsQuery"], template
    names = [r["name"]["as"] for r in merged["rules"] if r["name"]["as"]]
    assert len(names) == len(set(names)) == len(ours)


def test_keda_and_the_adapter_read_the_same_per_pod_values(tmp_path):
    """On one scrape in which a pod has its series twice (a PodMonitor's job
    beside pod discovery's), KEDA's queries read the sum of exactly the
    per-pod values that the adapter's queries (as the adapter fills them in
    for the HPA) serve, evaluated by promtool (Prometheus' own engine) on the
    recording rules; a plain sum would read the doubled pod twice."""
    jobs = {"a": ["softmax-serve", "softmax-serve/softmax-serve"], "b": ["softmax-serve"]}
    # Per pod: (queue seconds, compute seconds) added per 15 s scrape, and
    # (held bytes, limit): the ratios 0.5 and 1.5, 0.25 and 0.5.
    rates = {"a": (1, 2), "b": (3, 2)}
    held = {"a": (1 << 30, 4 << 30), "b": (2 << 30, 4 << 30)}
    expected = {SIGNALS[0]: {p: q / c for p, (q, c) in rates.items()},
                SIGNALS[1]: {p: h / limit for p, (h, limit) in held.items()}}
    series = []
    for pod, pod_jobs in jobs.items():
        for job in pod_jobs:
            labels = f'job="{job}",namespace="softmax-serve",pod="{pod}",instance="{pod}:9464"'
            queue, compute = rates[pod]
            series += [
                {"series": f"softmax_queue_duration_seconds_sum{{{labels}}}",
                 "values": f"0+{queue}x20"},
                {"series": f"softmax_compute_duration_seconds_sum{{{labels}}}",
                 "values": f"0+{compute}x20"},
                {"series": f"softmax_held_bytes{{{labels}}}", "values": f"{held[pod][0]}x20"},
                {"series": f"softmax_held_bytes_limit{{{labels}}}",
                 "values": f"{held[pod][1]}x20"}]
    # A replica of another namespace (the KServe one) counts for neither.
    other = 'job="softmax-kserve",namespace="softmax-kserve",pod="c",instance="c:9464"'
    series += [{"series": f"softmax_queue_duration_seconds_sum{{{other}}}", "values": "0+9x20"},
               {"series": f"softmax_compute_duration_seconds_sum{{{other}}}",
                "values": "0+1x20"}]

    adapter = {r["name"]["as"]: r for r in adapter_rules_custom()}
    hpa = yaml.safe_load_all(HPA_MANIFEST.read_text())
    (hpa,) = [d for d in hpa if d and d["kind"] == "HorizontalPodAutoscaler"]
    (scaled,) = [d for d in yaml.safe_load_all(KEDA_MANIFEST.read_text()) if d]
    checks = []
    for signal, metric, trigger in zip(SIGNALS, hpa["spec"]["metrics"],
                                       scaled["spec"]["triggers"], strict=True):
        rule = adapter[metric["pods"]["metric"]["name"]]
        query = (rule["metricsQuery"].replace("<<.Series>>", signal)
                 .replace("<<.LabelMatchers>>", 'namespace="softmax-serve",pod=~"a|b"')
                 .replace("<<.GroupBy>>", "pod"))
        per_pod = expected[signal]
        checks.append({"expr": query, "eval_time": "4m", "exp_samples": [
            {"labels": f'{{pod="{pod}"}}', "value": value} for pod, value in per_pod.items()]})
        keda_value = sum(per_pod.values())
        checks.append({"expr": trigger["metadata"]["query"], "eval_time": "4m",
                       "exp_samples": [{"labels": "{}", "value": keda_value}]})
        # The scrape does hold a pod twice: the plain sum reads more.
        doubled = keda_value + per_pod["a"]
        checks.append({"expr": f'sum({signal}{{namespace="softmax-serve"}})',
                       "eval_time": "4m", "exp_samples": [{"labels": "{}", "value": doubled}]})
    unit_test = tmp_path / "keda_adapter_test.yml"
    unit_test.write_text(yaml.safe_dump({
        "rule_files": [str(AUTOSCALING_RULES)], "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": series, "promql_expr_test": checks}]}))
    result = subprocess.run(["/usr/bin/promtool", "test", "rules", str(unit_test)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def quantity(text):
    text = str(text)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def test_autoscalers_read_the_recorded_signals_with_one_target_each(k8s, kserve):
    """The HPA (through prometheus-adapter), KEDA and KServe scale the
    Deployment on the recording rules' series, in the same order, with the
    same targets, bounds and stabilization windows; the rules exist."""
    rules = [r for g in yaml.safe_load(AUTOSCALING_RULES.read_text())["groups"]
             for r in g["rules"]]
    assert [r["record"] for r in rules] == SIGNALS

    hpa = k8s[("HorizontalPodAutoscaler", "softmax-serve")]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "softmax-serve"}
    adapter_rules = {r["name"]["as"]: r for r in adapter_rules_custom()}
    targets = []
    for signal, metric in zip(SIGNALS, hpa["spec"]["metrics"], strict=True):
        rule = adapter_rules[metric["pods"]["metric"]["name"]]
        assert signal in rule["seriesQuery"] and re.fullmatch(rule["name"]["matches"], signal)
        for template in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
            assert template in rule["metricsQuery"], template
        targets.append(quantity(metric["pods"]["target"]["averageValue"]))

    scaled = k8s[("ScaledObject", "softmax-serve")]
    assert scaled["spec"]["scaleTargetRef"]["name"] == "softmax-serve"
    for signal, target, trigger in zip(SIGNALS, targets, scaled["spec"]["triggers"],
                                       strict=True):
        assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
        # The metadata a prometheus trigger reads (the CRD leaves it free-form).
        assert set(trigger["metadata"]) <= {"serverAddress", "query", "threshold",
                                            "activationThreshold", "ignoreNullValues",
                                            "namespace", "unsafeSsl", "queryParameters"}
        assert f'{signal}{{namespace="softmax-serve"}}' in trigger["metadata"]["query"]
        assert float(trigger["metadata"]["threshold"]) == target

    service = kserve[("InferenceService", "softmax")]
    predictor = service["spec"]["predictor"]
    assert service["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "keda"
    for signal, target, external in zip(SIGNALS, targets, predictor["autoScaling"]["metrics"],
                                        strict=True):
        assert f'{signal}{{namespace="softmax-kserve"}}' in external["external"]["metric"][
            "query"]
        assert float(external["external"]["target"]["value"]) == target

    behaviors = [hpa["spec"]["behavior"],
                 scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]]
    assert behaviors[0] == behaviors[1]
    for direction in ("scaleUp", "scaleDown"):
        assert (predictor["autoScaling"]["behavior"][direction]["stabilizationWindowSeconds"] ==
                behaviors[0][direction]["stabilizationWindowSeconds"])
    assert behaviors[0]["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert behaviors[0]["scaleDown"]["stabilizationWindowSeconds"] >= 60
    bounds = {(hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]),
              (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]),
              (predictor["minReplicas"], predictor["maxReplicas"])}
    assert len(bounds) == 1, bounds
    # A voluntary disruption never takes the last replicas.
    (minimum, _), = bounds
    budget = k8s[("PodDisruptionBudget", "softmax-serve")]
    assert budget["spec"]["maxUnavailable"] < minimum
    # The Deployment leaves its replica count to the autoscaler.
    assert "replicas" not in k8s[("Deployment", "softmax-serve")]["spec"]


def test_hadolint_finds_nothing():
    result = subprocess.run([deploy_tool("hadolint"), str(DOCKERFILE)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_checkov_finds_nothing_in_the_dockerfile():
    result = subprocess.run(
        [deploy_tool("checkov"), "--file", str(DOCKERFILE), "--framework", "dockerfile",
         "--compact", "--quiet", "--skip-download"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Failed checks: 0" in result.stdout, result.stdout


def test_runtime_image_runs_as_the_manifests_user_with_the_nvidia_variables(resources, kserve):
    """What deploy/image-check.sh checks on the built image, read here from
    the Dockerfile's last stage, so that it holds where no image is built."""
    runtime = DOCKERFILE.read_text().split("\nFROM ")[-1]
    assert runtime.startswith("${DEBIAN_SLIM_IMAGE} AS runtime")
    (user,) = re.findall(r"^USER (\S+)$", runtime, re.M)
    uid = int(user.split(":")[0])
    pods = [resources[("Deployment", "softmax-serve")]["spec"]["template"]["spec"],
            kserve_pod(kserve)]
    assert uid > 0 and all(p["securityContext"]["runAsUser"] == uid for p in pods)
    for variable in ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
                     "NVIDIA_REQUIRE_CUDA"):
        assert re.search(rf"\b{variable}=", runtime), variable
    # Only the bundle of the server and the client comes from the build stage.
    assert re.findall(r"^COPY .*$", runtime, re.M) == [
        "COPY --from=build /opt/softmax-serve /opt/softmax-serve"]
    assert "--target softmax-server softmax-client" in DOCKERFILE.read_text()


def test_alerts_name_no_scrape_job():
    """Job names differ between compose, Kubernetes pod discovery and a
    ServiceMonitor: no rule may depend on one."""
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    for rule in rules:
        assert not re.search(r"\bjob\s*=", rule["expr"]), rule["alert"]


def test_every_alert_has_firing_and_quiet_unit_tests():
    alerts = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"]
              for r in g["rules"]}
    firing, quiet = set(), set()
    for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    assert firing == alerts and quiet == alerts, (alerts, firing, quiet)


def test_promtool_rule_unit_tests_pass():
    promtool = "/usr/bin/promtool"
    result = subprocess.run([promtool, "test", "rules", str(ALERT_TESTS),
                             str(AUTOSCALING_RULES.with_name("autoscaling_test.yml"))],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------- Gateway API and Istio

def gateway_resources():
    found = {}
    for name in ("routes.yaml", "istio.yaml"):
        for d in yaml.safe_load_all((GATEWAY / name).read_text()):
            if d:
                found[d["kind"]] = d
    return found


def test_gateway_api_and_istio_resources_match_their_crd_schemas():
    result = subprocess.run([deploy_tool("python"), str(VALIDATE_CRD), str(K8S_SCHEMAS),
                             str(GATEWAY / "routes.yaml"), str(GATEWAY / "istio.yaml")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    for label in ("Gateway/softmax-gateway", "GRPCRoute/softmax-grpc", "HTTPRoute/softmax-http",
                  "DestinationRule/softmax-serve-balanced",
                  "VirtualService/softmax-serve-balanced"):
        assert f"{label}: passed" in result.stdout, result.stdout
    for kind, source in (("GRPCRoute", "kubernetes-sigs/gateway-api v1."),
                         ("HTTPRoute", "kubernetes-sigs/gateway-api v1."),
                         ("Gateway", "kubernetes-sigs/gateway-api v1."),
                         ("DestinationRule", "istio/istio 1."),
                         ("VirtualService", "istio/istio 1.")):
        entry = json.loads(K8S_SCHEMAS.joinpath(f"{kind}.json").read_text())
        assert entry["source"].startswith(source), entry["source"]
        assert "/standard" in entry["source"] or kind in ("DestinationRule", "VirtualService")


@pytest.mark.parametrize("mistake, expected", [
    (lambda r: r["GRPCRoute"]["spec"]["rules"][0]["matches"][0]["method"].update(type="Glob"),
     "spec.rules.0.matches.0.method.type"),
    (lambda r: r["HTTPRoute"]["spec"]["rules"][0].update(retry={"attempts": 2}), "retry"),
    (lambda r: r["DestinationRule"]["spec"]["trafficPolicy"]["outlierDetection"].update(
        consecutive5xxError=5), "consecutive5xxError"),
    (lambda r: r["VirtualService"]["spec"]["http"][2]["retries"].update(attempts="two"),
     "spec.http.2.retries.attempts"),
    (lambda r: r["Gateway"]["spec"]["listeners"][0].update(protocol="HTTP/3"),
     "spec.listeners.0.protocol"),
])
def test_gateway_schema_check_catches_mistakes(tmp_path, mistake, expected):
    resources = gateway_resources()
    mistake(resources)
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump_all(list(resources.values())))
    result = subprocess.run([deploy_tool("python"), str(VALIDATE_CRD), str(K8S_SCHEMAS),
                             str(broken)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stdout and expected in result.stdout, result.stdout


def _seconds(text):
    text = str(text)
    return float(text[:-2]) / 1000 if text.endswith("ms") else float(text.rstrip("s"))


def test_gateway_api_and_istio_carry_envoy_yaml_settings(k8s):
    """The routes, balancing, outlier detection, retry budget, connection
    limits, retries and timeouts of deploy/envoy/envoy.yaml, as the Gateway
    API routes and Istio's resources say them."""
    envoy = yaml.safe_load((REPO / "deploy" / "envoy" / "envoy.yaml").read_text())
    clusters = {c["name"]: c for c in envoy["static_resources"]["clusters"]}
    routes = {l["name"]: l["filter_chains"][0]["filters"][0]["typed_config"]["route_config"][
        "virtual_hosts"][0]["routes"] for l in envoy["static_resources"]["listeners"]}
    unary = routes["softmax_v1"][1]["route"]
    stream_paths = {r["match"]["path"] for rs in routes.values() for r in rs
                    if r.get("route", {}).get("cluster") == "softmax_grpc_streams"}
    http_route = routes["kserve_http"][-1]["route"]
    grpc = clusters["softmax_grpc"]
    found = gateway_resources()

    rule = found["DestinationRule"]["spec"]
    policy = rule["trafficPolicy"]
    service = k8s[("Service", "softmax-serve-balanced")]
    assert rule["host"] == (f"{service['metadata']['name']}."
                            f"{service['metadata']['namespace']}.svc.cluster.local")
    assert policy["loadBalancer"]["simple"] == grpc["lb_policy"]
    outlier = grpc["outlier_detection"]
    assert policy["outlierDetection"] == {
        "splitExternalLocalOriginErrors": outlier["split_external_local_origin_errors"],
        "consecutiveLocalOriginFailures": outlier["consecutive_local_origin_failure"],
        "consecutive5xxErrors": outlier["consecutive_5xx"],
        "consecutiveGatewayErrors": outlier["enforcing_consecutive_gateway_failure"],
        "interval": outlier["interval"], "baseEjectionTime": outlier["base_ejection_time"],
        "maxEjectionPercent": outlier["max_ejection_percent"]}
    (thresholds,) = grpc["circuit_breakers"]["thresholds"]
    assert policy["retryBudget"] == {
        "percent": thresholds["retry_budget"]["budget_percent"]["value"],
        "minRetryConcurrency": thresholds["retry_budget"]["min_retry_concurrency"]}
    http2 = grpc["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["explicit_http_config"][
        "http2_protocol_options"]
    assert policy["connectionPool"]["http"] == {
        "maxConcurrentStreams": http2["max_concurrent_streams"],
        "http1MaxPendingRequests": thresholds["max_pending_requests"],
        "http2MaxRequests": thresholds["max_requests"]}

    virtual = {r["name"]: r for r in found["VirtualService"]["spec"]["http"]}
    assert {m["uri"]["exact"] for m in virtual["streams"]["match"]} == stream_paths
    assert virtual["streams"]["retries"] == {"attempts": 0}
    assert virtual["streams"]["timeout"] == "0s"
    policy = unary["retry_policy"]
    retries = virtual["unary-grpc"]["retries"]
    assert retries["attempts"] == policy["num_retries"]
    assert retries["perTryTimeout"] == policy["per_try_timeout"]
    assert retries["retryOn"] == policy["retry_on"]
    assert _seconds(retries["backoff"]) == _seconds(policy["retry_back_off"]["base_interval"])
    assert virtual["unary-grpc"]["timeout"] == unary["timeout"]
    http_policy = http_route["retry_policy"]
    assert set(virtual["kserve-http"]["retries"]["retryOn"].split(",")) == (
        set(http_policy["retry_on"].split(",")) - {"retriable-status-codes"}
        | {str(code) for code in http_policy["retriable_status_codes"]})
    assert virtual["kserve-http"]["timeout"] == http_route["timeout"]
    refused = {m["uri"]["prefix"] for m in virtual["shared-memory"]["match"]}
    assert refused == {r["match"]["prefix"] for rs in routes.values() for r in rs
                       if "direct_response" in r}

    assert found["HTTPRoute"]["spec"]["rules"][0]["timeouts"] == {
        "request": http_route["timeout"],
        "backendRequest": http_route["retry_policy"]["per_try_timeout"]}
    # Every RPC of the protocols but shared memory is routed; streams apart.
    grpc_rules = {r["name"]: r for r in found["GRPCRoute"]["spec"]["rules"]}
    methods = {name: {f"/{m['method']['service']}/{m['method']['method']}"
                      for m in rule["matches"]} for name, rule in grpc_rules.items()}
    assert methods["streams"] == stream_paths
    protos = {"softmax.v1.SoftmaxService": REPO / "proto" / "softmax",
              "inference.GRPCInferenceService": REPO / "proto" / "inference"}
    served = {f"/{service_name}/{rpc}" for service_name, folder in protos.items()
              for proto in folder.rglob("*.proto")
              for rpc in re.findall(r"^\s*rpc\s+(\w+)", proto.read_text(), re.M)}
    assert methods["unary"] | methods["streams"] == {
        m for m in served if "SharedMemory" not in m}, served
    # Backends: the balanced Service, at the replicas' ports.
    replicas = k8s[("Deployment", "softmax-serve")]
    assert service["spec"]["selector"] == replicas["spec"]["selector"]["matchLabels"]
    assert "clusterIP" not in service["spec"]
    container_ports = {p["name"] for p in
                       replicas["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports
    service_ports = {p["port"] for p in service["spec"]["ports"]}
    for kind in ("GRPCRoute", "HTTPRoute"):
        for rule in found[kind]["spec"]["rules"]:
            for backend in rule["backendRefs"]:
                assert backend["name"] == service["metadata"]["name"]
                assert backend["port"] in service_ports
    # The Gateway terminates TLS with the certificate Envoy's TLS front uses.
    envoy_pod = k8s[("Deployment", "softmax-envoy")]["spec"]["template"]["spec"]
    (listener,) = found["Gateway"]["spec"]["listeners"]
    assert listener["tls"]["certificateRefs"][0]["name"] in {
        v["secret"]["secretName"] for v in envoy_pod["volumes"] if "secret" in v}


# ------------------------------------------------------------------- KServe

def validate_crd(*manifests):
    return subprocess.run([deploy_tool("python"), str(VALIDATE_CRD), str(KSERVE_SCHEMAS),
                           *map(str, manifests)],
                          capture_output=True, text=True, timeout=120)


def kserve_pod(kserve):
    """The predictor pod KServe makes from the InferenceService and its
    runtime (Standard mode), as its MergePodSpec and MergeRuntimeContainers
    do for the fields these manifests set: the runtime's container under the
    model's container fields, the runtime's volumes, the predictor's pod
    fields."""
    service = kserve[("InferenceService", "softmax")]
    predictor = service["spec"]["predictor"]
    runtime = kserve[("ServingRuntime", predictor["model"]["runtime"])]["spec"]
    (container,) = [dict(c) for c in runtime["containers"] if c["name"] == "kserve-container"]
    model_only = {"modelFormat", "runtime", "protocolVersion", "storageUri", "storage"}
    for key, value in predictor["model"].items():
        if key not in model_only:
            container[key] = container.get(key, []) + value if key == "args" else value
    component_only = {"model", "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric",
                      "scaleMetricType", "autoScaling", "containerConcurrency", "timeout",
                      "canaryTrafficPercent", "logger", "batcher", "labels", "annotations",
                      "deploymentStrategy", "storageUris"}
    pod = {"volumes": runtime.get("volumes", []), "containers": [container]}
    pod.update({k: v for k, v in predictor.items() if k not in component_only})
    return pod


def test_kserve_resources_match_kserve_crd_schemas():
    result = validate_crd(KSERVE_MANIFEST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ServingRuntime/softmax-serve: passed" in result.stdout, result.stdout
    assert "InferenceService/softmax: passed" in result.stdout, result.stdout
    assert KSERVE_SCHEMAS.joinpath("ServingRuntime.json").is_file()
    source = json.loads(KSERVE_SCHEMAS.joinpath("InferenceService.json").read_text())["source"]
    assert source.startswith("kserve/kserve v"), source


@pytest.mark.parametrize("mistake, expected", [
    # A misspelt field: the API server (strict field validation) refuses it.
    (lambda r: r["InferenceService"]["spec"]["predictor"]["model"].update(protocolVerison="v2"),
     "protocolVerison"),
    (lambda r: r["ServingRuntime"]["spec"]["containers"][0].update(readinesProbe={}),
     "readinesProbe"),
    # A wrong type, a value outside the CRD's enum, a required field missing.
    (lambda r: r["InferenceService"]["spec"]["predictor"].update(minReplicas="two"),
     "spec.predictor.minReplicas"),
    (lambda r: r["InferenceService"]["spec"]["predictor"].update(scaleMetric="gpu"),
     "spec.predictor.scaleMetric"),
    (lambda r: r["ServingRuntime"]["spec"]["containers"][0]["ports"][0].pop("containerPort"),
     "'containerPort' is a required property"),
    # A field of a subtree the vendored schema prunes.
    (lambda r: r["InferenceService"]["spec"]["predictor"].update(triton={}),
     "spec.predictor.triton: pruned"),
])
def test_kserve_schema_check_catches_mistakes(tmp_path, mistake, expected):
    assert_check_catches(validate_crd, KSERVE_MANIFEST, mistake, expected, tmp_path)


def test_kserve_built_in_kinds_pass_kubernetes_validate():
    result = subprocess.run([deploy_tool("kubernetes-validate"), "--strict", str(KSERVE_MANIFEST)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed for resource") == 2, result.stdout


def test_kserve_pod_meets_the_restricted_profile(kserve):
    namespace = kserve[("Namespace", "softmax-kserve")]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    service = kserve[("InferenceService", "softmax")]
    # Only Standard mode makes a plain Deployment: Knative mode adds a
    # queue-proxy sidecar the manifest does not control.
    assert service["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    for resource in kserve.values():
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == "softmax-kserve", resource["kind"]
    pod = kserve_pod(kserve)
    assert_restricted(pod)
    # No storage initializer (an init container KServe would add) is wanted.
    assert "storageUri" not in service["spec"]["predictor"]["model"]


def test_kserve_runtime_serves_the_inference_service(kserve):
    service = kserve[("InferenceService", "softmax")]
    model = service["spec"]["predictor"]["model"]
    runtime = kserve[("ServingRuntime", model["runtime"])]
    # What KServe's controller checks before it deploys (predictor.go).
    assert not runtime["spec"].get("disabled")
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert model["modelFormat"]["name"] in [f["name"] for f in
                                            runtime["spec"]["supportedModelFormats"]]
    pod = kserve_pod(kserve)
    (container,) = pod["containers"]
    args = dict(a.lstrip("-").split("=", 1) for a in container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # The first port is the Service's port 80: the HTTP/REST endpoint.
    assert container["ports"][0]["name"] == "http"
    assert args["http_address"].endswith(f":{ports['http']}")
    assert args["grpc_address"].endswith(f":{ports['grpc']}")
    assert args["metrics_address"].endswith(f":{ports['metrics']}")
    annotations = runtime["spec"]["annotations"]
    assert annotations["prometheus.kserve.io/port"] == str(ports["metrics"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == ports["http"], probe
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60
    for kind in ("requests", "limits"):
        for resource in ("cpu", "memory", "nvidia.com/gpu"):
            assert resource in container["resources"][kind], (kind, resource)
    assert pod["terminationGracePeriodSeconds"] > int(args["shutdown_grace_s"])
    budget = kserve[("PodDisruptionBudget", "softmax-predictor")]
    assert budget["spec"]["selector"]["matchLabels"] == {
        "serving.kserve.io/inferenceservice": service["metadata"]["name"],
        "component": "predictor"}
    assert budget["spec"]["maxUnavailable"] < service["spec"]["predictor"]["minReplicas"]


def test_deployment_arguments_start_the_server(resources):
    import e2e_util

    container = resources[("Deployment", "softmax-serve")]["spec"]["template"]["spec"][
        "containers"][0]
    server = e2e_util.Server(*e2e_util.loopback_cpu_args(container["args"]))
    try:
        channel = server.channel()
        service = container["readinessProbe"]["grpc"]["service"]
        assert e2e_util.health_check(channel, service) == "SERVING"
        channel.close()
        assert server.stop() == 0
    finally:
        server.kill()


def test_kserve_runtime_arguments_start_the_server(kserve):
    """The runtime's own arguments (addresses moved to free loopback ports,
    the CPU for the GPU) start the real server, which then answers the
    probes' paths and an inference on the model the InferenceService names."""
    import e2e_util

    service = kserve[("InferenceService", "softmax")]
    (container,) = kserve_pod(kserve)["containers"]
    server = e2e_util.Server(*e2e_util.loopback_cpu_args(container["args"]))
    try:
        base = f"http://{server.http_address}"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            with urllib.request.urlopen(base + container[probe]["httpGet"]["path"],
                                        timeout=10) as response:
                assert response.status == 200, probe
        body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32",
                                       "data": [1.0, 2.0, 3.0]}]}).encode()
        request = urllib.request.Request(
            f"{base}/v2/models/{service['metadata']['name']}/infer", data=body,
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            output = json.loads(response.read())["outputs"][0]
        e2e_util.assert_close(output["data"], e2e_util.reference_softmax([1.0, 2.0, 3.0]),
                              "float32", "softmax over KServe v2 HTTP")
        assert server.stop() == 0
    finally:
        server.kill()
