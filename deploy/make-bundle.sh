#!/usr/bin/env bash
# Packs softmax-serve's binaries with the shared libraries they need into a
# relocatable folder and a tarball:
#
#   OUT_DIR/softmax-serve-<version>-linux-<arch>/
#     softmax-server, softmax-client, ...   launchers: set LD_LIBRARY_PATH to
#                                           ./lib (relative to themselves), exec
#     bin/                                  the real executables
#     lib/                                  their non-glibc shared libraries
#     VERSION, LIBRARIES                    what was built, what was packed
#   OUT_DIR/softmax-serve-<version>-linux-<arch>.tar.gz
#
# Usage: deploy/make-bundle.sh BUILD_DIR OUT_DIR
#
# Every executable in BUILD_DIR/bin is packed except unit-test binaries
# (*_test, *_tests). Libraries come from ldd; glibc's own (libc, libm, libpthread,
# libdl, librt, ld-linux, the vDSO) stay with the target system, and so does
# libcuda (the NVIDIA driver's, which must match the kernel module). The
# CUDA runtime (libcudart), gRPC, protobuf, Abseil, prometheus-cpp and
# libstdc++ travel in lib/. The target needs glibc >= the build machine's
# (Debian 12: 2.36) and, for the GPU backend, an NVIDIA driver.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR OUT_DIR" >&2
  exit 2
fi
build_dir=$(readlink -f "$1")
out_dir=$2
source_dir=$(cd "$(dirname "$0")/.." && pwd)

if [[ ! -x "$build_dir/bin/softmax-server" ]]; then
  echo "make-bundle: $build_dir/bin/softmax-server not found; build first (make build)" >&2
  exit 1
fi

version=${SOFTMAX_VERSION:-}
if [[ -z "$version" && -f "$build_dir/CMakeCache.txt" ]]; then
  version=$(sed -n 's/^CMAKE_PROJECT_VERSION:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
fi
version=${version:-0.0.0}
revision=$(git -C "$source_dir" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
arch=$(uname -m)
name="softmax-serve-${version}-linux-${arch}"

mkdir -p "$out_dir"
out_dir=$(readlink -f "$out_dir")
bundle="$out_dir/$name"
rm -rf "$bundle" "$bundle.tar.gz"
mkdir -p "$bundle/bin" "$bundle/lib"

# Libraries that belong to the target system, never to the bundle.
is_system_library() {
  case "$1" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*) return 0 ;;
    libresolv.so*|libutil.so*|libcrypt.so*|libnsl.so*|libanl.so*) return 0 ;;  # glibc too
    libcuda.so*|libnvidia-*) return 0 ;;                                        # the driver
  esac
  return 1
}

binaries=()
for path in "$build_dir"/bin/*; do
  [[ -f "$path" && -x "$path" ]] || continue
  base=$(basename "$path")
  case "$base" in *_test|*_tests) continue ;; esac
  binaries+=("$base")
  cp "$path" "$bundle/bin/$base"
done

declare -A packed=()
for base in "${binaries[@]}"; do
  # "libfoo.so.1 => /usr/lib/.../libfoo.so.1 (0x...)"; fail on "not found".
  while read -r line; do
    [[ "$line" == *" => "* ]] || continue
    soname=${line%% =>*}
    soname=${soname//[[:space:]]/}
    # The driver may be absent on a build machine without a GPU; that is fine.
    is_system_library "$soname" && continue
    if [[ "$line" == *"=> not found"* ]]; then
      echo "make-bundle: $base: unresolved library: $line" >&2
      exit 1
    fi
    target=${line#*=> }
    target=${target%% (*}
    if [[ -z "${packed[$soname]:-}" ]]; then
      cp -L "$target" "$bundle/lib/$soname"
      packed[$soname]=$target
    fi
  done < <(ldd "$build_dir/bin/$base")
done

# Loaded by path (not through ldd) when the HTTP endpoint serves TLS:
# server/rpc/http/civetweb_tls.h.
for path in "$build_dir"/lib/libsoftmax-civetweb-lib*.so; do
  cp "$path" "$bundle/lib/"
  packed[$(basename "$path")]=$path
done

for base in "${binaries[@]}"; do
  cat > "$bundle/$base" <<LAUNCHER
#!/bin/sh
# Runs bin/$base with the libraries packed beside it, wherever this folder is.
here=\$(dirname "\$(readlink -f "\$0")")
LD_LIBRARY_PATH="\$here/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
exec "\$here/bin/$base" "\$@"
LAUNCHER
  chmod 755 "$bundle/$base"
done

{
  echo "softmax-serve $version ($revision) linux-$arch"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
  echo "glibc $(ldd --version | head -1 | awk '{print $NF}') or newer needed"
} > "$bundle/VERSION"
for soname in $(printf '%s\n' "${!packed[@]}" | sort); do
  echo "$soname <- ${packed[$soname]}"
done > "$bundle/LIBRARIES"

# The packed binaries must resolve every library from lib/ or the system.
for base in "${binaries[@]}"; do
  if LD_LIBRARY_PATH="$bundle/lib" ldd "$bundle/bin/$base" | grep "not found" \
      | grep -vq "^[[:space:]]*libcuda\.so"; then
    echo "make-bundle: $base has unresolved libraries inside the bundle" >&2
    exit 1
  fi
done

tar -C "$out_dir" -czf "$bundle.tar.gz" "$name"
echo "make-bundle: $bundle (${#binaries[@]} binaries, ${#packed[@]} libraries)"
echo "make-bundle: $bundle.tar.gz"
