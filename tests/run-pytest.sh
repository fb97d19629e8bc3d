#!/bin/sh
# Runs end-to-end pytest files with the build tree's venv interpreter.
# Usage: run-pytest.sh VENV_PYTHON TEST_FILE... (ctest passes both, and sets
# SOFTMAX_SERVER_BIN, SOFTMAX_CLIENT_BIN and SOFTMAX_PYTHON_DIR).
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
exec "$python" -m pytest -p no:cacheprovider -q -rs "$@"
