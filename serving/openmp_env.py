"""The OpenMP environment of every tritonserver this project starts (the
engine's stub and its kernels share torch's libgomp).

OpenMP workers spin a while after each parallel region, then sleep.
libgomp's default (300,000 spins, ~14 ms on the 2-core machines) keeps idle
workers burning the cores the other stubs (pre/postprocessing) and the
server need; passive waiting (no spin at all) makes each of a step's ~300
kernel calls wait for its workers to wake: 16% of the offline workload's time
(16.1 vs 18.7 s, docs/benchmarks.md). 30,000 spins (~1.4 ms) bridge the gaps
inside a step and let the workers sleep soon after it.
"""

from __future__ import annotations

from collections.abc import MutableMapping

OPENMP_SPIN_COUNT = 30_000


def apply_openmp_defaults(env: MutableMapping[str, str]) -> None:
    """Set what the caller's environment does not already choose."""
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # runtimes other than libgomp: no spinning
    env.setdefault("GOMP_SPINCOUNT", str(OPENMP_SPIN_COUNT))  # libgomp: this bound, even when passive
