"""Padding of the update's micro-batches, and update tokens/s, for three packings of the same rows.

Rows: one per conversation of real MemAgent rollouts (`run_memagent`, temperature 1.0), as the trainer builds them:
- "tiny": the tiny demo's shape (tiny Qwen2 + its tokenizer, chunk 32, memory 10, answer 8, 2 chunks, 8 questions x
  G 8, 2 mini-batches, micro_batch_tokens 8192);
- "smollm2": models/smollm2-135m-instruct (chunk 512, memory 128, answer 32, 3 chunks, 4 questions x G 4,
  2 mini-batches; micro_batch_tokens 8192 and 16384).
The kv_retrieval task gives the documents; lengths are set by the workflow's budgets, not by the task.

Padded fraction: padding positions / all positions over every micro-batch of every mini-batch, for
pack_by_token_budget (trajectory order, the old packing), pack_by_length and pack_concatenated (remove-padding:
0 by construction).

Throughput (`--throughput`): forward + backward of DAPO's loss (policy_loss, token-mean, global N) over one
mini-batch subset of the SmolLM2 rows, on a random Llama of SmolLM2-135M's shape (hidden 576, 30 layers, 9 heads,
3 KV heads, intermediate 1536, vocab 49152, float32, sdpa), the three packings side by side in one process, each
after one untimed warm-up pass. Remove-padding runs token_logprobs through a wrapper that passes
attention_mask=None, so transformers builds the block-causal mask from the restarting position ids; its loss is
checked against the padded one.

Usage: `OMP_NUM_THREADS=1 .venv/bin/python bench/packing.py [--throughput --rows 16 --budget 2048]`.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch import nn

from memagent.data import make_task
from memagent.model import build_tiny_model, load_model, load_tokenizer, token_logprobs
from memagent.rl.loss import policy_loss
from memagent.rl.packing import (
    pack_by_length,
    pack_by_token_budget,
    pack_concatenated,
    packed_position_ids,
    padded_fraction,
)
from memagent.rl.step import TrainRow, collate, split_mini_batches
from memagent.rollout.llm import LocalLLM
from memagent.rollout.sampling import SamplingParams
from memagent.rollout.workflow import run_memagent

try:
    from memagent.rollout.prompts import WorkflowConfig
except ImportError:  # before the rename
    from memagent.rollout import MemoryConfig as WorkflowConfig  # type: ignore[no-redef]

SMOLLM2 = "models/smollm2-135m-instruct"


def rollout_rows(model: nn.Module, tok, *, chunk: int, memory: int, answer: int, chunks: int, questions: int,
                 group: int, seed: int = 0) -> list[TrainRow]:
    """TrainRows (advantage +-1, old log-probs 0) of real rollouts, trajectory order as the trainer has them."""
    samples = make_task("kv_retrieval", tok, length=chunk * chunks, num_samples=questions, seed=seed)
    llm = LocalLLM(model, tok, params=SamplingParams(temperature=1.0), generator=torch.Generator().manual_seed(seed))
    config = WorkflowConfig(chunk_tokens=chunk, memory_tokens=memory, answer_tokens=answer, max_chunks=chunks)
    rows = []
    for k, traj in enumerate(run_memagent(samples, llm, config, group_size=group)):
        for c in traj.conversations:
            rows.append(TrainRow(input_ids=list(c.prompt_ids) + list(c.response_ids), prompt_len=len(c.prompt_ids),
                                 response_mask=list(c.response_mask), advantage=1.0 if k % 2 else -1.0))
    return rows


def cached_rows(path: str, make) -> list[TrainRow]:
    """Rows from a JSON cache at `path` (ids, prompt length, mask, advantage), else from make() and saved there."""
    if path and os.path.exists(path):
        with open(path) as f:
            return [TrainRow(r["ids"], r["p"], r["m"], advantage=r["a"]) for r in json.load(f)]
    rows = make()
    if path:
        with open(path, "w") as f:
            json.dump([{"ids": r.input_ids, "p": r.prompt_len, "m": r.response_mask, "a": r.advantage} for r in rows], f)
    return rows


def padding_table(name: str, rows: list[TrainRow], mini_batches: int, budgets: list[int]) -> None:
    minis = split_mini_batches(rows, mini_batches)
    lengths = [len(r.input_ids) for r in rows]
    print(f"\n{name}: {len(rows)} rows, lengths {min(lengths)}..{max(lengths)} (mean {sum(lengths) / len(rows):.0f}), "
          f"{mini_batches} mini-batches")
    print("| micro_batch_tokens | packing | micro-batches | padded fraction |\n|---|---|---|---|")
    for budget in budgets:
        for label, pack in (("in order (pack_by_token_budget)", pack_by_token_budget),
                            ("pack_by_length", pack_by_length), ("pack_concatenated", pack_concatenated)):
            pad = total = count = 0
            for mini in minis:
                ls = [len(r.input_ids) for r in mini]
                groups = pack(ls, budget)
                count += len(groups)
                if pack is pack_concatenated:
                    size = sum(ls)
                else:
                    size = sum(len(g) * max(ls[i] for i in g) for g in groups)
                    assert abs(padded_fraction(ls, groups) - (size - sum(ls)) / size) < 1e-12
                pad += size - sum(ls)
                total += size
            print(f"| {budget} | {label} | {count} | {100 * pad / total:.1f}% |")


class NoMask(nn.Module):
    """Calls the wrapped causal LM with attention_mask=None (packed rows: the mask comes from position_ids)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, **kwargs):
        kwargs["attention_mask"] = None
        return self.module(**kwargs)


def concat_batch(rows: list[TrainRow]) -> dict[str, torch.Tensor]:
    """One [1, sum len] sequence of the rows with per-row position ids, loss mask, advantages and old log-probs."""
    ids, mask, adv, old = [], [], [], []
    for r in rows:
        n, p = len(r.input_ids), r.prompt_len
        ids += r.input_ids
        mask += [False] * p + [bool(m) for m in r.response_mask]
        adv += [r.advantage] * n
        old.append(torch.zeros(n) if r.old_logprobs is None else torch.cat([torch.zeros(p), r.old_logprobs]))
    lengths = [len(r.input_ids) for r in rows]
    return {"input_ids": torch.tensor([ids]), "loss_mask": torch.tensor([mask]), "advantages": torch.tensor([adv]),
            "old_logp": torch.cat(old).unsqueeze(0),
            "position_ids": packed_position_ids(lengths, list(range(len(rows))))}


def update_pass(model: nn.Module, rows: list[TrainRow], groups: list[list[int]], concatenated: bool,
                num_tokens: float) -> float:
    """Forward + backward of every group; returns the summed loss."""
    total = 0.0
    for g in groups:
        pack = [rows[i] for i in g]
        if concatenated:
            b = concat_batch(pack)
            out = token_logprobs(NoMask(model), b["input_ids"], torch.ones_like(b["input_ids"]), with_entropy=True,
                                 position_ids=b["position_ids"], target_mask=b["loss_mask"])
            loss, _ = policy_loss(out.logprobs, b["old_logp"], b["advantages"], b["loss_mask"], num_tokens=num_tokens,
                                  num_seqs=float(len(rows)))
        else:
            mb = collate(pack, 0, torch.device("cpu"))
            out = token_logprobs(model, mb.input_ids, mb.attention_mask, with_entropy=True, target_mask=mb.loss_mask)
            old = torch.zeros_like(out.logprobs) if mb.old_logp is None else mb.old_logp  # as concat_batch's zeros
            loss, _ = policy_loss(out.logprobs, old, mb.advantages, mb.loss_mask, num_tokens=num_tokens,
                                  num_seqs=float(len(rows)))
        loss.backward()
        total += float(loss.detach())
    return total


def throughput(rows: list[TrainRow], budget: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True,
                         max_position_embeddings=8192, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).float().train()
    lengths = [len(r.input_ids) for r in rows]
    num_tokens = float(sum(r.num_trained_tokens for r in rows))
    print(f"\nthroughput: {len(rows)} rows ({sum(lengths)} tokens, lengths {min(lengths)}..{max(lengths)}), "
          f"budget {budget}, threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}")
    print("| packing | micro-batches | padded fraction | seconds | real tokens/s | loss |\n|---|---|---|---|---|---|")
    modes = (("in order (padded)", pack_by_token_budget(lengths, budget), False),
             ("pack_by_length", pack_by_length(lengths, budget), False),
             ("remove-padding (pack_concatenated)", pack_concatenated(lengths, budget), True))
    warm = [0, 1] if len(rows) > 1 else [0]
    for _, _, concatenated in modes:  # untimed warm-up of each code path
        update_pass(model, rows, [warm], concatenated, num_tokens)
    losses = []
    for label, groups, concatenated in modes:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = update_pass(model, rows, groups, concatenated, num_tokens)
        dt = time.perf_counter() - t0
        losses.append(loss)
        pad = 0.0 if concatenated else padded_fraction(lengths, groups)
        print(f"| {label} | {len(groups)} | {100 * pad:.1f}% | {dt:.1f} | {sum(lengths) / dt:.0f} | {loss:.6f} |")
    assert max(losses) - min(losses) < 1e-4, losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--throughput", action="store_true", help="also time the update on a SmolLM2-shaped model")
    parser.add_argument("--rows", type=int, default=16, help="SmolLM2 rows (trajectory order) in the timed update")
    parser.add_argument("--budget", type=int, default=2048, help="micro_batch_tokens of the timed update")
    parser.add_argument("--tmp", default="/tmp/packing-bench-tiny", help="where the tiny model is built")
    parser.add_argument("--cache", default="/tmp/packing-bench", help="prefix of the rows' JSON caches ('' = none)")
    args = parser.parse_args(argv)
    print(f"load {os.getloadavg()[0]:.2f}, threads {torch.get_num_threads()}")

    def tiny_rows() -> list[TrainRow]:
        path = build_tiny_model(args.tmp, hidden_size=96, num_layers=3, intermediate_size=384)
        tiny, tiny_tok = load_model(path, dtype=torch.float32, device="cpu"), load_tokenizer(path)
        return rollout_rows(tiny, tiny_tok, chunk=32, memory=10, answer=8, chunks=2, questions=8, group=8)

    def smollm2_rows() -> list[TrainRow]:
        smol, smol_tok = load_model(SMOLLM2, dtype=torch.float32, device="cpu"), load_tokenizer(SMOLLM2)
        return rollout_rows(smol, smol_tok, chunk=512, memory=128, answer=32, chunks=3, questions=4, group=4)

    cache = (lambda name: f"{args.cache}-{name}.json") if args.cache else (lambda name: "")
    padding_table("tiny demo mix", cached_rows(cache("tiny"), tiny_rows), 2, [8192])
    rows = cached_rows(cache("smollm2"), smollm2_rows)
    padding_table("SmolLM2 mix", rows, 2, [2048, 8192, 16384])
    if args.throughput:
        throughput(rows[: args.rows], args.budget)


if __name__ == "__main__":
    main()
