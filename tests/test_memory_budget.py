"""ember.memory_budget: a training step under half its unconstrained peak recomputes intermediates, stays within the
budget (the pool's high-water mark) and trains exactly as without a budget and as torch; a budget too small raises
MemoryBudgetError naming the peak it needs; the planner's commands are sound; argument checks."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

import ember as em
from ember import nn, optim
from ember.scheduler import profile
from ember.budget.plan import BudgetTooSmall, PlanItem, plan_budget, smallest_budget
from ember.scheduler.devices import get_device

WIDTH, BATCH, LAYERS, STEPS = 32, 1024, 8, 3


@pytest.fixture(autouse=True)
def _no_budget_left_behind() -> Iterator[None]:
    yield
    em.memory_budget(None)  # (a failing test must not leave its budget to the next ones)


def _initial_state() -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    generator = np.random.default_rng(3)
    shapes = [(WIDTH, WIDTH), (WIDTH,)] * LAYERS + [(4, WIDTH), (4,)]
    parameters = [(generator.normal(size=shape) / np.sqrt(WIDTH)).astype(np.float32) for shape in shapes]
    inputs = generator.normal(size=(BATCH, WIDTH)).astype(np.float32)
    targets = generator.integers(0, 4, size=BATCH)
    return parameters, inputs, targets


def _ember_training(device: str, budget: int | None) -> tuple[list[np.ndarray], int, int, int]:
    """Parameters after STEPS SGD steps of a deep MLP (activations dominate its peak), the step's highest pool
    high-water mark, the kernels launched and the commands recomputed."""
    gc.collect()  # (buffers of earlier tests waiting in reference cycles would count in the pool's bytes)
    parameters, input_array, target_array = _initial_state()
    model = nn.Sequential(*[module for _ in range(LAYERS) for module in (nn.Linear(WIDTH, WIDTH), nn.ReLU())],
                          nn.Linear(WIDTH, 4)).to(device)
    with em.no_grad():
        for parameter, array in zip(model.parameters(), parameters):
            parameter.assign(em.tensor(array, device=device)).realize()
    optimizer = optim.SGD(model.parameters(), lr=0.1)
    inputs, targets = em.tensor(input_array, device=device), em.tensor(target_array, device=device)
    peak = kernels = recomputed = 0
    for _ in range(STEPS):
        with em.memory_budget(budget), em.profile() as record:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
        peak = max(peak, *record.peak_bytes.values())
        kernels += len(record.kernels)
        recomputed += record.recomputed_kernels
    return [parameter.detach().numpy() for parameter in model.parameters()], peak, kernels, recomputed


def _torch_training() -> list[np.ndarray]:
    parameters, input_array, target_array = _initial_state()
    model = torch.nn.Sequential(*[module for _ in range(LAYERS)
                                  for module in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())],
                                torch.nn.Linear(WIDTH, 4))
    with torch.no_grad():
        for parameter, array in zip(model.parameters(), parameters):
            parameter.copy_(torch.from_numpy(array))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(STEPS):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.from_numpy(input_array)),
                                          torch.from_numpy(target_array)).backward()
        optimizer.step()
    return [parameter.detach().numpy() for parameter in model.parameters()]


def test_training_under_half_the_peak_matches_unconstrained_and_torch(device: str) -> None:
    free, free_peak, free_kernels, free_recomputed = _ember_training(device, None)
    budget = free_peak // 2
    budgeted, budgeted_peak, budgeted_kernels, recomputed = _ember_training(device, budget)
    assert free_recomputed == 0 and recomputed > 0 and budgeted_kernels > free_kernels
    assert budgeted_peak <= budget < free_peak, (budgeted_peak, budget, free_peak)
    for free_parameter, budgeted_parameter in zip(free, budgeted):
        np.testing.assert_array_equal(budgeted_parameter, free_parameter)  # the same kernels, run again
    for torch_parameter, budgeted_parameter in zip(_torch_training(), budgeted):
        np.testing.assert_allclose(budgeted_parameter, torch_parameter, rtol=1e-4, atol=1e-5)


def test_a_budget_too_small_names_the_peak_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    pool = get_device("c").pool
    inputs = em.randn(BATCH, WIDTH, device="c").realize()
    layers = [em.randn(WIDTH, WIDTH, device="c").realize() for _ in range(4)]

    def chain() -> em.Tensor:
        hidden = inputs
        for layer in layers:
            hidden = (hidden @ layer).relu()
        return hidden.sum()

    pattern = r"memory budget of 100000 bytes .* needs at least"
    gc.collect()  # the least budget counts what the pool already holds: garbage of earlier tests must not come and go
    held_before_failure = pool.used_bytes
    with pytest.raises(em.MemoryBudgetError, match=pattern) as caught, em.memory_budget(100_000):
        chain().realize()
    error = caught.value
    error.__traceback__ = None  # (its frames hold the failed realize's nodes)
    assert isinstance(error, MemoryError) and error.budget == 100_000 and error.needed > 100_000
    expected = chain().numpy()
    previous = profile.debug_level()
    profile.set_debug_level(1)
    gc.collect()
    needed = error.needed - held_before_failure + pool.used_bytes  # the same realize on what the pool holds now
    try:
        with em.memory_budget(needed), em.profile() as record:  # the least it needs is enough
            values = chain().numpy()
    finally:
        profile.set_debug_level(previous)
    np.testing.assert_allclose(values, expected, rtol=1e-5)
    assert record.peak_bytes["c:0"] <= needed == record.planned_peak_bytes["c:0"]
    assert f"memory budget {needed} bytes: planned peak c:0" in capsys.readouterr().err
    assert f"memory budget plan on c:0: peak {needed} bytes" in str(record)


def test_the_plan_recomputes_evicted_inputs_first_and_stays_within_the_budget() -> None:
    # a chain 0 -> 1 -> 2 -> 3 -> 4 of 100 bytes each, and a small output reading 4 and 1 again
    items = [PlanItem(2, (1,), 10), PlanItem(3, (2,), 10), PlanItem(4, (3,), 10), PlanItem(5, (4, 1), 10)]
    items.insert(0, PlanItem(1, (0,), 10))
    nbytes = {**dict.fromkeys(range(5), 100), 5: 10}
    pools = dict.fromkeys(range(6), "pool")
    kept = frozenset([5])
    free = plan_budget(items, nbytes, pools, kept, frozenset(), {"pool": 100}, {})
    assert free.peak_bytes == {"pool": 400} and free.recomputed == 0
    plan = plan_budget(items, nbytes, pools, kept, frozenset(), {"pool": 100}, {"pool": 310})
    assert plan.peak_bytes["pool"] == 310 and plan.recomputed == 1
    assert [plan.commands[index] for index in plan.recomputes] == [0]  # item 0 (1 from 0) run again
    resident: set[int] = {0}
    for command in plan.commands:  # every command reads only values that are resident when it runs
        if command < 0:
            resident.remove(~command)
        else:
            assert set(items[command].inputs) <= resident, (command, resident)
            resident.add(items[command].output)
    assert resident == {0, 5}  # every intermediate freed after its last reader
    with pytest.raises(BudgetTooSmall):
        plan_budget(items, nbytes, pools, kept, frozenset(), {"pool": 100}, {"pool": 305})


def test_memory_budget_arguments_and_scopes() -> None:
    assert em.get_memory_budget() is None
    with em.memory_budget("2MB") as budget:
        assert em.get_memory_budget() == 2_000_000 == budget.value
        with em.memory_budget(None):
            assert em.get_memory_budget() is None
        assert em.get_memory_budget() == 2_000_000
    assert em.get_memory_budget() is None
    em.memory_budget("1KiB")  # a plain setter
    assert em.get_memory_budget() == 1024
    em.memory_budget(None)
    assert em.get_memory_budget() is None
    for wrong, error in ((0, em.ArgumentError), (-5, em.ArgumentError), ("0MB", em.ArgumentError),
                         (1.5, TypeError), (True, TypeError), ([1], TypeError), ("lots", ValueError)):
        with pytest.raises(error, match="memory_budget"):
            em.memory_budget(wrong)
    assert em.get_memory_budget() is None
    assert get_device("c").pool.used_bytes >= 0


def _jit_training(budget: int | None) -> tuple[list[np.ndarray], int, int]:
    """_ember_training's steps on c as one ember.jit function (eager, capture, replays): the parameters, the kernels
    the capture recorded and the most bytes the pool held after a call."""
    gc.collect()
    parameters, input_array, target_array = _initial_state()
    model = nn.Sequential(*[module for _ in range(LAYERS) for module in (nn.Linear(WIDTH, WIDTH), nn.ReLU())],
                          nn.Linear(WIDTH, 4)).to("c")
    with em.no_grad():
        for parameter, array in zip(model.parameters(), parameters):
            parameter.assign(em.tensor(array, device="c")).realize()
    optimizer = optim.SGD(model.parameters(), lr=0.1)
    inputs, targets = em.tensor(input_array, device="c"), em.tensor(target_array, device="c")

    @em.jit
    def step(inputs: em.Tensor, targets: em.Tensor) -> None:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()

    pool, held = get_device("c").pool, 0
    with em.memory_budget(budget):
        for _ in range(STEPS):
            step(inputs, targets)
            plan = step.memory_plan.get("c:0")
            # what the pool holds after the call with the arena packed to its least size (the arena's layout may
            # leave gaps: plan_arena is greedy)
            held = max(held, pool.used_bytes - (plan.arena_bytes - plan.peak_bytes if plan else 0))
    assert step.replays == STEPS - 2 and step.capture is not None and step.memory_plan["c:0"].arena
    return [parameter.detach().numpy() for parameter in model.parameters()], step.capture.kernels, held


def test_a_step_captured_by_jit_under_a_budget_replays_its_recomputes() -> None:
    eager, free_peak, _, _ = _ember_training("c", None)
    budget = free_peak // 2
    free, free_kernels, _ = _jit_training(None)
    budgeted, budgeted_kernels, held = _jit_training(budget)
    assert budgeted_kernels > free_kernels and held <= budget
    for eager_parameter, free_parameter, budgeted_parameter in zip(eager, free, budgeted):
        np.testing.assert_array_equal(free_parameter, eager_parameter)
        np.testing.assert_array_equal(budgeted_parameter, eager_parameter)


def test_an_optimizer_step_under_a_budget_updates_in_place() -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)).to("c")
    optimizer = optim.Adam(model.parameters(), lr=0.01)
    inputs = em.randn(32, 64, device="c").realize()
    allocated = []
    for budget in (None, None, 10**8, None, 10**8):
        optimizer.zero_grad()
        model(inputs).square().mean().backward()
        with em.memory_budget(budget), em.profile() as record:
            optimizer.step()
        allocated.append(record.bytes_allocated)
    parameter_bytes = sum(parameter.numel() * 4 for parameter in model.parameters())
    assert allocated[2] == allocated[3] == allocated[4] < parameter_bytes, (allocated, parameter_bytes)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_every_plan_reads_only_resident_values_and_keeps_to_the_budget(data: st.DataObject) -> None:
    leaves = data.draw(st.integers(1, 3))
    count = data.draw(st.integers(1, 14))
    items, nbytes = [], {position: data.draw(st.integers(1, 50)) for position in range(leaves)}
    for output in range(leaves, leaves + count):
        inputs = tuple(data.draw(st.lists(st.integers(0, output - 1), min_size=1, max_size=3)))
        items.append(PlanItem(output, inputs, data.draw(st.integers(1, 100))))
        nbytes[output] = data.draw(st.integers(0, 50))
    read = {position for item in items for position in item.inputs}
    kept = frozenset([item.output for item in items if item.output not in read or data.draw(st.booleans())])
    uploads = frozenset(data.draw(st.sets(st.integers(0, leaves - 1))))
    pools = dict.fromkeys(nbytes, "pool")
    baseline = {"pool": sum(nbytes[position] for position in range(leaves) if position not in uploads)}
    free = plan_budget(items, nbytes, pools, kept, uploads, baseline, {})
    least = smallest_budget(items, nbytes, pools, kept, uploads, baseline, ["pool"])
    budget = data.draw(st.one_of(st.just(least), st.integers(least, max(least, free.peak_bytes["pool"]))))
    try:
        plan = plan_budget(items, nbytes, pools, kept, uploads, baseline, {"pool": budget})
    except BudgetTooSmall:
        event("no plan")
        return
    event(f"recomputes: {min(plan.recomputed, 3)}")
    resident = set(range(leaves)) - uploads
    live = baseline["pool"]
    for command in plan.commands:
        if command < 0:
            assert ~command in resident and ~command not in kept
            resident.remove(~command)
            live -= nbytes[~command]
            continue
        item = items[command]
        for position in item.inputs:
            if position in uploads and position not in resident:  # host data allocated at its first use
                resident.add(position)
                live += nbytes[position]
        assert set(item.inputs) <= resident and item.output not in resident
        resident.add(item.output)
        live += nbytes[item.output]
        assert live <= budget
    assert kept <= resident and resident - kept <= set(range(leaves))  # every intermediate freed in the end
    assert plan.peak_bytes["pool"] <= budget and len(plan.recomputes) == plan.recomputed


def test_a_copy_between_devices_is_recomputed_under_the_budget(device: str) -> None:
    if device == "c:0":
        pytest.skip("copies from c to another device")
    gc.collect()  # (buffers of earlier tests waiting in reference cycles would count in the pool's bytes)
    generator = np.random.default_rng(5)
    input_array = generator.normal(size=(256, 64)).astype(np.float32)
    weight_arrays = [(generator.normal(size=(64, 64)) * 0.2).astype(np.float32) for _ in range(6)]
    inputs = em.tensor(input_array, device="c")
    weights = [em.tensor(array, device=device) for array in weight_arrays]

    def ember_loss() -> em.Tensor:
        first = (inputs * 2).to(device)  # a copy read by every term: evicted and copied again under the budget
        hidden, terms = first, []
        for weight in weights:
            hidden = (hidden @ weight).tanh()
            terms.append(((hidden - first) ** 2).sum())
        return em.stack(terms).sum()

    first = torch.from_numpy(input_array) * 2
    hidden, expected = first, torch.zeros(())
    for array in weight_arrays:
        hidden = (hidden @ torch.from_numpy(array)).tanh()
        expected = expected + ((hidden - first) ** 2).sum()
    with pytest.raises(em.MemoryBudgetError) as caught, em.memory_budget(1):
        ember_loss().realize()
    needed = caught.value.needed
    del caught  # (its traceback holds the failed attempt's tensors: the second attempt starts from the same pool)
    gc.collect()
    with em.memory_budget(needed), em.profile() as record:
        value = ember_loss().item()
    assert record.recomputed_kernels > 0 and len(record.copies) > 1, record
    assert max(record.peak_bytes.values()) <= needed
    np.testing.assert_allclose(value, expected.item(), rtol=1e-4)
