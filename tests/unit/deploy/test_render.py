"""The manifests are rendered from the deployment settings: change a setting,
see it in the YAML; the settings ConfigMap reads back as the same settings;
the cluster-side values come from the profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving import cli
from serving.deploy import monitoring
from serving.deploy.names import names_for
from serving.deploy.profile import ProfileError, load_profile
from serving.deploy.render import render, to_yaml
from serving.deploy.settings_env import DEFAULT_MODEL_DIR, IMAGE_GOLDEN, for_cluster, settings_env
from serving.settings import DeploymentSettings, SettingsError
from tests.unit.deploy.references import collect


def settings(*assignments: str) -> DeploymentSettings:
    return DeploymentSettings.load(environ={}, assignments=assignments, default_model_dir=lambda: DEFAULT_MODEL_DIR)


def objects(
    *assignments: str, profile: str = "cpu", k8s: tuple[str, ...] = (), golden: Path | None = None
) -> dict[tuple[str, str], dict[str, Any]]:
    manifests = render(settings(*assignments), load_profile(profile, k8s), golden)
    return {
        (o["kind"], o["metadata"]["name"]): o for docs in manifests.values() for o in yaml.safe_load_all(to_yaml(docs))
    }


def config_env(objs: dict) -> dict[str, str]:
    return objs[("ConfigMap", "triton-llm-settings")]["data"]


def pod(objs: dict, kind: str = "StatefulSet", name: str = "triton-llm-triton") -> dict[str, Any]:
    return objs[(kind, name)]["spec"]["template"]["spec"]


def container(objs: dict, name: str, kind: str = "StatefulSet", obj: str = "triton-llm-triton") -> dict[str, Any]:
    return next(c for c in pod(objs, kind, obj)["containers"] if c["name"] == name)


def test_the_settings_configmap_reads_back_as_the_same_settings():
    original = settings(
        "engine.max_num_seqs=8",
        "gateway.drain_timeout_s=90",
        "text.max_messages=12",
        'gateway.tiers={"gold": {"priority": 20, "allowed_models": ["ensemble"]}}',
        "engine.enable_kv_cache_reuse=false",
    )
    profile = load_profile("gpu")
    deployed = for_cluster(original, profile, names_for(profile), golden_mounted=False)
    env = settings_env(deployed)
    assert DeploymentSettings.load(environ=env) == deployed
    # only what differs from the defaults (and the model folder) is written
    assert env["LLM__ENGINE__MAX_NUM_SEQS"] == "8" and env["LLM__ENGINE__ENABLE_KV_CACHE_REUSE"] == "false"
    assert "LLM__ENGINE__BLOCK_SIZE" not in env


def test_a_changed_setting_shows_in_the_manifests():
    before, after = objects(), objects("engine.max_queue_size=32")
    assert "LLM__ENGINE__MAX_QUEUE_SIZE" not in config_env(before)
    assert config_env(after)["LLM__ENGINE__MAX_QUEUE_SIZE"] == "32"

    # a settings change rolls the pods (their template's checksum changes)
    def checksum(objs, kind, name):
        return objs[(kind, name)]["spec"]["template"]["metadata"]["annotations"]

    assert checksum(before, "StatefulSet", "triton-llm-triton") != checksum(after, "StatefulSet", "triton-llm-triton")
    assert checksum(before, "Deployment", "triton-llm-gateway") != checksum(after, "Deployment", "triton-llm-gateway")


def test_ports_follow_the_settings():
    objs = objects(
        "gateway.port=9100",
        "gateway.public_grpc_port=9101",
        "gateway.fleet.discovery_metrics_port=8102",
        "gateway.fleet.discovery_dns=triton.example.svc.cluster.local:8101",
        "gateway.ops_port=9102",
    )
    gateway = container(objs, "gateway", "Deployment", "triton-llm-gateway")
    assert {p["name"]: p["containerPort"] for p in gateway["ports"]} == {"http": 9100, "grpc": 9101, "ops": 9102}
    service = objs[("Service", "triton-llm-gateway")]
    assert [p["port"] for p in service["spec"]["ports"]] == [9100, 9101]  # the API only
    assert [p["port"] for p in objs[("Service", "triton-llm-gateway-ops")]["spec"]["ports"]] == [9102]
    triton = container(objs, "triton")
    assert {p["name"]: p["containerPort"] for p in triton["ports"]} == {"http": 8000, "grpc": 8101, "metrics": 8102}
    env = {e["name"]: e.get("value") for e in triton["env"]}
    assert env["LLM_TRITON_GRPC_PORT"] == "8101" and env["LLM_TRITON_METRICS_PORT"] == "8102"
    assert config_env(objs)["LLM__GATEWAY__FLEET__DISCOVERY_DNS"] == "triton.example.svc.cluster.local:8101"
    policy = objs[("NetworkPolicy", "triton-llm-triton")]["spec"]["ingress"]
    assert {p["port"] for p in policy[0]["ports"]} == {8000, 8101, 8102}
    assert [p["port"] for p in policy[1]["ports"]] == [8102]


def test_no_public_grpc_port_no_grpc_port():
    objs = objects("gateway.public_grpc_port=0")
    ports = container(objs, "gateway", "Deployment", "triton-llm-gateway")["ports"]
    assert [p["name"] for p in ports] == ["http", "ops"]


def test_the_ops_port_is_reachable_by_prometheus_but_not_through_the_public_service():
    objs = objects()
    assert config_env(objs)["LLM__GATEWAY__OPS_HOST"] == "0.0.0.0"  # the pod IP, not its loopback
    public = objs[("Service", "triton-llm-gateway")]["spec"]
    assert [p["name"] for p in public["ports"]] == ["http", "grpc"]
    ops = objs[("Service", "triton-llm-gateway-ops")]
    assert ops["spec"]["clusterIP"] == "None" and ops["spec"]["publishNotReadyAddresses"] is True
    assert ops["spec"]["ports"] == [{"name": "ops", "port": 9002, "targetPort": "ops", "protocol": "TCP"}]
    assert ops["spec"]["selector"] == public["selector"]
    monitor = objs[("ServiceMonitor", "triton-llm-gateway")]["spec"]
    assert monitor["endpoints"][0]["port"] == "ops" and monitor["endpoints"][0]["path"] == "/metrics"
    assert monitor["selector"]["matchLabels"].items() <= ops["metadata"]["labels"].items()
    assert monitor["jobLabel"] in ops["metadata"]["labels"]  # job="gateway", as the rules expect
    # the API ports from anywhere, the ops port from the monitoring namespace only
    policy = objs[("NetworkPolicy", "triton-llm-gateway")]["spec"]
    assert policy["ingress"][0] == {"ports": [{"protocol": "TCP", "port": 9000}, {"protocol": "TCP", "port": 9001}]}
    assert policy["ingress"][1] == {
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        "ports": [{"protocol": "TCP", "port": 9002}],
    }
    assert container(objs, "gateway", "Deployment", "triton-llm-gateway")["readinessProbe"]["httpGet"]["port"] == "http"
    # an InferencePool's sidecar keeps its ops port on the pod's loopback
    sidecar = container(objects(k8s=("inference_pool=true",)), "openai")
    assert {e["name"]: e["value"] for e in sidecar["env"]}["LLM__GATEWAY__OPS_HOST"] == "127.0.0.1"
    assert [p["name"] for p in sidecar["ports"]] == ["http"]
    # off: nothing to scrape, nothing rendered for it
    off = objects("gateway.ops_port=0")
    assert ("Service", "triton-llm-gateway-ops") not in off and ("ServiceMonitor", "triton-llm-gateway") not in off
    ports = container(off, "gateway", "Deployment", "triton-llm-gateway")["ports"]
    assert [p["name"] for p in ports] == ["http", "grpc"]


def test_the_gateway_discovers_the_headless_service_and_shares_redis():
    objs = objects()
    env = config_env(objs)
    assert env["LLM__GATEWAY__FLEET__DISCOVERY_DNS"] == "triton-llm-triton.triton-llm.svc.cluster.local:8001"
    assert objs[("Service", "triton-llm-triton")]["spec"]["clusterIP"] == "None"
    assert objs[("StatefulSet", "triton-llm-triton")]["spec"]["serviceName"] == "triton-llm-triton"
    assert env["LLM__GATEWAY__REDIS_URL"] == "redis://triton-llm-redis.triton-llm.svc.cluster.local:6379/0"
    assert ("Deployment", "triton-llm-redis") in objs
    assert objs[("Deployment", "triton-llm-gateway")]["spec"]["replicas"] >= 2
    # an external Redis: none rendered
    external = objects("gateway.redis_url=redis://redis.example:6379/0")
    assert ("Deployment", "triton-llm-redis") not in external
    assert config_env(external)["LLM__GATEWAY__REDIS_URL"] == "redis://redis.example:6379/0"


def test_thread_count_is_the_cpu_limit_unless_set():
    objs = objects(k8s=("triton_cpu=6",))
    assert config_env(objs)["LLM__ENGINE__NUM_THREADS"] == "6"
    assert container(objs, "triton")["resources"]["limits"]["cpu"] == "6"
    assert config_env(objects("engine.num_threads=3", k8s=("triton_cpu=6",)))["LLM__ENGINE__NUM_THREADS"] == "3"


def test_drain_timeout_sets_the_grace_periods():
    short, long = objects("gateway.drain_timeout_s=30"), objects("gateway.drain_timeout_s=600")
    for kind, name in (("StatefulSet", "triton-llm-triton"), ("Deployment", "triton-llm-gateway")):
        assert (
            pod(long, kind, name)["terminationGracePeriodSeconds"]
            - pod(short, kind, name)["terminationGracePeriodSeconds"]
            == 570
        )
        # longer than the longest reply the gateway waits for
        assert pod(long, kind, name)["terminationGracePeriodSeconds"] > 600
    pre_stop = container(long, "triton")["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[:4] == ["python", "-m", "serving", "drain"]
    assert pre_stop[pre_stop.index("--timeout-s") + 1] == "600"
    # it first waits for the gateways' DNS refresh
    assert int(pre_stop[pre_stop.index("--delay-s") + 1]) > settings().gateway.fleet.discovery_interval_s
    grace = pod(long, "StatefulSet", "triton-llm-triton")["terminationGracePeriodSeconds"]
    assert grace > int(pre_stop[pre_stop.index("--delay-s") + 1]) + 600


def test_probes():
    triton = container(objects(k8s=("startup_timeout_s=900",)), "triton")
    startup = triton["startupProbe"]
    assert startup["httpGet"]["path"] == "/v2/health/ready"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 900
    # readiness includes the inference check
    assert triton["readinessProbe"]["exec"]["command"][:4] == ["python", "-m", "serving", "probe"]
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    gateway = container(objects(), "gateway", "Deployment", "triton-llm-gateway")
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "tcpSocket" in gateway["livenessProbe"]  # a draining gateway is alive


def test_gpu_profile_node_pool_and_devices():
    objs = objects(profile="gpu")
    spec = pod(objs)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    limits = container(objs, "triton")["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    assert config_env(objs)["LLM__ENGINE__DEVICE"] == "cuda"
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    # the CPU profile: the same manifests without GPUs
    cpu = objects()
    assert "nvidia.com/gpu" not in container(cpu, "triton")["resources"]["limits"]
    assert "nodeSelector" not in pod(cpu) and "LLM__ENGINE__DEVICE" not in config_env(cpu)


def test_weights_on_a_pvc_filled_by_an_init_container():
    objs = objects(k8s=("storage_size=50Gi", "storage_class=fast"))
    statefulset = objs[("StatefulSet", "triton-llm-triton")]["spec"]
    claim = statefulset["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    init = pod(objs)["initContainers"][0]
    assert init["args"] == ["prepare-model"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/var/lib/triton-llm"} in init["volumeMounts"]
    other = objects("engine.model_dir=/var/lib/triton-llm/models/Qwen2-0.5B")
    assert pod(other)["initContainers"][0]["args"] == [
        "prepare-model",
        "--model-dir",
        "/var/lib/triton-llm/models/Qwen2-0.5B",
    ]


def test_hpa_scales_on_the_engine_queue_with_a_gentle_scale_down():
    objs = objects(k8s=("queue_target_per_replica=6", "triton_max_replicas=10", "scale_down_stabilization_s=1200"))
    hpa = objs[("HorizontalPodAutoscaler", "triton-llm-triton")]["spec"]
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "llm_num_requests_waiting"
    assert hpa["metrics"][0]["pods"]["target"]["averageValue"] == "6"
    assert hpa["maxReplicas"] == 10 and hpa["minReplicas"] == 2
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 1200
    assert hpa["behavior"]["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]
    # the HPA owns the replica count
    assert "replicas" not in objs[("StatefulSet", "triton-llm-triton")]["spec"]
    adapter = yaml.safe_load(objs[("ConfigMap", "triton-llm-prometheus-adapter")]["data"]["config.yaml"])
    assert adapter["rules"][0]["name"]["as"] == "llm_num_requests_waiting"
    fixed = objects(k8s=("autoscale=false", "triton_replicas=3"))
    assert ("HorizontalPodAutoscaler", "triton-llm-triton") not in fixed
    assert fixed[("StatefulSet", "triton-llm-triton")]["spec"]["replicas"] == 3


def test_golden_answer():
    # the default model: the images' own golden file
    assert config_env(objects())["LLM__GATEWAY__FLEET__PROBE_GOLDEN_FILE"] == IMAGE_GOLDEN
    # another model without one: readiness only (no wrong golden)
    assert "LLM__GATEWAY__FLEET__PROBE_GOLDEN_FILE" not in config_env(objects("engine.model_dir=/var/lib/triton-llm/m"))


def test_golden_file_ships_in_a_configmap(tmp_path: Path):
    golden = tmp_path / "golden.json"
    golden.write_text(json.dumps({"prompt": "1, 2,", "output_ids": [1, 2]}))
    objs = objects("engine.model_dir=/var/lib/triton-llm/m", golden=golden)
    assert objs[("ConfigMap", "triton-llm-probe-golden")]["data"]["golden.json"] == golden.read_text()
    assert config_env(objs)["LLM__GATEWAY__FLEET__PROBE_GOLDEN_FILE"] == "/etc/triton-llm/probe/golden.json"
    gateway_pod = pod(objs, "Deployment", "triton-llm-gateway")
    assert {"name": "golden", "configMap": {"name": "triton-llm-probe-golden"}} in gateway_pod["volumes"]


def test_inference_pool_selects_pods_that_serve_the_openai_api():
    objs = objects(k8s=("inference_pool=true",))
    pool = objs[("InferencePool", "triton-llm")]["spec"]
    assert (
        pool["selector"]["matchLabels"] == objs[("StatefulSet", "triton-llm-triton")]["spec"]["selector"]["matchLabels"]
    )
    sidecar = container(objs, "openai")
    assert pool["targetPorts"] == [{"number": sidecar["ports"][0]["containerPort"]}]
    env = {e["name"]: e["value"] for e in sidecar["env"]}
    assert json.loads(env["LLM__GATEWAY__FLEET__REPLICAS"])["local"]["grpc_url"] == "127.0.0.1:8001"
    assert env["LLM__GATEWAY__FLEET__DISCOVERY_DNS"] == ""
    # the pool's traffic may reach the sidecar's port
    ingress = objs[("NetworkPolicy", "triton-llm-triton")]["spec"]["ingress"]
    assert {"ports": [{"protocol": "TCP", "port": 9000}]} in ingress
    assert ("InferencePool", "triton-llm") not in objects()


def test_security_context_non_root():
    objs = objects()
    for kind, name in (("StatefulSet", "triton-llm-triton"), ("Deployment", "triton-llm-gateway")):
        assert pod(objs, kind, name)["securityContext"]["runAsNonRoot"] is True
    assert (
        container(objs, "gateway", "Deployment", "triton-llm-gateway")["securityContext"]["readOnlyRootFilesystem"]
        is True
    )


def test_metric_references_resolve():
    manifests = render(settings(), load_profile("cpu"))
    refs = collect(monitoring.rule_files(), monitoring.dashboard_files(), manifests).scraped()
    assert "llm_num_requests_waiting" in refs and "HorizontalPodAutoscaler" in refs["llm_num_requests_waiting"]
    assert {
        "gateway_time_to_first_token_seconds_bucket",
        "llm_kv_cache_blocks_used",
        "gateway_degradation_level",
        "gateway_replica_routable",
        "gateway_rate_limited_total",
        "llm_preemptions_total",
        "nv_inference_request_failure",
    } <= set(refs)
    # recording rules' outputs are followed to their sources, never asked of a target
    assert not [name for name in refs if ":" in name]


def test_profile_errors():
    with pytest.raises(ProfileError, match="no_such_field"):
        load_profile("cpu", ["no_such_field=1"])
    with pytest.raises(ProfileError, match="triton_cpu"):
        load_profile("cpu", ["triton_cpu=many"])
    with pytest.raises(ProfileError, match="tpu"):
        load_profile("tpu")
    assert load_profile("cpu", ['node_selector={"pool": "cpu"}']).node_selector == {"pool": "cpu"}


def test_render_k8s_command(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    for key in [k for k in __import__("os").environ if k.startswith("LLM__")]:
        monkeypatch.delenv(key)
    assert (
        cli.main(
            [
                "render-k8s",
                "--profile",
                "gpu",
                "--out",
                str(tmp_path),
                "--set",
                "engine.max_num_seqs=16",
                "--k8s",
                "namespace=llm-prod",
            ]
        )
        == 0
    )
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [
        "00-namespace.yaml",
        "10-settings.yaml",
        "20-triton.yaml",
        "30-gateway.yaml",
        "40-monitoring.yaml",
        "41-prometheus-adapter.yaml",
    ]
    text = (tmp_path / "10-settings.yaml").read_text()
    assert "LLM__ENGINE__MAX_NUM_SEQS: '16'" in text and "namespace: llm-prod" in text
    assert cli.main(["render-k8s", "--out", str(tmp_path), "--set", "engine.no_such=1"]) == 2
    assert "engine.no_such" in capsys.readouterr().err


def test_a_bad_setting_is_refused():
    with pytest.raises(SettingsError):
        settings("gateway.drain_timeout_s=soon")
    with pytest.raises(ValueError, match="gateway.host"):
        render(settings("gateway.host=127.0.0.1"), load_profile("cpu"))
