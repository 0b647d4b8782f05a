"""Copies of graph templates kept as one TEMPLATE node until the scheduler expands them (core/graph_templates.py):
the values and gradients are torch's, with the copies collapsed or node for node, and the structure is what the
collapse promises (fewer nodes per realize, the same kernels, stored nodes of a template's graph in slots of their
own)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember as em
import ember.nn.functional as F
from ember.core import graph_templates
from ember.core.ops import REDUCE_OPS, Op
from ember.scheduler import schedule
from ember.scheduler.schedule import SCHEDULES


def _mlp_steps(lib, device, steps: int) -> tuple[list[float], list[np.ndarray]]:  # type: ignore[no-untyped-def]
    """An MLP's training steps (linear, relu, linear, cross_entropy over 70 rows, SGD by hand) from fixed weights:
    the losses and the final weights."""
    rng = np.random.default_rng(3)
    first, second = rng.standard_normal((16, 8)).astype(np.float32) * 0.3, rng.standard_normal((4, 16)).astype(np.float32) * 0.3
    inputs = rng.standard_normal((70, 8)).astype(np.float32)
    labels = rng.integers(0, 4, 70)
    kwargs = {} if lib is torch else {"device": device}
    weights = [lib.tensor(first, requires_grad=True, **kwargs), lib.tensor(second, requires_grad=True, **kwargs)]
    biases = [lib.zeros(16, requires_grad=True, **kwargs), lib.zeros(4, requires_grad=True, **kwargs)]
    functional = torch.nn.functional if lib is torch else F
    losses = []
    for _ in range(steps):
        hidden = functional.relu(functional.linear(lib.tensor(inputs, **kwargs), weights[0], biases[0]))
        logits = functional.linear(hidden, weights[1], biases[1])
        loss = functional.cross_entropy(logits, lib.tensor(labels, **kwargs))
        loss.backward()
        with lib.no_grad():
            for parameter in (*weights, *biases):
                parameter -= 0.1 * parameter.grad
                parameter.grad = None
        losses.append(float(loss.item()))
    return losses, [weight.detach().cpu().numpy() if lib is torch else weight.numpy() for weight in weights]


@pytest.mark.parametrize("collapsed", [True, False])
def test_training_steps_match_torch_with_copies_collapsed_or_not(device: str, collapsed: bool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graph_templates, "TEMPLATE_NODES", collapsed)
    expected_losses, expected_weights = _mlp_steps(torch, "cpu", 4)
    losses, weights = _mlp_steps(em, device, 4)  # (a new structure, then the cached program three times)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    for weight, expected in zip(weights, expected_weights):
        np.testing.assert_allclose(weight, expected, rtol=1e-4, atol=1e-5)


def test_a_traced_result_is_one_template_node_until_it_is_scheduled(device: str) -> None:
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((6, 5), (3, 5), (3,)))
    result = F.linear(em.tensor(x, device=device), em.tensor(w, device=device), em.tensor(b, device=device))
    assert result.node.op is Op.TEMPLATE and len(result.node.srcs) == 3
    expected = torch.nn.functional.linear(torch.tensor(x), torch.tensor(w), torch.tensor(b)).numpy()
    np.testing.assert_allclose(result.numpy(), expected, rtol=1e-5, atol=1e-6)
    drawn = em.rand(4, 3, device=device)
    assert drawn.node.op is Op.CONTIGUOUS and drawn.node.srcs[0].op is Op.TEMPLATE  # (a draw: one node over its
    # key, stored once it is computed: creation.kept)


def test_a_collapsed_step_keys_fewer_nodes_and_launches_the_same_kernels(device: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The schedule key of a training step's realize lists far fewer nodes with the copies collapsed; the kernels
    launched are the same (the expansion is the graph the copies would have made); the program of the collapsed
    graph stores nodes of templates' graphs (a matmul's sum before its bias) in slots past the graph's."""
    keys: dict[bool, list[int]] = {}
    kernels: dict[bool, list[str]] = {}
    original_key = schedule.graph_key
    for collapsed in (False, True):
        monkeypatch.setattr(graph_templates, "TEMPLATE_NODES", collapsed)
        sizes = keys[collapsed] = []

        def counting_key(nodes, roots, sizes=sizes):  # type: ignore[no-untyped-def]
            sizes.append(len(nodes))
            return original_key(nodes, roots)

        monkeypatch.setattr(schedule, "graph_key", counting_key)
        with em.profile() as record:
            _mlp_steps(em, device, 1)
        kernels[collapsed] = sorted(kernel.name for kernel in record.kernels)
        monkeypatch.setattr(schedule, "graph_key", original_key)
    assert sum(keys[True]) * 3 < sum(keys[False]), keys
    assert kernels[True] == kernels[False]
    assert any(program.extra_slots for program in SCHEDULES.entries.values())


@pytest.mark.parametrize("collapsed", [True, False])
def test_a_dropout_mask_is_the_reference_hash(device: str, collapsed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A draw expanded by the scheduler computes the bits a copy of its graph does: numpy's double hash (the
    reference, tests/reference_random.py), 21,000 of them, kept where the uniform number is at least p."""
    from ember.core.creation import random_key
    from tests.reference_random import uniform_float32

    monkeypatch.setattr(graph_templates, "TEMPLATE_NODES", collapsed)
    em.manual_seed(11)
    dropped = F.dropout(em.ones(300, 70, device=device), 0.3, True).numpy()
    keep = uniform_float32(random_key(11, 0), 21000).reshape(300, 70) >= 0.3
    np.testing.assert_array_equal(dropped, keep.astype(np.float32) * np.float32(1.0 / 0.7))


def test_a_graph_drawing_expands_a_copy_of_the_graph(device: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ember.viz import graph_dot

    rng = np.random.default_rng(2)
    x, w = (rng.standard_normal(shape).astype(np.float32) for shape in ((4, 5), (3, 5)))
    result = F.linear(em.tensor(x, device=device), em.tensor(w, device=device))
    text = graph_dot([result.node])
    assert "TEMPLATE" not in text and "SUM" in text
    assert result.node.op is Op.TEMPLATE  # (the drawing expanded a copy; the user's graph is as it was)
    np.testing.assert_allclose(result.numpy(), x @ w.T, rtol=1e-5, atol=1e-6)


def test_collapsed_copies_do_not_raise_a_training_steps_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deep MLP's training step (activations dominate its peak) holds no more pool bytes with the copies collapsed
    than node for node: a TEMPLATE node holds all of its sources until it is dropped, so stored nodes of its copy
    are kept for it only where the copy has several results (its docstring)."""
    from tests.test_memory_budget import _ember_training

    peaks = {}
    for collapsed in (False, True):
        monkeypatch.setattr(graph_templates, "TEMPLATE_NODES", collapsed)
        parameters, peaks[collapsed], _, _ = _ember_training("c", None)
    assert peaks[True] <= peaks[False], peaks


def test_the_sharding_estimate_of_a_graph_with_copies_is_its_expanded_graphs() -> None:
    """The sharding decision reads a copy's work and dtypes from its template instead of expanding it (a realize
    of a large softmax on a GPU spent two thirds of its host time expanding and walking the copy): the same reduce
    work and dtypes as the expanded graph, each copy counted once however many of its results the graph holds."""
    from ember.core.shapes import prod
    from ember.core.walk import post_order
    from ember.sharding.decision import _work_and_dtypes

    rng = np.random.default_rng(4)
    x = em.tensor(rng.standard_normal((64, 300)).astype(np.float32))
    weight, bias = em.ones(300), em.zeros(300)
    roots = [(F.layer_norm(x, (300,), weight, bias) * 2).softmax(-1).sum(0).node,
             F.linear(x, em.tensor(rng.standard_normal((7, 300)).astype(np.float32))).log_softmax(-1).node]
    for root in roots:
        walk = lambda node: () if node.realized else node.srcs
        nodes = post_order([root], walk)
        assert any(node.op is Op.TEMPLATE for node in nodes)
        work, dtypes = _work_and_dtypes(nodes)
        graph_templates.expand_in_place([root])
        expanded = post_order([root], walk)
        assert not any(node.op is Op.TEMPLATE for node in expanded)
        assert work == sum(prod(node.srcs[0].shape) for node in expanded if node.op in REDUCE_OPS)
        assert dtypes == {node.dtype for node in expanded}
