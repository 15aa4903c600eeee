"""Starts the official tritonserver on the rendered model repository, waits for
readiness, and stops it cleanly. Used by `make serve`, the tests and the
benchmark alike."""
from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .paths import BUILD_DIR, REPO_ROOT
from .repository import DeploymentSettings, render_repository
from .triton_binary import TritonSetupError, find_triton, prepare_backends

log = logging.getLogger(__name__)

# Triton's own error lines look like "E1129 12:00:00.123 123 file.cc:45] msg"
_ERROR_LINE = re.compile(r"^E\d{4} .*?\] (.*)$")
# Harmless on a CPU machine (see docs/triton-on-cpu.md): not the cause of anything.
_HARMLESS = ("CudaDriverHelper", "NVML", "DCGM", "pinned")
# Lines after which the server will never become ready, though it may not exit.
_FATAL = ("error while loading shared libraries", "failed to load", "Traceback (most recent call last)")


class TritonStartError(RuntimeError):
    pass


def free_local_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now, for servers that must not collide with a
    `make serve` on 8000-8002 (tests, benchmarks)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class LaunchOptions:
    settings: DeploymentSettings
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    address: str = "0.0.0.0"
    work_dir: Path = BUILD_DIR
    repository_source: Path = REPO_ROOT / "model_repository"   # templates + model.py files
    log_file: Path | None = None          # default: <work_dir>/tritonserver.log
    ready_timeout_s: float = 600.0
    log_verbose: int = 0
    extra_args: list[str] = field(default_factory=list)


class TritonServer:
    """One tritonserver process. Use as a context manager or start()/stop()."""

    def __init__(self, options: LaunchOptions) -> None:
        self.options = options
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = options.log_file or options.work_dir / "tritonserver.log"
        self._log_handle = None

    # -- addresses -----------------------------------------------------------
    @property
    def host(self) -> str:
        return "127.0.0.1" if self.options.address in ("0.0.0.0", "") else self.options.address

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.options.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.options.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.options.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("server not started")
        return self.process.pid

    # -- lifecycle -----------------------------------------------------------
    def command(self, repository: Path, backends: Path) -> list[str]:
        o = self.options
        return [
            str(find_triton().binary),
            f"--model-repository={repository}",
            f"--backend-directory={backends}",
            f"--http-port={o.http_port}", f"--grpc-port={o.grpc_port}", f"--metrics-port={o.metrics_port}",
            f"--http-address={o.address}", f"--grpc-address={o.address}",
            "--allow-metrics=true", "--allow-cpu-metrics=true", "--metrics-interval-ms=1000",
            f"--log-verbose={o.log_verbose}",
            *o.extra_args,
        ]

    def start(self) -> "TritonServer":
        o = self.options
        o.work_dir.mkdir(parents=True, exist_ok=True)
        repository = render_repository(o.settings, o.work_dir / "model_repository", source=o.repository_source)
        backends = prepare_backends(find_triton(), o.work_dir / "backends")
        env = os.environ.copy()
        # The stub embeds CPython and ignores PYTHONPATH; it finds the venv's
        # site-packages through the first python on PATH.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        # Idle OpenMP threads spinning would steal the cores the other stubs
        # (pre/postprocessing) need; passive waiting costs nothing measurable.
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        libs = str(find_triton().libraries)
        env["LD_LIBRARY_PATH"] = libs + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_handle = open(self.log_path, "wb")
        cmd = self.command(repository, backends)
        log.info("starting tritonserver", extra={"log": str(self.log_path), "http_port": o.http_port})
        self.process = subprocess.Popen(cmd, env=env, stdout=self._log_handle, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        try:
            self.wait_ready(o.ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise TritonStartError(self._failure_message(f"tritonserver exited with code {self.process.returncode}"))
            if self.is_ready():
                return
            fatal = [line for line in self.read_log().splitlines() if any(f in line for f in _FATAL)]
            if fatal:
                time.sleep(1.0)  # let the rest of the traceback reach the log
                raise TritonStartError(self._failure_message("tritonserver cannot start"))
            time.sleep(0.25)
        raise TritonStartError(self._failure_message(f"tritonserver not ready after {timeout_s:.0f} s"))

    def _failure_message(self, headline: str) -> str:
        lines = self.read_log().splitlines()
        errors = [m.group(1) for line in lines
                  if (m := _ERROR_LINE.match(line)) and not any(h in line for h in _HARMLESS)]
        hints = [line for line in lines if any(f in line for f in _FATAL) or "Error:" in line]
        first = errors[0] if errors else (hints[0] if hints else "(no error line in the log)")
        tail = "\n".join(lines[-25:])
        return f"{headline}\nfirst error: {first}\nlog: {self.log_path}\n--- last lines ---\n{tail}"

    def read_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> int | None:
        proc, self.process = self.process, None
        code = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            code = proc.returncode
            # Its Python stubs share its process group; after a crash they would
            # outlive it (1.5 GB each), so the group goes with it.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        return code

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["LaunchOptions", "TritonServer", "TritonStartError", "TritonSetupError"]
