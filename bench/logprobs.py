"""Peak memory and time of chunked versus naive token log-probs, forward + backward.

Model: a random Qwen2 built from a config (hidden 256, 4 layers, vocab 32000 by default; no tokenizer), batch
B x T random tokens. "naive" is `log_softmax(model(ids).logits.float() / temp)` then gather; "chunked" is
`memagent.model.token_logprobs` (head applied in checkpointed chunks). Both then run `(logp * w).sum().backward()`.

What the memory number measures: the peak memory *above* what was in use just before the first forward (model,
optimizer-free parameters, inputs), over warm-up and timed runs, i.e. activations + logits + gradients.
- CUDA: `torch.cuda.max_memory_allocated()` minus `memory_allocated()` before (the caching allocator's live
  tensors, not reserved blocks).
- CPU: the process's resident-set high-water mark (VmHWM, reset through /proc/self/clear_refs just before the
  first forward) minus the resident set at that moment, with glibc's mmap threshold pinned to 1 MiB
  (MALLOC_MMAP_THRESHOLD_) so that freed tensors leave the resident set: it then tracks live tensor memory.
Each method runs in a fresh subprocess so one cannot inherit the other's allocator state or high-water mark.

Usage: `OMP_NUM_THREADS=2 .venv/bin/python bench/logprobs.py [--batch 2 --tokens 2048 --chunk-tokens 256,512]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

METHODS = ("naive", "chunked")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2, help="rows B")
    parser.add_argument("--tokens", type=int, default=2048, help="sequence length T")
    parser.add_argument("--vocab", type=int, default=32000, help="vocabulary V")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument(
        "--chunk-tokens",
        default="512",
        help="tokens per head chunk; a comma list runs the chunked method for each",
    )
    parser.add_argument("--temperature", type=float, default=0.7, help="softmax temperature")
    parser.add_argument(
        "--repeats", type=int, default=2, help="timed forward+backward runs after one warm-up"
    )
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when available)")
    parser.add_argument(
        "--layer-checkpointing",
        type=int,
        choices=(0, 1),
        default=1,
        help="1: recompute decoder layers in backward (as training does), so the head's memory shows; 0: keep them",
    )
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _rss_kib(field: str) -> int:
    """A memory field ('VmRSS' or 'VmHWM') of this process from /proc/self/status, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status (this benchmark's CPU mode needs Linux)")


class PeakMemory:
    """Peak bytes in use above the level at `start()`, for one device (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            Path("/proc/self/clear_refs").write_text("5")  # "5" resets VmHWM to the current RSS
            self.base = _rss_kib("VmRSS") * 1024

    def peak_bytes(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - self.base
        return _rss_kib("VmHWM") * 1024 - self.base


def run_worker(args: argparse.Namespace) -> dict:
    """Build the model, run warm-up + timed forward/backward passes of one method, return its figures."""
    from memagent.model.logprobs import token_logprobs
    from memagent.model.tiny import TinyModelConfig, random_qwen2

    device = torch.device(args.device)
    cfg = TinyModelConfig(
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=4 * args.hidden,
        vocab_size=args.vocab,
        max_position_embeddings=max(4096, args.tokens),
    )
    model = random_qwen2(cfg).to(device).train()
    if args.layer_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.batch, args.tokens), generator=g).to(device)
    mask = torch.ones_like(ids)
    weights = torch.randn(ids.shape, generator=g).to(device)

    def step() -> None:
        if args.worker == "naive":
            z = model(input_ids=ids, attention_mask=mask).logits.float() / args.temperature  # [B, T, V]
            logp = torch.log_softmax(z[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            loss = (logp * weights[:, 1:]).sum()
        else:
            out = token_logprobs(
                model, ids, mask, temperature=args.temperature, chunk_tokens=int(args.chunk_tokens)
            )
            loss = (out.logprobs * weights).sum()
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    memory = PeakMemory(device)
    memory.start()
    step()  # warm-up; also allocates the parameter gradients that the timed runs reuse
    times = []
    for _ in range(args.repeats):
        model.zero_grad(set_to_none=False)
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"method": args.worker, "peak_mib": memory.peak_bytes() / 2**20, "seconds": min(times)}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.worker:
        print(json.dumps(run_worker(args)))
        return
    # Every setting, spelled out again for the worker (argparse dest "chunk_tokens" is flag "--chunk-tokens").
    base = {k: v for k, v in vars(args).items() if k not in ("worker", "chunk_tokens")}
    settings = [f"--{k.replace('_', '-')}={v}" for k, v in base.items()]
    runs = [("naive", None)] + [("chunked", int(c)) for c in args.chunk_tokens.split(",")]
    # A fixed glibc mmap threshold: every tensor over 1 MiB gets its own mapping and leaves the RSS when freed.
    # Without it glibc raises the threshold after each large free, later chunks land in the heap and the RSS
    # keeps freed memory (we measured 1284 instead of 484 MiB for 256-token chunks).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    results = []
    for method, chunk in runs:
        cmd = [sys.executable, __file__, *settings, f"--chunk-tokens={chunk or 1}", f"--worker={method}"]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{method} worker failed:\n{done.stderr[-3000:]}")
        results.append(
            (method if chunk is None else f"chunked/{chunk}", json.loads(done.stdout.splitlines()[-1]))
        )
    print(
        f"device={args.device} threads={torch.get_num_threads()} B={args.batch} T={args.tokens} V={args.vocab} "
        f"hidden={args.hidden} layers={args.layers} layer_checkpointing={args.layer_checkpointing} "
        f"temperature={args.temperature} (forward + backward, best of {args.repeats} after a warm-up)"
    )
    naive = results[0][1]
    print(f"{'method':<14} {'peak MiB':>9} {'seconds':>8} {'memory naive/x':>15} {'time x/naive':>13}")
    for label, r in results:
        print(
            f"{label:<14} {r['peak_mib']:>9.0f} {r['seconds']:>8.2f} {naive['peak_mib'] / r['peak_mib']:>14.1f}x"
            f" {r['seconds'] / naive['seconds']:>12.2f}x"
        )


if __name__ == "__main__":
    main()
