#!/usr/bin/env bash
# stage_peers.sh OUT: the peers of the kernel benchmark (QuACK, Liger, the
# CuTe DSL, FlashInfer) for a GPU machine that has no package index and takes
# one transfer of 64 MiB, in transfer folders OUT/t1, OUT/t2, ... that
# run_h200.sh installs (it joins NAME.part-* files across its WHEELS_DIRs and
# unpacks *.whl and *.tar.xz offline). Run it here, where pip reaches PyPI:
#
#   kernels/bench/stage_peers.sh /tmp/peers
#   # GPU machine, call 1 (carry DIR and /tmp/peers/t1):
#   STASH=/tmp/peers_stash bash run_h200.sh DIR /tmp/peers/t1
#   # call 2, while that machine is up (carry /tmp/peers/t2):
#   bash run_h200.sh DIR /tmp/peers_stash /tmp/peers/t2
#
# Wheels over REPACK_MIB are unpacked and recompressed as NAME.tar.xz (the CuTe
# DSL compiler, 87 MiB as a wheel, is 61 MiB so); FlashInfer keeps only its
# Python files, headers and top-level sources (its softmax is a JIT-compiled
# sampling module; the other backends' sources are 90% of its wheel). Then
# the files fill t1 up to FIRST_MIB (room for the build beside it) and each
# later folder up to REST_MIB, a file that does not fit split across them.
# WHEELS=DIR takes the wheels from DIR instead of downloading them.
set -euo pipefail
out=${1:?usage: stage_peers.sh OUT}
first_kib=$(( ${FIRST_MIB:-28} * 1024 ))
rest_kib=$(( ${REST_MIB:-58} * 1024 ))
repack_kib=$(( ${REPACK_MIB:-32} * 1024 ))
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/bench/lib/gpu_stage.sh"

# The versions the committed results were measured with (results/README.md).
pins=(quack-kernels==0.6.5 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
      nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1
      apache-tvm-ffi==0.1.15.post2 liger-kernel==0.8.5 flashinfer-python==0.7.4)

rm -rf "$out" && mkdir -p "$out/files" "$out/work"
if [[ -n "${WHEELS:-}" ]]; then
  cp "$WHEELS"/*.whl "$out/files/"
else
  gpu_stage_download_wheels "$out/files" "$(gpu_stage_platforms 39 35 34 31 28 27 24 17)" \
    --no-deps "${pins[@]}"
fi

# FlashInfer keeps its Python files, headers and top-level sources.
flashinfer_keep='f.endswith(".py") or ".dist-info/" in f or f.count("/") == 1 or f.startswith(("flashinfer/data/include/", "flashinfer/data/cccl/", "flashinfer/data/cutlass/")) or (f.startswith("flashinfer/data/csrc/") and f.count("/") == 3 and not f.split("/")[3].startswith("cake"))'
for w in "$out"/files/*.whl; do
  if [[ $(basename "$w") == flashinfer_python-* ]]; then
    gpu_stage_repack_wheel "$w" "$out/files" "$out/work" "$flashinfer_keep"
  elif (( $(stat -c %s "$w") > repack_kib * 1024 )); then
    gpu_stage_repack_wheel "$w" "$out/files" "$out/work"
  fi
done
rm -rf "$out/work"
gpu_stage_split_transfers "$out/files" "$out" "$first_kib" "$rest_kib"
