# shellcheck shell=bash
# Staging for the GPU machine, which has no package index and takes one
# transfer of 64 MiB: the functions every bench/*/stage.sh (here, where pip
# reaches PyPI) and bench/*/run_h200.sh (there) share. Source it:
#
#   . "$(dirname "$0")/../lib/gpu_stage.sh"
#
# A STAGE folder holds bundle.tar.xz (the `make gpu-bundle` bundle, debug
# info stripped) and the wheels, either as wheels/*.whl or, unpacked so that
# xz compresses their contents, as wheels.tar.xz. The GPU machine's Python is
# CPython 3.12 on x86-64 Linux; its own OpenSSL 3 and libstdc++ serve.
# Functions print what they staged or installed; on failure they return
# non-zero (the callers' `set -e` or checks decide what follows).

gpu_stage_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# gpu_stage_bundle STAGE BUILD_DIR WORK "TOP ITEMS" "BIN ITEMS"
# Builds `make gpu-bundle` from BUILD_DIR and writes STAGE/bundle.tar.xz
# with the bundle's TOP ITEMS (e.g. "softmax-server softmax-client VERSION
# LIBRARIES lib") and bin/ BIN ITEMS, less the OpenSSL and libstdc++ the
# machine has, debug info stripped. WORK: a scratch folder of the caller's.
gpu_stage_bundle() {
  local stage=$1 build_dir=$2 work=$3 top=$4 bin=$5 bundle name item
  make -C "$gpu_stage_root" gpu-bundle BUILD_DIR="$build_dir" > "$work/bundle.log" 2>&1 \
    || { tail -20 "$work/bundle.log"; return 1; }
  bundle=$(ls -d "$gpu_stage_root"/dist/softmax-serve-*-linux-* | grep -v 'tar.gz$' | head -1)
  name=$(basename "$bundle")
  mkdir -p "$work/b/$name/bin"
  for item in $top; do cp -a "$bundle/$item" "$work/b/$name/"; done
  for item in $bin; do cp -a "$bundle/bin/$item" "$work/b/$name/bin/"; done
  rm -f "$work/b/$name"/lib/{libssl.so.3,libcrypto.so.3,libstdc++.so.6}
  strip --strip-debug "$work/b/$name"/bin/* "$work/b/$name"/lib/*.so* 2>/dev/null || true
  tar -C "$work/b" -cf - "$name" | xz -T2 -9 > "$stage/bundle.tar.xz"
  echo "bundle: $name, $(stat -c %s "$stage/bundle.tar.xz") bytes"
}

# gpu_stage_platforms N... : pip download's --platform arguments for
# manylinux_2_N (newest first), manylinux2014 and manylinux1, one a line.
gpu_stage_platforms() {
  local n
  for n in "$@"; do printf -- '--platform\nmanylinux_2_%s_x86_64\n' "$n"; done
  printf -- '--platform\nmanylinux2014_x86_64\n--platform\nmanylinux1_x86_64\n'
}

# gpu_stage_download_wheels DEST PLATFORM_ARGS PACKAGE...
# The binary wheels of PACKAGE... and their dependencies for the machine's
# CPython 3.12 into DEST; PLATFORM_ARGS: gpu_stage_platforms' output, plus
# any more --platform lines.
gpu_stage_download_wheels() {
  local dest=$1 platforms=()
  mapfile -t platforms <<< "$2"
  shift 2
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$dest" "$@"
}

# gpu_stage_unpack_wheels WHEELS WORK "SKIPPED"
# Every WHEELS/*.whl unpacked (unzip keeps the executable bits) into
# WORK/w/NAME, but those whose distribution name is in SKIPPED; the caller
# may prune or add there before gpu_stage_tar_wheels packs WORK/w.
gpu_stage_unpack_wheels() {
  local wheels=$1 work=$2 skipped=$3 w base d
  mkdir -p "$work/w"
  for w in "$wheels"/*.whl; do
    base=$(basename "$w"); [[ " $skipped " == *" ${base%%-*} "* ]] && continue
    d="$work/w/$(basename "$w" .whl)"
    mkdir -p "$d" && unzip -q "$w" -d "$d"
  done
}

# gpu_stage_tar_wheels STAGE WORK : STAGE/wheels.tar.xz from WORK/w.
gpu_stage_tar_wheels() {
  tar -C "$2/w" -cf - . | xz -T2 -9 > "$1/wheels.tar.xz"
}

# gpu_stage_unpack_bundle STAGE WORK : unpacks STAGE/bundle.tar.xz into WORK
# and prints the bundle's folder.
gpu_stage_unpack_bundle() {
  tar -C "$2" -xJf "$1/bundle.tar.xz" || return 1
  ls -d "$2"/softmax-serve-*
}

# gpu_stage_rezip_wheels UNPACKED DEST SKIP_PREFIX
# Each folder of UNPACKED (wheels.tar.xz unpacked) zipped again as
# DEST/NAME.whl (stored: only pip reads it), modes kept; folders whose name
# starts with SKIP_PREFIX (run from where they lie) are left out.
gpu_stage_rezip_wheels() {
  python3 - "$1" "$2" "$3" <<'EOF'
import os, sys, zipfile
src, dst, skip = sys.argv[1:]
for name in sorted(os.listdir(src)):
    if skip and name.startswith(skip):
        continue
    top = os.path.join(src, name)
    with zipfile.ZipFile(os.path.join(dst, name + ".whl"), "w", zipfile.ZIP_STORED) as z:
        for folder, _, files in os.walk(top):
            for f in files:
                path = os.path.join(folder, f)
                z.write(path, os.path.relpath(path, top))
EOF
}

# gpu_stage_pip_install LOG PIP_ARGS... WHEEL...
# pip install --no-index --no-deps of the wheels, output to LOG; on a
# distribution's Python (PEP 668, "externally-managed") once more with
# --break-system-packages: the machine is lent and handed back. Returns pip's
# exit code.
gpu_stage_pip_install() {
  local log=$1 rc
  shift
  python3 -m pip install -q --no-index --no-deps "$@" > "$log" 2>&1
  rc=$?
  if [[ $rc -ne 0 ]] && grep -q externally-managed "$log"; then
    python3 -m pip install -q --no-index --no-deps --break-system-packages "$@" >> "$log" 2>&1
    rc=$?
  fi
  return "$rc"
}

# --- Wheels over one transfer: packed here into transfer folders, joined and
# unpacked there (kernels/bench/stage_peers.sh and run_h200.sh).

# gpu_stage_repack_wheel WHEEL DEST_DIR WORK [KEEP_PY]
# WHEEL unpacked and recompressed as DEST_DIR/NAME.tar.xz (an unpacked
# wheel's contents compress better than its zip: the CuTe DSL compiler, 87 MiB
# as a wheel, is 61 MiB so); KEEP_PY, a Python expression in the archive path
# f, keeps only the files for which it is true. Removes WHEEL.
gpu_stage_repack_wheel() {
  local wheel=$1 dest=$2 work=$3 keep=${4:-True} name
  name=$(basename "$wheel" .whl)
  python3 - "$wheel" "$work/$name" "$keep" <<'PY'
import sys, zipfile
wheel, dest, keep = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [i for i in z.infolist()
                        if not i.is_dir() and eval(keep, {"f": i.filename})])
PY
  tar -C "$work/$name" -cf - . | xz -T2 -9 > "$dest/$name.tar.xz"
  rm -rf "$work/$name" "$wheel"
  echo "repacked $name: $(stat -c %s "$dest/$name.tar.xz") bytes"
}

# gpu_stage_split_transfers FILES OUT FIRST_KIB REST_KIB
# Moves every file of FILES (smallest first) into transfer folders OUT/t1,
# OUT/t2, ...: t1 holds FIRST_KIB (room for what travels beside it), each
# later one REST_KIB; a file that does not fit is split into NAME.part-aa,
# -ab, ... across them (gpu_stage_join_parts joins them). Removes FILES.
gpu_stage_split_transfers() {
  python3 - "$@" <<'PY'
import os, string, sys
files_dir, out, first, rest = sys.argv[1], sys.argv[2], int(sys.argv[3]) * 1024, int(sys.argv[4]) * 1024
files = sorted(os.listdir(files_dir), key=lambda f: os.path.getsize(os.path.join(files_dir, f)))
folder, room = 1, first
def target():
    d = os.path.join(out, "t%d" % folder)
    os.makedirs(d, exist_ok=True)
    return d
suffixes = [a + b for a in string.ascii_lowercase for b in string.ascii_lowercase]
for name in files:
    path = os.path.join(files_dir, name)
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
os.rmdir(files_dir)
PY
  local d
  for d in "$2"/t*; do
    echo "$d: $(du -sb "$d" | cut -f1) bytes: $(ls "$d" | tr '\n' ' ')"
  done
}

# gpu_stage_join_parts JOIN DIR... : copies every file of the transfer
# folders DIR... into JOIN and joins NAME.part-* files into NAME.
gpu_stage_join_parts() {
  local join=$1 d base
  shift
  rm -rf "$join" && mkdir -p "$join"
  for d in "$@"; do cp "$d"/* "$join"/ 2> /dev/null; done
  for base in $(ls "$join" | grep '\.part-' | sed 's/\.part-.*$//' | sort -u); do
    cat "$join/$base".part-* > "$join/$base" && rm -f "$join/$base".part-*
    echo "joined $base"
  done
}

# gpu_stage_unpack_into SITE JOIN : every JOIN/*.whl and *.tar.xz (a
# repacked wheel) unpacked into SITE, a folder for PYTHONPATH (offline, no
# dependency resolution: the machine's own torch, triton and numpy serve).
gpu_stage_unpack_into() {
  local site=$1 join=$2 f
  mkdir -p "$site"
  for f in "$join"/*.whl; do
    [[ -e $f ]] && { python3 -m zipfile -e "$f" "$site" || echo "WARNING: cannot unpack $f"; }
  done
  for f in "$join"/*.tar.xz; do
    [[ -e $f ]] && { python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$f" "$site" || echo "WARNING: cannot unpack $f"; }
  done
}
