"""Driver for test_distributed.py, run under `torchrun --nproc_per_node 2`: optimizer updates of the real backends
on gloo, each rank holding an uneven share of the rows (so a different number of micro-batches), compared on rank 0
with a single-process update on all rows. Exits non-zero (AssertionError) when parameters differ.

Scenarios: DDP, ZeRO-2 and ZeRO-3 on fixed rows; DDP with a KL loss to a reference model (a rank runs an
all-padding micro-batch); ZeRO-3 with every parameter partitioned (persistence threshold 0, small live-parameter and
prefetch limits), whose rows come from MemAgent rollouts of documents with a different number of chunks on each rank
(different numbers of decoding forwards); bf16 weights under ZeRO-2 accumulate gradients in fp32.

usage: torchrun --nproc_per_node 2 tests/train/dist_update.py MODEL_DIR
"""

from __future__ import annotations

import atexit
import sys

import torch
import torch.distributed as dist

from memagent.config import LossConfig, OptimConfig
from memagent.demo.task import generate_code_lookup
from memagent.model import load_model, load_tokenizer
from memagent.rl.step import (
    TrainRow,
    accumulate_gradients,
    global_counts,
    micro_batch_counts,
    set_logprobs,
    split_mini_batches,
)
from memagent.rollout.llm import LocalLLM
from memagent.rollout.prompts import WorkflowConfig
from memagent.rollout.sampling import SamplingParams
from memagent.rollout.workflow import run_memagent
from memagent.training.learner import (
    DeepSpeedLearner,
    Learner,
    close_process_group,
    deepspeed_config,
    dist_env,
)

CPU = torch.device("cpu")
BUDGET = 24
# A large AdamW eps: parameters whose gradient is ~0 in theory (k_proj.bias: softmax is shift-invariant) would
# otherwise turn float noise into lr-sized updates of either sign.
OPT = OptimConfig(lr=1e-2, warmup_steps=0, grad_clip=1.0, eps=1e-3)
# Every parameter partitioned and released after use: what each weight of a 7B model meets under configs/ds_zero3.json.
PARTITIONED = {"stage3_param_persistence_threshold": 0, "stage3_model_persistence_threshold": 0,
               "stage3_max_live_parameters": 1000, "stage3_prefetch_bucket_size": 1000}


def rows() -> list[TrainRow]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(6):
        p, r = 4 + i, 3 + (i % 3)
        ids = torch.randint(3, 500, (p + r,), generator=g).tolist()
        out.append(TrainRow(ids, p, [1] * r, advantage=float(torch.randn(1, generator=g))))
    return out


def rollout_rows(learner: Learner, model_dir: str, num_chunks: int) -> list[TrainRow]:
    """One conversation row per MemAgent step of 2 rollouts of a question whose document has `num_chunks` chunks."""
    tokenizer = load_tokenizer(model_dir)
    memory = WorkflowConfig(chunk_tokens=48, memory_tokens=8, answer_tokens=12, max_chunks=8, question_tokens=64)
    samples = generate_code_lookup(tokenizer, num_chunks=num_chunks, chunk_tokens=48, num_samples=1, seed=num_chunks)
    with learner.generation() as model:
        llm = LocalLLM(model, tokenizer, params=SamplingParams(temperature=1.0),
                       generator=torch.Generator().manual_seed(num_chunks))
        trajectories = run_memagent(samples, llm, memory, group_size=2)
    convs = [(i, c) for i, t in enumerate(trajectories) for c in t.conversations]
    return [TrainRow(c.prompt_ids + c.response_ids, len(c.prompt_ids), list(c.response_mask), advantage=1.0 - 2 * i)
            for i, c in convs]


def update(learner: Learner, mine: list[TrainRow], loss: LossConfig, reference: torch.nn.Module | None) -> None:
    """The update of train.py's rl_step: old (and reference) log-probs per mini-batch, global counts, step."""
    kw = dict(budget=BUDGET, pad_id=0, temperature=1.0, device=CPU)
    minis = split_mini_batches(mine, 1)
    counts = micro_batch_counts(minis, BUDGET, lambda t: learner.all_reduce(t, "max"))
    set_logprobs(learner.model, minis, counts, "old_logprobs", **kw)
    for row in mine:
        row.old_logprobs = row.old_logprobs - 0.1  # off-policy by a constant, so some tokens clip
    if reference is not None:
        set_logprobs(reference, minis, counts, "ref_logprobs", **kw)
    num_tokens, num_seqs = global_counts(minis[0], learner.all_reduce_sum)
    accumulate_gradients(learner.model, minis[0], **loss.update_args(), num_tokens=num_tokens, num_seqs=num_seqs,
                         world_size=learner.world_size, backward=learner.backward, num_micro=counts[0], **kw)
    learner.step()


def perturbed_reference(model_dir: str) -> torch.nn.Module:
    """A frozen model near the policy (same noise on every rank), so the KL term has a gradient."""
    model = load_model(model_dir, dtype="float32", device="cpu").eval().requires_grad_(False)
    g = torch.Generator().manual_seed(5)
    for p in model.parameters():
        p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def make_learner(name: str, model_dir: str, world: int) -> Learner:
    model = load_model(model_dir, dtype="float32", device="cpu")
    if name.startswith("DDP"):
        return Learner(model, OPT, CPU)  # DistributedDataParallel under torchrun
    ds = deepspeed_config(f"configs/ds_zero{name[5]}.json", OPT, world, torch.float32)
    if "partitioned" in name:
        ds["zero_optimization"].update(PARTITIONED)
    return DeepSpeedLearner(model, OPT, CPU, ds)


def copies(rows: list[TrainRow]) -> list[TrainRow]:
    return [TrainRow(r.input_ids, r.prompt_len, r.response_mask, r.advantage) for r in rows]


def scenario(name: str, model_dir: str, rank: int, world: int) -> None:
    learner = make_learner(name, model_dir, world)
    loss = LossConfig(kl_coef=0.1 if "KL" in name else 0.0)
    if "partitioned" in name:
        mine = rollout_rows(learner, model_dir, num_chunks=1 if rank == 0 else 3)
        gathered: list[list[TrainRow]] = [[] for _ in range(world)]
        dist.all_gather_object(gathered, mine)
        all_rows = [r for part in gathered for r in part]
    else:
        all_rows = rows()
        mine = all_rows[:2] if rank == 0 else all_rows[2:]  # uneven on purpose: 2 vs 4 rows
    reference = perturbed_reference(model_dir) if loss.kl_coef > 0 else None
    update(learner, copies(mine), loss, reference)
    with learner.full_parameters() as module:
        got = {k: v.detach().clone() for k, v in module.state_dict().items()}
    if rank == 0:
        single = Learner(load_model(model_dir, dtype="float32", device="cpu"), OPT, CPU, local=True)
        update(single, copies(all_rows), loss, reference)
        initial = load_model(model_dir, dtype="float32", device="cpu").state_dict()
        for key, want in single.unwrapped.state_dict().items():
            assert "k_proj.bias" in key or not torch.equal(want, initial[key]), f"{key} did not change"
            torch.testing.assert_close(got[key], want, rtol=1e-4, atol=1e-6, msg=f"{name} {key}")
        print(f"{name}: parameters match the single-process update ({len(all_rows)} rows)", flush=True)
    dist.barrier()


def bf16_gradients_accumulate_in_fp32(model_dir: str, rank: int, world: int) -> None:
    """bf16 weights under ZeRO-1 (DeepSpeed's BF16_Optimizer) and ZeRO-2: fp32 accumulation, a finite update."""
    for stage in (1, 2):
        model = load_model(model_dir, dtype="bfloat16", device="cpu")
        ds = deepspeed_config(f"configs/ds_zero{stage}.json", OPT, world, torch.bfloat16)
        learner = DeepSpeedLearner(model, OPT, CPU, ds)
        assert learner.engine.get_data_types() == (torch.bfloat16, torch.float32), learner.engine.get_data_types()
        mine = rows()[:2] if rank == 0 else rows()[2:]
        update(learner, mine, LossConfig(), None)
        norm = learner.engine.get_global_grad_norm()
        assert norm is not None and 0 < float(norm) < float("inf"), norm
        if rank == 0:
            print(f"ZeRO-{stage} bf16: gradients accumulate in fp32", flush=True)


def main(model_dir: str) -> None:
    rank, world, _ = dist_env()
    dist.init_process_group("gloo")
    # Destroyed at exit, as train.py does: an open gloo group can abort a finished rank at interpreter finalization
    # (memagent.training.learner.close_process_group), which torchrun reports as a failed run.
    atexit.register(close_process_group)
    for name in ("DDP", "ZeRO-2", "ZeRO-3", "DDP KL", "ZeRO-3 partitioned"):
        scenario(name, model_dir, rank, world)
    bf16_gradients_accumulate_in_fp32(model_dir, rank, world)


if __name__ == "__main__":
    main(sys.argv[1])
