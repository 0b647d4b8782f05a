"""Threads: grad mode, profiles, memory budgets, jit captures and debug output are per thread (ember/context.py), a
new thread starts from the defaults, and several threads training their own models at once on every device get
torch's results (the scheduler's lock, scheduler/lock.py); two threads on wgpu never abort the interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.scheduler import profile as profiling
from tests.conftest import TEST_DEVICES

TIMEOUT = 120  # seconds a thread may take before the test fails instead of hanging


def run_threads(targets: list[Callable[[], Any]]) -> list[Any]:
    """Run each target in its own thread; their results, or the first exception one raised."""
    results: list[Any] = [None] * len(targets)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            results[index] = targets[index]()
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(targets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "a thread did not finish (deadlock?)"
    if errors:
        raise errors[0]
    return results


# ---- per-thread grad mode -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("first_to_leave", ["no_grad thread", "recording thread"])
def test_no_grad_in_one_thread_does_not_turn_off_recording_in_another(first_to_leave: str) -> None:
    barrier = threading.Barrier(2, timeout=TIMEOUT)
    weight = em.tensor(np.ones(4, np.float32), device="c", requires_grad=True)

    def in_no_grad() -> list[bool]:
        seen = []
        with em.no_grad():
            barrier.wait()  # 1: both inside their blocks
            seen.append((weight * 2).requires_grad)
            barrier.wait()  # 2: the other thread has recorded an op
            if first_to_leave == "recording thread":
                barrier.wait()  # 3: the other thread is done
        seen.append(em.is_grad_enabled())
        if first_to_leave == "no_grad thread":
            barrier.wait()  # 3
        return seen

    def recording() -> list[bool]:
        seen = []
        with em.enable_grad():
            barrier.wait()  # 1
            seen.append(em.is_grad_enabled())
            seen.append((weight * 2).requires_grad)
            barrier.wait()  # 2
            if first_to_leave == "no_grad thread":
                barrier.wait()  # 3: the no_grad thread has left its block
            seen.append((weight * 3).requires_grad)
        if first_to_leave == "recording thread":
            barrier.wait()  # 3
        return seen

    no_grad_seen, recording_seen = run_threads([in_no_grad, recording])
    assert no_grad_seen == [False, True]  # off inside its block; on after it, whatever the other thread did
    assert recording_seen == [True, True, True]
    assert em.is_grad_enabled()  # this thread was never switched


def test_overlapping_no_grad_blocks_leave_grad_enabled_everywhere() -> None:
    # the bug this guards: two threads each saving the global mode on entry and restoring it on exit, interleaved as
    # enter A, enter B, exit A, exit B, left autograd off for the whole process
    barrier = threading.Barrier(2, timeout=TIMEOUT)

    def first() -> bool:
        with em.no_grad():
            barrier.wait()  # both inside
        barrier.wait()  # left first
        barrier.wait()
        return em.is_grad_enabled()

    def second() -> bool:
        with em.no_grad():
            barrier.wait()
            barrier.wait()  # still inside while the first leaves
        barrier.wait()
        return em.is_grad_enabled()

    assert run_threads([first, second]) == [True, True]
    assert em.is_grad_enabled()


def test_a_new_thread_starts_with_grad_enabled_and_no_switches() -> None:
    with em.no_grad(), em.memory_budget("1MB"):
        em.set_grad_enabled(False)

        def fresh() -> tuple[bool, bool, int | None]:
            return em.is_grad_enabled(), em.is_inference_mode_enabled(), em.get_memory_budget()

        assert run_threads([fresh]) == [(True, False, None)]
        assert not em.is_grad_enabled() and em.get_memory_budget() == 10**6
    em.set_grad_enabled(True)
    with em.inference_mode():
        assert run_threads([fresh]) == [(True, False, None)]
        assert em.is_inference_mode_enabled()


def test_a_switch_in_a_thread_that_ends_changes_nothing_elsewhere() -> None:
    def switch_off() -> None:
        em.set_grad_enabled(False)  # the call form: stays off in that thread only
        em.memory_budget(4096)
        profiling.set_debug_level(3)

    run_threads([switch_off])
    assert em.is_grad_enabled() and em.get_memory_budget() is None and profiling.debug_level() in (0, 1, 2, 3, 4, 5)
    weight = em.tensor(np.ones(2, np.float32), device="c", requires_grad=True)
    assert (weight + 1).requires_grad


# ---- profiles, budgets, jit captures --------------------------------------------------------------------------------


def test_a_profile_records_only_its_own_threads_kernels() -> None:
    barrier = threading.Barrier(2, timeout=TIMEOUT)
    values = np.arange(12, dtype=np.float32)

    def profiled() -> tuple[em.profile, np.ndarray]:
        x = em.tensor(values, device="c")
        with em.profile() as record:
            barrier.wait()  # the other thread runs its kernels now
            barrier.wait()
            result = (x * 2).sum().numpy()
        return record, result

    def busy() -> np.ndarray:
        barrier.wait()
        outputs = [(em.tensor(values, device="c") + step).exp().numpy() for step in range(5)]
        barrier.wait()
        return np.stack(outputs)

    (record, result), outputs = run_threads([profiled, busy])
    assert result == pytest.approx(values.sum() * 2)
    np.testing.assert_allclose(outputs, np.exp(values[None] + np.arange(5)[:, None]), rtol=1e-5)
    assert record.realizes == 1 and len(record.kernels) == 1  # only its own reduce, none of the other's five
    assert record.kernels[0].name.startswith("r_")


def test_a_memory_budget_in_one_thread_does_not_apply_to_another() -> None:
    barrier = threading.Barrier(2, timeout=TIMEOUT)
    data = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)

    def budgeted() -> int | None:
        with em.memory_budget(64):  # far too small for anything: a realize here would raise
            barrier.wait()
            barrier.wait()
            return em.get_memory_budget()

    def unbudgeted() -> np.ndarray:
        barrier.wait()
        x = em.tensor(data, device="c")
        result = ((x @ x).relu() + x).numpy()  # runs inside the other thread's budget block
        barrier.wait()
        return result

    budget, result = run_threads([budgeted, unbudgeted])
    assert budget == 64
    np.testing.assert_allclose(result, np.maximum(data @ data, 0) + data, rtol=1e-4, atol=1e-4)


def test_a_jit_capture_does_not_capture_another_threads_ops() -> None:
    captured = threading.Event()
    other_done = threading.Event()
    data = np.arange(8, dtype=np.float32)
    calls = []

    def step(x: em.Tensor) -> em.Tensor:
        calls.append(x)
        if len(calls) == 2:  # the capturing call (the first only notes its uploads): let the other thread run now
            captured.set()
            assert other_done.wait(TIMEOUT)
        return x * 2 + 1

    jitted = em.jit(step)

    def capturing() -> list[np.ndarray]:
        x = em.tensor(data, device="c")
        return [jitted(x).numpy() for _ in range(4)]

    def other() -> np.ndarray:
        assert captured.wait(TIMEOUT)
        result = (em.tensor(data, device="c") - 5).abs().sqrt().numpy()  # kernels no replay of `step` may run
        other_done.set()
        return result

    outputs, result = run_threads([capturing, other])
    for output in outputs:
        np.testing.assert_allclose(output, data * 2 + 1)
    np.testing.assert_allclose(result, np.sqrt(np.abs(data - 5)), rtol=1e-6)
    assert jitted.capture is not None
    launched = [command for command in jitted.capture.program.steps if hasattr(command, "kernel")]
    assert len(launched) == 1  # x * 2 + 1 only


def test_debug_level_is_per_thread(capsys: pytest.CaptureFixture[str]) -> None:
    def quiet() -> np.ndarray:
        return (em.tensor(np.ones(3, np.float32), device="c") * 7).numpy()

    level = profiling.debug_level()
    profiling.set_debug_level(1)
    try:
        capsys.readouterr()
        assert run_threads([quiet])[0].tolist() == [7, 7, 7]
        assert "realize:" not in capsys.readouterr().err  # the new thread starts at EMBER_DEBUG's level (0 here)
        (em.tensor(np.ones(3, np.float32), device="c") * 5).realize()
        assert "realize:" in capsys.readouterr().err
    finally:
        profiling.set_debug_level(level)


def test_asyncio_tasks_each_have_their_own_grad_mode() -> None:
    import asyncio

    weight = em.tensor(np.ones(3, np.float32), device="c", requires_grad=True)

    async def task(inside_no_grad: bool, entered: asyncio.Event, other_entered: asyncio.Event) -> list[bool]:
        if inside_no_grad:
            with em.no_grad():
                entered.set()
                await other_entered.wait()  # the other task runs while this one is inside no_grad
                return [em.is_grad_enabled(), (weight * 2).requires_grad]
        entered.set()
        await other_entered.wait()
        await asyncio.sleep(0)
        return [em.is_grad_enabled(), (weight * 2).requires_grad]

    async def main() -> list[list[bool]]:
        first, second = asyncio.Event(), asyncio.Event()
        return list(await asyncio.gather(task(True, first, second), task(False, second, first)))

    assert asyncio.run(main()) == [[False, False], [True, True]]
    assert em.is_grad_enabled()


def test_a_realize_inside_a_realize_on_the_same_thread_does_not_deadlock(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.scheduler import compile_cache

    inner_values = np.arange(5, dtype=np.float32) + 0.5
    inner_results: list[np.ndarray] = []
    calls: list[Any] = []
    original = compile_cache.compile_kernel

    def compile_and_realize(device: Any, kernel: Any) -> Any:  # a callback inside the realize that realizes
        calls.append(kernel)
        if len(calls) == 1:
            inner_results.append((em.tensor(inner_values, device="c") * 4 - 1).numpy())
        return original(device, kernel)

    monkeypatch.setattr(compile_cache, "compile_kernel", compile_and_realize)
    outer = np.arange(7, dtype=np.float32)
    (result,) = run_threads([lambda: (em.tensor(outer, device="c").exp() + 0.25).numpy()])
    np.testing.assert_allclose(result, np.exp(outer) + 0.25, rtol=1e-6)
    np.testing.assert_allclose(inner_results[0], inner_values * 4 - 1)


# ---- four threads training at once, on every device ----------------------------------------------------------------

SIZES = [(6, 12), (12, 3)]
STEPS = 6


def _weights(seed: int) -> list[np.ndarray]:
    generator = np.random.default_rng(seed)
    arrays = []
    for inputs, outputs in SIZES:
        arrays += [generator.normal(size=(outputs, inputs)).astype(np.float32) * 0.4,
                   generator.normal(size=(outputs,)).astype(np.float32) * 0.1]
    return arrays


def _batch(seed: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(1000 * seed + step)
    return generator.normal(size=(8, 6)).astype(np.float32), generator.normal(size=(8, 3)).astype(np.float32)


def _train_ember(device: str, seed: int, barrier: threading.Barrier) -> tuple[list[float], list[np.ndarray]]:
    """An MLP's SGD-with-momentum steps (forward, backward, step under no_grad, zero_grad); losses and weights."""
    model = em.nn.Sequential(em.nn.Linear(6, 12), em.nn.Tanh(), em.nn.Linear(12, 3)).to(device)
    with em.no_grad():
        for parameter, array in zip(model.parameters(), _weights(seed)):
            parameter.assign(em.tensor(array, device=device))
    optimizer = em.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    barrier.wait()  # every thread trains at once
    losses = []
    for step in range(STEPS):
        inputs, targets = _batch(seed, step)
        loss = ((model(em.tensor(inputs, device=device)) - em.tensor(targets, device=device)) ** 2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.item()))
    return losses, [parameter.numpy() for parameter in model.parameters()]


def _train_torch(seed: int) -> tuple[list[float], list[np.ndarray]]:
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    with torch.no_grad():
        for parameter, array in zip(model.parameters(), _weights(seed)):
            parameter.copy_(torch.tensor(array))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(STEPS):
        inputs, targets = _batch(seed, step)
        loss = ((model(torch.tensor(inputs)) - torch.tensor(targets)) ** 2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.item()))
    return losses, [parameter.detach().numpy() for parameter in model.parameters()]


@pytest.mark.parametrize("device", TEST_DEVICES)
def test_four_threads_training_their_own_models_match_torch(device: str) -> None:
    threads = 4
    barrier = threading.Barrier(threads, timeout=TIMEOUT)
    results = run_threads([lambda seed=seed: _train_ember(device, seed, barrier) for seed in range(threads)])
    for seed, (losses, weights) in enumerate(results):
        expected_losses, expected_weights = _train_torch(seed)
        np.testing.assert_allclose(losses, expected_losses, rtol=1e-4, atol=1e-5)
        for weight, expected in zip(weights, expected_weights):
            np.testing.assert_allclose(weight, expected, rtol=1e-4, atol=1e-5)
    assert em.is_grad_enabled()


def test_threads_on_every_device_at_once_match_torch() -> None:
    if len(TEST_DEVICES) < 2:
        pytest.skip("needs two devices")
    barrier = threading.Barrier(len(TEST_DEVICES), timeout=TIMEOUT)
    results = run_threads([lambda seed=seed, device=device: _train_ember(device, seed, barrier)
                           for seed, device in enumerate(TEST_DEVICES)])
    for seed, (losses, _) in enumerate(results):
        np.testing.assert_allclose(losses, _train_torch(seed)[0], rtol=1e-4, atol=1e-5)


# ---- wgpu from several threads: a crash must fail the test, not kill pytest ----------------------------------------

WGPU_THREADS = """
import threading, numpy as np, ember as em
errors, results = [], {}
barrier = threading.Barrier(3)
def work(seed):
    try:
        rng = np.random.default_rng(seed)
        weights = rng.standard_normal((8, 8)).astype(np.float32)
        w = em.tensor(weights, device="wgpu:0", requires_grad=True)  # the first use of wgpu is in the threads
        barrier.wait()
        for step in range(20):
            x = em.tensor(rng.standard_normal((4, 8)).astype(np.float32), device="wgpu:0")
            (x @ w).relu().sum().backward()
            with em.no_grad():
                w -= 0.01 * w.grad
            w.grad = None
        results[seed] = w.numpy()
    except BaseException as error:
        errors.append(repr(error))
threads = [threading.Thread(target=work, args=(seed,)) for seed in range(3)]
[thread.start() for thread in threads]
[thread.join() for thread in threads]
assert not errors, errors
for seed, value in results.items():  # the same steps in numpy
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((8, 8)).astype(np.float64)
    for step in range(20):
        x = rng.standard_normal((4, 8)).astype(np.float32).astype(np.float64)
        w -= 0.01 * (x.T @ ((x @ w) > 0).astype(np.float64))
    assert np.allclose(value, w, rtol=1e-4, atol=1e-4), (seed, np.abs(value - w).max())
print("ok", len(results))
"""


@pytest.mark.skipif("wgpu:0" not in TEST_DEVICES, reason="wgpu is not available here")
def test_wgpu_from_several_threads_does_not_crash() -> None:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(WGPU_THREADS)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and "ok 3" in result.stdout, result.stderr[-3000:]


# ---- cuda: the driver's current context is per thread ---------------------------------------------------------------


def test_cuda_calls_from_new_threads_have_their_context_current(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.backends import cuda
    from ember.backends.registry import REGISTRY
    from tests.test_ptx import FakeDriver

    class PerThreadContextDriver(FakeDriver):
        """A fake driver that, like CUDA, keeps the current context per thread: a new thread has none."""

        def __init__(self) -> None:
            super().__init__()
            self.current = threading.local()
            self.without_context: list[str] = []

        def cuCtxSetCurrent(self, context: Any) -> tuple:
            self.current.context = context
            return (0,)

        def _check(self, call: str) -> None:
            if getattr(self.current, "context", None) is None:
                self.without_context.append(call)

        def cuMemAlloc(self, *arguments: Any) -> tuple:
            self._check("cuMemAlloc")
            return super().cuMemAlloc(*arguments)

        def cuMemcpyHtoDAsync(self, *arguments: Any) -> tuple:
            self._check("cuMemcpyHtoDAsync")
            return super().cuMemcpyHtoDAsync(*arguments)

        def cuMemcpyDtoHAsync(self, *arguments: Any) -> tuple:
            self._check("cuMemcpyDtoHAsync")
            return super().cuMemcpyDtoHAsync(*arguments)

        def cuLaunchKernel(self, *arguments: Any) -> tuple:
            self._check("cuLaunchKernel")
            return super().cuLaunchKernel(*arguments)

    driver = PerThreadContextDriver()
    device = cuda.CudaDevice(driver, 0)
    monkeypatch.setitem(REGISTRY.devices, "cuda", [device])
    data = np.random.default_rng(3).standard_normal((13, 7)).astype(np.float32)

    def compute(seed: int) -> np.ndarray:
        return ((em.tensor(data, device="cuda:0") * (seed + 1)).exp().sum(0)).numpy()

    results = run_threads([lambda seed=seed: compute(seed) for seed in range(2)])
    for seed, result in enumerate(results):
        np.testing.assert_allclose(result, np.exp(data * (seed + 1)).sum(0), rtol=1e-5)
    assert driver.without_context == []
