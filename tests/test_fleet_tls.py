"""TLS through the front: the real Envoy running deploy/envoy/envoy-tls.yaml
(made by deploy/envoy/make_tls_config.py from deploy/envoy/envoy.yaml; only
its certificate paths replaced here) in front of replicas that serve nothing
but mutual TLS (--tls_cert_file, --tls_key_file, --tls_client_ca_file) and
check bearer tokens (--auth_tokens_file):

  - callers over TLS get right answers on every listener (softmax.v1 unary
    and stream, KServe gRPC, KServe HTTP), spread over both replicas;
  - a caller without TLS is refused;
  - tokens pass through Envoy unchanged: a good one is answered, a wrong or
    missing one refused UNAUTHENTICATED (HTTP 401), and never retried;
  - Envoy reaches the replicas, health checks included, over mutual TLS
    only: the replicas refuse plaintext and a TLS client without Envoy's
    certificate, yet Envoy holds them healthy.

Certificates are made here with openssl (as tests/test_security.py does):
one CA for the callers' side (the certificate Envoy shows them), one for
Envoy and the replicas (each replica's certificate names the headless
Service, softmax-serve.softmax-serve.svc, as envoy-tls.yaml requires)."""

import http.client
import json
import ssl
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest

import e2e_util
import fleet_util
from deploy.envoy import make_tls_config
from e2e_util import assert_close, reference_softmax

_ENVOY_REASON = fleet_util.envoy_unusable_reason()
pytestmark = pytest.mark.skipif(_ENVOY_REASON is not None, reason=f"Envoy: {_ENVOY_REASON}")

TLS_CONFIG = fleet_util.REPO / "deploy" / "envoy" / "envoy-tls.yaml"

GOOD_TOKEN = "fleet-token-one"
SHAPE = (2, 16)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """front-ca signs what callers see (front.pem, for 127.0.0.1); fleet-ca
    signs each replica's certificate and Envoy's client certificate. The
    folders front/ and replicas/ hold what deploy/k8s/envoy.yaml mounts at
    /etc/envoy-tls/front and /etc/envoy-tls/replicas."""
    folder = tmp_path_factory.mktemp("fleet-pki")
    e2e_util.make_ca(folder, "front-ca")
    e2e_util.make_ca(folder, "fleet-ca")
    e2e_util.make_ca(folder, "other-ca")
    e2e_util.make_certificate(folder, "front-ca", "front", "subjectAltName=DNS:localhost,IP:127.0.0.1")
    e2e_util.make_certificate(folder, "fleet-ca", "replica",
               f"subjectAltName=DNS:{make_tls_config.REPLICA_NAME}\n"
               "extendedKeyUsage=serverAuth")
    e2e_util.make_certificate(folder, "fleet-ca", "envoy", "extendedKeyUsage=clientAuth")
    e2e_util.make_certificate(folder, "other-ca", "intruder", "extendedKeyUsage=clientAuth")
    (folder / "front").mkdir()
    (folder / "replicas").mkdir()
    for target, source in {"front/tls.crt": "front.pem", "front/tls.key": "front.key",
                           "replicas/tls.crt": "envoy.pem", "replicas/tls.key": "envoy.key",
                           "replicas/ca.crt": "fleet-ca.pem"}.items():
        (folder / target).write_bytes((folder / source).read_bytes())
    (folder / "tokens").write_text(f"# the fleet's callers\n{GOOD_TOKEN}\n")
    return folder


def _certificates_from(folder):
    """envoy_patch: envoy-tls.yaml's certificate paths moved into `folder`."""
    front, replicas = make_tls_config.FRONT_DIR, make_tls_config.REPLICAS_DIR

    def move(node):
        if isinstance(node, dict):
            return {key: move(value) for key, value in node.items()}
        if isinstance(node, list):
            return [move(value) for value in node]
        if isinstance(node, str):
            return (node.replace(front, str(folder / "front"))
                    .replace(replicas, str(folder / "replicas")))
        return node

    def patch(config):
        config["static_resources"] = move(config["static_resources"])
    return patch


@pytest.fixture(scope="module")
def fleet(pki):
    server_args = [f"--tls_cert_file={pki / 'replica.pem'}",
                   f"--tls_key_file={pki / 'replica.key'}",
                   f"--tls_client_ca_file={pki / 'fleet-ca.pem'}",
                   f"--auth_tokens_file={pki / 'tokens'}"]
    with fleet_util.start_fleet(2, server_args=server_args, envoy_config=TLS_CONFIG,
                                envoy_patch=_certificates_from(pki)) as fleet:
        print(f"fleet: {fleet.mode} ({fleet.mode_note})")
        yield fleet


def _channel(address, pki):
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(pki / "front-ca.pem").read_bytes())
    return grpc.secure_channel(address, credentials, options=e2e_util.CHANNEL_OPTIONS)


def _softmax(channel, values, token=GOOD_TOKEN):
    from softmax.v1 import softmax_pb2_grpc
    metadata = [("authorization", f"Bearer {token}")] if token is not None else None
    answer = softmax_pb2_grpc.SoftmaxServiceStub(channel).Softmax(
        e2e_util.request(values), timeout=10, metadata=metadata)
    return e2e_util.decode(answer.output)


def _http_infer(address, pki, values, token=GOOD_TOKEN):
    context = ssl.create_default_context(cafile=str(pki / "front-ca.pem"))
    body = json.dumps({"inputs": [{"name": "INPUT", "datatype": "FP32",
                                   "shape": list(values.shape),
                                   "data": values.ravel().tolist()}]}).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"https://{address}/v2/models/softmax/infer", data=body,
                                     method="POST", headers=headers)
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        output = json.loads(response.read())["outputs"][0]
    return np.asarray(output["data"], dtype=np.float64).reshape(output["shape"])


def _retries(fleet):
    return sum(fleet.envoy.stats(f"cluster.{cluster}.upstream_rq_retry").get(
        f"cluster.{cluster}.upstream_rq_retry", 0) for cluster in fleet.envoy.clusters)


def test_callers_over_tls_get_right_answers_on_every_listener(fleet, pki):
    import tritonclient.grpc as triton_grpc

    rng = np.random.default_rng(7)
    before = [r.requests_total() for r in fleet.replicas]
    channel = _channel(fleet.envoy.softmax_address, pki)
    for _ in range(20):
        values = rng.normal(size=SHAPE).astype(np.float32)
        assert_close(_softmax(channel, values), reference_softmax(values), "float32",
                     "softmax.v1 over TLS through Envoy")
    # A stream, on the stream cluster's own mutual-TLS connections.
    from softmax.v1 import softmax_pb2_grpc
    values = rng.normal(size=SHAPE).astype(np.float32)
    answers = list(softmax_pb2_grpc.SoftmaxServiceStub(channel).SoftmaxStream(
        iter([e2e_util.request(values)] * 3), timeout=10,
        metadata=[("authorization", f"Bearer {GOOD_TOKEN}")]))
    assert len(answers) == 3 and not any(a.error.code for a in answers), answers
    for answer in answers:
        assert_close(e2e_util.decode(answer.output), reference_softmax(values), "float32",
                     "SoftmaxStream over TLS through Envoy")
    channel.close()

    client = triton_grpc.InferenceServerClient(
        fleet.envoy.kserve_grpc_address, ssl=True,
        root_certificates=str(pki / "front-ca.pem"))
    try:
        for _ in range(10):
            values = rng.normal(size=SHAPE).astype(np.float32)
            tensor = triton_grpc.InferInput("INPUT", list(SHAPE), "FP32")
            tensor.set_data_from_numpy(values)
            result = client.infer("softmax", [tensor], client_timeout=10,
                                  headers={"authorization": f"Bearer {GOOD_TOKEN}"})
            assert_close(result.as_numpy("OUTPUT"), reference_softmax(values), "float32",
                         "KServe gRPC over TLS through Envoy")
    finally:
        client.close()

    for _ in range(10):
        values = rng.normal(size=SHAPE).astype(np.float32)
        assert_close(_http_infer(fleet.envoy.http_address, pki, values),
                     reference_softmax(values), "float32", "KServe HTTPS through Envoy")

    answered = [r.requests_total() - b for r, b in zip(fleet.replicas, before)]
    print(f"calls answered per replica: {answered}")
    assert all(count >= 10 for count in answered), answered


def test_wrong_or_missing_token_is_refused_unauthenticated_and_not_retried(fleet, pki):
    values = np.ones(SHAPE, dtype=np.float32)
    retries = _retries(fleet)
    channel = _channel(fleet.envoy.softmax_address, pki)
    for token in ("wrong-token", None, GOOD_TOKEN + "X"):
        with pytest.raises(grpc.RpcError) as caught:
            _softmax(channel, values, token=token)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, token
    # The good token, on the same connection, still answered.
    assert_close(_softmax(channel, values), reference_softmax(values), "float32")
    channel.close()
    for token in ("wrong-token", None):
        with pytest.raises(urllib.error.HTTPError) as caught:
            _http_infer(fleet.envoy.http_address, pki, values, token=token)
        assert caught.value.code == 401, token
        assert caught.value.headers.get("WWW-Authenticate", "").startswith("Bearer"), token
    # UNAUTHENTICATED is the replica's answer to pass on, not a retry.
    assert _retries(fleet) == retries


def test_caller_without_tls_is_refused(fleet):
    values = np.ones(SHAPE, dtype=np.float32)
    for address in (fleet.envoy.softmax_address, fleet.envoy.kserve_grpc_address):
        channel = grpc.insecure_channel(address, options=e2e_util.CHANNEL_OPTIONS)
        with pytest.raises(grpc.RpcError) as caught:
            _softmax(channel, values)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, address
        channel.close()
    host, port = fleet.envoy.http_address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        connection.request("GET", "/v2/health/ready")
        connection.getresponse()
    connection.close()


def test_envoy_reaches_the_replicas_over_mutual_tls_only(fleet, pki):
    """The replicas accept only a client certificate of fleet-ca, which only
    Envoy holds; Envoy's health checks hold them healthy in every cluster,
    and its connections to them are TLS handshakes."""
    replica = fleet.replicas[0]
    values = np.ones(SHAPE, dtype=np.float32)
    attempts = {"plaintext": grpc.insecure_channel(replica.grpc_address),
                "TLS without a client certificate": grpc.ssl_channel_credentials(
                    root_certificates=(pki / "fleet-ca.pem").read_bytes()),
                "a client certificate of another CA": grpc.ssl_channel_credentials(
                    root_certificates=(pki / "fleet-ca.pem").read_bytes(),
                    private_key=(pki / "intruder.key").read_bytes(),
                    certificate_chain=(pki / "intruder.pem").read_bytes())}
    override = [("grpc.ssl_target_name_override", make_tls_config.REPLICA_NAME)]
    for what, attempt in attempts.items():
        channel = (attempt if isinstance(attempt, grpc.Channel) else
                   grpc.secure_channel(replica.grpc_address, attempt, options=override))
        with pytest.raises(grpc.RpcError) as caught:
            _softmax(channel, values)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, what
        channel.close()
    for r in fleet.replicas:
        assert fleet.in_rotation(r), (r.index, {c: fleet.envoy.hosts(c)
                                                for c in fleet.envoy.clusters})
    for cluster in fleet.envoy.clusters:
        handshakes = fleet.envoy.stats(f"cluster.{cluster}.ssl.handshake").get(
            f"cluster.{cluster}.ssl.handshake", 0)
        assert handshakes >= len(fleet.replicas), (cluster, handshakes)
        failed = {name: value for name, value in fleet.envoy.stats(
            f"cluster.{cluster}.ssl.fail_verify").items() if value}
        assert not failed, failed
