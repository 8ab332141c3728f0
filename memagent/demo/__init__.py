"""The embedded demo (docs/demo.md): a tiny model built offline, the code_lookup task, an oracle teacher and the
supervised warm start. train.py enters it through one optional stage (`DemoStage`, with demo.enabled); the generic
trainer imports nothing of it otherwise."""

from memagent.demo.stage import DemoStage

__all__ = ["DemoStage"]
