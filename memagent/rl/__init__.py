"""Multi-Conv DAPO math: group advantages, the clipped token-level loss, KL, entropy and DAPO shaping.

Pure tensor functions (no model, tokenizer or config objects); the optimizer step lives in memagent.rl.step.
"""

from memagent.rl.advantages import broadcast_to_conversations, group_advantages
from memagent.rl.entropy import entropy_from_logits
from memagent.rl.kl import kl_penalty
from memagent.rl.loss import AGG_MODES, LossMetrics, aggregate, clipped_token_loss, policy_loss
from memagent.rl.shaping import keep_informative_groups, overlong_penalty
from memagent.rl.step import (
    TrainRow,
    accumulate_gradients,
    global_counts,
    pack_by_token_budget,
    response_logprobs,
    split_mini_batches,
)

__all__ = [
    "AGG_MODES",
    "LossMetrics",
    "TrainRow",
    "accumulate_gradients",
    "global_counts",
    "pack_by_token_budget",
    "response_logprobs",
    "split_mini_batches",
    "aggregate",
    "broadcast_to_conversations",
    "clipped_token_loss",
    "entropy_from_logits",
    "group_advantages",
    "keep_informative_groups",
    "kl_penalty",
    "overlong_penalty",
    "policy_loss",
]
