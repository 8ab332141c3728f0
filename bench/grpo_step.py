"""A small, head-heavy GRPO step (one conversation per trajectory): ours before and after issue 22, and TRL's.

    OMP_NUM_THREADS=2 .venv/bin/python bench/grpo_step.py [--prompts 8 --group 8 --new-tokens 64 --repeats 2]
    PYTHONPATH=/path/to/trl/site OMP_NUM_THREADS=2 .venv/bin/python bench/grpo_step.py --trl

The model is a random Llama with hidden 256, 4 layers, 4 heads and SmolLM2's tokenizer (49,152 tokens), so the
output head is most of the arithmetic; float32. Each step samples G completions of `new-tokens` tokens (EOS off)
for each of P chat prompts at temperature 1, scores them with a random reward, computes group advantages, and
runs one clipped-loss update over all P x G rows. Settings, from the same weights and sampling seed:
  before   old log-probs recomputed by a forward pass; every row's prompt run whole in the update
  after    the sampler's log-probs reused (rollout.reuse_logprobs) and the G rows of a prompt running it once
           (optim.shared_prefix_tokens 64 applies when the prompt is that long; --prompt-words sets its length)
  trl      TRL's GRPOTrainer (when `trl` imports): same model, prompts, G, completion length, temperature,
           one optimizer step, no vLLM; its train() time for that one step, setup excluded.
Reported: generation, old log-prob and update seconds and the step total (best of --repeats), and each setting's
step time against `after`. Needs models/smollm2-135m-instruct (`make smollm2`) for its tokenizer.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from memagent.model import load_tokenizer  # noqa: E402
from memagent.records import TrainRow  # noqa: E402
from memagent.rl import group_advantages  # noqa: E402
from memagent.rl import step as rl_step  # noqa: E402
from memagent.rollout import SamplingParams, generate  # noqa: E402

SMOLLM2 = ROOT / "models" / "smollm2-135m-instruct"
LOSS = dict(clip_low=0.2, clip_high=0.28, clip_c=10.0, agg="token-mean", norm_len=None, kl_coef=0.0, kl_kind="k3")
WORDS = ("river stone lamp quiet orbit maple copper ledger signal harbor velvet meadow canyon lantern "
         "pocket thunder silver garden falcon marble").split()


def random_llama(vocab: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=vocab, tie_word_embeddings=True, max_position_embeddings=2048,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


def prompt_texts(n: int, words: int) -> list[str]:
    g = torch.Generator().manual_seed(1)
    return [" ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (words,), generator=g)) + f" (prompt {k})"
            for k in range(n)]


def ours(model: torch.nn.Module, prompts: list[list[int]], args: argparse.Namespace, *, after: bool) -> dict:
    """One GRPO step with our engine and update; seconds per phase."""
    out: dict[str, float] = {}
    t = time.perf_counter()
    model.eval()
    repeated = [p for p in prompts for _ in range(args.group)]
    gen = generate(model, repeated, max_new_tokens=args.new_tokens, eos_token_id=None, params=SamplingParams(),
                   generator=torch.Generator().manual_seed(0))
    out["generate_s"] = time.perf_counter() - t
    rewards = torch.rand(len(repeated), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    groups = torch.arange(len(prompts)).repeat_interleave(args.group)
    adv = group_advantages(rewards, groups)
    rows = [TrainRow(p + toks, len(p), [1] * len(toks), float(a)) for p, toks, a in zip(repeated, gen.tokens, adv)]
    shared = 64 if after else 0
    pack = dict(budget=args.budget, pad_id=0, device=torch.device("cpu"), temperature=1.0, shared_prefix=shared)
    counts = rl_step.micro_batch_counts([rows], args.budget, lambda x: x.clone(), shared)
    t = time.perf_counter()
    model.train()
    if after:
        for row, lp in zip(rows, gen.logprobs):
            row.old_logprobs = lp
    else:
        rl_step.set_logprobs(model, [rows], counts, "old_logprobs", **pack)
    out["old_logprobs_s"] = time.perf_counter() - t
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def optimizer_step() -> tuple[float, bool]:
        opt.step()
        opt.zero_grad(set_to_none=True)
        return 0.0, False

    t = time.perf_counter()
    rl_step.update_policy(model, [rows], counts, **LOSS, **pack, world_size=1, all_reduce_sum=lambda x: x.clone(),
                          backward=lambda loss, last: loss.backward(), optimizer_step=optimizer_step)
    out["update_s"] = time.perf_counter() - t
    return out


def trl_step(model: torch.nn.Module, tokenizer, texts: list[str], args: argparse.Namespace) -> dict:
    """TRL GRPOTrainer, one optimizer step on the same prompts; its train() seconds."""
    import tempfile

    from trl import GRPOConfig, GRPOTrainer

    def reward(completions, **kwargs) -> list[float]:
        return torch.rand(len(completions)).tolist()

    import datasets
    import pyarrow

    # Built with a fixed fingerprint: datasets' own fingerprinting pickles the arrow schema with dill, which fails
    # on this pyarrow / dill pair (MonthDayNano).
    table = pyarrow.Table.from_pylist([{"prompt": [{"role": "user", "content": t}]} for t in texts])
    data = datasets.Dataset(table, fingerprint="grpo-step-bench")
    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=len(texts) * args.group,
                         num_generations=args.group, max_completion_length=args.new_tokens, temperature=1.0,
                         top_p=1.0, learning_rate=1e-6, max_steps=1, logging_steps=1, save_strategy="no",
                         report_to=[], bf16=False, use_cpu=True, beta=0.0, dataloader_num_workers=0)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data,
                              processing_class=tokenizer)
        t = time.perf_counter()
        trainer.train()
        return {"step_s": time.perf_counter() - t}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-words", type=int, default=40)
    parser.add_argument("--budget", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--trl", action="store_true", help="also time TRL's GRPOTrainer (needs trl and datasets)")
    args = parser.parse_args(argv)
    if not (SMOLLM2 / "tokenizer_config.json").is_file():
        print(f"skipped: {SMOLLM2} not found (run `make smollm2`)")
        return
    tok = load_tokenizer(SMOLLM2)
    tok.padding_side = "left"
    base = random_llama(len(tok))
    texts = prompt_texts(args.prompts, args.prompt_words)
    prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for t in texts]
    print(f"random Llama h256 x 4 layers, vocab {len(tok)}, float32, {torch.get_num_threads()} threads; "
          f"{args.prompts} prompts of {sum(map(len, prompts)) / len(prompts):.0f} tokens x G {args.group}, "
          f"{args.new_tokens} new tokens\n")
    print("| setting | generate s | old log-probs s | update s | step s | vs after |")
    print("|---|---|---|---|---|---|")
    results = {}
    for label in ("before", "after"):
        runs = [ours(copy.deepcopy(base), prompts, args, after=label == "after") for _ in range(args.repeats)]
        best = min(runs, key=lambda r: sum(r.values()))
        results[label] = {**best, "step_s": sum(best.values())}
    if args.trl:
        runs = [trl_step(copy.deepcopy(base), tok, texts, args) for _ in range(args.repeats)]
        results["trl"] = min(runs, key=lambda r: r["step_s"])
    for label, r in results.items():
        cells = [f"{r[k]:.2f}" if k in r else "-" for k in ("generate_s", "old_logprobs_s", "update_s")]
        print(f"| {label} | {' | '.join(cells)} | {r['step_s']:.2f} | {r['step_s'] / results['after']['step_s']:.2f}x |",
              flush=True)


if __name__ == "__main__":
    main()
