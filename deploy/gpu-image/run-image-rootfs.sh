#!/usr/bin/env bash
# Runs the container image's own softmax-server and softmax-client on a GPU
# host where no container engine runs, the way the NVIDIA container runtime
# would: the image's root file system (from `IMAGE_EXPORT_DIR=...
# deploy/image-check.sh`, whole or trimmed by trim-rootfs.sh) is unpacked, the
# host's driver libraries (libcuda.so.1, libnvidia-ml.so.1 and the compute
# libraries beside them, found with `ldconfig -p`) and the /dev/nvidia* nodes
# are made visible to it, and the image's binaries run with the image's own
# loader, glibc and bundled libraries as its numeric user 10001.
#
#   MODE=chroot (the default where mounts work): the driver libraries are
#     copied into the image's /usr/lib/x86_64-linux-gnu and the image's own
#     ldconfig refreshes its cache (the runtime's bind mounts and its
#     update-ldcache hook); /dev gets a tmpfs with the standard nodes and the
#     /dev/nvidia* nodes bound in, /proc and /sys (read-only) are mounted;
#     then `chroot --userspec=10001:10001` starts the image's
#     /opt/softmax-serve/softmax-server launcher (its ENTRYPOINT) and
#     softmax-client, with the image's environment (NVIDIA_* variables).
#   MODE=loader: nothing is mounted; each binary is started by the image's
#     loader (ROOTFS/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
#     --library-path ROOTFS/opt/softmax-serve/lib:ROOTFS/usr/lib/...:DRIVER),
#     DRIVER being a folder of links to the host's driver libraries only.
#   MODE=auto (default): chroot when this process may mount, else loader.
#
# The server runs with --device=cuda (exits 1 when the GPU is unusable, never
# falls back to the CPU); then health must be SERVING, every dtype must pass
# softmax-client --check on each shape, and the server's /metrics must carry
# the NVML gauges of the GPU. The libraries the server process has mapped are
# listed with where they came from. Exit 0 only when all of that holds.
#
# Usage: deploy/gpu-image/run-image-rootfs.sh ROOTFS_TAR [WORK_DIR]
#   ROOTFS_TAR  tar (plain, .gz or .xz) of the image's root file system; a
#               ROOTFS_TAR.sha256 beside it (trim-rootfs.sh writes one) is
#               checked against the unpacked files first.
#   WORK_DIR    where it is unpacked (default: a temporary folder, removed).
# Environment: MODE (auto), SHAPES ("4,1000 64,32000 8,131072"),
#   DTYPES ("float32 float16 bfloat16"), IMAGE_USER (10001:10001),
#   DEVICE (cuda; cpu runs the same steps without the driver, to try this
#   script on a machine with no GPU).
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 ROOTFS_TAR [WORK_DIR]" >&2
  exit 2
fi
tarball=$(readlink -f "$1")
mode=${MODE:-auto}
shapes=${SHAPES:-"4,1000 64,32000 8,131072"}
dtypes=${DTYPES:-"float32 float16 bfloat16"}
image_user=${IMAGE_USER:-10001:10001}
device=${DEVICE:-cuda}
if [[ $# -eq 2 ]]; then
  work=$(mkdir -p "$2" && cd "$2" && pwd)
  keep_work=1
else
  work=$(mktemp -d /tmp/softmax-image.XXXXXX)
  keep_work=0
fi
root="$work/rootfs"
arch_lib=usr/lib/x86_64-linux-gnu

say() { echo "run-image: $*"; }
fail() { echo "run-image: FAILED: $*" >&2; exit 1; }

mounts=()
server_pid=""
declare -A from_host=()  # a driver library copied into the image -> the host's file
cleanup() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2> /dev/null; then
    kill -KILL "$server_pid" 2> /dev/null || true
  fi
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount -l "${mounts[$i]}" 2> /dev/null || true
  done
  if [[ $keep_work -eq 0 ]]; then
    rm -rf "$work"
  fi
}
trap cleanup EXIT

# --- the image's file system --------------------------------------------------
rm -rf "$root"
mkdir -p "$root"
tar -C "$root" --numeric-owner -xf "$tarball"
say "unpacked $(basename "$tarball") ($(du -sm "$root" | cut -f1) MiB, $(find "$root" -type f | wc -l) files) into $root"
if [[ -f "$tarball.sha256" ]]; then
  (cd "$root" && sha256sum --quiet -c "$tarball.sha256") \
    || fail "the unpacked files differ from $(basename "$tarball").sha256"
  say "every file matches $(basename "$tarball").sha256 ($(wc -l < "$tarball.sha256") files, written from the exported image)"
fi
[[ -x "$root/opt/softmax-serve/bin/softmax-server" ]] || fail "no /opt/softmax-serve/bin/softmax-server in the image"
say "image: $(. "$root/etc/os-release" && echo "$PRETTY_NAME"), $(head -1 "$root/opt/softmax-serve/VERSION")"
(cd "$root/opt/softmax-serve/bin" && sha256sum softmax-server softmax-client | sed 's/^/run-image: sha256 /')

# Resolves a path inside the image, following its links there (an absolute
# link points into the image, never to the host).
resolve_in_image() {
  local path=$1 hops=0 target
  while [[ -L "$root$path" ]]; do
    target=$(readlink "$root$path")
    if [[ "$target" == /* ]]; then path=$target; else path=$(dirname "$path")/$target; fi
    path=$(realpath -m -s "$path")
    ((++hops < 40)) || fail "link loop at $1"
  done
  # Directory links along the way (usr-merged /lib -> usr/lib).
  local dir base
  dir=$(dirname "$path")
  base=$(basename "$path")
  if [[ "$dir" != / ]]; then
    dir=$(resolve_in_image "$dir")
  fi
  echo "${dir%/}/$base"
}

# --- the host's driver: what the runtime mounts for compute,utility -----------
echo
say "host: $(uname -sr), $(. /etc/os-release 2> /dev/null && echo "$PRETTY_NAME")"
driver_libraries=()
devices=()
if [[ "$device" != cpu ]]; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap,pci.bus_id --format=csv,noheader \
    | sed 's/^/run-image: nvidia-smi: /' || fail "nvidia-smi"
  nvidia-smi -L | sed 's/^/run-image: nvidia-smi -L: /'
  # ldconfig's cache first (what the runtime's library search reads), then
  # LD_LIBRARY_PATH and the usual driver folders of GPU containers and VMs.
  host_library() {
    local found dir
    found=$(ldconfig -p | awk -v name="$1" '$1 == name && /x86-64/ {print $NF; exit}')
    if [[ -z "$found" ]]; then
      for dir in ${LD_LIBRARY_PATH//:/ } /usr/local/nvidia/lib64 /usr/local/nvidia/lib \
          /usr/lib/x86_64-linux-gnu /usr/lib64; do
        [[ -e "$dir/$1" ]] && { found="$dir/$1 (not in ldconfig -p)"; break; }
      done
    fi
    echo "$found"
  }
  for soname in libcuda.so.1 libnvidia-ml.so.1 libnvidia-ptxjitcompiler.so.1 libnvidia-nvvm.so.4; do
    path=$(host_library "$soname")
    if [[ -z "$path" ]]; then
      case "$soname" in
        libcuda.so.1|libnvidia-ml.so.1) fail "ldconfig -p lists no $soname on this host" ;;
        *) continue ;;
      esac
    fi
    say "driver library: $soname => $path -> $(readlink -f "${path%% (*}")"
    driver_libraries+=("${path%% (*}")
  done
  devices=(/dev/nvidia*)
  [[ -e "${devices[0]}" ]] || fail "no /dev/nvidia* nodes on this host"
  say "device nodes: ${devices[*]}"
fi

# --- how the image's binaries are started --------------------------------------
mount_probe=$(mktemp -d /tmp/softmax-image-probe.XXXXXX)
if [[ "$mode" == auto ]]; then
  if mount -t tmpfs -o size=1m none "$mount_probe" 2> /dev/null; then
    umount "$mount_probe"
    mode=chroot
  else
    mode=loader
  fi
fi
rmdir "$mount_probe"
say "mode: $mode"

# The image's environment (its config's Env where ROOTFS_TAR.json, from
# `buildah inspect`, lies beside the tarball).
# shellcheck disable=SC2054
image_env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
  "NVIDIA_REQUIRE_CUDA=cuda>=13.0")
if [[ -f "$tarball.json" ]]; then
  mapfile -t image_env < <(python3 -c 'import json, sys
config = json.load(open(sys.argv[1]))
print("\n".join(config["OCIv1"]["config"]["Env"]))' "$tarball.json")
fi
image_env+=(HOME=/)
say "environment: ${image_env[*]}"

# launch: what starts an image binary; env, chroot, the launcher and setpriv
# each exec the next, so the server's pid is the one started here.
case "$mode" in
  chroot)
    bind() {  # bind SOURCE TARGET [ro]
      mount --bind "$1" "$2"
      mounts+=("$2")
      if [[ "${3:-}" == ro ]]; then mount -o remount,bind,ro "$2" || say "$2 stays read-write"; fi
    }
    for path in "${driver_libraries[@]}"; do
      soname=$(basename "$path")
      cp -L "$path" "$root/$arch_lib/$soname"
      chmod 0755 "$root/$arch_lib/$soname"
      from_host["/$arch_lib/$soname"]=$(readlink -f "$path")
    done
    [[ ${#driver_libraries[@]} -gt 0 ]] && ln -sf libcuda.so.1 "$root/$arch_lib/libcuda.so"
    if [[ -x "$root/sbin/ldconfig" || -x "$root/usr/sbin/ldconfig" ]]; then
      chroot "$root" /sbin/ldconfig
      say "the image's ldconfig now finds: $(chroot "$root" /sbin/ldconfig -p \
        | awk '/libcuda.so.1 |libnvidia-ml.so.1 /{printf "%s => %s  ", $1, $NF}')"
    fi
    mkdir -p "$root/dev" "$root/proc" "$root/sys"
    mount -t tmpfs -o mode=755,size=64k,nosuid tmpfs "$root/dev"
    mounts+=("$root/dev")
    for node in null zero full random urandom tty "${devices[@]#/dev/}"; do
      [[ -e "/dev/$node" ]] || continue
      if [[ -d "/dev/$node" ]]; then
        mkdir -p "$root/dev/$node"
      else
        touch "$root/dev/$node"
      fi
      bind "/dev/$node" "$root/dev/$node"
    done
    mkdir -p "$root/dev/shm"
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
    mounts+=("$root/dev/shm")
    mount -t proc proc "$root/proc" 2> /dev/null || bind /proc "$root/proc"
    mounts+=("$root/proc")
    bind /sys "$root/sys" ro
    launch=(env -i "${image_env[@]}" chroot --userspec="$image_user" "$root")
    server_binary=/opt/softmax-serve/softmax-server
    client_binary=/opt/softmax-serve/softmax-client
    ;;
  loader)
    loader="$root$(resolve_in_image /lib64/ld-linux-x86-64.so.2)"
    [[ -f "$loader" ]] || fail "the image has no loader at /lib64/ld-linux-x86-64.so.2"
    driver_dir="$work/driver"
    rm -rf "$driver_dir"
    mkdir -p "$driver_dir"
    for path in "${driver_libraries[@]}"; do
      ln -s "$(readlink -f "$path")" "$driver_dir/$(basename "$path")"
    done
    library_path="$root/opt/softmax-serve/lib"
    for dir in /$arch_lib /lib/x86_64-linux-gnu; do
      dir="$root$(resolve_in_image "$dir")"
      [[ ":$library_path:" == *":$dir:"* ]] || library_path+=":$dir"
    done
    library_path+=":$driver_dir"
    say "loader: $loader"
    say "library path: $library_path"
    # The image's user, as the runtime starts it (USER 10001:10001).
    as_user=()
    if [[ $(id -u) -eq 0 ]] && command -v setpriv > /dev/null; then
      as_user=(setpriv --reuid="${image_user%%:*}" --regid="${image_user##*:}" --clear-groups)
    fi
    chmod 755 "$work"
    launch=(env -i "${image_env[@]}" "${as_user[@]}" "$loader" --library-path "$library_path")
    server_binary="$root/opt/softmax-serve/bin/softmax-server"
    client_binary="$root/opt/softmax-serve/bin/softmax-client"
    ;;
  *) fail "MODE must be auto, chroot or loader, not '$mode'" ;;
esac

# --- the server on the GPU -------------------------------------------------------
echo
log="$work/server.log"
say "starting the image's softmax-server --device=$device as $image_user"
"${launch[@]}" "$server_binary" --device="$device" --grpc_address=127.0.0.1:0 --http_address= \
  --metrics_address=127.0.0.1:0 > "$log" 2>&1 &
server_pid=$!
address=""
for _ in $(seq 1 1200); do
  address=$(sed -n 's/^.* softmax-server: listening grpc=\([^ ]*\) .*$/\1/p' "$log")
  [[ -n "$address" ]] && break
  kill -0 "$server_pid" 2> /dev/null || { cat "$log"; fail "the image's server exited"; }
  sleep 0.1
done
[[ -n "$address" ]] || { cat "$log"; fail "the image's server did not start in 120 s"; }
metrics=$(sed -n 's/^.* softmax-server: listening .* metrics=\([^ ]*\).*$/\1/p' "$log")
say "server log (start):"
sed 's/^/  | /' "$log"

echo
say "the serving process: pid $server_pid, uid $(stat -c %u "/proc/$server_pid"), $(tr '\0' ' ' < "/proc/$server_pid/cmdline")"
say "objects it has mapped (image: a file of the image; host: the host's driver, copied in or linked):"
awk '$6 ~ /\.so|softmax-server/ {print $6}' "/proc/$server_pid/maps" | sort -u > "$work/maps"
bundled=$(grep -c "^$root/opt/softmax-serve/lib/" "$work/maps" || true)
grep -v "^$root/opt/softmax-serve/lib/" "$work/maps" | while read -r object; do
  case "$object" in
    "$root"/*)
      inside=${object#"$root"}
      if [[ -n "${from_host[$inside]:-}" ]]; then
        echo "  host   $inside (the host's ${from_host[$inside]}, copied in)"
      else
        echo "  image  $inside"
      fi
      ;;
    *) echo "  host   $object" ;;
  esac
done
echo "  image  /opt/softmax-serve/lib/: $bundled bundled libraries (gRPC, protobuf, Abseil, OpenSSL, libstdc++, ...)"

echo
failures=0
health=$("${launch[@]}" "$client_binary" health --target="$address" --timeout_ms=10000) || true
say "softmax-client health --target=$address: $health"
[[ "$health" == SERVING ]] || { failures=$((failures + 1)); say "health is not SERVING"; }

for dtype in $dtypes; do
  for shape in $shapes; do
    echo
    say "softmax-client --target=$address --shape=$shape --dtype=$dtype --check"
    output=$("${launch[@]}" "$client_binary" --target="$address" --shape="$shape" --dtype="$dtype" --check 2>&1) \
      && status=0 || status=$?
    sed 's/^/  | /' <<< "$output"
    if [[ $status -eq 0 ]]; then
      say "PASS $dtype $shape"
    else
      say "FAIL $dtype $shape (exit $status)"
      failures=$((failures + 1))
    fi
  done
done

echo
if [[ -n "$metrics" ]]; then
  scrape=$(python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(
      'http://$metrics/metrics', timeout=10).read().decode())" 2> /dev/null \
    || curl -fsS "http://$metrics/metrics" || true)
  say "/metrics (host-side scrape of $metrics), the GPU lines:"
  grep -E '^softmax_(gpu_|backend|build_info)' <<< "$scrape" | head -40 | sed 's/^/  | /'
  [[ "$device" == cpu ]] || grep -q '^softmax_gpu_memory_total_bytes' <<< "$scrape" \
    || { failures=$((failures + 1)); say "no softmax_gpu_memory_total_bytes: NVML not loaded"; }
fi

echo
kill -TERM "$server_pid" 2> /dev/null || true
server_exit=0
wait "$server_pid" || server_exit=$?
server_pid=""
say "server stopped on SIGTERM, exit $server_exit; its log after start:"
awk 'f; /listening grpc=/ {f=1}' "$log" | tail -20 | sed 's/^/  | /'

echo
if [[ $failures -eq 0 ]]; then
  say "PASSED: the image's softmax-server on --device=$device ($mode), health SERVING," \
    "$(wc -w <<< "$dtypes") dtypes x $(wc -w <<< "$shapes") shapes checked"
else
  say "FAILED: $failures check(s)"
  exit 1
fi
