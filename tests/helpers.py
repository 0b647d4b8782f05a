"""Comparing ember with PyTorch: tensors made from the same numpy data, results checked value by value."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

import ember as em
from ember.sharding.tensor import ShardedTensor

TORCH_DTYPES = {
    em.float32: torch.float32, em.float64: torch.float64, em.float16: torch.float16, em.bfloat16: torch.bfloat16,
    em.int8: torch.int8, em.int16: torch.int16, em.int32: torch.int32, em.int64: torch.int64, em.uint8: torch.uint8,
    em.uint16: torch.uint16, em.uint32: torch.uint32, em.uint64: torch.uint64, em.bool: torch.bool,
}
EMBER_DTYPES = {value: key for key, value in TORCH_DTYPES.items()}


def random_array(shape: tuple[int, ...], dtype: Any = np.float32, low: float = -2.0, high: float = 2.0,
                 seed: int = 0) -> np.ndarray:
    """Deterministic test data of a numpy dtype."""
    generator = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return generator.random(shape) < 0.5
    if dtype.kind in "iu":
        low_int = 0 if dtype.kind == "u" else int(low) * 5
        return generator.integers(low_int, int(high) * 5 + 1, size=shape).astype(dtype)
    return generator.uniform(low, high, size=shape).astype(dtype)


def pair(array: np.ndarray, device: str, requires_grad: bool = False) -> tuple[em.Tensor, torch.Tensor]:
    """The same data as an ember tensor on `device` and as a torch tensor."""
    return em.tensor(array, device=device, requires_grad=requires_grad), torch.tensor(array, requires_grad=requires_grad)


def assert_close(actual: Any, expected: Any, atol: float = 1e-5, rtol: float = 1e-4, check_dtype: bool = True) -> None:
    """ember result vs torch result: same shape, matching dtype, values within tolerance, NaN/inf in place."""
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected), (actual, expected)
        for one_actual, one_expected in zip(actual, expected):
            assert_close(one_actual, one_expected, atol, rtol, check_dtype)
        return
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, (em.Tensor, ShardedTensor)), f"expected an ember Tensor, got {type(actual).__name__}"
        assert tuple(actual.shape) == tuple(expected.shape), f"shape {actual.shape} != torch's {tuple(expected.shape)}"
        if check_dtype:
            assert TORCH_DTYPES[actual.dtype] == expected.dtype, f"dtype {actual.dtype} != torch's {expected.dtype}"
        expected_array = expected.detach().float().numpy() if expected.dtype == torch.bfloat16 else expected.detach().numpy()
        actual_array = actual.numpy()
    else:
        expected_array, actual_array = np.asarray(expected), np.asarray(actual)
    if expected_array.dtype.kind in "biu" and actual_array.dtype.kind in "biu":
        np.testing.assert_array_equal(actual_array, expected_array)
    else:
        np.testing.assert_allclose(actual_array.astype(np.float64), expected_array.astype(np.float64), atol=atol,
                                   rtol=rtol, equal_nan=True)


class BatchedChecks:
    """Collect (ember, torch) results and compare their values with one kernel per dtype (a concatenation).

    Each distinct kernel costs a compile, so tests of many small views check them together: shapes and dtypes
    are checked at once per call, values at `verify()` (and, on a mismatch, one by one to name the failing call).
    """

    def __init__(self, atol: float = 0.0, rtol: float = 0.0) -> None:
        self.pairs: list[tuple[em.Tensor, torch.Tensor, str]] = []
        self.atol, self.rtol = atol, rtol

    def __call__(self, actual: Any, expected: Any, where: str = "", atol: float | None = None,
                 rtol: float | None = None) -> None:
        where = where or "line {}".format(sys._getframe(1).f_lineno)
        if isinstance(expected, (tuple, list)):
            assert isinstance(actual, (tuple, list)) and len(actual) == len(expected), (actual, expected)
            for one_actual, one_expected in zip(actual, expected):
                self(one_actual, one_expected, where, atol, rtol)
            return
        assert isinstance(actual, em.Tensor), f"expected an ember Tensor, got {type(actual).__name__}"
        assert tuple(actual.shape) == tuple(expected.shape), \
            f"{where}: shape {actual.shape} != torch's {tuple(expected.shape)}"
        assert TORCH_DTYPES[actual.dtype] == expected.dtype, \
            f"{where}: dtype {actual.dtype} != torch's {expected.dtype}"
        tolerance = (self.atol if atol is None else atol, self.rtol if rtol is None else rtol)
        self.pairs.append((actual.detach().clone(), expected.detach().clone(), where, tolerance))  # snapshots (detach aliases)

    def verify(self) -> None:
        groups: dict[Any, list[tuple[em.Tensor, torch.Tensor, str, tuple[float, float]]]] = {}
        for entry in self.pairs:
            groups.setdefault(entry[0].dtype, []).append(entry)
        for group in groups.values():
            values, start = em.cat([actual.reshape(-1) for actual, _, _, _ in group]).numpy(), 0
            for actual, expected, where, (atol, rtol) in group:
                expected_values = (expected.float() if expected.dtype == torch.bfloat16 else expected).numpy()
                try:
                    assert_close(values[start:start + actual.numel()].reshape(actual.shape), expected_values, atol,
                                 rtol)
                except AssertionError as error:
                    raise AssertionError(f"the check at {where}: {error}") from None
                start += actual.numel()


def scheduled_launches(run: Any, monkeypatch: Any) -> list[Any]:
    """The kernel launches (scheduler Launch commands) that the kernelizer schedules while `run()` runs; a graph whose
    schedule is cached already schedules nothing."""
    from ember.scheduler import schedule
    from ember.scheduler.program import Launch

    launches: list[Any] = []
    original = schedule.kernelize

    def recording(*arguments: Any, **keywords: Any) -> Any:
        items = original(*arguments, **keywords)
        launches.extend(item for item in items if isinstance(item, Launch))
        return items

    monkeypatch.setattr(schedule, "kernelize", recording)
    try:
        run()
    finally:
        monkeypatch.setattr(schedule, "kernelize", original)
    return launches


def require_dtypes(device: str, *dtypes: em.DType) -> None:
    """Skip the calling test, saying why, when the device's capability table lacks a dtype the test needs."""
    import pytest

    from ember.backends.registry import REGISTRY

    missing = REGISTRY.device(device).info.unsupported(set(dtypes))
    if missing:
        pytest.skip(f"{device} does not support {', '.join(dtype.name for dtype in missing)}")


def assert_close_batch(cases: list[tuple[Any, ...]], atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """BatchedChecks over a list of (label, ember result, torch result[, atol, rtol]) cases."""
    check = BatchedChecks(atol, rtol)
    for label, actual, expected, *tolerance in cases:
        check(actual, expected, label, *tolerance)
    check.verify()


def run_float_kernel(device: Any, ir: Any) -> np.ndarray:
    """Compile a float32 kernel IR on a device and run it directly through the backend contract (no scheduler),
    each input filled with 0, 1, 2, ...; the output's values."""
    program = device.compile(ir)
    buffers = [device.pool.allocate(param.size * param.dtype.itemsize) for param in ir.params]
    for buffer, param in zip(buffers[1:], ir.params[1:]):
        device.pool.copy_in(buffer, memoryview(np.arange(param.size, dtype=np.float32)).cast("B"))
    program(buffers, ir.global_size).wait()
    result = np.zeros(ir.params[0].size, np.float32)
    device.pool.copy_out(memoryview(result).cast("B"), buffers[0])
    return result


def unbound_launches(capture: Any, bound: Any) -> list[int]:
    """The positions of a jit capture's launches that `bound` (a replay's binding: per command a bound launch, a
    joined run of them at its first command, or None) leaves to be launched one by one."""
    from ember.scheduler.executor import JoinedLaunches
    from ember.scheduler.program import Launch

    covered: set[int] = set()
    for position, entry in enumerate(bound):
        if isinstance(entry, JoinedLaunches):
            covered.update(range(position, entry.end))
        elif entry is not None:
            covered.add(position)
    return [position for position, command in enumerate(capture.program.commands)
            if isinstance(command, Launch) and position not in covered]


def isolated_compile_cache(monkeypatch: Any) -> None:
    """A fresh compile cache and shape-class history for the calling test (undone after it): the kernels it
    compiles, as shape-class members or not, depend on its own calls only, and none is dropped meanwhile (a full
    cache drops old kernels, whose sizes buffers are freed or not as launch plans and replays still hold them)."""
    from collections import OrderedDict

    from ember.scheduler import compile_cache, shape_classes

    monkeypatch.setattr(compile_cache, "COMPILED", compile_cache.CompileCache())
    monkeypatch.setattr(shape_classes, "STRUCTURES", OrderedDict())


def compiled_sizes() -> dict[int, tuple[Any, int]]:
    """The sizes buffers the compile cache keeps with its shape-class members' kernels (scheduler/shape_classes.py:
    each member launch's global size and variable values, a few bytes of device memory made when the member is
    compiled and kept as its code is), by id of their pool handle: (handle, bytes). Tests that count a pool's bytes
    allow for those their kernels made (with isolated_compile_cache: which kernels compile as members then depends
    on the test's own calls)."""
    from ember.scheduler import compile_cache
    from ember.scheduler.shape_classes import SizedProgram

    return {id(compiled.program.sizes.handle): (compiled.program.sizes.handle, compiled.program.sizes.nbytes)
            for compiled in list(compile_cache.COMPILED.entries.values()) if isinstance(compiled.program, SizedProgram)}


def compiled_sizes_change(before: dict[int, tuple[Any, int]]) -> int:
    """Bytes of shape-class sizes buffers the compile cache took since `before` (compiled_sizes(); in a test with
    isolated_compile_cache, which drops none)."""
    return sum(nbytes for key, (_, nbytes) in compiled_sizes().items() if key not in before)
