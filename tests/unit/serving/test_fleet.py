"""`serve --replicas N` without Triton: the port layout (+10·i), the thread
budget, each replica's options, the gateway's settings for the fleet, and the
fleet's start / abort / watch / stop logic against stand-in servers that are
real child processes (so "nothing left running" is checked on real pids)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import serving.fleet as fleet_module
from gateway.config import ReplicaConfig
from serving import cli
from serving.fleet import (
    FleetStartError,
    Ports,
    ReplicaProcess,
    ReplicaProcesses,
    free_base_ports,
    gateway_assignments,
    plan_replicas,
    replica_ports,
    thread_budget,
    usable_cores,
)
from serving.launcher import LaunchOptions, TritonStartError
from serving.repository import render_repository
from serving.settings import DeploymentSettings, load_section
from serving.supervisor import Backoff, Supervisor, SupervisorMetrics


def _options(tmp_path: Path, **engine: object) -> LaunchOptions:
    settings = DeploymentSettings.load(
        environ={}, model_dir=str(tmp_path / "model"), **{f"engine.{k}": v for k, v in engine.items()}
    )
    return LaunchOptions(settings=settings, work_dir=tmp_path / "build", admin_key="k" * 32)


# -- ports and threads -------------------------------------------------------------


def test_replica_i_uses_the_base_ports_plus_ten_i():
    assert replica_ports(Ports(8000, 8001, 8002), 3) == [
        Ports(8000, 8001, 8002),
        Ports(8010, 8011, 8012),
        Ports(8020, 8021, 8022),
    ]


@pytest.mark.parametrize(
    "base, count, problem",
    [
        (Ports(8000, 8010, 8002), 2, "8010 is also replica r0 gRPC"),  # replica 1's HTTP = replica 0's gRPC
        (Ports(65520, 65521, 65522), 3, "out of range"),
        (Ports(8000, 8000, 8002), 1, "also replica r0 HTTP"),
        (Ports(), 0, "at least 1"),
    ],
)
def test_a_layout_that_collides_is_refused(base: Ports, count: int, problem: str):
    with pytest.raises(ValueError, match=problem):
        replica_ports(base, count)


@pytest.mark.parametrize("count, cores, threads", [(1, 2, 2), (2, 2, 1), (3, 2, 1), (2, 16, 8), (3, 16, 5)])
def test_thread_budget_shares_the_cores(count: int, cores: int, threads: int):
    assert thread_budget(count, cores) == threads


def test_usable_cores_is_the_affinity_mask():
    assert usable_cores() == len(__import__("os").sched_getaffinity(0))


def test_free_base_ports_gives_a_whole_free_layout():
    base = free_base_ports(3)
    for ports in replica_ports(base, 3):
        for port in ports.all():
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))  # raises if taken


# -- each replica's options ----------------------------------------------------------


def test_one_replica_is_exactly_todays_server(tmp_path: Path):
    options = _options(tmp_path)
    (replica,) = plan_replicas(options, 1, cores=8)
    assert replica.name == "r0" and replica.server.options is options
    assert replica.server.options.settings.engine.num_threads == 0  # torch's default, as before
    assert replica.server.log_path == tmp_path / "build" / "tritonserver.log"


def test_several_replicas_get_own_ports_dirs_logs_and_a_thread_share(tmp_path: Path):
    options = _options(tmp_path)
    options.log_file = tmp_path / "logs" / "serve.log"
    replicas = plan_replicas(options, 3, cores=8)
    assert [r.name for r in replicas] == ["r0", "r1", "r2"]
    servers = [r.server for r in replicas]
    assert [s.options.http_port for s in servers] == [8000, 8010, 8020]
    assert [s.grpc_url for s in servers] == ["127.0.0.1:8001", "127.0.0.1:8011", "127.0.0.1:8021"]
    assert [s.metrics_url for s in servers][2] == "http://127.0.0.1:8022/metrics"
    assert [s.options.work_dir for s in servers] == [tmp_path / "build" / "replicas" / n for n in ("r0", "r1", "r2")]
    assert len({s.admin_key_path for s in servers}) == 3
    assert [s.log_path.name for s in servers] == ["serve.r0.log", "serve.r1.log", "serve.r2.log"]
    assert {s.options.settings.engine.num_threads for s in servers} == {2}  # 8 cores // 3
    assert options.settings.engine.num_threads == 0  # serve's own settings untouched


def test_a_thread_count_the_user_set_is_kept(tmp_path: Path):
    replicas = plan_replicas(_options(tmp_path, num_threads=3), 2, cores=2)
    assert {r.server.options.settings.engine.num_threads for r in replicas} == {3}


def test_the_thread_budget_reaches_the_rendered_engine_config(tmp_path: Path):
    (_, replica) = plan_replicas(_options(tmp_path), 2, cores=6)
    target = render_repository(replica.server.options.settings, tmp_path / "repo")
    config = (target / "python_llm" / "config.pbtxt").read_text()
    block = config[config.index('key: "num_threads"') :][:120]
    assert 'string_value: "3"' in block, block


def test_gateway_settings_for_the_fleet_parse_as_the_gateway_reads_them(tmp_path: Path):
    replicas = plan_replicas(_options(tmp_path), 2, cores=2)
    golden = tmp_path / "probe" / "m.json"
    config = load_section("gateway", assignments=gateway_assignments(replicas, golden), environ={})
    assert config.fleet.replicas == {
        "r0": ReplicaConfig(grpc_url="127.0.0.1:8001", metrics_url="http://127.0.0.1:8002/metrics"),
        "r1": ReplicaConfig(grpc_url="127.0.0.1:8011", metrics_url="http://127.0.0.1:8012/metrics"),
    }
    assert config.fleet.probe_golden_file == str(golden)
    assert config.fleet.upstream_grpc_url == "127.0.0.1:8001"
    assert "gateway.fleet.probe_golden_file" not in " ".join(gateway_assignments(replicas, None))


def test_serve_refuses_a_bad_layout_before_starting_anything(model_dir: Path, capsys: pytest.CaptureFixture[str]):
    assert cli.main(["serve", "--model-dir", str(model_dir), "--replicas", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err
    assert cli.main(["serve", "--model-dir", str(model_dir), "--replicas", "2", "--grpc-port", "8010"]) == 2
    assert "also replica r0 gRPC" in capsys.readouterr().err


# -- start, abort, watch, stop with stand-in servers ------------------------------

# a server that exits on SIGINT, whatever it inherited (a test run in the
# background of a non-interactive shell inherits SIGINT ignored)
EXIT_ON_SIGINT = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_DFL); time.sleep(60)"
IGNORE_SIGINT = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)"
# a server still loading its models where SIGINT was inherited ignored: the
# first one is lost
SWALLOW_FIRST_SIGINT = (
    "import signal, sys, time\n"
    "seen = []\n"
    "def on_sigint(*_):\n"
    "    seen.append(1)\n"
    "    if len(seen) > 1:\n"
    "        sys.exit(130)\n"
    "signal.signal(signal.SIGINT, on_sigint)\n"
    "time.sleep(60)\n"
)


class StandIn:
    """A TritonServer's start/stop/process as the fleet uses them: start spawns
    a child and waits like `wait_ready` (an exit is a start error), or fails."""

    def __init__(
        self,
        tmp_path: Path,
        name: str,
        *,
        ready_after_s: float | None = 0.1,
        fail_after_s: float | None = None,
        ignore_sigint: bool = False,
        swallow_first_sigint: bool = False,
    ) -> None:
        self.ready_after_s = ready_after_s
        self.fail_after_s = fail_after_s
        self.code = IGNORE_SIGINT if ignore_sigint else SWALLOW_FIRST_SIGINT if swallow_first_sigint else EXIT_ON_SIGINT
        self.process: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []
        self.log_path = tmp_path / f"{name}.log"

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", self.code], start_new_session=True)
        self.pids.append(self.process.pid)
        t0 = time.monotonic()
        try:
            while True:
                if self.process.poll() is not None:
                    raise TritonStartError(f"exited with code {self.process.returncode}")
                elapsed = time.monotonic() - t0
                if self.fail_after_s is not None and elapsed > self.fail_after_s:
                    raise TritonStartError("model failed to load")
                if self.ready_after_s is not None and elapsed > self.ready_after_s:
                    return
                if elapsed > 20:  # a fleet that failed to stop it: fail the test in bounded time
                    raise TritonStartError("never ready")
                time.sleep(0.02)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> int | None:
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.kill()
        return process.wait()


def _fleet(*servers: StandIn) -> ReplicaProcesses:
    return ReplicaProcesses([ReplicaProcess(f"r{i}", s) for i, s in enumerate(servers)])  # type: ignore[arg-type]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_all_ready_reports_each_and_stop_ends_them(tmp_path: Path):
    servers = [StandIn(tmp_path, "a"), StandIn(tmp_path, "b", ready_after_s=0.3)]
    fleet = _fleet(*servers)
    ready: list[str] = []
    fleet.start(threading.Event(), on_ready=lambda replica, seconds: ready.append(replica.name))
    assert sorted(ready) == ["r0", "r1"] and not fleet.dead()
    assert set(fleet.stop()) == {"r0", "r1"}
    assert not any(_running(pid) for s in servers for pid in s.pids)


def test_a_failed_replica_stops_the_others_and_is_named(tmp_path: Path):
    servers = [StandIn(tmp_path, "a", ready_after_s=None), StandIn(tmp_path, "b", ready_after_s=None, fail_after_s=0.2)]
    t0 = time.monotonic()
    with pytest.raises(FleetStartError) as caught:
        _fleet(*servers).start(threading.Event())
    assert time.monotonic() - t0 < 5
    assert str(caught.value) == "replica r1: model failed to load"  # r0's exit is its echo, not a cause
    assert not any(_running(pid) for s in servers for pid in s.pids)


def test_a_sigint_lost_while_a_replica_loads_is_sent_again(tmp_path: Path):
    """tritonserver sets its SIGINT handler only once its models are loaded;
    where SIGINT was inherited ignored, one sent before is lost. The abort
    sends it again every _ABORT_RESIGNAL_S, long before the SIGKILL (15 s).
    Replica b fails after a second, when a's stand-in has long set its
    handler."""
    servers = [
        StandIn(tmp_path, "a", ready_after_s=None, swallow_first_sigint=True),
        StandIn(tmp_path, "b", ready_after_s=None, fail_after_s=1.0),
    ]
    t0 = time.monotonic()
    with pytest.raises(FleetStartError, match="^replica r1: model failed to load$"):
        _fleet(*servers).start(threading.Event())
    assert time.monotonic() - t0 < 5
    assert not any(_running(pid) for s in servers for pid in s.pids)


def test_one_replica_keeps_its_own_error_message(tmp_path: Path):
    with pytest.raises(FleetStartError, match="^model failed to load$"):
        _fleet(StandIn(tmp_path, "a", ready_after_s=None, fail_after_s=0.1)).start(threading.Event())


def test_a_stop_while_starting_ends_every_replica(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(fleet_module, "_ABORT_KILL_AFTER_S", 0.5)
    servers = [
        StandIn(tmp_path, "a", ready_after_s=None),
        StandIn(tmp_path, "b", ready_after_s=None, ignore_sigint=True),
    ]
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(InterruptedError):
        _fleet(*servers).start(stop)
    assert time.monotonic() - t0 < 5  # the one deaf to SIGINT was killed after the grace period
    assert not any(_running(pid) for s in servers for pid in s.pids)


def _supervisor(fleet: ReplicaProcesses, lines: list[str]) -> Supervisor:
    return Supervisor(
        fleet, Backoff(initial_s=0.2, max_s=1.0, reset_after_s=60.0), SupervisorMetrics(), say=lines.append
    )


@pytest.mark.parametrize("count", [1, 2])
def test_watch_restarts_a_replica_that_dies_and_ends_with_the_stop(tmp_path: Path, count: int):
    servers = [StandIn(tmp_path, name) for name in "ab"[:count]]
    fleet = _fleet(*servers)
    fleet.start(threading.Event())
    lines: list[str] = []
    supervisor = _supervisor(fleet, lines)
    try:
        first = servers[-1].process.pid  # type: ignore[union-attr]
        servers[-1].process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        stop = threading.Event()
        threading.Timer(3.0, stop.set).start()
        assert cli._watch(fleet, None, stop, supervisor) == 0  # ended by the stop, not by the death
        name = f"r{count - 1}"
        died = f"replica {name}: tritonserver exited on its own (killed by SIGKILL)"
        assert any(died in line for line in lines), lines
        assert any(f"replica {name}: restarted, ready in" in line for line in lines), lines
        assert servers[-1].process is not None and servers[-1].process.pid != first
        assert servers[-1].process.poll() is None
    finally:
        supervisor.stop()
        fleet.stop()
    assert not any(_running(pid) for s in servers for pid in s.pids)


def test_watch_without_a_supervisor_ends_serve_with_the_replicas_exit(tmp_path: Path, capsys):
    # server.restart_replicas = false (containers): the orchestrator restarts, so serve must exit
    servers = [StandIn(tmp_path, "a")]
    fleet = _fleet(*servers)
    fleet.start(threading.Event())
    try:
        servers[0].process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        stop = threading.Event()
        threading.Timer(10.0, stop.set).start()  # a bound: the death must end it first
        t0 = time.monotonic()
        assert cli._watch(fleet, None, stop, None) == -signal.SIGKILL
        assert time.monotonic() - t0 < 5
        assert "not restarted (server.restart_replicas is false)" in capsys.readouterr().err
    finally:
        stop.set()
        fleet.stop()
