"""Supervision of serve's replicas: a tritonserver that exits on its own is
restarted, on the same ports and work dir, so the gateway (which ejected it
after its failed probes) takes it back after its inference probe passes.

Restarts follow the exponential backoff with jitter that supervisors use
(Kubernetes' CrashLoopBackOff, systemd's RestartSteps): `restart_backoff_s`
doubled for each exit in a row, capped at `restart_backoff_max_s`, each
delay drawn in [½d, d] so replicas that died together do not restart in
lockstep; a replica that then ran `restart_reset_after_s` starts a new row.

The counts go to Prometheus from the launcher itself, on loopback
(`server.supervisor_metrics_port`): the supervisor is the one that sees an
exit and its cause, as the kubelet is for `kube_pod_container_status_restarts_total`;
the gateway only sees failed probes, and stays out of process management."""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from .children import find_leftovers, kill_and_wait
from .fleet import ReplicaProcess, ReplicaProcesses
from .launcher import TritonStartError
from .settings import ServerConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backoff:
    initial_s: float
    max_s: float
    reset_after_s: float
    jitter: float = 0.5  # the random share of each delay: drawn in [(1 - jitter)·d, d]

    @classmethod
    def from_settings(cls, server: ServerConfig) -> Backoff:
        return cls(server.restart_backoff_s, server.restart_backoff_max_s, server.restart_reset_after_s)

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.max_s < self.initial_s or self.reset_after_s < 0 or not 0 <= self.jitter <= 1:
            raise ValueError(
                f"restart backoff: need 0 < initial ({self.initial_s}) <= max ({self.max_s}), "
                f"reset_after >= 0 ({self.reset_after_s}) and jitter in [0, 1] ({self.jitter})"
            )

    def delay(self, in_row: int, draw: float) -> float:
        """The wait before restart number `in_row` (0: the first) of a row of
        exits; `draw` uniform in [0, 1)."""
        ceiling = min(self.max_s, self.initial_s * 2.0 ** min(in_row, 64))
        return ceiling * (1.0 - self.jitter * draw)


def exit_cause(returncode: int | None) -> str:
    """`SIGKILL` for a process a signal ended, `exit_<code>` otherwise."""
    if returncode is None:
        return "unknown"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal_{-returncode}"
    return f"exit_{returncode}"


class SupervisorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.restarts = Counter(
            "serving_replica_restarts_total",
            "Restarts of a replica's tritonserver after it exited on its own, by the cause of the exit",
            ["replica", "cause"],
            registry=self.registry,
        )
        self.up = Gauge(
            "serving_replica_up",
            "1 while the replica's tritonserver runs and has been ready",
            ["replica"],
            registry=self.registry,
        )

    def serve(self, port: int) -> bool:
        """Listen on 127.0.0.1:`port`; False (and a warning) when it cannot:
        a metrics port taken is no reason to refuse serving."""
        try:
            start_http_server(port, addr="127.0.0.1", registry=self.registry)
        except OSError as exc:
            log.warning("serve's metrics cannot listen on 127.0.0.1:%d (%s); going on without them", port, exc)
            return False
        return True


# one per launcher process: its registry is what the loopback listener serves
METRICS = SupervisorMetrics()


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def reclaim_stale_gateway(upstream_grpc_url: str) -> None:
    """A gateway an earlier serve of these replicas left running (its launcher
    was killed before gateways died with it): killed, and said. Ours by its
    command line (`-m gateway serve` with this upstream, as serve writes it)
    and stale only when its launcher is gone."""
    found = find_leftovers("-m", "gateway", "serve", f"gateway.fleet.upstream_grpc_url={upstream_grpc_url}")
    if found.stale:
        _say(
            f"an earlier gateway over {upstream_grpc_url} outlived its launcher (pids "
            f"{', '.join(map(str, found.stale))}): killing it"
        )
        kill_and_wait(found.stale)


@dataclass
class _Watch:
    """One replica as the supervisor follows it."""

    ready_at: float
    in_row: int = 0  # exits in a row (reset by a long enough run)
    restart_at: float | None = None  # a restart is due then
    cause: str = ""
    thread: threading.Thread | None = None  # a restart under way
    error: BaseException | None = None
    began_at: float = 0.0


@dataclass
class Supervisor:
    fleet: ReplicaProcesses
    backoff: Backoff
    metrics: SupervisorMetrics = METRICS
    say: Callable[[str], None] = _say
    draw: Callable[[], float] = random.random
    clock: Callable[[], float] = time.monotonic
    _watches: dict[str, _Watch] = field(default_factory=dict, init=False)
    _stopping: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        now = self.clock()
        for replica in self.fleet.replicas:
            self._watches[replica.name] = _Watch(ready_at=now)
            self.metrics.up.labels(replica=replica.name).set(1)

    @staticmethod
    def serve_metrics(port: int) -> bool:
        return METRICS.serve(port)

    def poll(self) -> None:
        """One round (serve's watch loop calls it every half second): notice
        exits, schedule and start restarts, report their outcome."""
        for replica in self.fleet.replicas:
            watch = self._watches[replica.name]
            if watch.thread is not None:
                if watch.thread.is_alive():
                    continue
                self._finished(replica, watch)
                continue
            process = replica.server.process
            if process is not None and process.poll() is None:
                if watch.in_row and self.clock() - watch.ready_at >= self.backoff.reset_after_s:
                    watch.in_row = 0
                continue
            if watch.restart_at is None:
                self._exited(replica, watch, process.returncode if process is not None else None)
            elif self.clock() >= watch.restart_at:
                self._restart(replica, watch)

    def _exited(self, replica: ReplicaProcess, watch: _Watch, returncode: int | None) -> None:
        self.metrics.up.labels(replica=replica.name).set(0)
        if self.clock() - watch.ready_at >= self.backoff.reset_after_s:
            watch.in_row = 0
        watch.cause = exit_cause(returncode)
        delay = self.backoff.delay(watch.in_row, self.draw())
        watch.in_row += 1
        watch.restart_at = self.clock() + delay
        self.say(
            f"replica {replica.name}: tritonserver exited on its own ({_cause_words(returncode)}); "
            f"restarting it in {delay:.1f} s (exit {watch.in_row} in a row); see {replica.server.log_path}"
        )

    def _restart(self, replica: ReplicaProcess, watch: _Watch) -> None:
        self.metrics.restarts.labels(replica=replica.name, cause=watch.cause).inc()
        watch.restart_at, watch.error, watch.began_at = None, None, self.clock()
        self.say(f"replica {replica.name}: restarting tritonserver...")

        def run() -> None:
            try:
                replica.server.stop()  # reaps the dead one, ends its stubs, removes its shm
                if not self._stopping:
                    replica.server.start()
            except BaseException as exc:  # reported by the next poll
                watch.error = exc

        watch.thread = threading.Thread(target=run, name=f"restart-{replica.name}", daemon=True)
        watch.thread.start()

    def _finished(self, replica: ReplicaProcess, watch: _Watch) -> None:
        watch.thread = None
        if self._stopping:
            return
        if watch.error is None and replica.server.process is not None:
            watch.ready_at = self.clock()
            self.metrics.up.labels(replica=replica.name).set(1)
            self.say(f"replica {replica.name}: restarted, ready in {watch.ready_at - watch.began_at:.1f} s")
            return
        first = str(watch.error).splitlines()[0] if watch.error else "no process"
        if not isinstance(watch.error, (TritonStartError, OSError)):
            log.error("replica %s: restart failed", replica.name, exc_info=watch.error)
        delay = self.backoff.delay(watch.in_row, self.draw())
        watch.in_row += 1
        watch.cause, watch.restart_at = "start_failed", self.clock() + delay
        self.say(f"replica {replica.name}: restart failed ({first}); trying again in {delay:.1f} s")

    def stop(self, bound_s: float = 15.0) -> None:
        """End restarts under way (a starting server has nothing in flight:
        its process group is killed) before the fleet stops."""
        self._stopping = True
        deadline = time.monotonic() + bound_s
        for replica in self.fleet.replicas:
            thread = self._watches[replica.name].thread
            while thread is not None and thread.is_alive() and time.monotonic() < deadline:
                process = replica.server.process
                if process is not None and process.poll() is None:
                    try:
                        os.killpg(process.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                thread.join(0.1)

    def restarting(self) -> list[str]:
        return [name for name, w in self._watches.items() if w.thread is not None or w.restart_at is not None]


def _cause_words(returncode: int | None) -> str:
    cause = exit_cause(returncode)
    if cause.startswith("exit_"):
        return f"exit code {returncode}"
    return f"killed by {cause}" if cause.startswith("SIG") else cause


__all__ = ["METRICS", "Backoff", "Supervisor", "SupervisorMetrics", "exit_cause", "reclaim_stale_gateway"]
