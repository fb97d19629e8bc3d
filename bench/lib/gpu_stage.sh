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
