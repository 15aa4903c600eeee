"""The replicas behind the gateway, as one upstream: every engine request is
routed (router.py) to a routable replica, with failover before the first
token; background loops keep each replica's load (its metrics) and health
(readiness + the inference probe) current.

Failover: an attempt refused as overloaded, or that cannot reach its
replica, is retried on another replica (never the same one twice) after a
full-jitter backoff, while a retry budget (10 spare retries plus 0.2 per
request, client/retry.py) lasts, so that a fleet-wide overload is answered
with 503s rather than multiplied. A request that already streams moves
to another replica when its own dies or stalls (routed_stream.py). Tier
pools (pools.py) decide which replicas a tier may use. Passive outlier
detection: a replica that cannot be reached, or whose streams break or
stall, collects failures like a failed probe."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Set

import httpx

from client import GenerationOptions
from client.retry import RetryBudget

from ..config import GatewayConfig, ReplicaConfig
from ..core.errors import GatewayError
from ..core.upstream import OVERLOAD_RETRY_AFTER_S
from ..ops import logs
from ..ops.metrics import EJECTIONS, FAILOVERS, PROBES, REPLICA_DRAINING, REPLICA_IN_FLIGHT, REPLICA_ROUTABLE, ROUTED
from .discovery import Discovery
from .load import parse_load
from .orphans import Orphans
from .pools import check_pools, pool_for
from .probe import OK, OVERLOADED, WRONG_ANSWER, GoldenAnswer, load_golden_answer, probe_once
from .replica import Replica
from .replica_client import ReplicaClient, ReplicaStream
from .routed_stream import RoutedRequest, RoutedStream
from .router import Router, RouteRequest

log = logging.getLogger(__name__)
# at shutdown, how long a probe under way may finish before it is cancelled
_PROBE_FINISH_S = 2.0

_RETRYABLE = frozenset({"overloaded", "upstream_unavailable"})
# Before its first token a request has produced nothing, so any refusal that
# is not the caller's input (400: it would fail everywhere) is tried on another
# replica: an unreachable or overloaded one, and one that answered with its
# own error (a dead stub, a model being reloaded, a connection lost in a way
# gRPC did not call UNAVAILABLE). The probe, not this error, judges whether the
# replica is sick: a request that fails everywhere must not eject replicas.
_FAIL_OVER = _RETRYABLE | {"upstream_error"}
_BACKOFF_BASE_S, _BACKOFF_MAX_S = 0.05, 1.0


def prompt_text(text_input: str, options: GenerationOptions) -> str:
    """What the prefix cache keys on, as text: the messages (each turn's role
    and content, in order) or the plain prompt."""
    if options.messages:
        return "".join(f"<{m['role']}>{m['content']}" for m in options.messages) + text_input
    return text_input


class Fleet:
    def __init__(self, config: GatewayConfig, replicas: list[Replica], golden: GoldenAnswer | None = None) -> None:
        if not replicas and not config.fleet.discovery_dns:
            raise ValueError(
                "a fleet needs at least one replica (gateway.fleet.replicas or gateway.fleet.discovery_dns)"
            )
        self.config = config
        self.replicas = replicas
        self.by_name = {r.name: r for r in replicas}
        self.golden = golden
        self.router = Router(config)
        self.budget = RetryBudget(ratio=0.2, floor=10.0, cap=100.0)
        self.orphans = Orphans()
        check_pools(config, replicas)
        self._tasks: list[asyncio.Task[None]] = []
        self._probing: dict[str, asyncio.Task[None]] = {}
        # called after every round of metrics scrapes (with the replicas, fresh
        # readings on them) and with every engine request's outcome (True: it
        # answered to its end); the degradation controller listens
        self.load_listeners: list[Callable[[list[Replica]], None]] = []
        self.outcome_listeners: list[Callable[[bool], None]] = []
        # the model an engine request really goes to (the degradation
        # controller's fallback model under sustained overload)
        self.model_for: Callable[[str], str] = lambda model: model
        self._first_verdicts: asyncio.Event | None = None
        self._routing_unproven = False  # the first-probe wait gave up
        self._stopping: asyncio.Event | None = None
        self.discovery = Discovery(self, config) if config.fleet.discovery_dns else None
        self._publish()

    @classmethod
    def from_config(cls, config: GatewayConfig) -> Fleet:
        specs = config.fleet.replicas or (
            {} if config.fleet.discovery_dns else {"default": ReplicaConfig(grpc_url=config.fleet.upstream_grpc_url)}
        )
        golden = load_golden_answer(config.fleet.probe_golden_file) if config.fleet.probe_golden_file else None
        return cls(config, [Replica.build(name, spec, config) for name, spec in specs.items()], golden)

    # the Upstream interface (what Generation calls)

    async def start(
        self, model: str, text_input: str, options: GenerationOptions, streaming: bool = True
    ) -> RoutedStream:
        self._ensure_loops()
        await self._first_probes()
        context = logs.current()
        request = RoutedRequest(
            self.model_for(model), text_input, options, streaming, tier=context.tier if context is not None else None
        )
        self.budget.record_request()
        try:
            stream, replica = await self.route(request)
        except GatewayError as error:
            if error.code in _RETRYABLE or error.code == "no_replica":
                self.outcome(False)
            raise
        return RoutedStream(stream, replica, self, request)

    async def route(self, request: RoutedRequest, exclude: Set[str] = frozenset()) -> tuple[ReplicaStream, Replica]:
        """Start `request` on the best replica of its tier's pool, failing over
        to another one (never `exclude`, never the same twice) while the retry
        budget lasts; the stream has answered once."""
        context = logs.current()
        prompt = RouteRequest(
            prompt_text(request.text_input, request.options),
            session=context.fields.get("user") if context is not None else None,
        )
        tried: set[str] = set(exclude)
        last_error: GatewayError | None = None
        for attempt in range(max(1, self.config.fleet.failover_attempts)):
            pool, spilled = pool_for(request.tier, self.routable(), self.replicas, self.config, time.monotonic())
            candidates = [r for r in pool if r.name not in tried]
            if not candidates:
                break
            if attempt > 0:
                if not self.budget.try_spend():
                    break
                await asyncio.sleep(random.uniform(0, min(_BACKOFF_MAX_S, _BACKOFF_BASE_S * 2**attempt)))
            decision = self.router.pick(candidates, prompt)
            replica = decision.replica
            tried.add(replica.name)
            ROUTED.labels(replica=replica.name, reason="spill_over" if spilled else decision.reason).inc()
            self.track(replica, +1)
            try:
                stream = await replica.upstream.start(
                    request.model, request.text_input, request.options, request.streaming
                )
            except GatewayError as error:
                self.track(replica, -1)
                if error.code == "upstream_unavailable":
                    self.failed(replica, "unreachable")
                if error.code not in _FAIL_OVER:
                    raise
                FAILOVERS.labels(reason=error.code or "error").inc()
                log.info("replica %s refused a request (%s); trying another", replica.name, error.code)
                last_error = error
                continue
            except BaseException:
                self.track(replica, -1)
                raise
            if context is not None:
                context.fields.setdefault("replicas", []).append(replica.name)
            return stream, replica
        if last_error is not None:
            raise last_error
        raise GatewayError(
            503,
            "No replica can take the request now; retry after the delay in Retry-After.",
            code="no_replica",
            headers={"Retry-After": str(OVERLOAD_RETRY_AFTER_S)},
        )

    async def _first_probes(self) -> None:
        """Just after start-up, wait (up to one probe timeout) until a replica
        has proven itself, so that no caller is sent to a replica nobody has
        checked (its weights may be broken); with DNS discovery, first for the
        first lookup."""
        if self.discovery is not None and not self.discovery.resolved.is_set():
            try:
                await asyncio.wait_for(self.discovery.resolved.wait(), self.config.fleet.probe_timeout_s)
            except TimeoutError:
                pass
        if self.golden is None or self._first_verdicts is None or self._first_verdicts.is_set():
            return
        try:
            await asyncio.wait_for(self._first_verdicts.wait(), self.config.fleet.probe_timeout_s)
        except TimeoutError:
            log.warning(
                "no replica answered its first probe within %.0f s; routing anyway", self.config.fleet.probe_timeout_s
            )
            self._first_verdicts.set()
            self._routing_unproven = True
            self._publish()

    def _verdict(self, replica: Replica) -> None:
        # a replica that failed its first probe (busy, or broken) does not end
        # the wait: only one that answered right does
        if self._first_verdicts is not None and replica.health.proven:
            self._first_verdicts.set()

    async def aclose(self) -> None:
        # a probe is let finish, briefly: Triton 2.51 keeps counting an ensemble
        # request cancelled mid-generation as in flight, and then stalls its own
        # exit for its exit timeout (serve sets 3 s: server.exit_timeout_s)
        if self._stopping is not None:
            self._stopping.set()
        pending: set[asyncio.Task[None]] = set()
        if self._tasks:
            _, pending = await asyncio.wait(
                self._tasks, timeout=min(self.config.fleet.probe_timeout_s, _PROBE_FINISH_S)
            )
        for task in pending:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.orphans.aclose()
        await asyncio.gather(*(r.upstream.aclose() for r in self.replicas), return_exceptions=True)

    # state

    def routable(self) -> list[Replica]:
        """Replicas taking new requests. With an inference probe, a replica
        gets user traffic only once it has answered the probe right (a new or
        broken one is not tried on callers), unless none has yet (start-up)."""
        live = [r for r in self.replicas if r.routable]
        proven = [r for r in live if r.health.proven]
        return proven if self.golden is not None and proven else live

    def may_eject(self, replica: Replica) -> bool:
        """Never the last replica still taking traffic."""
        return any(r is not replica and not r.health.ejected for r in self.replicas)

    def failed(self, replica: Replica, reason: str, decisive: bool = False) -> None:
        if replica.health.failed(reason, self.may_eject(replica), decisive):
            EJECTIONS.labels(replica=replica.name, reason=reason).inc()
            log.warning(
                "replica %s ejected (%s); back in after %d good probes, not before %.0f s",
                replica.name,
                reason,
                self.config.fleet.readmit_after_successes,
                replica.health.ejected_until - time.monotonic(),
            )
            self._publish()

    def succeeded(self, replica: Replica) -> None:
        was_proven = replica.health.proven
        if replica.health.succeeded():
            replica.prefix.forget()  # it may have restarted: its cache is cold
            log.info("replica %s re-admitted", replica.name)
            self._publish()
        elif not was_proven:
            self._publish()  # its first good answer: proven, it may take callers now

    def set_draining(self, name: str, draining: bool) -> Replica:
        replica = self.by_name[name]
        replica.draining = draining
        log.info("replica %s %s", name, "draining: no new requests" if draining else "taking requests again")
        self._publish()
        return replica

    # membership (DNS discovery)

    def add(self, replica: Replica) -> None:
        check_pools(self.config, [replica])
        self.replicas.append(replica)
        self.by_name[replica.name] = replica
        self._publish()
        if self._stopping is not None:
            self._watch(replica)
        log.info("replica %s added (%s)", replica.name, replica.config.grpc_url)

    def retire(self, name: str, retired: bool = True) -> None:
        """No new requests; it leaves once its in-flight ones have ended
        (sweep). `retired=False`: it came back before it had left."""
        replica = self.by_name[name]
        if replica.retired == retired:
            return
        replica.retired = retired
        self._publish()
        if retired:
            log.info("replica %s retired: no new requests, %d in flight finish there", name, replica.in_flight)
        elif self._stopping is not None:
            self._watch(replica)

    async def sweep(self) -> None:
        for replica in [r for r in self.replicas if r.retired and r.in_flight == 0]:
            self.replicas.remove(replica)
            del self.by_name[replica.name]
            await replica.upstream.aclose()
            log.info("replica %s removed", replica.name)

    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.replicas)

    def outcome(self, ok: bool) -> None:
        for listener in self.outcome_listeners:
            listener(ok)

    def track(self, replica: Replica, change: int) -> None:
        replica.in_flight += change
        REPLICA_IN_FLIGHT.labels(replica=replica.name).set(replica.in_flight)

    def _publish(self) -> None:
        # what a caller gets now, not each replica's own flags: with an
        # inference probe a live replica takes no callers until it answered it
        # right (while another has), and before any has, a caller waits for the
        # first (unless that wait gave up: then every live one takes callers)
        taking = {r.name for r in self.routable()}
        if self.golden is not None and not self._routing_unproven and not any(r.health.proven for r in self.replicas):
            taking = set()
        for replica in self.replicas:
            REPLICA_ROUTABLE.labels(replica=replica.name).set(1 if replica.name in taking else 0)
            REPLICA_DRAINING.labels(replica=replica.name).set(1 if replica.draining else 0)

    # background loops

    def _ensure_loops(self) -> None:
        if self._stopping is not None:
            return
        self._first_verdicts = asyncio.Event()
        self._stopping = asyncio.Event()
        # one replica and nothing to check it against: it takes every request anyway
        if len(self.replicas) > 1 or self.golden is not None or self.discovery is not None:
            # one loop per replica: a slow answer from a busy replica must not delay noticing a hung one
            for replica in self.replicas:
                self._watch(replica)
        if any(r.config.metrics_url for r in self.replicas) or self.discovery is not None:
            self._tasks.append(asyncio.ensure_future(self._scrape_loop()))
        if self.discovery is not None:
            self._tasks.append(asyncio.ensure_future(self.discovery.run(self._stopping)))

    def start_loops(self) -> None:
        """From the app's startup: probes run before the first request too."""
        self._ensure_loops()

    async def _scrape_loop(self) -> None:
        interval = self.config.fleet.metrics_interval_s
        async with httpx.AsyncClient(timeout=max(0.5, min(2.0, interval * 2))) as http:
            # ends with the fleet (aclose waits for its loops: a scrape loop that
            # never ended held every gateway's shutdown for 5 s)
            stopping = self._stopping or asyncio.Event()
            while not stopping.is_set():
                await asyncio.gather(*(self._scrape(http, r) for r in self.replicas if r.config.metrics_url))
                for listener in self.load_listeners:
                    listener(self.replicas)
                try:
                    await asyncio.wait_for(stopping.wait(), interval)
                except TimeoutError:
                    pass

    async def _scrape(self, http: httpx.AsyncClient, replica: Replica) -> None:
        try:
            response = await http.get(replica.config.metrics_url)
            replica.load = parse_load(response.text, time.monotonic())
        except Exception as exc:  # the old reading ages into "saturated"
            log.debug("scraping replica %s failed: %r", replica.name, exc)

    def _watch(self, replica: Replica) -> None:
        """Its probe loop, unless one still runs (a replica retired and back)."""
        running = self._probing.get(replica.name)
        if running is None or running.done():
            self._probing[replica.name] = task = asyncio.ensure_future(self._probe_loop(replica))
            self._tasks.append(task)

    async def _probe_loop(self, replica: Replica) -> None:
        stopping = self._stopping
        while (stopping is None or not stopping.is_set()) and not replica.retired:
            good = await self._probe(replica)
            # a failure is confirmed (or cleared) sooner: a hung replica is out
            # in about two half-intervals after its first miss
            pause = self.config.fleet.probe_interval_s / (1 if good else 2)
            if stopping is None:
                await asyncio.sleep(pause)
                continue
            try:
                await asyncio.wait_for(stopping.wait(), pause)
            except TimeoutError:
                pass

    async def _probe(self, replica: Replica) -> bool:
        ready_timeout = max(0.5, min(2.0, self.config.fleet.probe_interval_s / 2))
        try:
            outcome = await probe_once(
                replica.upstream.client,
                self.golden,
                ready_timeout_s=ready_timeout,
                answer_timeout_s=self.config.fleet.probe_timeout_s,
            )
        except Exception:
            log.exception("probing replica %s failed unexpectedly", replica.name)
            outcome = "error"
        PROBES.labels(replica=replica.name, outcome=outcome).inc()
        if outcome == OK:
            self.succeeded(replica)
        elif outcome != OVERLOADED:
            log.warning("replica %s failed its probe: %s", replica.name, outcome)
            self.failed(replica, f"probe_{outcome}", decisive=outcome == WRONG_ANSWER)
        self._verdict(replica)
        return outcome in (OK, OVERLOADED)


def build_fleet(config: GatewayConfig, upstream: ReplicaClient | None = None) -> Fleet:
    """The deployment's fleet; `upstream` (tests) stands in for a single replica's."""
    if upstream is not None and not config.fleet.replicas:
        return Fleet(
            config, [Replica.build("default", ReplicaConfig(config.fleet.upstream_grpc_url), config, upstream)]
        )
    return Fleet.from_config(config)
