"""Fixtures of the evaluation tests: the evaluate.py script module."""

from __future__ import annotations

from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def evaluate() -> ModuleType:
    """The evaluation script, memagent/evaluate.py (evaluate.py at the repo root runs its cli())."""
    from memagent import evaluate as module

    return module

