"""Prefill tokens of one MemAgent rollout round: MemAgent's prompt order against section-first, and where a gated
prompt's decision words go (token counts only).

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

A second table does the same for gated memory (docs/gates.md) in MemAgent's order: the ungated prompt, the gated one
with its decision words at the end (after the section, where they were first put) and as rendered now (between the
instruction and the blocks, where every prompt of the round shares them).
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
from memagent.rollout.gates import offered_words  # noqa: E402
from memagent.rollout.prefill import distinct_prompts, shared_prefix_runs  # noqa: E402
from memagent.rollout.prompts import (  # noqa: E402
    GATE_CHOICES,
    GATED_CLOSING,
    GATED_RULES,
    MEMORY_UPDATE_CLOSING,
    render_memory_update,
    user_message,
)

MIN_SHARED_PREFIX = 32
"""The engine's default (memagent.rollout.generate)."""


def engine_tokens(prompts: list[list[int]]) -> int:
    """Tokens the engine prefills for one call: identical prompts once, then shared prefixes once per run."""
    distinct, _ = distinct_prompts(prompts)
    saved = sum((len(rows) - 1) * prefix for rows, prefix in shared_prefix_runs(distinct, MIN_SHARED_PREFIX))
    return sum(map(len, distinct)) - saved


def gated_words_last(problem: str, memory: str, chunk: str) -> str:
    """The gated prompt (gates both) as first laid out: the decision words after the section, then "Decision:"."""
    rules = GATED_RULES.format(choices="\n".join(GATE_CHOICES[word] for word in offered_words("both")))
    return render_memory_update(problem, memory, chunk).removesuffix(MEMORY_UPDATE_CLOSING) + rules + GATED_CLOSING


LAYOUTS = {
    "ungated": lambda q, m, c: render_memory_update(q, m, c),
    "gated, words last": gated_words_last,
    "gated, words first": lambda q, m, c: render_memory_update(q, m, c, gates="both"),
}
"""The memory-update prompts of the gate table, MemAgent's block order."""


def round_prompts(tok, samples, group: int, chunk: int, memory: int, words: list[str], render) -> list[list[int]]:
    """Round 2's memory-update prompts, token ids through the chat template: G trajectories per question, each with
    its own memory of `memory` random-word tokens."""
    rng = random.Random(0)
    prompts = []
    for sample in samples:
        second = list(iter_chunks(tokenize_document(sample.context, tok), tok, chunk))[-1]
        for _ in range(group):
            memory_text = " ".join(rng.choice(words) for _ in range(memory))
            ids = tok(memory_text, add_special_tokens=False)["input_ids"][:memory]
            content = render(sample.question, tok.decode(ids), second)
            prompts.append(tok.apply_chat_template(list(user_message(content)), tokenize=True,
                                                   add_generation_prompt=True, return_dict=False))
    return prompts


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
            counts = {}
            for section_first in (False, True):
                prompts = round_prompts(tok, samples, group, chunk, memory, words,
                                        lambda q, m, c, sf=section_first: render_memory_update(q, m, c,
                                                                                               section_first=sf))
                counts[section_first] = (sum(map(len, prompts)), engine_tokens(prompts))
            plain = counts[False][0]
            print(f"| {chunk} | {memory} | {group} | {plain} | {counts[False][1]} ({counts[False][1] / plain:.0%}) | "
                  f"{counts[True][1]} ({counts[True][1] / plain:.0%}) | {counts[True][1] / counts[False][1]:.2f} |",
                  flush=True)
    print(f"\ngated memory, MemAgent's order: engine prefill tokens per prompt of round 2, {args.questions} questions\n")
    print(f"| chunk | memory | G | {' | '.join(LAYOUTS)} | words first / ungated |")
    print("|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        chunk, memory = (int(x) for x in shape.split(":"))
        samples = make_task("niah_single_1", tok, length=2 * chunk, num_samples=args.questions, seed=0)
        for group in (1, *args.groups):
            per_prompt = {}
            for name, render in LAYOUTS.items():
                prompts = round_prompts(tok, samples, group, chunk, memory, words, render)
                per_prompt[name] = engine_tokens(prompts) / len(prompts)
            print(f"| {chunk} | {memory} | {group} | {' | '.join(f'{v:.0f}' for v in per_prompt.values())} | "
                  f"{per_prompt['gated, words first'] / per_prompt['ungated']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
