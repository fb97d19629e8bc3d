#!/bin/bash
# Alternating rounds of the small point, 1 x 1024 float32 at 256 callers over
# 16 connections, for server variants side by side with the echo.
#
# Usage: bench/service/ab.sh BUNDLE OUT ROUNDS NAME=COMMAND...
# Each COMMAND starts a server (the flags below are appended), e.g.
#   base=/tmp/old/softmax-server
#   new=BUNDLE/bin/softmax-server
#   tcmalloc="env LD_PRELOAD=/tmp/libtcmalloc_minimal.so.4 BUNDLE/bin/softmax-server"
# The echo (BUNDLE's server, --device=none) runs last in odd rounds and first
# in even ones, the variants in the order given, reversed in even rounds; a
# round starts each server afresh and runs every mode against it. MODES
# (default "unary stream") picks among unary and stream (softmax.v1's
# Softmax and SoftmaxStream). DEV=cpu runs
# the CPU backend instead of cuda. Prints (and appends to OUT/ab.txt) one line
# per run: round, server, mode, req/s, p99 ms, errors.
B=$1; OUT=$2; ROUNDS=$3; shift 3
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$B/lib
P=50090
declare -A CMDS=([none]="$B/bin/softmax-server")
ORDER=()
for spec in "$@"; do CMDS[${spec%%=*}]=${spec#*=}; ORDER+=("${spec%%=*}"); done
ORDER+=(none)
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 == 0 )); then ORD=($(printf '%s\n' "${ORDER[@]}" | tac)); else ORD=("${ORDER[@]}"); fi
  for v in "${ORD[@]}"; do
    dev=${DEV:-cuda}; [[ $v == none ]] && dev=none
    ${CMDS[$v]} --device=$dev --grpc_address=127.0.0.1:$P --http_address= --metrics_address= \
      > "$OUT/server-$v-$r.log" 2>&1 &
    spid=$!
    for i in $(seq 100); do grep -q listening "$OUT/server-$v-$r.log" && break; sleep 0.1; done
    for mode in ${MODES:-unary stream}; do
      extra=""; [[ $mode == stream ]] && extra=--stream
      $B/bin/softmax-client load --target=127.0.0.1:$P --shape=1x1024 --dtype=float32 --concurrency=256 \
        --connections=16 $extra --duration=2.5s --warmup=0.5s --quiet --json="$OUT/$v-$mode-$r.json" \
        > /dev/null 2>&1
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], sys.argv[4], round(d['requests_per_s']), round(d['latency_us']['p99']/1000, 2), d['errors'])" \
        "$OUT/$v-$mode-$r.json" $r $v $mode | tee -a "$OUT/ab.txt"
    done
    kill $spid; wait $spid 2>/dev/null
  done
done
