"""Several tritonservers on one machine, for `python -m serving serve --replicas N`.

Replica i (named `r<i>`) listens on the base ports + 10·i (interface.md), has
a work dir of its own (rendered repository, backends, admin key, log) and a
share of the cores: `engine.num_threads` = max(1, usable cores // N) unless the
settings name a thread count, so N engines do not each spin a pool as wide as
the machine. The settings stay the one source of truth: the budget is written
into each replica's `engine.num_threads`, which its engine applies (and its
rendered config shows). A single replica keeps today's layout and settings.

The replicas start in parallel; a failed one, or a stop asked for meanwhile,
stops them all (none is left behind, whatever point its start had reached).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .launcher import LaunchOptions, TritonServer, TritonStartError
from .triton_binary import TritonSetupError

PORT_STRIDE = 10  # replica i: base port + 10·i (interface.md)
_ABORT_KILL_AFTER_S = 15.0  # a replica told to stop mid-start gets this long before SIGKILL
# ... and SIGINT again this often meanwhile: tritonserver sets its handler
# only once its models are loaded, and until then a SIGINT is lost where the
# fleet was started with SIGINT ignored (a background job of a
# non-interactive shell); it ignores a second one once it is exiting
_ABORT_RESIGNAL_S = 1.0


class FleetStartError(RuntimeError):
    """A replica did not start; the message names it. Every replica is stopped."""


@dataclass(frozen=True)
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    def shifted(self, index: int) -> Ports:
        step = PORT_STRIDE * index
        return Ports(self.http + step, self.grpc + step, self.metrics + step)

    def all(self) -> tuple[int, int, int]:
        return self.http, self.grpc, self.metrics


def replica_name(index: int) -> str:
    return f"r{index}"


def replica_ports(base: Ports, count: int) -> list[Ports]:
    """Each replica's ports; ValueError when two coincide or one is out of range
    (base ports 10 or more apart interleave with the next replica's)."""
    if count < 1:
        raise ValueError(f"--replicas: at least 1, got {count}")
    layout = [base.shifted(i) for i in range(count)]
    owners: dict[int, str] = {}
    for i, ports in enumerate(layout):
        for kind, port in zip(("HTTP", "gRPC", "metrics"), ports.all()):
            where = f"replica {replica_name(i)} {kind}"
            if not 1 <= port <= 65535:
                raise ValueError(f"{where} port {port} is out of range (base ports + {PORT_STRIDE}·i)")
            if port in owners:
                raise ValueError(
                    f"{where} port {port} is also {owners[port]}'s: replica i uses the base ports "
                    f"+ {PORT_STRIDE}·i, so the base ports must lie within {PORT_STRIDE} of each other"
                )
            owners[port] = where
    return layout


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, what a container's
    cpuset allows), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def thread_budget(count: int, cores: int) -> int:
    """Engine threads per replica: the cores shared out, at least one each."""
    return max(1, cores // count)


def free_base_ports(count: int, attempts: int = 200) -> Ports:
    """Base ports whose whole replica layout (+10·i) is free on 127.0.0.1 now,
    for tests and benchmarks that must not collide with a `make serve`."""
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(20000, 60000 - PORT_STRIDE * count, 10)
        layout = replica_ports(Ports(base, base + 1, base + 2), count)
        sockets: list[socket.socket] = []
        try:
            for port in (p for ports in layout for p in ports.all()):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return layout[0]
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no free layout of {count} replicas' ports found in {attempts} attempts")


@dataclass(frozen=True)
class ReplicaProcess:
    """One replica's tritonserver (not the gateway's routing view of a replica,
    gateway/fleet/replica.py)."""

    name: str
    server: TritonServer


def _replica_log(log_file: Path | None, name: str) -> Path | None:
    """`--log-file serve.log` becomes serve.r0.log, serve.r1.log, ..."""
    return None if log_file is None else log_file.with_name(f"{log_file.stem}.{name}{log_file.suffix}")


def plan_replicas(options: LaunchOptions, count: int, cores: int | None = None) -> list[ReplicaProcess]:
    """One `TritonServer` per replica from serve's options (its ports are the
    base). One replica: exactly `options`. Several: shifted ports, work dirs
    <work_dir>/replicas/r<i>, per-replica logs, the thread budget."""
    layout = replica_ports(Ports(options.http_port, options.grpc_port, options.metrics_port), count)
    if count == 1:
        return [ReplicaProcess(replica_name(0), TritonServer(options))]
    settings = options.settings
    if settings.engine.num_threads <= 0:  # 0 = "torch's default": the whole machine, in every replica
        settings = settings.replace(**{"engine.num_threads": thread_budget(count, cores or usable_cores())})
    replicas = []
    for i, ports in enumerate(layout):
        name = replica_name(i)
        replica_options = dataclasses.replace(
            options,
            settings=settings,
            http_port=ports.http,
            grpc_port=ports.grpc,
            metrics_port=ports.metrics,
            work_dir=options.work_dir / "replicas" / name,
            log_file=_replica_log(options.log_file, name),
        )
        replicas.append(ReplicaProcess(name, TritonServer(replica_options)))
    return replicas


def gateway_replicas(replicas: list[ReplicaProcess]) -> dict[str, dict[str, str]]:
    """`gateway.fleet.replicas` (gateway/config.py ReplicaConfig) for these servers."""
    return {r.name: {"grpc_url": r.server.grpc_url, "metrics_url": r.server.metrics_url} for r in replicas}


def gateway_assignments(replicas: list[ReplicaProcess], golden_file: Path | None) -> list[str]:
    """The `--set` assignments that point a gateway at the fleet. The single
    upstream stays replica 0, for a gateway that does not route (yet)."""
    assignments = [
        f"gateway.fleet.upstream_grpc_url={replicas[0].server.grpc_url}",
        f"gateway.fleet.replicas={json.dumps(gateway_replicas(replicas), separators=(',', ':'))}",
    ]
    if golden_file is not None:
        assignments.append(f"gateway.fleet.probe_golden_file={golden_file}")
    return assignments


class ReplicaProcesses:
    """The tritonservers of one `serve`: started together, watched, stopped
    together (the gateway routes over its own view of them, gateway/fleet/)."""

    def __init__(self, replicas: list[ReplicaProcess]) -> None:
        self.replicas = replicas
        self.reported_dead: set[str] = set()

    @property
    def servers(self) -> list[TritonServer]:
        return [r.server for r in self.replicas]

    def start(
        self, stop: threading.Event, on_ready: Callable[[ReplicaProcess, float], None] = lambda r, s: None
    ) -> None:
        """Start every replica at once and wait for all to be ready. A replica
        that fails, or `stop` set meanwhile, stops them all: FleetStartError
        (naming the failed replicas), or InterruptedError for a stop."""
        errors: dict[str, BaseException] = {}
        lock = threading.Lock()
        t0 = time.monotonic()

        def run(replica: ReplicaProcess) -> None:
            try:
                replica.server.start()
            except BaseException as exc:  # reported below, by name
                with lock:
                    errors[replica.name] = exc
                return
            on_ready(replica, time.monotonic() - t0)

        threads = [threading.Thread(target=run, args=(r,), name=f"start-{r.name}", daemon=True) for r in self.replicas]
        for thread in threads:
            thread.start()
        aborting_since: float | None = None
        causes: dict[str, BaseException] = {}  # the failures that made the others stop, not their echoes
        signalled: dict[int, float] = {}  # pid -> when it was last sent SIGINT
        while any(t.is_alive() for t in threads):
            if aborting_since is None and (stop.is_set() or errors):
                aborting_since = time.monotonic()
                with lock:
                    causes = dict(errors)
            if aborting_since is not None:
                self._abort_starting(signalled, time.monotonic() - aborting_since > _ABORT_KILL_AFTER_S)
            for thread in threads:
                thread.join(0.1)
        if aborting_since is None and errors:  # failed as the last thread ended
            causes = dict(errors)
        if causes or stop.is_set():
            self.stop()  # the ones that did become ready
            if len(self.replicas) == 1:  # one server: its own message, as before fleets
                raise FleetStartError(_message(next(iter(causes.values()))))
            if causes:
                raise FleetStartError("\n".join(f"replica {name}: {_message(exc)}" for name, exc in causes.items()))
            raise InterruptedError("stopped while starting")

    def _abort_starting(self, signalled: dict[int, float], kill: bool) -> None:
        """End the start of every replica still starting. Signalling its process
        (not `server.stop()`) makes its own `start()` see the exit, clean up
        and return; one not spawned yet is caught on a later round. SIGINT
        (Triton's graceful exit) every _ABORT_RESIGNAL_S, SIGKILL to the group
        once `kill` is set."""
        now = time.monotonic()
        for server in self.servers:
            process = server.process
            if process is None or process.poll() is not None:
                continue
            if not kill and now - signalled.get(process.pid, -math.inf) < _ABORT_RESIGNAL_S:
                continue
            signalled[process.pid] = now
            try:
                if kill:
                    os.killpg(process.pid, signal.SIGKILL)
                else:
                    process.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass

    def dead(self) -> list[tuple[ReplicaProcess, int]]:
        """Replicas whose tritonserver has exited on its own, each reported once."""
        found = []
        for replica in self.replicas:
            process = replica.server.process
            if replica.name in self.reported_dead:
                continue
            if process is None or process.poll() is not None:
                self.reported_dead.add(replica.name)
                found.append((replica, process.returncode if process is not None else 1))
        return found

    def stop(self) -> dict[str, int | None]:
        """Stop every replica, in parallel (each may take seconds to unload);
        their exit codes by name."""
        codes: dict[str, int | None] = {}

        def run(replica: ReplicaProcess) -> None:
            codes[replica.name] = replica.server.stop()

        threads = [threading.Thread(target=run, args=(r,), name=f"stop-{r.name}") for r in self.replicas]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return {r.name: codes.get(r.name) for r in self.replicas}


def _message(exc: BaseException) -> str:
    if isinstance(exc, (TritonStartError, TritonSetupError, OSError, ValueError)):
        return str(exc)
    return repr(exc)


__all__ = [
    "FleetStartError",
    "PORT_STRIDE",
    "Ports",
    "ReplicaProcess",
    "ReplicaProcesses",
    "free_base_ports",
    "gateway_assignments",
    "gateway_replicas",
    "plan_replicas",
    "replica_name",
    "replica_ports",
    "thread_budget",
    "usable_cores",
]
