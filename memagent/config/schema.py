"""Training configuration: one frozen dataclass per concern, one documented line per field.

Defaults are generic: MemAgent's scale (arXiv 2507.02259, run_memory_7B.sh) under DAPO's recipe (arXiv 2503.14476),
for any HF model passed as `--model.path`. Where a default follows DAPO rather than MemAgent's released scripts, the
field says so. `memagent.config.presets` holds `tiny` (the embedded demo, what `python train.py` runs without a model
path), `smoke` (tests), `smollm2`, `smollm2-release`, `smollm2-mix`, `smollm2-mix-gates`, `smollm2-mix-gates-cost`,
their LoRA variants (`smollm2-mix-lora`, `smollm2-mix-lora-gates-cost`, `smollm2-mix-lora-gates-update`),
`qwen2.5-7b` and `memagent-release`. Values are never mutated after construction; derived values are properties.
The workflow section is memagent.rollout.WorkflowConfig itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memagent.data.mix import parse_task_mix
from memagent.model.lora import DEFAULT_TARGETS
from memagent.rl.loss import AGG_MODES
from memagent.rl.rewards import VERIFIER_NAMES
from memagent.rollout.prompts import WorkflowConfig


@dataclass(frozen=True)
class ModelConfig:
    """The policy: an HF causal LM directory."""

    path: str = ""
    """HF model directory (required, except with demo.enabled, which builds the tiny model at demo.model_dir)."""
    dtype: str = "auto"
    """Parameter storage: auto (float32; bf16 under DeepSpeed on a bf16 GPU: it keeps fp32 masters), float32, bfloat16."""
    autocast: str = "auto"
    """bf16 autocast of the forward passes over fp32 weights: auto (on GPUs and CPUs with native bf16), bfloat16, off."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (saves memory at paper scale)."""
    compile: bool = False
    """torch.compile each MLP and RMSNorm (memagent.model.compiled; for AMX CPUs and GPUs: no gain on AVX512-BF16); not with DeepSpeed."""
    lora_rank: int = 0
    """LoRA rank r: train only rank-r adapters on lora_targets, the rest frozen (0 = full fine-tuning; no DeepSpeed)."""
    lora_alpha: float = 16.0
    """LoRA alpha: the adapters' update is scaled by alpha / rank."""
    lora_targets: tuple[str, ...] = DEFAULT_TARGETS
    """Names of the nn.Linear layers that get adapters (default: every attention and MLP projection)."""
    lora_init: str = ""
    """An adapter file (a LoRA run's adapter.safetensors) the adapters start from instead of B = 0: RL goes on from that policy ("" = none)."""
    lora_merged_dtype: str = "float32"
    """dtype of a LoRA checkpoint's merged model/: float32 (exact), bfloat16 or float16 (rounding loses part of the update; it warns how much)."""


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling G trajectories per question and shaping their rewards (DAPO Sec. 3.2 and 3.4)."""

    batch_size: int = 128
    """Questions (groups) per RL step after dynamic sampling (MemAgent: 128)."""
    group_size: int = 16
    """G, rollouts per question; must be >= 2 for a group baseline (MemAgent: 16)."""
    temperature: float = 1.0
    """Rollout sampling temperature (MemAgent: 1.0); the loss uses the same temperature for log-probs."""
    top_p: float = 1.0
    """Rollout nucleus sampling (MemAgent: 1.0, i.e. off)."""
    top_k: int = 0
    """Rollout top-k (0 = off)."""
    max_batch_rows: int = 0
    """Cap on prompts per generate call (bounds KV-cache memory; 0 = all pending requests in one call)."""
    kv_cache_budget_gb: float = 0.0
    """GiB of KV cache (and prefill activations) one generate call may use; rows per call follow from it (0 = off)."""
    prefill_chunk_tokens: int = 4096
    """Prompts are prefilled through the KV cache in slices of this many positions (0 = one forward)."""
    share_prefill: bool = True
    """Prefill once what one generate call's prompts share: identical prompts and common prefixes of 32+ tokens."""
    reuse_logprobs: str = "auto"
    """Old log-probs from the sampler, not recomputed: auto (when no autocast runs: equal to float32 rounding), on, off."""
    dynamic_sampling: bool = True
    """DAPO: drop groups whose G correctness scores are all equal and refill from the next questions."""
    filter_on: str = "correct"
    """Dynamic sampling drops groups where this is constant: correct (DAPO's accuracy) or reward (with shaping terms)."""
    max_refill_rounds: int = 4
    """Extra rollout rounds to refill the batch; after them, a warning and a smaller batch."""
    refill_oversample_cap: float = 4.0
    """A refill rolls out up to this many times the missing questions, sized by the keep rate seen so far."""
    refill_margin_std: float = 0.5
    """A refill's size leaves this many binomial std of margin over the expected informative groups (DAPO-style 2 = fewer rounds, more groups dropped)."""
    overlong_shaping: bool = True
    """DAPO soft overlong penalty on the answer length, added to the correctness reward (MemAgent: off)."""
    overlong_cache_tokens: int = 256
    """L_cache of the overlong penalty: it ramps linearly over the last this-many tokens of `answer_tokens`."""
    overlong_factor: float = 1.0
    """Penalty at the answer cap (DAPO: 1.0)."""
    read_cost: float = 0.0
    """Gated memory's efficiency term lambda: reward -= lambda x chunks read / chunks in the document (0 = off; docs/gates.md)."""
    write_cost: float = 0.0
    """Gated memory's writing term mu: reward -= mu x memory tokens written / (memory_tokens x chunks in the document)
    (0 = off; docs/gates.md)."""
    gate_explore: float = 0.0
    """Constrained gate decisions: this share is drawn uniformly among the offered words (epsilon-greedy; 0 = off; docs/gates.md)."""
    verifier: str = "strict"
    """Training reward on the final answer: strict (last \\boxed{} equals a gold; MemAgent), lenient (a gold inside the
    answer) or task (by task family: RULER string_match_all with partial credit, lenient for QA; for a task mix)."""

    @property
    def samples_the_scored_distribution(self) -> bool:
        """The rollout samples the distribution the loss scores (temperature > 0, no top-p / top-k truncation), so
        the sampler's log-probs are the old policy's."""
        return self.temperature > 0 and self.top_p == 1 and self.top_k == 0

    def reuses_logprobs(self, autocast_dtype) -> bool:
        """Whether step 5 takes the sampler's log-probs: `on`; or `auto` without autocast, where a decode step and
        a packed forward agree to float32 rounding (under bf16 autocast they differ by bf16 rounding: BENCHMARKS.md
        measured a mean |delta| of 0.03 on SmolLM2), and only for untruncated sampling. Constrained gate decisions
        (workflow.gate_decoding) keep it on: the sampler records the policy's unconstrained log-probs for them."""
        if self.reuse_logprobs == "auto":
            return autocast_dtype is None and self.samples_the_scored_distribution
        return self.reuse_logprobs == "on"


@dataclass(frozen=True)
class LossConfig:
    """Multi-Conv DAPO loss: clipped token-level surrogate over all conversations of the step."""

    clip_low: float = 0.2
    """epsilon_low of the ratio clip (DAPO and MemAgent: 0.2)."""
    clip_high: float = 0.28
    """epsilon_high, DAPO's clip-higher (MemAgent's script: 0.2, symmetric)."""
    clip_c: float | None = 10.0
    """Dual clip c for negative advantages (DAPO recipe: 10.0; MemAgent: 3.0); none = off."""
    agg: str = "token-mean"
    """Aggregation: token-mean (DAPO, MemAgent), seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm."""
    norm_len: float | None = None
    """Constant L_c of seq-mean-token-sum-norm (Dr. GRPO); required for that mode only."""
    scale_by_std: bool = True
    """Divide advantages by the group std (GRPO/DAPO); False = R - mean (MemAgent's released runs, Dr. GRPO)."""
    adv_eps: float = 1e-6
    """epsilon of the advantage denominator std + eps."""
    kl_coef: float = 0.0
    """Coefficient of a KL loss to a frozen reference model (DAPO: 0, off; MemAgent: 0.001 low_var_kl)."""
    kl_kind: str = "k3"
    """KL estimator: k1, k2, k3, k3+ (aliases kl, mse, low_var_kl)."""

    def update_args(self) -> dict[str, float | str | None]:
        """The scalars memagent.rl.step.accumulate_gradients takes (the advantage fields are not among them)."""
        return {"clip_low": self.clip_low, "clip_high": self.clip_high, "clip_c": self.clip_c, "agg": self.agg,
                "norm_len": self.norm_len, "kl_coef": self.kl_coef, "kl_kind": self.kl_kind}


@dataclass(frozen=True)
class OptimConfig:
    """AdamW, linear warm-up then constant lr, gradient clipping, mini- and micro-batching."""

    lr: float = 1e-6
    """Peak learning rate (MemAgent: 1e-6)."""
    warmup_steps: int = 320
    """Optimizer updates (not RL steps) of linear warm-up from 0, then constant (MemAgent: 20 RL steps = 20 x mini_batches)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay (MemAgent: 0.01)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.999
    """AdamW beta2."""
    eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Max global gradient norm (MemAgent: 1.0); 0 = no clipping. A non-finite norm skips the update."""
    mini_batches: int = 16
    """Optimizer updates per RL step; the step's conversations are split into this many (MemAgent: 16)."""
    micro_batch_tokens: int = 16384
    """Token budget (rows x padded length) of one forward/backward micro-batch; any value gives the same loss."""
    shared_prefix_tokens: int = 64
    """Rows sharing a prompt prefix this long run it once per micro-batch (0 = off; one process, no checkpointing)."""


@dataclass(frozen=True)
class DataConfig:
    """Training and held-out questions: files, or a synthetic generator of memagent.data.TASKS."""

    task: str = "hotpotqa_synth"
    """Synthetic task (a name in memagent.data.TASKS; code_lookup with demo.enabled) when train_file and tasks are empty."""
    tasks: tuple[str, ...] = ()
    """Task mix instead of `task`: entries "name" or "name:weight" (memagent.data.mix), one task per question."""
    train_file: str = ""
    """Training questions from a MemAgent/RULER JSON, JSONL or Parquet file (memagent.data readers); empty = synthetic."""
    eval_file: str = ""
    """Held-out questions from a file (evaluated at its own length); empty = synthetic at eval_chunk_factors."""
    train_chunks: int = 8
    """Synthetic document length at training, in chunks (train_chunks * workflow.chunk_tokens context tokens)."""
    num_train: int = 8192
    """Synthetic training questions (generated once from the seed; the stream reshuffles every epoch)."""
    num_eval: int = 128
    """Synthetic held-out questions per evaluation length."""
    eval_chunk_factors: tuple[int, ...] = (1, 2, 4)
    """Synthetic evaluation lengths as multiples of train_chunks (uncapped: evaluation has no max_chunks)."""
    seed: int = 0
    """Seed of the data generators; held-out set f uses seed + 1000 f + 1, so no set repeats another's documents."""


@dataclass(frozen=True)
class DemoConfig:
    """The embedded demo (memagent.demo, docs/demo.md): a tiny model built offline, the code_lookup task and a
    supervised warm start on teacher traces before RL. Only used with `enabled` (the `tiny` and `smoke` presets)."""

    enabled: bool = False
    """Run the demo stage: build the tiny model when model.path is empty, make code_lookup data, warm-start it."""
    model_dir: str = "runs/tiny/model"
    """Where the tiny model and its tokenizer (trained on the demo task's text) are built."""
    hidden_size: int = 96
    """Tiny model: width of the residual stream."""
    num_layers: int = 3
    """Tiny model: number of decoder layers."""
    intermediate_size: int = 384
    """Tiny model: width of the SwiGLU MLP."""
    vocab_size: int = 512
    """Tiny model: tokenizer and embedding size."""
    distractors: int = 0
    """code_lookup: code lines with other keys in every chunk (0: the needle is the only code line)."""
    pretrain_steps: int = 400
    """Cap on updates of the compact-prompt pretraining (stage 1 of memagent.demo.warm_start); 0 = none."""
    pretrain_batch: int = 64
    """Questions per compact-pretraining update (each gives all its oracle conversations; every one fresh)."""
    pretrain_stop_loss: float = 0.05
    """Compact pretraining stops once the mean loss of its last 5 updates is below this (nats/token)."""
    steps: int = 80
    """SFT updates on the workflow's own prompts (stage 2 of the warm start); 0 = none."""
    batch_questions: int = 16
    """Questions per SFT update (each gives all its oracle conversations; every question is fresh)."""
    pretrain_chunks: int = 1
    """Document length of the compact-pretraining questions, in chunks (their teacher is the exact oracle)."""
    chunks: int = 8
    """Document length of the SFT questions, in chunks."""
    teacher_keep_probability: float = 0.2
    """SFT teacher: chance that it carries a found needle through a section without one (else it writes
    "code {key} unknown."): a weak memory policy whose greedy imitation forgets; 1 = the exact oracle."""
    teacher_decisions: tuple[float, float, float] = (0.3, 0.6, 0.1)
    """SFT teacher with workflow.gates: chances of KEEP, UPDATE, ANSWER (those on offer, renormalized), drawn per
    update whatever the chunk holds, so the warm start speaks the grammar and RL learns when each word pays."""
    teacher_informed: float = 0.0
    """SFT teacher with workflow.gates: chance that a decision follows the rule (ANSWER once the memory holds the
    needle, UPDATE on its section, KEEP otherwise) instead of the blind draw; 0 = blind."""
    lr: float = 2e-3
    """Learning rate of both stages (AdamW, 10% warm-up then constant)."""


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation (before RL and at the end, and every `every` steps)."""

    every: int = 10
    """Evaluate every this-many RL steps (0 = only before and after RL)."""
    temperature: float = 0.7
    """Evaluation temperature (the paper's evaluation: 0.7; 0 = greedy)."""
    top_p: float = 0.95
    """Evaluation nucleus sampling (the paper's evaluation: 0.95)."""


@dataclass(frozen=True)
class RunConfig:
    """Steps, seeds, output, logging, checkpoints, and DeepSpeed or plain PyTorch for the learner."""

    steps: int = 500
    """RL steps (each: rollout, dynamic sampling, `mini_batches` optimizer updates)."""
    seed: int = 0
    """Seed of python, numpy, torch and the rollout generator."""
    output_dir: str = "runs/memagent"
    """Checkpoints, metrics.jsonl, traces and TensorBoard events go here."""
    resume: str = ""
    """Empty = start fresh (refuses a dir that has checkpoints), 'latest' = newest checkpoint in output_dir, or a path."""
    deepspeed: str = ""
    """DeepSpeed JSON config (configs/ds_zero{1,2,3}.json); empty = plain PyTorch (DDP under torchrun)."""
    device: str = "auto"
    """auto (cuda:LOCAL_RANK when available, else cpu), cpu or cuda."""
    save_every: int = 10
    """Write a checkpoint every this-many steps (and after the last); 0 = only after the last."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (the newest ones)."""
    trace_every: int = 10
    """Dump sample trajectories as readable text every this-many steps (0 = never)."""
    progress: bool = True
    """Show progress bars for rollout and update phases on rank 0."""
    allow_config_change: bool = False
    """On --resume, continue under settings that differ from the checkpoint's (a warning lists them) instead of refusing."""
    collective_timeout_s: float = 1800.0
    """Seconds a collective waits for all ranks, then fails (a rank lost on another node); above any one rank's lone work."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything train.py needs, one section per concern."""

    model: ModelConfig = field(default_factory=ModelConfig)
    workflow: WorkflowConfig = field(default_factory=WorkflowConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        validate(self)


def validate(cfg: TrainConfig) -> None:
    """Raise ValueError naming the field for values the trainer cannot run with."""
    r, lo, op, wf, d = cfg.rollout, cfg.loss, cfg.optim, cfg.workflow, cfg.data
    checks = [
        (r.group_size >= 2, f"rollout.group_size={r.group_size}: a group baseline needs at least 2 rollouts"),
        (r.batch_size >= 1, f"rollout.batch_size={r.batch_size}: need at least 1 question per step"),
        (r.max_refill_rounds >= 0, "rollout.max_refill_rounds must be >= 0"),
        (r.refill_oversample_cap >= 1, f"rollout.refill_oversample_cap={r.refill_oversample_cap} must be >= 1"),
        (r.refill_margin_std >= 0, f"rollout.refill_margin_std={r.refill_margin_std} must be >= 0"),
        (r.max_batch_rows >= 0, f"rollout.max_batch_rows={r.max_batch_rows} must be >= 0 (0 = no cap)"),
        (r.kv_cache_budget_gb >= 0, f"rollout.kv_cache_budget_gb={r.kv_cache_budget_gb} must be >= 0 (0 = off)"),
        (r.prefill_chunk_tokens >= 0, f"rollout.prefill_chunk_tokens={r.prefill_chunk_tokens} must be >= 0"),
        (r.reuse_logprobs in ("auto", "on", "off"), f"rollout.reuse_logprobs={r.reuse_logprobs!r}: auto, on or off"),
        (r.reuse_logprobs != "on" or r.samples_the_scored_distribution,
         f"rollout.reuse_logprobs=on: the sampler's log-probs are the old policy's only for untruncated sampling at a "
         f"temperature > 0; got temperature={r.temperature}, top_p={r.top_p}, top_k={r.top_k}"),
        (r.filter_on in ("correct", "reward"), f"rollout.filter_on={r.filter_on!r}: correct or reward"),
        (r.read_cost >= 0, f"rollout.read_cost={r.read_cost} must be >= 0 (0 = off)"),
        (r.write_cost >= 0, f"rollout.write_cost={r.write_cost} must be >= 0 (0 = off)"),
        # Without the exit gate every trajectory reads every chunk: the term would be one constant per question.
        (r.read_cost == 0 or wf.gates in ("exit", "both"),
         f"rollout.read_cost={r.read_cost} needs workflow.gates exit or both, got {wf.gates!r}"),
        (0 <= r.gate_explore <= 1, f"rollout.gate_explore={r.gate_explore} must be in [0, 1] (0 = off)"),
        (r.gate_explore == 0 or (wf.gated and wf.gate_decoding == "constrained"),
         f"rollout.gate_explore={r.gate_explore} explores constrained decisions: it needs workflow.gates other than "
         f"none and workflow.gate_decoding constrained, got {wf.gates!r} and {wf.gate_decoding!r}"),
        (0 < r.overlong_cache_tokens <= wf.answer_tokens or not r.overlong_shaping,
         f"rollout.overlong_cache_tokens={r.overlong_cache_tokens} must be in (0, answer_tokens={wf.answer_tokens}]"),
        (lo.agg in AGG_MODES, f"loss.agg={lo.agg!r}: expected one of {AGG_MODES}"),
        (lo.agg != "seq-mean-token-sum-norm" or lo.norm_len, "loss.norm_len is required by seq-mean-token-sum-norm"),
        (lo.kl_coef >= 0, "loss.kl_coef must be >= 0"),
        (op.mini_batches >= 1, f"optim.mini_batches={op.mini_batches} must be >= 1"),
        (op.micro_batch_tokens >= 1, "optim.micro_batch_tokens must be >= 1"),
        (op.shared_prefix_tokens >= 0, f"optim.shared_prefix_tokens={op.shared_prefix_tokens} must be >= 0 (0 = off)"),
        (op.lr > 0, f"optim.lr={op.lr} must be > 0"),
        (d.train_chunks >= 1 and d.num_eval >= 0, "data.train_chunks must be >= 1 and data.num_eval >= 0"),
        (not (d.tasks and d.train_file), "data.tasks and data.train_file: pass one of them, not both"),
        (min(cfg.demo.chunks, cfg.demo.pretrain_chunks) >= 1, "demo.chunks and demo.pretrain_chunks must be >= 1"),
        (0 <= cfg.demo.teacher_keep_probability <= 1, "demo.teacher_keep_probability must be in [0, 1]"),
        (len(cfg.demo.teacher_decisions) == 3 and min(cfg.demo.teacher_decisions) >= 0
         and cfg.demo.teacher_decisions[1] > 0,
         f"demo.teacher_decisions={cfg.demo.teacher_decisions}: three chances (KEEP, UPDATE, ANSWER) >= 0, UPDATE > 0"),
        (0 <= cfg.demo.teacher_informed <= 1, f"demo.teacher_informed={cfg.demo.teacher_informed} must be in [0, 1]"),
        (cfg.rollout.verifier in VERIFIER_NAMES,
         f"rollout.verifier={cfg.rollout.verifier!r}: strict, lenient or task"),
        (cfg.model.dtype in ("auto", "float32", "bfloat16"), f"model.dtype={cfg.model.dtype!r}: auto, float32, bfloat16"),
        (cfg.model.autocast in ("auto", "bfloat16", "off"), f"model.autocast={cfg.model.autocast!r}: auto, bfloat16, off"),
        # ZeRO-3 gathers partitioned weights in module hooks around each call; the compiled modules are untested there.
        (not (cfg.model.compile and cfg.run.deepspeed),
         "model.compile with run.deepspeed: the compiled path runs on plain PyTorch (one process or DDP); drop one"),
        (cfg.run.steps >= 0 and cfg.run.keep_checkpoints >= 1, "run.steps must be >= 0, run.keep_checkpoints >= 1"),
        (cfg.run.collective_timeout_s > 0, f"run.collective_timeout_s={cfg.run.collective_timeout_s} must be > 0"),
        *lora_checks(cfg),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    parse_task_mix(d.tasks)  # raises naming the bad entry


def lora_checks(cfg: TrainConfig) -> list[tuple[bool, str]]:
    """(ok, message) pairs for the lora_* fields; which targets the model has is checked once it is loaded."""
    m = cfg.model
    targets = m.lora_targets
    return [
        (m.lora_rank >= 0, f"model.lora_rank={m.lora_rank} must be >= 0 (0 = full fine-tuning)"),
        (m.lora_alpha > 0, f"model.lora_alpha={m.lora_alpha} must be > 0"),
        (m.lora_merged_dtype in ("float32", "bfloat16", "float16"),
         f"model.lora_merged_dtype={m.lora_merged_dtype!r}: float32, bfloat16, float16"),
        (len(targets) > 0 and all(targets) and len(set(targets)) == len(targets),
         f"model.lora_targets={targets!r}: give distinct, non-empty nn.Linear names, e.g. q_proj,v_proj"),
        # memagent.model.logprobs applies the output head outside the model's forward, so an adapter there would
        # escape the KL reference's bypass; the head is also tied to the embeddings in many models.
        ("lm_head" not in targets, "model.lora_targets: lm_head cannot be adapted (only decoder projections)"),
        (not m.lora_init or m.lora_rank > 0,
         f"model.lora_init={m.lora_init!r} needs model.lora_rank > 0 (the file's rank)"),
        # A LoRA run's KL reference is its base with the adapters bypassed: from lora_init that is not the policy RL
        # starts from, so the penalty would pull towards the wrong model.
        (not (m.lora_init and cfg.loss.kl_coef > 0),
         f"model.lora_init with loss.kl_coef={cfg.loss.kl_coef}: the KL reference would be the base, not the "
         "adapters' policy; set --loss.kl-coef 0"),
        # DeepSpeed wraps and checkpoints the whole module itself (bf16 casts, ZeRO partitions, its own checkpoint
        # layout); LoRA is for the single-GPU (or DDP) case, where the frozen base needs no optimizer state.
        (not (m.lora_rank and cfg.run.deepspeed),
         f"model.lora_rank={m.lora_rank} with run.deepspeed: LoRA runs on plain PyTorch (one GPU or DDP under "
         "torchrun); drop --deepspeed or set --model.lora-rank 0"),
    ]
