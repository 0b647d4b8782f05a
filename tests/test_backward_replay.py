"""Backward passes replayed (autograd/backward_replay.py): the later steps of a training loop run the program an
earlier step's backward ran and give torch's gradients, parameters and running statistics; a pass that a replay could
get wrong runs eagerly (hooks, retain_graph, a parameter changed in place), a failed value check still raises, and
a replayed pass frees its history and runs post-accumulate hooks as the eager pass does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import ember as em
import ember.nn.functional as F
from ember.autograd.backward_replay import REPLAYS
from ember.core.errors import AutogradError
from ember.settings import CONFIG
from tests.helpers import assert_close

FEATURES, HIDDEN, CLASSES = 12, 16, 5


def _models(lib: Any, device: str, normalization: bool) -> Any:
    nn = lib.nn
    layers = [nn.Linear(FEATURES, HIDDEN)]
    if normalization:
        layers.append(nn.BatchNorm1d(HIDDEN))
    layers += [nn.ReLU(), nn.Linear(HIDDEN, CLASSES)]
    return nn.Sequential(*layers).to(device)


def _pair(device: str, normalization: bool = False) -> tuple[Any, torch.nn.Module]:
    """An ember model and a torch model with the same weights."""
    torch.manual_seed(3)
    theirs = _models(torch, "cpu", normalization)
    mine = _models(em, device, normalization)
    mine.load_state_dict({name: em.tensor(value.detach().numpy(), device=device)
                          for name, value in theirs.state_dict().items()})
    return mine, theirs


def _batches(count: int, rows: int = 8, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    generator = np.random.default_rng(seed)
    return [(generator.normal(size=(rows, FEATURES)).astype(np.float32),
             generator.integers(0, CLASSES, size=rows).astype(np.int64)) for _ in range(count)]


def _compare(mine: Any, theirs: torch.nn.Module, gradients: bool = True) -> None:
    for (name, value), (_, expected) in zip(mine.named_parameters(), theirs.named_parameters()):
        assert_close(value, expected.detach(), atol=1e-5, rtol=1e-4)
        if gradients:
            assert value.grad is not None and expected.grad is not None, name
            assert_close(value.grad, expected.grad, atol=1e-5, rtol=1e-4)
    for (name, value), (_, expected) in zip(mine.named_buffers(), theirs.named_buffers()):
        np.testing.assert_allclose(value.numpy(), expected.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("normalization", [False, True])
def test_training_steps_replay_and_match_torch(device: str, normalization: bool) -> None:
    """Six steps of a classifier (cross-entropy with its target check, SGD with momentum; BatchNorm's running
    statistics updated in place in the same program): the later steps are replays, and every step's loss, gradients,
    parameters and running statistics are torch's. New label tensors each step keep a pending check on each loss.
    On c the replays are bound to buffers (autograd/bound_backward.py: BatchNorm's assigns among what a run
    leaves)."""
    mine, theirs = _pair(device, normalization)
    my_optimizer = em.optim.SGD(mine.parameters(), lr=0.1, momentum=0.9)
    their_optimizer = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    before, bound = REPLAYS.replayed, REPLAYS.bound
    for features, labels in _batches(6):
        my_optimizer.zero_grad()
        their_optimizer.zero_grad()
        loss = F.cross_entropy(mine(em.tensor(features, device=device)), em.tensor(labels, device=device))
        expected = torch.nn.functional.cross_entropy(theirs(torch.tensor(features)), torch.tensor(labels))
        loss.backward()
        expected.backward()
        assert_close(loss, expected.detach(), atol=1e-5, rtol=1e-5)
        _compare(mine, theirs)
        my_optimizer.step()
        their_optimizer.step()
    _compare(mine, theirs, gradients=False)
    assert REPLAYS.replayed - before >= 3, "the later steps were not replayed"
    assert (REPLAYS.bound - bound >= 3) == device.startswith("c:")  # (where launches rebind in place)


def test_gradients_accumulate_over_replayed_passes(device: str) -> None:
    """Two micro-batches a step, zero_grad once a step: the second backward adds to existing gradients (a
    signature of its own), as torch accumulates them."""
    mine, theirs = _pair(device)
    before = REPLAYS.replayed
    batches = _batches(8, seed=1)
    for step in range(4):
        for parameter in mine.parameters():
            parameter.grad = None
        theirs.zero_grad()
        for features, labels in batches[2 * step:2 * step + 2]:
            F.cross_entropy(mine(em.tensor(features, device=device)), em.tensor(labels, device=device)).backward()
            torch.nn.functional.cross_entropy(theirs(torch.tensor(features)), torch.tensor(labels)).backward()
        _compare(mine, theirs)
    assert REPLAYS.replayed - before >= 2


def test_passes_a_replay_could_get_wrong_run_eagerly(device: str) -> None:
    """A hook on an intermediate (it changes the gradient), retain_graph with a second backward, and a weight
    changed in place between the forward and the backward (torch's error): torch's result each time, none
    replayed."""
    mine, theirs = _pair(device)
    before = REPLAYS.replayed
    for features, labels in _batches(4, seed=2):
        hidden = mine[0](em.tensor(features, device=device))
        hidden.register_hook(lambda gradient: gradient * 3.0)
        F.cross_entropy(mine[2](mine[1](hidden)), em.tensor(labels, device=device)).backward()
        their_hidden = theirs[0](torch.tensor(features))
        their_hidden.register_hook(lambda gradient: gradient * 3.0)
        torch.nn.functional.cross_entropy(theirs[2](theirs[1](their_hidden)), torch.tensor(labels)).backward()
        _compare(mine, theirs)
    for features, labels in _batches(3, seed=3):
        loss = F.cross_entropy(mine(em.tensor(features, device=device)), em.tensor(labels, device=device))
        loss.backward(retain_graph=True)
        loss.backward()
        expected = torch.nn.functional.cross_entropy(theirs(torch.tensor(features)), torch.tensor(labels))
        expected.backward(retain_graph=True)
        expected.backward()
        _compare(mine, theirs)
    assert REPLAYS.replayed == before
    features, labels = _batches(1, seed=4)[0]
    loss = F.cross_entropy(mine(em.tensor(features, device=device)), em.tensor(labels, device=device))
    with em.no_grad():
        mine[2].weight.add_(1.0)
    with pytest.raises(AutogradError, match="modified by an inplace operation"):
        loss.backward()


def test_failed_check_raises_in_a_replayed_pass(device: str) -> None:
    """Once a classifier's backward is replayed, a label out of range still raises at the backward (as the eager
    pass's realize does), and the gradients computed from the wrong values raise when read."""
    mine, _ = _pair(device)

    def targets(labels: np.ndarray) -> em.Tensor:  # (computed on the device: checked lazily, not at the call)
        return em.tensor(labels, device=device) * 1

    for features, labels in _batches(4, seed=5):
        F.cross_entropy(mine(em.tensor(features, device=device)), targets(labels)).backward()
    before = REPLAYS.replayed
    features, labels = _batches(1, seed=6)[0]
    labels[3] = CLASSES + 2
    loss = F.cross_entropy(mine(em.tensor(features, device=device)), targets(labels))
    with pytest.raises(IndexError, match="Target 7 at position"):
        loss.backward()
    assert REPLAYS.replayed == before + 1, "the failing pass was not a replay"
    with pytest.raises(IndexError, match="Target 7 at position"):
        mine[2].bias.grad.numpy()


def test_replayed_pass_frees_its_history_and_runs_post_accumulate_hooks(device: str) -> None:
    """A replayed pass frees the history it walked (a second backward raises, as torch's does) and runs each leaf's
    post-accumulate hook once, with the new gradient in place."""
    mine, _ = _pair(device)
    seen: list[np.ndarray] = []
    mine[2].bias.register_post_accumulate_grad_hook(lambda parameter: seen.append(parameter.grad.numpy()))
    before = REPLAYS.replayed
    for features, labels in _batches(4, seed=7):
        mine.zero_grad()
        loss = F.cross_entropy(mine(em.tensor(features, device=device)), em.tensor(labels, device=device))
        loss.backward()
        np.testing.assert_array_equal(seen[-1], mine[2].bias.grad.numpy())
    assert len(seen) == 4 and REPLAYS.replayed - before >= 2
    with pytest.raises(AutogradError, match="backward through the graph a second time"):
        loss.backward()


def test_replays_follow_the_setting_and_new_shapes(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With backward replays off every pass is eager; a batch of another size is a signature of its own; the
    gradients are torch's either way."""
    mine, theirs = _pair(device)
    monkeypatch.setattr(CONFIG, "backward_replay", False)
    before = REPLAYS.replayed
    for rows in (4, 4, 4, 7, 7, 7):
        features, labels = _batches(1, rows=rows, seed=rows)[0]
        mine.zero_grad()
        theirs.zero_grad()
        F.cross_entropy(mine(em.tensor(features, device=device)), em.tensor(labels, device=device)).backward()
        torch.nn.functional.cross_entropy(theirs(torch.tensor(features)), torch.tensor(labels)).backward()
        _compare(mine, theirs)
    assert REPLAYS.replayed == before
    monkeypatch.setattr(CONFIG, "backward_replay", True)
    for rows in (4, 4, 4, 7, 7, 7, 4):
        features, labels = _batches(1, rows=rows, seed=10 + rows)[0]
        mine.zero_grad()
        theirs.zero_grad()
        F.cross_entropy(mine(em.tensor(features, device=device)), em.tensor(labels, device=device)).backward()
        torch.nn.functional.cross_entropy(theirs(torch.tensor(features)), torch.tensor(labels)).backward()
        _compare(mine, theirs)
    assert REPLAYS.replayed - before >= 3


def test_threads_training_models_of_one_signature_replay_each_their_own() -> None:
    """Two threads train two models of the same shapes at once (one signature, one recorded program) from different
    weights and data; each thread's gradients and weights after every step are torch's for its own model."""
    import threading

    results: dict[int, BaseException | None] = {}
    start = threading.Barrier(2)

    def train(index: int) -> None:
        try:
            torch.manual_seed(10 + index)
            theirs = _models(torch, "cpu", False)
            mine = _models(em, "c", False)
            mine.load_state_dict({name: em.tensor(value.detach().numpy())
                                  for name, value in theirs.state_dict().items()})
            my_optimizer = em.optim.SGD(mine.parameters(), lr=0.05)
            their_optimizer = torch.optim.SGD(theirs.parameters(), lr=0.05)
            start.wait()
            for features, labels in _batches(6, seed=20 + index):
                my_optimizer.zero_grad()
                their_optimizer.zero_grad()
                F.cross_entropy(mine(em.tensor(features)), em.tensor(labels)).backward()
                torch.nn.functional.cross_entropy(theirs(torch.tensor(features)), torch.tensor(labels)).backward()
                _compare(mine, theirs)
                my_optimizer.step()
                their_optimizer.step()
            results[index] = None
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            results[index] = error

    before = REPLAYS.replayed
    threads = [threading.Thread(target=train, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index in range(2):
        if results.get(index) is not None:
            raise AssertionError(f"thread {index} failed") from results[index]
    assert REPLAYS.replayed - before >= 4


def test_replayed_steps_at_a_tutorial_size_match_torch() -> None:
    """The MLP of `ember bench --case mlp` (784-512-10, batch 256: packed matmuls on every core): five SGD steps,
    the later ones replays, with torch's weights and gradients at each step."""
    generator = np.random.default_rng(42)
    torch.manual_seed(42)
    theirs = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    mine = em.nn.Sequential(em.nn.Linear(784, 512), em.nn.ReLU(), em.nn.Linear(512, 10))
    mine.load_state_dict({name: em.tensor(value.detach().numpy()) for name, value in theirs.state_dict().items()})
    my_optimizer = em.optim.SGD(mine.parameters(), lr=0.01)
    their_optimizer = torch.optim.SGD(theirs.parameters(), lr=0.01)
    before = REPLAYS.replayed
    for _ in range(5):
        features = generator.normal(size=(256, 784)).astype(np.float32)
        labels = generator.integers(0, 10, size=256)
        my_optimizer.zero_grad()
        their_optimizer.zero_grad()
        F.cross_entropy(mine(em.tensor(features)), em.tensor(labels)).backward()
        torch.nn.functional.cross_entropy(theirs(torch.tensor(features)), torch.tensor(labels)).backward()
        for value, expected in zip(mine.parameters(), theirs.parameters()):
            assert_close(value.grad, expected.grad, atol=2e-5, rtol=1e-3)
        my_optimizer.step()
        their_optimizer.step()
        for value, expected in zip(mine.parameters(), theirs.parameters()):
            assert_close(value, expected.detach(), atol=2e-5, rtol=1e-3)
    assert REPLAYS.replayed - before >= 2


def test_frozen_args_tell_ints_from_bools_and_floats() -> None:
    """A signature's frozen arg is equal exactly when the values are: a tuple of ints (a convolution's strides,
    frozen as it is) differs from one holding a bool or a float of the same value, from a nested one, and from a
    Size or a NamedTuple of the same ints; -0.0 from 0.0 inside a NamedTuple."""
    from typing import NamedTuple

    from ember.autograd.backward_replay import _frozen

    class Pair(NamedTuple):
        first: Any
        second: Any

    assert _frozen((1, 2), {}) == _frozen((1, 2), {})
    assert _frozen(Pair((1, 1), 0.5), {}) == _frozen(Pair((1, 1), 0.5), {})
    values = [(1, 2), (True, 2), (1.0, 2), ((1, 2),), (1, 2, 0), (-0.0,), (0.0,), em.Size([1, 2]), Pair(1, 2),
              Pair((1, 1), 0.0), Pair((1, 1), -0.0), Pair((1, True), 0.0), ((1, 2), em.Size([1, 2]))]
    frozen = {_frozen(value, {}) for value in values}
    assert len(frozen) == len(values)  # (a tuple's kind too: a Size or a NamedTuple of the same ints differs)
