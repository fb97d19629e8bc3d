#!/usr/bin/env bash
# The release bundle: deploy/make-bundle.sh packs BUILD_DIR's binaries; the
# tarball is unpacked elsewhere and its launchers are run with a bare
# environment: the server starts on the CPU backend, the bundled client finds
# it SERVING and gets a correct softmax (and correct ones over HTTP through
# the bundled libcurl), SIGTERM stops it with exit code 0.
# Usage: tests/bundle_test.sh BUILD_DIR WORK_DIR
set -euo pipefail
build_dir=$1
work=$2
source_dir=$(cd "$(dirname "$0")/.." && pwd)
. "$source_dir/scripts/listening.sh"

rm -rf "$work"
mkdir -p "$work/out" "$work/unpacked"
"$source_dir/deploy/make-bundle.sh" "$build_dir" "$work/out" > "$work/make-bundle.log"
tarball=$(ls "$work"/out/softmax-serve-*-linux-*.tar.gz)
name=$(basename "$tarball" .tar.gz)
tar -C "$work/unpacked" -xzf "$tarball"
bundle="$work/unpacked/$name"

fail() { echo "bundle_test: $*" >&2; exit 1; }

for f in softmax-server softmax-client bin/softmax-server bin/softmax-client VERSION; do
  [[ -e "$bundle/$f" ]] || fail "missing $f"
done
[[ -x "$bundle/softmax-server" && -x "$bundle/softmax-client" ]] || fail "launchers not executable"
ls "$bundle"/lib/libgrpc++.so.* > /dev/null || fail "libgrpc++ not packed"
# The client's HTTP transport (load --protocol=http).
ls "$bundle"/lib/libcurl.so.* > /dev/null || fail "libcurl not packed"
for lib in "$bundle"/lib/*; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*)
      fail "system library packed: $(basename "$lib")" ;;
  esac
done
! ls "$bundle"/bin/*_test > /dev/null 2>&1 || fail "unit-test binaries packed"
# The packed libraries are the ones loaded.
LD_LIBRARY_PATH="$bundle/lib" ldd "$bundle/bin/softmax-server" | grep "libgrpc++.so" \
  | grep -q "$bundle/lib/" || fail "libgrpc++ does not resolve to the bundle"
LD_LIBRARY_PATH="$bundle/lib" ldd "$bundle/bin/softmax-client" | grep "libcurl.so" \
  | grep -q "$bundle/lib/" || fail "libcurl does not resolve to the bundle"
# A server built with tcmalloc carries it: the target may not have it installed.
if "$bundle/softmax-server" --version | grep -q "allocator tcmalloc"; then
  LD_LIBRARY_PATH="$bundle/lib" ldd "$bundle/bin/softmax-server" | grep "libtcmalloc_minimal.so" \
    | grep -q "$bundle/lib/" || fail "libtcmalloc_minimal not packed"
fi

# Run from another directory, through a symlink, with a bare environment.
ln -s "$bundle/softmax-server" "$work/server-link"
log="$work/server.log"
(cd / && exec env -i PATH=/usr/bin:/bin "$work/server-link" --grpc_address=127.0.0.1:0 \
    --metrics_address= --http_address=127.0.0.1:0 --device=cpu \
    --listening_file="$work/listening.json") 2> "$log" &
pid=$!
trap 'kill -KILL $pid 2>/dev/null || true' EXIT
wait_for_listening "$work/listening.json" $pid || fail "bundled server did not start: $(cat "$log")"
address=$(listening_address "$work/listening.json" grpc)
http=$(listening_address "$work/listening.json" http)
[[ "$(listening_address "$work/listening.json" metrics)" == off ]] || fail "metrics listener not off"

health=$(env -i PATH=/usr/bin:/bin "$bundle/softmax-client" health --target="$address")
[[ "$health" == "SERVING" ]] || fail "health: $health"
env -i PATH=/usr/bin:/bin "$bundle/softmax-client" --target="$address" --shape=3,257 \
  --dtype=float16 --check > "$work/client.log" || fail "client call: $(cat "$work/client.log")"
grep -q "check:      0 of 771 elements" "$work/client.log" || fail "$(cat "$work/client.log")"
env -i PATH=/usr/bin:/bin "$bundle/softmax-client" load --protocol=http --target="$http" \
  --requests=20 --warmup=0 --verify --quiet > "$work/load.log" 2>&1 \
  || fail "load over HTTP: $(cat "$work/load.log")"

kill -TERM $pid
status=0
wait $pid || status=$?
trap - EXIT
[[ $status -eq 0 ]] || fail "server exit code $status after SIGTERM: $(cat "$log")"
echo "bundle_test: $name ok ($(wc -l < "$bundle/LIBRARIES") libraries)"
