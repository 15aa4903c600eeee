"""A `python -m serving serve` child process as the serve tests drive it:
its output read up to the ready banner's last line, and Ctrl-C to stop it."""
from __future__ import annotations

import signal
import subprocess
import time

from serving.cli import BANNER_END


def read_until_banner(proc: subprocess.Popen[str], output: list[str], timeout_s: float) -> None:
    """Append `proc`'s output lines to `output` until the banner ends, the
    output closes or `timeout_s` passes (the caller checks what it got)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()   # type: ignore[union-attr]
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
