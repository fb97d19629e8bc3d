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

for w in "$out"/files/*.whl; do
  name=$(basename "$w" .whl)
  if [[ $name == flashinfer_python-* ]]; then
    python3 - "$w" "$out/work/$name" <<'EOF'
import os, sys, zipfile
wheel, dest = sys.argv[1:]
def keep(f):
    parts = f.split("/")
    return (f.endswith(".py") or ".dist-info/" in f or len(parts) == 2
            or f.startswith(("flashinfer/data/include/", "flashinfer/data/cccl/",
                             "flashinfer/data/cutlass/"))
            or (f.startswith("flashinfer/data/csrc/") and len(parts) == 4
                and not parts[3].startswith("cake")))
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [i for i in z.infolist() if not i.is_dir() and keep(i.filename)])
EOF
  elif (( $(stat -c %s "$w") > repack_kib * 1024 )); then
    python3 -m zipfile -e "$w" "$out/work/$name"
  else
    continue
  fi
  tar -C "$out/work/$name" -cf - . | xz -T2 -9 > "$out/files/$name.tar.xz"
  rm -f "$w"
  echo "repacked $name: $(stat -c %s "$out/files/$name.tar.xz") bytes"
done
rm -rf "$out/work"

# Fill t1, t2, ...: whole files where they fit, else NAME.part-aa, -ab, ...
python3 - "$out" "$first_kib" "$rest_kib" <<'EOF'
import os, string, sys
out, first, rest = sys.argv[1], int(sys.argv[2]) * 1024, int(sys.argv[3]) * 1024
files = sorted(os.listdir(os.path.join(out, "files")), key=lambda f: os.path.getsize(os.path.join(out, "files", f)))
folder, room = 1, first
def target():
    d = os.path.join(out, "t%d" % folder)
    os.makedirs(d, exist_ok=True)
    return d
suffixes = [a + b for a in string.ascii_lowercase for b in string.ascii_lowercase]
for name in files:
    path = os.path.join(out, "files", name)
    size = os.path.getsize(path)
    if size <= room:
        os.rename(path, os.path.join(target(), name))
        room -= size
        continue
    with open(path, "rb") as src:
        part = 0
        while True:
            if room == 0:
                folder, room = folder + 1, rest
            chunk = src.read(room)
            if not chunk:
                break
            with open(os.path.join(target(), "%s.part-%s" % (name, suffixes[part])), "wb") as dst:
                dst.write(chunk)
            room -= len(chunk)
            part += 1
    os.remove(path)
os.rmdir(os.path.join(out, "files"))
EOF
for d in "$out"/t*; do
  echo "$d: $(du -sb "$d" | cut -f1) bytes: $(ls "$d" | tr '\n' ' ')"
done
