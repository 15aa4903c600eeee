"""The supervisor's restart policy: exponential backoff with jitter and a cap,
a new row after a long enough run, the exit cause as a label, and restarts
against stand-in servers (real child processes, no Triton)."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from serving.fleet import ReplicaProcess, ReplicaProcesses
from serving.settings import ServerConfig
from serving.supervisor import Backoff, Supervisor, SupervisorMetrics, exit_cause


def test_the_delay_doubles_per_exit_in_a_row_up_to_the_cap():
    backoff = Backoff(initial_s=1.0, max_s=30.0, reset_after_s=60.0, jitter=0.5)
    assert [backoff.delay(n, 0.0) for n in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff.delay(1000, 0.0) == 30.0  # no overflow however long the row


@pytest.mark.parametrize("in_row", [0, 3, 10])
def test_jitter_draws_within_half_the_delay_and_never_above_the_cap(in_row):
    backoff = Backoff(initial_s=1.0, max_s=30.0, reset_after_s=60.0, jitter=0.5)
    ceiling = backoff.delay(in_row, 0.0)
    assert backoff.delay(in_row, 0.999999) == pytest.approx(ceiling * 0.5, rel=1e-5)
    assert all(ceiling * 0.5 <= backoff.delay(in_row, d / 10) <= ceiling for d in range(10))


def test_the_policy_comes_from_the_server_settings():
    assert Backoff.from_settings(
        ServerConfig(restart_backoff_s=0.5, restart_backoff_max_s=4.0, restart_reset_after_s=9.0)
    ) == Backoff(0.5, 4.0, 9.0)


@pytest.mark.parametrize("bad", [dict(initial_s=0.0), dict(max_s=0.5), dict(reset_after_s=-1.0), dict(jitter=1.5)])
def test_a_policy_that_cannot_work_is_refused(bad):
    with pytest.raises(ValueError, match="restart backoff"):
        Backoff(**{**dict(initial_s=1.0, max_s=30.0, reset_after_s=60.0), **bad})


def test_the_cause_names_the_signal_or_the_exit_code():
    assert exit_cause(-signal.SIGKILL) == "SIGKILL"
    assert exit_cause(-signal.SIGSEGV) == "SIGSEGV"
    assert exit_cause(1) == "exit_1"
    assert exit_cause(0) == "exit_0"


@dataclass
class StandIn:
    """A server's start / stop / process, with a sleeping child for a process."""

    starts: int = 0
    fail_starts: int = 0
    process: subprocess.Popen[bytes] | None = None
    log_path: Path = Path("/dev/null")
    stopped: list[int | None] = field(default_factory=list)

    def start(self) -> None:
        self.starts += 1
        if self.fail_starts:
            self.fail_starts -= 1
            raise OSError("cannot start")
        self.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    def stop(self) -> int | None:
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait()
            self.stopped.append(process.returncode)
        return None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _supervise(server: StandIn, clock: Clock, lines: list[str]) -> tuple[Supervisor, SupervisorMetrics]:
    metrics = SupervisorMetrics()
    fleet = ReplicaProcesses([ReplicaProcess("r0", server)])  # type: ignore[arg-type]
    backoff = Backoff(initial_s=1.0, max_s=8.0, reset_after_s=60.0, jitter=0.5)
    return Supervisor(fleet, backoff, metrics, say=lines.append, draw=lambda: 0.0, clock=clock), metrics


def _settle(supervisor: Supervisor) -> None:
    """Polls until the restart under way (a thread) has finished."""
    for _ in range(200):
        supervisor.poll()
        if not any(w.thread is not None for w in supervisor._watches.values()):
            return
        watch = supervisor._watches["r0"]
        if watch.thread is not None:
            watch.thread.join(0.05)
    raise AssertionError("the restart did not finish")


def _restarts(metrics: SupervisorMetrics, cause: str) -> float:
    return metrics.registry.get_sample_value("serving_replica_restarts_total", {"replica": "r0", "cause": cause}) or 0


def test_a_killed_replica_is_restarted_after_its_backoff_and_counted():
    server, clock, lines = StandIn(), Clock(), []
    server.start()
    supervisor, metrics = _supervise(server, clock, lines)
    try:
        server.process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        server.process.wait()  # type: ignore[union-attr]
        supervisor.poll()
        assert "replica r0: tritonserver exited on its own (killed by SIGKILL); restarting it in 1.0 s" in lines[-1]
        assert metrics.registry.get_sample_value("serving_replica_up", {"replica": "r0"}) == 0
        clock.now += 0.9
        supervisor.poll()
        assert server.starts == 1  # not before its delay
        clock.now += 0.2
        _settle(supervisor)
        assert server.starts == 2 and server.process is not None and server.process.poll() is None
        assert server.stopped == [-signal.SIGKILL]  # the dead one reaped (stubs, shm) before the new start
        assert "replica r0: restarted, ready in" in lines[-1]
        assert _restarts(metrics, "SIGKILL") == 1
        assert metrics.registry.get_sample_value("serving_replica_up", {"replica": "r0"}) == 1
    finally:
        server.stop()


def test_exits_in_a_row_back_off_and_a_long_run_starts_a_new_row():
    server, clock, lines = StandIn(), Clock(), []
    server.start()
    supervisor, metrics = _supervise(server, clock, lines)
    delays = []
    try:
        for _ in range(5):
            server.process.kill()  # type: ignore[union-attr]
            server.process.wait()  # type: ignore[union-attr]
            supervisor.poll()
            delays.append(supervisor._watches["r0"].restart_at - clock.now)
            clock.now += delays[-1]
            _settle(supervisor)
        assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
        clock.now += 61.0  # a run long enough: the next exit starts over
        supervisor.poll()
        server.process.kill()  # type: ignore[union-attr]
        server.process.wait()  # type: ignore[union-attr]
        supervisor.poll()
        assert supervisor._watches["r0"].restart_at - clock.now == 1.0
        assert _restarts(metrics, "SIGKILL") == 5
    finally:
        supervisor.stop()
        server.stop()


def test_a_failed_restart_is_retried_with_a_longer_delay():
    server, clock, lines = StandIn(fail_starts=1), Clock(), []
    server.process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    server.process.wait()
    supervisor, metrics = _supervise(server, clock, lines)
    supervisor.poll()
    assert "(exit code 3)" in lines[-1]
    clock.now += 1.0
    _settle(supervisor)
    assert "restart failed (cannot start); trying again in 2.0 s" in lines[-1]
    clock.now += 2.0
    _settle(supervisor)
    try:
        assert server.process is not None and server.process.poll() is None
        assert _restarts(metrics, "exit_3") == 1 and _restarts(metrics, "start_failed") == 1
    finally:
        server.stop()
