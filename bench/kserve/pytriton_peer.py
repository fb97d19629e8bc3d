#!/usr/bin/env python3
"""Triton Inference Server as a Python team would deploy a softmax: PyTriton
(nvidia-pytriton, which bundles tritonserver) serving torch.softmax on the GPU
with dynamic batching, under the model names this service uses, so that one
perf_analyzer command drives both:

  softmax        FP32
  softmax_fp16   FP16
  softmax_bf16   BF16 carried as UINT16 (its raw bits): PyTriton describes
                 tensors with NumPy dtypes and NumPy has no bfloat16, so the
                 model reinterprets the 2-byte words as torch.bfloat16. The
                 bytes on the wire are the same as a BF16 tensor's.

Each model has one input INPUT of shape [batch, -1] and one output OUTPUT,
max batch 256 rows, a 100 us queue delay. Ports: HTTP 8000, gRPC 8001,
metrics 8002 (Triton's defaults), or --port-base B for B, B+1, B+2.

--backend=numpy computes with NumPy on the CPU instead (for a dry run on a
machine without a GPU or torch).
"""
import argparse

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

MAX_BATCH_ROWS = 256
QUEUE_DELAY_US = 100


def torch_models():
    import torch

    def run(x):
        return torch.softmax(x, dim=-1)

    @batch
    def fp32(INPUT):
        return {"OUTPUT": run(torch.from_numpy(INPUT).cuda(non_blocking=True)).cpu().numpy()}

    @batch
    def fp16(INPUT):
        return {"OUTPUT": run(torch.from_numpy(INPUT).cuda(non_blocking=True)).cpu().numpy()}

    @batch
    def bf16(INPUT):
        x = torch.from_numpy(INPUT.view(np.int16)).cuda(non_blocking=True).view(torch.bfloat16)
        return {"OUTPUT": run(x).view(torch.int16).cpu().numpy().view(np.uint16)}

    return fp32, fp16, bf16


def numpy_models():
    def run(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    @batch
    def fp32(INPUT):
        return {"OUTPUT": run(INPUT.astype(np.float64)).astype(np.float32)}

    @batch
    def fp16(INPUT):
        return {"OUTPUT": run(INPUT.astype(np.float64)).astype(np.float16)}

    @batch
    def bf16(INPUT):
        x = (INPUT.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        y = run(x).astype(np.float32).view(np.uint32)
        # round to nearest even, as torch does
        y = (y + 0x7FFF + ((y >> 16) & 1)) >> 16
        return {"OUTPUT": y.astype(np.uint16)}

    return fp32, fp16, bf16


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["torch", "numpy"], default="torch")
    parser.add_argument("--port-base", type=int, default=8000)
    args = parser.parse_args()
    fp32, fp16, bf16 = torch_models() if args.backend == "torch" else numpy_models()
    models = [("softmax", fp32, np.float32), ("softmax_fp16", fp16, np.float16),
              ("softmax_bf16", bf16, np.uint16)]
    config = TritonConfig(http_port=args.port_base, grpc_port=args.port_base + 1,
                          metrics_port=args.port_base + 2)
    # Statistics open to clients (perf_analyzer reads them), as in a plain tritonserver.
    security = TritonSecurityConfig(restricted_endpoints=["model-repository", "trace", "logging"])
    with Triton(config=config, security_config=security) as triton:
        for name, infer, dtype in models:
            triton.bind(model_name=name, infer_func=infer,
                        inputs=[Tensor(name="INPUT", dtype=dtype, shape=(-1,))],
                        outputs=[Tensor(name="OUTPUT", dtype=dtype, shape=(-1,))],
                        config=ModelConfig(max_batch_size=MAX_BATCH_ROWS,
                                           batcher=DynamicBatcher(
                                               max_queue_delay_microseconds=QUEUE_DELAY_US)),
                        strict=False)
        triton.serve()


if __name__ == "__main__":
    main()
