"""Plumbing of the trainer (memagent/train.py): run setup, the learner (one process, DDP, DeepSpeed), checkpoints,
held-out accuracy, logging, `--dry-run` sizing.

Import the modules themselves (memagent.training.checkpoint, ...): this file imports nothing, so that loading one
module does not load the others. It exists so that `pip install .` ships the package (setuptools' `find:` skips a
directory without it).
"""
