"""The README's demo: examples/train_digits.py trains its CNN on the digits to at least 97% test accuracy."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parent.parent / "examples" / "train_digits.py"


@pytest.mark.xdist_group("demo")
def test_demo_reaches_97_percent() -> None:
    specification = importlib.util.spec_from_file_location("train_digits", DEMO)
    module = importlib.util.module_from_spec(specification)
    sys.modules["train_digits"] = module
    specification.loader.exec_module(module)
    result = module.train(progress=False)
    assert result.accuracy >= 0.97, result
    assert result.steps == 10 * (1437 // 64)
    assert 0 < result.kernels_per_step <= 60, result  # forward, backward and update fused into few kernels
