"""The kernelizer's kept walks (kernelize.KernelWalks): find_boundaries with each kernel's interior and dependencies
kept between its passes chooses the same stored nodes, in the same order, as walking every kernel again at every
pass, on the graphs of real training steps (an LSTM, attention with layer norms, a convolution block), and the
steps' values match torch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.core.graph import Node
from ember.scheduler import kernelize
from tests.conftest import TEST_DEVICES

pytestmark = pytest.mark.skipif("c:0" not in TEST_DEVICES, reason="needs the c backend")


class NothingKept(kernelize.KernelWalks):
    """Every kernel walked again at every pass, as before the walks were kept."""

    def interior(self, root: Node) -> list[Node]:
        return kernelize._interior(root, self.boundaries)

    def dependencies(self, root: Node) -> list[Node]:
        return kernelize._kernel_dependencies(root, self.boundaries)

    @property  # type: ignore[override]
    def uncut(self) -> set[int]:
        return set()  # (a fresh set each time: nothing is remembered)

    @uncut.setter
    def uncut(self, value: set[int]) -> None:
        pass


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Each find_boundaries call checked against the walks kept by nobody; the stored nodes each call chose."""
    counts: list[int] = []
    original = kernelize.find_boundaries

    def checked(roots: list[Node], *args: Any) -> list[Node]:
        with monkeypatch.context() as patch:  # (expands templates in place first: the second call sees the same graph)
            patch.setattr(kernelize, "KernelWalks", NothingKept)
            walked = original(roots, *args)
        kept = original(roots, *args)
        assert [id(node) for node in kept] == [id(node) for node in walked]
        counts.append(len(kept))
        return kept

    monkeypatch.setattr(kernelize, "find_boundaries", checked)
    yield counts


def test_an_lstm_step_stores_the_same_nodes_and_matches_torch(compared: list[int]) -> None:
    torch.manual_seed(0)
    reference = torch.nn.LSTM(12, 24, 2)
    model = em.nn.LSTM(12, 24, 2).to("c")
    model.load_state_dict({key: value.detach().numpy() for key, value in reference.state_dict().items()})
    values = np.random.default_rng(0).standard_normal((20, 5, 12)).astype(np.float32)
    output, _ = model(em.tensor(values, device="c"))
    (output * output).mean().backward()
    expected, _ = reference(torch.tensor(values))
    (expected * expected).mean().backward()
    np.testing.assert_allclose(output.numpy(), expected.detach().numpy(), rtol=1e-4, atol=1e-5)
    for (name, parameter), (_, mine) in zip(reference.named_parameters(), model.named_parameters()):
        np.testing.assert_allclose(mine.grad.numpy(), parameter.grad.numpy(), rtol=1e-3, atol=1e-5, err_msg=name)
    assert sum(compared) > 20


def test_attention_and_a_convolution_block_store_the_same_nodes(compared: list[int]) -> None:
    rng = np.random.default_rng(1)
    x = em.tensor(rng.standard_normal((2, 16, 32)).astype(np.float32), device="c", requires_grad=True)
    weight = em.tensor(rng.standard_normal((32, 96)).astype(np.float32) * 0.2, device="c", requires_grad=True)
    q, k, v = em.nn.functional.layer_norm(x, (32,)).matmul(weight).split(32, dim=-1)
    attention = ((q @ k.transpose(-2, -1)) * 32 ** -0.5).softmax(-1) @ v
    images = em.tensor(rng.standard_normal((2, 4, 9, 9)).astype(np.float32), device="c", requires_grad=True)
    filters = em.tensor(rng.standard_normal((6, 4, 3, 3)).astype(np.float32), device="c", requires_grad=True)
    features = em.nn.functional.relu(em.nn.functional.conv2d(images, filters, padding=1, stride=2))
    loss = attention.square().mean() + features.mean()
    loss.backward()

    tx, tw = torch.tensor(x.numpy(), requires_grad=True), torch.tensor(weight.numpy(), requires_grad=True)
    tq, tk, tv = torch.nn.functional.layer_norm(tx, (32,)).matmul(tw).split(32, dim=-1)
    t_attention = ((tq @ tk.transpose(-2, -1)) * 32 ** -0.5).softmax(-1) @ tv
    t_images = torch.tensor(images.numpy(), requires_grad=True)
    t_filters = torch.tensor(filters.numpy(), requires_grad=True)
    t_features = torch.relu(torch.nn.functional.conv2d(t_images, t_filters, padding=1, stride=2))
    (t_attention.square().mean() + t_features.mean()).backward()
    for mine, theirs in ((x, tx), (weight, tw), (images, t_images), (filters, t_filters)):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-3, atol=1e-5)
    assert len(compared) >= 1


def test_a_vae_step_with_adam_stores_the_same_nodes_and_matches_torch(compared: list[int]) -> None:
    """Several passes of find_boundaries (shared work, broadcast recomputation) whose later passes read kept walks."""
    rng = np.random.default_rng(2)
    pixels = rng.random((32, 64)).astype(np.float32)
    noise = rng.standard_normal((32, 8)).astype(np.float32)
    torch.manual_seed(0)
    layers = {"fc1": (64, 48), "fc21": (48, 8), "fc22": (48, 8), "fc3": (8, 48), "fc4": (48, 64)}
    results = []
    for lib, device in ((torch, "cpu"), (em, "c")):
        torch.manual_seed(0)
        modules = {name: torch.nn.Linear(*shape) for name, shape in layers.items()}
        if lib is em:
            linears = {name: em.nn.Linear(*shape).to("c") for name, shape in layers.items()}
            for name, linear in linears.items():
                state = modules[name].state_dict()
                linear.load_state_dict({key: value.detach().numpy() for key, value in state.items()})
            modules = linears  # type: ignore[assignment]
        optimizer = lib.optim.Adam([p for module in modules.values() for p in module.parameters()], lr=1e-2)
        x, eps = lib.tensor(pixels, device=device), lib.tensor(noise, device=device)
        for _ in range(2):
            optimizer.zero_grad()
            h1 = lib.nn.functional.relu(modules["fc1"](x))
            mu, logvar = modules["fc21"](h1), modules["fc22"](h1)
            z = mu + eps * lib.exp(0.5 * logvar)
            reconstruction = lib.sigmoid(modules["fc4"](lib.nn.functional.relu(modules["fc3"](z))))
            bce = lib.nn.functional.binary_cross_entropy(reconstruction, x, reduction="sum")
            loss = (bce - 0.5 * lib.sum(1 + logvar - mu.pow(2) - logvar.exp())) / 32
            loss.backward()
            optimizer.step()
        results.append([float(loss.item()), *(module.weight.detach().numpy() if lib is torch else module.weight.numpy()
                                              for module in modules.values())])
    expected, mine = results
    assert mine[0] == pytest.approx(expected[0], rel=1e-4)
    for theirs, ours in zip(expected[1:], mine[1:]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-5)
    assert len(compared) >= 2
