"""Where the gates fire (docs/gates.md, "The demo"): a gated demo run's held-out questions replayed greedily, one line
per question and one letter per chunk, and how the decisions sit against the needle's chunk.

    python -m memagent.demo.gate_traces runs/tiny-gates-seed0 [--set 4x] [--questions 8] [--model final|warm_start]

The run's own config.json rebuilds the workflow and the held-out set (the same questions train.py evaluated on, from
memagent.demo.stage.DemoStage); --model warm_start replays the policy before RL, so the two show what RL changed.
Letters: K = KEEP, U = UPDATE, A = ANSWER (reading stops there), ? = a decision that did not parse, . = not read;
the needle's chunk is in brackets: `KK[U]A............` kept two chunks, wrote the needle, and answered after one more.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from memagent.config import load_config
from memagent.demo.stage import DemoStage
from memagent.model import load_model, load_tokenizer
from memagent.rl.rewards import answer_score
from memagent.rollout.gates import ANSWER_NOW, KEEP, UNPARSED, UPDATE
from memagent.rollout.llm import LocalLLM
from memagent.rollout.sampling import SamplingParams
from memagent.rollout.workflow import run_memagent

LETTERS = {KEEP: "K", UPDATE: "U", ANSWER_NOW: "A", UNPARSED: "?"}


@dataclass(frozen=True)
class GatePositions:
    """How a set of gated trajectories' decisions sit against each question's needle chunk."""

    questions: int
    """Questions replayed."""
    needle_dropped: float
    """Share of the needle chunks read whose decision was KEEP or ANSWER: the evidence never written."""
    update_off_needle: float
    """Share of the other chunks read that were rewritten (UPDATE or unparsed): writes with nothing new."""
    exits_before_needle: int
    """Questions whose reading stopped (ANSWER) before the needle's chunk."""
    chunks_after_needle: float
    """Mean chunks read after the needle's chunk, over the questions that read it (0 = stopped on it)."""


def gate_line(decisions: list[str], needle_chunk: int, document_chunks: int) -> str:
    """One letter per chunk of the document (module docstring), the needle's chunk in brackets."""
    letters = [LETTERS.get(d, "?") for d in decisions] + ["."] * (document_chunks - len(decisions))
    letters[needle_chunk] = f"[{letters[needle_chunk]}]"
    return "".join(letters)


def gate_positions(decisions: list[list[str]], needle_chunks: list[int]) -> GatePositions:
    """GatePositions of trajectories given as their decisions per chunk read (in chunk order) and needle chunks."""
    if len(decisions) != len(needle_chunks) or not decisions:
        raise ValueError(f"gate_positions: {len(decisions)} decision lists for {len(needle_chunks)} needle chunks "
                         "(need as many, at least one)")
    needle_read = [(d, n) for d, n in zip(decisions, needle_chunks) if n < len(d)]
    others = [word for d, n in zip(decisions, needle_chunks) for i, word in enumerate(d) if i != n]
    return GatePositions(
        questions=len(decisions),
        needle_dropped=sum(d[n] in (KEEP, ANSWER_NOW) for d, n in needle_read) / len(needle_read) if needle_read else 0.0,
        update_off_needle=sum(w in (UPDATE, UNPARSED) for w in others) / len(others) if others else 0.0,
        exits_before_needle=len(decisions) - len(needle_read),
        chunks_after_needle=(sum(len(d) - 1 - n for d, n in needle_read) / len(needle_read)) if needle_read else 0.0)


def model_dir(run_dir: Path, which: str) -> Path:
    """The run's latest checkpoint's model ("final") or its SFT warm start ("warm_start")."""
    steps = sorted((run_dir / "checkpoints").glob("step_*/model"))
    path = run_dir / "warm_start" if which == "warm_start" else steps[-1] if steps else run_dir / "checkpoints"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no {which} model there (is {run_dir} a gated demo run with a checkpoint?)")
    return path


def main(argv: list[str] | None = None) -> GatePositions:
    parser = argparse.ArgumentParser(prog="python -m memagent.demo.gate_traces", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a train.py run of the demo with gates (e.g. runs/tiny-gates-seed0)")
    parser.add_argument("--set", default="4x", help="held-out set name, as in the run's metrics (default 4x)")
    parser.add_argument("--questions", type=int, default=8, help="questions to print (all are counted; default 8)")
    parser.add_argument("--model", choices=("final", "warm_start"), default="final",
                        help="the latest checkpoint, or the warm start before RL")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    if not (run_dir / "config.json").is_file():
        raise FileNotFoundError(f"{run_dir / 'config.json'}: no such file (pass a train.py run directory)")
    cfg = load_config(["--config", str(run_dir / "config.json")])
    if cfg.workflow.gates == "none" or not cfg.demo.enabled:
        raise ValueError(f"{run_dir}: not a gated demo run (workflow.gates {cfg.workflow.gates}, "
                         f"demo.enabled {cfg.demo.enabled})")
    path = model_dir(run_dir, args.model)
    tokenizer = load_tokenizer(cfg.model.path or cfg.demo.model_dir)  # the warm start's directory holds no tokenizer
    sets = DemoStage(cfg).data(tokenizer)[1]
    if args.set not in sets:
        raise ValueError(f"--set {args.set}: the run held out {sorted(sets)}")
    samples = sets[args.set]
    model = load_model(path, dtype=torch.float32, device="cpu")
    llm = LocalLLM(model, tokenizer, params=SamplingParams(temperature=0.0))
    # Held out as in training: no chunk cap (memagent.training.heldout).
    workflow = dataclasses.replace(cfg.workflow, max_chunks=None)
    trajs = sorted(run_memagent(samples, llm, workflow, group_size=1, keep_prompt_ids=False),
                   key=lambda t: t.sample_index)
    needles = [samples[t.sample_index].extra["needle_chunk"] for t in trajs]
    for t, needle in list(zip(trajs, needles))[: args.questions]:
        correct = answer_score(cfg.rollout.verifier, t.answer, samples[t.sample_index]) > 0
        print(f"{gate_line(t.decisions, needle, t.document_chunks)}  {'right' if correct else 'wrong'}")
    positions = gate_positions([t.decisions for t in trajs], needles)
    print(f"{args.model}, {args.set}, {positions.questions} questions: needle's chunk not written (KEEP or ANSWER "
          f"there) {100 * positions.needle_dropped:.0f}%, UPDATE elsewhere {100 * positions.update_off_needle:.0f}%, "
          f"exits before the needle {positions.exits_before_needle}, chunks read after it "
          f"{positions.chunks_after_needle:.2f}")
    return positions


def cli(argv: list[str] | None = None) -> None:
    """main() with a user error as one line `error: ...` and exit status 2."""
    try:
        main(argv)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    cli()
