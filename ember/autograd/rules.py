"""Backward rules: for each primitive op (and each composition recorded as one step), the gradients of its sources
given the gradient of its output."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ember.autograd.grad_mode import is_grad_enabled
from ember.core.ops import Composite, Op
from ember.core.read_alike import read_alike
from ember.core.staged_reduce import reduce_axes
from ember.core.views import intermediates

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

LN_2 = math.log(2.0)


class Recorded(NamedTuple):
    """One recorded primitive: its output tensor, its arg and its source tensors (what a backward rule reads)."""

    output: Tensor
    arg: Any
    sources: tuple[Tensor, ...]


Gradients = tuple["Tensor | None", ...]
Rule = Callable[[Recorded, "Tensor"], Gradients]


# ---- small compositions the rules share (all of them Tensor ops, so the backward graph is lazy and fused) ----


def _zeros(like: Tensor) -> Tensor:
    """A lazy zero constant with the shape, dtype and device of `like` (torch's zeros_like, not like * 0)."""
    return like._full(like.shape, 0, like.dtype, like.device)


def _ones(like: Tensor) -> Tensor:
    return like._full(like.shape, 1, like.dtype, like.device)


def _select(mask: Tensor, if_true: Tensor, if_false: Tensor) -> Tensor:
    return mask._apply(Op.WHERE, if_true, if_false)


def _expand_to(gradient: Tensor, shape: tuple[int, ...]) -> Tensor:
    return gradient if gradient.shape == shape else gradient._apply(Op.EXPAND, arg=shape)


def _reduce(tensor: Tensor, op: Op, axes: tuple[int, ...]) -> Tensor:
    return reduce_axes(tensor, op, axes)


# ---- rules with more than one line -----------------------------------------------------------------------------


def _maximum(step: Recorded, grad: Tensor) -> Gradients:
    """Gradient to the larger operand; split in half on ties (as torch.maximum does)."""
    left, right = step.sources
    zeros = _zeros(grad)
    equal_share = _select(left == right, grad * 0.5, grad)
    return _select(left < right, zeros, equal_share), _select(right < left, zeros, equal_share)


def _relu(output: Tensor, grad: Tensor) -> Gradients:
    """torch's rule (threshold_backward on the result): no gradient where relu gave 0, which is where the input was
    at most 0; a NaN input gave NaN and passes the gradient. One comparison with the output, which the next layer
    reads anyway, instead of `input <= 0` (two comparisons and an or, on a tensor the step need not keep)."""
    zeros = _zeros(grad)
    return (_select(output._apply(Op.CMPEQ, zeros), zeros, grad),)


def _reduce_max(step: Recorded, grad: Tensor) -> Gradients:
    """Gradient to every element equal to the maximum, split equally among ties (as torch.amax does). A computed
    source is compared with the maximum of its stored copy (read_alike.py): the output's kernel computed it again."""
    (source,) = step.sources
    alike = read_alike(source)
    maximum = step.output if alike is source else _reduce(alike, Op.REDUCE_MAX, step.arg)
    is_maximum = alike == _expand_to(maximum, source.shape)
    as_float = _select(is_maximum, _ones(source), _zeros(source))
    count = _reduce(as_float, Op.SUM, step.arg)
    return (as_float * _expand_to(grad / count, source.shape),)


def _product(step: Recorded, grad: Tensor) -> Gradients:
    """d prod / d x_i is the product of the other elements, computed without dividing by zero.

    No zero in a reduced group: output / x_i. Exactly one zero: the product of the non-zeros at the zero, 0 elsewhere.
    Two or more zeros: 0 everywhere.
    """
    (source,) = step.sources
    shape, axes = source.shape, step.arg
    zeros, ones = _zeros(source), _ones(source)
    is_zero = source == zeros
    zero_count = _expand_to(_reduce(_select(is_zero, ones, zeros), Op.SUM, axes), shape)
    product_of_nonzeros = _expand_to(_reduce(_select(is_zero, ones, source), Op.PROD, axes), shape)
    without_zeros = _expand_to(step.output, shape) / _select(is_zero, ones, source)
    with_one_zero = _select(is_zero, product_of_nonzeros, zeros)
    others = _select(zero_count == zeros, without_zeros, _select(zero_count == ones, with_one_zero, zeros))
    return (others * _expand_to(grad, shape),)


def _expand(step: Recorded, grad: Tensor) -> Gradients:
    (source,) = step.sources
    axes = tuple(axis for axis, (old, new) in enumerate(zip(source.shape, step.output.shape)) if old != new)
    return (_reduce(grad, Op.SUM, axes),)


def _permute(step: Recorded, grad: Tensor) -> Gradients:
    inverse = tuple(sorted(range(len(step.arg)), key=lambda axis: step.arg[axis]))
    return (grad._apply(Op.PERMUTE, arg=inverse),)


def _pad(step: Recorded, grad: Tensor) -> Gradients:
    (source,) = step.sources
    bounds = tuple((before, before + size) for size, (before, _) in zip(source.shape, step.arg[0]))
    return (grad._apply(Op.SHRINK, arg=bounds),)


def _shrink(step: Recorded, grad: Tensor) -> Gradients:
    (source,) = step.sources
    amounts = tuple((start, size - end) for size, (start, end) in zip(source.shape, step.arg))
    return (grad._apply(Op.PAD, arg=(amounts, 0.0)),)


def _cast(step: Recorded, grad: Tensor) -> Gradients:
    (source,) = step.sources
    return (grad._apply(Op.CAST, arg=source.dtype) if source.dtype.is_float else None,)


def _not_differentiable(step: Recorded, grad: Tensor) -> Gradients:
    return (None,) * len(step.sources)


def _zero_gradient(step: Recorded, grad: Tensor) -> Gradients:
    """Piecewise-constant ops (TRUNC and hence floor, ceil, round): a zero gradient, as torch gives."""
    return (_zeros(grad),)


def _pow_scalar(step: Recorded, grad: Tensor) -> Gradients:
    """torch's pow_backward: 0 for an exponent of 0, else grad * exponent * base ** (exponent - 1)."""
    (base,) = step.sources
    exponent = step.arg
    if exponent == 0:
        return (_zeros(base),)
    return (grad * (base.pow(exponent - 1) * exponent),)


def _pow(step: Recorded, grad: Tensor) -> Gradients:
    """torch's pow_backward_self and pow_backward_exponent: grad * exponent * base ** (exponent - 1) (0 where the
    exponent is 0), and grad * base ** exponent * log(base) (0 where base is 0 and the exponent >= 0)."""
    from ember.core.elementwise import where

    base, exponent = step.sources
    zero = _zeros(base)
    base_gradient = _select(exponent == zero, zero, grad * (exponent * base.pow(exponent - 1)))
    exponent_gradient = grad * where((base == zero).logical_and(exponent >= zero), zero, step.output * base.log())
    return base_gradient, exponent_gradient


def _copysign(step: Recorded, grad: Tensor) -> Gradients:
    """+-1 to the magnitude (-1 where its sign was flipped), 0 where it is 0, NaN where it is NaN; zeros to the
    sign operand, which the output depends on only through its sign bit (torch's copysign backward)."""
    from ember.core.binary_math import sign_bit

    magnitude, sign = step.sources
    zeros, ones = _zeros(magnitude), _ones(magnitude)
    flipped = sign_bit(magnitude) != sign_bit(sign)
    derivative = _select(magnitude == zeros, zeros, _select(flipped, -ones, ones))
    derivative = _select(magnitude.isnan(), magnitude, derivative)  # NaN where the magnitude is NaN
    return grad * derivative, _zeros(sign)


@intermediates
def _grad_totals(grad: Tensor, normalized: Tensor, axes: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """(sum(grad), sum(grad * normalized)) over axes (kept), as one reduce (each stage one kernel, not two): grad
    times [1, normalized] stacked along a new leading axis (normalized padded with a one before it: recomputed
    twice per element, the cheap part; two products stacked would be stored first, as values read under a
    broadcast)."""
    from ember.core.functional import normalization_total
    from ember.core.staged_reduce import merged_reduced_runs

    if not axes:
        return grad, grad * normalized
    merged_shape, merged_axes = merged_reduced_runs(grad.shape, axes)
    if merged_axes != axes:  # (a batch norm's H x W as one axis: its stages read planes as consecutive elements)
        kept_shape = tuple(1 if axis in axes else size for axis, size in enumerate(grad.shape))
        grad_sum, grad_dot = _grad_totals(grad.reshape(merged_shape), normalized.reshape(merged_shape), merged_axes)
        return grad_sum.reshape(kept_shape), grad_dot.reshape(kept_shape)
    factor = normalized.reshape((1,) + normalized.shape)._pad_and_shrink(
        [(1, 0)] + [(0, 0)] * normalized.ndim, value=1.0)
    both = normalization_total(grad.reshape((1,) + grad.shape) * factor, tuple(axis + 1 for axis in axes))
    shape = both.shape[1:]
    return both.shrink([(0, 1)]).reshape(shape), both.shrink([(1, 2)]).reshape(shape)


@intermediates
def _normalize(step: Recorded, grad: Tensor) -> Gradients:
    """torch's backward of batch, group and instance norm from the saved mean and 1 / std. With xhat =
    (x - mean) * inverse_std and n values per statistic: grad_x = (grad - sum(grad) / n - xhat * sum(grad * xhat)
    / n) * inverse_std * weight where the weight is constant over the reduced axes (batch, instance norm), else the
    sums are of weight * grad (group norm: summed over space first, then weighted and summed over the group's
    channels, as torch); grad_weight = sum(grad * xhat) and grad_bias = sum(grad) over the axes it is broadcast on."""
    from ember.context import CONTEXT
    from ember.core.functional import batch_statistics
    from ember.core.functional import normalization_total as total

    saved = step.arg
    source = step.sources[0]
    count = math.prod(source.shape[axis] for axis in saved.axes)
    mean, inverse_std = saved.mean, saved.inverse_std
    if CONTEXT.get().grad_enabled:  # create_graph: the statistics again, with their history (double backward)
        mean, _, inverse_std = batch_statistics(source, saved.axes, saved.eps)
    normalized = (source - mean) * inverse_std
    weight = step.sources[1].reshape(saved.affine_shape) if saved.has_weight else None
    varying = tuple(axis for axis in saved.axes if saved.affine_shape[axis] != 1)  # reduced, the weight varies
    constant = tuple(axis for axis in saved.axes if axis not in varying)
    grad_sum, grad_dot = _grad_totals(grad, normalized, constant)
    if weight is None or not varying:
        scale = inverse_std if weight is None else inverse_std * weight
        grad_mean = _expand_to(total(grad_sum, varying) * (1.0 / count), source.shape)
        dot_mean = _expand_to(total(grad_dot, varying) * (1.0 / count), source.shape)
        source_gradient = (grad - grad_mean - normalized * dot_mean) * scale
    else:
        grad_mean = _expand_to(total(grad_sum * weight, varying) * (1.0 / count), source.shape)
        dot_mean = _expand_to(total(grad_dot * weight, varying) * (1.0 / count), source.shape)
        source_gradient = (grad * weight - grad_mean - normalized * dot_mean) * inverse_std
    broadcast = tuple(axis for axis, size in enumerate(saved.affine_shape) if size == 1 and axis not in constant)
    gradients: list[Tensor | None] = [source_gradient]
    if saved.has_weight:
        gradients.append(total(grad_dot, broadcast).reshape(saved.parameter_shape))
    if saved.has_bias:
        gradients.append(total(grad_sum, broadcast).reshape(saved.parameter_shape))
    return tuple(gradients)


def _convolution(step: Recorded, grad: Tensor) -> Gradients:
    """The input's gradient as the transposed convolution of grad, the weight's as the windows times grad summed
    (core/convolution_forms.py)."""
    from ember.core.convolution_forms import convolution_gradients

    source, weight = step.sources
    return convolution_gradients(grad, source, weight, step.arg)


def _transposed_convolution(step: Recorded, grad: Tensor) -> Gradients:
    """The input's gradient as the convolution of grad whose input gradient the step is, the weight's as grad's
    windows times the input summed (core/convolution_forms.py)."""
    from ember.core.convolution_forms import transposed_convolution_gradients

    source, weight = step.sources
    return transposed_convolution_gradients(grad, source, weight, step.arg)


def _max_pool(step: Recorded, grad: Tensor) -> Gradients:
    """Each window's gradient to its first maximum (torch's index), summed where windows overlap."""
    from ember.core.convolution_forms import max_pool_gradient

    return (max_pool_gradient(grad, step.sources[0], step.arg),)


def _gather(step: Recorded, grad: Tensor) -> Gradients:
    """The gradient of values[..., index] (a 1-d index): grad's entries summed into the positions they were read
    from (a sorted write where the index is long: core/sorted_writes.py)."""
    from ember.core.advanced_indexing import put_last

    values = step.sources[0]
    return (put_last(grad._full(values.shape, 0, grad.dtype, grad.device), step.arg, grad, "sum"),)


def _softmax(step: Recorded, grad: Tensor) -> Gradients:
    """y (g - sum(g y)) over the axis, from the output y (torch's softmax backward)."""
    output = step.output
    product = grad * output
    total = _reduce(product, Op.SUM, (step.arg,)) if output.ndim else product
    return (product - output * _expand_to(total, output.shape),)


def _log_softmax(step: Recorded, grad: Tensor) -> Gradients:
    """g - exp(y) sum(g) over the axis, from the output y (torch's log_softmax backward)."""
    output = step.output
    total = _reduce(grad, Op.SUM, (step.arg,)) if output.ndim else grad
    return (grad - output.exp() * _expand_to(total, output.shape),)


def _gelu(step: Recorded, grad: Tensor) -> Gradients:
    """grad (Phi(x) + x phi(x)) (torch's gelu backward, approximate='none')."""
    from ember.core.unary_math import gelu_derivative

    return (grad * gelu_derivative(step.sources[0]),)


def _deferred_linear(step: Recorded, grad: Tensor) -> Gradients:
    """The weight's and bias's gradients of linear(rows, weight, bias) whose matmul part was computed elsewhere (with
    the weight detached, one time step at a time): step.arg() gives (rows, scale or None) once those steps ran;
    (grad * scale)^T @ rows for all steps at once, and (grad * scale) summed over rows."""
    if is_grad_enabled():
        raise NotImplementedError(
            "backward with create_graph=True through a recurrent layer (RNN, LSTM, GRU) is not supported: its "
            "weight gradients are computed once for all time steps, without a graph of their own"
        )
    rows, scale = step.arg()
    if scale is not None:  # of grad's shape, or of a shape grad's elements in order take (stored in that shape)
        grad = (grad.reshape(scale.shape) * scale).contiguous().reshape(grad.shape)
    weight_gradient = grad.transpose(0, 1).matmul(rows)
    return (weight_gradient, grad.sum(0)) if len(step.sources) > 1 else (weight_gradient,)


def _recurrent_layer(step: Recorded, grad: Tensor) -> Gradients:
    """An LSTM or GRU layer's steps back in time (core/recurrent_steps.py)."""
    from ember.core.recurrent_steps import recurrent_layer_gradients

    return recurrent_layer_gradients(step.output, step.arg, step.sources, grad)


def _traced(step: Recorded, grad: Tensor) -> Gradients:
    """A traced function's gradients: the chain rule through its primitives (autograd/engine.py)."""
    from ember.autograd.engine import function_gradients

    return function_gradients(step.arg.compute, step.sources, grad)


# ---- the table: every primitive op, one entry each ----------------------------------------------------------------

BACKWARD: dict[Op, Rule] = {
    # sources have no sources of their own; COPY and CONTIGUOUS pass the gradient back
    Op.COPY: lambda step, grad: (grad._copy_to(step.sources[0].device),),
    Op.CONTIGUOUS: lambda step, grad: (grad,),
    # unary
    Op.NEG: lambda step, grad: (-grad,),
    Op.RECIPROCAL: lambda step, grad: (-grad * (step.output * step.output),),
    Op.SQRT: lambda step, grad: (grad / (step.output * 2),),
    Op.EXP2: lambda step, grad: (grad * step.output * LN_2,),
    Op.LOG2: lambda step, grad: (grad / (step.sources[0] * LN_2),),
    Op.SIN: lambda step, grad: (grad * step.sources[0].cos(),),
    Op.TRUNC: _zero_gradient,
    Op.NOT: _not_differentiable,
    Op.CAST: _cast,
    Op.BITCAST: _not_differentiable,
    # binary
    Op.ADD: lambda step, grad: (grad, grad),
    Op.SUB: lambda step, grad: (grad, -grad),
    Op.MUL: lambda step, grad: (grad * step.sources[1], grad * step.sources[0]),
    Op.DIV: lambda step, grad: (
        grad / step.sources[1],
        -grad * (step.output / step.sources[1]),  # torch's (a / b) / b: no overflow of b^2 or of grad * a
    ),
    Op.IDIV: _not_differentiable,
    Op.MOD: _not_differentiable,
    Op.MAX: _maximum,
    Op.CMPLT: _not_differentiable,
    Op.CMPEQ: _not_differentiable,
    Op.AND: _not_differentiable,
    Op.OR: _not_differentiable,
    Op.XOR: _not_differentiable,
    Op.SHL: _not_differentiable,
    Op.SHR: _not_differentiable,
    # ternary: the condition gets nothing, each branch gets the gradient where it was chosen
    Op.WHERE: lambda step, grad: (
        None,
        _select(step.sources[0], grad, _zeros(grad)),
        _select(step.sources[0], _zeros(grad), grad),
    ),
    # reductions (the output keeps the reduced axes with size 1)
    Op.SUM: lambda step, grad: (_expand_to(grad, step.sources[0].shape),),
    Op.PROD: _product,
    Op.REDUCE_MAX: _reduce_max,
    # movement: the inverse movement
    Op.RESHAPE: lambda step, grad: (grad._apply(Op.RESHAPE, arg=step.sources[0].shape),),
    Op.EXPAND: _expand,
    Op.PERMUTE: _permute,
    Op.PAD: _pad,
    Op.SHRINK: _shrink,
    Op.FLIP: lambda step, grad: (grad._apply(Op.FLIP, arg=step.arg),),
}

# compositions whose recorded step has its own rule (ember/core/ops.py says why): torch's formulas
COMPOSITE_BACKWARD: dict[Composite, Rule] = {
    Composite.EXP: lambda step, grad: (grad * step.output,),
    Composite.POW: _pow,
    Composite.POW_SCALAR: _pow_scalar,
    Composite.COPYSIGN: _copysign,
    Composite.NORMALIZE: _normalize,
    Composite.CONVOLUTION: _convolution,
    Composite.TRANSPOSED_CONVOLUTION: _transposed_convolution,
    Composite.MAX_POOL: _max_pool,
    Composite.GATHER: _gather,
    Composite.TANH: lambda step, grad: (grad * (1.0 - step.output * step.output),),
    Composite.SIGMOID: lambda step, grad: (grad * (step.output * (1.0 - step.output)),),
    Composite.GATES: lambda step, grad: (grad * ((step.output + step.arg) * (1.0 - step.output)),),
    Composite.RELU: lambda step, grad: _relu(step.output, grad),
    Composite.SOFTMAX: _softmax,
    Composite.LOG_SOFTMAX: _log_softmax,
    Composite.GELU: _gelu,
    Composite.DEFERRED_LINEAR: _deferred_linear,
    Composite.RECURRENT_LAYER: _recurrent_layer,
    Composite.TRACED: _traced,
}

NO_SOURCES = frozenset({Op.BUFFER, Op.CONST, Op.ARANGE})  # never recorded: they have no sources to differentiate

NEVER_RECORDED = NO_SOURCES | {Op.TEMPLATE}  # (a template's copy is made only where no input records history)
assert set(BACKWARD) | NEVER_RECORDED == set(Op), f"ops without a backward rule: {set(Op) - set(BACKWARD) - NEVER_RECORDED}"
assert set(COMPOSITE_BACKWARD) == set(Composite), f"without a rule: {set(Composite) - set(COMPOSITE_BACKWARD)}"
RULES: dict[Op | Composite, Rule] = dict(BACKWARD.items())  # what the engine looks up
RULES.update(COMPOSITE_BACKWARD.items())

# rules whose gradients' graphs the engine copies from a template (core/graph_templates.py) outside create_graph,
# each a composition of many movement and reduce ops decided by the step's shapes and its arg: per rule, how its
# arg splits into a hashable part (for the template's signature), the tensors it holds (inputs of the template) and
# how the arg is made again from those tensors' stand-ins. A convolution's and a pool's arg is their geometry; a
# normalization's holds its saved mean and 1 / std. Built op by op at every step otherwise (a ResNet step's six
# convolutions: ~2.6 ms of its 16, its batch norms' gradients ~1.5 ms)
ArgumentSplit = tuple[Any, tuple["Tensor", ...], Callable[[tuple["Tensor", ...]], Any]]


def _plain_argument(arg: Any) -> ArgumentSplit:
    return arg, (), lambda tensors: arg


def _normalization_argument(saved: Any) -> ArgumentSplit:
    signature = (saved.axes, saved.affine_shape, saved.parameter_shape, saved.eps, saved.has_weight, saved.has_bias)
    return signature, (saved.mean, saved.inverse_std), lambda tensors: saved._replace(mean=tensors[0],
                                                                                       inverse_std=tensors[1])


def _recurrent_layer_argument(saved: Any) -> ArgumentSplit:
    return (saved.mode, saved.steps, saved.reverse, saved.has_bias), saved.stored, lambda tensors: dataclasses.replace(
        saved, stored=tensors)


TEMPLATED_RULES: dict[Op | Composite, Callable[[Any], ArgumentSplit]] = {
    Composite.CONVOLUTION: _plain_argument,
    Composite.TRANSPOSED_CONVOLUTION: _plain_argument,
    Composite.MAX_POOL: _plain_argument,
    Composite.NORMALIZE: _normalization_argument,
    Composite.RECURRENT_LAYER: _recurrent_layer_argument,
    Composite.TRACED: _plain_argument,  # (a TracedFunction: its signature is the template's)
}
