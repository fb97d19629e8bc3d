#!/bin/bash
# Alternating rounds of the big-tensor points, before against after, with
# every server up for the whole run (run.py starts servers per variant and
# spends 10-15 s a point on the H200; this spends about 6).
#
# Usage: bench/transport/rounds.sh BUNDLE BEFORE OUT_FILE [short]
#   BUNDLE: the code after (a release bundle: bin/, lib/)
#   BEFORE: a folder with the code before's softmax-server and softmax-client
#   short: only what the targets need (unary 4 MiB after, 64 MiB in chunks
#          before and after; no curve): about 3 minutes instead of 7
# Per round, for the echo (--device=none) and the GPU (--device=cuda): unary
# 4 MiB (before and after), unary 64 MiB (before), 64 MiB in chunks of 1 MiB
# (before and after); the second round runs them in reverse order. Then one
# round of the curve (64 KiB to 16 MiB, unary and chunked), and the raw TCP
# ceiling at the start and the end. 4 callers on 4 connections throughout;
# each line of OUT_FILE is one load run (payload GB/s over all 4).
set -u
B=$1; M=$2; o=$3; short=${4:-}
export LD_LIBRARY_PATH=$B/lib
start() { $1 --device=$2 --grpc_address=127.0.0.1:$3 --http_address= --metrics_address= \
  > /tmp/rounds-server-$3.log 2>&1 & }
start "$M/softmax-server" none 50601; start "$B/bin/softmax-server" none 50602
start "$M/softmax-server" cuda 50603; start "$B/bin/softmax-server" cuda 50604
trap 'kill $(jobs -p) 2>/dev/null' EXIT
sleep 5
ceiling() {
  for m in "stream 67108864 1" "stream 67108864 4" "echo 67108864 4" "echo 4194304 4"; do
    set -- $m
    echo "ceiling $1 $2 x$3: $("$B/bin/tcp_ceiling" --mode=$1 --bytes=$2 --connections=$3 \
      --seconds=1 | tail -1)" | tee -a "$o"
  done
}
CH="--stream --chunk_bytes=1048576"
one() {  # LABEL CLIENT PORT BYTES [ARGS...]
  local label=$1 client=$2 port=$3 bytes=$4
  shift 4
  local r
  r=$("$client" load --target=127.0.0.1:$port --shape=1x$((bytes / 4)) --dtype=float32 \
    --concurrency=4 --connections=4 --duration=${DUR:-1.5s} --warmup=0.5s "$@" 2>&1 |
    grep -E "GB/s payload|mismatched|p50" | head -3 | tr '\n' ' ')
  echo "$label bytes=$bytes $r" | tee -a "$o"
}
ceiling
# Validate first: every response against the float64 reference.
one verify-after-cuda-chunk "$B/bin/softmax-client" 50604 67108864 $CH --verify
one verify-before-cuda-chunk "$M/softmax-client" 50603 67108864 $CH --verify
for round in 1 2 3; do
  for dev in none cuda; do
    if [ $dev = none ]; then pm=50601; pn=50602; else pm=50603; pn=50604; fi
    runs=("before-unary-4M $M/softmax-client $pm 4194304"
          "after-unary-4M $B/bin/softmax-client $pn 4194304"
          "before-unary-64M $M/softmax-client $pm 67108864"
          "before-chunk-64M $M/softmax-client $pm 67108864 $CH"
          "after-chunk-64M $B/bin/softmax-client $pn 67108864 $CH")
    order="0 1 2 3 4"
    [ $round = 2 ] && order="4 3 2 1 0"
    if [ "$short" = short ]; then
      runs=("${runs[1]}" "${runs[3]}" "${runs[4]}")
      order="0 1 2"
      [ $round = 2 ] && order="2 1 0"
    fi
    for i in $order; do
      set -- ${runs[$i]}
      l=$1
      shift
      one "r$round $dev $l" "$@"
    done
  done
done
if [ "$short" = short ]; then
  ceiling
  exit 0
fi
DUR=1s
for bytes in 65536 262144 1048576 16777216; do
  for dev in none cuda; do
    if [ $dev = none ]; then pm=50601; pn=50602; else pm=50603; pn=50604; fi
    one "curve $dev before-unary" "$M/softmax-client" $pm $bytes
    one "curve $dev after-unary" "$B/bin/softmax-client" $pn $bytes
    one "curve $dev before-chunk" "$M/softmax-client" $pm $bytes $CH
    one "curve $dev after-chunk" "$B/bin/softmax-client" $pn $bytes $CH
  done
done
ceiling
