"""The gateway the fuzz tests send to: its own process in front of the
module's tritonserver, one key of a tier that caps `max_tokens` (so an
accepted body stays short) and sets no QPS / TPS limit (so no 429 hides a
request), the public gRPC door off."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from serving.gateway_process import GatewayProcess
from serving.launcher import TritonServer, free_local_ports

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class FuzzGateway:
    process: GatewayProcess
    url: str
    key: str


@contextmanager
def fuzz_gateway_process(
    triton_server: TritonServer, work: Path, *, tokens_cap: int, label: str
) -> Iterator[FuzzGateway]:
    settings = work / "gateway.toml"
    settings.write_text(f"[gateway]\ntiers = '{json.dumps({'fuzz': {'max_tokens_cap': tokens_cap}})}'\n")
    keys = work / "keys.json"
    created = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "keys",
            "--settings",
            str(settings),
            "--keys-file",
            str(keys),
            "create",
            "--tier",
            "fuzz",
            "--label",
            label,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    if created.returncode != 0:
        raise RuntimeError(f"gateway keys create failed: {created.stderr}")
    (port,) = free_local_ports(1)
    process = GatewayProcess(
        [
            f"gateway.port={port}",
            "gateway.host=127.0.0.1",
            f"gateway.fleet.upstream_grpc_url={triton_server.grpc_url}",
            f"gateway.keys_file={keys}",
            "gateway.public_grpc_port=0",
        ],
        log_path=work / "gateway.log",
        port=port,
        settings_file=str(settings),
    )
    process.start()
    try:
        yield FuzzGateway(process, f"http://127.0.0.1:{port}", created.stdout.strip())
    finally:
        code = process.stop()
    if code != 0:
        raise RuntimeError(f"the fuzz gateway exited with {code}; see {process.log_path}")
