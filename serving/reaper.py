"""`python -m serving.reaper PREFIXES GRACE_S -- tritonserver ...`: runs one
tritonserver and cleans up after it, whoever stops it.

Why a process of its own: tritonserver unlinks its Python backend's
/dev/shm segments only when it unloads its models, which it skips when its
exit timeout expires (Triton 2.51 counts a cancelled ensemble request as in
flight forever) or when it is killed. When the launcher is there, the
launcher cleans up; when the launcher was SIGKILLed, nobody would. The
reaper is the launcher's child (its parent-death signal is SIGTERM, see
children.py) and tritonserver's parent, in one process group with it and
its stubs: on SIGINT / SIGTERM it passes SIGINT on (Triton's graceful exit),
SIGKILLs what is left of the group after GRACE_S, removes the /dev/shm files named
PREFIXES* (comma-separated), and exits as tritonserver did (its code, or its signal).

A SIGKILL to the whole group (a crash test's `kill -9`) takes the reaper
too; the launcher, alive then, cleans up instead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .children import kill_and_wait, pdeathsig, remove_shm

_POLL_S = 0.1


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[2]) == pgid and stat[0] != "Z":
                members.append(int(entry.name))
    return members


def run(prefixes: list[str], grace_s: float, command: list[str]) -> int:
    stop_asked: list[float] = []

    def on_signal(_sig: int, _frame: object) -> None:
        if not stop_asked:
            stop_asked.append(time.monotonic())

    # set before the child exists, so a stop asked during the spawn is seen;
    # the child starts with the default dispositions (exec resets handled signals)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    # a reaper killed alone (not its group) still ends the server, gracefully
    child = subprocess.Popen(command, preexec_fn=pdeathsig(signal.SIGTERM, os.getpid()))
    forwarded = False
    while child.poll() is None:
        if stop_asked and not forwarded:
            child.send_signal(signal.SIGINT)
            forwarded = True
        if stop_asked and time.monotonic() - stop_asked[0] > grace_s:
            child.kill()
        try:
            child.wait(_POLL_S)
        except subprocess.TimeoutExpired:
            pass
    # its stubs end on their own once they see it gone; the group's rest, now
    kill_and_wait(_group_members(os.getpgrp()))
    remove_shm(*prefixes)
    code = child.returncode
    if code < 0:  # the same death, so the launcher names its cause
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two take no handler
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m serving.reaper PREFIX[,PREFIX...] GRACE_S -- COMMAND...", file=sys.stderr)
        return 2
    return run(argv[0].split(","), float(argv[1]), argv[3:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
