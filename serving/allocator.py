"""The memory allocator of every tritonserver this project starts: TCMalloc,
preloaded into the server and so into its Python stubs, or the system's.

Measured on the 2-core Zen 4 (`python -m bench --only engine,triton
--served-rounds 3`, two runs each, docs/benchmarks.md): the ensemble served
0.76x and 0.83x of the engine offline on glibc's malloc, 0.89x and 0.87x on
TCMalloc (served tok/s, median of the six rounds: 126 -> 145); the engine
offline alone was no faster on it. Most likely the gain is the stubs' and
the server's many small allocations per response (tensors, protobufs,
Python objects) on several threads: what TCMalloc's per-thread caches are
for (not profiled further). jemalloc was
slower than glibc there (the offline engine 4.8%, with the MALLOC_CONF
PyTorch's CPU tuning guides give).

TCMalloc comes from Debian's libtcmalloc-minimal4, unpacked into
build/tools by `make tools` (no system install), or from the system (the
CPU container installs the package). Where neither has it, the server runs
on the system allocator and the launcher says so.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Iterable, MutableMapping
from pathlib import Path
from typing import Literal

from .paths import BUILD_DIR

log = logging.getLogger(__name__)

Allocator = Literal["tcmalloc", "system"]

TCMALLOC_LIBRARY = "libtcmalloc_minimal.so.4"


def _multiarch_dir() -> str:
    return f"usr/lib/{platform.machine()}-linux-gnu"


def tcmalloc_candidates() -> list[Path]:
    """Where the library is looked for, in order: the copy `make tools`
    unpacks, then the system's (Debian's multiarch directory)."""
    return [
        BUILD_DIR / "tools" / "tcmalloc" / _multiarch_dir() / TCMALLOC_LIBRARY,
        Path("/") / _multiarch_dir() / TCMALLOC_LIBRARY,
    ]


def find_tcmalloc(candidates: Iterable[Path] | None = None) -> Path | None:
    for path in tcmalloc_candidates() if candidates is None else candidates:
        if path.is_file():
            return path
    return None


def preload_allocator(
    env: MutableMapping[str, str], allocator: Allocator, candidates: Iterable[Path] | None = None
) -> Path | None:
    """Put `allocator` ahead of the environment's LD_PRELOAD; returns the
    library preloaded, or None (the system allocator)."""
    if allocator == "system":
        return None
    looked = tcmalloc_candidates() if candidates is None else list(candidates)
    library = find_tcmalloc(looked)
    if library is None:
        log.warning(
            "tcmalloc not found (looked in %s; `make tools` unpacks it): tritonserver runs on the system allocator",
            ", ".join(str(p) for p in looked),
        )
        return None
    preloaded = [p for p in env.get("LD_PRELOAD", "").split(os.pathsep) if p]
    env["LD_PRELOAD"] = os.pathsep.join([str(library), *preloaded])
    return library
