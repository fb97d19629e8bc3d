#!/bin/sh
# Runs end-to-end pytest files with the build tree's venv interpreter.
# Usage: run-pytest.sh VENV_PYTHON TEST_FILE... (ctest passes both, and sets
# SOFTMAX_SERVER_BIN, SOFTMAX_CLIENT_BIN, SOFTMAX_PYTHON_DIR and PYTHONPATH).
python="$1"
shift
if [ ! -x "$python" ]; then
  cat >&2 <<MSG
end-to-end tests: no Python venv at $python.
Create it with 'make venv' (or run everything with 'make test'), or by hand:
  /usr/bin/python3 -m venv --system-site-packages $(dirname "$(dirname "$python")")
  $python -m pip install pytest
MSG
  exit 1
fi
if ! "$python" -c "import pytest, grpc, numpy, google.protobuf" 2>/dev/null; then
  echo "end-to-end tests: $python lacks pytest, grpc, numpy or protobuf;" \
       "install Debian's python3-grpcio python3-numpy python3-protobuf" \
       "(scripts/install-deps.sh) and '$python -m pip install pytest'" >&2
  exit 1
fi
export PYTHONDONTWRITEBYTECODE=1
# A file whose every case skipped did not test anything: that fails, unless
# ctest says skipping is expected here (SOFTMAX_ALL_SKIPPED_OK=1, for the GPU
# tests on a host without a GPU).
report=$(mktemp)
trap 'rm -f "$report"' EXIT
"$python" -m pytest -p no:cacheprovider -q -rs --junitxml="$report" "$@"
status=$?
[ "$status" -ne 0 ] && exit "$status"
"$python" - "$report" <<'PY'
import os, sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
tests = sum(int(s.get("tests", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
if tests and skipped == tests and os.environ.get("SOFTMAX_ALL_SKIPPED_OK") != "1":
    print(f"run-pytest.sh: all {tests} case(s) skipped: nothing was tested", file=sys.stderr)
    sys.exit(1)
PY
