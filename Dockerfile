# syntax=docker/dockerfile:1
# seqserve images. The serving image holds onnxruntime + grpcio + tokenizers + numpy + prometheus-client and no
# torch; it does not train. Build the bundle on the host first (`make export` writes artifacts/bundle) and mount it
# at /bundle (docker-compose.yml does). Targets:
#   serve     (default)  the gRPC server, CPU execution provider (onnxruntime-gpu falls back to CPU without CUDA)
#   serve-gpu            the same plus the CUDA 13 / cuDNN 9 runtime wheels onnxruntime-gpu 1.31 loads
#   loadtest             locust and the seqserve load-test driver, for `docker compose --profile loadtest up`

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# Only what the package build needs; tests, docs and artifacts stay out (see .dockerignore).
COPY pyproject.toml README.md ./
COPY contract ./contract
COPY model ./model
COPY export ./export
COPY server ./server
COPY loadtest ./loadtest
COPY checks ./checks
COPY cli ./cli
COPY protos ./protos
RUN useradd --create-home --uid 10001 seqserve

FROM base AS serve
RUN pip install .
USER seqserve
ENV SEQSERVE_BUNDLE=/bundle SEQSERVE_HOST=0.0.0.0 SEQSERVE_PORT=50051 SEQSERVE_METRICS_PORT=9090
EXPOSE 50051 9090
# The standard grpc.health.v1 check: NOT_SERVING while loading, warming up or draining.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 CMD ["python", "-m", "seqserve.server.healthcheck", "127.0.0.1:50051"]
# SIGTERM drains: health NOT_SERVING, new calls UNAVAILABLE, in-flight calls finish within SEQSERVE_GRACE_SECONDS.
STOPSIGNAL SIGTERM
CMD ["seqserve", "serve"]

FROM serve AS serve-gpu
USER root
# The CUDA libraries come as nvidia-* wheels beside onnxruntime; server/device.py loads them (onnxruntime.preload_dlls).
RUN pip install "onnxruntime-gpu[cuda,cudnn]==1.31.1"
USER seqserve
ENV SEQSERVE_DEVICE=cuda

FROM base AS loadtest
RUN pip install ".[loadtest]"
USER seqserve
EXPOSE 8089
ENTRYPOINT ["locust"]
