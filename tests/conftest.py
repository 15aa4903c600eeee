"""Shared fixtures: the default model folder and real tritonserver instances.

Every server a test starts is stopped by its fixture. Ports are picked free
so tests never collide with a `make serve` running on 8000-8002.
"""

from __future__ import annotations

import os

# before torch is imported anywhere: spinning OpenMP threads starve the other
# processes (servers, clients) that share the 2 cores of a CI machine
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from serving.default_model import ensure_default_model
from serving.launcher import LaunchOptions, TritonServer, free_local_ports
from serving.settings import DeploymentSettings


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return ensure_default_model()


ServerFactory = Callable[..., TritonServer]


# servers started by the running test module (not the session's shared one)
_module_servers: list[TritonServer] = []


@pytest.fixture(scope="module", autouse=True)
def stop_module_servers() -> Iterator[None]:
    """A module's servers stop when it ends, not with the session: a python_llm
    stub holds its weights and KV cache (1.5-2.3 GB), and a session's worth
    of them does not fit in a CI machine's 24 GB."""
    yield
    while _module_servers:
        _module_servers.pop().stop()


@pytest.fixture(scope="session")
def start_triton(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """Start a real tritonserver with DeploymentSettings overrides; each is
    stopped when its test module ends (or earlier by the test), the shared
    session server (`session=True`) at the end of the session."""
    started: list[TritonServer] = []

    def start(session: bool = False, **overrides: object) -> TritonServer:
        # environ={}: the tests' servers do not follow the developer's LLM__* variables
        settings = DeploymentSettings.load(environ={}, model_dir=str(model_dir), **overrides)
        http, grpc, metrics = free_local_ports(3)
        work = tmp_path_factory.mktemp("triton")
        server = TritonServer(
            LaunchOptions(
                settings=settings,
                http_port=http,
                grpc_port=grpc,
                metrics_port=metrics,
                address="127.0.0.1",
                work_dir=work,
                ready_timeout_s=300,
            )
        )
        t0 = time.monotonic()
        server.start()
        print(f"\n[tritonserver ready in {time.monotonic() - t0:.1f} s on :{http}; log {server.log_path}]")
        started.append(server)
        if not session:
            _module_servers.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def triton_server(start_triton: ServerFactory) -> TritonServer:
    """The default deployment, shared by the tests that need nothing special."""
    return start_triton(session=True, postprocessing_instances=4, max_queue_size=512)
