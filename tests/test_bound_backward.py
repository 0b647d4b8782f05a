"""Backward replays bound to buffers (autograd/bound_backward.py; test_backward_replay.py's training steps run bound
on c and are compared with torch's there): a bound pass gives the same bits as an unbound one, never overwrites a
tensor a caller kept from an earlier step (a loss, a gradient, an activation), and stays unbound where its memory
would pass the limit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import ember as em
import ember.nn.functional as F
from ember.autograd import bound_backward
from ember.autograd.backward_replay import REPLAYS
from tests.helpers import assert_close
from tests.test_backward_replay import _batches, _compare, _pair


def _step_like_torch(mine: Any, theirs: torch.nn.Module, features: np.ndarray, labels: np.ndarray) -> None:
    """One backward of each model on a batch (no optimizer step), and their gradients compared."""
    for model in (mine, theirs):
        model.zero_grad()
    loss = F.cross_entropy(mine(em.tensor(features, device="c:0")), em.tensor(labels, device="c:0"))
    expected = torch.nn.functional.cross_entropy(theirs(torch.tensor(features)), torch.tensor(labels))
    loss.backward()
    expected.backward()
    _compare(mine, theirs)


def test_tensors_kept_from_a_bound_pass_keep_their_values(device: str) -> None:
    """A caller that keeps each step's loss, logits and gradients (the gradients set to None by zero_grad, so the
    parameters let them go): a later bound pass writes its results elsewhere, and every kept tensor still holds the
    values read right after its step. Tensors dropped are written over (their buffers reused)."""
    mine, _ = _pair(device)
    optimizer = em.optim.SGD(mine.parameters(), lr=0.1)
    kept: list[tuple[em.Tensor, np.ndarray]] = []
    for features, labels in _batches(6):
        optimizer.zero_grad()
        logits = mine(em.tensor(features, device=device))
        loss = F.cross_entropy(logits, em.tensor(labels, device=device))
        loss.backward()
        for tensor in (loss, logits, *[parameter.grad for parameter in mine.parameters()]):
            assert tensor is not None
            kept.append((tensor, tensor.numpy().copy()))
        optimizer.step()
    for tensor, values in kept:
        np.testing.assert_array_equal(tensor.numpy(), values)


def _char_model(seed: int) -> tuple[Any, Any, list[tuple[em.Tensor, em.Tensor]]]:
    torch.manual_seed(seed)
    em.manual_seed(seed)

    class CharModel(em.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = em.nn.Embedding(20, 8)
            self.rnn = em.nn.LSTM(8, 16, 2)
            self.decoder = em.nn.Linear(16, 20)

        def forward(self, codes: em.Tensor) -> em.Tensor:
            output, _ = self.rnn(self.encoder(codes))
            return self.decoder(output)

    model = CharModel().to("c")
    generator = np.random.default_rng(seed)
    batches = [(em.tensor(generator.integers(0, 20, (6, 4)), device="c"),
                em.tensor(generator.integers(0, 20, (6, 4)), device="c")) for _ in range(3)]
    return model, em.optim.SGD(model.parameters(), lr=0.5), batches


def _char_steps(steps: int) -> tuple[list[float], list[np.ndarray]]:
    model, optimizer, batches = _char_model(4)
    losses = []
    for step in range(steps):
        codes, targets = batches[step % len(batches)]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(codes).reshape(-1, 20), targets.reshape(-1))
        loss.backward()
        em.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        losses.append(float(loss.item()))
    return losses, [parameter.numpy() for parameter in model.parameters()]


def test_a_recurrent_model_bound_and_unbound_gives_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2-layer LSTM char model with clip_grad_norm_ (its stored per-step values are forward nodes the program
    computes; the gradients' graph's intermediates live in the arena): eight steps bound and eight unbound give the
    same losses and parameters, bit for bit."""
    before = REPLAYS.bound
    bound_losses, bound_parameters = _char_steps(8)
    assert REPLAYS.bound - before >= 4
    monkeypatch.setattr(bound_backward, "BIND_REPLAYS", False)
    replayed, before = REPLAYS.replayed, REPLAYS.bound
    losses, parameters = _char_steps(8)
    assert REPLAYS.bound == before and REPLAYS.replayed - replayed >= 4
    assert bound_losses == losses
    for bound_value, value in zip(bound_parameters, parameters):
        np.testing.assert_array_equal(bound_value, value)


def test_a_binding_past_the_memory_limit_stays_unbound(monkeypatch: pytest.MonkeyPatch) -> None:
    """With MAX_BOUND_BYTES below what the binding would keep, the replays run unbound and still match torch."""
    monkeypatch.setattr(bound_backward, "MAX_BOUND_BYTES", 0)
    REPLAYS.recorded.clear()  # (bindings made before are kept with their recordings)
    mine, theirs = _pair("c:0")
    replayed, bound = REPLAYS.replayed, REPLAYS.bound
    for features, labels in _batches(5):
        _step_like_torch(mine, theirs, features, labels)
    assert REPLAYS.replayed - replayed >= 2 and REPLAYS.bound == bound


def test_bindings_past_the_total_limit_let_the_least_recent_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two signatures (batches of 8 and of 12 rows) whose bindings do not fit MAX_BOUND_BYTES together: binding one
    lets the other's go (it binds again at its next replay), the bindings never hold more than the limit, and the
    steps stay torch's."""
    mine, theirs = _pair("c:0")
    small, large = _batches(1, rows=8)[0], _batches(1, rows=12, seed=1)[0]

    def held() -> list[int]:
        return [recorded.binding[0].held_bytes for recorded in REPLAYS.recorded.values()
                if recorded is not None and isinstance(recorded.binding[0], bound_backward.BoundBackward)]

    for batch in [small] * 4 + [large] * 4:
        _step_like_torch(mine, theirs, *batch)
    assert len(held()) == 2
    monkeypatch.setattr(bound_backward, "MAX_BOUND_BYTES", max(held()) + 1)  # (one fits, not both)
    REPLAYS.clear()
    for batch in [small] * 4 + [large] * 4:
        _step_like_torch(mine, theirs, *batch)
    bound = REPLAYS.bound
    for batch in (small, large, small, large):
        _step_like_torch(mine, theirs, *batch)
        assert len(held()) == 1 and sum(held()) <= bound_backward.MAX_BOUND_BYTES
    assert REPLAYS.bound - bound == 4


def test_truncated_backpropagation_carries_the_hidden_state_through_bound_passes() -> None:
    """word_language_model's loop: the LSTM's last hidden and cell states, detached, start the next window. They are
    forward nodes a bound pass computes and the caller keeps (the next window reads them as leaves): every window's
    loss and the parameters after it are torch's."""
    torch.manual_seed(7)
    theirs_rnn, theirs_decoder = torch.nn.LSTM(6, 12, 2), torch.nn.Linear(12, 6)
    mine_rnn, mine_decoder = em.nn.LSTM(6, 12, 2).to("c:0"), em.nn.Linear(12, 6).to("c:0")
    for mine, theirs in ((mine_rnn, theirs_rnn), (mine_decoder, theirs_decoder)):
        mine.load_state_dict({name: em.tensor(value.detach().numpy(), device="c:0")
                              for name, value in theirs.state_dict().items()})
    mine_parameters = [*mine_rnn.parameters(), *mine_decoder.parameters()]
    theirs_parameters = [*theirs_rnn.parameters(), *theirs_decoder.parameters()]
    my_optimizer = em.optim.SGD(mine_parameters, lr=0.5)
    their_optimizer = torch.optim.SGD(theirs_parameters, lr=0.5)
    generator = np.random.default_rng(2)
    my_state: Any = None
    their_state: Any = None
    bound = REPLAYS.bound
    for _ in range(7):
        inputs = generator.standard_normal((5, 3, 6)).astype(np.float32)
        targets = generator.integers(0, 6, (5, 3))
        my_optimizer.zero_grad()
        their_optimizer.zero_grad()
        output, my_state = mine_rnn(em.tensor(inputs, device="c:0"), my_state)
        expected, their_state = theirs_rnn(torch.tensor(inputs), their_state)
        loss = F.cross_entropy(mine_decoder(output).reshape(-1, 6), em.tensor(targets.reshape(-1), device="c:0"))
        their_loss = torch.nn.functional.cross_entropy(theirs_decoder(expected).reshape(-1, 6),
                                                       torch.tensor(targets.reshape(-1)))
        loss.backward()
        their_loss.backward()
        my_optimizer.step()
        their_optimizer.step()
        my_state = tuple(state.detach() for state in my_state)
        their_state = tuple(state.detach() for state in their_state)
        assert_close(loss, their_loss.detach(), atol=1e-5, rtol=1e-5)
        for mine, theirs in zip(mine_parameters, theirs_parameters):
            assert_close(mine, theirs.detach(), atol=1e-5, rtol=1e-4)
        for mine, theirs in zip(my_state, their_state):
            assert_close(mine, theirs, atol=1e-5, rtol=1e-4)
    assert REPLAYS.bound - bound >= 3
