#!/bin/bash
# Runs on the GPU machine, from the repository root: the GPU unit tests, then
# the benchmark. Binaries come prebuilt (see kernels/README.md); results go to
# $OUT (default ./bench-out).
#   kernels/bench/run_h200.sh [build-dir]
set -u
BUILD=${1:-build-kernels}
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
timeout 300 "$BUILD/bin/softmax_cuda_test" --gtest_output="xml:$OUT/gtest.xml" > "$OUT/gtest.log" 2>&1
echo "softmax_cuda_test exit code $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|tests? ran" "$OUT/gtest.log" | tail -15
grep -E "Failure|problem .* path" "$OUT/gtest.log" | head -20
PYTHONUNBUFFERED=1 python3 kernels/bench/softmax_bench.py \
  --lib "$BUILD/lib/libsoftmax_kernels_c.so" --out "$OUT" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
echo "softmax_bench exit code $?"
cat "$OUT/bench.log" | grep -v "^  " | tail -70
