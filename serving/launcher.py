"""Starts the official tritonserver on the rendered model repository, waits for
readiness, and stops it cleanly. Used by `make serve`, the tests and the
benchmark alike."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from .allocator import preload_allocator
from .children import (
    children_of,
    find_leftovers,
    group_alive,
    kill_and_wait,
    postprocessing_state_prefix,
    remove_shm,
    shm_prefix,
    spawn,
)
from .openmp_env import apply_openmp_defaults
from .paths import BUILD_DIR, REPO_ROOT
from .repository import render_repository
from .settings import DeploymentSettings
from .triton_binary import TritonSetupError, find_triton, prepare_backends

log = logging.getLogger(__name__)

# Triton's own error lines look like "E1129 12:00:00.123 123 file.cc:45] msg"
_ERROR_LINE = re.compile(r"^E\d{4} .*?\] (.*)$")
# Harmless on a CPU machine (no GPU, no NVML / DCGM, no pinned memory to allocate):
# never the cause of a failure.
_HARMLESS = ("CudaDriverHelper", "NVML", "DCGM", "pinned")
# Lines after which the server will never become ready, though it may not exit.
_FATAL = ("error while loading shared libraries", "failed to load", "Traceback (most recent call last)")
# After its exit timeout (in-flight inferences) tritonserver still unloads its
# models and ends its stubs: this long before it is killed.
_UNLOAD_MARGIN_S = 5.0
# Triton's Python-based backends in the repository; each takes the shm prefix
# in its own --backend-config (a prefix given to "python" alone leaves theirs
# at Triton's shared default).
_PYTHON_BACKENDS = ("python", "python_llm")


# Triton's own front is for the gateway and trusted callers only: single
# malformed requests can crash Triton 2.51's HTTP layer before any model code
# runs, and its admin APIs have no auth. It listens on loopback unless told otherwise.
DEFAULT_ADDRESS = "127.0.0.1"
# Addresses that mean "every interface": a local caller reaches them on loopback.
_WILDCARD_V4 = ("0.0.0.0", "")
_WILDCARD_V6 = ("::",)
# The admin groups a caller needs the key for. health, metadata, inference and
# model-config stay open: clients, probes and the contract tool use them.
RESTRICTED_APIS = ("model-repository", "logging", "trace", "shared-memory", "statistics")
# Lowercase because gRPC metadata keys must be; HTTP headers match in any case.
ADMIN_KEY_HEADER = "triton-admin-key"
# Triton 2.51 checks gRPC calls for the restricted key under this prefixed name.
ADMIN_KEY_GRPC_METADATA = f"triton-grpc-protocol-{ADMIN_KEY_HEADER}"
# Where `python -m serving serve` reads an operator-chosen key from.
ADMIN_KEY_ENV = "LLM_TRITON_ADMIN_KEY"
# A key travels inside Triton's "<groups>:<header>=<key>" flag and in a header:
# no separators, no whitespace, and long enough not to be guessed.
_ADMIN_KEY_FORM = re.compile(r"[A-Za-z0-9._~+/-]{16,}")


class TritonStartError(RuntimeError):
    pass


def is_loopback(address: str) -> bool:
    """True when `address` only accepts connections from this machine."""
    if address == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False  # a host name or garbage: assume it reaches the network
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def exposure_warning(address: str) -> str | None:
    """The warning for a Triton front that other machines can reach, or None."""
    if is_loopback(address):
        return None
    return (
        f"tritonserver listens on {address or '0.0.0.0'}, beyond loopback: its own HTTP/gRPC front can be "
        f"crashed by single malformed requests and its admin APIs only check a shared key, so it must sit "
        f"behind the gateway or on a trusted private network"
    )


def new_admin_key() -> str:
    return secrets.token_urlsafe(32)


def check_admin_key(key: str) -> str:
    """`key` if Triton can carry it safely; ValueError (not naming it) otherwise."""
    if not _ADMIN_KEY_FORM.fullmatch(key):
        raise ValueError("the Triton admin key must be at least 16 characters of A-Z a-z 0-9 . _ ~ + / -")
    return key


def write_admin_key(path: Path, key: str) -> None:
    """Write `key` readable by its owner only: created 0600 (never briefly wider)
    and renamed into place, so a reader sees the old key or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(fd, 0o600)  # exactly 0600 whatever the umask (it can only narrow the mode)
        handle.write(f"{key}\n")
    os.replace(tmp, path)


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
    address: str = DEFAULT_ADDRESS  # HTTP, gRPC and metrics alike
    admin_key: str | None = None  # None: a fresh random key at every start
    work_dir: Path = BUILD_DIR
    repository_source: Path = REPO_ROOT / "model_repository"  # templates + model.py files
    log_file: Path | None = None  # default: <work_dir>/tritonserver.log
    ready_timeout_s: float = 600.0
    log_verbose: int = 0
    extra_args: list[str] = field(default_factory=list)


class TritonServer:
    """One tritonserver process. Use as a context manager or start()/stop()."""

    def __init__(self, options: LaunchOptions) -> None:
        self.options = options
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = options.log_file or options.work_dir / "tritonserver.log"
        self.admin_key_path = options.work_dir / "admin_key"
        self.admin_key = check_admin_key(options.admin_key) if options.admin_key is not None else new_admin_key()
        self._log_handle: BinaryIO | None = None
        self.starts = 0
        # ours alone, so a start can tell its own leftovers from anybody else's
        self.shm_prefix = shm_prefix(options.work_dir)
        # every /dev/shm file of this server's: the backend's segments, the postprocessing state
        self.shm_files = (self.shm_prefix, postprocessing_state_prefix(options.work_dir / "model_repository"))
        warning = exposure_warning(options.address)
        if warning:
            log.warning(warning)

    # -- addresses -----------------------------------------------------------
    @property
    def host(self) -> str:
        """Where a local caller reaches the server (bracketed if IPv6, for URLs)."""
        address = self.options.address
        if address in _WILDCARD_V4:
            return "127.0.0.1"
        if address in _WILDCARD_V6:
            return "[::1]"
        return f"[{address}]" if ":" in address else address

    @property
    def admin_headers(self) -> dict[str, str]:
        """HTTP header for the restricted APIs (RESTRICTED_APIS)."""
        return {ADMIN_KEY_HEADER: self.admin_key}

    @property
    def admin_grpc_metadata(self) -> dict[str, str]:
        """gRPC metadata for the restricted protocols: Triton wants a prefixed name there."""
        return {ADMIN_KEY_GRPC_METADATA: self.admin_key}

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
        """The tritonserver's own pid (`process` is serving.reaper, its parent)."""
        if self.process is None:
            raise RuntimeError("server not started")
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            found = children_of(self.process.pid)
            if found:
                return found[0]
            time.sleep(0.05)
        raise RuntimeError(f"tritonserver not running under its reaper {self.process.pid}")

    # -- lifecycle -----------------------------------------------------------
    def command(self, repository: Path, backends: Path) -> list[str]:
        o = self.options
        restricted = f"{','.join(RESTRICTED_APIS)}:{ADMIN_KEY_HEADER}={self.admin_key}"
        return [
            str(find_triton().binary),
            f"--model-repository={repository}",
            f"--backend-directory={backends}",
            f"--http-port={o.http_port}",
            f"--grpc-port={o.grpc_port}",
            f"--metrics-port={o.metrics_port}",
            # metrics follows --http-address by default in 2.51; said explicitly so it never drifts
            f"--http-address={o.address}",
            f"--grpc-address={o.address}",
            f"--metrics-address={o.address}",
            f"--http-restricted-api={restricted}",
            f"--grpc-restricted-protocol={restricted}",
            "--allow-metrics=true",
            "--allow-cpu-metrics=true",
            "--metrics-interval-ms=1000",
            f"--log-verbose={o.log_verbose}",
            # Triton 2.51 counts an ensemble request cancelled mid-generation as in
            # flight forever, and waits this long for it at exit (default 30 s)
            f"--exit-timeout-secs={o.settings.server.exit_timeout_s}",
            *(f"--backend-config={b},shm-region-prefix-name={self.shm_prefix}{b}_" for b in _PYTHON_BACKENDS),
            *o.extra_args,
        ]

    def start(self) -> TritonServer:
        o = self.options
        o.work_dir.mkdir(parents=True, exist_ok=True)
        self.reclaim_stale()
        if o.admin_key is None:
            self.admin_key = new_admin_key()
        # before the server exists, so whoever sees it ready can read the key
        write_admin_key(self.admin_key_path, self.admin_key)
        log.info("Triton admin key (header %s) in %s", ADMIN_KEY_HEADER, self.admin_key_path)  # the path, never the key
        repository = render_repository(o.settings, o.work_dir / "model_repository", source=o.repository_source)
        backends = prepare_backends(find_triton(), o.work_dir / "backends")
        env = os.environ.copy()
        env.pop(ADMIN_KEY_ENV, None)  # the model code has no use for it
        # The stub embeds CPython and ignores PYTHONPATH; it finds the venv's
        # site-packages through the first python on PATH.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        apply_openmp_defaults(env)
        allocator = preload_allocator(env, o.settings.server.allocator)
        libs = str(find_triton().libraries)
        env["LD_LIBRARY_PATH"] = libs + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # a restart appends: the log of the run that died says why
        self._log_handle = open(self.log_path, "ab" if self.starts else "wb")
        self.starts += 1
        cmd = self.command(repository, backends)
        log.info(
            "starting tritonserver",
            extra={
                "log": str(self.log_path),
                "http_port": o.http_port,
                "allocator": str(allocator) if allocator else "system",
            },
        )
        # under serving.reaper, which removes its shm segments however it ends;
        # SIGTERM to the reaper when the launcher dies: the same stop as ours
        reaper = [sys.executable, "-m", "serving.reaper", ",".join(self.shm_files), str(self.stop_timeout_s), "--"]
        self.process = spawn(
            [*reaper, *cmd],
            signal.SIGTERM,
            env=env,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO_ROOT,
        )
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
                raise TritonStartError(
                    self._failure_message(f"tritonserver exited with code {self.process.returncode}")
                )
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
        errors = [
            m.group(1) for line in lines if (m := _ERROR_LINE.match(line)) and not any(h in line for h in _HARMLESS)
        ]
        hints = [line for line in lines if any(f in line for f in _FATAL) or "Error:" in line]
        first = errors[0] if errors else (hints[0] if hints else "(no error line in the log)")
        tail = "\n".join(lines[-25:])
        return f"{headline}\nfirst error: {first}\nlog: {self.log_path}\n--- last lines ---\n{tail}"

    def read_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def stop_timeout_s(self) -> float:
        """How long a stop waits for tritonserver's own exit before SIGKILL."""
        return self.options.settings.server.exit_timeout_s + _UNLOAD_MARGIN_S

    def reclaim_stale(self) -> None:
        """What an earlier server of this work dir left running (its launcher
        was killed before it could stop it: a tritonserver, stubs) is killed,
        and its shm segments removed, each said in the log. Ours alone: a
        process is ours by this work dir's repository in its command line and
        stale only when it lost its launcher; a segment by our prefix, and
        only when no live process maps it. A live server of this work dir
        (another serve) is an error, never killed."""
        found = find_leftovers(str((self.options.work_dir / "model_repository").resolve()))
        busy = [pid for pid in found.in_use if "tritonserver" in Path(f"/proc/{pid}/comm").read_text(errors="replace")]
        if busy:
            raise TritonStartError(
                f"a tritonserver (pid {', '.join(map(str, busy))}) already serves "
                f"{self.options.work_dir}, started by a launcher still running: stop it first"
            )
        if found.stale:
            log.warning(
                "an earlier tritonserver of %s outlived its launcher (pids %s): killing it",
                self.options.work_dir,
                ", ".join(map(str, found.stale)),
            )
            kill_and_wait(found.stale)
        removed = remove_shm(*self.shm_files)
        if removed:
            log.warning(
                "removed %d shared-memory segments an earlier tritonserver of %s left in /dev/shm",
                len(removed),
                self.options.work_dir,
            )

    def stop(self, timeout_s: float | None = None) -> int | None:
        """SIGINT (Triton's graceful exit: it waits server.exit_timeout_s for
        in-flight inferences, then unloads its models), SIGKILL to its process
        group (its stubs) past `timeout_s` (default stop_timeout_s); then its
        shm segments are removed, whichever way it ended."""
        proc, self.process = self.process, None
        code = None
        # the reaper kills it at stop_timeout_s; this is for a reaper that cannot
        bound = self.stop_timeout_s + 2.0 if timeout_s is None else timeout_s
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(bound)
                except subprocess.TimeoutExpired:
                    log.warning(
                        "tritonserver (reaper %d) still running %.0f s after SIGINT: killed with its stubs",
                        proc.pid,
                        bound,
                    )
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            code = proc.returncode
            # Its Python stubs share its process group; after a crash they would
            # outlive it (1.5 GB each), so the group goes with it.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 10.0
            while group_alive(proc.pid) and time.monotonic() < deadline:  # their maps go with them
                time.sleep(0.05)
            removed = remove_shm(*self.shm_files)
            if removed:
                log.info("removed %d shared-memory segments tritonserver %d left", len(removed), proc.pid)
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        return code

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = [
    "ADMIN_KEY_ENV",
    "ADMIN_KEY_GRPC_METADATA",
    "ADMIN_KEY_HEADER",
    "DEFAULT_ADDRESS",
    "RESTRICTED_APIS",
    "LaunchOptions",
    "TritonServer",
    "TritonStartError",
    "TritonSetupError",
    "exposure_warning",
    "is_loopback",
]
