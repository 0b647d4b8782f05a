"""Realizing pauses Python's cyclic garbage collector and gives it back as it found it (ember/collection_pause.py)."""

import gc

import numpy as np
import pytest

import ember as em
from ember.collection_pause import collection_paused


def _realize_and_watch(monkeypatch) -> list[bool]:
    """Realize a small graph, recording whether the collector was on while its kernels were chosen (lowered here,
    not read from the disk cache of lowered kernels)."""
    from ember.ir import lowered_cache, opt
    from ember.scheduler import compile_cache

    seen: list[bool] = []
    callbacks = gc.callbacks
    original = opt.choose_plan

    def watching(*arguments):
        seen.append(gc.isenabled())
        return original(*arguments)

    monkeypatch.setattr(opt, "choose_plan", watching)
    monkeypatch.setattr(lowered_cache, "load", lambda *arguments: None)
    monkeypatch.setattr(compile_cache, "COMPILED", type(compile_cache.COMPILED)())
    x = em.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    value = ((x * 3.5 + 1).exp().sum(1) + 0.123456).numpy()
    np.testing.assert_allclose(value, (np.exp(np.arange(12, dtype=np.float32).reshape(3, 4) * 3.5 + 1)).sum(1)
                               + 0.123456, rtol=1e-5)
    assert gc.callbacks is callbacks
    return seen


def test_realize_pauses_the_collector_and_turns_it_back_on(monkeypatch):
    assert gc.isenabled()
    seen = _realize_and_watch(monkeypatch)
    assert seen and not any(seen), "kernels were lowered with the collector on"
    assert gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off(monkeypatch):
    gc.disable()
    try:
        _realize_and_watch(monkeypatch)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_nested_pauses_and_errors_give_the_collector_back():
    with pytest.raises(RuntimeError, match="inside"):
        with collection_paused():
            with collection_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
            raise RuntimeError("inside")
    assert gc.isenabled()



def _collections_inside(monkeypatch, owner, name: str, work) -> tuple[int, object]:
    """How many cyclic collections ran while `owner.name` (wrapped here) was running during `work()`, with the
    collector made to run every 10 allocations (so a stretch that left it on would be seen), and work's result."""
    inside = []
    runs = []
    original = getattr(owner, name)

    def watched(*arguments, **keywords):
        inside.append(True)
        try:
            return original(*arguments, **keywords)
        finally:
            inside.pop()

    def count(phase, info):
        if phase == "start" and inside:
            runs.append(info["generation"])

    monkeypatch.setattr(owner, name, watched)
    threshold = gc.get_threshold()
    gc.callbacks.append(count)
    gc.set_threshold(10, 10, 10)
    try:
        result = work()
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(count)
    return len(runs), result


def test_backward_builds_the_gradients_with_the_collector_paused(monkeypatch):
    """backward's graph of gradients (many short-lived objects, no cycles) is built and realized without a cyclic
    collection: a training step's graph is not promoted to the old generation, whose full passes walk every object
    the program holds. The gradients match torch."""
    import torch

    from ember.autograd import engine

    data = np.linspace(-2.0, 2.0, 24, dtype=np.float32).reshape(4, 6)
    x = em.tensor(data, requires_grad=True)
    loss = x
    for _ in range(20):
        loss = (loss * 1.01 + 0.1).tanh()
    loss = loss.sum()
    runs, _ = _collections_inside(monkeypatch, engine, "_propagate", loss.backward)
    assert runs == 0
    assert gc.isenabled()
    expected = torch.tensor(data, requires_grad=True)
    reference = expected
    for _ in range(20):
        reference = (reference * 1.01 + 0.1).tanh()
    reference.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), expected.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_a_recurrent_layer_records_its_time_steps_with_the_collector_paused(monkeypatch):
    """An LSTM's time steps (hundreds of recorded ops) run without a cyclic collection; outputs match torch."""
    import torch

    from ember.nn.rnn import RNNBase

    em.manual_seed(0)
    layer = em.nn.LSTM(3, 5, num_layers=2)
    reference = torch.nn.LSTM(3, 5, num_layers=2)
    reference.load_state_dict({key: torch.tensor(value.numpy()) for key, value in layer.state_dict().items()})
    data = np.linspace(-1.0, 1.0, 7 * 2 * 3, dtype=np.float32).reshape(7, 2, 3)
    inputs = em.tensor(data)
    runs, (output, _) = _collections_inside(monkeypatch, RNNBase, "_recurrence", lambda: layer(inputs))
    assert runs == 0
    assert gc.isenabled()
    np.testing.assert_allclose(output.numpy(), reference(torch.tensor(data))[0].detach().numpy(), rtol=1e-4,
                               atol=1e-5)


def test_importing_ember_raises_the_young_threshold_unless_the_program_set_its_own():
    import subprocess
    import sys

    script = ("import gc{before}; import ember; from ember.collection_pause import YOUNG_GENERATION_THRESHOLD as T;"
              " print(gc.get_threshold(), T)")
    tuned = subprocess.run([sys.executable, "-c", script.format(before="")], capture_output=True, text=True,
                           check=True).stdout.split(") ")
    assert tuned[0] + ")" == f"({int(tuned[1])}, 10, 10)"
    kept = subprocess.run([sys.executable, "-c", script.format(before="; gc.set_threshold(500, 5, 5)")],
                          capture_output=True, text=True, check=True).stdout
    assert kept.startswith("(500, 5, 5)")


def _passes_during_training(steps: int) -> int:
    """How many collector passes (any generation) a small MLP's training steps set off."""
    from ember import nn, optim

    em.manual_seed(0)
    layers = [layer for _ in range(6) for layer in (nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU())]
    model = nn.Sequential(*layers, nn.Linear(64, 10))
    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    inputs, labels = em.randn(32, 64), em.randint(0, 10, (32,))

    def step() -> float:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        return loss.item()

    for _ in range(3):  # (compiles, the optimizer's replay)
        step()
    passes = []
    callback = lambda phase, info: passes.append(info["generation"]) if phase == "start" else None  # noqa: E731
    gc.collect()
    gc.callbacks.append(callback)
    try:
        for _ in range(steps):
            step()
    finally:
        gc.callbacks.remove(callback)
    return len(passes)


def test_a_training_step_sets_off_few_collector_passes():
    """A step's graph lives for the whole step: with Python's threshold of 700 allocations the collector passed
    over it (and promoted it) about once every one to four steps (four since backward passes replay: they build no
    gradients' graph); with ember's a few times in sixty steps."""
    from ember.collection_pause import YOUNG_GENERATION_THRESHOLD

    before = gc.get_threshold()
    try:
        gc.set_threshold(YOUNG_GENERATION_THRESHOLD, *before[1:])
        tuned = _passes_during_training(60)
        gc.set_threshold(700, *before[1:])
        default = _passes_during_training(60)
    finally:
        gc.set_threshold(*before)
    assert default >= 6 and 3 * tuned <= default, (tuned, default)
