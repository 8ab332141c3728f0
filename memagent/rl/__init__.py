"""Multi-Conv DAPO math: group advantages, the clipped token-level loss, KL, entropy and DAPO shaping.

Pure tensor functions (no model, tokenizer or config objects). The optimizer step, which does take a model, lives in
memagent.rl.step and is imported from there, so `import memagent.rl` stays torch-only (no transformers).
"""

from memagent.rl.advantages import broadcast_to_conversations, group_advantages
from memagent.rl.entropy import entropy_from_logits
from memagent.rl.kl import kl_penalty
from memagent.rl.loss import AGG_MODES, LossMetrics, aggregate, clipped_token_loss, policy_loss
from memagent.rl.shaping import (
    keep_informative_groups,
    overlong_penalty,
    read_cost_penalty,
    write_cost_penalty,
)

__all__ = [
    "AGG_MODES",
    "LossMetrics",
    "aggregate",
    "broadcast_to_conversations",
    "clipped_token_loss",
    "entropy_from_logits",
    "group_advantages",
    "keep_informative_groups",
    "kl_penalty",
    "overlong_penalty",
    "policy_loss",
    "read_cost_penalty",
    "write_cost_penalty",
]
