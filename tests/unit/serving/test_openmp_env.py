"""The OpenMP environment every tritonserver of this project starts with:
bounded spinning for libgomp (the engine's kernels share torch's), passive
waiting for other runtimes, and the caller's own choice kept."""

from __future__ import annotations

from serving.openmp_env import OPENMP_SPIN_COUNT, apply_openmp_defaults


def test_defaults_fill_what_is_unset_and_keep_what_is_set() -> None:
    env: dict[str, str] = {}
    apply_openmp_defaults(env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": str(OPENMP_SPIN_COUNT)}
    mine = {"GOMP_SPINCOUNT": "0", "OMP_WAIT_POLICY": "ACTIVE"}
    apply_openmp_defaults(mine)
    assert mine == {"GOMP_SPINCOUNT": "0", "OMP_WAIT_POLICY": "ACTIVE"}
