"""Python client for softmax-serve.

    import numpy as np
    from softmax_client import Client

    with Client("localhost:50051") as client:
        y = client.softmax(np.random.rand(4, 1000).astype(np.float32))

See Client for TLS, tokens, deadlines, retries and streaming.
"""
from softmax_client.client import (DEFAULT_CHUNK_BYTES, DEFAULT_RETRY_POLICY, Client,
                                   RetryPolicy, SoftmaxError, StreamResult, StreamResults,
                                   bfloat16_dtype)

__all__ = ["Client", "RetryPolicy", "DEFAULT_RETRY_POLICY", "DEFAULT_CHUNK_BYTES",
           "SoftmaxError", "StreamResult", "StreamResults", "bfloat16_dtype"]
__version__ = "0.1.0"
