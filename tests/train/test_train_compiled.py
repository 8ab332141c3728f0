"""train.py with `--model.compile true` (memagent.model.compiled): the smoke preset trains with every MLP and RMSNorm
compiled, its checkpoint is a plain HF model with the eager run's tensor names, it resumes, and DeepSpeed is refused.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from memagent.config import make_config
from memagent.model.compiled import elementwise_modules
from tests.train.test_lora_training import records, smoke, smoke_keeping_setup

COMPILE = ("--model.compile", "true")
needs_compiler = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                    reason="torch.compile's CPU backend needs a C++ compiler on PATH")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("smoke_model") / "model")


@needs_compiler
def test_a_compiled_run_trains_saves_eager_named_tensors_and_resumes(tmp_path: Path, model_dir: str) -> None:
    setup = smoke_keeping_setup(tmp_path / "compiled", model_dir, *COMPILE, "--run.steps", "1")
    modules = elementwise_modules(setup.learner.unwrapped)
    assert modules and all(m._compiled_call_impl is not None for m in modules)
    smoke(tmp_path / "eager", model_dir, "--run.steps", "1")
    names = {d: set(load_file(str(tmp_path / d / "checkpoints" / "step_000001" / "model" / "model.safetensors")))
             for d in ("compiled", "eager")}
    assert names["compiled"] == names["eager"]
    smoke(tmp_path / "compiled", model_dir, *COMPILE, "--resume", "latest")
    steps = [r for r in records(tmp_path / "compiled") if "rollout/reward" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["loss/grad_norm"] > 0 for r in steps)


def test_compile_with_deepspeed_is_refused_naming_both_fields() -> None:
    with pytest.raises(ValueError, match="model.compile with run.deepspeed"):
        make_config({"model": {"compile": True}, "run": {"deepspeed": "configs/ds_zero2.json"}})
