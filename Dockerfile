# syntax=docker/dockerfile:1
# seqserve images (docker-compose.yml builds them all; docs/deploy.md). Targets:
#   serve     (default, the last stage)  the gRPC server: onnxruntime + grpcio + tokenizers + numpy + prometheus-client, no torch
#   serve-gpu            the same plus the CUDA 13 / cuDNN 9 user-space libraries that onnxruntime-gpu 1.31.1 loads
#   train                torch (CPU build) + the train extra: `seqserve-bundle build` trains, exports and verifies
#   loadtest             locust and the seqserve load-test driver (the compose `loadtest` profile)
# Every image holds the whole package (one namespace) and seqserve-bundle (deploy/bundle.sh), and writes or reads
# the bundle under /artifacts (a volume owned by the unprivileged user seqserve, uid 10001).

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# Only what the package build needs; tests, docs and artifacts stay out (see .dockerignore).
COPY pyproject.toml README.md ./
COPY contract ./contract
COPY model ./model
COPY client ./client
COPY export ./export
COPY engine ./engine
COPY server ./server
COPY loadtest ./loadtest
COPY checks ./checks
COPY cli ./cli
COPY protos ./protos
COPY --chmod=755 deploy/bundle.sh /usr/local/bin/seqserve-bundle
# A new named volume mounted on /artifacts starts as a copy of this directory, owner included.
RUN useradd --create-home --uid 10001 seqserve && mkdir /artifacts && chown seqserve /artifacts

FROM base AS runtime
RUN pip install .
USER seqserve
# Containers listen on every interface (the settings' defaults are 127.0.0.1); gRPC and /metrics on their defaults.
ENV SEQSERVE_BUNDLE=/artifacts/bundle SEQSERVE_BIND=0.0.0.0 SEQSERVE_PORT=50051 \
    SEQSERVE_METRICS_BIND=0.0.0.0 SEQSERVE_METRICS_PORT=50052
EXPOSE 50051 50052
# The standard grpc.health.v1 check: NOT_SERVING (exit 1) while loading, warming up or draining.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "seqserve.client.healthcheck", "127.0.0.1:50051"]
# SIGTERM drains: health NOT_SERVING, new calls UNAVAILABLE, in-flight calls finish within SEQSERVE_GRACE_SECONDS.
STOPSIGNAL SIGTERM
CMD ["seqserve", "serve"]

FROM runtime AS serve-gpu
USER root
# onnxruntime-gpu 1.31.1 is built for CUDA 13.x and cuDNN 9.x; its [cuda,cudnn] extras are exactly those runtime
# libraries (nvidia-cuda-runtime~=13.0, nvidia-cudnn-cu13~=9.0, ...), which engine/runtime/device.py preloads. The host
# needs only an NVIDIA driver for CUDA 13 and the NVIDIA Container Toolkit.
RUN pip install "onnxruntime-gpu[cuda,cudnn]==1.31.1"
USER seqserve
ENV SEQSERVE_DEVICE=cuda

FROM base AS train
# The CPU build of the pinned torch (PyPI's default torch wheel for Linux is the CUDA build: gigabytes).
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install ".[train]"
USER seqserve
VOLUME /artifacts
CMD ["seqserve-bundle", "build"]

FROM base AS loadtest
RUN pip install ".[loadtest]"
USER seqserve
EXPOSE 8089
ENTRYPOINT ["locust"]

# Last, so that a plain `docker build .` gives the CPU server.
FROM runtime AS serve
