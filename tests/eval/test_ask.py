"""`python -m memagent.ask` on one's own document: memory shown per chunk, then the answer; local and over HTTP."""

from __future__ import annotations

import json
import re

from memagent.ask import load_document, main
from memagent.serve import BatchingEngine, ChatServer

DOCUMENT = "\n".join(f"Line {i}: the grass is green and the sky is blue." for i in range(16)) + "\nThe key is 4721.\n"


def _ask(tmp_path, *flags: str) -> list[str]:
    doc = tmp_path / "doc.txt"
    doc.write_text(DOCUMENT)
    return ["--document", str(doc), "--question", "What is the key?", "--chunk-tokens", "128",
            "--memory-tokens", "6", "--answer-tokens", "6", "--greedy", *flags]


def test_ask_prints_the_memory_after_every_chunk_then_the_answer(tiny_model_dir, tmp_path, capsys):
    assert main(_ask(tmp_path, "--model", str(tiny_model_dir))) == 0
    out = capsys.readouterr().out
    total = int(re.search(r"reading (\d+) chunk", out).group(1))
    assert total >= 2
    shown = re.findall(r"--- memory after chunk (\d+)/(\d+)", out)
    assert shown == [(str(k), str(total)) for k in range(1, total + 1)]
    assert out.index("--- answer ---") > out.index(f"memory after chunk {total}/")


def test_ask_quiet_through_the_api_prints_the_local_answer_under_greedy(tiny_model, tiny_tokenizer, tiny_model_dir,
                                                                        tmp_path, capsys):
    main(_ask(tmp_path, "--model", str(tiny_model_dir), "--quiet"))
    local = capsys.readouterr().out
    assert "memory after chunk" not in local and "reading" not in local  # --quiet: the answer only
    server = ChatServer(BatchingEngine(tiny_model, tiny_tokenizer), port=0, model_name="tiny")
    server.start_in_thread()
    try:
        main(_ask(tmp_path, "--api-base", server.url, "--api-model", "tiny", "--tokenizer", str(tiny_model_dir),
                  "--quiet"))
    finally:
        server.close()
    assert capsys.readouterr().out == local


def test_document_files_become_numbered_document_blocks(tmp_path):
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text(json.dumps({"title": "Paris", "text": "Capital of France."}) + "\n" + json.dumps("Plain doc.") + "\n")
    assert load_document(jsonl) == "Document 1:\nParis\nCapital of France.\n\nDocument 2:\nPlain doc."
    as_json = tmp_path / "docs.json"
    as_json.write_text(json.dumps({"documents": ["a", {"content": "b"}]}))
    assert load_document(as_json) == "Document 1:\na\n\nDocument 2:\nb"


def test_ask_with_gates_runs_the_gated_workflow_and_may_stop_reading_early(tiny_model_dir, tmp_path, capsys):
    assert main(_ask(tmp_path, "--model", str(tiny_model_dir), "--gates", "both")) == 0
    out = capsys.readouterr().out
    total = int(re.search(r"reading (\d+) chunk", out).group(1))
    shown = [int(k) for k, _ in re.findall(r"--- memory after chunk (\d+)/(\d+)", out)]
    assert shown == list(range(1, len(shown) + 1)) and 1 <= len(shown) <= total
    assert "--- answer ---" in out
