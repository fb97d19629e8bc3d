#!/usr/bin/env bash
# Runs, on a machine with an NVIDIA GPU, everything that needs one: the
# DeviceWorker's GPU unit tests, the end-to-end tests on --device=cuda, the
# batching benchmark and the service benchmark, all from a release bundle.
#
# Usage (from the checkout root, with the bundle built by `make gpu-bundle`):
#   scripts/gpu-check.sh BUNDLE_DIR OUT_DIR [steps]
# steps: any of unit,roundtrip,e2e,batching,small,service,service-small,ab,ab-inline,ab-batching,
# ab-streams,ab-spin,ab-large,ab-defaults,ab-c1,ab-pinned,ab-medium,ab-offload,ab-idle,ab-zc,malloc (default: unit,e2e,batching,service); they run in the order listed here.
# SERVICE_DURATION / SERVICE_WARMUP (seconds, default 3 / 1) set the service
# step's time per point, and SERVICE_ROUNDS (default 3) its rounds per point:
# each round times the GPU server and the echo back to back, in alternating
# order, and the table shows the median of the per-round ratios (see
# bench/service/README.md), so the step takes SERVICE_ROUNDS times as long.
# Needs python3 with grpcio, protobuf, numpy and pytest (matplotlib for plots).
# Everything lands in OUT_DIR/gpu-check.tgz plus a summary in OUT_DIR/summary.txt;
# both are rewritten after every step, so a run stopped at a time limit keeps
# the steps it finished.
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=$2
steps=${3:-unit,e2e,batching,service}
work=$(mktemp -d)
mkdir -p "$out"
status=0

step() { [[ ",$steps," == *",$1,"* ]]; }
note() { echo "== $*" | tee -a "$work/summary.txt"; }
snapshot() {
  cp "$work/summary.txt" "$out/summary.txt"
  tar -C "$work" -czf "$out/gpu-check.tgz" .
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
  | tee "$work/gpu.txt"

if step unit; then
  note "DeviceWorker GPU unit tests"
  LD_LIBRARY_PATH="$bundle/lib" "$bundle/bin/device_worker_test" 2>&1 | tee "$work/device_worker_test.log" \
    | tail -8 | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  snapshot
fi

if step roundtrip; then
  note "GPU round trip of a small batch, link by link"
  "$bundle/device_worker_bench" --iterations=3000 --json="$work/roundtrip.json" 2>&1 \
    | tee "$work/roundtrip.md" | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  snapshot
fi

if step e2e; then
  note "end-to-end tests on the GPU backend"
  SOFTMAX_SERVER_BIN="$bundle/softmax-server" SOFTMAX_CLIENT_BIN="$bundle/softmax-client" \
  SOFTMAX_PYTHON_DIR="$bundle/python" PYTHONDONTWRITEBYTECODE=1 \
    python3 -m pytest -p no:cacheprovider -q -rs --rootdir=tests \
      tests/test_gpu_serving.py tests/test_numerics.py tests/test_stream.py \
      2>&1 | tee "$work/e2e.log" | tail -15 | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  snapshot
fi

if step batching; then
  for delay in 0 2000; do
    note "batching benchmark, --max_queue_delay_us=$delay"
    python3 bench/batching/run.py --bundle="$bundle" --device=cuda \
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
    python3 bench/service/run.py --bundle="$bundle" --device=cuda --out="$work/small-$mode" \
      --payloads=1x1024:float32 --concurrency=256 --connections=16 --duration=4 --warmup=1 \
      "${extra[@]}" 2>&1 | tee "$work/small-$mode.log" | tail -4 | tee -a "$work/summary.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  done
  snapshot
fi

if step service; then
  note "service benchmark"
  python3 bench/service/run.py --bundle="$bundle" --device=cuda --out="$work/service" \
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
  python3 bench/service/run.py --bundle="$bundle" --device=cuda --out="$work/service-small" \
    --payloads=1x1024:float32,8x4096:float16 \
    --duration="${SERVICE_DURATION:-3}" --warmup="${SERVICE_WARMUP:-1}" \
    --rounds="${SERVICE_ROUNDS:-3}" 2>&1 \
    | tee "$work/service-small.log" | tail -14 | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  snapshot
fi

# One A/B setting: its own server, softmax only unless "$@" drops --skip-none.
# One round per point (--rounds=1, which "$@" may override): the A/B steps
# alternate their settings in rounds of their own.
# ab_unary NAME PAYLOADS CONCURRENCY [run.py args...]: 8 connections, unary.
ab_unary() {
  local name=$1 payloads=$2 concurrency=$3
  shift 3
  note "A/B $name"
  python3 bench/service/run.py --bundle="$bundle" --device=cuda --out="$work/ab-$name" \
    --payloads="$payloads" --concurrency="$concurrency" --duration=2 --warmup=0.5 --rounds=1 \
    "$@" 2>&1 | tee "$work/ab-$name.log" | grep -E "req/s|FAILED|/none median" \
    | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
}
# ab_stream NAME [run.py args...]: 1 x 1024 float32, 256 callers streamed over
# 16 connections.
ab_stream() {
  local name=$1
  shift
  python3 bench/service/run.py --bundle="$bundle" --device=cuda --out="$work/ab-$name-stream" \
    --payloads=1x1024:float32 --concurrency=256 --connections=16 --stream --duration=3 \
    --warmup=1 --rounds=1 "$@" 2>&1 | tee "$work/ab-$name-stream.log" \
    | grep -E "req/s|FAILED|/none median" | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
}

if step ab; then
  # The small-batch settings of the GPU backend, each switched off alone and
  # all together (before), against the defaults:
  #   copies     small batches copied to and from the GPU (no zero copy);
  #   no-offload batches of many requests answered on the stream's thread;
  #   hand-off   a lone small batch handed to a stream's thread.
  # Small payloads at 1-64 callers, then the small payload streamed at 256.
  for setting in default before copies no-offload hand-off; do
    case $setting in
      default) extra=() ;;
      before) extra=(--server-arg=--cuda_zero_copy_max_bytes=0
                     --server-arg=--offload_completion_requests=0
                     --server-arg=--cuda_inline_max_bytes=0) ;;
      copies) extra=(--server-arg=--cuda_zero_copy_max_bytes=0) ;;
      no-offload) extra=(--server-arg=--offload_completion_requests=0) ;;
      hand-off) extra=(--server-arg=--cuda_inline_max_bytes=0) ;;
    esac
    ab_unary "$setting" 1x1024:float32,8x4096:float16 1,16,64 --skip-none "${extra[@]}"
    ab_stream "$setting" --skip-none "${extra[@]}"
    snapshot
  done
fi

if step ab-inline; then
  # A lone small request run on the receiving thread (the default) against
  # handed to a stream's thread, at 1 caller, in alternating rounds with the
  # echo beside the first, so that drift between server starts shows.
  for round in 1 2 3; do
    ab_unary "inline-$round-inline" 1x1024:float32,8x4096:float16 1
    ab_unary "inline-$round-hand-off" 1x1024:float32,8x4096:float16 1 --skip-none \
      --server-arg=--cuda_inline_max_bytes=0
    snapshot
  done
fi

if step ab-batching; then
  # How batches are formed and run at 16-256 callers: the defaults (three
  # streams, a batch whenever one is free) against requests gathering for up
  # to 100 us while the GPU is busy, two streams, and small batches run on
  # the submitting thread while other streams are busy. The echo runs beside
  # the defaults.
  for setting in default delay100 streams2 busy; do
    case $setting in
      default) extra=() ;;
      delay100) extra=(--skip-none --server-arg=--max_queue_delay_us=100) ;;
      streams2) extra=(--skip-none --server-arg=--cuda_streams=2) ;;
      busy) extra=(--skip-none --server-arg=--cuda_inline_when_busy=true) ;;
    esac
    ab_unary "$setting" 1x1024:float32,8x4096:float16 16,64 "${extra[@]}"
    ab_stream "$setting" "${extra[@]}"
    snapshot
  done
fi

if step ab-streams; then
  # Three CUDA streams (the default) against two, at 16 and 64 callers, in
  # alternating rounds with the echo in each, so that drift shows.
  for round in 1 2 3; do
    ab_unary "streams-$round-streams3" 1x1024:float32,8x4096:float16 16,64
    ab_unary "streams-$round-streams2" 1x1024:float32,8x4096:float16 16,64 --skip-none \
      --server-arg=--cuda_streams=2
    snapshot
  done
fi

if step ab-spin; then
  # How a stream's thread (or the receiving thread running a batch inline)
  # waits for the GPU: polling for 50 us then asleep (the default), asleep at
  # once, or polling for 500 us; and the CPU backend beside them. Small
  # payloads at 1 and 16 callers, two alternating rounds, the echo in each.
  for round in 1 2; do
    ab_unary "spin-$round-default" 1x1024:float32,8x4096:float16 1,16
    ab_unary "spin-$round-spin0" 1x1024:float32,8x4096:float16 1,16 --skip-none \
      --server-arg=--cuda_spin_us=0
    ab_unary "spin-$round-spin500" 1x1024:float32,8x4096:float16 1,16 --skip-none \
      --server-arg=--cuda_spin_us=500
    ab_unary "spin-$round-cpu" 1x1024:float32,8x4096:float16 1,16 --skip-none --device=cpu
    snapshot
  done
fi

if step ab-large; then
  # Medium and large payloads at 16 and 64 callers: the defaults (with the
  # echo, first and last, so that drift shows) against zero copy up to 1 MiB,
  # 16 completion threads, the stream threads sleeping at once, and glibc
  # keeping freed memory (fewer page faults on large messages).
  for setting in default zerocopy1m completion16 spin0 malloc default2; do
    extra=(--skip-none)
    case $setting in
      default|default2) extra=() ;;
      zerocopy1m) extra+=(--server-arg=--cuda_zero_copy_max_bytes=1048576) ;;
      completion16) extra+=(--server-arg=--completion_threads=16) ;;
      spin0) extra+=(--server-arg=--cuda_spin_us=0) ;;
      malloc) export GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 ;;
    esac
    ab_unary "large-$setting" 8x4096:float16,64x32000:bfloat16 16,64 "${extra[@]}"
    unset GLIBC_TUNABLES
    snapshot
  done
fi

if step ab-defaults; then
  # This revision's two new defaults, each switched back alone, against the
  # defaults, in two alternating rounds (the echo beside the defaults):
  #   glibc  glibc's own malloc settings (--malloc_*=0);
  #   zc64   zero copy up to 64 KiB only.
  # Small and medium payloads at 16 and 64 callers, and the small payload
  # streamed at 256.
  for round in 1 2; do
    for setting in default glibc zc64; do
      case $setting in
        default) extra=() ;;
        glibc) extra=(--skip-none --server-arg=--malloc_mmap_threshold_bytes=0
                      --server-arg=--malloc_trim_threshold_bytes=0) ;;
        zc64) extra=(--skip-none --server-arg=--cuda_zero_copy_max_bytes=65536) ;;
      esac
      ab_unary "defaults-$round-$setting" 1x1024:float32,8x4096:float16 16,64 "${extra[@]}"
      ab_stream "defaults-$round-$setting" "${extra[@]}"
      snapshot
    done
  done
fi

if step ab-c1; then
  # One caller: a lone small batch run on the receiving thread (the default)
  # against handed to a stream's thread (now that a hand-off wakes one
  # thread), and the CPU backend, in three alternating rounds, the echo
  # beside the first of each.
  for round in 1 2 3; do
    ab_unary "c1-$round-inline" 1x1024:float32,8x4096:float16 1 --duration=3
    ab_unary "c1-$round-hand-off" 1x1024:float32,8x4096:float16 1 --duration=3 --skip-none \
      --server-arg=--cuda_inline_max_bytes=0
    ab_unary "c1-$round-cpu" 1x1024:float32,8x4096:float16 1 --duration=3 --skip-none \
      --device=cpu
    snapshot
  done
fi

if step ab-pinned; then
  # Responses sent from the pinned memory their batch was computed into (the
  # default) against copied into the response and serialised
  # (--cuda_pinned_responses_max_bytes=0), medium and large payloads, three
  # alternating rounds, the echo beside the default.
  for round in 1 2 3; do
    ab_unary "pinned-$round-default" 8x4096:float16,64x32000:bfloat16 16,64,256
    ab_unary "pinned-$round-copied" 8x4096:float16,64x32000:bfloat16 16,64,256 --skip-none \
      --server-arg=--cuda_pinned_responses_max_bytes=0
    snapshot
  done
fi

if step ab-medium; then
  # Medium payloads (8 x 4096 float16) at 16 and 64 callers, where the GPU
  # server is furthest below the echo: the defaults (the echo beside them)
  # against five streams, DMA copies for every batch, a longer spin before
  # sleeping, and batches run on the receiving gRPC thread; three rounds.
  for round in 1 2 3; do
    for setting in default streams5 dma spin500 inline; do
      extra=(--skip-none)
      case $setting in
        default) extra=() ;;
        streams5) extra+=(--server-arg=--cuda_streams=5) ;;
        dma) extra+=(--server-arg=--cuda_zero_copy_max_bytes=0) ;;
        spin500) extra+=(--server-arg=--cuda_spin_us=500) ;;
        inline) extra+=(--server-arg=--cuda_inline_max_bytes=4194304
                        --server-arg=--cuda_inline_when_busy) ;;
      esac
      ab_unary "medium-$round-$setting" 8x4096:float16 16,64 "${extra[@]}"
    done
    snapshot
  done
fi

if step ab-offload; then
  # Medium payloads again, once a batch queued while a stream's thread is in
  # its done callback goes to a waiting thread: the defaults (the echo
  # beside them) against answering batches of 64 KiB or 256 KiB and more on
  # the completion threads (in parallel, each response on its own thread)
  # instead of on the stream's thread; three rounds.
  for round in 1 2 3; do
    for setting in default offload64k offload256k; do
      extra=(--skip-none)
      case $setting in
        default) extra=() ;;
        offload64k) extra+=(--server-arg=--offload_completion_bytes=65536) ;;
        offload256k) extra+=(--server-arg=--offload_completion_bytes=262144) ;;
      esac
      ab_unary "offload-$round-$setting" 8x4096:float16 16,64 "${extra[@]}"
    done
    snapshot
  done
fi

if step ab-idle; then
  # Small and medium payloads at 1, 16 and 64 callers, where the GPU server
  # is furthest below the echo: the defaults (one stream thread polls 400 us
  # for the next batch before it sleeps; the echo beside them) against no
  # polling and against every stream thread polling 100 us
  # (--cuda_idle_spin_us, --cuda_idle_spin_threads); three rounds. The
  # responses' timing (mean_kernel_us, mean_dispatch_us) says where each
  # batch's time went.
  for round in 1 2 3; do
    for setting in default off idle100x3; do
      extra=(--skip-none)
      case $setting in
        default) extra=() ;;
        off) extra+=(--server-arg=--cuda_idle_spin_us=0) ;;
        idle100x3) extra+=(--server-arg=--cuda_idle_spin_us=100
                           --server-arg=--cuda_idle_spin_threads=3) ;;
      esac
      ab_unary "idle-$round-$setting" 1x1024:float32,8x4096:float16 1,16,64 "${extra[@]}"
    done
    snapshot
  done
fi

if step ab-zc; then
  # Batches of staged medium requests beyond 256 KiB (8 x 4096 float16 at 64
  # and 256 callers, 64 x 32000 bfloat16 at 16) spent most of their compute
  # on the host (the responses' compute_ns against kernel_ns) when they were
  # copied: one H2D copy per staged request and the D2H copy. The kernels
  # reading and writing pinned memory for batches up to 256 KiB (the
  # default before), 1 MiB and 4 MiB (--cuda_zero_copy_max_bytes, now the
  # default), the echo beside the first; three rounds.
  for round in 1 2 3; do
    for setting in zc256k zc1m zc4m; do
      extra=(--skip-none)
      case $setting in
        zc256k) extra=(--server-arg=--cuda_zero_copy_max_bytes=262144) ;;
        zc1m) extra+=(--server-arg=--cuda_zero_copy_max_bytes=1048576) ;;
        zc4m) extra+=(--server-arg=--cuda_zero_copy_max_bytes=4194304) ;;
      esac
      ab_unary "zc-$round-$setting" 8x4096:float16 16,64,256 "${extra[@]}"
      ab_unary "zc-$round-$setting-large" 64x32000:bfloat16 16 "${extra[@]}"
    done
    snapshot
  done
fi

if step malloc; then
  # glibc keeping freed memory instead of returning it (fewer page faults on
  # large messages), for both servers: the tunables a deployment could set.
  note "GLIBC_TUNABLES mmap_threshold=32 MiB, trim_threshold=4 GiB"
  GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \
    python3 bench/service/run.py --bundle="$bundle" --device=cuda --out="$work/malloc" \
    --payloads=64x32000:bfloat16,1x16M:float32 --concurrency=16 --duration=2 --warmup=0.5 \
    2>&1 | tee "$work/malloc.log" | grep -E "req/s|FAILED" | tee -a "$work/summary.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  snapshot
fi

snapshot
rm -rf "$work"
exit $status
