"""In-place updates under ember.jit and the buffers they write: a value assigned twice before a realize still
replaces its buffer (so a replay never reads and writes one buffer at different positions: that gave silently wrong
values), an argument updated in place replays on every device (wgpu binds an input that is also the output
read_write), and a write through a view is done in place when its movement ops cancel. Checked against torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.capture.jit import JitError
from tests.helpers import assert_close

SIZE = 1 << 20  # large enough that the c backend splits the kernel over threads


def _double_then_flip(state: Any, offset: Any) -> Any:
    state.mul_(2)
    state.copy_(state.flip(0) + offset)  # reads other positions of the value it replaces
    return state.sum()


def test_state_assigned_twice_replays_like_torch(device: str) -> None:
    values = (np.arange(SIZE) % 7).astype(np.float32)
    state, expected = em.tensor(values, device=device).realize(), torch.tensor(values)
    offset = em.ones(1, device=device)

    def step(offset: em.Tensor) -> em.Tensor:
        total = _double_then_flip(state, offset)
        state.realize()
        return total

    jitted = em.jit(step)
    for _ in range(5):
        jitted(offset)
        _double_then_flip(expected, torch.ones(1))
        assert_close(state, expected)
    assert jitted.replays == 3


def test_argument_assigned_twice_reading_other_positions_raises(device: str) -> None:
    jitted = em.jit(_double_then_flip)
    values = (np.arange(SIZE) % 7).astype(np.float32)
    argument, offset = em.tensor(values, device=device).realize(), em.ones(1, device=device)
    jitted(argument, offset)
    with pytest.raises(JitError, match="changes an argument in place"):
        jitted(argument, offset)


def test_argument_updated_in_place_replays_on_every_device(device: str) -> None:
    @em.jit
    def update(state: em.Tensor) -> em.Tensor:
        state.add_(1)
        state.mul_(state)  # two assigns, both reading the value only at their own positions
        return state

    ours, theirs = em.tensor(np.linspace(-1, 1, 12, dtype=np.float32), device=device), torch.linspace(-1, 1, 12)
    for _ in range(4):
        result = update(ours)
        theirs.add_(1)
        theirs.mul_(theirs)
        assert result is ours
        assert_close(ours, theirs, atol=1e-3, rtol=1e-3)
    assert update.replays == 2


def test_writes_through_views_reuse_the_buffer(device: str) -> None:
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    ours, theirs = em.tensor(values, device=device).realize(), torch.tensor(values)
    buffer = ours.node.buffer
    for x in (ours, theirs):
        x[1:3].add_(1)
        x.t()[0].mul_(2)
        x.view(12)[::5].neg_()
    ours.realize()
    assert ours.node.buffer is buffer
    assert_close(ours, theirs)
    flipped = ours.flip(0)  # reads other positions: the write needs a new buffer
    ours.copy_(flipped * 1)
    theirs.copy_(theirs.flip(0))
    assert_close(ours, theirs)
