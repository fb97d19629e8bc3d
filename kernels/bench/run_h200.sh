#!/bin/bash
# On the GPU machine: installs the peers' wheels (when given), runs the GPU
# unit tests, then the benchmark. Binaries come prebuilt (kernels/README.md).
#
#   kernels/bench/run_h200.sh DIR [WHEELS_DIR ...]
#
# DIR holds softmax_cuda_test and libsoftmax_kernels_c.so (each may be
# xz-compressed as NAME.xz); the benchmark is this checkout's
# (python3 -m kernels.bench.softmax_bench, the checkout on PYTHONPATH). Each WHEELS_DIR holds *.whl files
# and *.tar.xz archives of installed files (a wheel too large for one
# transfer, unpacked and recompressed), or their parts NAME.part-aa, -ab, ...
# which are joined first; all are installed offline into /tmp/peers_site
# (--no-index --no-deps: torch, triton and numpy are the machine's own).
#
# Environment: OUT (results, default ./bench-out), TESTS=0 skips the unit
# tests, BENCH=0 the benchmark, BENCH_ARGS more benchmark arguments,
# STASH=DIR only copies the wheel folders into DIR and exits (the first of two
# transfers; name DIR as a WHEELS_DIR of the second).
set -u
DIR=${1:?usage: run_h200.sh DIR [WHEELS_DIR ...]}
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

if [ -n "${STASH:-}" ]; then
  mkdir -p "$STASH"
  for d in "$@"; do cp "$d"/* "$STASH"/; done
  echo "stashed in $STASH:"; ls -la "$STASH"
  exit 0
fi

for f in "$DIR"/*.xz; do
  case "$f" in *.tar.xz|*"*"*) continue ;; esac
  "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$f" "${f%.xz}" && chmod +x "${f%.xz}"
done

if [ $# -gt 0 ]; then
  . "$root/bench/lib/gpu_stage.sh"
  SITE=/tmp/peers_site
  gpu_stage_join_parts /tmp/peers_join "$@"
  gpu_stage_unpack_into "$SITE" /tmp/peers_join
  # Unpacked wheels skip .pth files: nvidia_cutlass_dsl.pth adds dsl_packages.
  export PYTHONPATH="$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
  echo "peers installed in $SITE: $(ls "$SITE" | grep dist-info | tr '\n' ' ')"
fi

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
if [ "${TESTS:-1}" != "0" ]; then
  timeout "${TEST_TIMEOUT:-240}" "$DIR/softmax_cuda_test" > "$OUT/gtest.log" 2>&1
  echo "softmax_cuda_test exit code $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|tests? ran|^\[       OK|^\[  FAILED" "$OUT/gtest.log" | tail -25
  grep -E "Failure|problem .* path" "$OUT/gtest.log" | head -20
fi
if [ "${BENCH:-1}" != "0" ]; then
  lib=$(cd "$DIR" && pwd)/libsoftmax_kernels_c.so
  out=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
  (cd "$root" && PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" \
    "$PY" -m kernels.bench.softmax_bench --lib "$lib" --out "$out" ${BENCH_ARGS:-}) \
    > "$OUT/bench.log" 2>&1
  echo "softmax_bench exit code $?"
  grep -v "^  " "$OUT/bench.log" | tail -80
fi
