"""Child processes that never outlive the launcher, and finding what an
earlier launcher left behind.

A child asks the kernel for a signal when its parent dies (Linux
`prctl(PR_SET_PDEATHSIG)`, set between fork and exec). The kernel sends it
when the *thread* that forked the child exits, not the process: every child
is therefore forked by one long-lived thread of this module (`spawn`), never
by a short-lived start thread. A launcher killed by SIGKILL thus takes its
tritonservers and its gateway with it; a tritonserver's Python stubs notice
their parent gone on their own (they poll it every 300 ms).

What survives even that (Triton's Python backend's /dev/shm segments: the
server unlinks them only when it unloads its models) is named with a prefix
of this work dir's (`shm_prefix`), so the next start finds and removes
exactly its own."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
_PR_SET_PDEATHSIG = 1
# the C library this interpreter already has loaded: ctypes.util.find_library
# would run `ldconfig -p` in a child process at import
_libc = ctypes.CDLL(None, use_errno=True)


def pdeathsig(sig: int, parent: int) -> Callable[[], None]:
    """The preexec step: ask for `sig` when the parent dies; if it died
    already (between fork and here), the kernel will never send it, so die now."""

    def arm() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return arm


@dataclass
class _Request:
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Future[subprocess.Popen[Any]]


class _Spawner:
    """The one thread that forks every child: alive as long as the process."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> subprocess.Popen[Any]:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="child-spawner", daemon=True)
                self._thread.start()
        request = _Request(args, kwargs, Future())
        self._queue.put(request)
        return request.result.result()

    def _run(self) -> None:
        while True:
            request = self._queue.get()
            try:
                request.result.set_result(subprocess.Popen(*request.args, **request.kwargs))
            except BaseException as exc:  # handed to the caller, whose error it is
                request.result.set_exception(exc)


_SPAWNER = _Spawner()


def spawn(command: list[str], death_signal: int = signal.SIGKILL, **popen_kwargs: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(command, **popen_kwargs)`, the child getting
    `death_signal` when this process dies, however it dies."""
    popen_kwargs["preexec_fn"] = pdeathsig(death_signal, os.getpid())
    return _SPAWNER.submit((command,), popen_kwargs)


def children_of(pid: int) -> list[int]:
    """The live children of `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _parent(int(entry.name)) == pid and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def shm_prefix(work_dir: Path) -> str:
    """The Python backend's shm region prefix for the server of `work_dir`:
    one per work dir, so two servers on a machine never share one and a
    start can tell its own leftovers from anybody else's."""
    digest = hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:12]
    return f"tllm_{digest}_"


def _mapped_shm() -> set[str]:
    """Names of the /dev/shm files some live process has mapped."""
    mapped = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "maps").read_text(errors="replace")
        except OSError:  # gone, or not ours to read
            continue
        for line in text.splitlines():
            where = line.find(f"{SHM_DIR}/")
            if where >= 0:
                mapped.add(line[where + len(str(SHM_DIR)) + 1 :].split(" ")[0])
    return mapped


def postprocessing_state_prefix(repository: Path) -> str:
    """The postprocessing stage's shared state file in /dev/shm (with several
    instances; model_repository/postprocessing/1/model.py names it so)."""
    tag = hashlib.sha1(os.path.realpath(repository / "postprocessing").encode()).hexdigest()[:16]
    return f"triton-llm-postprocessing-{tag}.sqlite"


def remove_shm(*prefixes: str) -> list[str]:
    """Unlink the /dev/shm files named `prefixes`* that no live process has
    mapped (a running server's are left alone); their names."""
    try:
        names = [p.name for p in SHM_DIR.iterdir() if p.name.startswith(prefixes)]
    except OSError:
        return []
    if not names:
        return []
    mapped = _mapped_shm()
    removed = []
    for name in names:
        if name in mapped:
            continue
        try:
            (SHM_DIR / name).unlink()
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def _cmdline(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def _comm(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces


def _mentions(cmdline: bytes, marks: list[bytes]) -> bool:
    """Every mark as a whole argument or path: "/a/repo" matches "--x=/a/repo"
    and "/a/repo/m/1", never "/a/repo_old"."""
    return all(
        any(cmdline[i + len(m) : i + len(m) + 1] in (b"", b"\0", b"/") for i in _find_all(cmdline, m)) for m in marks
    )


def _find_all(text: bytes, mark: bytes) -> list[int]:
    found, at = [], text.find(mark)
    while at >= 0:
        found.append(at)
        at = text.find(mark, at + 1)
    return found


@dataclass(frozen=True)
class Leftovers:
    """Processes whose command line carries our marks: `stale` ones lost the
    launcher that started them (their parent is neither a Python launcher nor
    one of ours), `in_use` ones still have it."""

    stale: list[int]
    in_use: list[int]


# parents that make a marked process someone's live child: a launcher (or a
# test) in Python, or a tritonserver for its stubs
_OWNERS = ("python", "pytest", "tritonserver")


def find_leftovers(*marks: str) -> Leftovers:
    wanted = [m.encode() for m in marks]
    stale: list[int] = []
    in_use: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        if not _mentions(_cmdline(pid), wanted):
            continue
        parent = _parent(pid)
        owned = parent == os.getpid() or (parent > 1 and _comm(parent).startswith(_OWNERS))
        (in_use if owned else stale).append(pid)
    return Leftovers(stale, in_use)


def kill_and_wait(pids: list[int], bound_s: float = 10.0) -> None:
    """SIGKILL each of `pids` and wait until they are gone (their shm maps with them)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its (new) parent to reap it."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies do not count)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[2]) == pgid and stat[0] != "Z":
                return True
    return False


__all__ = [
    "Leftovers",
    "children_of",
    "find_leftovers",
    "group_alive",
    "kill_and_wait",
    "pdeathsig",
    "postprocessing_state_prefix",
    "remove_shm",
    "shm_prefix",
    "spawn",
]
