"""The tensorrt_llm variant's repository with a test double in place of
TensorRT-LLM's backend (GPU only): the rendered config with only the backend
swapped, and tests/data/trtllm/fake_engine/model.py as the model."""

from __future__ import annotations

import shutil
from pathlib import Path

from serving.launcher import LaunchOptions, TritonServer, free_local_ports
from serving.paths import REPO_ROOT
from serving.settings import DeploymentSettings
from serving.trtllm.engine_config import ENGINE_MODEL_NAME

FAKE_ENGINE = REPO_ROOT / "tests" / "data" / "trtllm" / "fake_engine" / "model.py"


def repository_with_fake_engine(source: Path) -> Path:
    """Copies the model repository to `source` with the double as the engine."""
    shutil.copytree(REPO_ROOT / "model_repository", source, ignore=shutil.ignore_patterns("__pycache__"))
    template = source / ENGINE_MODEL_NAME / "config.pbtxt.template"
    text = template.read_text()
    if 'backend: "tensorrtllm"' not in text:
        raise RuntimeError(f"{template} no longer names the tensorrtllm backend")
    template.write_text(text.replace('backend: "tensorrtllm"', 'backend: "python"'))
    shutil.copy2(FAKE_ENGINE, source / ENGINE_MODEL_NAME / "1" / "model.py")
    return source


def trtllm_variant_server(model_dir: Path, source: Path, work_dir: Path) -> TritonServer:
    """A tritonserver (not started) serving the variant from `source`."""
    settings = DeploymentSettings.load(
        environ={}, model_dir=str(model_dir), **{"server.llm_model_name": "tensorrt_llm"}
    )
    http, grpc, metrics = free_local_ports(3)
    return TritonServer(
        LaunchOptions(
            settings=settings,
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            address="127.0.0.1",
            work_dir=work_dir,
            repository_source=source,
            ready_timeout_s=300,
        )
    )
