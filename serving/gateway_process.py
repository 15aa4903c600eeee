"""Running `python -m gateway serve` as a child process: what `python -m
serving serve` and the end-to-end tests use (its own interpreter, so a
gateway crash never takes Triton down, and Ctrl-C reaches both)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from .children import spawn


class GatewayStartError(RuntimeError):
    pass


def _ops_port_assigned(assignments: list[str]) -> int | None:
    given = [a.partition("=")[2] for a in assignments if a.partition("=")[0].strip() == "gateway.ops_port"]
    return int(given[-1]) if given else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class GatewayProcess:
    def __init__(
        self,
        assignments: list[str],
        log_path: Path,
        *,
        port: int,
        settings_file: str | None = None,
        probe_host: str = "127.0.0.1",
    ) -> None:
        """`port`: the gateway.port the child will listen on, for the health probe.
        Its ops port (/metrics, /admin/*; `ops_url`, None when 0: off) is the last
        `gateway.ops_port=` of `assignments` (a settings file or the environment is
        not read here: the caller passes the resolved value), else a free loopback
        port added now, so that gateways side by side (tests, benchmarks) never
        meet on the default."""
        ops_port = _ops_port_assigned(assignments)
        if ops_port is None:
            ops_port = _free_port()
            assignments = [*assignments, f"gateway.ops_port={ops_port}"]
        self.assignments = assignments
        self.log_path = log_path
        self.settings_file = settings_file
        self.health_url = f"http://{probe_host}:{port}/health"
        # the operational endpoints, never on the public port (gateway/ops/server.py); None when off
        self.ops_url = f"http://{probe_host}:{ops_port}" if ops_port else None
        self.metrics_url = f"{self.ops_url}/metrics" if self.ops_url else None
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "gateway", "serve"]
        if self.settings_file:
            command += ["--settings", self.settings_file]
        for assignment in self.assignments:
            command += ["--set", assignment]
        return command

    def start(self, ready_timeout_s: float = 60.0) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # its own process group: a terminal's Ctrl-C goes to the parent, which stops it in order;
            # killed with its parent, however that dies (children.py)
            self.process = spawn(
                self.command(),
                signal.SIGKILL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=Path(__file__).resolve().parent.parent,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise GatewayStartError(f"the gateway exited with code {self.process.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.health_url, timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise GatewayStartError(f"the gateway was not ready within {ready_timeout_s:.0f} s; see {self.log_path}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 15.0) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode
