#!/usr/bin/env bash
# Cost of metrics: the same server with metrics on (--metrics_address=127.0.0.1:0)
# and off (--metrics_address= : nothing recorded), alternating pairs, driven by
# softmax-client load in closed loop (concurrency 64, 1 x 1024 float32).
# Prints one line per run: DEVICE MODE PAIR REQUESTS_PER_S ERRORS, then on/off.
#
#   bench/metrics-cost/run.sh BIN_DIR [DEVICE=cpu] [PAIRS=6] [DURATION=8s]
# BIN_DIR holds softmax-server and softmax-client (build/bin, or a bundle's top folder).
set -euo pipefail
. "$(dirname "$0")/../../scripts/listening.sh"
bin=$1; device=${2:-cpu}; pairs=${3:-6}; duration=${4:-8s}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
one() {  # mode pair
  local address=""; [[ $1 == on ]] && address=127.0.0.1:0
  rm -f "$work/listening.json"
  "$bin/softmax-server" --grpc_address=127.0.0.1:0 --metrics_address=$address \
      --device="$device" --listening_file="$work/listening.json" > "$work/server.log" 2>&1 &
  local pid=$!
  wait_for_listening "$work/listening.json" "$pid" || { cat "$work/server.log"; exit 1; }
  local target
  target=$(listening_address "$work/listening.json" grpc)
  rm -f "$work/load.json"
  "$bin/softmax-client" load --target="$target" --concurrency=64 --mix=1x1024:float32 \
      --duration="$duration" --warmup=2s --quiet --json="$work/load.json" > /dev/null
  kill "$pid"; wait "$pid" || true
  python3 -c "import json; d=json.load(open('$work/load.json')); print('$device', '$1', $2, d['requests_per_s'], d['errors'])"
}
for i in $(seq 1 "$pairs"); do
  # Alternate which mode goes first, so drift over the run does not favour one.
  if (( i % 2 )); then one on "$i"; one off "$i"; else one off "$i"; one on "$i"; fi
done | tee "$work/runs.txt"
python3 - "$work/runs.txt" <<'PY'
import sys
rate = {"on": 0.0, "off": 0.0}
for line in open(sys.argv[1]):
    _, mode, _, rps, _ = line.split()
    rate[mode] += float(rps)
print(f"on/off throughput: {rate['on'] / rate['off']:.3f}")
PY
