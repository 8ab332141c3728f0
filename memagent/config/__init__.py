"""Training configuration: frozen dataclasses per concern, presets, and command-line / file overrides."""

from memagent.config.overrides import build_parser, load_config, make_config, preset_config
from memagent.config.presets import PRESETS
from memagent.config.schema import (
    DataConfig,
    EvalConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    RunConfig,
    TrainConfig,
    WarmStartConfig,
    WorkflowConfig,
)

__all__ = [
    "PRESETS",
    "DataConfig",
    "EvalConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainConfig",
    "WarmStartConfig",
    "WorkflowConfig",
    "build_parser",
    "load_config",
    "make_config",
    "preset_config",
]
