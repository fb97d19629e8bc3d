#!/usr/bin/env bash
# Builds the container image from the Dockerfile and smoke-tests it, on a
# machine without a container daemon or a GPU (CI):
#
#   1. debootstrap --variant=minbase makes a Debian 12 root file system from
#      Debian's archive, and `podman import` turns it into the base image
#      (both of the Dockerfile's stages start from it);
#   2. `buildah bud --isolation chroot` builds the Dockerfile (chroot
#      isolation needs none of the capabilities an OCI runtime wants), with
#      CUDA from PyPI and one GPU architecture (CUDA_ARCHITECTURES) to stay
#      fast;
#   3. the runtime image is checked (only softmax-server and softmax-client
#      in it, a numeric user, the NVIDIA variables), then its server is
#      started on the CPU through `buildah run --isolation chroot` and its own
#      softmax-client asks for health and computes one softmax, checked
#      against its float64 reference (--check).
#
# Usage: deploy/image-check.sh WORK_DIR
# WORK_DIR holds the image storage (vfs) and the base file system; the base
# image is kept there between runs, the built image and its containers are
# removed at the end. Installs buildah, podman and debootstrap when missing.
# Environment: CUDA_ARCHITECTURES (default 90-real), CUDA_SOURCE (pypi),
# DEBIAN_MIRROR (http://deb.debian.org/debian), IMAGE_EXPORT_DIR (unset: the
# image is only checked; set: the runtime image's root file system is also
# written there as softmax-serve-rootfs.tar, with its config in
# softmax-serve-image.json, before the image is removed; for running the
# image's own binaries where no container engine runs:
# deploy/gpu-image/run-image-rootfs.sh).
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 WORK_DIR" >&2
  exit 2
fi
source_dir=$(cd "$(dirname "$0")/.." && pwd)
. "$source_dir/scripts/listening.sh"
work=$(mkdir -p "$1" && cd "$1" && pwd)
architectures=${CUDA_ARCHITECTURES:-90-real}
cuda_source=${CUDA_SOURCE:-pypi}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
export_dir=${IMAGE_EXPORT_DIR:-}
base=localhost/softmax-serve-base:bookworm
image=localhost/softmax-serve:image-check

step() { echo "image-check: $(date -u +%H:%M:%S) $*"; }
fail() { echo "image-check: FAILED: $*" >&2; exit 1; }

missing=()
for tool in buildah podman debootstrap; do
  command -v "$tool" > /dev/null || missing+=("$tool")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  step "installing ${missing[*]}"
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
fi

# Storage of its own, in vfs (overlay needs a kernel mount the machine may
# refuse inside a container).
storage=(--root "$work/storage" --runroot "$work/run" --storage-driver vfs)

if ! podman "${storage[@]}" image exists "$base"; then
  step "debootstrap bookworm (minbase) from $mirror"
  rm -rf "$work/rootfs"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log"; fail "debootstrap"; }
  tar -C "$work/rootfs" -c . | podman "${storage[@]}" import - "$base" > /dev/null
  rm -rf "$work/rootfs"
fi

server_container=""
export_container=""
cleanup() {
  [[ -n "${server_pid:-}" ]] && kill "$server_pid" 2> /dev/null || true
  [[ -n "$server_container" ]] && buildah "${storage[@]}" rm "$server_container" > /dev/null 2>&1 || true
  [[ -n "$export_container" ]] && buildah "${storage[@]}" rm "$export_container" > /dev/null 2>&1 || true
  buildah "${storage[@]}" rmi -f "$image" > /dev/null 2>&1 || true
}
trap cleanup EXIT

# The host's CA bundle, for pip behind a proxy that inspects TLS.
secrets=()
ca_bundle=/etc/ssl/certs/ca-certificates.crt
[[ -s "$ca_bundle" ]] && secrets=(--secret "id=ca-bundle,src=$ca_bundle")

step "buildah bud (CUDA from $cuda_source, architectures $architectures)"
started=$SECONDS
# Docker's image format: OCI's has no SHELL or HEALTHCHECK.
buildah "${storage[@]}" bud --isolation chroot --format docker --layers=false "${secrets[@]}" \
  --build-arg "DEBIAN_IMAGE=$base" --build-arg "DEBIAN_SLIM_IMAGE=$base" \
  --build-arg "CUDA_SOURCE=$cuda_source" --build-arg "CUDA_ARCHITECTURES=$architectures" \
  -f "$source_dir/Dockerfile" -t "$image" "$source_dir" > "$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log"; fail "buildah bud (log: $work/build.log)"; }
step "built in $((SECONDS - started)) s"

# The runtime image's file system as built (from a container nothing has run
# in), for running its binaries where no container engine runs.
if [[ -n "$export_dir" ]]; then
  mkdir -p "$export_dir"
  export_container=$(buildah "${storage[@]}" from "$image")
  root=$(buildah "${storage[@]}" mount "$export_container")
  tar -C "$root" --numeric-owner -cf "$export_dir/softmax-serve-rootfs.tar" .
  buildah "${storage[@]}" umount "$export_container" > /dev/null
  buildah "${storage[@]}" inspect --type image "$image" > "$export_dir/softmax-serve-image.json"
  step "exported the runtime image's root file system: $export_dir/softmax-serve-rootfs.tar" \
    "($(du -m "$export_dir/softmax-serve-rootfs.tar" | cut -f1) MiB)"
fi

# What the runtime image holds and runs as.
config() { buildah "${storage[@]}" inspect --type image --format "$1" "$image"; }
user=$(config '{{.OCIv1.Config.User}}')
[[ "$user" =~ ^[1-9][0-9]*(:[0-9]+)?$ ]] || fail "image user '$user' is not a numeric non-root uid"
environment=$(config '{{range .OCIv1.Config.Env}}{{println .}}{{end}}')
for variable in NVIDIA_VISIBLE_DEVICES NVIDIA_DRIVER_CAPABILITIES NVIDIA_REQUIRE_CUDA; do
  grep -q "^$variable=" <<< "$environment" || fail "image sets no $variable"
done
server_container=$(buildah "${storage[@]}" from "$image")
binaries=$(buildah "${storage[@]}" run --isolation chroot "$server_container" -- \
  ls /opt/softmax-serve/bin | tr '\n' ' ')
[[ "$binaries" == "softmax-client softmax-server " ]] \
  || fail "runtime image ships '$binaries', expected only softmax-client and softmax-server"

step "starting the image's server on the CPU"
log="$work/server.log"
# The server (the image's user) writes its --listening_file into a folder of
# this host's, mounted into the container.
mkdir -p "$work/listening" && chmod 1777 "$work/listening"
buildah "${storage[@]}" run --isolation chroot -v "$work/listening:/listening" \
  "$server_container" -- /opt/softmax-serve/softmax-server --grpc_address=127.0.0.1:0 \
  --http_address= --metrics_address= --device=cpu \
  --listening_file=/listening/listening.json > "$log" 2>&1 &
server_pid=$!
wait_for_listening "$work/listening/listening.json" "$server_pid" \
  || fail "the image's server did not start: $(cat "$log")"
address=$(listening_address "$work/listening/listening.json" grpc)

client() {
  buildah "${storage[@]}" run --isolation chroot "$server_container" -- \
    /opt/softmax-serve/softmax-client "$@"
}
health=$(client health --target="$address" --timeout_ms=5000) || fail "health: $health"
[[ "$health" == SERVING ]] || fail "health answered '$health'"
client --target="$address" --shape=4,1000 --dtype=float32 --check \
  || fail "softmax-client call with --check"
step "the image answers: health $health, one softmax checked"
# buildah run ends its command with SIGKILL when signalled (it forwards no
# SIGTERM), so the drain is not exercised here; tests/test_shutdown.py covers it.
kill -TERM "$server_pid"
wait "$server_pid" 2> /dev/null || true
server_pid=""
step "passed"
