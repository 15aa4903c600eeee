"""The terms of a fairness run's TTFT (`docs/benchmarks.md`, "Issue 18 at
a glance"): with s the long prompt's mean step, d the streams' part of it
and c what its slices cost against the same tokens alone,

    TTFT / alone = c x s / (s - d)

From the steps of one `bench.fairness` point: the pacer's aim and the
runner's own seconds of each step's layer slice, and the run alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

# the streams' part at the start and at the end: the median of this part of the slice steps
EDGE_SHARE = 0.1


def alone_fit(alone_steps: Sequence[Sequence[float]]) -> tuple[float, float] | None:
    """(a, b) of seconds = n (a + b (s + n / 2)) over the run alone's chunks
    (start s, n tokens, through every layer): a token's fixed cost, and its
    attention's per earlier position. None with fewer than two chunks."""
    chunks = [(s, n, t) for s, n, t in alone_steps if n > 0]
    if len(chunks) < 2:
        return None
    x = np.array([[n, n * (s + n / 2)] for s, n, _ in chunks])
    y = np.array([t for *_, t in chunks])
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(a), float(b)


def step_terms(
    during_steps: Sequence[Sequence[float]],
    aims: Sequence[float | None],
    slice_own_s: Sequence[float | None],
    alone_steps: Sequence[Sequence[float]],
    num_layers: int,
) -> dict[str, float | None]:
    """`fill`: the paced steps' median seconds over their aim.
    `slice_cost` (c): the slices' own seconds over what their token-layers
    cost alone (by `alone_fit`). `streams_part_start_ms` / `_end_ms`: a
    slice step's seconds less its slice's, at the start and at the end of
    the prompt. None where the run has none of those steps."""
    fills = [step[2] / aim for step, aim in zip(during_steps, aims) if aim]
    sliced = [
        (step, own) for step, own in zip(during_steps, slice_own_s) if own is not None and 0 < step[3] < num_layers
    ]
    fit = alone_fit(alone_steps)
    slice_cost = None
    if sliced and fit is not None:
        a, b = fit
        expected = sum(layers / num_layers * n * (a + b * (s + n / 2)) for (s, n, _, layers), _ in sliced)
        slice_cost = sum(own for _, own in sliced) / expected if expected > 0 else None
    parts = [step[2] - own for step, own in sliced]
    edge = max(int(len(parts) * EDGE_SHARE), 1)
    return {
        "fill": statistics.median(fills) if fills else None,
        "slice_cost": slice_cost,
        "streams_part_start_ms": 1e3 * statistics.median(parts[:edge]) if parts else None,
        "streams_part_end_ms": 1e3 * statistics.median(parts[-edge:]) if parts else None,
    }
