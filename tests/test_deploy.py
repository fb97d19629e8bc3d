"""The deploy files as a platform team's checks see them: the Kubernetes
manifest against the restricted Pod Security Standard and the API schemas
(kubernetes-validate --strict) and checkov's policies, and the alert rules
against their unit tests. The validators come from PyPI into the venv
`make venv` creates at $SOFTMAX_DEPLOY_VENV; nothing here needs the network."""

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "deploy" / "k8s" / "softmax-serve.yaml"
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


def project_version():
    match = re.search(r"project\(softmax_serve VERSION (\S+)",
                      (REPO / "CMakeLists.txt").read_text())
    return match.group(1)


def test_pod_meets_the_restricted_profile(resources):
    namespace = resources[("Namespace", "softmax-serve")]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    deployment = resources[("Deployment", "softmax-serve")]
    assert deployment["metadata"]["namespace"] == "softmax-serve"
    pod = deployment["spec"]["template"]["spec"]
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
    assert budget["spec"]["maxUnavailable"] < deployment["spec"]["replicas"]


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


def test_kubernetes_validate_strict():
    result = subprocess.run([deploy_tool("kubernetes-validate"), "--strict", str(MANIFEST)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed for resource") == 6, result.stdout


def test_checkov_finds_nothing():
    result = subprocess.run(
        [deploy_tool("checkov"), "--file", str(MANIFEST), "--framework", "kubernetes",
         "--compact", "--quiet", "--skip-download"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Failed checks: 0" in result.stdout, result.stdout


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
    result = subprocess.run([promtool, "test", "rules", str(ALERT_TESTS)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
