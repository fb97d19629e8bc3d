"""TLS, mutual TLS, bearer tokens and the reflection switch. Certificates
are made here with openssl, in a temporary folder."""

import signal
import subprocess

import grpc
import numpy as np
import pytest

import e2e_util
from e2e_util import health_check, request, wait_for


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_ca(folder, name):
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", "1", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
             "-out", f"{name}.pem", cwd=folder)


def _make_cert(folder, ca, name, extensions):
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=folder)
    (folder / f"{name}.ext").write_text(extensions + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
             cwd=folder)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA with a server and a client certificate, and another CA with a
    client certificate of its own."""
    folder = tmp_path_factory.mktemp("pki")
    _make_ca(folder, "ca")
    _make_ca(folder, "other-ca")
    _make_cert(folder, "ca", "server", "subjectAltName=DNS:localhost,IP:127.0.0.1")
    _make_cert(folder, "ca", "client", "extendedKeyUsage=clientAuth")
    _make_cert(folder, "other-ca", "intruder", "extendedKeyUsage=clientAuth")
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
        result = subprocess.run([e2e_util.SERVER_BIN, "--grpc_address=127.0.0.1:0",
                                 "--metrics_address=", "--device=cpu", *args],
                                capture_output=True, text=True, timeout=30)
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
                     [("authorization", "Bearer first-toke")]):
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
