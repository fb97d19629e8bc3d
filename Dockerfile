# softmax-serve container image.
#
#   docker build -t softmax-serve:0.1.0 .
#   docker run --gpus all -p 50051:50051 -p 8000:8000 -p 9464:9464 softmax-serve:0.1.0
#
# Build stage: Debian 12, so the same scripts/install-deps.sh installs the same
# Debian packages as on a bare machine (NVIDIA's own nvidia/cuda images are
# Ubuntu/UBI based, which lack Debian 12's gRPC 1.51 / Abseil 20220623 set),
# plus nvcc and the CUDA runtime from PyPI's NVIDIA wheels or NVIDIA's apt
# repository (CUDA_SOURCE; deploy/install-cuda.sh). The kernels are built for
# every architecture in CUDA_ARCHITECTURES, with PTX for the newest so that
# later GPUs compile it at load. The build ends with deploy/make-bundle.sh:
# the two binaries plus every non-glibc library they load.
#
# Runtime stage: the slim Debian 12 image (same glibc) with only
# softmax-server and softmax-client, run as the numeric non-root user 10001.
# The NVIDIA driver (libcuda) is not in the image: the NVIDIA container
# runtime mounts the host's at start (--gpus / runtime: nvidia) when its
# driver meets NVIDIA_REQUIRE_CUDA. Without a GPU the server serves on the CPU
# (--device=auto).
#
# CI builds it with buildah from a debootstrapped Debian 12 base, for one
# architecture, and smoke-tests it (deploy/image-check.sh).

# Both stages' bases are build arguments (CI passes a local debootstrapped
# image); the defaults are tagged releases, never latest.
# checkov:skip=CKV_DOCKER_7:the base image is a build argument whose default is the debian:12 tag
ARG DEBIAN_IMAGE=debian:12
ARG DEBIAN_SLIM_IMAGE=debian:12-slim
ARG CUDA_VERSION=13.0

FROM ${DEBIAN_IMAGE} AS build
ARG CUDA_VERSION
# pypi | nvidia-apt
ARG CUDA_SOURCE=pypi
# sm_80 / sm_86 / sm_89 Ampere and Ada (A100, A10, L4), sm_90 Hopper (H100,
# H200), sm_100 Blackwell (B200), and PTX of sm_100 for later GPUs. Below
# sm_90 the kernels that need thread-block clusters are left out and the
# launch plan does without them (kernels/cuda/common.cuh).
ARG CUDA_ARCHITECTURES="80-real;86-real;89-real;90-real;100-real;100-virtual"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# Dependencies first, so source edits do not reinstall packages.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY deploy/install-cuda.sh deploy/install-cuda.sh
# Behind a proxy that inspects TLS, pip needs its CA: pass the host's bundle
# with --secret id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt (it is
# mounted for this step only, never stored in the image).
RUN --mount=type=secret,id=ca-bundle,required=false \
    deploy/install-cuda.sh "${CUDA_SOURCE}" "${CUDA_VERSION}"
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}" -DSOFTMAX_BUILD_TESTS=OFF \
 && cmake --build /build --target softmax-server softmax-client \
 && deploy/make-bundle.sh /build /dist \
 && mv /dist/softmax-serve-*-linux-*/ /opt/softmax-serve \
 && test "$(ls /opt/softmax-serve/bin)" = "$(printf 'softmax-client\nsoftmax-server')"

FROM ${DEBIAN_SLIM_IMAGE} AS runtime
ARG CUDA_VERSION
# The NVIDIA container runtime reads these: expose the GPUs, mount the
# driver's compute and NVML libraries (NVML: the GPU health metrics), and
# refuse a host whose driver is too old for the CUDA the kernels were built
# with (CUDA 13 needs driver 580 or newer).
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=${CUDA_VERSION}"
COPY --from=build /opt/softmax-serve /opt/softmax-serve
# The user deploy/k8s and deploy/kserve run as (runAsUser: 10001).
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin softmax \
 && ln -s /opt/softmax-serve/softmax-server /usr/local/bin/softmax-server \
 && ln -s /opt/softmax-serve/softmax-client /usr/local/bin/softmax-client
USER 10001:10001
EXPOSE 50051 8000 9464
# SIGTERM: health goes NOT_SERVING, in-flight requests finish (up to
# --shutdown_grace_s, 30 s by default; give `docker stop -t` a bit more).
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/opt/softmax-serve/softmax-client", "health", "--target=127.0.0.1:50051", "--timeout_ms=3000"]
ENTRYPOINT ["/opt/softmax-serve/softmax-server"]
CMD ["--grpc_address=0.0.0.0:50051", "--http_address=0.0.0.0:8000", "--metrics_address=0.0.0.0:9464", "--device=auto"]
