#!/usr/bin/env bash
# On the GPU machine (no package index there): unpacks what stage.sh staged,
# installs PyTriton and its dependencies offline into the machine's Python
# (PyTriton's Python backend only sees packages of the interpreter itself, so
# no --target or venv), then runs pa_bench.py: perf_analyzer on our KServe
# gRPC and HTTP endpoints beside softmax-client load, and on PyTriton.
#
# Usage (from the checkout root):
#   bench/kserve/run_h200.sh STAGE OUT [pa_bench.py flags...]
# Everything lands in OUT: results.json/.csv, table.md, plot.png, logs/, and
# setup.log (unpacking and pip).
set -uo pipefail
stage=$(cd "${1:?usage: run_h200.sh STAGE OUT [flags]}" && pwd)
out=${2:?usage: run_h200.sh STAGE OUT [flags]}
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
started=$SECONDS

mkdir -p "$work/wheels" "$work/whl"
tar -C "$work" -xJf "$stage/bundle.tar.xz" &
tar -C "$work/wheels" -xJf "$stage/wheels.tar.xz"
wait
bundle=$(ls -d "$work"/softmax-serve-*)
echo "== unpacked in $((SECONDS - started)) s: $(cat "$bundle/VERSION" | head -1)"

# Each unpacked wheel zipped again (stored: only pip reads it), modes kept.
python3 - "$work/wheels" "$work/whl" <<'EOF'
import os, sys, zipfile
src, dst = sys.argv[1:]
for name in sorted(os.listdir(src)):
    if name.startswith("perf_analyzer-"):
        continue  # run from where it lies
    top = os.path.join(src, name)
    with zipfile.ZipFile(os.path.join(dst, name + ".whl"), "w", zipfile.ZIP_STORED) as z:
        for folder, _, files in os.walk(top):
            for f in files:
                path = os.path.join(folder, f)
                z.write(path, os.path.relpath(path, top))
EOF
python3 -m pip install -q --no-index --no-deps "$work"/whl/*.whl > "$out/setup.log" 2>&1
rc=$?
if [[ $rc -ne 0 ]] && grep -q externally-managed "$out/setup.log"; then
  # A distribution's Python (PEP 668); the machine is lent and handed back.
  python3 -m pip install -q --no-index --no-deps --break-system-packages "$work"/whl/*.whl \
    >> "$out/setup.log" 2>&1
  rc=$?
fi
echo "== pip rc $rc after $((SECONDS - started)) s"; grep -v "^$" "$out/setup.log" | tail -3
pa=$(ls "$work"/wheels/perf_analyzer-*/perf_analyzer/bin/perf_analyzer)
chmod +x "$pa"
"$pa" --version 2>&1 | head -1
site=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# The tritonserver binary that PyTriton starts finds its libraries here.
export LD_LIBRARY_PATH=$site/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
python3 -c "import numpy, torch, pytriton, tritonclient.grpc; print('numpy', numpy.__version__, 'torch', torch.__version__)" 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" python3 -m bench.kserve.pa_bench \
  --bundle="$bundle" --perf-analyzer="$pa" --device=cuda --out="$out" "$@" 2>&1 \
  | tee "$out/pa_bench.log"
status=${PIPESTATUS[0]}
echo "== done in $((SECONDS - started)) s, rc $status"
rm -rf "$work"
exit "$status"
