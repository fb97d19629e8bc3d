#!/bin/bash
# Alternating rounds of service points for server variants side by side with
# the echo; by default the small point, 1 x 1024 float32 at 256 callers over
# 16 connections, unary and streamed.
#
# Usage: bench/service/ab.sh BUNDLE OUT ROUNDS NAME=COMMAND...
# Each COMMAND starts a server (the flags below are appended), e.g.
#   base=/tmp/old/softmax-server
#   new=BUNDLE/bin/softmax-server
#   tcmalloc="env LD_PRELOAD=/tmp/libtcmalloc_minimal.so.4 BUNDLE/bin/softmax-server"
# The echo (BUNDLE's server, --device=none) runs last in odd rounds and first
# in even ones, the variants in the order given, reversed in even rounds; a
# round starts each server afresh and runs every point against it.
# Environment:
#   POINTS    SHAPE:DTYPE:CALLERS[:MODE[:FLAG]] ... (default 1x1024:float32:256),
#             each over min(CALLERS, 16) connections, in MODE (empty: every
#             one of MODES), FLAG one more flag for the load client (e.g.
#             64x32000:bfloat16:64::--top_k=5)
#   MODES     unary and/or stream (softmax.v1's Softmax, SoftmaxStream);
#             default "unary stream"
#   ECHO=0    leaves the echo out
#   DEV=cpu   the CPU backend instead of cuda
#   DURATION, WARMUP  per run, with a unit (default 2.5s, 0.5s); PORT  gRPC port (50090)
# Prints (and appends to OUT/ab.txt) one line per run: round, server, mode,
# point, req/s, p50 ms, p99 ms, errors; `python3 -m bench.service.ab_table
# OUT/ab.txt` makes the table.
B=$1; OUT=$2; ROUNDS=$3; shift 3
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$B/lib
P=${PORT:-50090}
declare -A CMDS=([none]="$B/bin/softmax-server")
ORDER=()
for spec in "$@"; do CMDS[${spec%%=*}]=${spec#*=}; ORDER+=("${spec%%=*}"); done
[[ ${ECHO:-1} == 0 ]] || ORDER+=(none)
for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 == 0 )); then ORD=($(printf '%s\n' "${ORDER[@]}" | tac)); else ORD=("${ORDER[@]}"); fi
  for v in "${ORD[@]}"; do
    dev=${DEV:-cuda}; [[ $v == none ]] && dev=none
    ${CMDS[$v]} --device=$dev --grpc_address=127.0.0.1:$P --http_address= --metrics_address= \
      > "$OUT/server-$v-$r.log" 2>&1 &
    spid=$!
    # Up once its port takes a connection (it listens after its warm-up):
    # revisions older than --listening_file are compared here too.
    for i in $(seq 100); do (exec 3<> "/dev/tcp/127.0.0.1/$P") 2> /dev/null && break; sleep 0.1; done
    for point in ${POINTS:-1x1024:float32:256}; do
      IFS=: read -r shape dtype callers only flag <<< "$point"
      for mode in ${only:-${MODES:-unary stream}}; do
        extra=""; [[ $mode == stream ]] && extra=--stream
        name=$v-$mode-$shape-$dtype-$callers${flag:+-${flag//[^a-z0-9]/}}-$r
        $B/bin/softmax-client load --target=127.0.0.1:$P --shape=$shape --dtype=$dtype \
          --concurrency=$callers --connections=$(( callers < 16 ? callers : 16 )) $extra $flag \
          --duration=${DURATION:-2.5s} --warmup=${WARMUP:-0.5s} --quiet --json="$OUT/$name.json" > "$OUT/$name.log" 2>&1 \
          || { echo "$r $v $mode $shape:$dtype:$callers${flag:+:$flag} client failed: $(tail -1 "$OUT/$name.log")" | tee -a "$OUT/ab.txt"; continue; }
        python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(*sys.argv[2:], round(d['requests_per_s']), round(d['latency_us']['p50']/1000, 2), round(d['latency_us']['p99']/1000, 2), d['errors'])" \
          "$OUT/$name.json" $r $v $mode $shape:$dtype:$callers${flag:+:$flag} | tee -a "$OUT/ab.txt"
      done
    done
    kill $spid; wait $spid 2>/dev/null
  done
done
