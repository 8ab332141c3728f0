"""The learner: the policy being trained, its optimizer, and the collectives of one process, DDP under torchrun, or
DeepSpeed ZeRO 1/2/3.

One interface for the trainer: `backward(loss, is_last)` accumulates (DDP: no_sync until the last micro-batch;
DeepSpeed: the accumulation boundary is the last one), `step()` clips, skips a non-finite update and steps
AdamW and the lr schedule, `generation()` is a context in which the full model can generate (ZeRO-3 gathers the
partitioned parameters once and removes its partition hooks meanwhile, so decoding runs no collective and ranks may
run different numbers of forwards), and the all-reduces the loss normalizer needs.
We drive `torch.distributed` and `deepspeed.initialize` directly: on CPU this is gloo, on GPUs NCCL, chosen at
run time. DeepSpeed on CPU (docs/training.md): the shm-comm op's ~95 s g++ JIT is skipped, and the client
torch AdamW avoids building cpu_adam.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import json
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from memagent.config import OptimConfig

DEEPSPEED_DIR, DEEPSPEED_TAG = "deepspeed", "state"
"""A DeepSpeed checkpoint's folder inside ours, and the tag of its one save in there (OUT/.../deepspeed/state)."""


def dist_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun / the deepspeed launcher's environment; (0, 1, 0) alone."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def pick_device(name: str, local_rank: int) -> torch.device:
    """auto: cuda:LOCAL_RANK when CUDA is available, else cpu."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("run.device=cuda but CUDA is not available: pass --run.device cpu or auto")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device(name)


def init_process_group(device: torch.device, timeout_s: float) -> None:
    """Join the torchrun process group (NCCL on GPUs, gloo on CPU) when WORLD_SIZE > 1.

    timeout_s bounds every collective and the rendezvous: a rank whose peer died where no launcher sees it (another
    node) fails after it with the backend's timeout error, instead of waiting for the backend's default (gloo 30 min).
    """
    _, world, _ = dist_env()
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=timeout_s))
        # At exit, not at the end of train.main: gloo cannot re-join a default group destroyed under torchrun, and a
        # process may run several trainings (tests/train/smoke_train.py's "each").
        atexit.register(close_process_group)


def close_process_group() -> None:
    """Destroy the process group if one is open (registered with atexit by init_process_group).

    Why: a gloo group still open when the interpreter finalizes lets its worker threads outlive the interpreter, and a
    rank can then die with SIGABRT ("terminate called without an active exception") after its run has finished, which
    torchrun reports as a failed run. Local only, no barrier: on a failed run a peer may be gone, and on a finished
    one every collective has completed on every rank before any of them exits.
    """
    if dist.is_initialized():
        dist.destroy_process_group()


def warmup_constant(warmup_steps: int) -> Any:
    """lr multiplier of update u: linear warm-up (u + 1) / warmup_steps, then 1 (MemAgent's constant schedule)."""
    return lambda u: min(1.0, (u + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def make_optimizer(model: nn.Module, cfg: OptimConfig) -> tuple[torch.optim.Optimizer, Any]:
    """Torch AdamW over the trainable parameters and its warm-up-then-constant LambdaLR."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup_constant(cfg.warmup_steps))


class Learner:
    """Plain PyTorch: one process, or DDP across torchrun processes (gradients averaged on the last backward)."""

    name = "torch"
    optimizer_restores_weights = False
    """Whether load_optimizer also restores the weights (DeepSpeed's checkpoint holds the module states)."""

    def __init__(self, model: nn.Module, cfg: OptimConfig, device: torch.device, *, local: bool = False) -> None:
        """local=True: this process alone, even under torchrun (a reference computation in tests)."""
        self.rank, self.world_size, _ = (0, 1, 0) if local else dist_env()
        self.device = device
        self.cfg = cfg
        self.unwrapped = model
        self.optimizer, self.scheduler = make_optimizer(model, cfg)
        self.model: nn.Module = model
        if self.world_size > 1:
            ids = [device.index] if device.type == "cuda" else None
            self.model = nn.parallel.DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)
        self.name = "ddp" if self.world_size > 1 else "torch"

    # ---- collectives (identity on one process)
    def all_reduce(self, tensor: Tensor, op: str = "sum") -> Tensor:
        """SUM or MAX over ranks; returns a new tensor on the CPU."""
        if self.world_size == 1:
            return tensor.clone()
        t = tensor.to(self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return t.cpu()

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        return self.all_reduce(tensor, "sum")

    def all_reduce_max(self, tensor: Tensor) -> Tensor:
        return self.all_reduce(tensor, "max")

    def max_over_ranks(self, n: int) -> int:
        """The largest of one integer over all ranks."""
        return int(self.all_reduce(torch.tensor(n), "max"))

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    # ---- the update
    def backward(self, loss: Tensor, is_last: bool) -> None:
        """Accumulate gradients; DDP reduces them only on the last micro-batch of the update."""
        sync = contextlib.nullcontext() if is_last or self.world_size == 1 else self.model.no_sync()  # type: ignore[operator]
        with sync:
            loss.backward()

    def step(self) -> tuple[float, bool]:
        """Clip to optim.grad_clip, then step, unless the global grad norm is not finite. Returns (norm, skipped)."""
        params = [p for p in self.unwrapped.parameters() if p.requires_grad]
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        skipped = not math.isfinite(norm)
        if not skipped:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm, skipped

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    @contextlib.contextmanager
    def generation(self) -> Iterator[nn.Module]:
        """The full unwrapped model, in eval mode, for rollouts."""
        was_training = self.unwrapped.training
        self.unwrapped.eval()
        try:
            yield self.unwrapped
        finally:
            self.unwrapped.train(was_training)

    # ---- checkpoints
    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[nn.Module]:
        """The unwrapped module with complete parameters (for save_pretrained on rank 0)."""
        yield self.unwrapped

    def save_optimizer(self, directory: Path) -> None:
        """Optimizer and lr-schedule states (rank 0 writes; DDP ranks hold identical copies)."""
        if self.rank == 0:
            torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
                       directory / "optimizer.pt")

    def load_optimizer(self, directory: Path) -> None:
        """Optimizer and lr-schedule states of optimizer.pt; a DeepSpeed checkpoint (no optimizer.pt, a deepspeed/
        folder) gives them through its universal form, with its fp32 master weights (load_deepspeed_state)."""
        if not (directory / "optimizer.pt").is_file() and (directory / DEEPSPEED_DIR).is_dir():
            load_deepspeed_state(directory / DEEPSPEED_DIR / DEEPSPEED_TAG, self.unwrapped, self.optimizer,
                                 self.scheduler)
            return
        state = torch.load(directory / "optimizer.pt", map_location=self.device, weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


def load_deepspeed_state(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """Restore a DeepSpeed checkpoint of any ZeRO stage and number of ranks into one process's model and AdamW.

    DeepSpeed's universal-checkpoint converter (deepspeed.checkpoint.ds_to_universal, run here into a temporary
    directory under TMPDIR that holds about three fp32 copies of the model) merges the ranks' partitions into one
    folder per parameter: its fp32 master becomes the parameter (exact after a bf16 run too), exp_avg, exp_avg_sq and
    the step its AdamW state. The lr schedule is DeepSpeed's copy of ours.
    """
    from deepspeed.checkpoint import ds_to_universal

    with tempfile.TemporaryDirectory(prefix="memagent-universal-") as tmp:
        # ZeRO-1/2 checkpoints lack the universal-format version tag that only Megatron-DeepSpeed writes: inject it.
        ds_to_universal.main(argparse.Namespace(input_folder=str(folder), output_folder=tmp, num_extract_workers=1,
                                                num_merge_workers=1, keep_temp_folder=False, strict=True,
                                                inject_missing_state=True))
        root = Path(tmp) / "zero"
        common = torch.load(root / "optimizer_state.pt", map_location="cpu", weights_only=False)
        flat_states = common.get("optimizer_state_dict", {}).get("state", {})  # ZeRO-3: the step per flat group
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            if not (root / name).is_dir():
                raise ValueError(f"{folder}: the DeepSpeed checkpoint has no parameter {name} (another model?)")
            files = {key: _universal_tensor(root / name / f"{key}.pt") for key in ("fp32", "exp_avg", "exp_avg_sq")}
            if files["fp32"].numel() != param.numel():
                raise ValueError(f"{folder}: {name} has {files['fp32'].numel()} elements, the model {param.numel()}")
            step = _universal_tensor(root / name / "step.pt") if (root / name / "step.pt").is_file() else \
                next(iter(flat_states.values()))["step"]
            with torch.no_grad():
                param.copy_(files["fp32"].view_as(param))
            optimizer.state[param] = {"step": torch.tensor(float(step)),
                                      **{k: files[k].view_as(param).to(param) for k in ("exp_avg", "exp_avg_sq")}}
    model_states = torch.load(sorted(folder.glob("*model_states.pt"))[0], map_location="cpu", weights_only=False)
    scheduler.load_state_dict(model_states["lr_scheduler"])
    for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr(), strict=True):
        group["lr"] = lr


def _universal_tensor(path: Path) -> Tensor:
    """One file of a universal checkpoint: a tensor (ZeRO-3) or {"param": tensor, "cat_dim": ...} (ZeRO-1/2)."""
    data = torch.load(path, map_location="cpu", weights_only=False)
    return data["param"] if isinstance(data, dict) else data


def skip_deepspeed_cpu_jit() -> None:
    """On CPU, DeepSpeed builds its shm-comm op with g++ (~95 s) at init; gloo does not need it (docs/training.md)."""
    import deepspeed.comm.torch  # noqa: F401  (the module object is only reachable through sys.modules)

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # type: ignore[attr-defined]


def deepspeed_config(path: str, cfg: OptimConfig, world_size: int, dtype: torch.dtype) -> dict[str, Any]:
    """Read a ds_zero*.json and fill its "auto" values from our config (HF convention)."""
    ds = json.loads(Path(path).read_text())
    fill = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,  # we mark the accumulation boundary ourselves (last micro-batch)
        "train_batch_size": world_size,
        "gradient_clipping": cfg.grad_clip,
    }
    for key, value in fill.items():
        if ds.get(key, "auto") == "auto":
            ds[key] = value
    for key, enabled in (("bf16", dtype == torch.bfloat16), ("fp16", False)):
        section = ds.setdefault(key, {})
        if section.get("enabled", "auto") == "auto":
            section["enabled"] = enabled
    types = ds.setdefault("data_types", {})
    if types.get("grad_accum_dtype", "auto") == "auto":
        types["grad_accum_dtype"] = "fp32"  # bf16 weights: micro-batch gradients add up in fp32, not in bf16
    if "optimizer" in ds or "scheduler" in ds:
        raise ValueError(f"{path}: remove 'optimizer'/'scheduler'; train.py passes torch AdamW and its lr schedule")
    return ds


class DeepSpeedLearner(Learner):
    """DeepSpeed ZeRO 1/2/3 with the client torch AdamW; gradient averaging and clipping are DeepSpeed's."""

    optimizer_restores_weights = True

    def __init__(self, model: nn.Module, cfg: OptimConfig, device: torch.device, ds_config: dict[str, Any]) -> None:
        if device.type == "cpu":
            skip_deepspeed_cpu_jit()
        import deepspeed

        self.rank, self.world_size, _ = dist_env()
        self.device, self.cfg, self.unwrapped = device, cfg, model
        self.stage = int(ds_config.get("zero_optimization", {}).get("stage", 0))
        self.name = f"deepspeed-zero{self.stage}"
        optimizer, scheduler = make_optimizer(model, cfg)
        self.model, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config,
            dist_init_required=not dist.is_initialized(),
        )
        self.engine = self.model

    def backward(self, loss: Tensor, is_last: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(is_last)
        self.engine.backward(loss)

    def step(self) -> tuple[float, bool]:
        """DeepSpeed clips to gradient_clipping and skips the update (and the lr step) on a non-finite norm."""
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        norm = float("nan") if norm is None else float(norm)
        return norm, not math.isfinite(norm)

    @contextlib.contextmanager
    def generation(self) -> Iterator[nn.Module]:
        """ZeRO-3: every rank gathers the full parameters once (a collective on enter and exit) and DeepSpeed's
        partition hooks are off meanwhile, so decoding is local: no per-layer re-gather per token, which would be a
        collective and hang ranks that run different numbers of forwards (DeepSpeed's unwrap_model_for_generation)."""
        if self.stage < 3:
            with super().generation() as m:
                yield m
            return
        from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation

        with unwrap_model_for_generation(self.engine), super().generation() as m:
            yield m

    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[nn.Module]:
        if self.stage < 3:
            yield self.unwrapped
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.unwrapped.parameters()), modifier_rank=None):
            yield self.unwrapped

    def save_optimizer(self, directory: Path) -> None:
        """Every rank writes its optimizer partition (DeepSpeed's own layout) under directory/deepspeed."""
        self.engine.save_checkpoint(str(directory / DEEPSPEED_DIR), tag=DEEPSPEED_TAG)

    def load_optimizer(self, directory: Path) -> None:
        self.engine.load_checkpoint(str(directory / DEEPSPEED_DIR), tag=DEEPSPEED_TAG, load_optimizer_states=True,
                                    load_lr_scheduler_states=True)


def resolve_deepspeed_path(flag: str, environ: dict[str, str] | os._Environ[str]) -> str:
    """The DeepSpeed config to use: --deepspeed, or the file of an `accelerate launch` DeepSpeed config.

    accelerate's launcher only exports its DeepSpeed settings (ACCELERATE_USE_DEEPSPEED,
    ACCELERATE_DEEPSPEED_CONFIG_FILE, ACCELERATE_DEEPSPEED_ZERO_STAGE, ...); train.py wraps the model itself, so it
    honours a config file and refuses plugin-only settings (a ZeRO stage without a file) instead of running DDP.
    """
    if environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true":
        return flag
    file = environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "")
    if not file or file == "none":
        raise ValueError("accelerate launch asks for DeepSpeed without a deepspeed_config_file: train.py does not "
                         "read accelerate's DeepSpeed plugin settings; set deepspeed_config_file (e.g. "
                         "configs/ds_zero2.json) in the accelerate config, or pass --deepspeed FILE")
    if flag and Path(flag).resolve() != Path(file).resolve():
        raise ValueError(f"--deepspeed {flag} and accelerate's deepspeed_config_file {file} differ: give one of them")
    return file


def make_learner(model: nn.Module, cfg: OptimConfig, device: torch.device, deepspeed_path: str,
                 dtype: torch.dtype) -> Learner:
    """DeepSpeed when a config file is given, else plain PyTorch (DDP when launched with several processes)."""
    if deepspeed_path:
        _, world, _ = dist_env()
        return DeepSpeedLearner(model, cfg, device, deepspeed_config(deepspeed_path, cfg, world, dtype))
    return Learner(model, cfg, device)
