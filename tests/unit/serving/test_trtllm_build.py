"""`python -m serving build-trtllm`: without TensorRT-LLM or a GPU it says so in
one line and exits non-zero; with them (faked here) it converts the checkpoint
with TP x PP ranks through TensorRT-LLM's API and builds with `trtllm-build`,
limits from the deployment settings."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from python_llm.engine.config import EngineConfig
from serving.paths import REPO_ROOT
from serving.trtllm import convert_checkpoint
from serving.trtllm.build import CONVERT_SCRIPT, Toolchain, build_command, convert_command, find_toolchain, plan_build
from serving.trtllm.environment import EnvironmentMissing, Probes
from serving.trtllm.versions import TENSORRT_LLM_VERSION

HAS_TRTLLM = importlib.util.find_spec("tensorrt_llm") is not None


def _fake_machine(gpus: int = 4, version: str | None = TENSORRT_LLM_VERSION, trtllm_build: bool = True) -> Probes:
    def which(name: str) -> str | None:
        return {
            "nvidia-smi": "/usr/bin/nvidia-smi" if gpus else None,
            "trtllm-build": "/usr/local/bin/trtllm-build" if trtllm_build else None,
            "python3": "/usr/bin/python3",
        }.get(name)

    def run(command: list[str], **_: object) -> subprocess.CompletedProcess:
        if command[-1] == "-L":
            listing = "".join(f"GPU {i}: NVIDIA H100 (UUID: GPU-{i})\n" for i in range(gpus))
            return subprocess.CompletedProcess(command, 0, listing, "")
        if command[0] == "/usr/bin/python3" and version is not None:
            return subprocess.CompletedProcess(command, 0, f"{version}\n", "")
        return subprocess.CompletedProcess(command, 1, "", "ModuleNotFoundError: tensorrt_llm")

    return Probes(
        which=which, run=run, exists=lambda path: path.startswith("/usr/bin/python3") or path == sys.executable
    )


@pytest.mark.skipif(HAS_TRTLLM, reason="TensorRT-LLM is installed here")
def test_without_tensorrt_llm_the_command_says_so_in_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "serving", "build-trtllm", "--tp", "2", "--pp", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("build-trtllm: TensorRT-LLM is not installed here")
    assert f"pinned to tensorrt-llm {TENSORRT_LLM_VERSION}" in lines[0] and "24.10-trtllm" in lines[0]
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        (dict(version=None), "TensorRT-LLM is not installed here"),
        (dict(version="0.15.0"), f"TensorRT-LLM 0.15.0 found, this repository is pinned to {TENSORRT_LLM_VERSION}"),
        (dict(trtllm_build=False), "trtllm-build is not on PATH"),
        (dict(gpus=0), "no NVIDIA GPU here (nvidia-smi lists none)"),
        (dict(gpus=1), "tp 2 x pp 2 needs 4 GPUs, nvidia-smi lists 1"),
    ],
)
def test_each_missing_piece_is_named(machine: dict, expected: str):
    with pytest.raises(EnvironmentMissing) as caught:
        find_toolchain(2, 2, probes=_fake_machine(**machine))
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_with_everything_there_the_toolchain_is_found():
    tools = find_toolchain(2, 2, probes=_fake_machine(gpus=8))
    assert tools == Toolchain("/usr/bin/python3", TENSORRT_LLM_VERSION, "/usr/local/bin/trtllm-build", 8)
    with pytest.raises(ValueError, match="--tp and --pp"):
        find_toolchain(0, 1, probes=_fake_machine())


def test_the_commands_carry_tp_pp_and_the_settings_limits(tmp_path: Path):
    engine = EngineConfig(model_dir=str(tmp_path / "m"), max_num_seqs=32, max_num_batched_tokens=4096, block_size=32)
    plan = plan_build(engine, max_seq_len=2048, tp=2, pp=2, checkpoint_dtype="float16")
    tools = Toolchain("/usr/bin/python3", TENSORRT_LLM_VERSION, "/usr/local/bin/trtllm-build", 4)
    assert plan.engine_dir == tmp_path / "m" / "tensorrt_llm_engine"  # where the render looks
    convert = convert_command(plan, tools)
    assert convert[:2] == ["/usr/bin/python3", str(CONVERT_SCRIPT)]
    assert convert[convert.index("--tp") + 1] == "2" and convert[convert.index("--pp") + 1] == "2"
    assert convert[convert.index("--output-dir") + 1] == str(plan.checkpoint_dir)
    build = build_command(plan, tools)
    flags = dict(zip(build[1::2], build[2::2]))
    assert build[0] == "/usr/local/bin/trtllm-build"
    assert flags["--checkpoint_dir"] == str(plan.checkpoint_dir) and flags["--output_dir"] == str(plan.engine_dir)
    assert (flags["--workers"], flags["--max_batch_size"], flags["--max_num_tokens"]) == ("4", "32", "4096")
    assert (flags["--max_seq_len"], flags["--max_input_len"], flags["--tokens_per_block"]) == ("2048", "2047", "32")
    assert flags["--kv_cache_type"] == "paged" and flags["--use_paged_context_fmha"] == "enable"
    plain = plan_build(
        EngineConfig(model_dir="/m", enable_kv_cache_reuse=False, enable_chunked_context=False),
        max_seq_len=512,
        tp=1,
        pp=1,
        checkpoint_dtype="auto",
        output=tmp_path / "e",
    )
    assert "--use_paged_context_fmha" not in build_command(plain, tools) and plain.engine_dir == tmp_path / "e"


def test_the_checkpoint_is_converted_rank_by_rank_through_tensorrt_llms_api(tmp_path: Path, monkeypatch):
    calls: list[tuple] = []

    class Mapping:
        def __init__(self, world_size: int, rank: int, tp_size: int, pp_size: int) -> None:
            self.args = (world_size, rank, tp_size, pp_size)

    class LLaMAForCausalLM:
        @classmethod
        def from_hugging_face(cls, model_dir: str, dtype: str, mapping: Mapping) -> LLaMAForCausalLM:
            calls.append(("load", model_dir, dtype, mapping.args))
            return cls()

        def save_checkpoint(self, output_dir: str, save_config: bool) -> None:
            calls.append(("save", output_dir, save_config))

    monkeypatch.setitem(sys.modules, "tensorrt_llm", types.ModuleType("tensorrt_llm"))
    monkeypatch.setitem(sys.modules, "tensorrt_llm.mapping", types.SimpleNamespace(Mapping=Mapping))
    monkeypatch.setitem(
        sys.modules, "tensorrt_llm.models", types.SimpleNamespace(MODEL_MAP={"LlamaForCausalLM": LLaMAForCausalLM})
    )
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    out = str(tmp_path / "ckpt")
    assert (
        convert_checkpoint.main(
            ["--model-dir", str(model), "--output-dir", out, "--tp", "2", "--pp", "2", "--dtype", "float16"]
        )
        == 0
    )
    loads = [c for c in calls if c[0] == "load"]
    assert [c[3] for c in loads] == [(4, rank, 2, 2) for rank in range(4)]
    assert [c[2] for c in calls if c[0] == "save"] == [True, False, False, False]
    (model / "config.json").write_text(json.dumps({"architectures": ["UnknownForCausalLM"]}))
    assert convert_checkpoint.main(["--model-dir", str(model), "--output-dir", out, "--tp", "1", "--pp", "1"]) == 1


def test_the_convert_script_imports_nothing_of_this_project():
    source = CONVERT_SCRIPT.read_text()
    imports = [line.split()[1] for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert set(imports) <= {"__future__", "argparse", "json", "sys", "pathlib"}, imports
