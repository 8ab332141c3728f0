"""A compiled fast path for the decoder's elementwise work: each MLP and RMSNorm under `torch.compile` (issue 22).

Why these modules and not whole decoder layers. On a CPU with native bf16, matmuls run several times faster than in
float32 while RMSNorm (square, mean, rsqrt, scale), SwiGLU (silu, multiply) and the dtype casts around them run at
memory speed, one pass over the activations per op; fusing each block's chain into one kernel is what inductor
does well. Whole layers compile badly here: a layer's attention updates the KV cache (the rollout's, and the shared
prompt prefix of the training forwards, memagent.model.shared_prefix), and dynamo guards on each layer's cache
index, so every one of the L layers compiles its own graph (SmolLM2's 30: about 4 minutes on one CPU thread before
the first step). The MLP and norm modules hold no cache, share one source, and compile into a graph or two for all
layers. Attention stays eager, where SDPA is already a fused kernel.

Measured on a 2-core AMD EPYC (Zen 4, AVX512-BF16, no AMX), one thread, SmolLM2-135M (BENCHMARKS.md, "A compiled
fast path"): it does not pay there. An isolated bf16 forward+backward gains 1.08x, but a whole RL step is 1.01x in
fp32 and slower in bf16 (the rollout's decode loses more than the update gains), after 50-80 s of compilation. It
is off by default (`model.compile`), for CPUs with AMX and GPUs, where elementwise work is most of the forward; the
eager model stays the reference: the compiled one must equal it (tests/model/test_compiled.py checks log-probs, gradients
and greedy generation against `model.generate` in float32).
"""

from __future__ import annotations

from torch import nn

COMPILED_SUFFIXES = ("MLP", "RMSNorm")
"""Class-name endings of the modules compiled: the HF Llama family's names (LlamaMLP, Qwen2RMSNorm, MistralMLP...)."""


def elementwise_modules(model: nn.Module) -> list[nn.Module]:
    """The modules `compile_elementwise` compiles: every submodule whose class name ends in MLP or RMSNorm."""
    return [m for m in model.modules() if type(m).__name__.endswith(COMPILED_SUFFIXES)]


def compile_elementwise(model: nn.Module) -> int:
    """Wrap each MLP and RMSNorm of `model` in `torch.compile(dynamic=True)`, in place; returns how many.

    Compilation is lazy: it happens in the first forward (and once more when a shape first varies), so the call
    itself is cheap. Dynamic shapes, because every micro-batch and decode step has its own length. Raises
    ValueError when the model has no such module (an architecture outside the Llama family's naming).
    """
    modules = elementwise_modules(model)
    if not modules:
        raise ValueError(f"model.compile: {type(model).__name__} has no module whose class name ends in "
                         f"{' or '.join(COMPILED_SUFFIXES)}; run it eager (--model.compile false)")
    for module in modules:
        module.compile(dynamic=True)
    return len(modules)
