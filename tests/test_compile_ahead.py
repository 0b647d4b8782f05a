"""Compiling a schedule's new kernels ahead (scheduler/compile_ahead.py): batches built while the next kernels are
lowered give the same values, and a cold compile of many kernels shows a progress bar on stderr when asked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ember as em
from ember.scheduler import compile_cache
from ember.scheduler.compile_ahead import PROGRESS_MIN_KERNELS


def _many_kernels(count: int, device: str) -> tuple[list[em.Tensor], list[np.ndarray]]:
    """`count` outputs of distinct shapes (so distinct kernels), each its own kernel, and their numpy values."""
    generator = np.random.default_rng(13)
    outputs, expected = [], []
    for index in range(count):
        data = generator.standard_normal((index + 2, 3), dtype=np.float32)
        outputs.append((em.tensor(data, device=device) * 1.5 + 0.25).exp().sum(0))
        expected.append(np.exp(data * np.float32(1.5) + np.float32(0.25)).sum(0))
    return outputs, expected


@pytest.fixture
def cold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty disk cache and an empty in-memory compile cache: every kernel is compiled."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_cache, "COMPILED", compile_cache.CompileCache())


@pytest.mark.parametrize("progress", ["1", "0"])
def test_a_cold_realize_of_many_kernels_shows_progress_when_asked(cold: None, progress: str,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EMBER_PROGRESS", progress)
    count = PROGRESS_MIN_KERNELS + 2
    outputs, expected = _many_kernels(count, "c")
    with em.profile() as record:
        em.realize(*outputs)
    assert len(record.compiles) == count  # all compiled ahead, each once
    for output, values in zip(outputs, expected):
        np.testing.assert_allclose(output.numpy(), values, rtol=1e-5)
    error = capsys.readouterr().err
    if progress == "1":
        assert f"compiling {count} kernels for c:0" in error and f"0/{count}" in error
    else:
        assert "compiling" not in error


def test_no_progress_for_few_kernels_or_without_a_terminal(cold: None, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EMBER_PROGRESS", "1")
    outputs, expected = _many_kernels(PROGRESS_MIN_KERNELS - 1, "c")
    em.realize(*outputs)
    monkeypatch.delenv("EMBER_PROGRESS")  # captured stderr is not a terminal
    more, more_expected = _many_kernels(PROGRESS_MIN_KERNELS + 3, "c")
    doubled = [output * 2 for output in more]
    em.realize(*doubled)
    assert "compiling" not in capsys.readouterr().err
    for output, values in zip(outputs + doubled, expected + [values * 2 for values in more_expected]):
        np.testing.assert_allclose(output.numpy(), values, rtol=1e-5)
