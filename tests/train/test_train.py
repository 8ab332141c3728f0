"""train.py end to end on the `smoke` preset: it runs, it trains every parameter, it resumes exactly, it refuses
bad setups early with a clear message, and it is the only run writing its output directory (memagent.dirlock).

The smoke model is random, so its answers are never right; to give groups a reward spread (and the update a
gradient) these tests replace the strict verifier by a deterministic stand-in scoring the answer's length parity.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from memagent import train
from memagent.cli import run_cli
from memagent.config import load_config
from memagent.dirlock import OutputDirBusy, lock_output_dir
from memagent.rl import rewards


@pytest.fixture(autouse=True)
def parity_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(rewards.VERIFIERS, "strict", lambda response, golds: float(len(response) % 2))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("smoke_model") / "model")


def smoke(out: Path, model_dir: str, *extra: str) -> dict[str, float]:
    return train.main(["--preset", "smoke", "--output-dir", str(out), "--demo.model-dir", model_dir,
                       "--data.num-eval", "2", *extra])


def records(out: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def without_timing(record: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in record.items() if not k.startswith("perf/")}


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory: pytest.TempPathFactory, model_dir: str) -> Path:
    out = tmp_path_factory.mktemp("runs") / "full"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rewards.VERIFIERS, "strict", lambda response, golds: float(len(response) % 2))
        smoke(out, model_dir)
    return out


def test_two_step_smoke_run_changes_every_trainable_parameter(two_steps: Path, model_dir: str) -> None:
    before = load_file(str(Path(model_dir) / "model.safetensors"))
    after = load_file(str(two_steps / "checkpoints" / "step_000002" / "model" / "model.safetensors"))
    assert before.keys() == after.keys()
    unchanged = [k for k in before if torch.equal(before[k], after[k]) and "k_proj.bias" not in k]
    assert not unchanged, f"parameters not updated: {unchanged}"
    steps = [r for r in records(two_steps) if "rollout/reward" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["loss/grad_norm"] > 0 for r in steps)
    assert (two_steps / "traces" / "step_000002.txt").read_text().count("memory after chunk") > 0


def test_every_heldout_evaluation_logs_its_wall_time_per_question_under_perf(two_steps: Path) -> None:
    evals = [r for r in records(two_steps) if any(k.startswith("eval/accuracy_") for k in r)]
    assert [r["step"] for r in evals] == [0, 2]  # before and after RL
    for r in evals:
        sets = [k.removeprefix("eval/accuracy_") for k in r if k.startswith("eval/accuracy_")]
        assert sets and all(0 < r[f"perf/eval_seconds_per_question_{s}"] < float("inf") for s in sets)
        assert not any("seconds" in k for k in without_timing(r))


def test_checkpoint_loads_with_transformers_alone(two_steps: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = two_steps / "checkpoints" / "step_000002" / "model"
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert model.config.vocab_size >= len(tokenizer) - 1
    assert not list((two_steps / "checkpoints").glob(".tmp-*"))


def test_resume_after_interruption_reproduces_the_uninterrupted_metrics(
        two_steps: Path, tmp_path: Path, model_dir: str) -> None:
    out = tmp_path / "interrupted"
    smoke(out, model_dir, "--run.steps", "1")
    smoke(out, model_dir, "--run.steps", "2", "--resume")
    full = [without_timing(r) for r in records(two_steps) if r["step"] == 2]
    resumed = [without_timing(r) for r in records(out) if r["step"] == 2]
    assert full and resumed == full


def test_a_step_logged_before_a_stop_cut_its_checkpoint_is_logged_once_after_resuming(
        two_steps: Path, tmp_path: Path, model_dir: str) -> None:
    import shutil

    out = tmp_path / "cut"
    shutil.copytree(two_steps, out)
    shutil.rmtree(out / "checkpoints" / "step_000002")  # the stop came after step 2 was logged, before its save
    (out / "results.json").unlink()
    smoke(out, model_dir, "--resume")
    steps = [r["step"] for r in records(out) if "rollout/reward" in r]
    assert steps == [1, 2]
    full = [without_timing(r) for r in records(two_steps)]
    assert [without_timing(r) for r in records(out)] == full


def test_a_line_cut_off_by_a_kill_does_not_block_the_resume_and_is_dropped(
        two_steps: Path, tmp_path: Path, model_dir: str) -> None:
    import shutil

    out = tmp_path / "cut_line"
    shutil.copytree(two_steps, out)
    shutil.rmtree(out / "checkpoints" / "step_000002")
    (out / "results.json").unlink()
    kept = [line for line in (out / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] < 2]
    (out / "metrics.jsonl").write_text("\n".join(kept) + '\n{"step": 2, "rollout/rew')  # killed mid-write
    smoke(out, model_dir, "--resume")
    assert [without_timing(r) for r in records(out)] == [without_timing(r) for r in records(two_steps)]


def test_a_broken_metrics_line_before_the_last_is_named_not_dropped() -> None:
    from memagent.training.logging import records_up_to

    good = ['{"step": 1, "a": 1}\n', '{"step": 2, "a": 2}\n']
    assert records_up_to("".join(good) + '{"step": 3, "a"', 2) == good
    assert records_up_to("".join(good), 1) == good[:1] and records_up_to("".join(good), -1) == []
    with pytest.raises(ValueError, match="run/metrics.jsonl line 2: not a metrics record"):
        records_up_to(good[0] + "{oops\n" + good[1], 2, "run/metrics.jsonl")


def test_a_run_started_again_after_dying_before_its_first_checkpoint_logs_each_step_once(
        two_steps: Path, tmp_path: Path, model_dir: str) -> None:
    import shutil

    out = tmp_path / "died_early"
    shutil.copytree(two_steps, out)
    shutil.rmtree(out / "checkpoints")  # as if killed after logging its steps, before any checkpoint
    (out / "results.json").unlink()
    smoke(out, model_dir)  # no checkpoint to resume from: the same command again, without --resume
    assert [without_timing(r) for r in records(out)] == [without_timing(r) for r in records(two_steps)]


@pytest.mark.parametrize(("flags", "error", "words"), [
    (["--rollout.group-size", "1"], ValueError, "group_size=1"),
    (["--data.num-train", "0"], ValueError, "empty"),
    (["--data.num-train", "1"], ValueError, "fewer than rollout.batch_size"),
    (["--loss.no-such-key", "1"], SystemExit, None),
])
def test_bad_setups_fail_early_with_a_clear_message(
        tmp_path: Path, model_dir: str, flags: list[str], error: type, words: str | None) -> None:
    with pytest.raises(error, match=words):
        smoke(tmp_path / "out", model_dir, *flags)
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_unwritable_output_dir_fails_before_any_work(tmp_path: Path, model_dir: str) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(PermissionError, match="not writable"):
        smoke(blocker / "out", model_dir)


def test_config_file_overrides_and_unknown_keys_are_named(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("preset: smoke\nloss:\n  clip_high: 0.3\nrollout:\n  group_size: 3\n")
    cfg = load_config(["--config", str(good), "--loss.clip-low", "0.1"])
    assert (cfg.loss.clip_high, cfg.loss.clip_low, cfg.rollout.group_size, cfg.run.steps) == (0.3, 0.1, 3, 2)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"loss": {"clip_hihg": 0.3}}))
    with pytest.raises(ValueError, match="loss.clip_hihg"):
        load_config(["--config", str(bad)])


def test_dynamic_sampling_with_refills_trains_whole_groups_of_distinct_trajectories(
        tmp_path: Path, model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The path the smoke preset leaves off: dynamic sampling on, refill rounds, several mini-batches. Every group
    handed to the advantage step holds exactly G distinct trajectories of one question."""
    seen: list[list] = []
    real = train.trajectories_to_rows

    def spy(kept, **kw):
        seen.append(list(kept))
        return real(kept, **kw)

    monkeypatch.setattr(train, "trajectories_to_rows", spy)
    # Two questions in three score 0 whatever the answer (uninformative groups), so refill rounds happen.
    monkeypatch.setitem(rewards.VERIFIERS, "strict",
                        lambda response, golds: float(len(response) % 2) if sum(map(ord, golds[0])) % 3 == 0 else 0.0)
    metrics = smoke(tmp_path / "out", model_dir, "--rollout.dynamic-sampling", "true", "--rollout.max-refill-rounds",
                    "3", "--rollout.batch-size", "4", "--optim.mini-batches", "2", "--run.steps", "4")
    assert metrics["rollout/rounds"] >= 2
    for kept in seen:
        assert len({id(t) for t in kept}) == len(kept)
        groups: dict[int, list] = {}
        for t in kept:
            groups.setdefault(t.sample_index, []).append(t)
        assert sorted(groups) == list(range(len(groups))) and len(groups) <= 4
        assert all(len(members) == 4 for members in groups.values())
    # The waste metrics add up: every rolled-out group is kept, uninformative, or informative past the quota.
    for r in (r for r in records(tmp_path / "out") if "rollout/reward" in r):
        assert r["rollout/rolled_groups"] == (r["rollout/kept_groups"] + r["rollout/uninformative_groups"]
                                              + r["rollout/surplus_groups"])
        kept_share = r["rollout/kept_groups"] / r["rollout/rolled_groups"]  # every trajectory has 2 chunks + answer
        assert r["rollout/wasted_fraction"] == pytest.approx(1 - kept_share)


def test_reusing_rollout_logprobs_trains_like_recomputing_them(two_steps: Path, tmp_path: Path, model_dir: str) -> None:
    out = tmp_path / "reuse"
    smoke(out, model_dir, "--rollout.reuse-logprobs", "on")
    full = [r for r in records(two_steps) if "rollout/reward" in r]
    reused = [r for r in records(out) if "rollout/reward" in r]
    assert [r["step"] for r in reused] == [1, 2]
    for a, b in zip(full, reused):
        assert a["rollout/reward"] == b["rollout/reward"]  # the same samples
        assert b["loss/clipfrac"] == 0.0 and abs(b["loss/approx_kl"]) < 1e-5  # ratio 1 up to float32 rounding
        assert b["loss/loss"] == pytest.approx(a["loss/loss"], rel=1e-4, abs=1e-6)


def test_a_collective_lost_to_a_dead_rank_ends_in_one_line_naming_it_and_how_to_resume(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from memagent.cli import run_cli

    def gloo_timeout(argv: list[str]) -> dict[str, float]:  # gloo's own words (a plain RuntimeError) after 3 s
        raise RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
                           "3000ms for recv operation to complete")

    monkeypatch.setattr(train, "main", gloo_timeout)
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as stop:
        run_cli(train.main_or_lost_rank, ["--preset", "smoke", "--output-dir", "runs/x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1
    assert "rank 1" in err[0] and "another rank died" in err[0] and "Timed out waiting 3000ms" in err[0]
    assert "--resume latest" in err[0]

    def our_bug(argv: list[str]) -> dict[str, float]:
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(train, "main", our_bug)
    with pytest.raises(RuntimeError, match="shape mismatch"):  # any other error keeps its traceback
        train.main_or_lost_rank([])


def test_a_task_mix_trains_with_the_task_verifier_and_logs_accuracy_per_task(tmp_path: Path, model_dir: str) -> None:
    """data.tasks replaces the demo's code_lookup questions, and every task the step drew gets
    rollout/accuracy/{task}."""
    out = tmp_path / "mix"
    smoke(out, model_dir, "--data.tasks", "kv_retrieval:3,kv_last_write", "--rollout.verifier", "task", "--data.num-eval", "4",
          "--run.steps", "1", "--rollout.batch-size", "4", "--data.eval-chunk-factors", "1")
    step = next(r for r in records(out) if r.get("step") == 1 and "rollout/accuracy" in r)
    per_task = {k.removeprefix("rollout/accuracy/"): v for k, v in step.items() if k.startswith("rollout/accuracy/")}
    assert per_task and set(per_task) <= {"kv_retrieval", "kv_last_write"}
    assert all(0.0 <= v <= 1.0 for v in per_task.values())
    traces = (out / "traces" / "step_000001.txt").read_text()
    assert "value of key" in traces  # kv questions, not the demo's code_lookup ones


def test_a_bad_task_mix_entry_fails_before_any_work_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'kv_retrieval:x'.*number"):
        train.main(["--preset", "smoke", "--output-dir", str(tmp_path / "bad"), "--data.tasks", "kv_retrieval:x"])
    assert not (tmp_path / "bad").exists()


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """An output directory whose lock another live process holds (SIGKILLed afterwards: the kernel frees it)."""
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; from pathlib import Path; from memagent.dirlock import lock_output_dir; "
         f"lock = lock_output_dir(Path({str(out)!r})); print('locked', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield out, holder
    finally:
        holder.kill()
        holder.wait()


def test_a_second_run_on_a_directory_in_use_stops_naming_the_holder_and_writes_nothing(
        held: tuple[Path, subprocess.Popen[str]], model_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    out, holder = held
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(SystemExit) as stop:
        run_cli(train.main_or_lost_rank, ["--preset", "smoke", "--output-dir", str(out), "--demo.model-dir", model_dir,
                                          "--run.steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1
    assert f"pid {holder.pid}" in err[0] and str(out) in err[0]
    assert sorted(p.name for p in out.iterdir()) == before  # no config.json, metrics.jsonl or checkpoints
    holder.kill()
    holder.wait()
    smoke(out, model_dir, "--run.steps", "1")  # the holder is gone, and so is its lock
    assert any(r.get("step") == 1 for r in records(out))


def test_the_lock_is_held_while_the_run_works_and_released_when_it_ends_or_fails(
        tmp_path: Path, model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    seen: list[str] = []

    def probing_verifier(response: str, golds: list[str]) -> float:  # runs mid-step, inside train.main
        try:
            lock_output_dir(out).close()
            seen.append("free")
        except OutputDirBusy:
            seen.append("busy")
        return float(len(response) % 2)

    monkeypatch.setitem(rewards.VERIFIERS, "strict", probing_verifier)
    smoke(out, model_dir, "--run.steps", "1")
    assert seen and set(seen) == {"busy"}
    lock_output_dir(out).close()  # released after a finished run

    def interrupted(response: str, golds: list[str]) -> float:
        raise KeyboardInterrupt

    monkeypatch.setitem(rewards.VERIFIERS, "strict", interrupted)
    with pytest.raises(KeyboardInterrupt):
        smoke(out, model_dir, "--run.steps", "2", "--resume", "latest")
    lock_output_dir(out).close()  # released after a stopped one, so the same process can resume at once


def test_each_rank_holds_its_own_lock_file(tmp_path: Path) -> None:
    rank0, rank1 = lock_output_dir(tmp_path), lock_output_dir(tmp_path, rank=1)
    try:
        for rank in (0, 1):
            with pytest.raises(OutputDirBusy):
                lock_output_dir(tmp_path, rank=rank)
        assert (tmp_path / ".lock").read_text() == (tmp_path / ".lock-rank1").read_text()  # this pid, twice
    finally:
        rank0.close()
        rank1.close()
    lock_output_dir(tmp_path, rank=1).close()
