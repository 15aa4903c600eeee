"""Fixtures of the replica e2e modules: the inference probe's golden answer
and two real tritonservers, each module-scoped (a module that asks for them
gets its own pair, stopped by the session's start_triton fixture)."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.launcher import TritonServer
from serving.probe_golden import ensure_golden


@pytest.fixture(scope="module")
def golden(model_dir: Path) -> Path:
    return ensure_golden(model_dir)


@pytest.fixture(scope="module")
def replicas(start_triton) -> dict[str, TritonServer]:
    return {"r0": start_triton(), "r1": start_triton()}
