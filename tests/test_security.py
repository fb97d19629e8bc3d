"""TLS, mutual TLS, bearer tokens and the reflection switch, on gRPC
(softmax.v1 and KServe v2) and on the HTTP endpoint. Certificates are made
here with openssl, in a temporary folder."""

import http.client
import json
import re
import signal
import ssl
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

import e2e_util
from e2e_util import health_check, request, wait_for


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA with a server and a client certificate, and another CA with a
    client certificate of its own."""
    folder = tmp_path_factory.mktemp("pki")
    e2e_util.make_ca(folder, "ca")
    e2e_util.make_ca(folder, "other-ca")
    e2e_util.make_certificate(folder, "ca", "server", "subjectAltName=DNS:localhost,IP:127.0.0.1")
    e2e_util.make_certificate(folder, "ca", "client", "extendedKeyUsage=clientAuth")
    e2e_util.make_certificate(folder, "other-ca", "intruder", "extendedKeyUsage=clientAuth")
    return folder


def _read(path):
    return path.read_bytes()


def _tls_channel(server, pki, client=None):
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(pki / "ca.pem"),
        private_key=_read(pki / f"{client}.key") if client else None,
        certificate_chain=_read(pki / f"{client}.pem") if client else None)
    return grpc.secure_channel(server.grpc_address, credentials,
                               options=e2e_util.CHANNEL_OPTIONS)


def _softmax(channel, metadata=None):
    stub = e2e_util.softmax_pb2_grpc.SoftmaxServiceStub(channel)
    x = np.array([[1.0, 2.0, 3.0]])
    response = stub.Softmax(request(x), timeout=10, metadata=metadata)
    e2e_util.assert_close(e2e_util.decode(response.output), e2e_util.reference_softmax(x),
                          "float32")


def test_tls_serves_and_plaintext_is_refused(start_server, pki):
    server = start_server(f"--tls_cert_file={pki / 'server.pem'}",
                          f"--tls_key_file={pki / 'server.key'}")
    _softmax(_tls_channel(server, pki))
    with pytest.raises(grpc.RpcError) as caught:
        _softmax(server.channel())  # plaintext
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_needs_a_client_certificate_of_the_ca(start_server, pki):
    server = start_server(f"--tls_cert_file={pki / 'server.pem'}",
                          f"--tls_key_file={pki / 'server.key'}",
                          f"--tls_client_ca_file={pki / 'ca.pem'}")
    _softmax(_tls_channel(server, pki, client="client"))
    for client in (None, "intruder"):
        with pytest.raises(grpc.RpcError) as caught:
            _softmax(_tls_channel(server, pki, client=client))
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, client


def test_tls_flags_are_checked_at_start(pki):
    for args in ([f"--tls_cert_file={pki / 'server.pem'}"],
                 [f"--tls_client_ca_file={pki / 'ca.pem'}"],
                 ["--tls_cert_file=/nonexistent", "--tls_key_file=/nonexistent"]):
        result = e2e_util.run_server("--grpc_address=127.0.0.1:0", "--metrics_address=",
                                     "--device=cpu", *args, timeout=30)
        assert result.returncode == 1, (args, result.stderr)
        assert "--tls_" in result.stderr, result.stderr


def test_bearer_tokens_wrong_missing_right_and_reloaded(start_server, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("# the tokens\nfirst-token\n\nsecond-token\n")
    server = start_server(f"--auth_tokens_file={tokens}")
    channel = server.channel()
    _softmax(channel, metadata=[("authorization", "Bearer first-token")])
    _softmax(channel, metadata=[("authorization", "Bearer second-token")])
    for metadata in (None, [("authorization", "Bearer wrong")],
                     [("authorization", "first-token")],
                     [("authorization", "Bearer first-toke")],
                     # A known token with more after it is not that token.
                     [("authorization", "Bearer first-tokenX")],
                     [("authorization", "Bearer second-token-and-more")],
                     [("authorization", "Bearer FIRST-TOKEN")]):
        with pytest.raises(grpc.RpcError) as caught:
            _softmax(channel, metadata=metadata)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
    # Streams too.
    stub = e2e_util.softmax_pb2_grpc.SoftmaxServiceStub(channel)
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.SoftmaxStream(iter([request(np.zeros((1, 3)))]), timeout=10))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    ok = list(stub.SoftmaxStream(iter([request(np.zeros((1, 3)))]), timeout=10,
                                 metadata=[("authorization", "Bearer first-token")]))
    assert len(ok) == 1 and not ok[0].error.code
    # Health is exempt.
    assert health_check(channel) == "SERVING"
    # SIGHUP reloads: the old token goes, the new one works.
    tokens.write_text("third-token\n")
    server.process.send_signal(signal.SIGHUP)
    wait_for(lambda: "tokens reloaded" in server.output(), 10, "the reload")
    _softmax(channel, metadata=[("authorization", "Bearer third-token")])
    with pytest.raises(grpc.RpcError) as caught:
        _softmax(channel, metadata=[("authorization", "Bearer first-token")])
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_tls_with_tokens(start_server, pki, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("tls-token\n")
    server = start_server(f"--tls_cert_file={pki / 'server.pem'}",
                          f"--tls_key_file={pki / 'server.key'}", f"--auth_tokens_file={tokens}")
    channel = _tls_channel(server, pki)
    _softmax(channel, metadata=[("authorization", "Bearer tls-token")])
    with pytest.raises(grpc.RpcError) as caught:
        _softmax(channel)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_reflection_can_be_turned_off(start_server):
    server = start_server("--reflection=false")
    with pytest.raises(grpc.RpcError) as caught:
        e2e_util.reflection_services(server.channel())
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


# The HTTP endpoint (KServe v2 over HTTP/REST) takes the same TLS files and
# tokens as gRPC.

_INFER_BODY = json.dumps({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 3],
                                      "data": [1.0, 2.0, 3.0]}]}).encode()


def _https_context(pki, client=None, ca="ca"):
    context = ssl.create_default_context(cafile=str(pki / f"{ca}.pem"))
    if client:
        context.load_cert_chain(str(pki / f"{client}.pem"), str(pki / f"{client}.key"))
    return context


def _http(url, context=None, body=None, token=None):
    """(status, headers, body) of one request; HTTP errors are answers too."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers,
                                     method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def _assert_http_softmax(url, context=None, token=None):
    status, _, body = _http(f"{url}/v2/models/softmax/infer", context, _INFER_BODY, token)
    assert status == 200, body
    output = json.loads(body)["outputs"][0]
    e2e_util.assert_close(np.array(output["data"]).reshape(1, 3),
                          e2e_util.reference_softmax(np.array([[1.0, 2.0, 3.0]])), "float32")


def _tls_server(start_server, pki, *args):
    return start_server(f"--tls_cert_file={pki / 'server.pem'}",
                        f"--tls_key_file={pki / 'server.key'}", *args)


def test_http_tls_serves_https_and_refuses_plain_http(start_server, pki):
    server = _tls_server(start_server, pki)
    url = f"https://{server.http_address}"
    assert _http(f"{url}/v2/health/ready", _https_context(pki))[0] == 200
    _assert_http_softmax(url, _https_context(pki))
    # tritonclient over HTTPS, with the test CA.
    client = triton_http.InferenceServerClient(
        server.http_address, ssl=True, ssl_options={"ca_certs": str(pki / "ca.pem")})
    x = np.array([[0.5, -1.0, 2.0, 4.0]], np.float32)
    tensor = triton_http.InferInput("INPUT", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    e2e_util.assert_close(client.infer("softmax", [tensor]).as_numpy("OUTPUT"),
                          e2e_util.reference_softmax(x), "float32")
    client.close()
    # Plain HTTP on the TLS port: the connection is closed without an
    # answer, promptly (no hang), and the server goes on serving.
    started = time.monotonic()
    with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
        _http(f"http://{server.http_address}/v2/health/ready")
    assert time.monotonic() - started < 5
    # A server certificate the client does not trust is refused by the client.
    with pytest.raises(urllib.error.URLError) as caught:
        _http(f"{url}/v2/health/ready", _https_context(pki, ca="other-ca"))
    assert isinstance(caught.value.reason, ssl.SSLCertVerificationError)
    # TLS older than 1.2 is refused.
    old = _https_context(pki)
    old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        _http(f"{url}/v2/health/ready", old)
    _assert_http_softmax(url, _https_context(pki))


def test_http_mutual_tls_needs_a_client_certificate_of_the_ca(start_server, pki):
    server = _tls_server(start_server, pki, f"--tls_client_ca_file={pki / 'ca.pem'}")
    url = f"https://{server.http_address}"
    _assert_http_softmax(url, _https_context(pki, client="client"))
    for client in (None, "intruder"):
        # The handshake fails (TLS 1.3 reports it at the first read).
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError,
                            http.client.HTTPException)):
            _http(f"{url}/v2/models/softmax/infer", _https_context(pki, client=client),
                  _INFER_BODY)
    _assert_http_softmax(url, _https_context(pki, client="client"))


def test_tls_files_are_checked_at_start_naming_the_flag(pki):
    # Readable PEM files that do not fit: a key that is not the
    # certificate's, a CA file holding no certificate.
    for args, flag in (([f"--tls_key_file={pki / 'client.key'}"], "--tls_key_file"),
                       ([f"--tls_key_file={pki / 'server.key'}",
                         f"--tls_client_ca_file={pki / 'server.key'}"], "--tls_client_ca_file")):
        result = e2e_util.run_server("--grpc_address=127.0.0.1:0", "--http_address=127.0.0.1:0",
                                     "--metrics_address=", "--device=cpu",
                                     f"--tls_cert_file={pki / 'server.pem'}", *args, timeout=30)
        assert result.returncode == 1, result.stderr
        # An error-level line that names the flag.
        assert re.search(rf"\bE softmax-server: {re.escape(flag)}:", result.stderr), result.stderr


def test_http_bearer_tokens_wrong_missing_right(start_server, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("http-token\n")
    server = start_server(f"--auth_tokens_file={tokens}")
    url = f"http://{server.http_address}"
    for token in (None, "wrong", "http-toke", "http-tokenX", "http-token-and-more"):
        for path, body in (("/v2/models/softmax/infer", _INFER_BODY), ("/v2", None),
                           ("/v2/models/softmax", None), ("/v2/models/softmax/config", None),
                           ("/v2/models/stats", None)):
            status, headers, reply = _http(url + path, body=body, token=token)
            assert status == 401, (path, token, reply)
            assert headers["WWW-Authenticate"] == "Bearer"
            assert "error" in json.loads(reply)
    # Health checks are exempt.
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/softmax/ready",
                 "/v2/models/softmax/versions/1/ready"):
        assert _http(url + path)[0] == 200, path
    _assert_http_softmax(url, token="http-token")
    assert _http(url + "/v2", token="http-token")[0] == 200
    # Refused inference is counted with its code.
    text = e2e_util.scrape_metrics(server.metrics_address)
    assert e2e_util.metric_value(text, "softmax_requests_total",
                                 {"method": "http_infer", "code": "UNAUTHENTICATED"}) == 5


def test_kserve_grpc_needs_a_token_but_for_health(start_server, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("kserve-token\n")
    server = start_server(f"--auth_tokens_file={tokens}")
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    right = {"authorization": "Bearer kserve-token"}
    x = np.array([[1.0, 2.0, 3.0]], np.float32)

    def infer(headers):
        tensor = triton_grpc.InferInput("INPUT", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer("softmax", [tensor], headers=headers).as_numpy("OUTPUT")

    for headers in (None, {"authorization": "Bearer wrong"},
                    {"authorization": "Bearer kserve-tokenX"}):
        for call in (lambda h: infer(h), lambda h: client.get_server_metadata(headers=h),
                     lambda h: client.get_model_metadata("softmax", headers=h),
                     lambda h: client.get_model_config("softmax", headers=h),
                     lambda h: client.get_inference_statistics(headers=h),
                     lambda h: client.get_system_shared_memory_status(headers=h)):
            with pytest.raises(InferenceServerException) as caught:
                call(headers)
            assert caught.value.status() == "StatusCode.UNAUTHENTICATED", caught.value
    e2e_util.assert_close(infer(right), e2e_util.reference_softmax(x), "float32")
    assert client.get_server_metadata(headers=right).name == "softmax-serve"
    # Health is exempt.
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("softmax")
    # A stream without a token is refused when it opens.
    stream = server.channel().stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
    with pytest.raises(grpc.RpcError) as caught:
        list(stream(iter([b""]), timeout=10))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    client.close()
