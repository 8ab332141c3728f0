"""Load Hugging Face causal LMs and tokenizers from local directories, offline only.

memagent never downloads: every path must be a directory on disk that holds a `config.json` (a model) or the
tokenizer files. `make smollm2` writes the one real pretrained model we can get offline, and
`python -m memagent.model.tiny --out DIR` writes a tiny random one. Anything else (a hub id, a missing path) is
refused with an error that says what to pass.

Defaults, and why:
- dtype None is float32. bfloat16 weights cannot take the ~1e-6 updates of RL fine-tuning (bf16 keeps 8 bits of
  mantissa, so w + 1e-6 * g rounds back to w); ask for "auto" or torch.bfloat16 for inference or mixed precision.
- device None is cuda when available, else cpu.
- The model comes back in eval mode, as `from_pretrained` leaves it; the trainer calls `.train()` itself.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from memagent.model.precision import device_supports_bf16

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
HOW_TO_GET_A_MODEL = (
    "Pass a local model directory: run `make smollm2` (writes models/smollm2-135m-instruct) or "
    "`python -m memagent.model.tiny --out DIR` (a tiny random Qwen2 for tests)."
)
# "org/name" with hub-legal characters: what a user copies from a model card.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`device`, or cuda when available else cpu when it is None."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """Turn a dtype argument into a torch.dtype.

    Accepts a torch.dtype, "float32", "bfloat16", "float16", "auto" or None (float32, see the module docstring).
    "auto" is bfloat16 where bf16 matmuls are native (`device_supports_bf16`: a CUDA device with bf16, a CPU with
    AVX512-BF16 or AMX), else float32: on an AVX2-only CPU bf16 is emulated, and a SmolLM2 prefill runs 5.6x slower
    in it than in float32 (BENCHMARKS.md, "`make smollm2-rl`'s training on an
    AVX2-only CPU").
    """
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device_supports_bf16(device) else torch.float32
    if dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype={dtype!r} is not supported: pass a torch.dtype or one of {[*DTYPES, 'auto']}")


def check_local_dir(path: str | Path, *, need: str = "config.json") -> Path:
    """Return `path` as a Path if it is a directory containing `need`; otherwise raise a helpful error.

    Raises ValueError for a missing path that looks like a hub id ("org/name"), FileNotFoundError for any other
    missing directory or a directory without `need`.
    """
    p = Path(path).expanduser()
    if not p.exists():
        text = str(path)
        first = Path(text.split("/", 1)[0])
        if _HUB_ID.match(text) and not first.is_dir():
            raise ValueError(
                f"{text!r} is not a local directory; it looks like a Hugging Face hub id, but memagent works "
                f"offline and never downloads. {HOW_TO_GET_A_MODEL}"
            )
        raise FileNotFoundError(f"no such directory: {p}. {HOW_TO_GET_A_MODEL}")
    if not p.is_dir():
        raise FileNotFoundError(f"{p} is a file, not a model directory. {HOW_TO_GET_A_MODEL}")
    if not (p / need).is_file():
        raise FileNotFoundError(
            f"{p} has no {need}, so it is not a saved model directory. {HOW_TO_GET_A_MODEL}"
        )
    return p


WEIGHT_FILES = ("*.safetensors", "*.bin")
"""The files of a model directory that hold its weights."""


def weights_fingerprint(path: str | Path, adapter: str | Path | None = None) -> str:
    """The first 16 hex digits of a SHA-256 over the weight files of a local model directory (name, then bytes, in
    name order): equal for byte-identical weights wherever they lie, different for a model trained again into the
    same path. With `adapter` (a LoRA adapter file folded in at load, evaluate.py's `--adapter`) its bytes follow,
    under a fixed name, so a copy of the adapter file anywhere fingerprints the same. Refuses a directory with no
    weight file."""
    directory = Path(path).expanduser()
    files = sorted({f for pattern in WEIGHT_FILES for f in directory.glob(pattern)})
    if not files:
        raise ValueError(f"{directory}: no weight files ({', '.join(WEIGHT_FILES)})")
    named = [(file.name, file) for file in files]
    if adapter is not None:
        named.append(("adapter", Path(adapter).expanduser()))
    digest = hashlib.sha256()
    for name, file in named:
        digest.update(name.encode())
        with file.open("rb") as f:
            while block := f.read(1 << 24):
                digest.update(block)
    return digest.hexdigest()[:16]


def apply_rope_scaling(config: Any, rope_scaling: dict[str, Any]) -> None:
    """Merge a RoPE override (e.g. YaRN) into `config.rope_parameters` in place, then validate it.

    transformers 5 keeps every RoPE setting, rope_theta included, in `config.rope_parameters` (`rope_scaling` is
    a deprecated alias), so the override is merged over the existing dict rather than replacing it: replacing
    would silently reset rope_theta to 10000. Example for Qwen2.5:
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}. The older key "type" is
    accepted for "rope_type".
    """
    override = dict(rope_scaling)
    if "type" in override:
        override.setdefault("rope_type", override.pop("type"))
    if "rope_type" not in override:
        raise ValueError(
            f"rope_scaling={rope_scaling!r} needs a 'rope_type' (e.g. 'yarn', 'linear', 'dynamic')"
        )
    config.rope_parameters = {**(config.rope_parameters or {}), **override}
    config.standardize_rope_params()
    config.validate_rope()


def load_model(
    path: str | Path,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    attn_implementation: str | None = None,
    rope_scaling: dict[str, Any] | None = None,
    gradient_checkpointing: bool = False,
) -> PreTrainedModel:
    """Load a causal LM from a local directory onto `device` in `dtype`.

    Args:
        path: a directory with config.json and weights (see the module docstring for how to make one).
        dtype: torch.dtype, "float32", "bfloat16", "float16", "auto" or None (float32).
        device: torch device or None (cuda if available, else cpu).
        attn_implementation: "sdpa" (transformers' default), "eager", "flash_attention_2", ... or None.
        rope_scaling: RoPE override merged into the config before the weights load (see `apply_rope_scaling`).
        gradient_checkpointing: recompute activations in backward (non-reentrant), and turn the config's
            use_cache off so training forwards build no KV cache.
    """
    directory = check_local_dir(path)
    dev = resolve_device(device)
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    if rope_scaling is not None:
        apply_rope_scaling(config, rope_scaling)
    kwargs: dict[str, Any] = {}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(
        directory, config=config, dtype=resolve_dtype(dtype, dev), local_files_only=True, **kwargs
    )
    if gradient_checkpointing:
        # transformers 5.24 renamed gradient checkpointing to activation checkpointing (the old name warns).
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    return model.to(dev)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer saved in a local directory, set to left padding (what batched generation needs).

    The pad token falls back to the eos token when the tokenizer has none; a tokenizer with neither is refused.
    """
    directory = check_local_dir(path, need="tokenizer_config.json")
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"the tokenizer in {directory} has neither a pad nor an eos token: set one and save it"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
