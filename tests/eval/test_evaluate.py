"""evaluate.py end to end on the tiny model: outputs, resuming after interruptions, failures in the denominator."""

from __future__ import annotations

import dataclasses
import json
import re
import socket

import pytest

from .evaluate_cli import evaluate_argv, read_traces


def _count_samples_run(evaluate, monkeypatch) -> list[int]:
    """Patch the two method runners to record how many samples each call computes."""
    seen: list[int] = []
    for name in ("run_memagent_set", "run_baseline_batch"):
        original = getattr(evaluate, name)

        def counting(es, batch, *args, _original=original, **kwargs):
            seen.append(len(batch))
            return _original(es, batch, *args, **kwargs)

        monkeypatch.setattr(evaluate, name, counting)
    return seen


def test_evaluate_writes_table_results_and_per_chunkread_traces(evaluate, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert evaluate.main(evaluate_argv(tiny_model_dir, out, "--baseline", "both", "--window", "512")) == 0
    printed = capsys.readouterr().out
    assert "| method" in printed and "kv_retrieval" in printed
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {(r["method"], r["n"], r["length"]) for r in rows} == {("memagent", 3, 200), ("full-context", 3, 200)}
    traces = read_traces(out)
    assert len(traces) == 6
    for t in traces:
        assert {"question", "answer", "golds", "score"} <= set(t)
        if t["method"] == "memagent":
            assert len(t["memories"]) == t["num_chunks"] >= 2  # one memory per chunk, no chunk cap
        else:
            assert t["kept_tokens"] <= t["doc_tokens"]


def test_progress_advances_per_memory_round_within_a_batch(evaluate, tiny_model_dir, tmp_path, capsys):
    assert evaluate.main(evaluate_argv(tiny_model_dir, tmp_path / "run", "--batch-size", "3")) == 0
    totals = re.findall(r"rollout conversations: .*?\d+/(\d+)", capsys.readouterr().err)
    # one batch of 3 samples of 2+ chunks each: the inner bar counts memory updates and answers (it advances each
    # round), so its total exceeds the batch's 3 samples, which is all the outer bar can count. (How many
    # intermediate states tqdm draws depends on its refresh interval, so only the total is checked.)
    assert totals and int(totals[0]) >= 3 * 3


def test_samples_in_flight_do_not_change_greedy_traces(evaluate, tiny_model_dir, tmp_path):
    """One question at a time and all three at once score and write the same samples (only the timing differs)."""
    runs = {}
    for in_flight in ("1", "3"):
        out = tmp_path / f"in-flight-{in_flight}"
        assert evaluate.main(evaluate_argv(tiny_model_dir, out, "--batch-size", in_flight)) == 0
        runs[in_flight] = sorted((t["index"], t["answer"], t["memories"], t["score"], t["generated_tokens"])
                                 for t in read_traces(out))
    assert len(runs["1"]) == 3 and runs["1"] == runs["3"]


def test_a_stop_keeps_every_sample_finished_before_it(evaluate, tiny_model_dir, tiny_tokenizer, tmp_path,
                                                     monkeypatch):
    """Samples are written as they finish, not when their batch does. A long question (index 0) and three short
    ones, two in flight, the backend stopped on its sixth call: short question 1 finished in round 4 and is on disk
    (in batches of two it would have waited for question 0), and a rerun computes only the other three."""
    from memagent.data import make_task, write_samples

    long, *_ = make_task("kv_retrieval", tiny_tokenizer, 300, 1, 0)
    short = make_task("kv_retrieval", tiny_tokenizer, 100, 3, 1)
    samples = [dataclasses.replace(s, index=i) for i, s in enumerate([long, *short])]
    path = write_samples(tmp_path / "mixed.json", samples)
    out = tmp_path / "run"
    argv = evaluate_argv(tiny_model_dir, out, "--chunk-tokens", "48")
    argv[argv.index("--task"):argv.index("--task") + 6] = ["--data", str(path)]
    build = evaluate.build_evaluated_model
    calls = 0

    def failing_on_sixth_call(args):
        evaluated = build(args)
        complete = evaluated.llm.complete

        def counted(requests):
            nonlocal calls
            calls += 1
            if calls == 6:
                raise KeyboardInterrupt
            return complete(requests)

        evaluated.llm.complete = counted
        return evaluated

    monkeypatch.setattr(evaluate, "build_evaluated_model", failing_on_sixth_call)
    with pytest.raises(KeyboardInterrupt):
        evaluate.main(argv)
    kept = read_traces(out)
    # 300 tokens are more than 5 chunks of 48; 100 tokens are 3 (4 rounds with the answer).
    assert [(t["index"], t["num_chunks"]) for t in kept] == [(1, 3)]
    monkeypatch.setattr(evaluate, "build_evaluated_model", build)
    seen = _count_samples_run(evaluate, monkeypatch)
    assert evaluate.main(argv) == 0
    assert seen == [3]
    assert sorted(t["index"] for t in read_traces(out)) == [0, 1, 2, 3]


def test_rerun_after_limit_computes_only_the_missing_samples(evaluate, tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    seen = _count_samples_run(evaluate, monkeypatch)
    evaluate.main(evaluate_argv(tiny_model_dir, out, "--limit", "2"))
    first = (out / "traces.jsonl").read_text()
    evaluate.main(evaluate_argv(tiny_model_dir, out))
    assert seen == [2, 1]  # the second run computed only sample 2
    assert (out / "traces.jsonl").read_text().startswith(first)  # earlier lines untouched
    keys = [(t["index"], t["method"]) for t in read_traces(out)]
    assert sorted(keys) == [(0, "memagent"), (1, "memagent"), (2, "memagent")]


def test_cut_off_last_trace_line_is_recomputed_once(evaluate, tiny_model_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    evaluate.main(evaluate_argv(tiny_model_dir, out))
    path = out / "traces.jsonl"
    path.write_bytes(path.read_bytes()[:-20])  # a kill while the last sample's line was being written
    seen = _count_samples_run(evaluate, monkeypatch)
    evaluate.main(evaluate_argv(tiny_model_dir, out))
    assert seen == [1]
    assert sorted(t["index"] for t in read_traces(out)) == [0, 1, 2]
    assert "cut-off line" in capsys.readouterr().err


def test_resume_with_other_settings_is_refused(evaluate, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    evaluate.main(evaluate_argv(tiny_model_dir, out, "--limit", "1"))
    with pytest.raises(SystemExit, match="other settings"):
        evaluate.main(evaluate_argv(tiny_model_dir, out, "--memory-tokens", "7"))


def test_resume_in_other_arithmetic_is_refused_naming_the_dtypes(evaluate, tiny_model_dir, tmp_path):
    # `--dtype auto` resolves per machine (bfloat16 where bf16 matmuls are native, else float32), and greedy decoding
    # of the same weights parts ways between the two: a cell resumed on another machine class must not mix them.
    out = tmp_path / "run"
    evaluate.main(evaluate_argv(tiny_model_dir, out, "--limit", "1", "--dtype", "float32"))
    assert json.loads((out / "run_config.json").read_text())["dtype"] == "float32"
    with pytest.raises(SystemExit, match=r"'dtype': \('float32', 'bfloat16'\).*--dtype float32"):
        evaluate.main(evaluate_argv(tiny_model_dir, out, "--dtype", "bfloat16"))
    assert len(read_traces(out)) == 1


def test_resume_with_other_weights_at_the_same_path_is_refused(evaluate, tiny_model_dir, tmp_path):
    # A seed trained again writes its checkpoint to the same path, but it is another model: SmolLM2's fp32 seed 0,
    # trained a third time, matched its recorded sampled accuracy through step 7 and parted from it at step 8
    # (docs/evaluation.md). A cell resumed on the new weights would mix two models' traces under one row.
    import shutil

    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    out = tmp_path / "run"
    evaluate.main(evaluate_argv(model, out, "--limit", "1"))
    recorded = json.loads((out / "run_config.json").read_text())["weights"]
    assert re.fullmatch(r"[0-9a-f]{16}", recorded)
    weights = next(model.glob("*.safetensors"))
    tensors = load_file(weights)
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1e-3
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(SystemExit, match=r"'weights': \('" + recorded + r"', '[0-9a-f]{16}'\)"):
        evaluate.main(evaluate_argv(model, out))
    assert len(read_traces(out)) == 1


def test_a_run_config_from_before_dtypes_were_recorded_resumes_unchecked(evaluate, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    evaluate.main(evaluate_argv(tiny_model_dir, out, "--limit", "1"))
    path = out / "run_config.json"
    recorded = json.loads(path.read_text())
    del recorded["dtype"]
    path.write_text(json.dumps(recorded))
    assert evaluate.main(evaluate_argv(tiny_model_dir, out, "--dtype", "bfloat16")) == 0
    assert len(read_traces(out)) == 3
    assert "dtype" not in json.loads(path.read_text())  # its first traces' arithmetic stays unknown, not relabelled


def test_bad_task_budget_or_length_is_refused_before_the_output_dir_exists(evaluate, tiny_model_dir, tmp_path,
                                                                              capsys):
    # A typo should cost no model load and leave no run directory behind (with a run_config.json a later run would
    # be checked against). The task and budget errors come before the model loads (its directory does not exist).
    out = tmp_path / "run"
    with pytest.raises(SystemExit):
        evaluate.main(evaluate_argv(tmp_path / "no-model", out, "--task", "niah_singel_1"))
    assert "--task: invalid choice: 'niah_singel_1'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1"):
        evaluate.main(evaluate_argv(tmp_path / "no-model", out, "--chunk-tokens", "0"))
    with pytest.raises(ValueError, match="target length 10 is too small"):
        evaluate.main(evaluate_argv(tiny_model_dir, out, "--lengths", "10"))
    assert not out.exists()


def test_unreachable_api_counts_every_sample_as_a_failure_in_the_denominator(evaluate, tiny_model_dir, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    out = tmp_path / "run"
    argv = evaluate_argv(tiny_model_dir, out, "--retries", "1", "--backoff", "0.01", "--timeout", "2")
    argv[argv.index("--model"):argv.index("--model") + 2] = [
        "--api-base", f"http://127.0.0.1:{dead}/v1", "--api-model", "tiny", "--tokenizer", str(tiny_model_dir)]
    assert evaluate.main(argv) == 0
    [row] = json.loads((out / "results.json").read_text())["rows"]
    assert (row["n"], row["failed"], row["score"]) == (3, 3, 0.0)
    assert all(t["error"] for t in read_traces(out))


def test_data_files_are_scored_per_file_with_their_own_task_metric(evaluate, tiny_model_dir, tiny_tokenizer, tmp_path):
    from memagent.data import make_task, write_samples

    path = write_samples(tmp_path / "hqa_200.json", make_task("hotpotqa_synth", tiny_tokenizer, 200, 2, 0))
    out = tmp_path / "run"
    argv = evaluate_argv(tiny_model_dir, out)
    argv[argv.index("--task"):argv.index("--task") + 6] = ["--data", str(path)]
    assert evaluate.main(argv) == 0
    [row] = json.loads((out / "results.json").read_text())["rows"]
    assert (row["source"], row["n"], row["metric"]) == ("hqa_200", 2, "sub_em")
    assert row["em"] is not None and row["f1"] is not None


def test_a_second_evaluation_of_a_directory_in_use_exits_busy_and_writes_nothing(evaluate, tiny_model_dir, tmp_path,
                                                                                  capsys):
    import subprocess
    import sys

    from memagent.evaluation.traces import BUSY_STATUS

    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from memagent.dirlock import lock_output_dir; "
         f"lock = lock_output_dir(Path({str(out)!r})); print('locked', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert evaluate.main(evaluate_argv(tiny_model_dir, out)) == BUSY_STATUS
        assert f"pid {holder.pid}" in capsys.readouterr().err
        assert not (out / "traces.jsonl").exists() and not (out / "run_config.json").exists()
    finally:
        holder.kill()  # SIGKILL: the kernel releases a dead holder's lock
        holder.wait()
    assert evaluate.main(evaluate_argv(tiny_model_dir, out)) == 0
    assert len(read_traces(out)) == 3
