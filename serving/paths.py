"""Where the project keeps what it builds and caches."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = Path(os.environ.get("LLM_BUILD_DIR", REPO_ROOT / "build"))
CACHE_DIR = Path(os.environ.get("LLM_CACHE_DIR",
                                Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "triton-llm"))
