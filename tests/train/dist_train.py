"""Driver for test_distributed.py, run under `accelerate launch --use_deepspeed --deepspeed_config_file
configs/ds_zero2.json --num_processes 2`: train.py's main on the default tiny preset WITH its warm start (small step
counts), KL on, three times in one launch:

  OUT/zero2: no --deepspeed flag: the accelerate DeepSpeed config must be honoured (not plain DDP);
  OUT/zero1: --deepspeed configs/ds_zero1.json (accelerate's variables cleared first);
  OUT/zero3: --deepspeed OUT/zero3_partitioned.json, every parameter partitioned (persistence threshold 0, small
             live-parameter and prefetch limits).

The RL lr is so small that the update cannot move a weight, so each step-1 checkpoint must equal OUT/*/warm_start
(the test compares them), and the KL reference is the warm-started model, so the step's KL is 0. The reward is
test_train.py's stand-in (the answer's length parity), so groups have a reward spread and the update a gradient;
overlong shaping is off, since its penalty can cancel that spread exactly (a full-length right answer, 1 - 1, ties a
short wrong one, 0 + 0: it did, and the step had no gradient).

usage: accelerate launch ... tests/train/dist_train.py OUT TINY_MODEL_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from memagent import train
from memagent.rl import rewards

# The tiny preset's recipe, shrunk: a few compact-pretraining and SFT updates, one RL step at lr 1e-30.
SMALL = ["--demo.pretrain-steps", "3", "--demo.pretrain-batch", "4", "--demo.steps", "2",
         "--demo.batch-questions", "2", "--demo.chunks", "2", "--rollout.batch-size", "2",
         "--rollout.group-size", "2", "--rollout.dynamic-sampling", "false", "--data.num-train", "8",
         "--data.num-eval", "2", "--data.eval-chunk-factors", "1", "--optim.lr", "1e-30", "--optim.mini-batches", "1",
         "--optim.micro-batch-tokens", "1200", "--loss.kl-coef", "0.01", "--run.steps", "1", "--run.progress", "false",
         "--rollout.overlong-shaping", "false"]
PARTITIONED = {"stage3_param_persistence_threshold": 0, "stage3_model_persistence_threshold": 0,
               "stage3_max_live_parameters": 1000, "stage3_prefetch_bucket_size": 1000}


def main(out: Path, tiny_dir: str) -> None:
    common = ["--demo.model-dir", tiny_dir, *SMALL]
    rewards.VERIFIERS["strict"] = lambda response, golds: float(len(response) % 2)
    assert os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true", "launch this driver with accelerate --use_deepspeed"
    train.main(["--output-dir", str(out / "zero2"), *common])
    for name in [k for k in os.environ if k.startswith("ACCELERATE_")]:
        del os.environ[name]
    train.main(["--output-dir", str(out / "zero1"), "--deepspeed", "configs/ds_zero1.json", *common])
    ds = json.loads(Path("configs/ds_zero3.json").read_text())
    ds["zero_optimization"].update(PARTITIONED)
    partitioned = out / "zero3_partitioned.json"
    if os.environ.get("RANK", "0") == "0":
        partitioned.write_text(json.dumps(ds))
    dist.barrier()
    train.main(["--output-dir", str(out / "zero3"), "--deepspeed", str(partitioned), *common])


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
