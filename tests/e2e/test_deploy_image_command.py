"""The CPU image's start, without Docker: its ENTRYPOINT + CMD are read from
docker/cpu.Dockerfile and run exactly (the image's paths mapped onto this
checkout and venv, its ENV applied, the ports and address given through the
same LLM_TRITON_* variables a container gets), with the wheel's tritonserver.
The server becomes ready, the readiness probe's command (an inference check
against the golden answer) passes and fails a wrong golden, the preStop
drain returns on an idle engine, Triton's log reaches the container's output,
and SIGTERM (what `docker stop` and Kubernetes send) stops it cleanly."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from serving.launcher import free_local_ports
from serving.paths import BUILD_DIR, CACHE_DIR, REPO_ROOT
from serving.probe_golden import golden_path

pytestmark = pytest.mark.e2e

DOCKERFILE = REPO_ROOT / "docker" / "cpu.Dockerfile"


@dataclass
class Image:
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    out, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        keyword, _, rest = current.strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
        current = ""
    return out


def parse_dockerfile(path: Path) -> Image:
    """The last stage's WORKDIR, ENV, ENTRYPOINT and CMD (exec form only: the
    shell form would need a shell the image defines)."""
    image = Image()
    for keyword, rest in _instructions(path.read_text()):
        if keyword == "FROM":
            image = Image()
        elif keyword == "WORKDIR":
            image.workdir = rest
        elif keyword == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                image.env[key] = re.sub(r"\$\{?(\w+)\}?", lambda m: image.env.get(m.group(1), f"${m.group(1)}"), value)  # noqa: B023
        elif keyword in ("ENTRYPOINT", "CMD"):
            value = json.loads(rest)
            assert isinstance(value, list), f"{keyword} must be in exec form (signals reach the process)"
            if keyword == "ENTRYPOINT":
                image.entrypoint, image.cmd = value, []  # a new ENTRYPOINT resets CMD
            else:
                image.cmd = value
    return image


def test_the_dockerfile_is_parsed():
    image = parse_dockerfile(DOCKERFILE)
    assert image.workdir == "/app" and image.entrypoint == ["/app/docker/entrypoint.sh"] and image.cmd == ["triton"]
    assert image.env["LLM_BUILD_DIR"] == "/var/lib/triton-llm/build"
    assert image.env["PATH"].startswith("/opt/venv/bin:")


def local_command(image: Image) -> list[str]:
    """The image's command with its paths on this checkout (the image copies the repo to WORKDIR)."""

    def here(arg: str) -> str:
        return str(REPO_ROOT) + arg[len(image.workdir) :] if arg.startswith(image.workdir + "/") else arg

    return [here(arg) for arg in [*image.entrypoint, *image.cmd]]


def local_env(image: Image, build_dir: Path, ports: dict[str, int]) -> dict[str, str]:
    venv = Path(sys.executable).parent.parent
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LLM__") and k not in ("LLM_MODEL_DIR", "LLM_TRITON_ADMIN_KEY")
    }
    env = dict(base)
    for key, value in image.env.items():
        value = value.replace(image.env.get("VIRTUAL_ENV", "/opt/venv"), str(venv))
        env[key] = value.replace("$PATH", base.get("PATH", ""))
    # the image's own folders: the converted model where this machine keeps it, a fresh build dir
    env["LLM_CACHE_DIR"], env["LLM_BUILD_DIR"] = str(CACHE_DIR), str(build_dir)
    env.update(
        {
            "LLM_TRITON_ADDRESS": "127.0.0.1",
            "LLM_TRITON_HTTP_PORT": str(ports["http"]),
            "LLM_TRITON_GRPC_PORT": str(ports["grpc"]),
            "LLM_TRITON_METRICS_PORT": str(ports["metrics"]),
        }
    )
    return env


@dataclass
class Container:
    process: subprocess.Popen[bytes]
    env: dict[str, str]
    ports: dict[str, int]
    build_dir: Path
    output: Path

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), env=self.env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def container(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    image = parse_dockerfile(DOCKERFILE)
    work = tmp_path_factory.mktemp("image")
    build_dir = work / "build"
    known = golden_path(model_dir, BUILD_DIR)
    if known.is_file():  # what the image records at build (prepare-model); else serve computes it
        (build_dir / "probe").mkdir(parents=True)
        shutil.copy2(known, build_dir / "probe" / known.name)
    http, grpc, metrics = free_local_ports(3)
    ports = {"http": http, "grpc": grpc, "metrics": metrics}
    env = local_env(image, build_dir, ports)
    output = work / "output.log"
    with open(output, "wb") as sink:
        process = subprocess.Popen(
            local_command(image), env=env, cwd=REPO_ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    started = Container(process, env, ports, build_dir, output)
    try:
        t0 = time.monotonic()
        while not _ready(http):
            assert process.poll() is None, f"exited with {process.returncode}:\n{output.read_text()[-3000:]}"
            assert time.monotonic() - t0 < 300, f"not ready in 300 s:\n{output.read_text()[-3000:]}"
            time.sleep(0.5)
        print(f"\n[the image's command ready in {time.monotonic() - t0:.1f} s on :{http}]")
        yield started
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(process.pid, signal.SIGKILL)  # whatever is left of the group (tail, stubs)
        except ProcessLookupError:
            pass


def test_the_image_command_serves_and_its_probes_pass(container: Container, tmp_path: Path):
    # the readiness probe: ready + the golden answer
    probe = container.run(sys.executable, "-m", "serving", "probe", "--timeout-s", "30")
    assert probe.returncode == 0, probe.stdout + probe.stderr
    assert probe.stdout.startswith("probe: ok") and "golden" in probe.stdout, probe.stdout
    # a replica that answers something else is not ready
    golden = json.loads(next((container.build_dir / "probe").glob("*.json")).read_text())
    golden["output_ids"] = [(i + 1) % 1000 for i in golden["output_ids"]]
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps(golden))
    probe = container.run(sys.executable, "-m", "serving", "probe", "--golden", str(wrong), "--timeout-s", "30")
    assert probe.returncode == 1 and "wrong_answer" in probe.stdout, probe.stdout + probe.stderr
    # the preStop hook on an idle engine
    drain = container.run(sys.executable, "-m", "serving", "drain", "--timeout-s", "10")
    assert drain.returncode == 0 and "idle" in drain.stdout, drain.stdout + drain.stderr
    # Triton's own log reaches the container's output (kubectl logs / docker logs)
    output = container.output.read_text(errors="replace")
    assert "ready." in output and "Started GRPCInferenceService" in output, output[-3000:]


def test_sigterm_stops_it(container: Container):
    container.process.send_signal(signal.SIGTERM)
    code = container.process.wait(90)
    assert code == 0, container.output.read_text(errors="replace")[-3000:]
    assert not _ready(container.ports["http"])
