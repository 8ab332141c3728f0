"""Training configuration: frozen dataclasses per concern, presets, and command-line / file overrides."""

from memagent.config.overrides import build_parser, load_config, make_config, preset_config
from memagent.config.presets import PRESETS
from memagent.config.schema import (
    DataConfig,
    DemoConfig,
    EvalConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    RunConfig,
    TrainConfig,
)
from memagent.rollout.prompts import WorkflowConfig

__all__ = [
    "PRESETS",
    "DataConfig",
    "DemoConfig",
    "EvalConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainConfig",
    "WorkflowConfig",
    "build_parser",
    "load_config",
    "make_config",
    "preset_config",
]
