"""Compiling a schedule's new kernels ahead (scheduler/compile_ahead.py): batches built while the next kernels are
lowered give the same values, and a cold compile of many kernels shows a progress bar on stderr when asked."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ember as em
from ember.backends import c as c_backend
from ember.ir.kernel import Kernel
from ember.scheduler import compile_ahead, compile_cache, quick_compile
from ember.scheduler.compile_ahead import COMPILE_COST_FIXED, PROGRESS_MIN_KERNELS, _compile_cost, _first_part
from ember.scheduler.kernelize import kernelize
from ember.scheduler.program import Launch


def _many_kernels(count: int, device: str, first_rows: int = 2) -> tuple[list[em.Tensor], list[np.ndarray]]:
    """`count` outputs of distinct shapes (so distinct kernels), each its own kernel, and their numpy values."""
    generator = np.random.default_rng(13)
    outputs, expected = [], []
    for index in range(count):
        data = generator.standard_normal((index + first_rows, 3), dtype=np.float32)
        outputs.append((em.tensor(data, device=device) * 1.5 + 0.25).exp().sum(0))
        expected.append(np.exp(data * np.float32(1.5) + np.float32(0.25)).sum(0))
    return outputs, expected




@pytest.mark.parametrize("progress", ["1", "0"])
def test_a_cold_realize_of_many_kernels_shows_progress_when_asked(cold: None, progress: str,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EMBER_PROGRESS", progress)
    count = PROGRESS_MIN_KERNELS + 2
    outputs, expected = _many_kernels(count, "c")
    with em.profile() as record:
        em.realize(*outputs)
    assert len(record.compiles) == count  # all compiled ahead, each once
    for output, values in zip(outputs, expected):
        np.testing.assert_allclose(output.numpy(), values, rtol=1e-5)
    error = capsys.readouterr().err
    if progress == "1":
        assert f"compiling {count} kernels for c:0" in error and f"0/{count}" in error
    else:
        assert "compiling" not in error


def test_no_progress_for_few_kernels_or_without_a_terminal(cold: None, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EMBER_PROGRESS", "1")
    outputs, expected = _many_kernels(PROGRESS_MIN_KERNELS - 1, "c")
    em.realize(*outputs)
    monkeypatch.delenv("EMBER_PROGRESS")  # captured stderr is not a terminal
    more, more_expected = _many_kernels(PROGRESS_MIN_KERNELS + 3, "c")
    doubled = [output * 2 for output in more]
    em.realize(*doubled)
    assert "compiling" not in capsys.readouterr().err
    for output, values in zip(outputs + doubled, expected + [values * 2 for values in more_expected]):
        np.testing.assert_allclose(output.numpy(), values, rtol=1e-5)


@pytest.mark.parametrize("quick", ["1", "0"])
def test_quick_builds_run_first_and_the_optimized_ones_replace_them(cold: None, quick: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold compile launches quick builds (c: -O0) while the optimized ones are built in the background; these
    replace them in the compile cache, give the same values, and are the ones a later process finds on disk."""
    monkeypatch.setenv("EMBER_QUICK_COMPILE", quick)
    quick_builds: list[compile_cache.CompiledKernel] = []
    real_compile_quickly = quick_compile.compile_quickly

    def recording(device: Any, kernels: Any, irs: Any) -> Any:
        built = real_compile_quickly(device, kernels, irs)
        quick_builds.extend(built or [])
        return built

    monkeypatch.setattr(quick_compile, "compile_quickly", recording)
    rows = 40 if quick == "1" else 50  # kernels no earlier test built (the device keeps its programs in memory)
    outputs, expected = _many_kernels(4, "c", rows)
    em.realize(*outputs)
    first = dict(compile_cache.COMPILED.items())
    assert len(first) == 4
    for output, values in zip(outputs, expected):
        np.testing.assert_allclose(output.numpy(), values, rtol=1e-5)
    quick_compile.wait_for_optimized()
    optimized = dict(compile_cache.COMPILED.items())
    assert optimized.keys() == first.keys()
    # every kernel had a quick build, and its optimized build replaced it (one may have done so before the realize
    # returned: a small kernel's optimized build can finish while the others' quick builds run)
    assert len(quick_builds) == (4 if quick == "1" else 0)
    quick_programs = {id(build.program) for build in quick_builds}
    assert not any(id(compiled.program) in quick_programs for compiled in optimized.values())
    for key, compiled in optimized.items():  # the same IR, built the other way
        assert compiled.ir is first[key].ir
    fresh = c_backend.CDevice("c:quick-test")
    assert fresh.compile_quick([compiled.ir for compiled in optimized.values()]) is None  # optimized ones on disk
    rerun, rerun_expected = _many_kernels(4, "c", rows)  # the same kernels again: now the optimized programs run
    em.realize(*rerun)
    for output, values in zip(rerun, rerun_expected):
        np.testing.assert_allclose(output.numpy(), values, rtol=1e-5)
    assert all(compile_cache.COMPILED.get(key) is optimized[key] for key in first)


def test_a_compiler_run_takes_about_its_share_of_the_compile_cost() -> None:
    """A run takes the first kernels up to its share of the cost (a kernel while at least half of it fits), at
    least one, so a run started near the end of lowering does not take all the work from the other cores."""
    assert _first_part([10, 10, 10, 10], 20) == 2
    assert _first_part([10, 10, 10, 10], 25) == 3  # the third fits by half
    assert _first_part([10, 10, 10, 10], 24) == 2
    assert _first_part([100, 1, 1], 10) == 1  # at least one, however large
    assert _first_part([5, 5], 1000) == 2
    device = em.scheduler.devices.get_device("c")
    kernel_ir = compile_cache.lower_for(device, _kernel_of_a_sum())
    assert _compile_cost(device, kernel_ir) > COMPILE_COST_FIXED  # a kernel's nodes count beyond the fixed part


def test_a_packed_matmuls_library_is_costed_at_its_tiles_first_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A packed matmul compiles no kernel of its own, but the first of its tile shape builds the tile's library (a
    large compiler run): that kernel carries the library's cost, so the part building it is spread like the others,
    and later kernels of the tile cost nothing."""
    monkeypatch.setattr(compile_ahead, "PACKED_TILES", set())
    device = em.scheduler.devices.get_device("c")
    costs = []
    for rows in (96, 97):
        a = em.tensor(np.ones((rows, 64), dtype=np.float32), device="c")
        b = em.tensor(np.ones((64, 64), dtype=np.float32), device="c")
        kernel = next(item.kernel for item in kernelize([(a @ b).node]) if isinstance(item, Launch))
        kernel_ir = compile_cache.lower_for(device, kernel)
        assert kernel_ir.packed is not None
        costs.append(compile_ahead._compile_cost(device, kernel_ir))
    assert costs == [compile_ahead.PACKED_LIBRARY_COST, 0]


def _kernel_of_a_sum() -> Kernel:
    """The kernel of (x * 2).sum(0) for a 4x3 x on c."""
    x = em.tensor(np.arange(12, dtype=np.float32).reshape(4, 3), device="c")
    return next(item.kernel for item in kernelize([(x * 2).sum(0).node]) if isinstance(item, Launch))


def test_the_compile_work_left_after_lowering_goes_out_in_shrinking_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once every kernel is lowered, each compiler thread that frees takes a share of what is left, so the parts
    shrink (to MIN_PART_COST) and the cores finish close together; every kernel is built once, in order, by at most
    one run per core at a time."""
    import threading
    import time

    from ember.progress import Progress

    costs = [300] * 60  # 18,000 cost units: parts from 18,000 / 4 down to the smallest
    kernels = [f"kernel {index}" for index in range(len(costs))]
    monkeypatch.setattr(compile_cache, "lower_for", lambda device, kernel: kernel)
    monkeypatch.setattr(compile_ahead, "_compile_cost", lambda device, ir: costs[kernels.index(ir)])
    monkeypatch.setattr(compile_ahead.os, "cpu_count", lambda: 2)
    parts: list[list[Any]] = []
    active, most = [0], [0]
    lock = threading.Lock()

    def build(device: Any, batch: list[Any], irs: list[Any]) -> list[Any]:
        with lock:
            parts.append(list(batch))
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.002 * len(batch))
        with lock:
            active[0] -= 1
        return []

    monkeypatch.setattr(compile_ahead, "_build", build)
    with Progress(len(kernels), "test", "kernel", shown=False) as progress:
        compile_ahead._compile_pipelined(None, list(kernels), [], progress)  # type: ignore[arg-type]
    assert sorted(kernel for part in parts for kernel in part) == sorted(kernels)
    assert len({kernel for part in parts for kernel in part}) == len(kernels)
    assert most[0] <= 2
    part_costs = [sum(costs[kernels.index(kernel)] for kernel in part) for part in parts]
    last_parts = part_costs[-4:]
    assert last_parts == sorted(last_parts, reverse=True)
    assert last_parts[-1] <= compile_ahead.MIN_PART_COST + 300  # (equal fifths of the work would leave 3,600)
