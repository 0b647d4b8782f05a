"""Flat shape classes (ir/flat_kernel.py, scheduler/shape_classes.batch_classes): the kernels of one schedule that
are alike once flat but for their element count (an optimizer's per-parameter updates, clip_grad_norm_'s sums of
squares and scalings) compile as one class kernel each. An AdamW step with clipping over parameters of eight shapes
compiles a few kernels instead of three per parameter, and its values, over several steps and replays, are torch's;
NaN and infinities pass through a class kernel as through torch; kernels that move elements, and members past the
size limits, are compiled for their own sizes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.core import dtype as dtypes
from ember.core.ops import Op
from ember.ir.flat_kernel import flat_kernel
from ember.ir.kernel import Kernel, KernelStep
from ember.ir.shape_class import split_sizes
from ember.scheduler import shape_classes

SHAPES = [(88, 64), (64, 64), (64,), (192, 64), (192,), (64, 256), (256, 64), (256,)]
F32 = dtypes.float32


@pytest.fixture(autouse=True)
def fresh_classes(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default mode (auto), with compile caches and flat classes of this test's own."""
    from ember.scheduler import compile_cache

    monkeypatch.delenv("EMBER_SHAPE_CLASSES", raising=False)
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_cache, "COMPILED", compile_cache.CompileCache())
    monkeypatch.setattr(shape_classes, "STRUCTURES", type(shape_classes.STRUCTURES)())
    monkeypatch.setattr(shape_classes, "FLAT_CLASSES", type(shape_classes.FLAT_CLASSES)())


def _scaled_update(shape: tuple[int, ...]) -> Kernel:
    """p - scalars[2] * g as the scheduler makes it for a parameter of `shape`: a scalar sliced from a small buffer,
    reshaped to the parameter's rank and broadcast."""
    ones = (1,) * len(shape)
    count = int(np.prod(shape))
    return Kernel((
        KernelStep(Op.BUFFER, (), 1, shape, F32),
        KernelStep(Op.BUFFER, (), 2, (9,), F32),
        KernelStep(Op.SHRINK, (1,), ((2, 3),), (1,), F32),
        KernelStep(Op.RESHAPE, (2,), ones, ones, F32),
        KernelStep(Op.EXPAND, (3,), shape, shape, F32),
        KernelStep(Op.BUFFER, (), 3, shape, F32),
        KernelStep(Op.MUL, (4, 5), None, shape, F32),
        KernelStep(Op.SUB, (0, 6), None, shape, F32),
    ), (count, 9, count))


def test_flat_forms_of_one_update_differ_only_in_the_element_count() -> None:
    forms = [flat_kernel(_scaled_update(shape)) for shape in SHAPES]
    assert all(form is not None for form in forms)
    assert all(form.output.shape == (int(np.prod(shape)),) for form, shape in zip(forms, SHAPES))  # type: ignore
    assert len({split_sizes(form)[0] for form in forms if form is not None}) == 1  # (the rank is gone)
    square_sum = Kernel((KernelStep(Op.BUFFER, (), 1, (88, 64), F32), KernelStep(Op.MUL, (0, 0), None, (88, 64), F32),
                         KernelStep(Op.SUM, (1,), (0, 1), (1, 1), F32)), (5632,))
    flat_sum = flat_kernel(square_sum)
    assert flat_sum is not None and flat_sum.output == KernelStep(Op.SUM, (1,), (0,), (1,), F32)


def test_kernels_that_move_elements_have_no_flat_form() -> None:
    shape = (4, 6)
    transposed = Kernel((KernelStep(Op.BUFFER, (), 1, (6, 4), F32), KernelStep(Op.PERMUTE, (0,), (1, 0), shape, F32),
                         KernelStep(Op.NEG, (1,), None, shape, F32)), (24,))
    row_sums = Kernel((KernelStep(Op.BUFFER, (), 1, shape, F32), KernelStep(Op.SUM, (0,), (1,), (4, 1), F32)), (24,))
    sliced = Kernel((KernelStep(Op.BUFFER, (), 1, (5, 6), F32), KernelStep(Op.SHRINK, (0,), ((0, 4), (0, 6)), shape,
                                                                           F32)), (30,))
    tiled = Kernel((KernelStep(Op.BUFFER, (), 1, (1, 6), F32), KernelStep(Op.EXPAND, (0,), shape, shape, F32),
                    KernelStep(Op.NEG, (1,), None, shape, F32)), (6,))  # (a row broadcast: not one value)
    assert [flat_kernel(kernel) for kernel in (transposed, row_sums, sliced, tiled)] == [None] * 4


def _train(lib: Any, device: str | None, steps: int) -> tuple[list[np.ndarray], list[float]]:
    """`steps` AdamW steps with clip_grad_norm_ of one parameter per SHAPES entry (loss: a weighted sum of squares
    and sines); the parameters after them and the norm clip_grad_norm_ returned at each step."""
    generator = np.random.default_rng(5)
    starts = [generator.normal(size=shape).astype(np.float32) for shape in SHAPES]
    weights = [generator.normal(size=shape).astype(np.float32) for shape in SHAPES]
    kwargs = {} if device is None else {"device": device}
    parameters = [lib.nn.Parameter(lib.tensor(start, **kwargs)) for start in starts]
    targets = [lib.tensor(weight, **kwargs) for weight in weights]
    optimizer = lib.optim.AdamW(parameters, lr=0.05, weight_decay=0.1)
    norms = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = sum(((parameter - target) ** 2 * target + parameter.sin()).sum()
                   for parameter, target in zip(parameters, targets))
        loss.backward()
        norms.append(float(lib.nn.utils.clip_grad_norm_(parameters, 5.0)))
        optimizer.step()
    return [parameter.detach().cpu().numpy() if lib is torch else parameter.numpy() for parameter in parameters], norms


def test_an_optimizer_step_compiles_a_class_per_update_and_matches_torch(device: str) -> None:
    with em.profile() as record:
        mine, my_norms = _train(em, device, 1)
    first_compiles = len(record.compiles)
    mine, my_norms = _train(em, device, 4)
    theirs, their_norms = _train(torch, None, 4)
    np.testing.assert_allclose(my_norms, their_norms, rtol=1e-5)
    for value, expected in zip(mine, theirs):  # (Adam divides by the root of tiny second moments: an element whose
        # gradient is near 0 moves by a float32 rounding's worth of the learning rate, ~3e-5 here with or without
        # classes, EMBER_SHAPE_CLASSES=0)
        np.testing.assert_allclose(value, expected, rtol=2e-5, atol=1e-4)
    classes = [compiled for known in shape_classes.FLAT_CLASSES.values() for compiled in known]
    assert len(classes) >= 3  # (AdamW's three updates: the parameter, its two moments; the clip's scaling)
    # the first step's compiles: a few class kernels and the scalar ones (11 on every backend), where three updates
    # and a scaling per parameter are 4 * 8 kernels alone (46 compiles with EMBER_SHAPE_CLASSES=0)
    assert first_compiles <= 2 * len(SHAPES), first_compiles


def test_nan_and_infinities_pass_through_a_class_kernel(device: str) -> None:
    generator = np.random.default_rng(9)
    arrays = [generator.normal(size=shape).astype(np.float32) for shape in SHAPES[:4]]
    arrays[1][3, 5], arrays[2][7], arrays[3][0, 0] = np.nan, np.inf, -np.inf
    results = [(em.tensor(array, device=device) * 3.0 - 1.0).exp2() for array in arrays]
    em.realize(*results)
    assert shape_classes.FLAT_CLASSES  # (the four kernels made one class)
    for result, array in zip(results, arrays):
        np.testing.assert_allclose(result.numpy(), torch.exp2(torch.tensor(array) * 3.0 - 1.0).numpy(), rtol=1e-6)


def test_members_past_the_size_limit_compile_for_their_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shape_classes, "MAX_MEMBER_WORK", 1000)
    arrays = [np.arange(count, dtype=np.float32) for count in (1500, 2500)]
    results = [em.tensor(array) * 2.0 + 1.0 for array in arrays]
    em.realize(*results)
    assert not shape_classes.FLAT_CLASSES
    for result, array in zip(results, arrays):
        np.testing.assert_array_equal(result.numpy(), array * 2.0 + 1.0)


def test_a_structure_makes_at_most_max_classes_flat_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels of one flat structure that keep differing in a value a class holds fixed (an integer constant: the
    same in both kernels of the first batch, another in the second's) make new classes up to MAX_CLASSES; past it
    they compile for their sizes."""
    monkeypatch.setattr(shape_classes, "MAX_CLASSES", 1)
    generator = np.random.default_rng(2)
    for factor in (3, 5):
        arrays = [generator.integers(-1000, 1000, size=count).astype(np.int32) for count in (64, 4096)]
        results = [em.tensor(array) * factor + 7 for array in arrays]
        em.realize(*results)
        for result, array in zip(results, arrays):
            np.testing.assert_array_equal(result.numpy(), array * factor + 7)
    assert [len(classes) for classes in shape_classes.FLAT_CLASSES.values()] == [1]


def test_members_reading_slices_at_offsets_match_numpy(device: str) -> None:
    """Slices of one buffer at offsets (an RNN's time steps) read as views at launch: a class kernel launched for
    each slice reads its own elements, in a first realize and in the next ones (cached programs and launch plans)."""
    values = np.random.default_rng(3).normal(size=8192).astype(np.float32)
    whole = em.tensor(values, device=device).realize()
    ranges = [(100, 164), (1000, 5096), (16, 48)]
    for _ in range(3):
        results = [whole[start:end] * 2.0 + 1.0 for start, end in ranges]
        em.realize(*results)
        for result, (start, end) in zip(results, ranges):
            np.testing.assert_array_equal(result.numpy(), values[start:end] * 2.0 + 1.0)


def test_members_of_millions_of_elements_and_the_reduce_limit(device: str) -> None:
    """Members at the sizes of real parameters (2,000,003 and 1,048,577 elements: past 65,535 work items and no
    multiple of a vector, a NaN and an infinity in the last elements) share a class and match numpy; sums of
    squares at the reduce limit and one past it (compiled for its sizes) match float64 sums within float32's
    rounding."""
    generator = np.random.default_rng(12)
    arrays = [generator.normal(size=count).astype(np.float32) for count in (2_000_003, 1_048_577)]
    arrays[0][-1], arrays[1][-2] = np.nan, np.inf
    results = [(em.tensor(array, device=device) * 0.5 - 2.0).maximum(em.tensor(array, device=device))
               for array in arrays]
    em.realize(*results)
    assert shape_classes.FLAT_CLASSES
    for result, array in zip(results, arrays):
        np.testing.assert_array_equal(result.numpy(), np.maximum(array * np.float32(0.5) - np.float32(2.0), array))
    limit = shape_classes.MAX_REDUCED_MEMBER
    squares = [generator.normal(size=count).astype(np.float32) for count in (limit, limit + 1, 1000)]
    sums = [(em.tensor(array, device=device) ** 2).sum() for array in squares]
    em.realize(*sums)
    for total, array in zip(sums, squares):
        np.testing.assert_allclose(total.numpy(), np.sum(array.astype(np.float64) ** 2), rtol=1e-5)


def test_threads_realizing_flat_batches_at_once_get_their_own_values() -> None:
    """Four threads each realize elementwise kernels of their own sizes, one structure for all, several times: the
    classes made and entered under the scheduler's lock serve every thread; each gets numpy's values."""
    import threading

    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            generator = np.random.default_rng(seed)
            for round_ in range(3):
                arrays = [generator.normal(size=100 * seed + 37 * round_ + count).astype(np.float32)
                          for count in (5, 3000, 70_000)]
                # (times 2 is exact: c contracts a * b + c into one rounding, numpy rounds twice)
                results = [em.tensor(array) * 2.0 + 1.0 for array in arrays]
                em.realize(*results)
                for result, array in zip(results, arrays):
                    np.testing.assert_array_equal(result.numpy(), array * np.float32(2.0) + np.float32(1.0))
        except BaseException as error:  # noqa: BLE001 - reported by the test's thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert shape_classes.FLAT_CLASSES
