"""Model layer: offline loading of HF causal LMs and tokenizers, the tiny test model, chunked log-probs."""

from memagent.model.loading import load_model, load_tokenizer
from memagent.model.logprobs import TokenLogprobs, token_logprobs
from memagent.model.tiny import TinyModelConfig, build_tiny_model

__all__ = [
    "TinyModelConfig",
    "TokenLogprobs",
    "build_tiny_model",
    "load_model",
    "load_tokenizer",
    "token_logprobs",
]
