"""The TensorRT-LLM release this variant is pinned to, and where the names it
uses come from (tests/data/trtllm/ holds the lists, with the same sources).

Triton 2.51 is release 24.10; NVIDIA's `nvcr.io/nvidia/tritonserver:24.10-trtllm-python-py3`
ships TensorRT-LLM 0.14.0 (Triton's Release Compatibility Matrix, docs.nvidia.com/deeplearning/
triton-inference-server/archives/triton-inference-server-2530/user-guide/docs/introduction/compatibility.html),
whose Triton backend is triton-inference-server/tensorrtllm_backend at tag v0.14.0.
"""

from __future__ import annotations

TENSORRT_LLM_VERSION = "0.14.0"
TRITON_CONTAINER = "nvcr.io/nvidia/tritonserver:24.10-trtllm-python-py3"
TRITON_SERVER_VERSION = "2.51.0"
BACKEND_REPOSITORY = "https://github.com/triton-inference-server/tensorrtllm_backend"
BACKEND_TAG = "v0.14.0"
BACKEND_COMMIT = "9958c21167e1a8e6bbddafc09b284904aaf22ab1"
# the template the engine model's names come from, at BACKEND_TAG
TEMPLATE_PATH = "all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt"
# where the container keeps Triton and the TensorRT-LLM backend
CONTAINER_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
CONTAINER_BACKEND_DIR = "/opt/tritonserver/backends/tensorrtllm"
EXECUTOR_WORKER = f"{CONTAINER_BACKEND_DIR}/trtllmExecutorWorker"
