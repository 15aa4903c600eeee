"""Where the gateway keeps its own files when its settings name none (the API
key store, the admin key): the deployment's build directory, `LLM_BUILD_DIR`
(set by the launcher's environment, the images and the pods), else `build/`
in this checkout, the same place as the rest of the stack's (serving/paths.py).
Read from the environment, not from the launcher's code: the gateway runs
alone too (`python -m gateway serve`)."""

from __future__ import annotations

import os
from pathlib import Path

# gateway/lifecycle/state_dir.py → the checkout
_CHECKOUT = Path(__file__).resolve().parents[2]


def state_dir() -> Path:
    return Path(os.environ.get("LLM_BUILD_DIR", _CHECKOUT / "build"))
