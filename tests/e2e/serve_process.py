"""A `python -m serving serve` child process as the serve tests drive it:
its output read up to the ready banner's last line (then followed), a
cancelled stream, Ctrl-C to stop it, and what it may have left behind
(processes, /dev/shm files, ports)."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from serving.children import SHM_DIR, postprocessing_state_prefix, shm_prefix
from serving.cli import BANNER_END


def read_until_banner(proc: subprocess.Popen[str], output: list[str], timeout_s: float) -> None:
    """Append `proc`'s output lines to `output` until the banner ends, the
    output closes or `timeout_s` passes (the caller checks what it got)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            return
        output.append(line)
        if line.strip() == BANNER_END:
            return


def stop_with_ctrl_c(proc: subprocess.Popen[str], wait_s: float) -> None:
    """SIGINT, as Ctrl-C sends; killed if it has not ended within `wait_s`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def follow(proc: subprocess.Popen[str], output: list[str]) -> threading.Thread:
    """Keep appending `proc`'s output lines to `output` (after the banner: the
    supervisor's and the stop's lines) until it closes."""

    def run() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            output.append(line)

    thread = threading.Thread(target=run, name=f"follow-{proc.pid}", daemon=True)
    thread.start()
    return thread


def api_key(banner: str) -> str:
    """The local key serve printed in its banner."""
    match = re.search(r"API key +(sk-\S+)", banner)
    if match is None:
        raise AssertionError(f"no API key in the banner:\n{banner}")
    return match.group(1)


def hang_up_a_stream(gateway_port: int, key: str, events: int = 3) -> float:
    """A long streamed completion through the gateway, dropped after `events`
    events (what Ctrl-C of a curl does): the cancelled stream a stop must not
    wait out. Seconds it took."""
    t0 = time.monotonic()
    body = {
        "model": "ensemble",
        "prompt": "Write a long story about a lighthouse.",
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.Client(timeout=httpx.Timeout(30.0, read=120.0)) as client:
        with client.stream(
            "POST",
            f"http://127.0.0.1:{gateway_port}/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        ) as response:
            assert response.status_code == 200, response.read()
            seen = 0
            for line in response.iter_lines():
                seen += line.startswith("data: ")
                if seen >= events:
                    break
    return time.monotonic() - t0


def ours(build_dir: Path) -> list[psutil.Process]:
    """Live processes whose command line names `build_dir` (tritonserver, its
    stubs and reaper, the gateway with its golden file); zombies do not count."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            if process.info["status"] != psutil.STATUS_ZOMBIE and str(build_dir) in " ".join(
                process.info["cmdline"] or ()
            ):
                found.append(process)
        except psutil.Error:
            continue
    return found


def shm_files(work_dirs: list[Path]) -> list[str]:
    """The /dev/shm files these servers' work dirs name (serving/children.py)."""
    prefixes = tuple(
        f for work in work_dirs for f in (shm_prefix(work), postprocessing_state_prefix(work / "model_repository"))
    )
    return sorted(p.name for p in SHM_DIR.iterdir() if p.name.startswith(prefixes))


def bound_ports(ports: list[int]) -> list[int]:
    """Those of `ports` that something still listens on (127.0.0.1)."""
    taken = []
    for port in ports:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                taken.append(port)
    return taken


def gone_within(bound_s: float, check: Callable[[], list[object]]) -> tuple[float, list[object]]:
    """Poll `check` until it finds nothing or `bound_s` passes: (seconds, what is left)."""
    t0 = time.monotonic()
    left = check()
    while left and time.monotonic() - t0 < bound_s:
        time.sleep(0.1)
        left = check()
    return time.monotonic() - t0, left
