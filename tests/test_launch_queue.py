"""The c backend's launch queue (backends/launch_queue.py): an eager program's kernels held and run back to back at
its end, in program order. Values against numpy where memory is released and reused inside the program, uploaded,
copied to another device, given back to the system, and where the runner is missing or a kernel has too many
parameters for it."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import ember as em
from ember.backends import launch_queue
from ember.scheduler import quick_compile
from ember.scheduler.devices import get_device
from ember.scheduler.executor import JoinedLaunches
from ember.scheduler.kernelize import kernelize
from ember.scheduler.program import Launch
from tests.conftest import TEST_DEVICES

pytestmark = pytest.mark.skipif("c:0" not in TEST_DEVICES, reason="needs the c backend")


@pytest.fixture
def flushes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The number of launches each run of the queue ran."""
    counts: list[int] = []
    original = launch_queue.LaunchQueue.flush

    def counted(queue: launch_queue.LaunchQueue) -> None:
        if queue.addresses:
            counts.append(len(queue.addresses))
        original(queue)

    monkeypatch.setattr(launch_queue.LaunchQueue, "flush", counted)
    yield counts


def _twice(run: Callable[[], Any]) -> Any:
    """The last of three runs: a program runs its launch plan (and so the queue) from its second realize under one
    compile-cache stamp on, and a quick build swapped for its optimized one (waited for here) changes the stamp."""
    run()
    quick_compile.wait_for_optimized()
    run()
    return run()


def _chain(x: em.Tensor) -> em.Tensor:
    # each step stores a value (a reduce reads it again), so the program allocates, frees and reuses buffers
    for step in range(12):
        x = (x * 0.5 + step).contiguous()
        x = x - x.sum(1, keepdim=True) / x.shape[1]
    return x


def _chain_numpy(x: np.ndarray) -> np.ndarray:
    for step in range(12):
        x = x * np.float32(0.5) + np.float32(step)
        x = x - x.sum(1, keepdims=True, dtype=np.float64).astype(np.float32) / np.float32(x.shape[1])
    return x


def test_a_program_whose_buffers_are_released_and_reused_runs_from_the_queue_in_order(flushes: list[int]) -> None:
    values = np.random.default_rng(0).standard_normal((300, 1000)).astype(np.float32)
    x = em.tensor(values, device="c").realize()
    result = _twice(lambda: _chain(x).numpy())
    np.testing.assert_allclose(result, _chain_numpy(values), rtol=1e-4, atol=1e-4)
    assert flushes and max(flushes) >= 12  # the program's kernels were held and ran together


def test_an_upload_and_a_copy_inside_a_queued_program_see_the_kernels_before_them(flushes: list[int]) -> None:
    generator = np.random.default_rng(1)
    values, added = (generator.standard_normal((256, 512)).astype(np.float32) for _ in range(2))
    x = em.tensor(values, device="c").realize()

    def run() -> tuple[np.ndarray, np.ndarray | None]:
        fresh = em.tensor(added, device="c")  # uploaded at its first use, inside the program
        staged = _chain(x) + fresh
        other = None
        if "opencl:0" in TEST_DEVICES:
            other = (staged.to("opencl:0") * 2).to("c") + 1  # copies out of and back into c memory mid-program
            return staged.numpy(), other.numpy()
        return staged.numpy(), other

    staged, other = _twice(run)
    expected = _chain_numpy(values) + added
    np.testing.assert_allclose(staged, expected, rtol=1e-4, atol=1e-4)
    if other is not None:
        np.testing.assert_allclose(other, expected * 2 + 1, rtol=1e-4, atol=1e-4)
    assert flushes


def test_host_data_a_queued_program_reads_late_is_uploaded_before_its_launches_are_held(flushes: list[int]) -> None:
    """A leaf of host data (a new batch, a random draw's key) that a program reads only after many kernels is
    uploaded before the queue holds the first of them: an upload runs what the queue holds, so at its first use it
    split the program's launches into two runs of the queue (three with a dropout's two keys)."""
    generator = np.random.default_rng(2)
    values, added = (generator.standard_normal((256, 512)).astype(np.float32) for _ in range(2))
    x = em.tensor(values, device="c").realize()

    def run() -> np.ndarray:
        flushes.clear()
        return (_chain(x) + em.tensor(added, device="c")).numpy()

    np.testing.assert_allclose(_twice(run), _chain_numpy(values) + added, rtol=1e-4, atol=1e-4)
    assert len(flushes) == 1 and flushes[0] >= 12, flushes


def test_an_assign_whose_target_a_queued_program_reads_is_written_in_place() -> None:
    """A queued program's leaves are uploaded before its launches are held, and nothing of that loop still refers to
    the last leaf when the kernels run: a stray reference to the node an assign replaces (here the program's one
    leaf) made its kernel compute into a new buffer (the reference count in_place.reusable_buffer checks), so a
    decode step's write into a cache's window view missed the cache."""
    size = 10_000_001  # past SMALL_ASSIGN_BYTES (a new buffer may not stand in for the old one), a sum of 10^7
    expected = np.arange(size, dtype=np.float32) / size
    target = em.tensor(expected, device="c").contiguous().realize()
    for _ in range(3):  # the first call compiles; the next ones run from the program's launch plan
        before = id(target.node.buffer)
        target.assign(target + (target * 2).sum() / size)
        target.realize()
        expected = expected + (expected * 2).sum(dtype=np.float64).astype(np.float32) / size
        assert id(target.node.buffer) == before
        np.testing.assert_allclose(target.numpy(), expected, rtol=1e-5)


def test_memory_the_pool_gives_back_runs_the_queue_past_its_limit(flushes: list[int],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # a pool that keeps no large buffer lets each one go at its release: the queue holds that memory until it runs,
    # and runs once it holds more than MAX_RELEASED_BYTES (here 1 MiB: every few launches of 1.2 MB buffers)
    pool = get_device("c").pool
    monkeypatch.setattr(pool, "reuse_budget_bytes", 0)
    monkeypatch.setattr(launch_queue, "MAX_RELEASED_BYTES", 1 << 20)
    values = np.random.default_rng(2).standard_normal((300, 1000)).astype(np.float32)
    x = em.tensor(values, device="c").realize()
    result = _twice(lambda: _chain(x).numpy())
    np.testing.assert_allclose(result, _chain_numpy(values), rtol=1e-4, atol=1e-4)
    assert len(flushes) >= 4  # (the program's ~24 launches ran in several runs of the queue)


def test_without_the_runner_the_held_launches_run_one_by_one_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str) -> Any:
        raise OSError("no runner here")

    monkeypatch.setattr(get_device("c").launch_group, "_sequence_runner", None)
    monkeypatch.setattr(get_device("c").launch_group, "load_runner", broken)
    values = np.random.default_rng(3).standard_normal((64, 100)).astype(np.float32)
    x = em.tensor(values, device="c").realize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _twice(lambda: _chain(x).numpy())
    np.testing.assert_allclose(result, _chain_numpy(values), rtol=1e-4, atol=1e-4)
    assert any("launch one by one" in str(warning.message) for warning in caught)


def test_a_kernel_with_more_parameters_than_the_runner_passes_runs_itself_after_the_queue() -> None:
    # 70 separate inputs: a kernel of 71 parameters (launch_group.MAX_GROUPED_PARAMETERS is 64), after kernels held
    generator = np.random.default_rng(4)
    arrays = [generator.standard_normal(1000).astype(np.float32) for _ in range(70)]
    tensors = [em.tensor(array, device="c").realize() for array in arrays]

    def run() -> np.ndarray:
        total = (tensors[0] * 2).contiguous().sin()
        for tensor in tensors[1:]:
            total = total + tensor
        return (total * 3).numpy()

    expected = (np.sin(arrays[0] * 2) + np.sum(arrays[1:], axis=0, dtype=np.float64)) * 3
    np.testing.assert_allclose(_twice(run), expected, rtol=1e-4, atol=1e-4)


def test_a_training_step_with_the_queue_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    generator = np.random.default_rng(5)
    inputs = generator.standard_normal((32, 20)).astype(np.float32)
    labels = generator.integers(0, 5, 32)
    torch.manual_seed(0)
    torch_model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
                                      torch.nn.Linear(64, 5))
    model = em.nn.Sequential(em.nn.Linear(20, 64), em.nn.BatchNorm1d(64), em.nn.ReLU(), em.nn.Linear(64, 5))
    model.load_state_dict({key: value.detach().numpy() for key, value in torch_model.state_dict().items()})
    optimizer = em.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch_optimizer = torch.optim.SGD(torch_model.parameters(), lr=0.1, momentum=0.9)
    x, y = em.tensor(inputs, device="c"), em.tensor(labels, device="c")
    tx, ty = torch.tensor(inputs), torch.tensor(labels)
    for _ in range(5):
        optimizer.zero_grad()
        loss = em.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        torch_optimizer.zero_grad()
        torch_loss = torch.nn.functional.cross_entropy(torch_model(tx), ty)
        torch_loss.backward()
        torch_optimizer.step()
        np.testing.assert_allclose(float(loss.item()), float(torch_loss.item()), rtol=1e-4)
    for key, value in torch_model.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[key].numpy(), value.numpy(), rtol=1e-4, atol=1e-5)


def test_a_queued_program_at_a_users_size_with_the_pools_real_bounds(flushes: list[int]) -> None:
    # 70,001 rows of 240 (16.8M elements, the first dim past 65,535): each stored step is 67 MB, released and reused
    # inside the program under the pool's own reuse budget; one computation, checked in full against numpy
    values = np.random.default_rng(6).standard_normal((70_001, 240)).astype(np.float32)
    x = em.tensor(values, device="c").realize()

    def run() -> np.ndarray:
        y = x
        for step in range(3):
            y = (y * 0.5 + step).contiguous()
            y = y - y.sum(1, keepdim=True) / y.shape[1]
        return y.numpy()

    expected = values
    for step in range(3):
        expected = expected * np.float32(0.5) + np.float32(step)
        expected = expected - (expected.sum(1, keepdims=True, dtype=np.float64) / expected.shape[1]).astype(np.float32)
    np.testing.assert_allclose(_twice(run), expected, rtol=1e-4, atol=1e-4)
    assert flushes and max(flushes) >= 2  # (its launches were held and ran together)


def test_a_small_kernel_right_after_one_on_every_core_runs_on_every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel of WARM_THRESHOLD to PARALLEL_THRESHOLD estimated operations reads whether its threads are awake (a
    last argument: c.warm_parallel). Held in the queue right after a launch on every core it is passed WARM, first
    in a run or after a one-thread launch COLD, and alone COLD; a replay's joined run passes the same. Its values
    are numpy's either way."""
    from ember.backends import c as c_backend
    from ember.backends.launch_group import COLD, WARM

    rows = np.random.default_rng(1).standard_normal((256, 512)).astype(np.float32)
    weight = np.random.default_rng(2).standard_normal((512, 512)).astype(np.float32)
    bias = np.random.default_rng(3).standard_normal(512).astype(np.float32)
    x, w, b = (em.tensor(array, device="c").realize() for array in (rows, weight, bias))
    held: list[tuple[str, bool, int]] = []
    original = launch_queue.LaunchQueue.hold

    def noted(queue: launch_queue.LaunchQueue, program: Any, pointers: list[int], handles: list[Any]) -> bool:
        kept = original(queue, program, pointers, handles)
        held.append((program.function.__name__, program.warm, pointers[-1]))
        return kept

    monkeypatch.setattr(launch_queue.LaunchQueue, "hold", noted)
    expected_alone = np.maximum(rows + bias, 0)
    np.testing.assert_allclose(_twice(lambda: ((x + b).relu()).numpy()), expected_alone, rtol=1e-6)
    expected = np.maximum(rows @ weight + bias, 0) * 0.5
    result = _twice(lambda: ((((x @ w).contiguous() + b).relu()).contiguous() * 0.5).numpy())
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-3)
    warm = [(name, flag) for name, is_warm, flag in held if is_warm]
    assert warm and all(flag in (COLD, WARM) for _, flag in warm)
    assert any(flag == WARM for _, flag in warm), held  # (the bias and relu after the matmul, on every core)
    from ember.ir.opt import build_kernel_ir

    source = c_backend.CRenderer().render(
        build_kernel_ir(next(item.kernel for item in kernelize([((x + b).relu()).node]) if isinstance(item, Launch)),
                        "kernel", get_device("c").info))
    assert "const int* restrict ember_warm" in source and "if(parallel: *ember_warm)" in source

    @em.jit
    def step(x: em.Tensor, w: em.Tensor, b: em.Tensor) -> em.Tensor:
        return ((((x @ w).contiguous() + b).relu()).contiguous() * 0.5)

    for _ in range(4):
        np.testing.assert_allclose(step(x, w, b).numpy(), expected, rtol=1e-4, atol=1e-3)
    capture = step.capture
    bound = [*(capture.bound or []), *(capture.rebinding[0] if capture.rebinding else [])]
    joined = [launch for command in bound if isinstance(command, JoinedLaunches) for launch in command.launch.launches]
    assert any(launch.program.warm and launch.pointers[-1] == WARM for launch in joined)


def test_a_warm_kernel_on_a_one_core_device_takes_its_argument_and_matches_numpy() -> None:
    """A device of one core (config `c.devices` splits the cores) compiles the same source, whose kernel takes the
    warm argument: its program passes it too (a call with one argument too few read a stray pointer)."""
    from ember.backends.c import CDevice, warm_parallel
    from ember.ir.opt import build_kernel_ir
    from ember.ir.search import _Bench

    x = em.tensor(np.zeros((256, 512), dtype=np.float32), device="dummy:0")
    b = em.tensor(np.zeros(512, dtype=np.float32), device="dummy:0")
    kernel = next(item.kernel for item in kernelize([((x + b).relu()).node]) if isinstance(item, Launch))
    device = CDevice("c:0", threads=1)
    ir = build_kernel_ir(kernel, "warm_kernel", device.info)
    assert warm_parallel(ir)
    program = device.compile(ir)
    assert program.warm
    bench = _Bench(device, ir)
    try:
        output, _ = bench.output_of(program, ir.global_size)
        inputs = []
        for (handle, nbytes), param in zip(bench.buffers[1:], ir.params[1:]):
            values = np.empty(param.size, dtype=np.float32)
            device.pool.copy_out(values.data.cast("B"), handle)
            inputs.append(values)
    finally:
        bench.close()
    rows, bias = (inputs[0], inputs[1]) if inputs[0].size > inputs[1].size else (inputs[1], inputs[0])
    np.testing.assert_array_equal(output.reshape(256, 512), np.maximum(rows.reshape(256, 512) + bias, 0))
