"""Fixtures shared by the native kernels' tests."""

from __future__ import annotations

import pytest
import torch

from python_llm.engine.worker.kernels import CpuKernels, cpu_kernels


@pytest.fixture(scope="module")
def native() -> CpuKernels:
    built = cpu_kernels()
    assert built is not None, "the CPU kernels did not build on this machine (see the warning log)"
    return built


@pytest.fixture
def threads():
    """torch.set_num_threads for one test, the count restored after it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)
