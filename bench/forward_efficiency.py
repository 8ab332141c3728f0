"""How close our forwards run to this machine's limit: FLOP/s against a bare matmul, decode bytes against copy bandwidth.

    OMP_NUM_THREADS=2 .venv/bin/python bench/forward_efficiency.py [--models smollm2 qwen2-0.5b --dtype auto
        --batch 4 --tokens 512 --decode-batch 8 --decode-context 512 --repeats 3]

Three passes per model, each beside its own bound measured in the same run, dtype and thread count:
- prefill: one forward of batch x tokens (logits of the last position only, as the engine's prefill). Its matmul
  FLOPs (2 x the decoder's linear parameters per token, plus 2 x T^2 x width per layer for causal attention)
  over its time, against the FLOP/s of bare matmuls of the same shapes ([B*T, in] @ [in, out] for every linear of
  a layer, timed alone).
- forward+backward: `token_logprobs` over every position and its backward, as the update runs it. 3x the forward's
  FLOPs (the output head over every token included) over its time, against the same bare-matmul FLOP/s.
- decode: one step of decode-batch rows over a decode-context KV cache. Its bytes (every weight once, plus the K/V
  it reads) over its time, against the copy bandwidth of a 256 MiB tensor (bytes read + written per second): a
  decode step is bound by reading the weights, not by arithmetic.
Models: "smollm2" (models/smollm2-135m-instruct from `make smollm2`) and "qwen2-0.5b", a random Qwen2 of
Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads / 2 KV heads, MLP 4864, vocab 151936) built from a config.
--dtype auto: bfloat16 where the CPU has native bf16 matmuls (AVX512-BF16 or AMX) or on a bf16 GPU, else float32;
the models then run under bf16 autocast over fp32 weights, as training does (memagent.model.precision).
The first line names the ISA; the last is `prefill efficiency: X% of matmul peak (dtype)` of the last model.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from memagent.model import load_model  # noqa: E402
from memagent.model.logprobs import token_logprobs  # noqa: E402
from memagent.model.precision import autocast, autocast_dtype, dtype_name  # noqa: E402

SMOLLM2 = ROOT / "models" / "smollm2-135m-instruct"
QWEN_0_5B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768)


def isa() -> str:
    """The widest matrix ISA this machine offers torch: a CUDA device, AMX, AVX512-BF16, AVX512 or AVX2."""
    if torch.cuda.is_available():
        return f"CUDA ({torch.cuda.get_device_name()})"
    flags = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        flags = {w for line in cpuinfo.read_text().splitlines() if line.startswith("flags") for w in line.split()}
    for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX512"), ("avx2", "AVX2")):
        if flag in flags:
            return name
    return torch.backends.cpu.get_cpu_capability()


def best_time(fn, repeats: int) -> float:
    """Best wall time of `repeats` calls after one warm-up (seconds)."""
    fn()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return min(times)


def linear_shapes(model: nn.Module) -> list[tuple[int, int]]:
    """(in, out) of every nn.Linear of the first decoder layer."""
    layer = model.model.layers[0]
    return [(m.in_features, m.out_features) for m in layer.modules() if isinstance(m, nn.Linear)]


def bare_matmul_flops(shapes: list[tuple[int, int]], rows: int, dtype: torch.dtype, device, repeats: int) -> float:
    """FLOP/s of x [rows, in] @ w [in, out] over one layer's linear shapes, each timed alone, in `dtype`."""
    total_flops = total_time = 0.0
    for d_in, d_out in shapes:
        x = torch.randn(rows, d_in, dtype=dtype, device=device)
        w = torch.randn(d_in, d_out, dtype=dtype, device=device)
        total_time += best_time(lambda x=x, w=w: x @ w, repeats)
        total_flops += 2.0 * rows * d_in * d_out
    return total_flops / total_time


def copy_bandwidth(device, repeats: int) -> float:
    """Bytes read + written per second cloning a 256 MiB float32 tensor."""
    x = torch.empty(64 * 2**20, dtype=torch.float32, device=device).uniform_()
    return 2 * x.numel() * 4 / best_time(lambda: x.clone(), repeats)


def forward_flops(model: nn.Module, batch: int, tokens: int, with_head: bool) -> float:
    """Matmul FLOPs of one forward: decoder linears per token, causal attention, the head when asked."""
    cfg = model.config
    layers = cfg.num_hidden_layers
    linear = sum(i * o for i, o in linear_shapes(model)) * layers
    width = cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads)
    attention = 2.0 * tokens * tokens * width * layers  # QK^T and AV over the causal half: 2 x (T^2 / 2) x 2 x width
    head = cfg.hidden_size * cfg.vocab_size if with_head else 0
    return batch * (2.0 * tokens * (linear + head) + attention)


def build(name: str) -> nn.Module | None:
    if name == "smollm2":
        return load_model(SMOLLM2, dtype=torch.float32) if (SMOLLM2 / "config.json").is_file() else None
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**QWEN_0_5B, attn_implementation="sdpa")).eval()


def measure(name: str, args: argparse.Namespace, device, amp: torch.dtype | None) -> float | None:
    model = build(name)
    if model is None:
        print(f"{name}: skipped, {SMOLLM2} not found (run `make smollm2`)", flush=True)
        return None
    model.to(device)
    dtype = amp or torch.float32
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 1000, (args.batch, args.tokens), generator=g).to(device)
    mask = torch.ones_like(ids)
    peak = bare_matmul_flops(linear_shapes(model), args.batch * args.tokens, dtype, device, args.repeats)

    def prefill() -> None:
        with torch.no_grad(), autocast(device, amp):
            model(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=1)

    prefill_rate = forward_flops(model, args.batch, args.tokens, with_head=False) / best_time(prefill, args.repeats)

    train_ids, train_mask = ids[: max(1, args.batch // 2)], mask[: max(1, args.batch // 2)]

    def forward_backward() -> None:
        with autocast(device, amp):
            out = token_logprobs(model, train_ids, train_mask)
        out.logprobs.sum().backward()
        model.zero_grad(set_to_none=True)

    fb_flops = 3 * forward_flops(model, train_ids.shape[0], args.tokens, with_head=True)
    fb_rate = fb_flops / best_time(forward_backward, max(1, args.repeats - 1))

    from transformers import DynamicCache

    context = torch.randint(100, 1000, (args.decode_batch, args.decode_context), generator=g).to(device)
    with torch.no_grad(), autocast(device, amp):
        cache = DynamicCache(config=model.config)
        model(input_ids=context, cache=cache, use_cache=True, logits_to_keep=1)
    step_ids = context[:, -1:]
    positions = torch.full((args.decode_batch, 1), args.decode_context, device=device)

    def decode_step() -> None:
        with torch.no_grad(), autocast(device, amp):
            model(input_ids=step_ids, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
        # The cache grows by one position a call (repeats + 1 in all): negligible beside decode_context.

    weight_bytes = sum(p.numel() for p in model.parameters()) * (2 if amp is not None else 4)
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv_bytes = (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * args.decode_context
                * args.decode_batch * (2 if amp is not None else 4))
    bandwidth = copy_bandwidth(device, args.repeats)
    decode_rate = (weight_bytes + kv_bytes) / best_time(decode_step, args.repeats)
    label = dtype_name(dtype)
    print(f"| {name} | {label} | {prefill_rate / 1e9:.0f} | {fb_rate / 1e9:.0f} | {peak / 1e9:.0f} | "
          f"{100 * prefill_rate / peak:.0f}% | {100 * fb_rate / peak:.0f}% | {decode_rate / 1e9:.1f} | "
          f"{bandwidth / 1e9:.1f} | {100 * decode_rate / bandwidth:.0f}% |", flush=True)
    return prefill_rate / peak


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "qwen2-0.5b"], choices=["smollm2", "qwen2-0.5b"])
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--decode-batch", type=int, default=8)
    parser.add_argument("--decode-context", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    amp = {"float32": None, "bfloat16": torch.bfloat16}.get(args.dtype, autocast_dtype("auto", device))
    print(f"ISA: {isa()}; torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}")
    print(f"prefill {args.batch} x {args.tokens} tokens; forward+backward {max(1, args.batch // 2)} x {args.tokens}; "
          f"decode {args.decode_batch} rows over {args.decode_context} cached tokens\n")
    print("| model | dtype | prefill GFLOP/s | fwd+bwd GFLOP/s | bare matmul GFLOP/s | prefill / matmul | "
          "fwd+bwd / matmul | decode GB/s | copy GB/s | decode / bandwidth |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    efficiency = None
    for name in args.models:
        efficiency = measure(name, args, device, amp) or efficiency
    if efficiency is not None:
        print(f"\nprefill efficiency: {100 * efficiency:.0f}% of matmul peak ({str(amp or torch.float32)[6:]})")


if __name__ == "__main__":
    main()
