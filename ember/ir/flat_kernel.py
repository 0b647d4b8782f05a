"""A kernel's flat form: an elementwise kernel over whole tensors (inputs read in order, scalars broadcast), or a
reduce of such a kernel to one value, computes the same with every full-size step made one axis of n elements. The
flat forms of an optimizer's per-parameter updates differ only in n, whatever each parameter's shape, so they make
one shape class (scheduler/shape_classes.batch_classes) with n read at launch."""

from __future__ import annotations

from ember.core.ops import ELEMENTWISE_OPS, REDUCE_OPS, Op
from ember.core.shapes import prod
from ember.ir.kernel import Kernel, KernelStep

# what a step of a kernel is to its flat form: FULL, one of n elements in row-major order (made one axis); ONE, a
# single value (kept as it is: a scalar, an element sliced from a small buffer, a sum of everything); OTHER, a value
# of another size that only ONE values are made from (a small buffer of scalars, kept as it is)
FULL, ONE, OTHER = "full", "one", "other"


def flat_kernel(kernel: Kernel) -> Kernel | None:
    """`kernel` with its full-size steps on one axis of n elements (a reduce of all of them to one value kept, over
    that axis), or None where it is not such a kernel: a step moves full-size elements (a permute, slice, pad,
    flip, a reduce of some axes) or makes a full-size value from anything but a broadcast single value, or n < 2."""
    steps = kernel.steps
    output = steps[-1]
    if output.op in REDUCE_OPS:
        source_shape = steps[output.srcs[0]].shape
        if prod(output.shape) != 1 or tuple(output.arg) != tuple(range(len(source_shape))):
            return None
        size = prod(source_shape)
    else:
        size = prod(output.shape)
    if size < 2:
        return None
    kinds: list[str] = []
    positions: list[int] = []  # each step's position in the flat kernel
    flat: list[KernelStep] = []

    def add(step: KernelStep) -> int:
        flat.append(step)
        return len(flat) - 1

    for step in steps:
        kind = _kind(step, [kinds[source] for source in step.srcs], size, kernel.input_sizes)
        if kind is None:
            return None
        sources = tuple(positions[source] for source in step.srcs)
        if kind == FULL and step.op is Op.RESHAPE:
            position = sources[0]  # (a reshape of full-size elements keeps their order: nothing to do)
        elif kind == FULL and step.op is Op.EXPAND:
            single = sources[0]
            while flat[single].op is Op.RESHAPE and prod(flat[flat[single].srcs[0]].shape) == 1:
                single = flat[single].srcs[0]  # (the value reshaped to ones, once per rank: one reshape will do)
            sources = (single,)
            if flat[single].shape != (1,):
                sources = (add(KernelStep(Op.RESHAPE, sources, (1,), (1,), flat[single].dtype)),)
            position = add(KernelStep(Op.EXPAND, sources, (size,), (size,), step.dtype))
        elif kind == FULL:
            position = add(step._replace(srcs=sources, shape=(size,)))
        elif step.op in REDUCE_OPS and kinds[step.srcs[0]] == FULL:
            position = add(KernelStep(step.op, sources, (0,), (1,), step.dtype))
            if step.shape != (1,) and step is not output:
                position = add(KernelStep(Op.RESHAPE, (position,), step.shape, step.shape, step.dtype))
        else:
            position = add(step._replace(srcs=sources))
        kinds.append(kind)
        positions.append(position)
    if FULL not in kinds or positions[-1] != len(flat) - 1:
        return None  # (nothing full-size, or the output is a reshape of a full-size step: stored by its source)
    return Kernel(_live_steps(flat), kernel.input_sizes)


def _live_steps(steps: list[KernelStep]) -> tuple[KernelStep, ...]:
    """The steps the last one is computed from, in their order, with their sources renumbered (reshapes to ones
    that no step reads any more are dropped: flat forms alike but for their ranks are then the same)."""
    live = [False] * len(steps)
    live[-1] = True
    for position in range(len(steps) - 1, -1, -1):
        if live[position]:
            for source in steps[position].srcs:
                live[source] = True
    renumbered: dict[int, int] = {}
    kept: list[KernelStep] = []
    for position, step in enumerate(steps):
        if live[position]:
            renumbered[position] = len(kept)
            kept.append(step._replace(srcs=tuple(renumbered[source] for source in step.srcs)))
    return tuple(kept)


def _kind(step: KernelStep, sources: list[str], size: int, input_sizes: tuple[int, ...]) -> str | None:
    """What `step` is in a flat form over `size` elements (FULL, ONE, OTHER), or None where it has none."""
    count = prod(step.shape)
    op = step.op
    if op is Op.BUFFER:
        if count == size and input_sizes[step.arg - 1] == size:
            return FULL
        return ONE if count == 1 else OTHER
    if op is Op.CONST:
        return FULL if count == size else ONE if count == 1 else None
    if op is Op.ARANGE:
        return FULL if step.shape == (size,) else ONE if count == 1 else OTHER
    if FULL not in sources:
        if count == size and op is Op.EXPAND and sources == [ONE]:
            return FULL
        if count == size:
            return None  # (full-size elements made from a smaller value in some order: a gather, a tiling)
        return ONE if count == 1 else OTHER
    if count == size and all(kind == FULL for kind in sources) and (op in ELEMENTWISE_OPS or op is Op.RESHAPE):
        return FULL
    if op in REDUCE_OPS and count == 1 and tuple(step.arg) == tuple(range(len(step.shape))):
        return ONE  # (a reduce of all full-size elements to one value)
    return None
