"""SIGTERM with requests in flight: every request already on the server is
answered OK, the server exits 0; health goes NOT_SERVING while it drains."""

import datetime
import re
import signal
import threading
import time

import grpc
import numpy as np
import pytest

from e2e_util import (HOLD_IN_QUEUE, LAME_DUCK_S, assert_close, chunks_of, decode, health_check,
                      metric_value, reference_softmax, request, scrape_metrics)


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigterm_answers_every_queued_request(start_server):
    # A long batching delay keeps requests queued on the server, so they are
    # certainly in flight when the signal arrives; the drain computes them at
    # once instead of waiting the delay out.
    server = start_server("--max_queue_delay_us=60000000", "--max_batch_rows=1000000",
                          env=HOLD_IN_QUEUE)
    channel = server.channel()
    stub = server.stub()
    count = 120
    rng = np.random.default_rng(0)
    inputs = [rng.normal(size=(4, 64)) for _ in range(count)]
    futures = [stub.Softmax.future(request(x, request_id=f"q{i}"), timeout=60)
               for i, x in enumerate(inputs)]
    # Two streams also hold requests in flight.
    stream_inputs = [rng.normal(size=(2, 33)) for _ in range(20)]
    stream_results = []

    def run_stream(offset):
        reqs = [request(x, request_id=f"s{offset + i}")
                for i, x in enumerate(stream_inputs[offset:offset + 10])]
        stream_results.extend(stub.SoftmaxStream(iter(reqs), timeout=60))

    threads = [threading.Thread(target=run_stream, args=(o,)) for o in (0, 10)]
    for thread in threads:
        thread.start()
    wait_for(lambda: (metric_value(scrape_metrics(server.metrics_address),
                                   "softmax_queued_requests") or 0) >= count + 20,
             20, "every request to be queued")

    health_seen = []
    server.process.send_signal(signal.SIGTERM)
    # Watch health while the server drains (it must never flip back to SERVING).
    deadline = time.monotonic() + 30
    while server.process.poll() is None and time.monotonic() < deadline:
        try:
            health_seen.append(health_check(channel, timeout=0.5))
        except grpc.RpcError as error:
            health_seen.append(error.code().name)
        time.sleep(0.005)

    assert server.process.wait(timeout=30) == 0, server.output()
    for thread in threads:
        thread.join(timeout=30)
    for i, future in enumerate(futures):
        response = future.result()  # raises if the RPC failed
        assert response.request_id == f"q{i}"
        assert_close(decode(response.output), reference_softmax(inputs[i]), "float32", f"q{i}")
    assert sorted(r.request_id for r in stream_results) == sorted(f"s{i}" for i in range(20))
    for response in stream_results:
        assert response.error.code == 0, response.error
        x = stream_inputs[int(response.request_id[1:])]
        assert_close(decode(response.output), reference_softmax(x), "float32",
                     response.request_id)
    # Health said NOT_SERVING while draining (the lame duck lasts 500 ms, so
    # the 5 ms polls see it), and once it stopped answering SERVING it never
    # said SERVING again.
    assert "NOT_SERVING" in health_seen, health_seen
    first_not_serving = next((i for i, s in enumerate(health_seen) if s != "SERVING"),
                             len(health_seen))
    assert "SERVING" not in health_seen[first_not_serving:], health_seen


def run_callers_through_sigterm(server, callers=8):
    """Callers send unary requests back to back until the server refuses
    them; SIGTERM arrives once 50 were answered. Returns the exit code, the
    outcomes by status code name, and any wrong result or hang."""
    stub = server.stub()
    x = np.random.default_rng(1).normal(size=(16, 512))
    expected = reference_softmax(x)
    outcomes = {}
    problems = []
    lock = threading.Lock()

    def caller():
        while True:
            try:
                response = stub.Softmax(request(x), timeout=30)
                code = "OK"
                try:
                    assert_close(decode(response.output), expected, "float32", "under load")
                except AssertionError as error:
                    problems.append(error)
            except grpc.RpcError as error:
                code = error.code().name
            with lock:
                outcomes[code] = outcomes.get(code, 0) + 1
            if code != "OK":
                return

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for thread in threads:
        thread.start()
    wait_for(lambda: outcomes.get("OK", 0) >= 50, 30, "50 answered requests")
    exit_code = server.stop(signal.SIGTERM, timeout=30)
    for thread in threads:
        thread.join(timeout=30)
        if thread.is_alive():
            problems.append(AssertionError("a caller hung"))
    return exit_code, outcomes, problems


def test_sigterm_under_load_loses_nothing(start_server):
    """Every call ends (no hang), every OK carries the right result, refusals
    are UNAVAILABLE (or CANCELLED, see the next test), the server exits 0."""
    server = start_server()
    exit_code, outcomes, problems = run_callers_through_sigterm(server)
    assert exit_code == 0, server.output()
    assert not problems, problems[0]
    assert outcomes.get("OK", 0) >= 50
    assert set(outcomes) <= {"OK", "UNAVAILABLE", "CANCELLED"}, outcomes


def test_refused_while_draining_is_unavailable_not_cancelled(start_server):
    """A call that reaches the server after SIGTERM must be refused with
    UNAVAILABLE (retryable), per the status contract. gRPC 1.51's core
    answers CANCELLED to calls it accepted but never handed to a handler when
    Server::Shutdown() starts (grpc/grpc#41785); a server that refuses new
    calls itself for a moment (lame duck) before Shutdown() avoids that."""
    server = start_server()
    exit_code, outcomes, problems = run_callers_through_sigterm(server)
    assert exit_code == 0, server.output()
    assert not problems, problems[0]
    assert "CANCELLED" not in outcomes, (
        f"callers saw {outcomes}: CANCELLED is not retryable; draining must refuse "
        f"with UNAVAILABLE")


def test_sigint_also_exits_0(start_server):
    server = start_server()
    assert health_check(server.channel()) == "SERVING"
    assert server.stop(signal.SIGINT, timeout=30) == 0, server.output()


def test_draining_says_not_serving_and_refuses_with_unavailable(start_server):
    """From SIGTERM until the listener closes (the lame duck, 500 ms): health
    and softmax_serving say not serving, new calls get UNAVAILABLE, and the
    exit waits the lame duck out but not much longer (idle: lame duck + 1 s)."""
    server = start_server()
    channel = server.channel()
    stub = server.stub()
    assert health_check(channel) == "SERVING"
    assert metric_value(scrape_metrics(server.metrics_address), "softmax_serving") == 1
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    wait_for(lambda: health_check(channel) == "NOT_SERVING", LAME_DUCK_S, "health NOT_SERVING")
    assert metric_value(scrape_metrics(server.metrics_address), "softmax_serving") == 0
    with pytest.raises(grpc.RpcError) as caught:
        stub.Softmax(request(np.zeros((1, 4))), timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    # Refused by the server itself, not by a closed listener.
    assert "shutting down" in caught.value.details(), caught.value
    assert time.monotonic() - started < LAME_DUCK_S, "the checks above must fall in the lame duck"
    assert server.process.wait(timeout=10) == 0, server.output()
    elapsed = time.monotonic() - started
    assert LAME_DUCK_S <= elapsed <= LAME_DUCK_S + 1.0, (
        f"exit {elapsed:.2f} s after SIGTERM; lame duck {LAME_DUCK_S} s")


def _logged_at(output, message):
    """The time of the server's first log line whose message starts with
    `message` (text format: "2026-12-01T00:06:15.123456Z I softmax-server: ...")."""
    match = re.search(rf"^(\S+)Z I softmax-server: {re.escape(message)}", output, re.MULTILINE)
    assert match, f"no '{message}' line in:\n{output}"
    return datetime.datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S.%f")


def test_lame_duck_lasts_500_ms_by_the_servers_own_clock(start_server):
    """From "SIGTERM received" to "lame duck over" the server's own log shows
    at least the lame duck. A caller's clock only sees the exit, which the
    HTTP and metrics servers' stop and the close linger also delay, so on a
    slow machine it cannot tell a missing pause from a slow drain; the two
    log lines are a few microseconds apart without the pause."""
    server = start_server()
    assert health_check(server.channel()) == "SERVING"
    assert server.stop(signal.SIGTERM, timeout=30) == 0, server.output()
    output = server.output()
    lame_duck = (_logged_at(output, "lame duck over") -
                 _logged_at(output, "SIGTERM received")).total_seconds()
    assert lame_duck >= LAME_DUCK_S, f"lame duck {lame_duck:.6f} s by the server's log"
    assert output.index("lame duck over") < output.index("softmax-server: stopped")


def test_idle_open_stream_does_not_hold_the_exit(start_server):
    """An open stream with nothing in flight is ended with UNAVAILABLE at
    once, so the server exits within the lame duck + 1 s (not the grace)."""
    server = start_server("--shutdown_grace_s=30")
    stub = server.stub()
    release = threading.Event()

    def requests():
        yield request(np.zeros((1, 8)), request_id="only")
        release.wait(30)

    responses = stub.SoftmaxStream(requests(), timeout=60)
    try:
        assert next(responses).request_id == "only"
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        with pytest.raises(grpc.RpcError) as caught:
            next(responses)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
        assert server.process.wait(timeout=10) == 0, server.output()
        assert time.monotonic() - started <= LAME_DUCK_S + 1.0
    finally:
        release.set()


def test_idle_http_keep_alive_connection_holds_the_exit_at_most_2_s(start_server):
    """An HTTP connection kept alive after its answer (5 s) is closed by the
    stop within civetweb's 2-s wait: the server exits 0 within the lame duck
    + 1 s + 2 s, not the keep-alive or the grace."""
    import json
    import socket
    server = start_server("--shutdown_grace_s=30")
    body = json.dumps({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 2],
                                   "data": [0, 0]}]}).encode()
    host, port = server.http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/softmax/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % len(body) + body)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=10) == 0, server.output()
        assert time.monotonic() - started <= LAME_DUCK_S + 1.0 + 2.0


def test_busy_stream_is_answered_then_ended_with_unavailable(start_server):
    """A stream with requests queued at SIGTERM gets every answer, then
    UNAVAILABLE (retry elsewhere) although its client never half-closed."""
    server = start_server("--max_queue_delay_us=60000000", "--max_batch_rows=1000000",
                          env=HOLD_IN_QUEUE)
    stub = server.stub()
    release = threading.Event()
    inputs = [np.random.default_rng(i).normal(size=(2, 16)) for i in range(5)]

    def requests():
        for i, x in enumerate(inputs):
            yield request(x, request_id=f"s{i}")
        release.wait(30)

    responses = stub.SoftmaxStream(requests(), timeout=60)
    received = []
    try:
        wait_for(lambda: (metric_value(scrape_metrics(server.metrics_address),
                                       "softmax_queued_requests") or 0) >= 5,
                 10, "the stream's requests to be queued")
        server.process.send_signal(signal.SIGTERM)
        with pytest.raises(grpc.RpcError) as caught:
            for response in responses:
                received.append(response)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
    finally:
        release.set()
    assert sorted(r.request_id for r in received) == [f"s{i}" for i in range(5)]
    for response in received:
        assert_close(decode(response.output),
                     reference_softmax(inputs[int(response.request_id[1:])]), "float32")
    assert server.process.wait(timeout=10) == 0, server.output()


def test_closed_loop_callers_never_see_cancelled(start_server):
    """Callers that keep calling through SIGTERM (each waits for its answer)
    see OK, then UNAVAILABLE, never CANCELLED, up to the exit and after."""
    server = start_server()
    stub = server.stub()
    x = np.zeros((4, 64))
    outcomes = {}
    lock = threading.Lock()
    stop = threading.Event()

    def caller():
        while not stop.is_set():
            try:
                stub.Softmax(request(x), timeout=10)
                code = "OK"
            except grpc.RpcError as error:
                code = error.code().name
            with lock:
                outcomes[code] = outcomes.get(code, 0) + 1

    threads = [threading.Thread(target=caller) for _ in range(32)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: outcomes.get("OK", 0) >= 200, 30, "200 answered requests")
        assert server.stop(signal.SIGTERM, timeout=30) == 0, server.output()
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert "CANCELLED" not in outcomes, outcomes
    assert outcomes.get("UNAVAILABLE", 0) > 0, outcomes


def test_restart_on_the_same_addresses_listens_at_once(start_server):
    """A rolling update restarts a replica on its own address: with
    connections that the server closed itself (its sockets then wait in
    TIME_WAIT on those ports), the new process binds gRPC, HTTP and metrics
    again at once instead of failing on a lingering bind."""
    import socket
    import urllib.request
    first = start_server()
    addresses = (first.grpc_address, first.http_address, first.metrics_address)
    stub = first.stub()
    stub.Softmax(request(np.zeros((1, 4))), timeout=10)
    for path in (f"http://{first.http_address}/v2/health/ready",
                 f"http://{first.metrics_address}/metrics"):
        urllib.request.urlopen(path, timeout=10).read()
    host, port = first.http_address.rsplit(":", 1)
    kept = socket.create_connection((host, int(port)), timeout=10)
    kept.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    kept.recv(65536)
    assert first.stop() == 0, first.output()
    kept.close()
    started = time.monotonic()
    second = start_server(f"--grpc_address={addresses[0]}", f"--http_address={addresses[1]}",
                          f"--metrics_address={addresses[2]}")
    assert (second.grpc_address, second.http_address, second.metrics_address) == addresses
    assert time.monotonic() - started < 5.0
    second.stub().Softmax(request(np.zeros((1, 4))), timeout=10)


# Bound on an idle server's exit after SIGTERM in the tests below: an idle
# exit takes about 1 s; a request still counted in flight holds it for the
# 30-s grace they set. The margin keeps a loaded CI host from failing them.
PROMPT_EXIT_S = LAME_DUCK_S + 5.0


def _assert_prompt_exit(server, started, what):
    """`server` exits 0 within PROMPT_EXIT_S of `started` (SIGTERM): nothing
    of its earlier calls is still counted in flight, which would hold the
    exit for the whole grace period."""
    assert server.process.wait(timeout=40) == 0, server.output()
    elapsed = time.monotonic() - started
    assert elapsed <= PROMPT_EXIT_S, (
        f"exit {elapsed:.2f} s after SIGTERM following {what}: a request still counted "
        f"in flight held the drain toward its 30-s grace\n{server.output()}")


def test_sigterm_after_a_chunked_stream_exits_at_once(start_server):
    """The messages of a chunked request that get no answer of their own (the
    chunks taken into the first one, the dropped later chunks of a failed
    request) and those a stream's end fails (a tensor half assembled) leave
    nothing in flight: SIGTERM after such a stream exits promptly, not after
    the grace."""
    server = start_server("--shutdown_grace_s=30")
    stub = server.stub()
    x = np.random.default_rng(5).normal(size=(4, 3000))
    whole = request(x, request_id="chunked")
    messages = chunks_of(whole, 4096)
    assert len(messages) >= 10
    # A failed chunked request ("gap" skips bytes) whose later chunk is dropped.
    gap = chunks_of(request(x, request_id="gap"), 4096)
    messages += [gap[0], gap[2], gap[3]]
    # A tensor still being assembled when the caller half-closes.
    messages += chunks_of(request(x, request_id="unfinished"), 4096)[:3]
    answers = {}
    for response in stub.SoftmaxStream(iter(messages), timeout=30):
        answers.setdefault(response.request_id, []).append(response)
    assert set(answers) == {"chunked", "gap", "unfinished"}, answers.keys()
    assert answers["chunked"][0].error.code == 0, answers["chunked"][0].error
    assert all(len(answers[i]) == 1 and answers[i][0].error.code != 0
               for i in ("gap", "unfinished")), answers
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    _assert_prompt_exit(server, started, "a chunked stream")


def test_sigterm_after_a_stream_whose_writes_failed_exits_at_once(start_server):
    """A caller that cancels its stream while answers wait to be written (it
    reads none): the failed write and the answers dropped behind it leave
    nothing in flight, so SIGTERM exits promptly."""
    server = start_server("--shutdown_grace_s=30")
    stub = server.stub()
    # Answers of 1 MiB each, far more than the connection's window holds.
    x = np.zeros((4, 65536))
    sent = threading.Event()

    def requests():
        for i in range(32):
            yield request(x, request_id=f"w{i}")
        sent.set()
        time.sleep(30)

    call = stub.SoftmaxStream(requests(), timeout=60)
    assert sent.wait(20), "the requests were never all sent"
    wait_for(lambda: (metric_value(scrape_metrics(server.metrics_address),
                                   "softmax_requests_total") or 0) >= 1,
             20, "an answered request")
    call.cancel()
    time.sleep(0.5)  # the server sees the reset and its pending write fail
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    _assert_prompt_exit(server, started, "a stream whose writes failed")


def test_sigterm_after_every_unary_exit_path_exits_at_once(start_server, tmp_path):
    """Each way a softmax.v1, KServe gRPC or KServe HTTP call ends (answered,
    refused unauthenticated, invalid, for an unknown model, and a KServe
    stream's in-band error) gives its ticket back: SIGTERM after all of them
    exits 0 promptly, not after the grace."""
    import json
    import urllib.error
    import urllib.request
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    tokens = tmp_path / "tokens"
    tokens.write_text("door-token\n")
    server = start_server("--shutdown_grace_s=30", f"--auth_tokens_file={tokens}")
    auth = [("authorization", "Bearer door-token")]
    stub = server.stub()
    kserve = service_pb2_grpc.GRPCInferenceServiceStub(server.channel())
    x = np.zeros((2, 8))

    def code_of(call, *args, **kwargs):
        try:
            call(*args, timeout=10, **kwargs)
            return grpc.StatusCode.OK
        except grpc.RpcError as error:
            return error.code()

    def infer(model="softmax", datatype="FP32"):
        message = service_pb2.ModelInferRequest(model_name=model)
        message.inputs.add(name="INPUT", datatype=datatype, shape=[2, 8])
        message.raw_input_contents.append(np.zeros((2, 8), np.float32).tobytes())
        return message

    codes = {
        "v1 ok": code_of(stub.Softmax, request(x), metadata=auth),
        "v1 no token": code_of(stub.Softmax, request(x)),
        "v1 invalid": code_of(stub.Softmax, request(x, axis=5), metadata=auth),
        "v1 chunk": code_of(stub.Softmax, request(x, request_id="c", more_chunks=True),
                            metadata=auth),
        "kserve ok": code_of(kserve.ModelInfer, infer(), metadata=auth),
        "kserve no token": code_of(kserve.ModelInfer, infer()),
        "kserve unknown model": code_of(kserve.ModelInfer, infer("nope"), metadata=auth),
        "kserve invalid": code_of(kserve.ModelInfer, infer(datatype="FP99"), metadata=auth),
    }
    assert codes == {
        "v1 ok": grpc.StatusCode.OK, "v1 no token": grpc.StatusCode.UNAUTHENTICATED,
        "v1 invalid": grpc.StatusCode.INVALID_ARGUMENT,
        "v1 chunk": grpc.StatusCode.INVALID_ARGUMENT, "kserve ok": grpc.StatusCode.OK,
        "kserve no token": grpc.StatusCode.UNAUTHENTICATED,
        "kserve unknown model": grpc.StatusCode.NOT_FOUND,
        "kserve invalid": grpc.StatusCode.INVALID_ARGUMENT}, codes
    stream = list(kserve.ModelStreamInfer(iter([infer(), infer(datatype="FP99")]),
                                          metadata=auth, timeout=10))
    # (Answered in the order they finish.)
    assert sorted(bool(r.error_message) for r in stream) == [False, True], stream

    def http(model, body, token="door-token"):
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = f"http://{server.http_address}/v2/models/{model}/infer"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers),
                                        timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code

    good = json.dumps({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 2],
                                   "data": [0, 1]}]}).encode()
    statuses = [http("softmax", good), http("softmax", good, token=None),
                http("nope", good), http("softmax", b"{not json")]
    assert statuses == [200, 401, 404, 400], statuses
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    _assert_prompt_exit(server, started, "calls on every unary exit path")
