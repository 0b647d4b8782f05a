"""A training step leaves no reference cycles among ember's objects: its graph, tensors and device buffers go by
reference counting when the step's last tensor goes, not when Python's cycle collector next runs a full collection
(which, over a large lazy graph, cost an LSTM step ~15% of its time and kept every step's buffers alive until then).
Each step's loss is checked against torch, so the step is the real one."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
import ember.nn as enn
import ember.nn.functional as F
import ember.optim as eoptim


@contextmanager
def cyclic_ember_garbage() -> Iterator[list[str]]:
    """Collects what is already garbage, then lists (by type) the ember objects that only the cycle collector could
    free among what the body leaves behind."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    found: list[str] = []
    try:
        yield found
    finally:
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            found.extend(sorted({type(item).__qualname__ for item in gc.garbage
                                 if type(item).__module__.startswith("ember")}))
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            if was_enabled:
                gc.enable()


def _recurrent(kind: str) -> tuple[Callable[[Any], Any], Callable[[Any], Any], Any, Any]:
    """An embedding-free two-layer (bidirectional) recurrent classifier in ember and in torch with equal weights."""
    torch.manual_seed(0)
    torch_layer = getattr(torch.nn, kind)(6, 8, num_layers=2, bidirectional=True)
    layer = getattr(enn, kind)(6, 8, num_layers=2, bidirectional=True)
    layer.load_state_dict(torch_layer.state_dict())
    return (lambda x: layer(x)[0].square().mean()), (lambda x: torch_layer(x)[0].square().mean()), layer, torch_layer


def _convolutional() -> tuple[Callable[[Any], Any], Callable[[Any], Any], Any, Any]:
    """conv 3x3 -> batch norm -> ReLU -> max pool -> linear, as in the tutorial CNN."""
    def build(nn: Any) -> Any:
        return nn.Sequential(nn.Conv2d(6, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(4 * 2 * 2, 3))
    torch.manual_seed(0)
    torch_model, model = build(torch.nn), build(enn)
    model.load_state_dict(torch_model.state_dict())
    return ((lambda x: model(x.reshape(2, 6, 4, 4)).square().mean()),
            (lambda x: torch_model(x.reshape(2, 6, 4, 4)).square().mean()), model, torch_model)


def _attention() -> tuple[Callable[[Any], Any], Callable[[Any], Any], Any, Any]:
    """One causal self-attention block through scaled_dot_product_attention, with layer norm and a residual."""
    def build(nn: Any) -> Any:
        return nn.ModuleDict({"norm": nn.LayerNorm(6), "qkv": nn.Linear(6, 18), "out": nn.Linear(6, 6)})

    def forward(modules: Any, functional: Any, x: Any) -> Any:
        x = x.reshape(4, 8, 6)
        query, key, value = modules["qkv"](modules["norm"](x)).split(6, dim=-1)
        attended = functional.scaled_dot_product_attention(query, key, value, is_causal=True)
        return (x + modules["out"](attended)).square().mean()
    torch.manual_seed(0)
    torch_model, model = build(torch.nn), build(enn)
    model.load_state_dict(torch_model.state_dict())
    return ((lambda x: forward(model, F, x)), (lambda x: forward(torch_model, torch.nn.functional, x)), model,
            torch_model)


MODELS = {"LSTM": lambda: _recurrent("LSTM"), "GRU": lambda: _recurrent("GRU"), "RNN": lambda: _recurrent("RNN"),
          "conv_batchnorm": _convolutional, "attention": _attention}


@pytest.mark.parametrize("name", list(MODELS))
def test_training_steps_leave_no_cyclic_garbage(name: str) -> None:
    loss_of, torch_loss_of, model, torch_model = MODELS[name]()
    optimizer = eoptim.Adam(model.parameters(), lr=1e-2)
    torch_optimizer = torch.optim.Adam(torch_model.parameters(), lr=1e-2)
    data = np.random.default_rng(0).standard_normal((3, 32, 6)).astype(np.float32).reshape(3, 4, 8, 6)
    for step, batch in enumerate(data):  # the first step creates the optimizer's state; the later ones replay
        with cyclic_ember_garbage() as garbage:
            loss = loss_of(em.tensor(batch))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            value = loss.item()
            del loss
        torch_loss = torch_loss_of(torch.tensor(batch))
        torch_optimizer.zero_grad()
        torch_loss.backward()
        torch_optimizer.step()
        assert abs(value - torch_loss.item()) <= 1e-4 * max(1.0, abs(torch_loss.item())), (step, value)
        assert garbage == [], f"step {step} of {name} left ember objects in reference cycles: {garbage}"
