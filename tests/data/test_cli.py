"""`python -m memagent.data` writes samples that read back at the requested length."""

from __future__ import annotations

import pytest

from memagent.data import read_samples
from memagent.data.__main__ import main


@pytest.mark.parametrize(
    "name, fmt", [("eval_64.json", None), ("niah.jsonl", "ruler"), ("train.jsonl", "train")]
)
def test_cli_writes_a_readable_file_of_the_requested_length(tmp_path, tiny_model_dir, capsys, name, fmt):
    argv = ["--task", "kv_retrieval", "--length", "400", "--num-samples", "3", "--tokenizer", str(tiny_model_dir),
            "--out", str(tmp_path / name), "--option", "depth=0.5", "--option", "num-keys=3"]  # fmt: skip
    main(argv + (["--format", fmt] if fmt else []))
    samples = read_samples(tmp_path / name)
    assert len(samples) == 3 and all(abs(s.length - 400) <= 8 and s.task == "kv_retrieval" for s in samples)
    assert "wrote 3 kv_retrieval samples" in capsys.readouterr().out


def test_cli_refuses_an_ambiguous_output_path_before_generating(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match="pass format='ruler' or format='train'"):
        main(["--task", "vt", "--length", "300", "--num-samples", "1", "--tokenizer", str(tiny_model_dir),
              "--out", str(tmp_path / "x.jsonl")])  # fmt: skip
