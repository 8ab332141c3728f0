"""Named presets: `tiny` (the embedded demo: what `python train.py` runs without a model path), `tiny-gates` and
`tiny-4chunks` (the demo with gated memory and its ungated twin, docs/gates.md), `smoke` (tests, seconds),
`qwen2.5-7b` (paper scale, DAPO recipe: the schema defaults plus the model and data files), `memagent-release` (paper
scale, MemAgent's released recipe), `smollm2` / `smollm2-release` (SmolLM2-135M on a CPU under each of the two loss
recipes), `smollm2-mix` (SmolLM2-135M on a mix of four tasks) and `smollm2-mix-gates` / `smollm2-mix-gates-cost`
(the same with gated memory, docs/gates.md).

A preset is a nested dict of overrides on the dataclass defaults, so `--config FILE` and command-line flags apply on
top of it with the same rules. The defaults are MemAgent's 7B run (run_memory_7B.sh) except where DAPO is our
contract (docs/rl-math.md §5): clip_high 0.28, dual clip 10, std-scaled advantages, dynamic sampling and overlong
shaping on, no KL.
"""

from __future__ import annotations

from typing import Any

Preset = dict[str, dict[str, Any]]

# The embedded demo (docs/demo.md): a 0.1M-parameter model built offline, code_lookup over 32-token chunks, compact
# pretraining and SFT from a forgetful teacher, then 50 RL steps of 8 questions x G 8.
TINY: Preset = {
    "demo": {"enabled": True},
    "model": {"autocast": "off"},
    "workflow": {"chunk_tokens": 32, "memory_tokens": 10, "answer_tokens": 8, "max_chunks": 8, "question_tokens": 64},
    "rollout": {"batch_size": 8, "group_size": 8, "overlong_cache_tokens": 4},
    "optim": {"lr": 3e-4, "warmup_steps": 2, "weight_decay": 0.0, "mini_batches": 2, "micro_batch_tokens": 8192},
    "data": {"task": "code_lookup", "train_chunks": 2, "num_train": 4000, "num_eval": 64, "eval_chunk_factors": (1, 4)},
    "eval": {"every": 0, "temperature": 0.0, "top_p": 1.0},
    "run": {"steps": 50, "output_dir": "runs/tiny", "save_every": 10, "trace_every": 10},
}


def _on(base: Preset, **sections: dict[str, Any]) -> Preset:
    """`base` with some fields of some sections replaced."""
    return {name: {**base.get(name, {}), **sections.get(name, {})} for name in {*base, *sections}}


# Gated memory on the embedded demo (docs/gates.md, "The demo"; `make demo-gates`): the tiny recipe with both gates,
# 4-chunk training documents (a needle in one chunk of four, so three of four updates have nothing to write) and both
# efficiency terms on: reward - 0.2 x chunks read / chunks in the document - 0.5 x memory tokens written / (10 x chunks
# in the document), groups filtered on the total reward. Held out at 1x, 4x, 16x and 64x the training length (4 to
# 256 chunks). The warm start's teacher gates by the rule on 80% of its decisions and blindly otherwise
# (demo.teacher_informed 0.8): its imitation keeps on chunks without the needle but never exits, and RL learns the
# exit. From a blind teacher RL trained the gates away, and from one right half the time it learned the update gate
# in one seed of three (docs/gates.md). Its ungated twin, `tiny-4chunks`, differs only in the gates, their costs and
# the teacher's decisions: the like-for-like comparison. Both take advantages as R - mean (loss.scale_by_std False, as
# MemAgent's released runs): divided by the group's spread, the small cost differences inside an all-correct group
# became full-size advantages on every token, answers included, and a gated seed collapsed (docs/gates.md). Both
# train at half the demo's learning rate: at 3e-4 a gated seed whose warm start was already right drifted (entropy
# 0.2 -> 0.8) and collapsed at step 48; at 1.5e-4 all three gated seeds and all three twins end at 100%.
TINY_4CHUNKS: Preset = _on(TINY, data={"train_chunks": 4, "eval_chunk_factors": (1, 4, 16, 64)},
                           optim={"lr": 1.5e-4}, loss={"scale_by_std": False}, run={"output_dir": "runs/tiny-4chunks"})
TINY_GATES: Preset = _on(TINY_4CHUNKS, workflow={"gates": "both"},
                         rollout={"read_cost": 0.2, "write_cost": 0.5, "filter_on": "reward"},
                         demo={"teacher_informed": 0.8}, run={"output_dir": "runs/tiny-gates"})


PRESETS: dict[str, Preset] = {
    "tiny": TINY,
    "tiny-4chunks": TINY_4CHUNKS,
    "tiny-gates": TINY_GATES,
    # Two RL steps of a 2-layer model on 2-chunk documents, no warm start: seconds on a CPU, for tests.
    "smoke": _on(
        TINY,
        demo={"model_dir": "runs/smoke/model", "hidden_size": 32, "num_layers": 2, "intermediate_size": 64,
              "vocab_size": 512, "steps": 0, "pretrain_steps": 0},
        workflow={"chunk_tokens": 48, "memory_tokens": 8, "answer_tokens": 12},
        rollout={"batch_size": 2, "group_size": 4, "dynamic_sampling": False, "max_refill_rounds": 1},
        optim={"lr": 1e-3, "warmup_steps": 0, "mini_batches": 1, "micro_batch_tokens": 4096},
        data={"num_train": 16, "num_eval": 4},
        run={"steps": 2, "output_dir": "runs/smoke", "save_every": 1, "trace_every": 1, "progress": False},
    ),
    # SmolLM2-135M-Instruct on this 2-core CPU (`make smollm2-rl`, docs/evaluation.md): niah_single_1 at 512 tokens
    # (2 chunks of 256), 8 questions x G 4 and two updates of 16 trajectories per step (one seed of the first
    # recipe, 4 questions and 4 updates per step, peaked and fell back: more rollouts per step, fewer off-policy
    # updates per rollout). Lenient reward: the untrained model never boxes its answer, so the strict verifier would
    # give all-zero groups; the answer budget leaves 16 tokens of overlong ramp. micro_batch_tokens 2048 keeps the
    # update near 6 GB (4096 took 12 GB without checkpointing; the sum is exact either way). No in-run held-out
    # evaluation: evaluate.py scores the checkpoint on questions of another seed (--data-seed 1).
    "smollm2": {
        "model": {"path": "models/smollm2-135m-instruct"},
        "workflow": {"chunk_tokens": 256, "memory_tokens": 64, "answer_tokens": 32, "max_chunks": 8,
                     "question_tokens": 64},
        "rollout": {"batch_size": 8, "group_size": 4, "verifier": "lenient", "overlong_cache_tokens": 16,
                    "max_refill_rounds": 2},
        "optim": {"lr": 4e-5, "warmup_steps": 4, "weight_decay": 0.0, "mini_batches": 2, "micro_batch_tokens": 2048},
        "data": {"task": "niah_single_1", "train_chunks": 2, "num_train": 512, "num_eval": 0,
                 "eval_chunk_factors": ()},
        "eval": {"every": 0, "temperature": 0.0, "top_p": 1.0},
        "run": {"steps": 8, "output_dir": "runs/smollm2", "save_every": 1, "trace_every": 1},
    },
    # MemAgent 7B (arXiv 2507.02259; run_memory_7B.sh): 128 questions x 16 rollouts, 16 updates per step.
    "qwen2.5-7b": {
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct", "dtype": "auto", "gradient_checkpointing": True},
        "workflow": {"chunk_tokens": 5000, "memory_tokens": 1024, "answer_tokens": 1024, "max_chunks": 8,
                     "question_tokens": 1024},
        "rollout": {"batch_size": 128, "group_size": 16, "temperature": 1.0, "top_p": 1.0,
                    "overlong_cache_tokens": 256, "max_batch_rows": 256, "kv_cache_budget_gb": 40.0,
                    "prefill_chunk_tokens": 1024},
        "loss": {"clip_low": 0.2, "clip_high": 0.28, "clip_c": 10.0, "agg": "token-mean"},
        # MemAgent's 20 warm-up steps are RL steps (verl counts those); ours count optimizer updates: 20 x 16.
        "optim": {"lr": 1e-6, "warmup_steps": 320, "weight_decay": 0.01, "grad_clip": 1.0, "mini_batches": 16,
                  "micro_batch_tokens": 16384},
        "data": {"train_file": "data/hotpotqa_train.json", "eval_file": "data/eval_200.json", "train_chunks": 8, "num_train": 8192, "num_eval": 128,
                 "eval_chunk_factors": (1, 2, 4)},
        "eval": {"every": 10, "temperature": 0.7, "top_p": 0.95},
        "run": {"steps": 500, "output_dir": "runs/qwen2.5-7b", "save_every": 10, "trace_every": 10},
    },
    # MemAgent's released recipe exactly (run_memory_7B.sh) on the same scale: R - mean advantages, clip 0.2/0.2,
    # dual clip 3, KL 0.001 low_var_kl, no dynamic sampling, no overlong shaping. An independent Qwen3-4B
    # reproduction had loss spikes until it used exactly this.
    "memagent-release": {
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct", "dtype": "auto", "gradient_checkpointing": True},
        "workflow": {"chunk_tokens": 5000, "memory_tokens": 1024, "answer_tokens": 1024, "max_chunks": 8,
                     "question_tokens": 1024},
        "rollout": {"batch_size": 128, "group_size": 16, "temperature": 1.0, "top_p": 1.0, "max_batch_rows": 256,
                    "kv_cache_budget_gb": 40.0, "prefill_chunk_tokens": 1024, "dynamic_sampling": False,
                    "overlong_shaping": False},
        "loss": {"clip_low": 0.2, "clip_high": 0.2, "clip_c": 3.0, "agg": "token-mean", "scale_by_std": False,
                 "kl_coef": 0.001, "kl_kind": "low_var_kl"},
        "optim": {"lr": 1e-6, "warmup_steps": 320, "weight_decay": 0.01, "grad_clip": 1.0, "mini_batches": 16,
                  "micro_batch_tokens": 16384},
        "data": {"train_file": "data/hotpotqa_train.json", "eval_file": "data/eval_200.json", "train_chunks": 8,
                 "num_train": 8192, "num_eval": 128, "eval_chunk_factors": (1, 2, 4)},
        "eval": {"every": 10, "temperature": 0.7, "top_p": 0.95},
        "run": {"steps": 500, "output_dir": "runs/memagent-release", "save_every": 10, "trace_every": 10},
    },
}
# The `smollm2` recipe under MemAgent's released loss (the `memagent-release` rows above) instead of our DAPO
# defaults, for the side-by-side curves in docs/evaluation.md (`make smollm2-rl PRESET=smollm2-release`).
PRESETS["smollm2-release"] = _on(
    PRESETS["smollm2"],
    rollout={"dynamic_sampling": False, "overlong_shaping": False},
    loss=PRESETS["memagent-release"]["loss"],
    run={"output_dir": "runs/smollm2-release"},
)
# MemAgent's evaluation in small (docs/evaluation.md, "Task mix"; `make smollm2-mix SEED=`): the smollm2 recipe on
# four training tasks, 512 tokens (2 chunks of 256) as in smollm2, so a step costs about the same and the 64x cells
# (32K tokens) stay within reach of a 2-core CPU. Rewards by task family: string_match_all with partial credit for
# the NIAH tasks, the contained rule for the two-hop QA. The answer budget grows to 48 tokens: four 7-digit values
# are 31 SmolLM2 tokens before any words around them. 10 steps. Two changes from the first run of this recipe (v0,
# docs/evaluation.md), whose policy collapsed to the single-needle answer: no overlong shaping (its ramp began at
# 32 answer tokens, so a complete four-value answer was penalized and answers shrank from 40 tokens to 10, one
# value), and double weight on the two tasks that need the memory to keep a key or several values. Third change (v2,
# after v1's first two steps): rollouts sample at temperature 0.6, a departure from MemAgent's 1.0. The untrained
# 135M model's temperature-1 samples lose the answer (24 questions at 512 tokens: 4/0/4/0% on the four tasks, against
# 67/8/28/0% at 0.6 and 73/31/55/4% greedy), so v1 rolled 36 groups a step to keep 8 and 78% of them were all-zero.
# The loss divides logits by the same temperature, so ratios stay those of the sampling policy.
MIX_TRAIN_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multivalue", "hotpotqa_synth")
MIX_WEIGHTS = (1, 2, 2, 1)
"""Shares of MIX_TRAIN_TASKS in the smollm2-mix training questions."""
MIX_HELDOUT_TASKS = ("vt", "fwe", "niah_multiquery", "niah_multikey_3", "kv_retrieval")
"""Tasks the mix never trains on, evaluated at 1x and 4x the training length (issue 24's held-out list)."""
PRESETS["smollm2-mix"] = _on(
    PRESETS["smollm2"],
    workflow={"answer_tokens": 48},
    rollout={"verifier": "task", "overlong_shaping": False, "temperature": 0.6},
    data={"task": "", "tasks": tuple(f"{t}:{w}" for t, w in zip(MIX_TRAIN_TASKS, MIX_WEIGHTS))},
    run={"steps": 10, "output_dir": "runs/smollm2-mix"},
)
# The task mix with LoRA adapters (docs/evaluation.md, "A grid that outlives its machine"): rank 8 on every decoder
# projection, alpha 16, the rest of the recipe unchanged except the learning rate, 25x the full fine-tuning one.
# LoRA's best rate sits near 10x full fine-tuning's at alpha / r = 4 (Schulman et al., "LoRA Without Regret", 2025);
# ours is alpha / r = 2, and a first try at 10x (4e-4) moved the policy 3-10x less per step than full fine-tuning
# did (approx. KL 0.0000-0.0008 against 0.0003-0.0019 over steps 1-4) and left its entropy where it started. The
# point is size: a seed's policy is its adapters, 9.8 MB in float32, small enough to keep in the repository
# (docs/results/adapters), so the long cells can be scored in later sessions on the same weights.
PRESETS["smollm2-mix-lora"] = _on(
    PRESETS["smollm2-mix"],
    model={"lora_rank": 8},
    optim={"lr": 1e-3},
    run={"output_dir": "runs/smollm2-mix-lora"},
)
# Gated memory (docs/gates.md) against the task mix above: the same recipe, seeds, tasks and lengths, with the update
# and exit gates on (KEEP / UPDATE / ANSWER before each memory update) and no efficiency term (rollout.read_cost 0), so
# the comparison isolates the workflow. Evaluate its checkpoints with `evaluate.py --gates both`.
PRESETS["smollm2-mix-gates"] = _on(
    PRESETS["smollm2-mix"],
    workflow={"gates": "both"},
    run={"output_dir": "runs/smollm2-mix-gates"},
)
# The gated recipe's second try (docs/gates.md, "Read cost"): trained without a read cost on two-chunk documents, the
# gates went unused (every greedy decision UPDATE), because the only possible exit was after chunk 0 and nothing
# rewarded reading less. Here the training documents are 4 chunks (1024 tokens), so an exit can save up to three
# quarters of the reading, and the efficiency term is on: reward - 0.2 x chunks read / chunks in the document (a
# full read costs 0.2, a fifth of a correct answer; InfMem and GRU-Mem use terms of this kind, docs/gates.md).
# It starts from the ungated smollm2-mix policy of the same seed (`make smollm2-mix-gates GATES_PRESET=...` passes
# --model.path): from the base model, the gated prompt on 4-chunk documents scored 1.6% at step 1 (0% on
# niah_single_1) and 35 of 40 groups were all-zero, so the gates would have had almost no gradient. Dynamic sampling
# filters on the total reward (rollout.filter_on reward): on correctness alone, a group whose answers are all right
# but read different amounts is dropped, and the read cost only ever acted inside groups of mixed correctness (a
# first run filtering on correctness had KEEP 71% -> 0% and ANSWER 1-8% by step 3: the gates trained away again).
PRESETS["smollm2-mix-gates-cost"] = _on(
    PRESETS["smollm2-mix-gates"],
    rollout={"read_cost": 0.2, "filter_on": "reward"},
    data={"train_chunks": 4},
    run={"output_dir": "runs/smollm2-mix-gates-cost"},
)
# The read-cost recipe on the LoRA grid (docs/gates.md, "Read cost"): it starts from the kept adapter file of the
# LoRA seed (`make smollm2-mix-gates GATES_PRESET=smollm2-mix-lora-gates-cost` passes --model.lora-init), with the
# LoRA learning rate, so its policy is again an adapter file and a session need not train the ungated seed first.
# Two changes, from its first step without them: the trained LoRA seed 0 puts a thousandth of its decision mass on
# UPDATE under the gated prompt (KEEP 79%, ANSWER 21%, UPDATE 0% of sampled decisions; every answer wrong), so half
# the decisions are drawn uniformly among the three words (rollout.gate_explore, epsilon-greedy); and with every
# answer wrong, groups differ only in how much they read, which the group's std would blow up to full-size advantages
# pushing to exit at once, so advantages are R - mean (loss.scale_by_std False, as the gated demo's presets).
PRESETS["smollm2-mix-lora-gates-cost"] = _on(
    PRESETS["smollm2-mix-gates-cost"],
    model={"lora_rank": 8},
    rollout={"gate_explore": 0.5},
    loss={"scale_by_std": False},
    optim={"lr": PRESETS["smollm2-mix-lora"]["optim"]["lr"]},
    run={"output_dir": "runs/smollm2-mix-lora-gates-cost"},
)
# The update gate alone on the LoRA grid (docs/gates.md, "Results"): with the exit gate and its read cost, the explored
# LoRA run above learned to stop reading before the needle (ANSWER 23% -> 58% of decisions, chunks read 65% -> 40%,
# sampled accuracy 3% -> 2% over steps 1-3): while almost every answer is wrong, reading less is all a group can
# learn. Without the exit there is no such way out: the policy already keeps its memory on almost every chunk (KEEP
# 97% of its first-token mass), and what RL has to teach is to UPDATE on the chunk that holds the asked needle. It
# did, and more: without a cost, UPDATE went from 1% to all of the policy's own decisions in three steps (sampled
# accuracy 14 -> 43%), MemAgent's workflow again. So writing is charged: reward - 0.5 x memory tokens written /
# (memory_tokens x chunks), which a KEEP earns back. Groups are filtered on correctness, so the charge acts only
# inside groups of mixed correctness and never pays a blind KEEP in a group that is all wrong. 4-chunk documents, so
# three updates of four have nothing to write. Evaluate with --gates update.
PRESETS["smollm2-mix-lora-gates-update"] = _on(
    PRESETS["smollm2-mix-lora"],
    workflow={"gates": "update"},
    rollout={"gate_explore": 0.5, "write_cost": 0.5},
    data={"train_chunks": 4},
    run={"output_dir": "runs/smollm2-mix-lora-gates-update"},
)
