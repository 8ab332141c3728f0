"""Checkpoints stay atomic when the same step is saved again, and they keep the live parameters' dtype."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from memagent.config import OptimConfig
from memagent.training import checkpoint as ckpt
from memagent.training.learner import Learner


def make_learner(model: torch.nn.Module) -> Learner:
    return Learner(model.train(), OptimConfig(lr=1e-3, warmup_steps=0), torch.device("cpu"), local=True)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model" / "model.safetensors"))


def test_a_crash_while_resaving_a_step_leaves_that_step_complete(tiny_model, tiny_tokenizer, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    learner, generator = make_learner(tiny_model), torch.Generator().manual_seed(0)
    first = ckpt.save_checkpoint(learner, tiny_tokenizer, tmp_path, 3, {"position": 1}, generator, keep=2)
    saved = weights(first)
    with torch.no_grad():
        next(tiny_model.parameters()).add_(1.0)  # the re-save would write other weights

    real_replace = ckpt.os.replace

    def crash_on_install(src, dst):
        if Path(src).name.startswith(".tmp-step"):
            raise OSError("simulated kill while installing the new checkpoint")
        return real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", crash_on_install)
    with pytest.raises(OSError, match="simulated kill"):
        ckpt.save_checkpoint(learner, tiny_tokenizer, tmp_path, 3, {"position": 2}, generator, keep=2)
    monkeypatch.setattr(ckpt.os, "replace", real_replace)

    found = ckpt.resolve_resume("latest", tmp_path)
    assert found is not None and found.name.endswith("step_000003")
    again = weights(found)
    assert again.keys() == saved.keys() and all(torch.equal(again[k], saved[k]) for k in saved)
    assert (found / "trainer_state.json").is_file() and (found / "optimizer.pt").is_file()


def test_a_completed_resave_replaces_the_step_and_leaves_no_side_directories(tiny_model, tiny_tokenizer,
                                                                             tmp_path: Path) -> None:
    learner, generator = make_learner(tiny_model), torch.Generator().manual_seed(0)
    ckpt.save_checkpoint(learner, tiny_tokenizer, tmp_path, 3, {"position": 1}, generator, keep=2)
    with torch.no_grad():
        next(tiny_model.parameters()).add_(1.0)
    path = ckpt.save_checkpoint(learner, tiny_tokenizer, tmp_path, 3, {"position": 2}, generator, keep=2)
    name, param = next(iter(tiny_model.named_parameters()))
    assert torch.equal(weights(path)[name], param.detach())
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000003"]


def test_checkpoint_keeps_float32_master_weights(tiny_model, tiny_tokenizer, tmp_path: Path) -> None:
    learner, generator = make_learner(tiny_model), torch.Generator().manual_seed(0)
    path = ckpt.save_checkpoint(learner, tiny_tokenizer, tmp_path, 1, {}, generator, keep=1)
    saved = weights(path)
    for name, param in tiny_model.named_parameters():
        if name in saved:
            assert saved[name].dtype == torch.float32 and torch.equal(saved[name], param.detach()), name
