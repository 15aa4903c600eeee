"""Done means, for what CI cannot run: each Dockerfile passes hadolint, every
rendered manifest (both profiles, with and without the InferencePool) is
valid for the pinned Kubernetes release in strict mode, the custom resources
are valid against their vendored CRD schemas, compose.yaml is valid against
the Compose specification's schema, and promtool accepts the Prometheus
config and rules. Each validator is also shown to reject a broken input, so
a pass means something."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest
import yaml

from serving.deploy.profile import load_profile
from serving.deploy.render import render, to_yaml
from serving.paths import REPO_ROOT
from serving.settings import DeploymentSettings
from tests.unit.deploy.validation import SCHEMAS, promtool, tool, validate

DOCKERFILES = sorted((REPO_ROOT / "docker").glob("*.Dockerfile"))
COMPOSE = REPO_ROOT / "deploy" / "compose.yaml"
PROMETHEUS = REPO_ROOT / "deploy" / "prometheus"
CASES = [
    ("cpu", ()),
    ("gpu", ()),
    ("cpu", ("inference_pool=true",)),
    ("gpu", ("inference_pool=true", "autoscale=false")),
]


def settings() -> DeploymentSettings:
    return DeploymentSettings.load(
        environ={}, default_model_dir=lambda: "/var/lib/triton-llm/cache/models/SmolLM2-135M-Instruct"
    )


def rendered(profile: str, assignments: tuple[str, ...]) -> list[dict]:
    manifests = render(settings(), load_profile(profile, assignments))
    # through YAML text and back: what kubectl would read
    return [o for objects in manifests.values() for o in yaml.safe_load_all(to_yaml(objects))]


def test_two_dockerfiles():
    assert {p.name for p in DOCKERFILES} == {"cpu.Dockerfile", "gpu.Dockerfile"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile: Path):
    result = subprocess.run(
        [tool("hadolint"), "--config", str(REPO_ROOT / ".hadolint.yaml"), str(dockerfile)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_rejects_an_unpinned_image(tmp_path: Path):
    broken = tmp_path / "Dockerfile"
    broken.write_text("FROM python:latest\nRUN pip install requests\n")
    result = subprocess.run(
        [tool("hadolint"), "--config", str(REPO_ROOT / ".hadolint.yaml"), str(broken)], capture_output=True, text=True
    )
    assert result.returncode != 0 and "DL3007" in result.stdout and "DL3013" in result.stdout


@pytest.mark.parametrize("profile,assignments", CASES, ids=lambda v: v if isinstance(v, str) else ",".join(v))
def test_every_rendered_object_is_valid(profile: str, assignments: tuple[str, ...]):
    objects = rendered(profile, assignments)
    kinds = {o["kind"] for o in objects}
    assert {
        "StatefulSet",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ConfigMap",
        "ServiceMonitor",
        "PrometheusRule",
    } <= kinds
    if "inference_pool=true" in assignments:
        assert "InferencePool" in kinds
    for obj in objects:
        try:
            validate(obj)
        except Exception as exc:  # name the object in the failure
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {exc}")


def test_strict_validation_rejects_an_unknown_field():
    statefulset = next(o for o in rendered("cpu", ()) if o["kind"] == "StatefulSet")
    broken = copy.deepcopy(statefulset)
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}  # a typo
    with pytest.raises(Exception, match="readinesProbe"):
        validate(broken)


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PrometheusRule", "InferencePool"])
def test_custom_resource_schemas_reject_an_unknown_field(kind: str):
    obj = next(o for o in rendered("cpu", ("inference_pool=true",)) if o["kind"] == kind)
    validate(obj)
    broken = copy.deepcopy(obj)
    broken["spec"]["selektor"] = {}
    with pytest.raises(Exception, match="selektor"):
        validate(broken)


def test_custom_resource_schemas_check_types():
    pool = next(o for o in rendered("cpu", ("inference_pool=true",)) if o["kind"] == "InferencePool")
    pool["spec"]["targetPorts"] = [{"number": 70000}]
    with pytest.raises(Exception, match="70000"):
        validate(pool)


def _check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("check-jsonschema"), "--schemafile", str(SCHEMAS / "compose-spec.json"), str(path)],
        capture_output=True,
        text=True,
    )


def test_compose_is_valid():
    result = _check_compose(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_schema_rejects_an_unknown_key(tmp_path: Path):
    data = yaml.safe_load(COMPOSE.read_text())
    data["services"]["gateway"]["comand"] = ["gateway"]
    broken = tmp_path / "compose.yaml"
    broken.write_text(yaml.safe_dump(data))
    result = _check_compose(broken)
    assert result.returncode != 0 and "comand" in result.stdout


def test_promtool_accepts_the_config_and_rules():
    config = subprocess.run(
        [promtool(), "check", "config", str(PROMETHEUS / "prometheus.yml")], capture_output=True, text=True
    )
    assert config.returncode == 0, config.stdout + config.stderr
    rule_files = sorted(str(p) for p in (PROMETHEUS / "rules").glob("*.yml"))
    assert rule_files
    rules = subprocess.run([promtool(), "check", "rules", *rule_files], capture_output=True, text=True)
    assert rules.returncode == 0, rules.stdout + rules.stderr


def test_promtool_rejects_a_broken_rule(tmp_path: Path):
    broken = tmp_path / "broken.yml"
    broken.write_text("groups:\n  - name: x\n    rules:\n      - alert: Broken\n        expr: sum(rate(x[5m])\n")
    result = subprocess.run([promtool(), "check", "rules", str(broken)], capture_output=True, text=True)
    assert result.returncode != 0
