"""Children that never outlive the launcher and a start that reclaims only
its own leftovers, on real processes and real /dev/shm files (no Triton):
the parent-death signal, the reaper's cleanup, `reclaim_stale`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from serving.children import SHM_DIR, find_leftovers, remove_shm, shm_prefix, spawn
from serving.launcher import LaunchOptions, TritonServer, TritonStartError
from serving.settings import DeploymentSettings

SLEEP = "import time; time.sleep(60)"


def _gone(pid: int, bound_s: float = 10.0) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _orphan(*args: str) -> int:
    """A sleeping process whose parent has exited (what a SIGKILLed launcher leaves); its pid."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; p = subprocess.Popen(sys.argv[1:], "
            "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
            "print(p.pid)",
            sys.executable,
            "-c",
            SLEEP,
            *args,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


def test_a_spawned_child_dies_with_its_parent_even_by_sigkill(tmp_path: Path):
    # a parent that spawns a child from a short-lived thread, then is SIGKILLed
    code = (
        "import signal, sys, threading, time\nfrom serving.children import spawn\n"
        "t = threading.Thread(target=lambda: print(spawn([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " signal.SIGKILL).pid, flush=True))\nt.start(); t.join(); time.sleep(60)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[3]
    )
    try:
        child = int(parent.stdout.readline())  # type: ignore[union-attr]
        time.sleep(0.3)
        assert psutil.Process(child).is_running(), "the child died with its spawning thread"
        parent.kill()
        parent.wait()
        assert _gone(child), "the child outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_the_reaper_passes_sigint_on_and_removes_its_shm_files(tmp_path: Path):
    prefix = f"tllm_test{uuid.uuid4().hex[:8]}_"
    (SHM_DIR / f"{prefix}segment").write_bytes(b"x")
    reaper = spawn(
        [
            sys.executable,
            "-m",
            "serving.reaper",
            prefix,
            "5",
            "--",
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGINT, lambda *_: sys.exit(0)); time.sleep(60)",
        ],
        start_new_session=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    time.sleep(1.0)
    reaper.send_signal(signal.SIGINT)
    assert reaper.wait(10) == 0
    assert not (SHM_DIR / f"{prefix}segment").exists()


def test_the_reaper_exits_as_its_child_did_when_it_is_killed(tmp_path: Path):
    reaper = spawn(
        [sys.executable, "-m", "serving.reaper", "tllm_none_", "5", "--", sys.executable, "-c", SLEEP],
        start_new_session=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    deadline = time.monotonic() + 30

    def sleeper() -> list[psutil.Process]:  # the command, not a helper the reaper's start may run
        found = []
        for child in psutil.Process(reaper.pid).children():
            try:
                if SLEEP in child.cmdline():
                    found.append(child)
            except psutil.Error:  # a helper that ended meanwhile
                pass
        return found

    while not sleeper() and time.monotonic() < deadline:
        time.sleep(0.05)
    sleeper()[0].kill()
    assert reaper.wait(30) == -signal.SIGKILL


def test_a_start_reclaims_only_its_own_leftovers(tmp_path: Path):
    work = tmp_path / "build"
    repository = str((work / "model_repository").resolve())
    stale = _orphan(f"--model-repository={repository}")
    other = _orphan(f"--model-repository={repository}_old")  # another work dir's, by name alone
    mine = f"{shm_prefix(work)}python_{uuid.uuid4()}"
    theirs = f"{shm_prefix(tmp_path / 'other')}python_{uuid.uuid4()}"
    for name in (mine, theirs):
        (SHM_DIR / name).write_bytes(b"x")
    try:
        assert find_leftovers(repository).stale == [stale]
        server = TritonServer(
            LaunchOptions(
                settings=DeploymentSettings.load(environ={}, model_dir="/m"), work_dir=work, admin_key="k" * 32
            )
        )
        server.reclaim_stale()
        assert _gone(stale)
        assert psutil.Process(other).is_running()
        assert not (SHM_DIR / mine).exists() and (SHM_DIR / theirs).exists()
    finally:
        for pid in (stale, other):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        remove_shm(shm_prefix(tmp_path / "other"))


def test_a_live_server_of_the_same_work_dir_is_an_error_never_killed(tmp_path: Path):
    work = tmp_path / "build"
    repository = str((work / "model_repository").resolve())
    # a tritonserver (by its name) whose launcher (this test) still runs
    fake = tmp_path / "tritonserver"  # the kernel names a process after the file it runs
    fake.symlink_to(sys.executable)
    live = subprocess.Popen([str(fake), "-c", SLEEP, f"--model-repository={repository}"])
    try:
        deadline = time.monotonic() + 5
        while psutil.Process(live.pid).name() != "tritonserver" and time.monotonic() < deadline:
            time.sleep(0.05)
        server = TritonServer(
            LaunchOptions(
                settings=DeploymentSettings.load(environ={}, model_dir="/m"), work_dir=work, admin_key="k" * 32
            )
        )
        with pytest.raises(TritonStartError, match="already serves"):
            server.reclaim_stale()
        assert live.poll() is None
    finally:
        live.kill()
        live.wait()
