"""SoftmaxStream: many requests on one stream, a bad request gets a response
carrying its error and the stream goes on, every request_id is answered
exactly once."""

import threading

import grpc
import numpy as np
import pytest

from e2e_util import assert_close, decode, encode, reference_softmax, request, softmax_pb2

INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]


@pytest.fixture(scope="module")
def server(device_server):
    """Every test here runs on the CPU backend and, where present, the GPU."""
    return device_server


def mixed_requests(count, seed=0):
    """(request, expectation) pairs: expectation is ('ok', reference, dtype)
    or ('error', field named in the message)."""
    rng = np.random.default_rng(seed)
    dtypes = ["float32", "float16", "bfloat16"]
    pairs = []
    for i in range(count):
        request_id = f"req-{seed}-{i}"
        kind = i % 7
        if kind == 3:
            req = request(tensor=softmax_pb2.Tensor(dtype=softmax_pb2.DTYPE_FLOAT32, shape=[2, 3],
                                                    data=bytes(5)), request_id=request_id)
            pairs.append((req, ("error", "input.data")))
        elif kind == 5:
            req = request(np.zeros((2, 3)), request_id=request_id, temperature=0.0)
            pairs.append((req, ("error", "temperature")))
        elif kind == 6 and i % 2 == 0:
            req = request(np.zeros((2, 3)), request_id=request_id, axis=5)
            pairs.append((req, ("error", "axis")))
        else:
            dtype = dtypes[i % 3]
            shape = tuple(int(d) for d in rng.integers(1, 40, size=int(rng.integers(1, 4))))
            axis = int(rng.integers(-len(shape), len(shape)))
            log = bool(i % 2)
            values = rng.normal(0, 2, size=shape)
            req = request(values, dtype, request_id=request_id, axis=axis, log=log)
            sent = decode(encode(values, dtype))
            pairs.append((req, ("ok", reference_softmax(sent, axis, 1.0, log), dtype)))
    return pairs


def check_responses(pairs, responses):
    expected = {req.request_id: expectation for req, expectation in pairs}
    seen = [response.request_id for response in responses]
    assert sorted(seen) == sorted(expected), "every request_id answered exactly once"
    for response in responses:
        expectation = expected[response.request_id]
        if expectation[0] == "error":
            assert response.error.code == INVALID_ARGUMENT, response
            assert expectation[1] in response.error.message, response.error.message
            assert not response.output.data
        else:
            assert response.error.code == 0, response.error
            assert_close(decode(response.output), expectation[1], expectation[2],
                         response.request_id)


def test_stream_mixes_good_and_bad_requests(stub):
    pairs = mixed_requests(150)
    responses = list(stub.SoftmaxStream(iter([req for req, _ in pairs]), timeout=60))
    check_responses(pairs, responses)
    assert sum(1 for r in responses if r.error.code) == sum(1 for _, e in pairs if e[0] == "error")


def test_stream_starting_with_a_bad_request_goes_on(stub):
    bad = request(tensor=softmax_pb2.Tensor(dtype=softmax_pb2.DTYPE_UNSPECIFIED, shape=[1],
                                            data=bytes(4)), request_id="bad")
    good = request(np.array([[1.0, 2.0]]), request_id="good")
    responses = {r.request_id: r for r in stub.SoftmaxStream(iter([bad, bad, good]), timeout=30)}
    # Two requests with the same id get two answers; the dict keeps one of them.
    assert set(responses) == {"bad", "good"}
    assert responses["bad"].error.code == INVALID_ARGUMENT
    assert "input.dtype" in responses["bad"].error.message
    assert_close(decode(responses["good"].output), reference_softmax([[1.0, 2.0]]), "float32")


def test_duplicate_request_ids_are_each_answered(stub):
    reqs = [request(np.array([float(i), 0.0]), request_id="same") for i in range(10)]
    responses = list(stub.SoftmaxStream(iter(reqs), timeout=30))
    assert len(responses) == 10
    assert all(r.request_id == "same" and r.error.code == 0 for r in responses)


def test_empty_stream_closes_cleanly(stub):
    assert list(stub.SoftmaxStream(iter([]), timeout=10)) == []


def test_parallel_streams(stub):
    failures = []

    def run(seed):
        try:
            pairs = mixed_requests(60, seed)
            check_responses(pairs, list(stub.SoftmaxStream(iter([r for r, _ in pairs]),
                                                           timeout=60)))
        except Exception as error:  # collected and re-raised in the main thread
            failures.append(error)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(1, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[0]


def test_interleaved_writes_and_reads(stub):
    """The server answers while the client is still writing (no waiting for
    half-close): send one request, read its answer, then the next."""
    import queue
    outgoing = queue.Queue()

    def requests():
        while True:
            item = outgoing.get()
            if item is None:
                return
            yield item

    responses = stub.SoftmaxStream(requests(), timeout=30)
    for i in range(5):
        outgoing.put(request(np.array([0.0, float(i)]), request_id=f"step-{i}"))
        response = next(responses)
        assert response.request_id == f"step-{i}"
        assert_close(decode(response.output), reference_softmax([0.0, float(i)]), "float32")
    outgoing.put(None)
    assert list(responses) == []
