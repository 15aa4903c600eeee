"""Every metric that a Grafana panel, a recording or alert rule, the
prometheus-adapter rule or the HPA reads is exposed by a live stack: a real
tritonserver's metrics port and a real gateway's /metrics on its ops port (the gateway
started with the image's `gateway` command and compose's kind of settings:
replicas found by DNS, the golden answer, a key store), after one request.
The names are parsed from the files themselves (tests/unit/deploy/references.py
says what "present" means: a declared family counts, samples or not)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.admission.keys import KeyStore
from serving.deploy import monitoring
from serving.deploy.profile import load_profile
from serving.deploy.render import render
from serving.launcher import TritonServer, free_local_ports
from serving.paths import BUILD_DIR, REPO_ROOT
from serving.probe_golden import ensure_golden
from serving.settings import DeploymentSettings
from tests.unit.deploy.references import Exposition, collect

pytestmark = pytest.mark.e2e

ENTRYPOINT = REPO_ROOT / "docker" / "entrypoint.sh"
# which process exposes a family, by its prefix
SOURCES = {"llm_": "triton", "nv_": "triton", "gateway_": "gateway"}


def _health(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def gateway(triton_server: TritonServer, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    work = tmp_path_factory.mktemp("deploy-gateway")
    port, ops_port = free_local_ports(2)
    keys = KeyStore(work / "keys.json")
    key = keys.create("paid", label="deploy-metrics").key
    golden = ensure_golden(model_dir, build_dir=BUILD_DIR)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM__")}
    env.update(
        {
            # the image's PATH: its virtualenv first (here, the one running the tests)
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "LLM_BUILD_DIR": str(work / "build"),
            "LLM__GATEWAY__HOST": "127.0.0.1",
            "LLM__GATEWAY__PORT": str(port),
            "LLM__GATEWAY__PUBLIC_GRPC_PORT": "0",
            "LLM__GATEWAY__OPS_PORT": str(ops_port),  # /metrics: the ops port, as Prometheus scrapes it
            # found by name, as compose and Kubernetes find the replicas
            "LLM__GATEWAY__FLEET__DISCOVERY_DNS": f"127.0.0.1:{triton_server.options.grpc_port}",
            "LLM__GATEWAY__FLEET__DISCOVERY_METRICS_PORT": str(triton_server.options.metrics_port),
            "LLM__GATEWAY__FLEET__PROBE_GOLDEN_FILE": str(golden),
            "LLM__GATEWAY__FLEET__PROBE_INTERVAL_S": "1",
            "LLM__GATEWAY__KEYS_FILE": str(keys.path),
            "LLM__GATEWAY__ADMIN_KEY_FILE": str(work / "admin_key"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    log = work / "gateway.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            [str(ENTRYPOINT), "gateway"],
            env=env,
            cwd=REPO_ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _health(f"{url}/health"):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        yield {"url": url, "key": key, "log": log, "metrics_url": f"http://127.0.0.1:{ops_port}/metrics"}
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def test_every_referenced_metric_is_exposed(gateway: dict, triton_server: TritonServer):
    # one request through the stack (the replica must first pass its probe)
    answer = httpx.post(
        f"{gateway['url']}/v1/completions",
        timeout=120,
        headers={"Authorization": f"Bearer {gateway['key']}"},
        json={"model": "ensemble", "prompt": "1, 2, 3,", "max_tokens": 4, "temperature": 0},
    )
    assert answer.status_code == 200, answer.text
    expositions = {
        "gateway": Exposition.parse(httpx.get(gateway["metrics_url"], timeout=10).text),
        "triton": Exposition.parse(httpx.get(triton_server.metrics_url, timeout=10).text),
    }
    settings = DeploymentSettings.load(environ={}, default_model_dir=lambda: "/models/m")
    manifests = render(settings, load_profile("cpu", ["inference_pool=true"]))
    references = collect(monitoring.rule_files(), monitoring.dashboard_files(), manifests).scraped()
    assert len(references) > 20
    missing = []
    for name, used_by in sorted(references.items()):
        source = next((s for prefix, s in SOURCES.items() if name.startswith(prefix)), None)
        if source is None or not expositions[source].present(name):
            missing.append(f"{name} ({source or 'no known source'}): used by {', '.join(sorted(used_by))}")
    assert not missing, "not exposed by the live stack:\n" + "\n".join(missing)
