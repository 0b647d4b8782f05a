"""The executor (scheduler/executor.py) running hand-built command programs (scheduler/program.py): values against
numpy, a Free releasing its slot's buffer, copies between devices, and a replay over buffers."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import ember as em
from ember.backends.registry import REGISTRY
from ember.core.errors import BackendUnavailable, DeviceError
from ember.core.graph import Node
from ember.core.ops import Op
from ember.ir.kernel import Kernel
from ember.scheduler.buffers import buffer_of, read_node
from ember.scheduler.devices import get_device
from ember.scheduler.executor import execute
from ember.scheduler.launch_plan import bind_buffers, bind_devices
from ember.scheduler.program import CommandProgram, Copy, Free, Launch, LaunchBinding
from ember.scheduler.schedule import SCHEDULES
from tests.helpers import isolated_compile_cache, random_array

SHAPE = (5, 7)


def _kernel(graph: em.Tensor) -> Kernel:
    """The one kernel the scheduler makes for `graph` (an op on realized tensors)."""
    program, _ = SCHEDULES.schedule([graph.node])
    (step,) = program.steps
    assert isinstance(step, Launch)
    return step.kernel


def _leaf(data: np.ndarray, device: str) -> Node:
    return em.tensor(data, device=device).realize().node


def _output(device: str) -> Node:
    """A node for a kernel step to write (it becomes a buffer when its step runs)."""
    return Node(Op.CONTIGUOUS, (), None, SHAPE, em.float32, device)


def _kernels(device: str) -> tuple[Kernel, Kernel]:
    """Kernels of `a + b` and `a * 3` on float32 tensors of SHAPE."""
    a, b = em.tensor(random_array(SHAPE), device=device).realize(), em.tensor(random_array(SHAPE), device=device)
    b = b.realize()
    return _kernel(a + b), _kernel(a * 3.0)


def test_a_hand_built_program_computes_what_numpy_does(device: str) -> None:
    add, triple = _kernels(device)
    a_data, b_data = random_array(SHAPE, seed=1), random_array(SHAPE, seed=2)
    table: list[Node | None] = [_leaf(a_data, device), _leaf(b_data, device), _output(device), _output(device),
                                _output(device)]
    program = CommandProgram([Launch(2, (0, 1), add), Launch(3, (2,), triple), Launch(4, (3, 3), add)])
    # a Free after each slot's last use, none after the last step (the table goes then)
    assert program.commands[1::2] == (Free((0, 1)), Free((2,)))
    assert program.last_use == {2: 2, 0: 0, 1: 0, 3: 4, 4: 4}
    bindings, _ = bind_devices(program, table)
    results = table[2:]
    execute(program.commands, bindings, table, program.last_use)
    assert table[:3] == [None, None, None]  # freed after their last readers
    added = a_data + b_data
    np.testing.assert_allclose(read_node(results[0]), added, rtol=1e-6)
    np.testing.assert_allclose(read_node(results[1]), added * 3.0, rtol=1e-6)
    np.testing.assert_allclose(read_node(results[2]), added * 6.0, rtol=1e-6)


def test_a_free_gives_the_buffer_back_to_its_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    isolated_compile_cache(monkeypatch)  # no compile in the window drops an old kernel and frees its sizes buffer
    add, triple = _kernels("c")
    pool = get_device("c").pool
    nbytes = int(np.prod(SHAPE)) * 4
    a, b = _leaf(random_array(SHAPE, seed=3), "c"), _leaf(random_array(SHAPE, seed=4), "c")
    buffer_of(a), buffer_of(b)
    held = []
    for freed in (None, False, True):  # the first run compiles the kernels; the two after it are measured
        commands = [Launch(2, (0, 1), add), Launch(3, (2,), triple), *([Free((2,))] if freed else []),
                    Launch(4, (3, 3), add)]
        program = CommandProgram((), commands)
        table: list[Node | None] = [a, b, _output("c"), _output("c"), _output("c")]
        gc.collect()
        gc.disable()  # no other test's garbage goes back to the pool while this one counts
        try:
            before = pool.used_bytes
            execute(program.commands, bind_devices(program, table)[0], table, program.last_use)
            held.append(pool.used_bytes - before)
        finally:
            gc.enable()
        del table
    assert held[1:] == [3 * nbytes, 2 * nbytes]  # the freed intermediate's memory went back while the table lives


@pytest.mark.parametrize("devices", [("c:0", "wgpu:0"), ("wgpu:0", "c:0")])
def test_copy_steps_move_values_between_devices(devices: tuple[str, str]) -> None:
    try:
        REGISTRY.probe("wgpu")
    except (BackendUnavailable, DeviceError) as error:
        pytest.skip(f"needs the wgpu backend: {error}")
    first, second = devices
    _, triple = _kernels(second)
    data = random_array(SHAPE, seed=5)
    table: list[Node | None] = [_leaf(data, first), _output(second), _output(second), _output(first)]
    program = CommandProgram([Copy(1, 0), Launch(2, (1,), triple), Copy(3, 2)])
    results = table[1:]
    execute(program.commands, bind_devices(program, table)[0], table, program.last_use)
    assert [node.buffer.device_name for node in results] == [second, second, first]  # type: ignore[union-attr]
    np.testing.assert_allclose(read_node(results[0]), data)
    np.testing.assert_allclose(read_node(results[2]), data * 3.0, rtol=1e-6)


def test_a_replay_runs_the_program_over_buffers(device: str) -> None:
    """Slots bound to buffers (as ember.jit replays them): launches pre-bound where every slot is fixed, the input's
    slot bound anew at each run."""
    add, triple = _kernels(device)
    target = get_device(device)
    b_data = random_array(SHAPE, seed=7)
    fixed = [None, buffer_of(_leaf(b_data, device)), buffer_of(_leaf(np.zeros(SHAPE, np.float32), device)),
             buffer_of(_leaf(np.zeros(SHAPE, np.float32), device))]
    program = CommandProgram((), [Launch(2, (0, 1), add), Launch(3, (2,), triple)])
    compiled = [em.scheduler.compile_cache.compile_kernel(target, kernel) for kernel in (add, triple)]
    bindings = [LaunchBinding(target, program_compiled, int(np.prod(SHAPE)), em.float32)
                for program_compiled in compiled]
    bound = bind_buffers(program, bindings, fixed)
    assert bound[0] is None and bound[1] is not None  # the first reads the input's slot
    for seed in (8, 9):
        a_data = random_array(SHAPE, seed=seed)
        buffers = list(fixed)
        buffers[0] = buffer_of(_leaf(a_data, device))
        execute(program.commands, bindings, buffers, bound=bound)
        result = buffers[3]
        assert result is not None
        np.testing.assert_allclose(result.read().reshape(SHAPE), (a_data + b_data) * 3.0, rtol=1e-6)
