"""Mixed precision: fp32 master weights, bf16 autocast for the forward passes where the hardware runs it fast.

Why. Parameters kept in bfloat16 cannot take RL fine-tuning updates: bf16 has 8 bits of mantissa, so at lr 1e-6
AdamW's step (about lr per weight) rounds back to the weight and the model never changes. The fix is the usual
mixed-precision recipe: parameters, gradients and optimizer states stay float32 (the "master weights"), and the
forward passes run under `torch.autocast(device_type, torch.bfloat16)`, which casts the matmul inputs to bf16 on
the fly. Everything the loss depends on beyond the matmuls stays float32: the log-softmax of the output head
(memagent.model.logprobs upcasts the logits), the ratios, clipping and the token normalizer (memagent.rl.loss),
and the sampler's softmax (memagent.rollout.sampling upcasts too). Under DeepSpeed its own bf16 section keeps the
fp32 master copy, so bf16 parameter storage is allowed there, and under LoRA, whose frozen base takes no updates and
whose adapters stay float32 (see `storage_dtype`).

Where bf16 pays: CUDA devices that support it, and CPUs with native bf16 matmuls (AVX512-BF16 or AMX; a bf16
matmul runs about 2.2x an fp32 one on an avx512_bf16 CPU). On other CPUs bf16 is emulated and slower than fp32,
so `model.autocast: auto` leaves it off there; `bfloat16` forces it and `off` disables it everywhere.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache
from pathlib import Path

import torch

AUTOCAST_MODES = ("auto", "bfloat16", "off")
STORAGE_DTYPES = ("auto", "float32", "bfloat16")
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of CPUs with native bf16 matmuls."""


def cpu_flags_support_bf16(flags: set[str]) -> bool:
    """True when a CPU with these /proc/cpuinfo flags multiplies bf16 natively (AVX512-BF16 or AMX-BF16)."""
    return any(flag in flags for flag in CPU_BF16_FLAGS)


@lru_cache(maxsize=1)
def cpu_supports_bf16() -> bool:
    """Whether this machine's CPU has native bf16 matmuls: its /proc/cpuinfo flags (Linux), and oneDNN agreeing.

    Without /proc/cpuinfo (macOS, Windows) the answer is False: `model.autocast: bfloat16` still forces it.
    """
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return False
    flags = {word for line in cpuinfo.read_text().splitlines() if line.startswith("flags") for word in line.split()}
    return cpu_flags_support_bf16(flags) and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def device_supports_bf16(device: torch.device) -> bool:
    """bf16 autocast pays on this device: a CUDA device with bf16 support, or a CPU with native bf16 matmuls."""
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return cpu_supports_bf16()
    return False


def autocast_dtype(mode: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `model.autocast` = mode on `device`, or None for no autocast.

    mode: "auto" (bfloat16 where `device_supports_bf16`, else off), "bfloat16" (always) or "off".
    """
    if mode not in AUTOCAST_MODES:
        raise ValueError(f"model.autocast={mode!r}: expected one of {AUTOCAST_MODES}")
    if mode == "off":
        return None
    if mode == "bfloat16" or device_supports_bf16(device):
        return torch.bfloat16
    return None


def storage_dtype(mode: str, device: torch.device, *, deepspeed: bool, frozen_base: bool = False) -> torch.dtype:
    """The dtype the model's parameters are stored in, for `model.dtype` = mode.

    "float32" always; "auto": bfloat16 under DeepSpeed on a device that supports it (its bf16 section keeps fp32
    master weights), else float32; "bfloat16" only under DeepSpeed or with a frozen base (LoRA: the base takes no
    updates and the adapters are float32): plain AdamW on bf16 tensors drops updates below the weights' bf16
    resolution (all of them at lr 1e-6), so it is refused otherwise with what to pass.
    """
    if mode not in STORAGE_DTYPES:
        raise ValueError(f"model.dtype={mode!r}: expected one of {STORAGE_DTYPES}")
    if mode == "float32":
        return torch.float32
    if mode == "auto":
        cuda_bf16 = device.type == "cuda" and device_supports_bf16(device)
        return torch.bfloat16 if deepspeed and cuda_bf16 else torch.float32
    if not (deepspeed or frozen_base):
        raise ValueError(
            "model.dtype=bfloat16 without DeepSpeed would train bf16 weights with no fp32 master copy (AdamW "
            "updates below the bf16 resolution vanish): pass --model.dtype float32 (bf16 compute comes from "
            "--model.autocast), run with --deepspeed, or train LoRA adapters (--model.lora-rank N) over a frozen bf16 base"
        )
    return torch.bfloat16


def training_autocast(mode: str, device: torch.device, parameter_dtype: torch.dtype) -> torch.dtype | None:
    """The autocast dtype for training forwards: none when the parameters are already low precision."""
    return autocast_dtype(mode, device) if parameter_dtype == torch.float32 else None


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16": the spelling of `--dtype` and of records."""
    return str(dtype).removeprefix("torch.")


def arithmetic_name(parameter_dtype: torch.dtype, autocast_dtype: torch.dtype | None) -> str:
    """How a run's forwards compute, in words for checkpoints and warnings: "float32", or "float32 weights,
    bfloat16 autocast"."""
    weights = dtype_name(parameter_dtype)
    return weights if autocast_dtype is None else f"{weights} weights, {dtype_name(autocast_dtype)} autocast"


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """`torch.autocast(device.type, dtype)`, or a no-op context when dtype is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
