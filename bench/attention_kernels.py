"""Attention of one memory round's prefill on a CPU: the kernel transformers' SDPA path calls, against what else a CPU
offers (BENCHMARKS.md, "Where an evaluation's time goes").

    OMP_NUM_THREADS=1 .venv/bin/python bench/attention_kernels.py [--rows 16 --repeats 3]

SmolLM2-135M's attention shape (9 query heads over 3 key/value heads, head dim 64) on a memory round of the task-mix
cells (prompts of about 520 tokens, left-padded by up to 60): queries over the whole prompt (one-shot prefill) and
over its last 340 positions (the part left after the engine's shared prefix, memagent.rollout.prefill). Timed, best
of --repeats, in fp32 (what `--dtype auto` gives a CPU without native bf16):
- `sdpa, padding mask`: `F.scaled_dot_product_attention` with the boolean causal-and-padding mask and key/value heads
  repeated to the query heads, as transformers' sdpa attention calls it in a left-padded batch;
- `sdpa, gqa`: the same mask with `enable_gqa=True` instead of repeated heads;
- `matmul-softmax-matmul, per row`: the plain formula, one row at a time (its [9, L, L] scores stay cache-sized);
- `sdpa, per row, pads cut`: every row alone with its padding sliced off;
- `sdpa, is_causal, no padding`: the causal kernel on unpadded rows, the bound a right-padded layout could reach.
GFLOP/s counts the dense work (4 x rows x heads x queries x keys x 64), masked or not. Each variant's output is
checked against the first (max abs difference, padded query rows excluded).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def best_seconds(fn: Callable[[], Tensor], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def compare(rows: int, queries: int, keys: int, max_pad: int, repeats: int) -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(rows, HEADS, queries, HEAD_DIM, generator=gen)
    k = torch.randn(rows, KV_HEADS, keys, HEAD_DIM, generator=gen)
    v = torch.randn(rows, KV_HEADS, keys, HEAD_DIM, generator=gen)
    pads = torch.randint(0, max_pad + 1, (rows,), generator=gen)
    key_pos = torch.arange(keys)
    query_pos = torch.arange(keys - queries, keys)
    mask = ((key_pos[None, :] <= query_pos[:, None])[None] & (key_pos[None, :] >= pads[:, None])[:, None, :])[:, None]
    k_rep, v_rep = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
    real_queries = query_pos[None, :] >= pads[:, None]  # [rows, queries]: padded query rows are never read

    def sdpa_mask() -> Tensor:
        return F.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=mask)

    def sdpa_gqa() -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    def math_per_row() -> Tensor:
        out = torch.empty_like(q)
        for r in range(rows):
            scores = (q[r] @ k_rep[r].transpose(-1, -2)) * HEAD_DIM**-0.5
            out[r] = torch.softmax(scores.masked_fill(~mask[r], float("-inf")), -1) @ v_rep[r]
        return out

    def sdpa_per_row_cut() -> Tensor:
        out = torch.zeros_like(q)
        for r in range(rows):
            pad = int(pads[r])
            first_query = max(0, pad - (keys - queries))
            out[r : r + 1, :, first_query:] = F.scaled_dot_product_attention(
                q[r : r + 1, :, first_query:], k_rep[r : r + 1, :, pad:], v_rep[r : r + 1, :, pad:],
                attn_mask=mask[r : r + 1, :, first_query:, pad:])
        return out

    variants = {"sdpa, padding mask": sdpa_mask, "sdpa, gqa": sdpa_gqa, "matmul-softmax-matmul, per row": math_per_row,
                "sdpa, per row, pads cut": sdpa_per_row_cut}
    reference = sdpa_mask()
    dense_gflop = 4 * rows * HEADS * queries * keys * HEAD_DIM / 1e9
    print(f"\n{rows} rows, {queries} queries over {keys} keys (pads 0-{max_pad}), fp32, "
          f"{torch.get_num_threads()} thread(s)\n")
    print("| variant | ms per layer | GFLOP/s (dense) | max abs diff |")
    print("|---|---|---|---|")
    for name, fn in variants.items():
        diff = (fn() - reference).abs().amax(dim=(1, 3))[real_queries].max().item()
        seconds = best_seconds(fn, repeats)
        print(f"| {name} | {seconds * 1e3:.1f} | {dense_gflop / seconds:.1f} | {diff:.1e} |")
    if queries == keys:
        q_full, k_full, v_full = q, k_rep, v_rep
        seconds = best_seconds(lambda: F.scaled_dot_product_attention(q_full, k_full, v_full, is_causal=True), repeats)
        print(f"| sdpa, is_causal, no padding | {seconds * 1e3:.1f} | {dense_gflop / seconds:.1f} | (other input) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=16, help="prompts in the round (default 16)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per variant, best kept (default 3)")
    args = parser.parse_args()
    compare(args.rows, 520, 520, 60, args.repeats)
    compare(args.rows, 340, 520, 60, args.repeats)


if __name__ == "__main__":
    main()
