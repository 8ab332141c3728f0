"""Driver for test_distributed.py, run under `torchrun --nproc_per_node 2`: one optimizer update of the real
backends (DDP, DeepSpeed ZeRO-2 and ZeRO-3 on gloo) on fixed rows, each rank holding an uneven share, compared on rank 0
with a single-process update on all rows. Exits non-zero (AssertionError) when parameters differ.

usage: torchrun --nproc_per_node 2 tests/train/dist_update.py MODEL_DIR
"""

from __future__ import annotations

import sys

import torch

from memagent.config import LossConfig, OptimConfig
from memagent.model import load_model
from memagent.rl.step import TrainRow, accumulate_gradients, global_counts, micro_batches, response_logprobs
from memagent.training.backend import Backend, DeepSpeedBackend, deepspeed_config, dist_env

CPU = torch.device("cpu")
# A large AdamW eps: parameters whose gradient is ~0 in theory (k_proj.bias: softmax is shift-invariant) would
# otherwise turn float noise into lr-sized updates of either sign.
OPT = OptimConfig(lr=1e-2, warmup_steps=0, grad_clip=1.0, eps=1e-3)


def rows() -> list[TrainRow]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(6):
        p, r = 4 + i, 3 + (i % 3)
        ids = torch.randint(3, 500, (p + r,), generator=g).tolist()
        out.append(TrainRow(ids, p, [1] * r, advantage=float(torch.randn(1, generator=g))))
    return out


def update(backend: Backend, mine: list[TrainRow]) -> None:
    """The update of train.py's rl_step: old log-probs, global counts, micro-batches, step."""
    n_micro = int(backend.all_reduce(torch.tensor(len(micro_batches(mine, 24))), "max"))
    for row, lp in zip(mine, response_logprobs(backend.model, mine, budget=24, pad_id=0, temperature=1.0,
                                               device=CPU, num_micro=n_micro)):
        row.old_logprobs = lp - 0.1  # off-policy by a constant, so some tokens clip
    num_tokens, num_seqs = global_counts(mine, backend.all_reduce_sum)
    accumulate_gradients(backend.model, mine, LossConfig(), num_tokens=num_tokens, num_seqs=num_seqs,
                         world_size=backend.world_size, budget=24, pad_id=0, temperature=1.0, device=CPU,
                         backward=backend.backward, num_micro=n_micro)
    backend.step()


def main(model_dir: str) -> None:
    rank, world, _ = dist_env()
    torch.distributed.init_process_group("gloo")
    all_rows = rows()
    mine = all_rows[:2] if rank == 0 else all_rows[2:]  # uneven on purpose: 2 vs 4 rows
    for name in ("DDP", "ZeRO-2", "ZeRO-3"):
        model = load_model(model_dir, dtype="float32", device="cpu")
        if name == "DDP":
            backend = Backend(model, OPT, CPU)  # DistributedDataParallel under torchrun
        else:
            ds = deepspeed_config(f"configs/ds_zero{name[-1]}.json", OPT, world, torch.float32)
            backend = DeepSpeedBackend(model, OPT, CPU, ds)
        update(backend, [TrainRow(r.input_ids, r.prompt_len, r.response_mask, r.advantage) for r in mine])
        with backend.full_parameters() as module:
            got = {k: v.detach().clone() for k, v in module.state_dict().items()}
        if rank == 0:
            reference = Backend(load_model(model_dir, dtype="float32", device="cpu"), OPT, CPU, local=True)
            update(reference, [TrainRow(r.input_ids, r.prompt_len, r.response_mask, r.advantage) for r in all_rows])
            initial = load_model(model_dir, dtype="float32", device="cpu").state_dict()
            for key, want in reference.unwrapped.state_dict().items():
                assert "k_proj.bias" in key or not torch.equal(want, initial[key]), f"{key} did not change"
                torch.testing.assert_close(got[key], want, rtol=1e-4, atol=1e-6, msg=f"{name} {key}")
            print(f"{name}: parameters match the single-process update", flush=True)
        torch.distributed.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
