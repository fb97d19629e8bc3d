"""softmax.v1 tensors and requests from NumPy arrays and back, for the tests
and the benchmarks that speak softmax.v1 from Python.

Needs the generated softmax/v1 stubs importable (PYTHONPATH: build/python,
or a bundle's python/), grpcio's protobuf runtime and NumPy.
"""

import numpy as np
from softmax.v1 import softmax_pb2

from bench.lib.reference import bfloat16_bits_to_float, float_to_bfloat16_bits

DTYPES = {
    "float32": softmax_pb2.DTYPE_FLOAT32,
    "float16": softmax_pb2.DTYPE_FLOAT16,
    "bfloat16": softmax_pb2.DTYPE_BFLOAT16,
}

# Unlimited client message sizes: gRPC's Python default receive limit is 4 MiB.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1),
                   ("grpc.max_send_message_length", -1)]


def encode(values, dtype):
    """A softmax.v1.Tensor of `dtype` from an array (rounded to nearest even)."""
    values = np.asarray(values, dtype=np.float32)
    if dtype == "float32":
        data = values.astype("<f4").tobytes()
    elif dtype == "float16":
        data = values.astype("<f2").tobytes()
    else:
        data = float_to_bfloat16_bits(values).astype("<u2").tobytes()
    return softmax_pb2.Tensor(dtype=DTYPES[dtype], shape=list(values.shape), data=data)


def decode(tensor):
    """float64 array of a softmax.v1.Tensor, whatever its dtype."""
    shape = tuple(tensor.shape)
    if tensor.dtype == softmax_pb2.DTYPE_FLOAT32:
        flat = np.frombuffer(tensor.data, dtype="<f4")
    elif tensor.dtype == softmax_pb2.DTYPE_FLOAT16:
        flat = np.frombuffer(tensor.data, dtype="<f2")
    elif tensor.dtype == softmax_pb2.DTYPE_BFLOAT16:
        flat = bfloat16_bits_to_float(np.frombuffer(tensor.data, dtype="<u2"))
    else:
        raise ValueError(f"tensor with dtype {tensor.dtype}")
    return flat.astype(np.float64).reshape(shape)


def request(values=None, dtype="float32", tensor=None, request_id="", **fields):
    """A SoftmaxRequest from an array (or a ready Tensor) plus optional fields
    axis / temperature / log."""
    if tensor is None:
        tensor = encode(values, dtype)
    return softmax_pb2.SoftmaxRequest(request_id=request_id, input=tensor, **fields)


def chunks_of(req, chunk_bytes):
    """`req` as the messages of a chunked request (softmax.proto's
    chunk_offset and more_chunks), chunk_bytes of its input data each."""
    data = req.input.data
    first = softmax_pb2.SoftmaxRequest()
    first.CopyFrom(req)
    first.input.data = data[:chunk_bytes]
    first.more_chunks = len(data) > chunk_bytes
    messages = [first]
    for offset in range(chunk_bytes, len(data), chunk_bytes):
        messages.append(softmax_pb2.SoftmaxRequest(
            request_id=req.request_id, chunk_offset=offset,
            input=softmax_pb2.Tensor(data=data[offset:offset + chunk_bytes]),
            more_chunks=offset + chunk_bytes < len(data)))
    return messages


def varint(value):
    """`value` as a protobuf base-128 varint, for messages written by hand."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
