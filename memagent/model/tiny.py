"""The tiny offline model: a randomly initialised Qwen2 plus a byte-level BPE tokenizer trained locally.

Tests, demos and benchmarks need a real Hugging Face directory (config, safetensors weights, tokenizer with a
chat template) without downloading anything. `build_tiny_model` writes one in well under a second: the model is
`Qwen2ForCausalLM` built from a config with a seeded random init, and the tokenizer is trained with the
`tokenizers` library on a small built-in corpus (or yours). The special tokens, their roles and the chat template
follow Qwen2.5-Instruct (ChatML, eos `<|im_end|>`, pad `<|endoftext|>`, no bos, a default system prompt), so code
written against the tiny model runs unchanged on Qwen2.5. The weights are random: the model talks nonsense.

CLI: `python -m memagent.model.tiny --out models/tiny`.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# ChatML as Qwen2.5 renders it: a system turn always comes first (the default one when the caller gives none),
# every turn is "<|im_start|>{role}\n{content}<|im_end|>\n", and the generation prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- set rest = messages[1:] %}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\\n' }}"
    "{%- set rest = messages %}"
    "{%- endif %}"
    "{%- for message in rest %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


@dataclass(frozen=True)
class TinyModelConfig:
    """Sizes of the tiny Qwen2 model and its tokenizer."""

    hidden_size: int = 64
    """Width of the residual stream."""
    num_layers: int = 2
    """Number of decoder layers."""
    num_heads: int = 4
    """Query heads per layer (hidden_size must be divisible by it)."""
    num_kv_heads: int = 2
    """Key/value heads per layer (grouped-query attention; num_heads must be divisible by it)."""
    intermediate_size: int = 256
    """Width of the SwiGLU MLP."""
    vocab_size: int = 512
    """Tokenizer and embedding size: 256 bytes + 3 special tokens + learned merges."""
    max_position_embeddings: int = 4096
    """Longest sequence the config advertises (RoPE has no hard limit)."""
    seed: int = 0
    """Seed of the random weight init."""

    def __post_init__(self) -> None:
        minimum = 256 + len(SPECIAL_TOKENS)
        if self.vocab_size < minimum:
            raise ValueError(
                f"vocab_size={self.vocab_size} is too small: pass at least {minimum} (bytes + specials)"
            )
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}: "
                "pass hidden_size divisible by num_heads and num_heads divisible by num_kv_heads"
            )


def default_corpus() -> list[str]:
    """A small English-like corpus with digits, punctuation, unicode and the MemAgent prompt words.

    Deterministic (fixed seed), so the learned merges, and hence token ids, never change between runs.
    """
    base = [
        "You are given a problem, an article section that may contain the answer, and a previous memory.",
        "Read the section and update the memory with new information that helps to answer the problem.",
        "Keep every relevant detail of the previous memory. Updated memory:",
        "Answer the problem from the previous memory and put the answer in \\boxed{}. Your answer:",
        "<problem> What is the special magic number for the river? </problem>",
        "<memory> No previous memory </memory>",
        "<section> The quick brown fox jumps over the lazy dog near the old mill. </section>",
        "The capital of France is Paris. The capital of Japan is Tokyo (東京). Café, naïve, résumé – 🙂.",
        "Question: who wrote the letter, and when did it arrive? Answer: the captain wrote it in 1862.",
        "One, two, three, four, five; six, seven, eight, nine, ten! Numbers like 42, 3.14 and 1,000,000.",
        'She said: "the key is under the blue stone", then she left the house at 7:30 in the morning.',
        "Document 12: the village had a school, a bakery, a library and a small train station.",
        "The answer is \\boxed{42}. Therefore, the answer is the green door on the second floor.",
    ]
    words = (
        "the a an of to in and is was for on with as by at from that this it he she they we you memory problem "
        "section answer question document river city number magic key value name year book letter story "
        "found said wrote read keep update new old previous relevant detail information final"
    ).split()
    rng = random.Random(1234)
    generated = []
    for _ in range(400):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(5, 14)))
        number = rng.randint(0, 99999)
        punct = rng.choice([".", "!", "?", ";", ":", ","])
        generated.append(f"{sentence.capitalize()} {number}{punct}")
    return base * 20 + generated


def train_tokenizer(corpus: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer with the ChatML special tokens and the Qwen2.5-style chat template.

    Ids 0, 1, 2 are `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`; then the 256 byte symbols; then merges.
    Raises ValueError when the corpus is too small to learn `vocab_size` tokens, because a model whose embedding
    table is larger than its tokenizer samples ids that decode to nothing.
    """
    # Qwen2's own pipeline (NFC, its split regex, then bytes): `AutoTokenizer` rebuilds a Qwen2Tokenizer with
    # exactly these steps from the saved vocab and merges, so the trained and the reloaded tokenizer agree.
    tk = Tokenizer(models.BPE())
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(corpus, trainer)
    if tk.get_vocab_size() != vocab_size:
        raise ValueError(
            f"the corpus only supports {tk.get_vocab_size()} tokens, not vocab_size={vocab_size}: "
            "pass a larger corpus or a smaller vocab_size"
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tk,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=1 << 30,
    )


def random_qwen2(cfg: TinyModelConfig, *, eos_token_id: int = 2, pad_token_id: int = 0) -> Qwen2ForCausalLM:
    """A float32 Qwen2ForCausalLM with tied embeddings, randomly initialised from `cfg.seed`.

    The global torch RNG is left untouched. bos = pad = `<|endoftext|>` as in Qwen2.5's config.
    """
    config = Qwen2Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = Qwen2ForCausalLM(config)
    return model.float().eval()


def build_tiny_model(
    out_dir: str | Path,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    vocab_size: int = 512,
    corpus: Iterable[str] | None = None,
    seed: int = 0,
    max_position_embeddings: int = 4096,
) -> Path:
    """Write a tiny Qwen2 model and its tokenizer to `out_dir` (created if needed) and return the path.

    The directory loads with `load_model` / `load_tokenizer` (or plain `from_pretrained`). Same arguments, same
    bytes: the corpus is fixed and the init is seeded.
    """
    cfg = TinyModelConfig(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
        seed=seed,
    )
    tokenizer = train_tokenizer(default_corpus() if corpus is None else corpus, cfg.vocab_size)
    eos, pad = tokenizer.convert_tokens_to_ids([IM_END, ENDOFTEXT])
    model = random_qwen2(cfg, eos_token_id=eos, pad_token_id=pad)
    # Qwen2.5-Instruct stops on either end token; we do the same so `generate` users get the same behaviour.
    model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=[eos, pad], pad_token_id=pad)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Write the tiny offline Qwen2 model and tokenizer to a directory."
    )
    parser.add_argument("--out", required=True, type=Path, help="output directory (created if needed)")
    for field, default in TinyModelConfig.__dataclass_fields__.items():
        flag = "--" + field.replace("_", "-")
        parser.add_argument(flag, type=int, default=default.default, help=f"default {default.default}")
    args = parser.parse_args(argv)
    sizes = {f: getattr(args, f) for f in TinyModelConfig.__dataclass_fields__}
    path = build_tiny_model(args.out, **sizes)
    print(f"wrote tiny model to {path}")


if __name__ == "__main__":
    main()
