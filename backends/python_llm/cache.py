"""Where the project keeps what it builds once per machine (converted models,
compiled kernels): `LLM_CACHE_DIR`, default $XDG_CACHE_HOME/triton-llm."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR = Path(
    os.environ.get("LLM_CACHE_DIR", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "triton-llm")
)
