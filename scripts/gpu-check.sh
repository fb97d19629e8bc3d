#!/usr/bin/env bash
# Runs, on a machine with an NVIDIA GPU, everything that needs one: the
# CudaBackend's GPU unit tests, the end-to-end tests on --device=cuda, the
# batching benchmark and the service benchmark, all from a release bundle.
#
# Usage (from the checkout root, with the bundle built by `make gpu-bundle`):
#   scripts/gpu-check.sh BUNDLE_DIR OUT_DIR [steps]
# steps: any of unit,roundtrip,e2e,shm,scrape,protocols,batching,small,service,service-small,
# soak,multi-gpu
# (default: unit,e2e,batching,service); they run in the order listed here.
# multi-gpu wants a machine with two GPUs or more.
# SERVICE_DURATION / SERVICE_WARMUP (seconds, default 3 / 1) set the service
# step's time per point, and SERVICE_ROUNDS (default 3) its rounds per point:
# each round times the GPU server and the echo back to back, in alternating
# order, and the table shows the median of the per-round ratios (see
# bench/service/README.md), so the step takes SERVICE_ROUNDS times as long.
# INVARIANCE_ROUNDS (default 110) sets how many times the e2e step's batch
# invariance test sends each probe through each protocol, and
# INVARIANCE_PROCESSES (default 1) how many such tests run at once, each with
# its own server (on an H100, four at once gave 57,000-69,000 answers in
# 125-170 s of probing).
# TEST_TIMEOUT (seconds, default 300) bounds each test step, so that a hang
# ends its step (with pytest's stack dump of every thread after 4/5 of it)
# and the later steps and the logs still come back.
# SOAK_DURATION (seconds, default 600) sets the soak step's length: the
# server with its default flags on --device=cuda, every protocol, a
# tritonclient stream and a grpcio stream open the whole time, no call may fail
# (bench/soak/soak.py --no-abuse; tritonclient is used when it imports).
# Needs python3 with grpcio, protobuf, numpy and pytest (matplotlib for plots).
# Everything lands in OUT_DIR/gpu-check.tgz plus a summary in OUT_DIR/summary.txt;
# both are rewritten after every step, so a run stopped at a time limit keeps
# the steps it finished.
set -uo pipefail
. "$(dirname "$0")/listening.sh"
bundle=$(cd "$1" && pwd)
out=$2
steps=${3:-unit,e2e,batching,service}
work=$(mktemp -d)
mkdir -p "$out"
status=0

step() { [[ ",$steps," == *",$1,"* ]]; }
limit=${TEST_TIMEOUT:-300}
bounded() { timeout "$limit" "$@"; }
# The end-to-end tests against the bundle: the checkout (bench.lib) and the
# bundle's softmax/v1 stubs on PYTHONPATH, as ctest sets them.
pytest_bounded() {
  SOFTMAX_SERVER_BIN="$bundle/softmax-server" SOFTMAX_CLIENT_BIN="$bundle/softmax-client" \
  SOFTMAX_PYTHON_DIR="$bundle/python" PYTHONDONTWRITEBYTECODE=1 \
  PYTHONPATH="$PWD:$bundle/python${PYTHONPATH:+:$PYTHONPATH}" \
    bounded python3 -m pytest -p no:cacheprovider -q -rs --rootdir=tests \
      -o faulthandler_timeout=$((limit * 4 / 5)) "$@"
}
note() { echo "== $*" | tee -a "$work/summary.txt"; }
snapshot() {
  cp "$work/summary.txt" "$out/summary.txt"
  tar -C "$work" -czf "$out/gpu-check.tgz" .
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
  | tee "$work/gpu.txt"

if step unit; then
  note "CudaBackend GPU unit tests"
  LD_LIBRARY_PATH="$bundle/lib" bounded "$bundle/bin/cuda_backend_test" 2>&1 | tee "$work/cuda_backend_test.log" \
    | tail -8 | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  # The kernels against the float64 reference, their batch invariance (each
  # probe's rows alone and inside random launches, bit for bit) and the fused
  # top K (the reference's ranking, and its bits alone and batched).
  for t in softmax_cuda_test softmax_invariance_test top_k_cuda_test; do
    note "kernel tests: $t"
    bounded "$bundle/bin/$t" 2>&1 | tee "$work/$t.log" \
      | grep -E "^batch invariance|^\[  (PASSED|FAILED|SKIPPED) " | tee -a "$work/summary.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  done
  snapshot
fi

if step roundtrip; then
  note "GPU round trip of a small batch, link by link"
  "$bundle/cuda_backend_bench" --iterations=3000 --json="$work/roundtrip.json" 2>&1 \
    | tee "$work/roundtrip.md" | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  snapshot
fi

if step e2e; then
  note "end-to-end tests on the GPU backend"
  # tests/test_top_k.py (the top K on --device=cuda, tritonclient's class_count
  # among it) needs tritonclient: run where it imports, said where it does not.
  top_k=tests/test_top_k.py
  python3 -c "import tritonclient.grpc" 2> /dev/null \
    || { top_k=; note "tests/test_top_k.py not run: tritonclient does not import"; }
  pytest_bounded tests/test_gpu_serving.py tests/test_numerics.py tests/test_stream.py \
      tests/test_chunked_stream.py $top_k \
      2>&1 | tee "$work/e2e.log" | tail -15 | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  snapshot
  # Batch invariance: every probe's bits under a 48-caller flood, on every
  # protocol, 1,000 answers or so per probe (about 100,000 in all), stopped
  # after 3/5 of TEST_TIMEOUT if slower; INVARIANCE_PROCESSES test processes
  # at once, each with its own server and flood; their summary lines and
  # the total go to summary.txt.
  procs=${INVARIANCE_PROCESSES:-1}
  note "batch invariance on the GPU backend under a flood ($procs processes at once)"
  pids=()
  for i in $(seq "$procs"); do
    SOFTMAX_INVARIANCE_ROUNDS="${INVARIANCE_ROUNDS:-110}" \
    SOFTMAX_INVARIANCE_SECONDS=$((limit * 3 / 5)) \
      pytest_bounded tests/test_batch_invariance.py -k cuda > "$work/invariance$i.log" 2>&1 &
    pids+=($!)
  done
  for i in $(seq "$procs"); do
    wait "${pids[$((i - 1))]}" || status=1
    grep -E "^batch invariance|^(FAILED|ERROR|SKIPPED)|[0-9]+ (passed|failed|skipped)" \
      "$work/invariance$i.log" | tail -8 | tee -a "$work/summary.txt"
  done
  cat "$work"/invariance*.log | sed -nE \
    's/^batch invariance on [^:]*: ([0-9]+) probe answers compared, ([0-9]+) differing.*/\1 \2/p' \
    | awk -v p="$procs" '{a += $1; d += $2; n++}
        END {printf "batch invariance, all processes: %d probe answers, %d differing (%d of %d processes reported)\n", a, d, n, p}' \
    | tee -a "$work/summary.txt"
  snapshot
fi

if step shm; then
  # Shared memory (system and CUDA regions) on the GPU backend; needs
  # tritonclient on PYTHONPATH.
  note "shared-memory tests on the GPU backend"
  pytest_bounded tests/test_shared_memory.py 2>&1 | tee "$work/shm.log" | tail -5 | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  snapshot
fi

if step scrape; then
  # The server's /metrics on the GPU under load (64 x 32000 bfloat16, 16
  # callers), as Prometheus would scrape it: gpu-metrics.txt.
  note "GPU metrics scraped under load"
  "$bundle/softmax-server" --device=cuda --grpc_address=127.0.0.1:0 --http_address= \
    --metrics_address=127.0.0.1:0 --listening_file="$work/scrape-listening.json" \
    > "$work/scrape-server.log" 2>&1 &
  server=$!
  wait_for_listening "$work/scrape-listening.json" "$server" || true
  grpc=$(listening_address "$work/scrape-listening.json" grpc)
  metrics=$(listening_address "$work/scrape-listening.json" metrics)
  "$bundle/softmax-client" load --target="$grpc" --shape=64,32000 --dtype=bfloat16 \
    --concurrency=16 --duration=8s --quiet > "$work/scrape-load.txt" 2>&1 &
  load=$!
  sleep 5
  python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(
      'http://$metrics/metrics', timeout=10).read().decode())" > "$work/gpu-metrics.txt"
  rc=$?
  wait $load
  kill -TERM $server; wait $server
  grep -E '^softmax_gpu_' "$work/gpu-metrics.txt" | tee -a "$work/summary.txt"
  grep -q '^softmax_gpu_memory_total_bytes' "$work/gpu-metrics.txt" && [[ $rc -eq 0 ]] || status=1
  cp "$work/gpu-metrics.txt" "$out/gpu-metrics.txt"
  snapshot
fi

if step protocols; then
  # softmax.v1 against KServe ModelInfer and KServe HTTP/REST (binary
  # tensors), one server, the same load client.
  note "softmax.v1 against KServe gRPC and HTTP, same client"
  python3 -m bench.kserve.protocols --bundle="$bundle" --device=cuda --out="$work/protocols" \
    2>&1 | tee "$work/protocols.log" | tail -5 | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  cp "$work/protocols/protocols.json" "$out/" 2>/dev/null
  snapshot
fi

if step batching; then
  for delay in 0 2000; do
    note "batching benchmark, --max_queue_delay_us=$delay"
    python3 -m bench.batching.run --bundle="$bundle" --device=cuda \
      --server-arg=--max_queue_delay_us=$delay --out="$work/batching-delay$delay" \
      2>&1 | tee "$work/batching-delay$delay.log" | tail -8 | tee -a "$work/summary.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  done
  snapshot
fi

if step small; then
  # The small-payload point (1 x 1024 float32, 256 callers), unary and stream,
  # over 16 connections.
  for mode in unary stream; do
    note "small payloads, $mode"
    extra=(); [[ $mode == stream ]] && extra=(--stream)
    python3 -m bench.service.run --bundle="$bundle" --device=cuda --out="$work/small-$mode" \
      --payloads=1x1024:float32 --concurrency=256 --connections=16 --duration=4 --warmup=1 \
      "${extra[@]}" 2>&1 | tee "$work/small-$mode.log" | tail -4 | tee -a "$work/summary.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  done
  snapshot
fi

if step service; then
  note "service benchmark"
  python3 -m bench.service.run --bundle="$bundle" --device=cuda --out="$work/service" \
    --duration="${SERVICE_DURATION:-3}" --warmup="${SERVICE_WARMUP:-1}" \
    --rounds="${SERVICE_ROUNDS:-3}" 2>&1 \
    | tee "$work/service.log" | tail -30 | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  snapshot
fi

if step service-small; then
  # The sweep's small and medium payloads only, where softmax is closest to
  # the echo: a second look at those points in less time.
  note "service benchmark, small and medium payloads"
  python3 -m bench.service.run --bundle="$bundle" --device=cuda --out="$work/service-small" \
    --payloads=1x1024:float32,8x4096:float16 \
    --duration="${SERVICE_DURATION:-3}" --warmup="${SERVICE_WARMUP:-1}" \
    --rounds="${SERVICE_ROUNDS:-3}" 2>&1 \
    | tee "$work/service-small.log" | tail -14 | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  snapshot
fi

if step soak; then
  note "soak of default flags, ${SOAK_DURATION:-600} s on --device=cuda"
  PYTHONPATH="$bundle/python:${PYTHONPATH:-}" timeout $(( ${SOAK_DURATION:-600} + 300 )) \
    python3 -m bench.soak.soak --bundle="$bundle" --device=cuda --no-abuse \
    --duration="${SOAK_DURATION:-600}" --callers=8 --bulk-callers=32 --out="$work/soak" 2>&1 \
    | tee "$work/soak.log" | tail -30 | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  snapshot
fi

if step multi-gpu; then
  # One GPU against every GPU of the host under the one scheduler, with the
  # load client: the two large payloads at 64 callers, in alternating rounds.
  for device in cuda:0 cuda:all; do
    note "multi-GPU: --device=$device"
    python3 -m bench.service.run --bundle="$bundle" --device="$device" \
      --out="$work/multi-gpu-${device/:/-}" --payloads=64x32000:bfloat16,1x16M:float32 \
      --concurrency=64 --duration="${SERVICE_DURATION:-3}" --warmup="${SERVICE_WARMUP:-1}" \
      --rounds="${SERVICE_ROUNDS:-3}" --skip-none 2>&1 \
      | tee "$work/multi-gpu-${device/:/-}.log" | tail -8 | tee -a "$work/summary.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  done
  snapshot
fi

snapshot
rm -rf "$work"
exit $status
