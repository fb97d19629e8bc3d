"""Chunked tensors on SoftmaxStream (softmax.proto's chunk_offset and
more_chunks): round trips for every dtype, chunked requests interleaved with
each other and with whole ones, the echo, and exactly one error for every
malformed sequence while the stream goes on."""

import grpc
import numpy as np
import pytest

from e2e_util import (assert_close, chunks_of, decode, encode, reference_softmax, request,
                      softmax_pb2, softmax_pb2_grpc)

INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]
# The server's floor on a response chunk (kMinResponseChunkBytes).
MIN_RESPONSE_CHUNK = 64 << 10


@pytest.fixture(scope="module")
def server(device_server):
    return device_server


def chunk(request_id, offset, data, more):
    return softmax_pb2.SoftmaxRequest(request_id=request_id, chunk_offset=offset, more_chunks=more,
                                      input=softmax_pb2.Tensor(data=data))


def reassemble(responses):
    """{request_id: (first message, whole output data, chunk count)}; checks
    that each answer's chunks come in order, without gaps, the last one
    alone without more_chunks."""
    answers = {}
    open_ids = set()
    for response in responses:
        rid = response.request_id
        if rid not in answers:
            assert response.chunk_offset == 0, response
            answers[rid] = [response, bytearray(response.output.data), 1]
        else:
            assert rid in open_ids, f"{rid}: a message after its last chunk"
            entry = answers[rid]
            assert response.chunk_offset == len(entry[1]), (rid, response.chunk_offset)
            assert not response.output.shape and not response.HasField("timing")
            entry[1] += response.output.data
            entry[2] += 1
        if response.more_chunks:
            open_ids.add(rid)
        else:
            open_ids.discard(rid)
    assert not open_ids, f"answers never finished: {open_ids}"
    return {rid: (first, bytes(data), count) for rid, (first, data, count) in answers.items()}


def output_of(first, data):
    return decode(softmax_pb2.Tensor(dtype=first.output.dtype, shape=first.output.shape, data=data))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_chunked_round_trip(stub, dtype):
    rng = np.random.default_rng(7)
    values = rng.normal(0, 3, size=(4, 50000))
    req = request(values, dtype, request_id=f"big-{dtype}", axis=1, temperature=1.5)
    chunk_bytes = 70001  # not a multiple of the item size: chunks split elements
    answers = reassemble(stub.SoftmaxStream(iter(chunks_of(req, chunk_bytes)), timeout=60))
    first, data, count = answers[req.request_id]
    assert first.error.code == 0, first.error
    assert list(first.output.shape) == [4, 50000]
    assert count == -(-len(req.input.data) // chunk_bytes), "chunks as large as the request's"
    sent = decode(encode(values, dtype))
    assert_close(output_of(first, data), reference_softmax(sent, 1, 1.5), dtype)


def test_interleaved_chunked_and_whole_requests(stub):
    rng = np.random.default_rng(3)
    a_values, b_values = rng.normal(size=(2, 40000)), rng.normal(size=(3, 30000))
    a = chunks_of(request(a_values, "float32", request_id="a", log=True), 30000)
    b = chunks_of(request(b_values, "float16", request_id="b", axis=0), 20000)
    whole = [request(rng.normal(size=(2, 8)), request_id=f"whole-{i}") for i in range(4)]
    messages = []
    for i in range(max(len(a), len(b))):
        messages += a[i:i + 1] + b[i:i + 1]
        if i < len(whole):
            messages.append(whole[i])
    answers = reassemble(stub.SoftmaxStream(iter(messages), timeout=60))
    assert sorted(answers) == sorted(["a", "b"] + [w.request_id for w in whole])
    first, data, count = answers["a"]
    assert count > 1
    assert_close(output_of(first, data), reference_softmax(decode(encode(a_values, "float32")),
                                                           -1, 1.0, True), "float32")
    first, data, _ = answers["b"]
    assert_close(output_of(first, data), reference_softmax(decode(encode(b_values, "float16")),
                                                           0), "float16")
    for w in whole:
        first, data, count = answers[w.request_id]
        assert count == 1 and not first.more_chunks
        assert_close(output_of(first, data), reference_softmax(decode(w.input)), "float32")


def test_echo_answers_in_chunks(start_server):
    echo = start_server(device="none")
    rng = np.random.default_rng(5)
    req = request(rng.normal(size=(1, 100000)), "float32", request_id="echoed")
    with echo.channel() as channel:
        stub = softmax_pb2_grpc.SoftmaxServiceStub(channel)
        answers = reassemble(stub.SoftmaxStream(iter(chunks_of(req, 50000)), timeout=30))
    first, data, count = answers["echoed"]
    assert data == req.input.data
    assert count == -(-len(data) // MIN_RESPONSE_CHUNK), "response chunks raised to 64 KiB"
    assert list(first.output.shape) == [1, 100000]


def test_every_malformed_sequence_gets_one_error(stub):
    tensor = dict(dtype=softmax_pb2.DTYPE_FLOAT32, shape=[1000])  # 4000 bytes
    data = bytes(range(256)) * 16

    def first(rid, n):
        return softmax_pb2.SoftmaxRequest(request_id=rid, more_chunks=True,
                                          input=softmax_pb2.Tensor(data=data[:n], **tensor))

    messages = [
        first("gap", 1000), chunk("gap", 2000, data[2000:3000], True),
        chunk("gap", 3000, data[3000:4000], False),  # dropped: "gap" already failed
        first("overlap", 1000), chunk("overlap", 500, data[500:4000], False),
        first("beyond", 1000), chunk("beyond", 1000, data[1000:4096], False),
        first("short", 1000), chunk("short", 1000, data[1000:3000], False),
        chunk("unknown", 100, data[:10], False),
        first("done", 1000), chunk("done", 1000, data[1000:4000], False),
        chunk("done", 4000, data[:4], False),  # after its last chunk
        softmax_pb2.SoftmaxRequest(request_id="huge", more_chunks=True, input=softmax_pb2.Tensor(
            dtype=softmax_pb2.DTYPE_FLOAT32, shape=[1 << 30])),  # past --max_tensor_bytes
        request(np.ones((1, 4)), request_id="good"),
        first("unfinished", 1000),  # the stream ends before its last chunk
    ]
    responses = list(stub.SoftmaxStream(iter(messages), timeout=30))
    by_id = {}
    for response in responses:
        by_id.setdefault(response.request_id, []).append(response)
    expected = {"gap": "without gaps", "overlap": "without gaps", "beyond": "beyond the 4000",
                "short": "false after 3000", "unknown": "no tensor being assembled",
                "huge": "--max_tensor_bytes", "unfinished": "stream ended after 1000"}
    for rid, words in expected.items():
        assert len(by_id.get(rid, [])) == 1, (rid, by_id.get(rid))
        error = by_id[rid][0].error
        assert error.code == INVALID_ARGUMENT and words in error.message, (rid, error)
        assert not by_id[rid][0].more_chunks
    # Its answer and the error for the chunk after its last, in completion order.
    done = sorted(by_id["done"], key=lambda r: r.error.code)
    assert [r.error.code for r in done] == [0, INVALID_ARGUMENT], done
    assert "already complete" in done[1].error.message
    assert len(by_id["good"]) == 1 and by_id["good"][0].error.code == 0
    assert len(responses) == len(expected) + 3


def test_too_many_tensors_being_assembled(stub):
    def first(rid):
        return softmax_pb2.SoftmaxRequest(request_id=rid, more_chunks=True, input=softmax_pb2.Tensor(
            dtype=softmax_pb2.DTYPE_FLOAT32, shape=[2], data=bytes(4)))

    messages = [first(f"t{i}") for i in range(17)]
    messages += [chunk(f"t{i}", 4, np.float32([1.0]).tobytes(), False) for i in range(17)]
    responses = list(stub.SoftmaxStream(iter(messages), timeout=30))
    errors = [r for r in responses if r.error.code]
    assert [r.request_id for r in errors] == ["t16"]
    assert "already has 16" in errors[0].error.message
    assert sorted(r.request_id for r in responses if not r.error.code) == \
        sorted(f"t{i}" for i in range(16))


def test_unary_call_refuses_chunks(stub):
    req = request(np.ones((1, 4)), request_id="x")
    req.more_chunks = True
    with pytest.raises(grpc.RpcError) as raised:
        stub.Softmax(req, timeout=10)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "SoftmaxStream only" in raised.value.details()
