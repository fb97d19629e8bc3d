#!/usr/bin/env bash
# Installs the Debian 12 packages softmax-serve needs to build, test and serve.
# Idempotent: installs only what is missing. Uses sudo when not root.
# Usage: scripts/install-deps.sh [--runtime-only]
set -euo pipefail

build_packages=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev
  # The server's logs (server/logging/).
  libspdlog-dev
  # The KServe v2 HTTP front-end (server/rpc/http/kserve_http.cc); its CMake
  # package also wants the `civetweb` binary package.
  libcivetweb-dev civetweb
  # TLS on that front-end (server/rpc/http/civetweb_tls.cc); gRPC uses it too.
  libssl-dev
  # softmax-client load --protocol=http (client/load/http.cc).
  libcurl4-openssl-dev
  # The server's allocator, tcmalloc_minimal (server/memory_trim.h).
  libgoogle-perftools-dev
)
test_packages=(
  python3 python3-venv python3-grpcio python3-protobuf python3-numpy
  python3-prometheus-client prometheus curl
  # tests/test_fleet_faults.py drops a replica's packets in its namespace.
  nftables
)

packages=("${build_packages[@]}" "${test_packages[@]}")
if [[ "${1:-}" == "--runtime-only" ]]; then
  packages=()
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
