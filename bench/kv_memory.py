"""KV-cache memory of one generate call: peak RSS growth, allocated cache bytes, and the padded width of a prefill.

    OMP_NUM_THREADS=1 .venv/bin/python bench/kv_memory.py
    OMP_NUM_THREADS=1 .venv/bin/python bench/kv_memory.py --decode-speed   # what growing the cache costs

Two random Qwen2s from a config: "tiny" (hidden 64, 2 layers, 2 KV heads of 16: 512 bytes of fp32 KV per token)
and "h256" (hidden 256, 4 layers, 2 KV heads of 64: 4096 bytes). Each generate case runs in a fresh process and
reports the peak RSS growth over the call (Linux VmHWM, reset through /proc/self/clear_refs just before it) and the
most bytes the cache's buffers held after any forward of the call or at its end.

Case "stop": 16 prompts of 32 random ids (4 distinct ones, each 4 times, as in a first MemAgent round: the shared
prefill copies each one's cache to its rows, which touches every page), every row stopping after its first token
(every id is an EOS), max_new_tokens 50000 against 64.

Case "server": a server batch of 32 requests, 31 asking for 64 tokens and one for 2048 (prompts of 32 ids, no EOS:
every row runs to its own limit), on h256.

Case "width": the positions per row of a shared prefill against the longest prompt (the width a KV budget
assumes) for 4 prompts sharing a 600-token system prompt (609 tokens each) beside one unrelated 604-token prompt,
and for a MemAgent-shaped round (4 questions x 4 trajectories: a 100-token template, a problem of 40-120 tokens, a
memory of 20-200 tokens, a 256-token chunk).

--decode-speed: greedy decode of 16 prompts of 64 ids x 800 new tokens on h256 (the cache grows 3 times), generated
tokens per second of CPU time, best of 3; run it on two checkouts to compare.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from memagent.model.tiny import TinyModelConfig, random_qwen2  # noqa: E402
from memagent.rollout import SamplingParams, generate  # noqa: E402
from memagent.rollout.prefill import prefill_prompts  # noqa: E402

MODELS = {
    "tiny": TinyModelConfig(hidden_size=64, num_layers=2, intermediate_size=256, vocab_size=512),
    "h256": TinyModelConfig(hidden_size=256, num_layers=4, intermediate_size=1024, vocab_size=32000),
}
GENERATE_CASES = [  # (case, model, max_new_tokens, preallocate_kv)
    ("stop", "tiny", 50000, True), ("stop", "tiny", 50000, False), ("stop", "tiny", 64, True),
    ("stop", "h256", 50000, True), ("stop", "h256", 50000, False), ("stop", "h256", 64, True),
    ("server", "h256", 2048, True), ("server", "h256", 2048, False),
]


def peak_rss_kib() -> int:
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])


def generate_case(case: str, model_name: str, max_new_tokens: int, preallocate_kv: bool) -> str:
    """One generate call in this process; returns 'rss_growth_mb cache_mb'."""
    torch.manual_seed(0)
    model = random_qwen2(MODELS[model_name], eos_token_id=1, pad_token_id=0).eval()
    vocab = model.config.vocab_size
    distinct = torch.randint(3, vocab, (32, 32), generator=torch.Generator().manual_seed(0)).tolist()
    if case == "stop":
        prompts = [p for p in distinct[:4] for _ in range(4)]  # a first round: G = 4 equal prompts per question
        limits, eos = max_new_tokens, list(range(vocab))
    else:
        prompts, limits, eos = distinct, [64] * 31 + [max_new_tokens], None
    seen = []  # the call's cache, as the model's forward receives it
    held = [0]

    def count() -> None:
        tensors = [t for layer in seen[-1].layers for t in (
            (layer.key_buffer, layer.value_buffer) if hasattr(layer, "key_buffer") else (layer.keys, layer.values)
        ) if t is not None]
        held[0] = max(held[0], sum(t.nbytes for t in tensors))

    def after_forward(_module, _args, kwargs, _output) -> None:
        seen.append(kwargs["cache"])
        count()

    model.register_forward_hook(after_forward, with_kwargs=True)
    generate(model, prompts[:2], max_new_tokens=2, eos_token_id=eos, preallocate_kv=preallocate_kv)  # warm up
    held[0] = 0
    open("/proc/self/clear_refs", "w").write("5")
    before = peak_rss_kib()
    generate(model, prompts, max_new_tokens=limits, eos_token_id=eos, preallocate_kv=preallocate_kv)
    count()  # the cache as the call left it: the shared prefill's copies come after the last forward
    return f"{(peak_rss_kib() - before) / 1024:.0f} {held[0] / 2**20:.1f}"


def prefill_width(prompts: list[list[int]]) -> int:
    model = random_qwen2(MODELS["tiny"], eos_token_id=1, pad_token_id=0).eval()
    with torch.no_grad():
        start = prefill_prompts(model, prompts, pad_token_id=0, chunk=0, new_cache=lambda _: DynamicCache(),
                                share_prefill=True, min_shared_prefix=32)
    return start.mask.shape[1]


def ids(n: int, g: torch.Generator) -> list[int]:
    return torch.randint(3, 512, (n,), generator=g).tolist()


def width_cases() -> None:
    g = torch.Generator().manual_seed(0)
    system = ids(600, g)
    mixed = [system + ids(9, g) for _ in range(4)] + [ids(604, g)]
    template = ids(100, g)
    memagent = []
    for _ in range(4):
        problem, chunk = ids(int(torch.randint(40, 121, (1,), generator=g)), g), ids(256, g)
        memagent += [template + problem + ids(int(torch.randint(20, 201, (1,), generator=g)), g) + chunk
                     for _ in range(4)]
    for name, prompts in (("shared system prompt + unrelated prompt", mixed), ("MemAgent-shaped round", memagent)):
        width, longest = prefill_width(prompts), max(map(len, prompts))
        print(f"width | {name}: {width} positions per row, longest prompt {longest} ({width / longest:.2f}x)")


def decode_speed() -> None:
    torch.manual_seed(0)
    model = random_qwen2(MODELS["h256"], eos_token_id=1, pad_token_id=0).eval()
    prompts = torch.randint(3, 32000, (16, 64), generator=torch.Generator().manual_seed(0)).tolist()
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        generate(model, prompts, max_new_tokens=800, eos_token_id=None, params=SamplingParams(temperature=0.0))
        best = min(best, time.process_time() - start)
    print(f"decode | h256, 16 rows x 800 tokens, greedy: {16 * 800 / best:.0f} tok/s (CPU clock, best of 3)")


def main() -> None:
    if sys.argv[1:] == ["--decode-speed"]:
        decode_speed()
        return
    if len(sys.argv) > 1:  # a child process: one generate case
        case, model_name, new_tokens, pre = sys.argv[1:]
        print(generate_case(case, model_name, int(new_tokens), pre == "1"))
        return
    print("case | model | max_new_tokens | preallocate_kv | peak RSS growth MB | cache buffers MB")
    for case, model_name, new_tokens, pre in GENERATE_CASES:
        args = [sys.executable, __file__, case, model_name, str(new_tokens), str(int(pre))]
        rss, cache = subprocess.run(args, capture_output=True, text=True, check=True).stdout.split()
        print(f"{case} | {model_name} | {new_tokens} | {pre} | {rss} | {cache}")
    width_cases()


if __name__ == "__main__":
    main()
