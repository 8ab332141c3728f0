"""evaluate.py `--adapter FILE`: a LoRA policy kept as its adapter file alone is scored as the base model with the
file folded in, which is the merged model/ its run saved, bit for bit; the fingerprint covers the adapter; a file
that does not fit the base is refused naming both.

The adapters here are the tiny model's, with random B (a trained run's B is non-zero; B = 0 would make every
comparison with the base trivially equal), saved by the checkpoint code a LoRA run uses (`save_model`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import load_file

from memagent.evaluation.model_choice import adapted_model
from memagent.model import load_model, load_tokenizer
from memagent.model.loading import weights_fingerprint
from memagent.model.lora import adapter_file_settings, apply_lora, lora_modules, save_adapters
from memagent.model.tiny import build_tiny_model
from memagent.training.checkpoint import ADAPTER_FILE, save_model
from tests.eval.evaluate_cli import evaluate_argv, read_traces


@pytest.fixture(scope="module")
def lora_checkpoint(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint dir of the tiny model under rank-4 adapters on q_proj and down_proj: adapter file + merged model/."""
    model = load_model(tiny_model_dir, dtype=torch.float32, device="cpu")
    apply_lora(model, rank=4, alpha=8.0, target_modules=("q_proj", "down_proj"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in lora_modules(model).values():
            module.lora_b.copy_(torch.randn(module.lora_b.shape, generator=generator))
    directory = tmp_path_factory.mktemp("lora-checkpoint")
    save_model(model, load_tokenizer(tiny_model_dir), directory)
    return directory


def test_base_plus_the_adapter_file_is_the_runs_merged_model_bit_for_bit(
        tiny_model_dir: Path, lora_checkpoint: Path) -> None:
    saved = load_file(str(lora_checkpoint / "model" / "model.safetensors"))
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    state = adapted_model(tiny_model_dir, lora_checkpoint / ADAPTER_FILE, dtype="float32", device="cpu").state_dict()
    assert any(not torch.equal(saved[k], base[k]) for k in saved), "the adapters change some weights"
    for key, value in saved.items():
        assert torch.equal(state[key], value), key


def test_the_adapter_files_settings_are_read_from_the_file(lora_checkpoint: Path) -> None:
    assert adapter_file_settings(lora_checkpoint / ADAPTER_FILE) == (4, 8.0, ("down_proj", "q_proj"))


def test_an_adapted_model_is_cast_to_the_asked_dtype_after_the_merge(
        tiny_model_dir: Path, lora_checkpoint: Path) -> None:
    exact = adapted_model(tiny_model_dir, lora_checkpoint / ADAPTER_FILE, dtype="float32", device="cpu")
    bf16 = adapted_model(tiny_model_dir, lora_checkpoint / ADAPTER_FILE, dtype="bfloat16", device="cpu")
    for (name, a), (_, b) in zip(exact.state_dict().items(), bf16.state_dict().items(), strict=True):
        assert b.dtype == torch.bfloat16 and torch.equal(a.to(torch.bfloat16), b), name


def test_evaluating_base_plus_adapter_answers_as_the_merged_checkpoint(
        evaluate: ModuleType, tiny_model_dir: Path, lora_checkpoint: Path, tmp_path: Path) -> None:
    # Sampled at temperature 1 with one seed: the random tiny model's greedy outputs are empty whatever its weights,
    # its samples differ wherever its distribution does.
    def argv(model: Path, run: str, *extra: str) -> list[str]:
        flags = [f for f in evaluate_argv(model, tmp_path / run, *extra) if f != "--greedy"]
        return [*flags, "--temperature", "1.0", "--top-p", "1.0", "--seed", "3"]

    adapter = lora_checkpoint / ADAPTER_FILE
    assert evaluate.main(argv(tiny_model_dir, "adapter", "--adapter", str(adapter))) == 0
    assert evaluate.main(argv(lora_checkpoint / "model", "merged")) == 0
    assert evaluate.main(argv(tiny_model_dir, "base")) == 0
    outputs = {run: [(t["answer"], t["memories"]) for t in read_traces(tmp_path / run)]
               for run in ("adapter", "merged", "base")}
    assert outputs["adapter"] == outputs["merged"] != outputs["base"]
    config = json.loads((tmp_path / "adapter" / "run_config.json").read_text())
    assert config["weights"] == weights_fingerprint(tiny_model_dir, adapter) != weights_fingerprint(tiny_model_dir)
    assert str(adapter) in config["model"]


def test_the_fingerprint_of_an_adapter_does_not_depend_on_where_its_file_lies(
        tiny_model_dir: Path, lora_checkpoint: Path, tmp_path: Path) -> None:
    copy = shutil.copy(lora_checkpoint / ADAPTER_FILE, tmp_path / "seed0.safetensors")
    assert weights_fingerprint(tiny_model_dir, copy) == weights_fingerprint(tiny_model_dir, lora_checkpoint / ADAPTER_FILE)


def test_resuming_a_cell_with_another_adapter_is_refused(
        evaluate: ModuleType, tiny_model_dir: Path, lora_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "cell"
    argv = evaluate_argv(tiny_model_dir, out, "--num-samples", "1")
    assert evaluate.main(argv) == 0
    with pytest.raises(SystemExit, match="weights"):
        evaluate.main([*argv, "--adapter", str(lora_checkpoint / ADAPTER_FILE)])


def test_an_adapter_of_another_base_is_refused_naming_both(lora_checkpoint: Path, tmp_path: Path) -> None:
    wider = build_tiny_model(tmp_path / "wider", hidden_size=96)
    with pytest.raises(SystemExit, match=rf"--adapter .*{ADAPTER_FILE} does not fit --model .*wider"):
        adapted_model(wider, lora_checkpoint / ADAPTER_FILE, dtype="float32", device="cpu")


def test_a_file_that_is_not_an_adapter_file_is_refused_naming_it(tiny_model_dir: Path) -> None:
    weights = tiny_model_dir / "model.safetensors"
    with pytest.raises(SystemExit, match="model.safetensors.*not an adapter file"):
        adapted_model(tiny_model_dir, weights, dtype="float32", device="cpu")
    with pytest.raises(SystemExit, match="no such file"):
        adapted_model(tiny_model_dir, tiny_model_dir / "absent.safetensors", dtype="float32", device="cpu")


def test_an_adapter_saved_with_an_integer_alpha_folds_in(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = load_model(tiny_model_dir, dtype=torch.float32, device="cpu")
    apply_lora(model, rank=2, alpha=4, target_modules=("v_proj",))  # alpha an int, as a caller may pass it
    save_adapters(model, tmp_path / "adapter.safetensors")
    assert adapter_file_settings(tmp_path / "adapter.safetensors") == (2, 4.0, ("v_proj",))
    adapted_model(tiny_model_dir, tmp_path / "adapter.safetensors", dtype="float32", device="cpu")
