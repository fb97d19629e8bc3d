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
# The server is started by the image's own ENTRYPOINT and CMD (from
# ROOTFS_TAR.json, the image's config): its ports, --device=auto, the
# defaults of every other flag. Then, each a check that must pass:
#   - every EXPOSEd port is one the server listens on; with DEVICE=cuda the
#     CMD's --device=auto picked the GPU (a launch plan, no CPU fallback);
#   - health SERVING once the warm-up is over (the time it took is printed);
#   - every dtype on each shape: softmax-client --check (softmax.v1 gRPC),
#     and softmax-client load --verify over KServe gRPC and KServe HTTP
#     (binary tensors); one KServe HTTP call in JSON from outside the image,
#     checked against a float64 softmax;
#   - /metrics answers with softmax_serving 1 and, on the GPU, NVML's gauges;
#   - SIGTERM while 64 callers are running: exit 0 within the server's
#     grace (--shutdown_grace_s, read off its log), no request left at the
#     grace deadline, and every call answered (OK and verified, or refused
#     UNAVAILABLE after the signal, the retryable refusal).
# The server shares the host's network (docker run --network host): the
# CMD's ports must be free. The libraries the server process has mapped
# are listed with where they came from. Exit 0 only when all of that holds.
#
# Usage: deploy/gpu-image/run-image-rootfs.sh ROOTFS_TAR [WORK_DIR]
#   ROOTFS_TAR  tar (plain, .gz or .xz) of the image's root file system, with
#               ROOTFS_TAR.json beside it (the image's config, `buildah
#               inspect`; trim-rootfs.sh writes one); a ROOTFS_TAR.sha256
#               beside it is checked against the unpacked files first.
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
[[ -f "$tarball.json" ]] || fail "no $(basename "$tarball").json (the image's config) beside the tarball"

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

# --- the server, started by the image's own ENTRYPOINT and CMD ------------------
# In chroot mode the ENTRYPOINT runs as it is (the launcher, which execs
# bin/softmax-server); the loader can start only an ELF binary, so in loader
# mode the launcher's binary gets the CMD's arguments.
mapfile -t command_line < <(python3 -c 'import json, sys
config = json.load(open(sys.argv[1]))["OCIv1"]["config"]
print("\n".join((config.get("Entrypoint") or []) + (config.get("Cmd") or [])))' "$tarball.json")
mapfile -t exposed < <(python3 -c 'import json, sys
config = json.load(open(sys.argv[1]))["OCIv1"]["config"]
print("\n".join(sorted(config.get("ExposedPorts") or {})))' "$tarball.json")
[[ ${#command_line[@]} -gt 0 ]] || fail "the image config names no ENTRYPOINT or CMD"
[[ "${command_line[0]}" == /opt/softmax-serve/softmax-server ]] \
  || fail "the image's ENTRYPOINT is ${command_line[0]}, not /opt/softmax-serve/softmax-server"
say "the image's ENTRYPOINT + CMD: ${command_line[*]}"
say "the image's exposed ports: ${exposed[*]}"

# Files the image's client writes (its --json reports): where it sees them
# and where this script reads them.
if [[ "$mode" == chroot ]]; then
  report_dir=/tmp
  report_host="$root/tmp"
else
  report_dir="$work/reports"
  report_host=$report_dir
fi
mkdir -p "$report_host"
chmod 1777 "$report_host"
client() { "${launch[@]}" "$client_binary" "$@"; }
report_field() {  # report_field FILE EXPRESSION: a field of a client --json report
  python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(eval(sys.argv[2], {"r": r}))' "$report_host/$1" "$2"
}

echo
log="$work/server.log"
say "starting the image's softmax-server as $image_user: ${command_line[*]}"
started=$(date +%s.%N)
"${launch[@]}" "$server_binary" "${command_line[@]:1}" \
  --listening_file="$report_dir/listening.json" > "$log" 2>&1 &
server_pid=$!
for _ in $(seq 1 1200); do
  [[ -s "$report_host/listening.json" ]] && break
  kill -0 "$server_pid" 2> /dev/null || { cat "$log"; fail "the image's server exited"; }
  sleep 0.1
done
[[ -s "$report_host/listening.json" ]] \
  || { cat "$log"; fail "the image's server did not start in 120 s"; }
port_of() { report_field listening.json "r['$1'].rsplit(':', 1)[-1]"; }
grpc_port=$(port_of grpc)
http_port=$(port_of http)
metrics_port=$(port_of metrics)
address=127.0.0.1:$grpc_port
say "listening: grpc port $grpc_port, http port $http_port, metrics port $metrics_port" \
  "($(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}') s after the start)"
failures=0
check() {  # check STATUS WHAT: counts a failure when STATUS is not 0
  if [[ $1 -eq 0 ]]; then say "ok: $2"; else say "FAIL: $2"; failures=$((failures + 1)); fi
}
for port in "${exposed[@]}"; do
  number=${port%/*}
  status=0; [[ " $grpc_port $http_port $metrics_port " == *" $number "* ]] || status=1
  check $status "exposed port $port is one the server listens on"
done
say "server log (start):"
sed 's/^/  | /' "$log"
if [[ "$device" != cpu ]]; then
  status=0; { ! grep -q 'serves on the CPU' "$log" && grep -q 'launch plan: device' "$log"; } || status=1
  check $status "the CMD's --device picked the GPU (a launch plan for a device; no CPU fallback)"
fi

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

# --- health after the warm-up ----------------------------------------------------
echo
health=""
for _ in $(seq 1 900); do
  health=$(client health --target="$address" --timeout_ms=2000 2> /dev/null) && break
  sleep 0.2
done
say "softmax-client health --target=$address: $health" \
  "($(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}') s after the start)"
status=0; [[ "$health" == SERVING ]] || status=1
check $status "health SERVING after the warm-up"

# --- a checked softmax of every dtype: gRPC (softmax.v1, KServe) and HTTP ---------
for dtype in $dtypes; do
  for shape in $shapes; do
    echo
    say "softmax-client --target=$address --shape=$shape --dtype=$dtype --check"
    output=$(client --target="$address" --shape="$shape" --dtype="$dtype" --check 2>&1) \
      && status=0 || status=$?
    sed 's/^/  | /' <<< "$output"
    check "$status" "gRPC softmax.v1 $dtype $shape"
    for protocol in kserve http; do
      case $protocol in
        kserve) target=$address ;;
        http) target=127.0.0.1:$http_port ;;
      esac
      name=$protocol-$dtype-${shape/,/x}.json
      client load --protocol=$protocol --target="$target" --shape="$shape" --dtype="$dtype" \
        --requests=16 --concurrency=4 --connections=2 --warmup=0s --verify --quiet \
        --json="$report_dir/$name" > /dev/null 2>&1 && status=0 || status=$?
      summary=$(report_field "$name" \
        '"%d ok, %d verified, %d mismatches, errors %s" % (r["ok"], r["verified"], r["mismatches"], r["errors_by_code"])' \
        2> /dev/null || echo "no report")
      [[ $status -eq 0 && "$summary" == "16 ok, 16 verified, 0 mismatches, errors {}" ]] || status=1
      check "$status" "softmax-client load --protocol=$protocol --target=$target --shape=$shape --dtype=$dtype --requests=16 --verify: $summary"
    done
  done
done

# And one call over KServe HTTP from outside the image, in JSON, checked here
# against a float64 softmax.
echo
json_check=$(python3 - "127.0.0.1:$http_port" <<'PY' 2>&1
import json, math, random, sys, urllib.request
random.seed(7)
rows, cols = 4, 1000
values = [random.gauss(0, 3) for _ in range(rows * cols)]
body = json.dumps({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [rows, cols],
                               "data": values}]}).encode()
request = urllib.request.Request(f"http://{sys.argv[1]}/v2/models/softmax/infer", data=body,
                                 method="POST", headers={"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=30) as response:
    output = json.loads(response.read())["outputs"][0]
assert output["shape"] == [rows, cols], output["shape"]
worst = 0.0
for r in range(rows):
    row = values[r * cols:(r + 1) * cols]
    top = max(row)
    total = math.fsum(math.exp(v - top) for v in row)
    for c, v in enumerate(row):
        expected = math.exp(v - top) / total
        worst = max(worst, abs(output["data"][r * cols + c] - expected) / max(expected, 1e-30))
print(f"POST /v2/models/softmax/infer (JSON, FP32 {rows}x{cols}): {output['datatype']} "
      f"{output['shape']}, largest relative error {worst:.2e} against float64")
sys.exit(0 if worst < 1e-5 else 1)
PY
) && status=0 || status=$?
check "$status" "$json_check"

# --- metrics -------------------------------------------------------------------------
echo
scrape=$(python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(
    'http://127.0.0.1:$metrics_port/metrics', timeout=10).read().decode())" 2> /dev/null \
  || curl -fsS "http://127.0.0.1:$metrics_port/metrics" || true)
say "/metrics (host-side scrape of 127.0.0.1:$metrics_port), the GPU and serving lines:"
grep -E '^softmax_(gpu_|backend|build_info|serving)' <<< "$scrape" | head -40 | sed 's/^/  | /'
status=0; grep -q '^softmax_serving 1' <<< "$scrape" || status=1
check $status "/metrics answers, softmax_serving 1"
if [[ "$device" != cpu ]]; then
  status=0; grep -q '^softmax_gpu_memory_total_bytes' <<< "$scrape" || status=1
  check $status "/metrics carries NVML's softmax_gpu_memory_total_bytes"
fi

# --- SIGTERM with calls in flight ----------------------------------------------------
# A closed loop of 64 callers is running when SIGTERM arrives: the server
# must answer what it accepted (it refuses new calls UNAVAILABLE from the
# signal on, the retryable refusal), log no request left at its grace
# deadline, and exit 0 within its grace. The callers go on until their 5 s
# are over: once the server is gone their calls fail UNAVAILABLE too
# (connection refused), so only a code other than UNAVAILABLE, a mismatch,
# or the server's own grace warning, is a lost call.
echo
client load --target="$address" --shape=4,1000 --dtype=float32 --concurrency=64 --connections=4 \
  --duration=5s --warmup=0s --verify --quiet --json="$report_dir/drain.json" > /dev/null 2>&1 &
load_pid=$!
sleep 3
say "SIGTERM to the server with softmax-client load (64 callers, --verify) running"
signalled=$(date +%s.%N)
kill -TERM "$server_pid"
server_exit=0
wait "$server_pid" || server_exit=$?
stopped=$(date +%s.%N)
server_pid=""
wait "$load_pid" || true
took=$(awk -v s="$signalled" -v e="$stopped" 'BEGIN {printf "%.2f", e - s}')
grace=$(sed -n 's/^.*SIGTERM received; draining.*grace_s[^0-9]*\([0-9][0-9]*\).*$/\1/p' "$log")
say "server log from the signal on:"
awk '/SIGTERM received/ {f=1} f' "$log" | sed 's/^/  | /'
summary=$(report_field drain.json \
  '"%d ok, %d verified, %d mismatches, errors %s" % (r["ok"], r["verified"], r["mismatches"], r["errors_by_code"])' \
  2> /dev/null || echo "no report")
say "the callers: $summary"
status=0; [[ $server_exit -eq 0 ]] || status=1
check $status "server exit $server_exit on SIGTERM"
status=0; { [[ -n "$grace" ]] && awk -v t="$took" -v g="$grace" 'BEGIN {exit !(t < g)}'; } || status=1
check $status "stopped ${took} s after SIGTERM, within its grace (${grace:-unknown} s)"
status=0; ! grep -q 'still in flight at the grace deadline' "$log" || status=1
check $status "no request left in flight at the grace deadline"
status=0
[[ $(report_field drain.json 'r["mismatches"] == 0 and r["ok"] > 0 and set(r["errors_by_code"]) <= {"UNAVAILABLE"}' \
  2> /dev/null) == True ]] || status=1
check $status "every call answered: each OK and verified, or refused UNAVAILABLE after the signal"

echo
if [[ $failures -eq 0 ]]; then
  say "PASSED: the image's own ENTRYPOINT and CMD ($mode, device $device): ports, health SERVING," \
    "$(wc -w <<< "$dtypes") dtypes x $(wc -w <<< "$shapes") shapes checked over gRPC (softmax.v1," \
    "KServe) and HTTP, /metrics, SIGTERM drained"
else
  say "FAILED: $failures check(s)"
  exit 1
fi
