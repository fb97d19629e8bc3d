// Everything softmax-server is configured with, one field per flag. main.cc
// fills it from the command line; nothing else reads flags.
#ifndef SOFTMAX_SERVER_SERVER_OPTIONS_H_
#define SOFTMAX_SERVER_SERVER_OPTIONS_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "common/malloc_tuning.h"

namespace softmax::server {

struct ServerOptions {
  // --grpc_address: host:port for gRPC; port 0 picks a free port (the bound
  // one is printed in the "listening" line).
  std::string grpc_address = "0.0.0.0:50051";
  // --metrics_address: host:port for Prometheus /metrics; empty disables it.
  std::string metrics_address = "0.0.0.0:9464";
  // --device: auto | cpu | cuda | cuda:N | none. auto = a GPU when present,
  // else the CPU. none = echo inputs from the reactor (transport ceiling).
  std::string device = "auto";
  // --max_tensor_bytes: largest input tensor; also sets gRPC's message
  // limits (plus a small headroom). Bounds memory per request.
  int64_t max_tensor_bytes = int64_t{1} << 30;
  // --max_batch_rows / --max_batch_bytes / --max_queue_delay_us: when a
  // batch closes. Bigger batches raise throughput; a delay makes requests
  // wait for company while the device is busy. 0 (the default) forms a batch
  // whenever the device can take one: requests gather only while every
  // stream is busy.
  int64_t max_batch_rows = 8192;
  int64_t max_batch_bytes = int64_t{64} << 20;
  int64_t max_queue_delay_us = 0;
  // --dispatch_when_idle: form a batch at once when the backend has nothing
  // in flight instead of waiting max_queue_delay_us for company; requests
  // gather only while the device is busy.
  bool dispatch_when_idle = true;
  // --max_queued_requests / --max_queued_bytes: admission bounds; beyond
  // them requests fail fast with UNAVAILABLE instead of queueing.
  int64_t max_queued_requests = 8192;
  int64_t max_queued_bytes = int64_t{4} << 30;
  // --completion_threads / --offload_completion_bytes /
  // --offload_completion_requests: batches of at least that many input bytes
  // or requests are answered (responses serialised and queued for writing)
  // by this many threads in parallel, freeing the backend for the next batch
  // at once; smaller batches are answered on the backend's thread.
  // --completion_threads=0 answers every batch there.
  int completion_threads = 4;
  int64_t offload_completion_bytes = int64_t{1} << 20;
  int64_t offload_completion_requests = 32;
  // --cpu_threads: CPU backend threads; 0 = hardware concurrency.
  int cpu_threads = 0;
  // --lame_duck_ms: on SIGINT/SIGTERM, how long the server keeps its port
  // open refusing new requests with UNAVAILABLE (health NOT_SERVING) before
  // it stops listening, so callers and balancers move away cleanly.
  int lame_duck_ms = 500;
  // --shutdown_grace_s: on SIGINT/SIGTERM, how long in-flight RPCs get to
  // finish before they are cancelled.
  int shutdown_grace_s = 30;
  // --cuda_streams: GPU backend pipeline depth (batches in flight, one CUDA
  // stream each). 2 overlaps one batch's copies with another's compute; 3
  // also lets small batches start while two are in flight.
  int cuda_streams = 3;
  // --cuda_blocking_sync: GPU backend waits for each batch by sleeping on its
  // CUDA event instead of spinning; frees cores when the host's CPUs, shared
  // with gRPC, are the bottleneck, at some wake-up latency.
  bool cuda_blocking_sync = true;
  // --cuda_spin_us: with --cuda_blocking_sync, how long a batch's completion
  // is polled before the slot sleeps on it (small batches finish within it,
  // so they keep the wake-up latency of spinning).
  int64_t cuda_spin_us = 50;
  // --cuda_idle_spin_us: after a batch, how long a stream's thread polls for
  // the next one before it sleeps (no wake-up for a batch that comes
  // meanwhile, one busy core while it polls). 0 = sleep at once.
  int64_t cuda_idle_spin_us = 400;
  // --cuda_idle_spin_threads: at most this many stream threads poll at once.
  int cuda_idle_spin_threads = 1;
  // --cuda_inline_max_bytes: batches up to this size that find the GPU idle
  // run on the thread that submits them (no hand-off); 0 = never.
  int64_t cuda_inline_max_bytes = 0;
  // --cuda_inline_when_busy: such batches run on the submitting thread also
  // while other streams are busy, as long as one is free.
  bool cuda_inline_when_busy = false;
  // --cuda_zero_copy_max_bytes: batches up to this many input bytes skip the
  // host<->device copies; the kernels read and write the pinned staging
  // directly over the bus. 0 = always copy.
  int64_t cuda_zero_copy_max_bytes = int64_t{4} << 20;
  // --cuda_pinned_responses_max_bytes / --cuda_pinned_response_min_bytes:
  // responses of at least min bytes are sent straight from the pinned memory
  // their batch was computed into, no copy, while the pinned memory so held
  // by responses not yet sent stays within max; beyond it they are copied.
  // Inputs of min bytes or more are copied into pinned memory as they are
  // admitted, within the same max. max 0 = always copy.
  int64_t cuda_pinned_responses_max_bytes = int64_t{1} << 30;
  int64_t cuda_pinned_response_min_bytes = int64_t{16} << 10;
  // --cuda_memory_limit_bytes: device memory the GPU backend may hold (its
  // staging included); 0 = no cap. For a GPU shared with other processes.
  int64_t cuda_memory_limit_bytes = 0;
  // --inject_fault_after_batches: testing only; the GPU backend provokes a
  // real sticky fault after this many batches (0 = never), to show that the
  // server goes NOT_SERVING and exits non-zero.
  int64_t inject_fault_after_batches = 0;
  // --malloc_mmap_threshold_bytes / --malloc_trim_threshold_bytes: glibc
  // keeps freed memory for reuse instead of mapping fresh pages for every
  // large message (common/malloc_tuning.h). 0 keeps glibc's default.
  MallocTuning malloc;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_SERVER_OPTIONS_H_
