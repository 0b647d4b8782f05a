"""Input views (scheduler/input_views.py): a kernel reading one contiguous slice of an input reads a view at the
slice's offset, so a loop slicing a tensor at a new offset each step compiles one kernel; values against torch and
numpy, on every device, eager and under ember.jit, at a 10^7-element buffer's end, with offsets the pool cannot
view and slices that are not one run."""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch

import ember as em
from ember.core import dtype as dtypes
from ember.core.ops import Op
from ember.ir.kernel import Kernel, KernelStep
from ember.plan.kernel_codec import decode, encode
from ember.scheduler.devices import get_device
from ember.scheduler.input_views import contiguous_offset, rebased
from tests.helpers import assert_close


def _views(device: str) -> bool:
    return get_device(device).pool.view_alignment > 0


def _recurrence(lib: object, x: object, w: object, u: object, steps: int) -> object:
    """A user's own recurrent loop: h = tanh(x[t] @ w + h @ u), the hidden states summed."""
    h = x[0] @ w * 0  # type: ignore[index]
    total = h
    for t in range(steps):
        h = (x[t] @ w + h @ u).tanh()  # type: ignore[index]
        total = total + h
    return total


def _distinct_kernels(device: str, steps: int) -> tuple[int, int]:
    rng = np.random.default_rng(0)
    x = em.tensor(rng.standard_normal((steps, 8, 32), dtype=np.float32), device=device)
    w = em.tensor(rng.standard_normal((32, 32), dtype=np.float32) * 0.2, device=device)
    u = em.tensor(rng.standard_normal((32, 32), dtype=np.float32) * 0.2, device=device)
    em.realize(x, w, u)
    with em.profile() as record:
        em.realize(_recurrence(em, x, w, u, steps))
    return len(record.kernels), len({kernel.name for kernel in record.kernels})


def test_a_loop_over_time_steps_compiles_the_same_kernels_at_every_step(device: str) -> None:
    """Twice the steps launch more kernels but no new ones, where the pool makes views (wgpu's makes none: there each
    step's slice is in its kernel's code)."""
    (short, short_distinct), (long, long_distinct) = _distinct_kernels(device, 6), _distinct_kernels(device, 12)
    assert long > short
    if _views(device):
        assert long_distinct == short_distinct, (short_distinct, long_distinct)


def test_a_loop_over_time_steps_matches_torch_forward_and_backward(device: str) -> None:
    steps = 10
    rng = np.random.default_rng(1)
    values = [rng.standard_normal(shape, dtype=np.float32) * scale
              for shape, scale in (((steps, 8, 32), 1.0), ((32, 32), 0.2), ((32, 32), 0.2))]
    ours = [em.tensor(value, device=device, requires_grad=True) for value in values]
    theirs = [torch.tensor(value, requires_grad=True) for value in values]
    result = _recurrence(em, *ours, steps)
    expected = _recurrence(torch, *theirs, steps)
    assert_close(result, expected.detach(), atol=1e-4)
    result.square().sum().backward()  # type: ignore[attr-defined]
    expected.square().sum().backward()  # type: ignore[attr-defined]
    for mine, reference in zip(ours, theirs):
        assert_close(mine.grad, reference.grad, atol=2e-4, rtol=2e-4)


def test_rows_at_any_offset_match_numpy(device: str) -> None:
    """Rows of 3 float32 (12 bytes) at every offset: c views them all (its kernels need only element alignment:
    one kernel for the 40 rows); a pool that views only at multiples of 16 bytes or more (OpenCL's base address
    alignment) views some, and the other rows' kernels name their offsets. Every row's value is numpy's."""
    values = np.arange(40 * 3, dtype=np.float32).reshape(40, 3) / 7
    x = em.tensor(values, device=device)
    em.realize(x)
    with em.profile() as record:
        rows = [x[t] * 2 + 1 for t in range(40)]
        em.realize(*rows)
    for t, row in enumerate(rows):
        np.testing.assert_array_equal(row.numpy(), values[t] * 2 + 1)
    if device.startswith("c:"):
        assert len({kernel.name for kernel in record.kernels}) == 1, record


def test_empty_slices_sum_to_torchs_zeros(device: str) -> None:
    """Sums over empty slices of a realized tensor (at its start, middle and end), alone and added to a row: torch's
    values on every device."""
    values = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)
    x, expected = em.tensor(values, device=device), torch.tensor(values)
    em.realize(x)
    for start in (0, 2, 6):
        assert_close(x[start:start].sum(0), expected[start:start].sum(0))
        assert_close(x[start:start].sum(0) + x[1], expected[start:start].sum(0) + expected[1])


def test_views_at_the_end_of_a_ten_million_element_buffer(device: str) -> None:
    """The last rows of a 2,500 x 4,096 buffer (10^7 elements), NaN and inf among them, read through views: every
    value numpy's, the last element included."""
    rng = np.random.default_rng(2)
    values = rng.standard_normal((2500, 4096), dtype=np.float32)
    values[-1, -1], values[-2, 0], values[-3, 7] = np.nan, np.inf, -np.inf
    x = em.tensor(values, device=device)
    picked = list(range(2488, 2500))
    rows = [(x[t] * 3 - 1).relu() for t in picked]
    em.realize(*rows)
    for t, row in zip(picked, rows):
        np.testing.assert_allclose(row.numpy(), np.maximum(values[t] * 3 - 1, 0), rtol=1e-6, atol=1e-6)


def test_a_jit_replay_reads_each_steps_view(device: str) -> None:
    """ember.jit records the launches with views of its arena's buffers (OpenCL: a sub-buffer of a sub-buffer is made
    of the buffer itself); each replay's values are torch's."""
    w = np.random.default_rng(3).standard_normal((16, 16), dtype=np.float32) * 0.3
    weight = em.tensor(w, device=device)

    @em.jit
    def run(x: em.Tensor) -> em.Tensor:
        return _recurrence(em, x * 1.5, weight, weight, 6)  # type: ignore[return-value]

    for seed in range(4):
        x = np.random.default_rng(seed + 10).standard_normal((6, 4, 16), dtype=np.float32)
        expected = _recurrence(torch, torch.tensor(x) * 1.5, torch.tensor(w), torch.tensor(w), 6)
        assert_close(run(em.tensor(x, device=device)), expected, atol=1e-4)
    assert run.replays >= 2


def _step(op: Op, srcs: tuple[int, ...], arg: object, shape: tuple[int, ...]) -> KernelStep:
    return KernelStep(op, srcs, arg, shape, dtypes.float32)


def _slice_kernel(bounds: tuple[tuple[int, int], ...], shape: tuple[int, ...] = (10, 4, 8)) -> Kernel:
    region = tuple(end - start for start, end in bounds)
    steps = (_step(Op.BUFFER, (), 1, shape), _step(Op.SHRINK, (0,), bounds, region),
             _step(Op.CONST, (), (1.0).hex(), region), _step(Op.ADD, (1, 2), None, region))
    return Kernel(steps, (int(np.prod(shape)),))


def test_rebased_reads_a_view_of_a_contiguous_slice() -> None:
    kernel = rebased(_slice_kernel(((3, 5), (0, 4), (0, 8))), 16)
    assert kernel.input_offsets == (3 * 32,) and kernel.input_sizes == (2 * 32,)
    assert [step.op for step in kernel.steps] == [Op.BUFFER, Op.CONST, Op.ADD]
    assert kernel.steps[0].shape == (2, 4, 8) and kernel.steps[2].srcs == (0, 1)
    # the first step's slice has the same code: one kernel for both
    first = rebased(_slice_kernel(((0, 2), (0, 4), (0, 8))), 16)
    assert first.input_offsets == () and first.code == kernel.code


def test_rebased_leaves_what_is_not_one_viewable_run() -> None:
    for bounds in (((3, 5), (1, 3), (0, 8)),  # rows of a middle axis: not one run
                   ((0, 10), (0, 4), (0, 8))):  # the whole buffer
        kernel = _slice_kernel(bounds)
        assert rebased(kernel, 16) is kernel
    kernel = _slice_kernel(((3, 4), (1, 2), (0, 8)))  # one row of 8: one run at 3 * 32 + 8
    assert rebased(kernel, 16).input_offsets == (104,)
    assert rebased(kernel, 0) is kernel  # a pool without views
    assert rebased(_slice_kernel(((3, 4), (1, 2), (1, 8))), 16).input_offsets == ()  # 105 * 4 bytes: not aligned
    two = Kernel((*_slice_kernel(((3, 5), (0, 4), (0, 8))).steps, _step(Op.SHRINK, (0,), ((4, 6), (0, 4), (0, 8)),
                                                                         (2, 4, 8)),
                  _step(Op.ADD, (3, 4), None, (2, 4, 8))), (320,))
    assert rebased(two, 16) is two  # two slices of one buffer
    empty = _slice_kernel(((3, 3), (0, 4), (0, 8)))
    assert rebased(empty, 16) is empty  # an empty slice (a pool views at least one byte)


def test_rebased_looks_through_reshapes_and_keeps_a_copied_slice() -> None:
    reshaped = Kernel((_step(Op.BUFFER, (), 1, (40, 8)), _step(Op.RESHAPE, (0,), (10, 4, 8), (10, 4, 8)),
                       _step(Op.SHRINK, (1,), ((6, 7), (0, 4), (0, 8)), (1, 4, 8)),
                       _step(Op.CONST, (), (2.0).hex(), (1, 4, 8)), _step(Op.MUL, (2, 3), None, (1, 4, 8))), (320,))
    kernel = rebased(reshaped, 16)
    assert kernel.input_offsets == (192,) and [step.op for step in kernel.steps] == [Op.BUFFER, Op.CONST, Op.MUL]
    assert kernel.steps[0].shape == (1, 4, 8)
    copied = Kernel(_slice_kernel(((3, 5), (0, 4), (0, 8))).steps[:2], (320,))
    kernel = rebased(copied, 16)
    assert kernel.input_offsets == (96,) and kernel.steps[-1].op is Op.SHRINK
    assert kernel.steps[-1].arg == ((0, 2), (0, 4), (0, 8)) and kernel.steps[0].shape == (2, 4, 8)


def test_contiguous_offset() -> None:
    assert contiguous_offset((5, 6), ((2, 3), (0, 6))) == 12
    assert contiguous_offset((5, 6), ((2, 3), (1, 4))) == 13
    assert contiguous_offset((5, 6), ((2, 4), (1, 6))) is None
    assert contiguous_offset((5, 6), ((0, 5), (0, 6))) is None


def test_a_kernels_offsets_survive_the_plan_codec() -> None:
    kernel = rebased(_slice_kernel(((3, 5), (0, 4), (0, 8))), 16)
    assert decode(encode(kernel)) == kernel and decode(encode(kernel.code)) == kernel.code


def test_nn_lstm_at_a_real_size_compiles_no_kernel_per_step() -> None:
    """An LSTM layer at the char model's size (benchmarks/programs.py) over 24 steps, forward and backward: its
    gradients are torch's, and every per-step kernel is launched at every step (one naming its step's offset would be
    launched once: about 44 more before input views)."""
    torch.manual_seed(0)
    reference = torch.nn.LSTM(64, 128)
    module = em.nn.LSTM(64, 128).to("c")
    for name, parameter in reference.named_parameters():
        getattr(module, name).data = em.tensor(parameter.detach().numpy(), device="c")
    length = 24
    sequence = np.random.default_rng(length).standard_normal((length, 16, 64), dtype=np.float32)
    ours = em.tensor(sequence, device="c", requires_grad=True)
    theirs = torch.tensor(sequence, requires_grad=True)
    with em.profile() as record:
        output, _ = module(ours)
        output.square().mean().backward()
        em.realize(ours.grad, *(parameter.grad for parameter in module.parameters()))
    reference(theirs)[0].square().mean().backward()
    assert_close(ours.grad, theirs.grad, atol=1e-5, rtol=1e-3)
    for name, parameter in reference.named_parameters():
        assert_close(getattr(module, name).grad, parameter.grad, atol=1e-4, rtol=1e-3)
    launches = Counter(kernel.name for kernel in record.kernels)
    once = [name for name, count in launches.items() if count == 1]
    assert len(once) < length, launches  # (the first and last steps, and whole-sequence kernels: 18)
