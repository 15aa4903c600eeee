"""Progress display for the long parts (to stderr, so the table stays clean)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm


@contextmanager
def progress_bar(total: int, description: str, unit: str = "tok") -> Iterator[tqdm]:
    bar = tqdm(
        total=total, desc=description, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True, mininterval=1.0
    )
    try:
        yield bar
    finally:
        bar.close()
