# Shell helpers for softmax-server's --listening_file (sourced, not run):
#
#   . scripts/listening.sh
#   softmax-server --listening_file="$work/listening.json" ... &
#   wait_for_listening "$work/listening.json" $! || fail "did not start"
#   grpc=$(listening_address "$work/listening.json" grpc)
#
# The file is written once every listener is up (JSON: grpc, http, metrics
# addresses, pid, version, revision), so scripts read the bound ports from it
# instead of parsing the log.

# wait_for_listening FILE PID [SECONDS]: 0 once FILE is written; 1 when PID
# exits first or SECONDS (default 30) pass.
wait_for_listening() {
  local file=$1 pid=$2 tenths=$(( ${3:-30} * 10 ))
  for _ in $(seq 1 "$tenths"); do
    [[ -s "$file" ]] && return 0
    kill -0 "$pid" 2> /dev/null || { [[ -s "$file" ]]; return; }
    sleep 0.1
  done
  [[ -s "$file" ]]
}

# listening_address FILE KEY: the bound address of KEY (grpc, http, metrics),
# as host:port, or "off" for a listener not served.
listening_address() {
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]) or "")' "$1" "$2"
}
