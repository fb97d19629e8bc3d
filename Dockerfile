# softmax-serve container image.
#
#   docker build -t softmax-serve .
#   docker run --gpus all -p 50051:50051 -p 8000:8000 -p 9464:9464 softmax-serve
#
# Build stage: Debian 12, so the same scripts/install-deps.sh installs the same
# Debian packages as on a bare machine, plus nvcc and the CUDA runtime from
# NVIDIA's debian12 apt repository (NVIDIA's own nvidia/cuda images are
# Ubuntu/UBI based, which lack Debian 12's gRPC 1.51 / Abseil 20220623 set).
# The build ends with deploy/make-bundle.sh: the binaries plus every non-glibc
# library they load (gRPC, protobuf, Abseil, prometheus-cpp, libcudart, ...).
#
# Runtime stage: debian:12-slim (same glibc) with that bundle copied in. The
# NVIDIA driver (libcuda) is not in the image: the NVIDIA container runtime
# mounts the host's at start (--gpus / runtime: nvidia). Without a GPU the
# server falls back to the CPU backend (--device=auto).

ARG DEBIAN_IMAGE=debian:12
ARG DEBIAN_SLIM_IMAGE=debian:12-slim

FROM ${DEBIAN_IMAGE} AS build
ARG CUDA_PACKAGE_VERSION=13-0
ARG CUDA_ARCHITECTURES=90
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && curl -fsSL -o /tmp/cuda-keyring.deb \
      https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
 && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
 && apt-get update \
 && apt-get install -y --no-install-recommends \
      cuda-nvcc-${CUDA_PACKAGE_VERSION} cuda-cudart-dev-${CUDA_PACKAGE_VERSION} \
      cuda-cccl-${CUDA_PACKAGE_VERSION} cuda-driver-dev-${CUDA_PACKAGE_VERSION} \
 && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/local/cuda/bin:${PATH}

WORKDIR /src
# Dependencies first, so source edits do not reinstall packages.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES} -DSOFTMAX_BUILD_TESTS=OFF \
 && cmake --build /build \
 && deploy/make-bundle.sh /build /dist \
 && mv /dist/softmax-serve-*-linux-*/ /opt/softmax-serve

FROM ${DEBIAN_SLIM_IMAGE} AS runtime
# The NVIDIA container runtime reads these: expose the GPUs, mount the
# driver's compute libraries.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
COPY --from=build /opt/softmax-serve /opt/softmax-serve
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin softmax \
 && ln -s /opt/softmax-serve/softmax-server /usr/local/bin/softmax-server \
 && ln -s /opt/softmax-serve/softmax-client /usr/local/bin/softmax-client
USER softmax
EXPOSE 50051 8000 9464
# SIGTERM: health goes NOT_SERVING, in-flight requests finish (up to
# --shutdown_grace_s, 30 s by default; give `docker stop -t` a bit more).
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/opt/softmax-serve/softmax-client", "health", "--target=127.0.0.1:50051", "--timeout_ms=3000"]
ENTRYPOINT ["/opt/softmax-serve/softmax-server"]
CMD ["--grpc_address=0.0.0.0:50051", "--http_address=0.0.0.0:8000", "--metrics_address=0.0.0.0:9464", "--device=auto"]
