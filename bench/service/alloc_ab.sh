#!/bin/bash
# Alternating rounds of the 1 x 1024 float32 point at 256 callers (unary and
# streamed) for server variants that differ only in their environment: the
# allocator. Usage: PRELOAD_DIR=DIR bench/service/alloc_ab.sh BUNDLE OUT [ROUNDS]
# DIR holds libjemalloc.so.2 and libtcmalloc_minimal.so.4 (Debian's
# libjemalloc2 and libtcmalloc-minimal4: apt-get download, dpkg -x). Prints
# (and appends to OUT/ab.txt) one line per run: round, server, mode, req/s,
# p99 ms, errors. DEV=cpu runs the CPU backend instead of cuda.
B=$1; OUT=$2; ROUNDS=${3:-3}
PRELOAD_DIR=${PRELOAD_DIR:?PRELOAD_DIR: the folder of the preloaded allocators}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$B/lib
P=50090
declare -A ENVS=(
  [main]=""
  [tcache]="GLIBC_TUNABLES=glibc.malloc.tcache_count=1024"
  [jemalloc]="LD_PRELOAD=$PRELOAD_DIR/libjemalloc.so.2"
  [tcmalloc]="LD_PRELOAD=$PRELOAD_DIR/libtcmalloc_minimal.so.4"
  [none]=""
)
ORDER=(main tcache jemalloc tcmalloc none)
for r in $(seq 1 $ROUNDS); do
  if (( r % 2 == 0 )); then ORD=($(printf '%s\n' "${ORDER[@]}" | tac)); else ORD=("${ORDER[@]}"); fi
  for v in "${ORD[@]}"; do
    dev=${DEV:-cuda}; [[ $v == none ]] && dev=none
    env ${ENVS[$v]} $B/bin/softmax-server --device=$dev --grpc_address=127.0.0.1:$P --http_address= --metrics_address= > $OUT/server-$v-$r.log 2>&1 &
    spid=$!
    for i in $(seq 50); do grep -q listening $OUT/server-$v-$r.log && break; sleep 0.1; done
    for mode in unary stream; do
      extra=""; [[ $mode == stream ]] && extra=--stream
      $B/bin/softmax-client load --target=127.0.0.1:$P --shape=1x1024 --dtype=float32 --concurrency=256 \
        --connections=16 $extra --duration=2.5s --warmup=0.5s --quiet --json=$OUT/$v-$mode-$r.json > /dev/null 2>&1
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], sys.argv[4], round(d['requests_per_s']), round(d['latency_us']['p99']/1000, 2), d['errors'])" $OUT/$v-$mode-$r.json $r $v $mode | tee -a $OUT/ab.txt
    done
    kill $spid; wait $spid 2>/dev/null
  done
done
