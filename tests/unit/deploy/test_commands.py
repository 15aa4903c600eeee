"""The container-side commands without a server (the e2e tests run them
against a real tritonserver), the entrypoint script, and compose.yaml's
agreement with the settings and the images."""

from __future__ import annotations

import argparse
import subprocess
import time

import yaml

from gateway.config import GatewayConfig
from serving.deploy import drain, probe_command
from serving.launcher import free_local_ports
from serving.paths import REPO_ROOT

ENTRYPOINT = REPO_ROOT / "docker" / "entrypoint.sh"

EXPOSITION = """# HELP llm_num_requests_running Requests in the running batch
# TYPE llm_num_requests_running gauge
llm_num_requests_running{model="python_llm",version="1"} 2
# HELP llm_num_requests_waiting Requests waiting to be scheduled
# TYPE llm_num_requests_waiting gauge
llm_num_requests_waiting{model="python_llm",version="1"} 3
# TYPE nv_inference_count counter
nv_inference_count{model="ensemble",version="1"} 40
"""


def test_drain_counts_running_and_waiting():
    assert drain.busy(EXPOSITION) == 5
    assert drain.busy(EXPOSITION.replace("} 2", "} 0").replace("} 3", "} 0")) == 0


def test_drain_returns_when_nothing_answers():
    (port,) = free_local_ports(1)
    args = argparse.Namespace(
        metrics_url=f"http://127.0.0.1:{port}/metrics", delay_s=0.0, timeout_s=5.0, interval_s=0.1
    )
    started = time.monotonic()
    assert drain.main(args) == 0 and time.monotonic() - started < 3


def test_probe_fails_without_a_server(capsys, tmp_path):
    (port,) = free_local_ports(1)
    missing = tmp_path / "none.json"
    args = argparse.Namespace(grpc_url=f"127.0.0.1:{port}", golden=None, timeout_s=2.0, settings=None)
    started = time.monotonic()
    assert probe_command.main(args) == 1
    assert time.monotonic() - started < 10
    out = capsys.readouterr().out
    assert out.startswith("probe: ") and "ok" not in out.split()[1]
    # a golden file asked for and missing is a failure, never a silent pass
    args.golden = str(missing)
    assert probe_command.main(args) == 1


def test_entrypoint_is_valid_shell_and_runs_other_commands():
    subprocess.run(["sh", "-n", str(ENTRYPOINT)], check=True)
    result = subprocess.run([str(ENTRYPOINT), "echo", "hello"], capture_output=True, text=True, check=True)
    assert result.stdout == "hello\n"


def test_compose_agrees_with_the_settings_and_the_images():
    compose = yaml.safe_load((REPO_ROOT / "deploy" / "compose.yaml").read_text())
    services = compose["services"]
    defaults = GatewayConfig()
    assert services["triton"]["deploy"]["replicas"] == 2
    env = services["gateway"]["environment"]
    host, _, grpc = env["LLM__GATEWAY__FLEET__DISCOVERY_DNS"].partition(":")
    assert host == "triton" and grpc == "8001"
    assert int(env["LLM__GATEWAY__FLEET__DISCOVERY_METRICS_PORT"]) == defaults.fleet.discovery_metrics_port
    published = {p.rsplit(":", 1)[1] for p in services["gateway"]["ports"]}
    assert published == {str(defaults.port), str(defaults.public_grpc_port), str(defaults.ops_port)}
    # the ops port (/metrics, /admin/*) on the compose network for Prometheus; on the host, loopback only
    assert env["LLM__GATEWAY__OPS_HOST"] == "0.0.0.0"
    assert f"127.0.0.1:{defaults.ops_port}:{defaults.ops_port}" in services["gateway"]["ports"]
    # the golden file the CPU image bakes in (docker/cpu.Dockerfile: prepare-model at build)
    dockerfile = (REPO_ROOT / "docker" / "cpu.Dockerfile").read_text()
    assert "LLM_BUILD_DIR=/var/lib/triton-llm/build" in dockerfile and "prepare-model" in dockerfile
    assert env["LLM__GATEWAY__FLEET__PROBE_GOLDEN_FILE"] == "/var/lib/triton-llm/build/probe/SmolLM2-135M-Instruct.json"
    # the gateway's drain fits in compose's stop grace period
    grace = int(services["gateway"]["stop_grace_period"].rstrip("s"))
    assert grace > float(env["LLM__GATEWAY__DRAIN_TIMEOUT_S"])
    # Prometheus scrapes the replicas' metrics port
    prometheus = yaml.safe_load((REPO_ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    triton_job = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "triton")
    assert triton_job["dns_sd_configs"][0]["port"] == defaults.fleet.discovery_metrics_port
    gateway_job = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "gateway")
    assert gateway_job["static_configs"][0]["targets"] == [f"gateway:{defaults.ops_port}"]
