r"""Answer verifiers: pure string functions from a model response and gold answers to a score.

- Training reward (strict): `strict_reward`, the last `\boxed{...}` equals a gold exactly (docs/workflow.md, Verifiers);
  the lenient training option `contained_reward` (a gold inside the extracted answer).
- Evaluation (lenient): `normalize_answer`, `exact_match`, `f1_score`, `sub_exact_match` (HotpotQA / SQuAD
  rules) and `lenient_reward` (extract an answer, then sub-exact-match).
- Per task family: `task_reward` (string_match_all for RULER-style tasks, `contained_reward` for QA), the
  training verifier `task` of a task mix.
- RULER: `string_match_all`, `string_match_part` per sample; batch means live in `memagent.verify.ruler`.
"""

from memagent.verify.by_task import is_retrieval_task, task_reward
from memagent.verify.extract import extract_boxed
from memagent.verify.lenient import contained_reward, lenient_reward
from memagent.verify.qa_metrics import exact_match, f1_score, normalize_answer, sub_exact_match
from memagent.verify.ruler import string_match_all, string_match_part
from memagent.verify.strict import strict_reward

__all__ = [
    "extract_boxed",
    "strict_reward",
    "normalize_answer",
    "exact_match",
    "f1_score",
    "sub_exact_match",
    "lenient_reward",
    "contained_reward",
    "string_match_all",
    "string_match_part",
    "is_retrieval_task",
    "task_reward",
]
