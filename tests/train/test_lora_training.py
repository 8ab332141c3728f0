"""train.py with LoRA (`--model.lora-rank 4`) end to end on the `smoke` preset: only the adapters train, the
checkpoint's model/ is the merged model as a plain HF checkpoint, resume is exact, the KL reference is the frozen
base, and bad lora settings fail early naming the field.

As in test_train.py, a deterministic stand-in for the strict verifier (the answer's length parity) gives the random
smoke model's groups a reward spread, so the updates have a gradient.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from memagent import train
from memagent.config import load_config, make_config
from memagent.model.lora import adapter_state_dict, lora_modules
from memagent.rl import rewards
from memagent.training.setup import TrainingSetup

LORA = ("--model.lora-rank", "4")
IDS = torch.tensor([[5, 17, 99, 3, 250, 41, 7, 12], [8, 8, 300, 2, 19, 64, 111, 6]])


def parity(response: str, golds: list[str]) -> float:
    return float(len(response) % 2)


@pytest.fixture(autouse=True)
def parity_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(rewards.VERIFIERS, "strict", parity)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("smoke_model") / "model")


def smoke(out: Path, model_dir: str, *extra: str) -> dict[str, float]:
    return train.main(["--preset", "smoke", "--output-dir", str(out), "--demo.model-dir", model_dir,
                       "--data.num-eval", "2", *extra])


def smoke_keeping_setup(out: Path, model_dir: str, *extra: str) -> TrainingSetup:
    """Run train.main and return its TrainingSetup, whose learner holds the live model after training."""
    captured: list[TrainingSetup] = []
    real = train.set_up_training

    def spy(*args, **kwargs):
        captured.append(real(*args, **kwargs))
        return captured[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train, "set_up_training", spy)
        mp.setitem(rewards.VERIFIERS, "strict", parity)
        smoke(out, model_dir, *extra)
    return captured[-1]


def records(out: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def without_timing(record: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in record.items() if not k.startswith("perf/")}


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits.double()


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory, model_dir: str) -> tuple[Path, TrainingSetup]:
    out = tmp_path_factory.mktemp("runs") / "lora"
    return out, smoke_keeping_setup(out, model_dir, *LORA)


def test_lora_run_trains_every_adapter_and_nothing_else(lora_run: tuple[Path, TrainingSetup], model_dir: str) -> None:
    _, setup = lora_run
    model, base = setup.learner.unwrapped, load_file(str(Path(model_dir) / "model.safetensors"))
    adapters = {n: p for n, p in model.named_parameters() if n.endswith(("lora_a", "lora_b"))}
    assert len(lora_modules(model)) == 2 * 7 and len(adapters) == 2 * len(lora_modules(model))
    optimized = {id(p) for group in setup.learner.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in adapters.values()}
    for name, param in model.named_parameters():
        if name not in adapters:
            assert torch.equal(param.detach(), base[name.replace(".base.", ".")]), f"frozen {name} changed"
    assert all(float(p.detach().abs().sum()) > 0 for n, p in adapters.items() if n.endswith("lora_b")), "B starts at 0"


def test_checkpoint_model_dir_is_the_merged_model_and_loads_with_transformers_alone(
        lora_run: tuple[Path, TrainingSetup], model_dir: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, setup = lora_run
    path = out / "checkpoints" / "step_000002" / "model"
    saved, base = load_file(str(path / "model.safetensors")), load_file(str(Path(model_dir) / "model.safetensors"))
    assert saved.keys() == base.keys()
    changed = {k for k in base if not torch.equal(saved[k], base[k])}
    assert changed and all(k.endswith("_proj.weight") for k in changed), "only adapted projections differ"
    merged = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert not lora_modules(merged)
    torch.testing.assert_close(logits(merged), logits(setup.learner.unwrapped), rtol=1e-5, atol=1e-5)
    assert not list((out / "checkpoints").glob(".tmp-*"))


def test_lora_resume_after_interruption_reproduces_the_uninterrupted_run(
        lora_run: tuple[Path, TrainingSetup], tmp_path: Path, model_dir: str) -> None:
    full = lora_run[0]
    out = tmp_path / "interrupted"
    smoke(out, model_dir, *LORA, "--run.steps", "1")
    smoke(out, model_dir, *LORA, "--run.steps", "2", "--resume")
    expected = [without_timing(r) for r in records(full) if r["step"] == 2]
    assert expected and [without_timing(r) for r in records(out) if r["step"] == 2] == expected
    a = load_file(str(full / "checkpoints" / "step_000002" / "adapter.safetensors"))
    b = load_file(str(out / "checkpoints" / "step_000002" / "adapter.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_lora_checkpoint_is_not_resumed_as_full_fine_tuning(tmp_path: Path, model_dir: str) -> None:
    out = tmp_path / "out"
    smoke(out, model_dir, *LORA, "--run.steps", "1")
    with pytest.raises(ValueError, match=r"other settings \(model.lora_rank: 4 -> 0\)"):
        smoke(out, model_dir, "--run.steps", "2", "--resume")
    # even when told to take the new settings, the checkpoint's kind decides: its optimizer state holds adapters only
    with pytest.raises(ValueError, match="a LoRA checkpoint"), pytest.warns(UserWarning, match="model.lora_rank"):
        smoke(out, model_dir, "--run.steps", "2", "--resume", "--run.allow-config-change", "true")


def test_lora_kl_reference_is_the_frozen_base_not_the_moving_policy(tmp_path: Path, model_dir: str) -> None:
    """Step 1 updates from B = 0, where the policy is the base (KL exactly 0); by step 2 it has moved away."""
    smoke(tmp_path / "out", model_dir, *LORA, "--loss.kl-coef", "0.1")
    kl = [r["loss/kl"] for r in records(tmp_path / "out") if "loss/kl" in r]
    assert len(kl) == 2 and kl[0] == 0.0 and kl[1] > 0.0


@pytest.mark.parametrize(("model", "run", "words"), [
    ({"lora_rank": -1}, {}, "model.lora_rank=-1"),
    ({"lora_rank": 4, "lora_alpha": 0.0}, {}, "model.lora_alpha=0.0"),
    ({"lora_rank": 4, "lora_targets": ()}, {}, "model.lora_targets"),
    ({"lora_rank": 4, "lora_targets": ("q_proj", "q_proj")}, {}, "model.lora_targets"),
    ({"lora_rank": 4, "lora_targets": ("q_proj", "lm_head")}, {}, "model.lora_targets: lm_head"),
    ({"lora_rank": 4}, {"deepspeed": "configs/ds_zero2.json"}, "model.lora_rank=4 with run.deepspeed"),
    ({"lora_rank": 4, "lora_merged_dtype": "float64"}, {}, "model.lora_merged_dtype='float64'"),
    ({"lora_init": "a.safetensors"}, {}, r"model.lora_init='a.safetensors' needs model.lora_rank > 0"),
])
def test_bad_lora_settings_are_refused_naming_the_field(model: dict, run: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        make_config({"model": model, "run": run})


def test_lora_flags_parse_into_the_model_section() -> None:
    cfg = load_config(["--preset", "smoke", "--model.lora-rank", "8", "--model.lora-alpha", "32",
                       "--model.lora-targets", "q_proj,v_proj"])
    assert (cfg.model.lora_rank, cfg.model.lora_alpha, cfg.model.lora_targets) == (8, 32.0, ("q_proj", "v_proj"))
    assert load_config(["--preset", "smoke"]).model.lora_rank == 0


def test_a_lora_target_the_model_lacks_fails_before_training(tmp_path: Path, model_dir: str) -> None:
    with pytest.raises(ValueError, match=r"model.lora_targets=.*\['qproj'\] match no nn.Linear"):
        smoke(tmp_path / "out", model_dir, *LORA, "--model.lora-targets", "q_proj,qproj")
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_lora_trains_float32_adapters_over_a_bfloat16_base(tmp_path: Path, model_dir: str) -> None:
    """The frozen base may be stored in bf16 without DeepSpeed (nothing updates it); the adapters stay float32, and
    so does the merged model/ (bf16 would round away most of a small update)."""
    setup = smoke_keeping_setup(tmp_path / "out", model_dir, *LORA, "--model.dtype", "bfloat16", "--run.steps", "1")
    params = dict(setup.learner.unwrapped.named_parameters())
    assert {p.dtype for n, p in params.items() if "lora_" in n} == {torch.float32}
    assert {p.dtype for n, p in params.items() if "lora_" not in n} == {torch.bfloat16}
    assert all(float(p.detach().abs().sum()) > 0 for n, p in params.items() if n.endswith("lora_b"))
    step = tmp_path / "out" / "checkpoints" / "step_000001"
    assert {t.dtype for t in load_file(str(step / "model" / "model.safetensors")).values()} == {torch.float32}
    assert {t.dtype for t in load_file(str(step / "adapter.safetensors")).values()} == {torch.float32}


def test_a_bf16_merged_model_dir_is_saved_on_request_with_a_warning(tmp_path: Path, model_dir: str) -> None:
    with pytest.warns(UserWarning, match="merged weights saved in bfloat16 lose .*% of the LoRA update"):
        smoke(tmp_path / "out", model_dir, *LORA, "--model.dtype", "bfloat16", "--model.lora-merged-dtype", "bfloat16",
              "--run.steps", "1")
    saved = load_file(str(tmp_path / "out" / "checkpoints" / "step_000001" / "model" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}


def test_a_resumed_lora_run_keeps_the_warm_started_base(tmp_path: Path, model_dir: str) -> None:
    """Checkpoints hold only the adapters, so the base of a resumed run must be the warm-started model, not the
    model it was warm-started from."""
    warm = ("--demo.steps", "1", "--demo.pretrain-steps", "1")
    out = tmp_path / "out"
    smoke(out, model_dir, *LORA, *warm, "--run.steps", "1")
    setup = smoke_keeping_setup(out, model_dir, *LORA, *warm, "--run.steps", "2", "--resume")
    warmed, built = load_file(str(out / "warm_start" / "model.safetensors")), load_file(f"{model_dir}/model.safetensors")
    assert any(not torch.equal(warmed[k], built[k]) for k in warmed), "the warm start must change the model"
    for name, param in setup.learner.unwrapped.named_parameters():
        if "lora_" not in name:
            assert torch.equal(param.detach(), warmed[name.replace(".base.", ".")]), name


def test_lora_init_starts_the_adapters_from_the_file_and_rl_goes_on_from_there(
        lora_run: tuple[Path, TrainingSetup], tmp_path: Path, model_dir: str) -> None:
    start = lora_run[0] / "checkpoints" / "step_000002" / "adapter.safetensors"
    at_setup: dict[str, torch.Tensor] = {}
    real = train.set_up_training

    def spy(*args, **kwargs):
        setup = real(*args, **kwargs)
        at_setup.update(adapter_state_dict(setup.learner.unwrapped))
        return setup

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train, "set_up_training", spy)
        smoke(tmp_path / "out", model_dir, *LORA, "--model.lora-init", str(start), "--run.steps", "1")
    file = load_file(str(start))
    assert at_setup.keys() == file.keys() and all(torch.equal(at_setup[k], file[k]) for k in file)
    after = load_file(str(tmp_path / "out" / "checkpoints" / "step_000001" / "adapter.safetensors"))
    assert any(not torch.equal(after[k], file[k]) for k in file), "RL trains on from the file's adapters"


def test_lora_init_of_another_rank_or_with_a_kl_term_is_refused_naming_the_field(
        lora_run: tuple[Path, TrainingSetup], tmp_path: Path, model_dir: str) -> None:
    start = str(lora_run[0] / "checkpoints" / "step_000002" / "adapter.safetensors")
    with pytest.raises(ValueError, match=r"model.lora_init=.* does not fit this run's adapters: .*rank 4"):
        smoke(tmp_path / "a", model_dir, "--model.lora-rank", "8", "--model.lora-init", start)
    with pytest.raises(ValueError, match="model.lora_init=.*no such file"):
        smoke(tmp_path / "b", model_dir, *LORA, "--model.lora-init", str(tmp_path / "absent.safetensors"))
    with pytest.raises(ValueError, match="model.lora_init with loss.kl_coef=0.1"):
        smoke(tmp_path / "c", model_dir, *LORA, "--model.lora-init", start, "--loss.kl-coef", "0.1")
