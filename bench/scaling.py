"""Cost versus document length: the MemAgent workflow (linear) against the full-context baseline (super-linear).

    OMP_NUM_THREADS=1 .venv/bin/python bench/scaling.py [--base-tokens 1024 --multiples 1 2 4 8 16 --device cpu]

One random Qwen2 (the tiny model by default; `--hidden-size/--layers` for a bigger one) with a context window large
enough for the longest document, so the baseline reads every document whole. Each length gets one RULER
niah_single_1 document from the data generator, and both methods read the same one:
- workflow: `run_memagent` with max_chunks None: one memory update per chunk, then the answer;
- baseline: one prompt holding the whole document (`full_context_prompt`, nothing truncated), then the answer.
Outputs have a fixed length (EOS disabled), so the timings measure the document, not when a random model happens
to stop. Reported: wall time, cost per 1k document tokens (and its ratio to the shortest document) and peak
memory above the level before the call (CUDA: max_memory_allocated; CPU: the kernel's peak-RSS counter, reset via
/proc/self/clear_refs). On CPU the cost is the process's CPU time, which other jobs on a shared machine do not
inflate; run with OMP_NUM_THREADS=1 there, so it equals wall time on a quiet machine. On CUDA it is wall time.
Last, the time to generate one 1M-token RULER sample.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from memagent.data import make_task  # noqa: E402
from memagent.evaluation.baseline import full_context_prompt  # noqa: E402
from memagent.model import build_tiny_model, load_model, load_tokenizer  # noqa: E402
from memagent.rollout.chunking import num_chunks  # noqa: E402
from memagent.rollout.llm import LocalLLM  # noqa: E402
from memagent.rollout.prompts import WorkflowConfig  # noqa: E402
from memagent.rollout.sampling import SamplingParams  # noqa: E402
from memagent.rollout.workflow import run_memagent  # noqa: E402


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(fn: Callable[[], object], device: torch.device) -> tuple[float, float, float]:
    """Run fn once; return (wall seconds, cost seconds, peak MiB above the memory in use before it).

    Cost is this process's CPU time on CPU (what other processes on a shared machine do not inflate, unlike wall
    time) and wall time on CUDA (kernels run asynchronously, so CPU time says little there).
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (peak RSS) to the current RSS
        before = _rss_kib("VmRSS") * 1024
    start, cpu_start = time.perf_counter(), time.process_time()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else _rss_kib("VmHWM") * 1024
    return wall, (wall if device.type == "cuda" else cpu), (peak - before) / 2**20


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-tokens", type=int, default=1024, help="document tokens at 1x")
    p.add_argument("--multiples", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--chunk-tokens", type=int, default=128)
    p.add_argument("--memory-tokens", type=int, default=32)
    p.add_argument("--answer-tokens", type=int, default=8)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=2,
                   help="passes over all lengths; each cell keeps its best time (see the loop for why)")
    p.add_argument("--million-tokens", type=int, default=1_000_000, help="length of the data-generation check")
    args = p.parse_args(argv)

    device = torch.device(args.device)
    longest = args.base_tokens * max(args.multiples)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(tmp, hidden_size=args.hidden_size, num_layers=args.layers,
                                     intermediate_size=4 * args.hidden_size, max_position_embeddings=4 * longest)
        model = load_model(model_dir, dtype=torch.float32, device=device).eval()
        tokenizer = load_tokenizer(model_dir)
    llm = LocalLLM(model, tokenizer, params=SamplingParams(temperature=0.0))
    llm.eos_token_ids = []  # fixed-length outputs: time measures the document, not a random model's EOS
    config = WorkflowConfig(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens,
                          answer_tokens=args.answer_tokens, max_chunks=None)
    window = 2 * longest  # the baseline never truncates

    def workflow(sample):
        return lambda: run_memagent([sample], llm, config, keep_prompt_ids=False)

    def baseline(sample):
        prompt = full_context_prompt(sample, tokenizer, window=window, answer_tokens=config.answer_tokens,
                                     question_tokens=config.question_tokens)
        assert prompt.kept_tokens == prompt.document_tokens
        return lambda: llm.complete([prompt.request])

    samples = {m: make_task("niah_single_1", tokenizer, args.base_tokens * m, 1, m)[0] for m in args.multiples}
    first = samples[min(args.multiples)]
    measure(workflow(first), device)  # warm-up: first-call allocations and kernel choice
    measure(baseline(first), device)

    print(f"model: hidden {args.hidden_size}, {args.layers} layers, {sum(x.numel() for x in model.parameters())} "
          f"params, {device}; chunk {config.chunk_tokens}, memory {config.memory_tokens}, answer "
          f"{config.answer_tokens} tokens; torch threads {torch.get_num_threads()}; best of {args.rounds} rounds")
    unit = "GPU" if device.type == "cuda" else "CPU"
    header = (f"| x | doc tokens | chunks | workflow wall s | workflow {unit} ms/1k tok | vs 1x | workflow peak MiB "
              f"| baseline wall s | baseline {unit} ms/1k tok | vs 1x | baseline peak MiB |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    # Rounds over all lengths, not repeats of one length: on a shared machine the load drifts over minutes, and
    # interleaving spreads that drift over every length instead of biasing the ones measured last.
    best: dict[tuple[str, int], tuple[float, float, float]] = {}
    for _ in range(args.rounds):
        for m in args.multiples:
            for name, build in (("workflow", workflow), ("baseline", baseline)):
                wall, cost, peak = measure(build(samples[m]), device)
                old = best.get((name, m), (float("inf"), float("inf"), 0.0))
                best[(name, m)] = (min(old[0], wall), min(old[1], cost), max(old[2], peak))
    ref: dict[str, float] = {}
    for m in args.multiples:
        tokens = len(tokenizer(samples[m].context, add_special_tokens=False)["input_ids"])
        cells = [str(m), str(tokens), str(num_chunks(tokens, config.chunk_tokens))]
        for name in ("workflow", "baseline"):
            wall, cost, peak = best[(name, m)]
            per_1k = 1000 * cost / tokens * 1000  # ms per 1k document tokens
            ref.setdefault(name, per_1k)
            cells += [f"{wall:.2f}", f"{per_1k:.1f}", f"{per_1k / ref[name]:.2f}", f"{peak:.0f}"]
        print("| " + " | ".join(cells) + " |", flush=True)

    start = time.perf_counter()
    [big] = make_task("niah_single_1", tokenizer, args.million_tokens, 1, 0)
    seconds = time.perf_counter() - start
    print(f"\ndata generation: one niah_single_1 sample of {args.million_tokens} tokens "
          f"({len(big.context)} characters) in {seconds:.1f} s (target < 30 s)")


if __name__ == "__main__":
    main()
