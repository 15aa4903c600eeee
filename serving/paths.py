"""Where the project keeps what it builds and caches."""

from __future__ import annotations

import os
from pathlib import Path

from python_llm.cache import CACHE_DIR

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = Path(os.environ.get("LLM_BUILD_DIR", REPO_ROOT / "build"))

__all__ = ["BUILD_DIR", "CACHE_DIR", "REPO_ROOT"]
