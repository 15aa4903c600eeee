"""The operator's endpoints, on the ops listener only (server.py), behind their
own key (never an API key): `GET /admin/replicas` (each replica's state), `POST
/admin/replicas/{name}/drain` (no new requests to it; its in-flight ones
finish) and `/resume`, `GET /admin/degradation` (the degradation level, its
signals' window values and thresholds). The key is read from `gateway.admin_key_file`, or
`<build dir>/gateway_admin_key`, created (0600) on first start."""

from __future__ import annotations

import logging
import os
import secrets
import time
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..config import GatewayConfig
from ..core.errors import GatewayError
from ..fleet import Fleet
from ..fleet.replica import Replica
from ..lifecycle.state_dir import state_dir

log = logging.getLogger(__name__)
router = APIRouter(include_in_schema=False)


def admin_key_path(config: GatewayConfig) -> Path:
    if config.admin_key_file:
        return Path(config.admin_key_file)
    return state_dir() / "gateway_admin_key"


def admin_key(config: GatewayConfig) -> str:
    path = admin_key_path(config)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_urlsafe(32))
        log.info("created the gateway admin key in %s", path)
    return path.read_text().strip()


def _check(request: Request) -> Fleet:
    state = request.app.state
    if getattr(state, "admin_key", None) is None:
        state.admin_key = admin_key(state.config)
    expected: str = state.admin_key
    scheme, _, given = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), expected.encode()):
        raise GatewayError(
            401,
            "The admin endpoints need the gateway's admin key.",
            code="invalid_admin_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return request.app.state.fleet


def describe(replica: Replica, stale_s: float) -> dict[str, object]:
    load, health = replica.load, replica.health
    return {
        "name": replica.name,
        "grpc_url": replica.config.grpc_url,
        "routable": replica.routable,
        "ejected": health.ejected,
        "draining": replica.draining,
        "in_flight": replica.in_flight,
        "consecutive_failures": health.failures,
        "ejections_in_a_row": health.ejections,
        "last_failure": health.last_reason or None,
        "ejected_for_s": round(max(0.0, health.ejected_until - time.monotonic()), 1) if health.ejected else 0,
        "load": {
            "waiting": load.waiting,
            "running": load.running,
            "kv_blocks_used": load.kv_used,
            "kv_blocks_capacity": load.kv_capacity,
            "stale": load.stale(stale_s),
            "age_s": None if load.at <= 0 else round(load.age_s(), 2),
        },
    }


def _replica(fleet: Fleet, name: str) -> Replica:
    replica = fleet.by_name.get(name)
    if replica is None:
        raise GatewayError(404, f"No replica named '{name}'; replicas are {', '.join(fleet.by_name)}.", param="name")
    return replica


@router.get("/admin/replicas")
async def replicas(request: Request) -> JSONResponse:
    fleet = _check(request)
    return JSONResponse({"replicas": [describe(r, fleet.config.fleet.metrics_stale_s) for r in fleet.replicas]})


@router.post("/admin/replicas/{name}/drain")
async def drain(name: str, request: Request) -> JSONResponse:
    fleet = _check(request)
    replica = fleet.set_draining(_replica(fleet, name).name, True)
    return JSONResponse(describe(replica, fleet.config.fleet.metrics_stale_s))


@router.post("/admin/replicas/{name}/resume")
async def resume(name: str, request: Request) -> JSONResponse:
    fleet = _check(request)
    replica = fleet.set_draining(_replica(fleet, name).name, False)
    return JSONResponse(describe(replica, fleet.config.fleet.metrics_stale_s))


@router.get("/admin/degradation")
async def degradation(request: Request) -> JSONResponse:
    _check(request)
    state = request.app.state.degradation
    if state is None:
        return JSONResponse({"level": 0, "max_level": 0, "enabled": False})
    return JSONResponse({"enabled": True, **state.describe()})
