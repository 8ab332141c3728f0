"""--resume under other settings than the checkpoint's is refused naming each changed field (a run mixed from two
recipes is not one experiment), allowed with --run.allow-config-change (with a warning), and free for the settings
that leave the optimisation unchanged (steps, output cadence, memory knobs)."""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict
from pathlib import Path

import pytest

from memagent.config import TrainConfig, load_config
from memagent.rl import rewards
from memagent.training.checkpoint import RESUMABLE_CHANGES, config_changes
from tests.train.test_lora_training import parity
from tests.train.test_train import records, smoke


@pytest.fixture(autouse=True)
def length_parity_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(rewards.VERIFIERS, "strict", parity)  # a reward spread for the random smoke model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("resume_model") / "model")


def as_json(cfg: TrainConfig) -> dict:
    return json.loads(json.dumps(asdict(cfg)))


def test_config_changes_lists_changed_fields_only_outside_the_resumable_ones() -> None:
    defaults = as_json(TrainConfig())
    saved = as_json(load_config(["--preset", "smoke"]))
    now = asdict(load_config(["--preset", "smoke", "--loss.clip-high", "0.3", "--run.steps", "9",
                              "--optim.micro-batch-tokens", "512", "--model.compile", "true"]))
    assert config_changes(saved, now, defaults) == ["loss.clip_high: 0.28 -> 0.3"]
    assert {"run.steps", "optim.micro_batch_tokens", "model.compile"} <= RESUMABLE_CHANGES
    # tuples saved as JSON lists are the same setting
    assert config_changes(saved, asdict(load_config(["--preset", "smoke"])), defaults) == []


def test_a_field_the_saved_run_did_not_have_yet_counts_as_its_default() -> None:
    defaults = as_json(TrainConfig())
    saved = as_json(load_config(["--preset", "smoke"]))
    del saved["rollout"]["read_cost"]  # a checkpoint from before the field existed
    now = load_config(["--preset", "smoke"])
    assert config_changes(saved, asdict(now), defaults) == []
    gated = asdict(load_config(["--preset", "smoke", "--workflow.gates", "both", "--rollout.read-cost", "0.1"]))
    assert config_changes(saved, gated, defaults) == ["rollout.read_cost: 0.0 -> 0.1", "workflow.gates: 'none' -> 'both'"]


def test_resuming_under_a_changed_setting_is_refused_naming_it_and_writes_nothing(tmp_path: Path,
                                                                                  model_dir: str) -> None:
    out = tmp_path / "run"
    smoke(out, model_dir, "--run.steps", "1")
    before = (out / "metrics.jsonl").read_text(), (out / "config.json").read_text()
    with pytest.raises(ValueError, match=r"loss.clip_high: 0.28 -> 0.3\).*--run.allow-config-change true"):
        smoke(out, model_dir, "--run.steps", "2", "--loss.clip-high", "0.3", "--resume", "latest")
    assert ((out / "metrics.jsonl").read_text(), (out / "config.json").read_text()) == before


def test_allow_config_change_resumes_with_a_warning_naming_the_change(tmp_path: Path, model_dir: str) -> None:
    out = tmp_path / "run"
    smoke(out, model_dir, "--run.steps", "1")
    with pytest.warns(UserWarning, match=r"continuing under changed settings: loss.clip_high: 0.28 -> 0.3"):
        smoke(out, model_dir, "--run.steps", "2", "--loss.clip-high", "0.3", "--resume", "latest",
              "--run.allow-config-change", "true")
    assert [r["step"] for r in records(out) if "rollout/reward" in r] == [1, 2]
    assert json.loads((out / "config.json").read_text())["loss"]["clip_high"] == 0.3


def test_a_checkpoint_from_before_the_config_was_recorded_as_a_dict_is_checked_against_config_json(
        tmp_path: Path, model_dir: str) -> None:
    out = tmp_path / "run"
    smoke(out, model_dir, "--run.steps", "1")
    state_file = out / "checkpoints" / "step_000001" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert isinstance(state["config"], dict)
    state["config"] = "TrainConfig(...)"  # the repr older checkpoints held
    state_file.write_text(json.dumps(state))
    with pytest.raises(ValueError, match=r"optim.lr: 0.001 -> 0.002"):
        smoke(out, model_dir, "--run.steps", "2", "--optim.lr", "0.002", "--resume", "latest")


def test_resuming_on_a_machine_where_autocast_auto_resolves_otherwise_warns_naming_both_arithmetics(
        tmp_path: Path, model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # `model.autocast auto` is bf16 on a CPU with native bf16 and off elsewhere: the same command resumed on the
    # other machine class trains the rest of the run in other arithmetic. The two machine classes are simulated.
    from memagent.model import precision

    out = tmp_path / "run"
    monkeypatch.setattr(precision, "device_supports_bf16", lambda device: True)
    smoke(out, model_dir, "--run.steps", "1", "--model.autocast", "auto")
    state = json.loads((out / "checkpoints" / "step_000001" / "trainer_state.json").read_text())
    assert state["arithmetic"] == "float32 weights, bfloat16 autocast"
    monkeypatch.setattr(precision, "device_supports_bf16", lambda device: False)
    with pytest.warns(UserWarning, match=r"trained in float32 weights, bfloat16 autocast.*resumes in float32"):
        smoke(out, model_dir, "--run.steps", "2", "--model.autocast", "auto", "--resume", "latest")
    assert [r["step"] for r in records(out) if "rollout/reward" in r] == [1, 2]
    assert json.loads((out / "checkpoints" / "step_000002" / "trainer_state.json").read_text())["arithmetic"] == (
        "float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        smoke(out, model_dir, "--run.steps", "3", "--model.autocast", "auto", "--resume", "latest")
    assert not [w for w in caught if "resumes in" in str(w.message)]  # the same arithmetic again: nothing to say
