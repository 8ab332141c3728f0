"""Prefill tokens of one MemAgent rollout round, MemAgent's prompt order against section-first (token counts only).

    .venv/bin/python bench/prefill_saving.py [--tokenizer models/smollm2-135m-instruct --questions 4
        --groups 4 16 --shapes 256:64 5000:1024]

For each shape (chunk tokens : memory tokens) and group size G, Q niah_single_1 questions each get G trajectories
whose memories differ (random words of the memory budget's length, as after round 1), and one memory-update round is
rendered for every trajectory through the chat template, in MemAgent's block order and section-first
(workflow.section_first). Counted per setting: the tokens a plain prefill runs (every prompt whole), and the tokens
the engine runs (memagent.rollout.prefill: identical prompts once, then the prefix-sharing plan of
`shared_prefix_runs` over the distinct prompts with min_shared_prefix 32). No model runs: prefill compute is
proportional to these counts (plus attention, which the shared prefix saves too). The answer round is unchanged by
the order and round 1 shares the whole prompt in both, so the saving shown is the later memory rounds'.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from memagent.data import make_task  # noqa: E402
from memagent.model import build_tiny_model, load_tokenizer  # noqa: E402
from memagent.rollout.chunking import iter_chunks, tokenize_document  # noqa: E402
from memagent.rollout.prefill import distinct_prompts, shared_prefix_runs  # noqa: E402
from memagent.rollout.prompts import render_memory_update, user_message  # noqa: E402

MIN_SHARED_PREFIX = 32
"""The engine's default (memagent.rollout.generate)."""


def engine_tokens(prompts: list[list[int]]) -> int:
    """Tokens the engine prefills for one call: identical prompts once, then shared prefixes once per run."""
    distinct, _ = distinct_prompts(prompts)
    saved = sum((len(rows) - 1) * prefix for rows, prefix in shared_prefix_runs(distinct, MIN_SHARED_PREFIX))
    return sum(map(len, distinct)) - saved


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default=str(ROOT / "models" / "smollm2-135m-instruct"))
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--groups", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--shapes", nargs="+", default=["256:64", "5000:1024"], help="chunk_tokens:memory_tokens")
    args = parser.parse_args(argv)
    path = Path(args.tokenizer)
    if not (path / "tokenizer_config.json").is_file():
        print(f"{path} not found (run `make smollm2`); using the tiny tokenizer")
        path = build_tiny_model(ROOT / "runs" / "bench" / "tiny")
    tok = load_tokenizer(path)
    words = [w for w in tok.get_vocab() if w.isalpha() and len(w) > 3][:5000]
    print(f"tokenizer {path.name}, {args.questions} questions, round 2 of 2 chunks\n")
    print("| chunk | memory | G | plain prefill tokens | MemAgent order, engine | section-first, engine | "
          "section-first / MemAgent order |")
    print("|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        chunk, memory = (int(x) for x in shape.split(":"))
        samples = make_task("niah_single_1", tok, length=2 * chunk, num_samples=args.questions, seed=0)
        for group in args.groups:
            rng = random.Random(0)
            counts = {}
            for section_first in (False, True):
                prompts = []
                for sample in samples:
                    second = list(iter_chunks(tokenize_document(sample.context, tok), tok, chunk))[-1]
                    for _ in range(group):
                        memory_text = " ".join(rng.choice(words) for _ in range(memory))
                        ids = tok(memory_text, add_special_tokens=False)["input_ids"][:memory]
                        content = render_memory_update(sample.question, tok.decode(ids), second,
                                                       section_first=section_first)
                        prompts.append(tok.apply_chat_template(list(user_message(content)), tokenize=True,
                                                               add_generation_prompt=True, return_dict=False))
                counts[section_first] = (sum(map(len, prompts)), engine_tokens(prompts))
            plain = counts[False][0]
            print(f"| {chunk} | {memory} | {group} | {plain} | {counts[False][1]} ({counts[False][1] / plain:.0%}) | "
                  f"{counts[True][1]} ({counts[True][1] / plain:.0%}) | {counts[True][1] / counts[False][1]:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
