"""A schedule's key is pure: placement.place_graph (the schedule pass) places the graph, schedule.graph_key reads the
placed nodes and changes none of them, and refuses a graph that was not placed; values checked against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember as em
from ember.core.graph import Node
from ember.core.walk import post_order
from ember.scheduler import placement, schedule
from tests.conftest import TEST_DEVICES
from tests.helpers import assert_close, random_array

needs_two = pytest.mark.skipif(len(TEST_DEVICES) < 2, reason="needs two test devices")


def _snapshot(roots: list[Node]) -> list[tuple]:
    """Every node under `roots` as (node, op, srcs, device, arg), sources first."""
    return [(node, node.op, node.srcs, node.device, node.arg) for node in post_order(roots, lambda node: node.srcs)]


def _mixed_graph() -> tuple[list[Node], em.Tensor, torch.Tensor]:
    """An unplaced graph reading tensors of two devices and a constant of a third place, and its torch value."""
    first, second = TEST_DEVICES[:2]
    a_data, b_data = random_array((6, 5)), random_array((5, 3), seed=1)
    a = em.tensor(a_data, device=first).realize()
    b = em.tensor(b_data, device=second).realize()
    constant = em.full((6, 3), -0.0, device=second)
    result = ((a @ b) * constant + (a @ b)).relu()
    expected = ((torch.tensor(a_data) @ torch.tensor(b_data)) * -0.0 + torch.tensor(a_data) @ torch.tensor(b_data))
    return [result.node], result, expected.relu()


@needs_two
def test_the_key_of_a_placed_graph_changes_no_node_and_repeats() -> None:
    roots, result, expected = _mixed_graph()
    nodes = placement.place_graph(roots)
    assert any(node.op.name == "COPY" for node in nodes)  # the sources on the other device arrive by copies
    before = _snapshot(roots)
    key = schedule.graph_key(nodes, roots)
    assert _snapshot(roots) == before
    assert schedule.graph_key(nodes, roots) == key
    again = placement.place_graph(roots)  # placing a placed graph again changes nothing
    # (the first list also holds the constant made again elsewhere, which the placed graph no longer reads)
    assert {id(node) for node in again} < {id(node) for node in nodes}
    assert _snapshot(roots) == before and schedule.graph_key(nodes, roots) == key
    assert_close(result.realize(), expected, atol=1e-4)


@needs_two
def test_the_key_of_an_unplaced_graph_is_refused_and_places_nothing() -> None:
    roots, result, expected = _mixed_graph()
    before = _snapshot(roots)
    nodes = [node for node, *_ in before]
    for _ in range(2):
        with pytest.raises(ValueError, match="not placed"):
            schedule.graph_key(nodes, roots)
        assert _snapshot(roots) == before  # no device decided, no source replaced by a copy
    assert_close(result.realize(), expected, atol=1e-4)


@needs_two
def test_the_key_of_a_graph_whose_devices_were_asked_places_nothing() -> None:
    """`Tensor.device` decides the devices before a realize but moves no source: the key of such a graph is
    written (every node has a device) and still copies nothing; the schedule pass then places it."""
    roots, result, expected = _mixed_graph()
    assert result.device == TEST_DEVICES[0]
    before = _snapshot(roots)
    nodes = [node for node, *_ in before]
    key = schedule.graph_key(nodes, roots)
    assert schedule.graph_key(nodes, roots) == key and _snapshot(roots) == before
    assert not any(node.op.name == "COPY" for node, *_ in _snapshot(roots))
    placed = placement.place_graph(roots)
    assert any(node.op.name == "COPY" for node in placed) and schedule.graph_key(placed, roots) != key
    assert_close(result.realize(), expected, atol=1e-4)


def test_nodes_out_of_placement_order_are_refused() -> None:
    x = em.tensor(random_array((4,)), device="c").realize()
    graph = (x * 2.0).exp()
    roots = [graph.node]
    nodes = placement.place_graph(roots)
    with pytest.raises(ValueError, match="read before it is listed"):
        schedule.graph_key(nodes[::-1], roots)
    with pytest.raises(ValueError, match="read before it is listed"):
        schedule.graph_key(nodes[:-1], roots)  # the root is not among the nodes
    assert_close(graph.realize(), torch.tensor(x.numpy() * 2.0).exp())


def test_the_schedule_pass_places_before_the_key(device: str) -> None:
    """A realize places the graph in the schedule pass and keys what was placed: the key cached for a graph is the
    key of its placed nodes, and constants of other bits get their own entry."""
    data = np.array([-0.0, 0.0, 1.5, np.nan], dtype=np.float32)
    x = em.tensor(data, device=device).realize()
    for constant in (0.0, -0.0, float("nan")):
        graph = (x * constant).realize()
        realized_key = schedule.SCHEDULES.last_key
        again = x * constant
        roots = [again.node]
        assert schedule.graph_key(placement.place_graph(roots), roots) == realized_key
        np.testing.assert_array_equal(graph.numpy(), (torch.tensor(data) * constant).numpy())
    keys = set()
    for constant in (0.0, -0.0, float("nan")):
        graph = x * constant
        roots = [graph.node]
        keys.add(schedule.graph_key(placement.place_graph(roots), roots))
    assert len(keys) == 3


def test_the_cache_drops_the_least_recently_found_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_CACHED_SCHEDULES the least recently found eighth goes: a program found again since it was made stays,
    one never found again is scheduled anew. (A cache of its own: the process's is left as it is.)"""
    cache = schedule.ScheduleCache()
    monkeypatch.setattr(schedule, "MAX_CACHED_SCHEDULES", 16)
    tensor = em.tensor(random_array((4, 3)), device="c").realize()

    def run(offset: int) -> None:  # a graph of its own structure per offset (the constant differs)
        cache.schedule([(tensor.reshape(12)[: offset % 12 + 1] * 2.0 + offset).node])

    run(0)
    kept_key = cache.last_key
    for offset in range(1, 16):
        run(offset)
        run(0)  # found again: the most recent
    misses = cache.misses
    run(100)  # the 17th structure: two of the oldest go, the one found at every step stays
    assert len(cache.entries) == 16 - 2 + 1 and kept_key in cache.entries
    run(0)
    assert cache.misses == misses + 1
    run(1)  # the least recently found: dropped, scheduled anew
    assert cache.misses == misses + 2
