#!/usr/bin/env bash
# Cuts the runtime image's exported root file system down to the image's
# payload and the files of the image that its binaries load, so that it can
# travel where transfers are small (run-image-rootfs.sh runs it there).
#
# Kept, every file unchanged from the image (links kept as links, with what
# they point to inside the image, and every parent folder with its mode):
#   - /opt/softmax-serve whole (the release bundle: launchers, bin/, lib/),
#     and the /usr/local/bin links to its launchers;
#   - every file the image's processes opened or executed in a CPU run here:
#     chroot --userspec=10001:10001 into the whole image, the launcher
#     (/bin/sh, dirname, readlink), softmax-server --device=cpu, and
#     softmax-client health, --check of every dtype and load --verify of
#     every dtype over KServe gRPC and HTTP, traced with strace (files
#     opened after the chroot only);
#   - what the image's loader lists for both binaries (ld.so --list), and
#     what the kernel loads at execve: /bin/sh and the loader;
#   - the image's glibc shared libraries (package libc6): the host's driver
#     libraries load theirs (libdl, libpthread, librt, ...) from the image;
#   - what the NVIDIA container runtime's own steps use in the image: its
#     ldconfig with /etc/ld.so.conf*, /etc/ld.so.cache (the update-ldcache
#     hook), /etc/passwd and /etc/group (the numeric user), /etc/os-release;
#   - the empty mount points /dev, /proc, /sys, /tmp.
# Then the trimmed tree is run on the CPU here the same way (run-image-rootfs.sh
# with DEVICE=cpu MODE=chroot), so that nothing it needs was left out.
#
# Usage: deploy/gpu-image/trim-rootfs.sh EXPORT_DIR OUT.tar.xz
#   EXPORT_DIR  IMAGE_EXPORT_DIR of image-check.sh (softmax-serve-rootfs.tar,
#               softmax-serve-image.json)
#   writes OUT.tar.xz, OUT.tar.xz.sha256 (every regular file's sha256, as in
#   the exported image) and OUT.tar.xz.json (the image's config).
# Needs root (chroot), strace, python3 and xz.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 EXPORT_DIR OUT.tar.xz" >&2
  exit 2
fi
export_dir=$(readlink -f "$1")
out=$(readlink -f "$2")
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../scripts/listening.sh"
[[ -f "$export_dir/softmax-serve-rootfs.tar" ]] || { echo "no $export_dir/softmax-serve-rootfs.tar" >&2; exit 1; }
for tool in strace python3 xz chroot; do
  command -v "$tool" > /dev/null || { echo "trim-rootfs: $tool is needed" >&2; exit 1; }
done

work=$(mktemp -d /tmp/softmax-trim.XXXXXX)
mounts=()
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]]; then kill -KILL "$server_pid" 2> /dev/null || true; fi
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}" 2> /dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
say() { echo "trim-rootfs: $*"; }

full="$work/full"
mkdir -p "$full"
tar -C "$full" --numeric-owner -xf "$export_dir/softmax-serve-rootfs.tar"
say "the exported image: $(du -sm "$full" | cut -f1) MiB, $(find "$full" -type f | wc -l) files"

# --- what the image's processes open, on the CPU, in the whole image ----------------
for node in null zero urandom random; do
  touch "$full/dev/$node"
  mount --bind "/dev/$node" "$full/dev/$node"
  mounts+=("$full/dev/$node")
done
mount -t proc proc "$full/proc"
mounts+=("$full/proc")
# shellcheck disable=SC2054
tracer=(strace -f -qq -e trace=chroot,execve,open,openat,openat2 -e status=successful)
traced() {  # traced LOG COMMAND...: files opened or executed after the chroot
  "${tracer[@]}" -o "$1" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/ \
    chroot --userspec=10001:10001 "$full" "${@:2}"
}
"${tracer[@]}" -o "$work/trace-server" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/ chroot --userspec=10001:10001 "$full" /opt/softmax-serve/softmax-server --device=cpu \
  --grpc_address=127.0.0.1:0 --http_address=127.0.0.1:0 --metrics_address=127.0.0.1:0 \
  --listening_file=/tmp/trim-listening.json > "$work/server.log" 2>&1 &
strace_pid=$!
wait_for_listening "$full/tmp/trim-listening.json" "$strace_pid" 60 \
  || { cat "$work/server.log"; echo "trim-rootfs: the server did not start" >&2; exit 1; }
address=$(listening_address "$full/tmp/trim-listening.json" grpc)
# env, chroot and the launcher exec each other: strace's one child is the server.
server_pid=$(pgrep -P "$strace_pid")
traced "$work/trace-health" /opt/softmax-serve/softmax-client health --target="$address"
http_address=$(listening_address "$full/tmp/trim-listening.json" http)
for dtype in float32 float16 bfloat16; do
  traced "$work/trace-$dtype" /opt/softmax-serve/softmax-client --target="$address" \
    --shape=4,1000 --dtype="$dtype" --check > /dev/null
  # run-image-rootfs.sh's checks over KServe gRPC and HTTP, with reports.
  traced "$work/trace-kserve-$dtype" /opt/softmax-serve/softmax-client load --protocol=kserve \
    --target="$address" --shape=4,1000 --dtype="$dtype" --requests=4 --warmup=0s --verify \
    --quiet --json=/tmp/trim-kserve.json > /dev/null
  traced "$work/trace-http-$dtype" /opt/softmax-serve/softmax-client load --protocol=http \
    --target="$http_address" --shape=4,1000 --dtype="$dtype" --requests=4 --warmup=0s --verify \
    --quiet --json=/tmp/trim-http.json > /dev/null
done
rm -f "$full/tmp/trim-kserve.json" "$full/tmp/trim-http.json"
# And the launchers' own commands, through the links in /usr/local/bin.
traced "$work/trace-version" /usr/local/bin/softmax-server --version > /dev/null
kill -TERM "$server_pid"
wait "$strace_pid" || true
server_pid=""
for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}"; done
mounts=()

{
  # Paths the traced processes opened, from each trace's first chroot on.
  for trace in "$work"/trace-*; do
    awk '/ chroot\(/ {inside = 1; next} inside' "$trace" \
      | sed -nE 's/^[0-9]+ +(execve|open|openat|openat2)\((AT_FDCWD, )?"([^"]+)".*/\3/p'
  done
  # The loader's list for both binaries, with the bundle's lib/ as the launcher sets it.
  for binary in softmax-server softmax-client; do
    env -i LD_LIBRARY_PATH=/opt/softmax-serve/lib "$(command -v chroot)" "$full" /lib64/ld-linux-x86-64.so.2 \
      --list "/opt/softmax-serve/bin/$binary" | sed -nE 's/.*=> (\/[^ ]+) .*/\1/p; s/^\s*(\/[^ ]+) \(.*/\1/p'
  done
  # What the kernel itself loads at execve (no open call to trace): the
  # launchers' interpreter and the binaries' loader.
  printf '%s\n' /bin/sh /lib64/ld-linux-x86-64.so.2
  (cd "$full" && find opt/softmax-serve usr/local/bin -mindepth 0 -printf '/%p\n')
  printf '%s\n' /sbin/ldconfig /etc/ld.so.conf /etc/ld.so.cache /etc/passwd /etc/group \
    /etc/os-release /dev /proc /sys /tmp
  (cd "$full" && find etc/ld.so.conf.d -printf '/%p\n')
  # The image's glibc (package libc6): the driver libraries the runtime adds
  # load theirs (libdl, libpthread, librt, ...) from the image.
  grep -E '/x86_64-linux-gnu/lib[^/]*\.so[^/]*$' "$full/var/lib/dpkg/info/libc6:amd64.list"
} | grep -vE '^/(proc|sys|dev)/' | sort -u > "$work/wanted"
say "$(wc -l < "$work/wanted") paths opened, listed or needed by the runtime's steps"

# Every path with the links along it (resolved inside the image) and its parents.
python3 - "$full" "$work/wanted" > "$work/keep" <<'PY'
import os, sys
root, wanted = sys.argv[1], sys.argv[2]
keep = set()

def add(path, depth=0):
    """Adds path (absolute, inside the image), every link on the way to what
    it names, and every parent folder."""
    if depth > 40:
        raise SystemExit(f"link loop at {path}")
    parts = [p for p in path.split("/") if p]
    current = ""
    for i, part in enumerate(parts):
        current = current + "/" + part
        host = root + current
        if not os.path.lexists(host):
            return
        keep.add(current)
        if os.path.islink(host):
            target = os.readlink(host)
            base = "/" if target.startswith("/") else os.path.dirname(current)
            resolved = os.path.normpath(os.path.join(base, target))
            rest = "/".join(parts[i + 1:])
            add(resolved + ("/" + rest if rest else ""), depth + 1)
            return

for line in open(wanted):
    path = line.strip()
    if path:
        add(os.path.normpath(path))
# A kept folder brings only itself (tar --no-recursion): its files are listed.
for path in sorted(keep):
    print(path.lstrip("/"))
PY
trimmed="$work/trimmed"
mkdir -p "$trimmed"
tar -C "$full" --numeric-owner --no-recursion -cf - -T "$work/keep" | tar -C "$trimmed" --numeric-owner -xpf -
say "kept $(find "$trimmed" -type f | wc -l) files, $(find "$trimmed" -type l | wc -l) links: $(du -sm "$trimmed" | cut -f1) MiB"
(cd "$trimmed" && find . -type f -printf '%P\n' | sort | xargs -d '\n' sha256sum) > "$work/manifest"
(cd "$full" && sha256sum --quiet -c "$work/manifest") || { echo "trim-rootfs: kept files differ from the image" >&2; exit 1; }

echo "--- kept files (from the image, unchanged) ---"
(cd "$trimmed" && find . \( -type f -o -type l \) -printf '%P\n' | sort)
echo "---"

mkdir -p "$(dirname "$out")"
tar -C "$trimmed" --numeric-owner --sort=name -cf - . | xz -T0 -9 > "$out"
cp "$work/manifest" "$out.sha256"
cp "$export_dir/softmax-serve-image.json" "$out.json"
say "wrote $out ($(du -m "$out" | cut -f1) MiB), $out.sha256, $out.json"

# The trimmed tree must run on its own: the same steps, on the CPU.
say "running the trimmed image on the CPU"
DEVICE=cpu MODE=chroot SHAPES="4,1000" "$here/run-image-rootfs.sh" "$out" > "$work/cpu-run.txt" 2>&1 \
  || { cat "$work/cpu-run.txt"; echo "trim-rootfs: the trimmed image did not run" >&2; exit 1; }
grep -E 'PASSED|health' "$work/cpu-run.txt"
