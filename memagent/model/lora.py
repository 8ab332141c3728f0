"""LoRA from scratch (Hu et al., arXiv 2106.09685): low-rank adapters on the linear layers of an HF causal LM.

A frozen linear layer W (out x in) gets a trainable update of rank r:

    y = x W^T + b + (alpha / r) * dropout(x) A^T B^T        A: [r, in] (Kaiming-uniform), B: [out, r] (zeros)

B starts at zero, so an adapted model computes exactly what the base model did until the first update. Only A and B
train: a 7B policy then needs optimizer state for a few million parameters instead of seven billion, which is what
single-GPU users of MemAgent ask for.

- `apply_lora(model, rank=..., alpha=..., target_modules=...)` swaps the matching `nn.Linear` modules (by the last
  component of their name: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj) for `LoRALinear` and
  freezes every other parameter.
- `merge_lora(model)` folds W + (alpha / r) B A back into plain `nn.Linear` modules: the result saves with
  `save_pretrained` as an ordinary HF checkpoint that transformers loads alone.
- `merged_state_dict(model, dtype=torch.float32)`: the state dict of the merged model, built without touching the
  adapted one (a training run saves it as a plain HF checkpoint and keeps training). float32 by default whatever
  the base's dtype: rounding W + (alpha / r) B A to a bf16 base's dtype loses most of a small update.
- `rounding_loss(model, dtype)`: the fraction of the adapters' update that rounding the merged weights to dtype loses
  (about 77% for an update of 0.1% of |W| in bf16, 16% for 1%).
- `adapter_state_dict(model)` / `load_adapter_state_dict(model, state)`: adapter-only checkpoints (A and B of every
  adapted layer, keyed by module name), restored bit for bit; `save_adapters` / `load_adapters` write and read them
  as one safetensors file that records rank and alpha.
- `AdaptersOff(model)`: the adapted model with every adapter bypassed, i.e. exactly the base model, sharing its
  weights (the KL reference of a LoRA run costs no second copy of the model).
- `merge_adapter_file(model, file)`: a base model with a `save_adapters` file folded in, rank, alpha and adapted
  layers read from the file (how evaluate.py's `--adapter` scores a policy kept as its adapters alone).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The attention and MLP projections of Llama / Qwen2-style decoders."""


class LoRALinear(nn.Module):
    """A frozen `nn.Linear` plus a trainable rank-r update; same call signature as the layer it wraps."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.base = base.requires_grad_(False)
        self.rank, self.alpha = rank, alpha
        self.scaling = alpha / rank
        weight = base.weight
        # Adapters are kept in float32 whatever the base dtype: they are the trained (master) parameters.
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, device=weight.device, dtype=torch.float32))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, device=weight.device, dtype=torch.float32))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))  # nn.Linear's own init for the down-projection
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.enabled = True  # False: the layer computes its base layer alone (adapters_disabled)

    def forward(self, x: Tensor) -> Tensor:
        """x: [..., in] -> [..., out] in the dtype of the base layer's output."""
        out = self.base(x)
        if not self.enabled:
            return out
        update = self.dropout(x).to(self.lora_a.dtype) @ self.lora_a.t() @ self.lora_b.t()  # [..., out]
        return out + (self.scaling * update).to(out.dtype)

    def merged_weight(self, dtype: torch.dtype | None = None) -> Tensor:
        """W + (alpha / r) B A, [out, in], summed in float32 and returned in `dtype` (None: the base weight's)."""
        delta = (self.lora_b @ self.lora_a) * self.scaling
        return (self.base.weight.float() + delta).to(dtype or self.base.weight.dtype)


def _targets(model: nn.Module, target_modules: Iterable[str]) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute name, linear layer) of every nn.Linear whose name ends in one of target_modules."""
    wanted = set(target_modules)
    found = []
    for module in model.modules():
        for child_name, child in module.named_children():
            if isinstance(child, nn.Linear) and child_name in wanted:
                found.append((module, child_name, child))
    return found


def apply_lora(
    model: nn.Module, *, rank: int, alpha: float, target_modules: Iterable[str] = DEFAULT_TARGETS,
    dropout: float = 0.0,
) -> nn.Module:
    """Wrap the target linear layers of `model` in place and freeze everything else; returns `model`.

    Raises ValueError when a name of target_modules matches no nn.Linear (a typo would leave that layer frozen).
    """
    targets = list(target_modules)
    found = _targets(model, targets)
    # Every name must match: a typo in one of seven names would otherwise silently leave that projection frozen.
    unmatched = sorted(set(targets) - {child_name for _, child_name, _ in found})
    if unmatched:
        linears = sorted({n.rpartition(".")[2] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(f"LoRA target_modules {unmatched} match no nn.Linear of {type(model).__name__} "
                         f"(its linear layers: {linears})")
    model.requires_grad_(False)
    for parent, child_name, linear in found:
        setattr(parent, child_name, LoRALinear(linear, rank, alpha, dropout))
    return model


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """Every LoRALinear of the model, by module name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every LoRALinear by a plain nn.Linear holding the merged weight (in place); returns `model`.

    The merged layers keep the base's dtype so that the model still runs: over a bf16 base that rounds the update
    (see `rounding_loss`); `merged_state_dict` gives the exact float32 weights instead.
    """
    for name, module in lora_modules(model).items():
        parent_name, _, child_name = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        base = module.base
        merged = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None,
                           device=base.weight.device, dtype=base.weight.dtype)
        with torch.no_grad():
            merged.weight.copy_(module.merged_weight())
            if base.bias is not None:
                merged.bias.copy_(base.bias)
        setattr(parent, child_name, merged)
    return model


def adapter_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """{"<module>.lora_a": [r, in], "<module>.lora_b": [out, r]} float32 copies of every adapter."""
    state = {}
    for name, module in lora_modules(model).items():
        state[f"{name}.lora_a"] = module.lora_a.detach().clone()
        state[f"{name}.lora_b"] = module.lora_b.detach().clone()
    return state


def load_adapter_state_dict(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Copy adapter weights into an already adapted model; the key sets must match exactly."""
    modules = lora_modules(model)
    expected = {f"{n}.{p}" for n in modules for p in ("lora_a", "lora_b")}
    if set(state) != expected:
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(f"adapter checkpoint does not match the model: missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]} (check lora rank and target_modules)")
    with torch.no_grad():
        for key, value in state.items():
            name, _, param = key.rpartition(".")
            target = getattr(modules[name], param)
            if target.shape != value.shape:
                raise ValueError(f"adapter {key}: shape {tuple(value.shape)} != model {tuple(target.shape)}")
            target.copy_(value)


@torch.no_grad()
def merged_state_dict(
    model: nn.Module, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
) -> dict[str, Tensor]:
    """The state dict of the merged model in `dtype`, leaving `model` as it is.

    Every floating-point tensor comes back in `dtype` on `device`; merged weights are summed in float32, built one
    layer at a time and cast once (a GPU holds one extra layer, not a second model). A tensor already in `dtype` on
    `device` is the model's own, and tensors that share storage (tied embeddings) still share it after the cast, so
    save_pretrained writes them once. float32 of a bf16 model takes twice its size in host memory.
    """
    state = model.state_dict()
    for name, module in lora_modules(model).items():
        del state[f"{name}.lora_a"], state[f"{name}.lora_b"]
        for key, value in module.base.state_dict().items():
            del state[f"{name}.base.{key}"]
            state[f"{name}.{key}"] = module.merged_weight(dtype).to(device) if key == "weight" else value
    cast: dict[int, Tensor] = {}  # by storage: tied tensors are cast once and stay one tensor
    for key, value in state.items():
        if value.is_floating_point():
            pointer = value.untyped_storage().data_ptr()
            state[key] = cast.setdefault(pointer, value.to(device=device, dtype=dtype))
    return state


@torch.no_grad()
def rounding_loss(model: nn.Module, dtype: torch.dtype) -> float:
    """|round_dtype(W + U) - (W + U)| / |U| over every adapted layer (Frobenius norms), U = (alpha / r) B A.

    The share of the adapters' update that a merged model stored in `dtype` does not hold: near 0 in float32, most
    of a small update in bf16 (8 bits of mantissa: an update below W's half-ulp rounds back to W). 0 without
    adapters or while B = 0.
    """
    error = total = 0.0
    for module in lora_modules(model).values():
        update = (module.lora_b.double() @ module.lora_a.double()) * module.scaling  # [out, in]
        exact = module.base.weight.double() + update
        error += float((module.merged_weight(dtype).double() - exact).square().sum())
        total += float(update.square().sum())
    return (error / total) ** 0.5 if total > 0 else 0.0


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Within the context every LoRALinear of `model` computes its base layer alone."""
    modules = list(lora_modules(model).values())
    for module in modules:
        module.enabled = False
    try:
        yield model
    finally:
        for module in modules:
            module.enabled = True


class AdaptersOff(nn.Module):
    """The base model of an adapted model: its forward runs the adapted model with every adapter bypassed.

    The adapted model is registered as `module`, like DDP's wrapped model, so helpers that look through wrappers
    (memagent.model.logprobs finds the output head there) see the real model.
    """

    def __init__(self, adapted: nn.Module) -> None:
        super().__init__()
        self.module = adapted

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with adapters_disabled(self.module):
            return self.module(*args, **kwargs)


def save_adapters(model: nn.Module, file: str | Path) -> None:
    """adapter_state_dict(model) as one safetensors file, with each layer's rank and alpha in its metadata."""
    modules = list(lora_modules(model).values())
    meta = {"rank": str(modules[0].rank), "alpha": repr(modules[0].alpha)} if modules else {}
    save_file(adapter_state_dict(model), str(file), metadata=meta)


def load_adapters(model: nn.Module, file: str | Path) -> None:
    """Load a `save_adapters` file into an adapted model; refuses another rank, alpha or set of layers."""
    module = next(iter(lora_modules(model).values()), None)
    if module is not None:
        # Compared as numbers: a file saved with alpha 16 holds the text "16", read back as 16.0.
        rank, alpha, _ = adapter_file_settings(file)
        if (rank, alpha) != (module.rank, float(module.alpha)):
            raise ValueError(f"{file}: adapters of rank {rank} alpha {alpha}, the model has rank {module.rank} "
                             f"alpha {module.alpha}")
    load_adapter_state_dict(model, load_file(str(file)))


def adapter_file_settings(file: str | Path) -> tuple[int, float, tuple[str, ...]]:
    """(rank, alpha, target module names) of a `save_adapters` file, read from its metadata and keys.

    Raises ValueError naming the file when it is not one (no rank / alpha metadata, or no adapter keys)."""
    with safe_open(str(file), framework="pt", device="cpu") as f:
        meta, keys = f.metadata() or {}, list(f.keys())
    targets = tuple(sorted({key.rsplit(".", 2)[-2] for key in keys if key.endswith((".lora_a", ".lora_b"))}))
    if "rank" not in meta or "alpha" not in meta or not targets:
        raise ValueError(f"{file}: not an adapter file written by save_adapters (metadata {meta}, {len(keys)} "
                         "tensors); a LoRA checkpoint keeps it as adapter.safetensors")
    return int(meta["rank"]), float(meta["alpha"]), targets


def merge_adapter_file(model: nn.Module, file: str | Path) -> nn.Module:
    """Fold the adapters of a `save_adapters` file into `model` (in place; returns it): apply_lora with the file's
    rank, alpha and layers, load the file, merge_lora.

    The merge keeps the model's dtype, so pass a float32 base for the exact W + (alpha / r) B A (what a LoRA run
    saves as its `model/`, memagent.training.checkpoint) and cast afterwards. Raises ValueError when the file's
    layers do not match the model's (another architecture or another base)."""
    rank, alpha, targets = adapter_file_settings(file)
    apply_lora(model, rank=rank, alpha=alpha, target_modules=targets)
    load_adapters(model, file)
    return merge_lora(model)
