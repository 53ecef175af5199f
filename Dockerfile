# syntax=docker/dockerfile:1
# Tensor Debugger's image: the app, its CLI and (from the `cluster` extra) what a replica on PostgreSQL needs.
# Two stages: `build` compiles the statistics kernels and the chunk loop (gcc, C-Blosc2 from the blosc2 wheel) into
# a virtual environment; the runtime stage copies that environment alone and runs as a non-root user. Nothing is
# installed when a container starts. docker-compose.yml builds it once and runs every service of ours from it.
ARG PYTHON=3.11

FROM python:${PYTHON}-slim-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/tensor-debugger PATH=/opt/tensor-debugger/bin:$PATH PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv "$VIRTUAL_ENV"
# A CPU build of torch first (the one the Makefile pins), so that no resolver pulls CUDA packages.
ARG TORCH=torch==2.13.0
RUN pip install "$TORCH" --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md /src/
COPY server /src/server
COPY web /src/web
COPY migrations /src/migrations
RUN pip install "/src[cluster]" \
    && python -c "from tensor_debugger.engine.fused import kernel_name; from tensor_debugger.compare.compute.chunk_loop \
import loop_name; k, l = kernel_name(), loop_name(); print('kernels:', k, '| chunk loop:', l); \
assert k == 'compiled', k"

FROM python:${PYTHON}-slim-bookworm
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /data tensor \
    && mkdir /data && chown tensor:tensor /data
COPY --from=build /opt/tensor-debugger /opt/tensor-debugger
ENV PATH=/opt/tensor-debugger/bin:$PATH PYTHONUNBUFFERED=1 \
    TENSOR_DEBUGGER_DATA_DIR=/data TENSOR_DEBUGGER_HOST=0.0.0.0 TENSOR_DEBUGGER_PORT=8000
USER tensor
WORKDIR /data
VOLUME /data
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
CMD ["tensor-debugger", "serve"]
