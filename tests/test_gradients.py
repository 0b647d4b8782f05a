"""Gradients of every differentiable Tensor method against torch.autograd.grad: elementwise, reductions, views, linalg."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import ember as em
from tests.gradcheck import Case, check_gradients

S = (3, 5)  # the usual shape: small, not a power of two


def _torch_gelu(x: torch.Tensor) -> torch.Tensor:
    """torch's exact gelu computed in float64 (its float32 kernels, forward and backward, are oneDNN's on x86 and
    differ by CPU), rounded back to x's dtype."""
    return F.gelu(x.double()).to(x.dtype)


ELEMENTWISE = [
    # arithmetic, with broadcasting and Python scalars on either side
    Case("add_broadcast", lambda x, y: x + y, [(4, 1, 5), (3, 5)]),
    Case("add_alpha", lambda x, y: x.add(y, alpha=2.5), [S, S]),
    Case("sub_broadcast", lambda x, y: x - y, [(3, 1), (1, 5)]),
    Case("rsub_scalar", lambda x: 3.0 - x, [S]),
    Case("mul_broadcast", lambda x, y: x * y, [(2, 3, 5), (5,)], second_order=True),
    Case("mul_self", lambda x: x * x * x, [S], second_order=True),
    Case("div", lambda x, y: x / y, [S, S], low=0.5, high=2.0, second_order=True),
    Case("div_broadcast_scalar_left", lambda x: 2.0 / x, [S], low=0.5, high=2.0),
    Case("div_scalar", lambda x: x / 3.0, [S]),
    Case("neg", lambda x: -x, [S]),
    Case("reciprocal", lambda x: x.reciprocal(), [S], low=0.5, high=2.0, second_order=True),
    Case("square", lambda x: x.square(), [S]),
    Case("pow_int", lambda x: x**3, [S], second_order=True),
    Case("pow_float", lambda x: x**2.5, [S], low=0.2, high=2.0, second_order=True),
    Case("pow_negative", lambda x: x**-1.5, [S], low=0.5, high=2.0),
    Case("pow_tensor", lambda x, y: x**y, [S, S], low=0.5, high=2.0, second_order=True),
    Case("rpow", lambda x: 2.0**x, [S]),
    Case("abs", lambda x: x.abs(), [S]),
    Case("sign", lambda x: x.sign() * x, [S]),
    Case("remainder", lambda x, y: x.remainder(y), [S, S], low=0.5, high=3.0),
    Case("fmod", lambda x, y: x.fmod(y), [S, S], low=0.5, high=3.0),
    Case("lerp", lambda x, y: x.lerp(y, 0.3), [S, S]),
    Case("lerp_tensor_weight", lambda x, y, w: x.lerp(y, w), [S, S, (5,)]),
    # exponentials, logarithms, trigonometry
    Case("exp", lambda x: x.exp(), [S], second_order=True),
    Case("exp2", lambda x: x.exp2(), [S]),
    Case("expm1", lambda x: x.expm1(), [S]),
    Case("log", lambda x: x.log(), [S], low=0.2, high=3.0, second_order=True),
    Case("log2", lambda x: x.log2(), [S], low=0.2, high=3.0),
    Case("log10", lambda x: x.log10(), [S], low=0.2, high=3.0),
    Case("log1p", lambda x: x.log1p(), [S], low=-0.5, high=3.0),
    Case("sqrt", lambda x: x.sqrt(), [S], low=0.2, high=3.0, second_order=True),
    Case("rsqrt", lambda x: x.rsqrt(), [S], low=0.2, high=3.0),
    Case("sin", lambda x: x.sin(), [S], second_order=True),
    Case("cos", lambda x: x.cos(), [S], second_order=True),
    Case("tan", lambda x: x.tan(), [S], low=-1.2, high=1.2),
    Case("tanh", lambda x: x.tanh(), [S], second_order=True),
    Case("sigmoid", lambda x: x.sigmoid(), [S], low=-6.0, high=6.0, second_order=True),
    Case("erf", lambda x: x.erf(), [S]),
    # activations
    Case("relu", lambda x: x.relu(), [S]),
    Case("relu6", lambda x: F.relu6(x) if isinstance(x, torch.Tensor) else x.relu6(), [S], low=-3.0, high=9.0),
    Case("leaky_relu", lambda x: x.leaky_relu(0.2), [S], torch_function=lambda x: F.leaky_relu(x, 0.2)),
    Case("elu", lambda x: x.elu(0.7), [S], torch_function=lambda x: F.elu(x, 0.7)),
    Case("selu", lambda x: x.selu(), [S], torch_function=F.selu),
    Case("celu", lambda x: x.celu(1.3), [S], torch_function=lambda x: F.celu(x, 1.3)),
    Case("gelu", lambda x: x.gelu(), [S], torch_function=_torch_gelu, second_order=True),
    Case("gelu_tanh", lambda x: x.gelu("tanh"), [S], torch_function=lambda x: F.gelu(x, approximate="tanh")),
    Case("silu", lambda x: x.silu(), [S], torch_function=F.silu, second_order=True),
    Case("mish", lambda x: x.mish(), [S], torch_function=F.mish),
    Case("softplus", lambda x: x.softplus(2.0, 3.0), [S], torch_function=lambda x: F.softplus(x, 2.0, 3.0)),
    Case("hardtanh", lambda x: x.hardtanh(-0.5, 1.5), [S], torch_function=lambda x: F.hardtanh(x, -0.5, 1.5)),
    Case("hardsigmoid", lambda x: x.hardsigmoid(), [S], low=-4.0, high=4.0, torch_function=F.hardsigmoid),
    Case("hardswish", lambda x: x.hardswish(), [S], low=-4.0, high=4.0, torch_function=F.hardswish),
    Case("softsign", lambda x: x.softsign(), [S], torch_function=F.softsign),
    Case("logsigmoid", lambda x: x.logsigmoid(), [S], low=-6.0, high=6.0, torch_function=F.logsigmoid),
    # piecewise constant (zero gradient, as torch) and their combinations
    Case("trunc_floor_ceil_round", lambda x: x.trunc() + x.floor() * 2 + x.ceil() * 3 + x.round() * 4, [S]),
    Case("frac", lambda x: x.frac(), [S]),
    # selection and clamping
    Case("maximum", lambda x, y: x.maximum(y), [(3, 1), S]),
    Case("minimum", lambda x, y: x.minimum(y), [S, S]),
    Case("maximum_ties", lambda x, y: x.maximum(y), [], data=[[1.0, 2.0, 3.0], [1.0, 0.0, 3.0]]),
    Case("clamp", lambda x: x.clamp(-0.5, 0.7), [S]),
    Case("clamp_min_tensor", lambda x, y: x.clamp(min=y), [S, (5,)]),
    Case("clamp_max", lambda x: x.clamp(max=0.3), [S]),
    Case("where", lambda x, y: (x * 2).where(x > 0, y), [S, (5,)]),
    Case("where_function", lambda x, y: em.where(x > 0, x * 2, y), [S, (5,)],
         torch_function=lambda x, y: torch.where(x > 0, x * 2, y)),
    Case("where_scalar", lambda x: x.where(x > 0, 0.5), [S]),
    Case("where_scalar_input", lambda x: em.where(x > 0, 0.5, x), [S],
         torch_function=lambda x: torch.where(x > 0, 0.5, x)),
    Case("where_nan_branch", lambda x: x.sqrt().where(x > 0, 0.0), [S]),
    Case("masked_fill", lambda x: x.masked_fill(x < 0.5, -1.0), [S]),
    Case("nan_to_num", lambda x: (x.log()).nan_to_num(0.0, 1.0, -1.0), [S], low=0.0, high=2.0),
    # casts between float dtypes keep the gradient (in the input's dtype)
    Case("cast_double", lambda x: (x.double() * 3).sin().float(), [S]),
    Case("cast_double_input", lambda x: (x.float() * 3).sin(), [S], dtype="float64"),
    Case("cast_to_int_cuts_gradient", lambda x: x * x.long().float(), [S]),
]

REDUCTIONS = [
    Case("sum_all", lambda x: x.sum(), [(3, 4, 5)]),
    Case("sum_dim", lambda x: x.sum(1), [(3, 4, 5)]),
    Case("sum_dims_keepdim", lambda x: x.sum((0, 2), keepdim=True), [(3, 4, 5)]),
    Case("sum_negative_dim", lambda x: x.sum(-1), [S]),
    Case("sum_zero_size", lambda x: x.sum(0), [(0, 4)]),
    Case("mean", lambda x: x.mean(), [(3, 4, 5)]),
    Case("mean_dim_keepdim", lambda x: x.mean(-1, keepdim=True), [(3, 4, 5)]),
    Case("prod_all", lambda x: x.prod(), [(2, 3)], low=0.5, high=1.5),
    Case("prod_dim", lambda x: x.prod(1), [(3, 4)], second_order=True),
    Case("prod_dim_keepdim", lambda x: x.prod(0, keepdim=True), [(3, 4)]),
    Case("prod_zeros", lambda x: x.prod(1), [],
         data=[[[1.0, 2.0, 3.0, 4.0], [1.0, 0.0, 3.0, 4.0], [0.0, 2.0, 0.0, 4.0], [0.0, 0.0, 0.0, 0.0]]]),
    Case("amax", lambda x: x.amax(1), [(3, 4, 5)]),
    Case("amax_dims_keepdim", lambda x: x.amax((0, 2), keepdim=True), [(3, 4, 5)]),
    Case("amin", lambda x: x.amin(-1), [(3, 4, 5)]),
    Case("amax_ties", lambda x: x.amax(1), [], data=[[[1.0, 3.0, 3.0], [2.0, 2.0, 2.0], [0.0, -1.0, 5.0]]]),
    Case("max_all", lambda x: x.max(), [(3, 4)]),
    Case("max_all_ties", lambda x: x.max(), [], data=[[[1.0, 4.0], [4.0, 0.0]]]),
    Case("min_all", lambda x: x.min(), [(3, 4)]),
    Case("max_dim_values", lambda x: x.max(1).values, [(3, 4, 5)]),
    Case("max_dim_keepdim", lambda x: x.max(-1, keepdim=True)[0], [(3, 4, 5)]),
    Case("min_dim_values", lambda x: x.min(0).values, [(3, 4)]),
    Case("var", lambda x: x.var(1), [(3, 6)], second_order=True),
    Case("var_unbiased_false_keepdim", lambda x: x.var(0, unbiased=False, keepdim=True), [(3, 6)]),
    Case("var_all", lambda x: x.var(), [(3, 6)]),
    Case("std", lambda x: x.std(-1), [(3, 6)]),
    Case("std_correction", lambda x: x.std((0, 1), correction=0), [(2, 3, 4)]),
    Case("logsumexp", lambda x: x.logsumexp(1), [(3, 5)], second_order=True),
    Case("logsumexp_keepdim", lambda x: x.logsumexp((0, 1), keepdim=True), [(3, 4, 2)]),
    Case("norm", lambda x: x.norm(), [(3, 5)]),
    Case("norm_dim", lambda x: x.norm(dim=1, keepdim=True), [(3, 5)]),
    Case("norm_p1", lambda x: x.norm(p=1, dim=0), [(3, 5)]),
    Case("norm_inf", lambda x: x.norm(p=math.inf, dim=1), [(3, 5)]),
    Case("norm_p3", lambda x: x.norm(p=3, dim=1), [(3, 5)]),
    Case("cumsum", lambda x: x.cumsum(1), [(3, 6)]),
    Case("cumsum_dim0", lambda x: x.cumsum(0), [(5, 2)]),
    Case("cumprod", lambda x: x.cumprod(1), [(3, 5)]),
    Case("cummax", lambda x: x.cummax(1).values, [(3, 5)]),
]

MOVEMENT = [
    Case("reshape", lambda x: x.reshape(5, 3) * x.reshape(-1)[:, None].reshape(5, 3), [S]),
    Case("view_flatten", lambda x: x.view(-1) * 2, [(2, 3, 4)]),
    Case("expand", lambda x: x.expand(4, 3, 5), [(3, 1)]),
    Case("expand_new_dims", lambda x: x.expand(2, 3, 4), [(4,)]),
    Case("broadcast_to", lambda x: x.broadcast_to((2, 3, 5)) * 1.5, [(1, 5)]),
    Case("permute", lambda x: x.permute(2, 0, 1), [(2, 3, 4)]),
    Case("transpose", lambda x: x.transpose(0, -1), [(2, 3, 4)]),
    Case("t_T_mT", lambda x, y: x.t() + y.T + y.mT, [(3, 5), (3, 5)]),
    Case("movedim", lambda x: x.movedim(0, -1), [(2, 3, 4)]),
    Case("flip", lambda x: x.flip(0, 2), [(2, 3, 4)]),
    Case("pad", lambda x: x.pad((1, 2, 0, 3), value=0.5), [S], torch_function=lambda x: F.pad(x, (1, 2, 0, 3), value=0.5)),
    Case("pad_negative", lambda x: x.pad((-1, 2, 1, -2)), [(4, 5)], torch_function=lambda x: F.pad(x, (-1, 2, 1, -2))),
    Case("shrink", lambda x: x.shrink(((1, 3), None)), [(4, 5)], torch_function=lambda x: x[1:3]),
    Case("flatten_unflatten", lambda x: x.flatten(1).unflatten(1, (4, 3)).sin(), [(2, 3, 4)]),
    Case("squeeze_unsqueeze", lambda x: x.squeeze(1).unsqueeze(0), [(3, 1, 5)]),
    Case("repeat", lambda x: x.repeat(2, 1, 3), [(3, 2)]),
    Case("repeat_interleave", lambda x: x.repeat_interleave(3, dim=1), [(2, 3)]),
    Case("narrow", lambda x: x.narrow(1, 1, 3), [S]),
    Case("split", lambda x: x.split(2, dim=1), [S]),
    Case("split_sections", lambda x: x.split([1, 4], dim=1), [S]),
    Case("chunk", lambda x: x.chunk(2, dim=0), [(5, 3)]),
    Case("unbind", lambda x: x.unbind(1), [(2, 3)]),
    Case("tensor_split", lambda x: x.tensor_split(3, dim=1), [(2, 7)]),
    Case("cat", lambda x, y: em.cat([x, y, x], dim=1) if isinstance(x, em.Tensor) else torch.cat([x, y, x], dim=1),
         [(2, 3), (2, 4)]),
    Case("stack", lambda x, y: em.stack([x, y], dim=-1) if isinstance(x, em.Tensor) else torch.stack([x, y], dim=-1),
         [S, S]),
    Case("index_int_slice", lambda x: x[1, 1:4], [(3, 5)]),
    Case("index_steps", lambda x: x[::2, ..., 1::3], [(5, 2, 7)]),
    Case("index_none_negative", lambda x: x[None, -1, :, None], [(3, 4)]),
    Case("view_chain", lambda x: x.permute(1, 0)[1:, ::2].reshape(-1).flip(0).exp(), [(4, 5)]),
]

LINALG = [
    Case("matmul", lambda x, y: x @ y, [(3, 4), (4, 5)], second_order=True),
    Case("matmul_batched_broadcast", lambda x, y: x @ y, [(2, 1, 3, 4), (3, 4, 2)]),
    Case("matmul_vector_matrix", lambda x, y: x @ y, [(4,), (4, 5)]),
    Case("matmul_matrix_vector", lambda x, y: x @ y, [(3, 4), (4,)]),
    Case("matmul_vector_vector", lambda x, y: x @ y, [(4,), (4,)]),
    Case("mm", lambda x, y: x.mm(y), [(3, 4), (4, 2)]),
    Case("bmm", lambda x, y: x.bmm(y), [(2, 3, 4), (2, 4, 2)]),
    Case("dot", lambda x, y: x.dot(y), [(6,), (6,)]),
    Case("outer", lambda x, y: x.outer(y), [(3,), (4,)]),
    Case("mlp", lambda x, w, b: (x @ w + b).relu().sum(-1), [(4, 6), (6, 3), (3,)]),
]

FUNCTIONAL = [
    Case("softmax", lambda x: x.softmax(-1), [(3, 5)], second_order=True),
    Case("softmax_dim0", lambda x: x.softmax(0), [(3, 4, 2)]),
    Case("log_softmax", lambda x: x.log_softmax(1), [(3, 5)], second_order=True),
    Case("log_softmax_large", lambda x: (x * 30).log_softmax(-1), [(2, 7)]),
]

def _einsum(equation: str, *operands: Any) -> Any:
    return (torch if isinstance(operands[0], torch.Tensor) else em).einsum(equation, *operands)


MORE = [
    Case("erfc", lambda x: x.erfc(), [S]),
    Case("fix", lambda x: x.fix() * x, [S]),
    Case("float_power", lambda x: x.float_power(2.5), [S], low=0.2, high=2.0),
    Case("fmax_fmin", lambda x, y: x.fmax(y) + x.fmin(y * 0.5), [S, S]),
    Case("clamp_min_max", lambda x: x.clamp_min(-0.5) * x.clamp_max(0.5), [S]),
    Case("half_cast", lambda x: (x.half() * 2).float(), [S], atol=1e-2, rtol=1e-2),
    Case("div_rounding_mode", lambda x, y: x.div(y, rounding_mode="floor") * x + x.div(y, rounding_mode="trunc"),
         [S, S], low=0.5, high=3.0),
    Case("clone_contiguous", lambda x: x.T.contiguous().clone() * 2, [S]),
    Case("expand_as_view_as", lambda x, y: x.expand_as(y) + y.view_as(y.T.T), [(3, 1), S]),
    Case("roll", lambda x: x.roll((1, -2), (0, 1)), [(3, 4)]),
    Case("roll_flat", lambda x: x.roll(2), [(3, 4)]),
    Case("select", lambda x: x.select(1, -1), [(3, 4, 2)]),
    Case("softmin", lambda x: x.softmin(1), [(3, 5)], torch_function=lambda x: F.softmin(x, 1)),
    Case("std_mean", lambda x: x.std_mean(1), [(3, 5)], torch_function=lambda x: torch.std_mean(x, 1)),
    Case("var_mean", lambda x: x.var_mean(0, keepdim=True), [(3, 5)],
         torch_function=lambda x: torch.var_mean(x, 0, keepdim=True)),
    Case("aminmax", lambda x: x.aminmax(dim=1), [(3, 5)], torch_function=lambda x: _torch_aminmax(x, 1)),
    Case("addmm", lambda b, x, y: b.addmm(x, y, beta=0.5, alpha=2.0), [(3, 2), (3, 4), (4, 2)]),
    Case("mv_inner_ger", lambda m, v, w: m.mv(v).inner(w) + v.ger(w).sum(), [(3, 4), (4,), (3,)]),
    Case("einsum_batched", lambda x, y: _einsum("bij,bjk->bik", x, y), [(2, 3, 4), (2, 4, 5)]),
    Case("einsum_trace_outer", lambda x, y: _einsum("ii,j->j", x, y), [(3, 3), (4,)]),
    Case("take", lambda x: x.take(em.tensor([0, 5, 5], device=x.device) if isinstance(x, em.Tensor)
                                   else torch.tensor([0, 5, 5])), [(2, 3)]),
    Case("scatter_reduce_sum", lambda x, s: x.scatter_reduce(0, _index(x, [0, 1, 0]), s, "sum"), [(2,), (3,)]),
    Case("scatter_reduce_mean", lambda x, s: x.scatter_reduce(0, _index(x, [0, 1, 0]), s, "mean"), [(2,), (3,)]),
    Case("scatter_reduce_amax", lambda x, s: x.scatter_reduce(0, _index(x, [0, 1, 0]), s, "amax"), [(2,), (3,)]),
    Case("scatter_reduce_prod", lambda x, s: x.scatter_reduce(0, _index(x, [0, 1, 0]), s, "prod",
                                                              include_self=False), [(2,), (3,)]),
    Case("in_place_on_non_leaf", lambda x: _in_place_chain(x), [S]),
]


def _torch_aminmax_has_gradient() -> bool:
    """torch.aminmax got a backward in 2026 (pytorch#175215; 2.13 has it, 2.11 raised), so ask the installed one."""
    x = torch.zeros(1, 2, requires_grad=True)
    try:
        torch.autograd.grad(x.aminmax(dim=1)[0].sum(), x)
    except RuntimeError:
        return False
    return True


TORCH_AMINMAX_HAS_GRADIENT = _torch_aminmax_has_gradient()


def _torch_aminmax(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's aminmax, or what it is documented to be, (amin, amax), where the installed torch cannot
    differentiate it (its backward, where it exists, is amin's and amax's: ties share the gradient)."""
    if TORCH_AMINMAX_HAS_GRADIENT:
        return tuple(x.aminmax(dim=dim))
    return x.amin(dim=dim), x.amax(dim=dim)


def _index(like: Any, values: list[int]) -> Any:
    return torch.tensor(values) if isinstance(like, torch.Tensor) else em.tensor(values, device=like.device)


def _in_place_chain(x: Any) -> Any:
    y = x * 1.0
    y.mul_(2).add_(x).sub_(0.5)
    y.clamp_(-1.0, 1.0)
    y.masked_fill_(x > 1.5, 0.25)
    y.pow_(2)
    return y


CASES = ELEMENTWISE + REDUCTIONS + MOVEMENT + LINALG + FUNCTIONAL + MORE

# Values where a composition can divide 0 by 0 or overflow in its backward graph even though the function is smooth
# there: zero, tiny, moderate and large magnitudes of both signs. Kinks (relu at 0, ...) are not included.
SPECIAL_VALUES = [0.0, 1e-9, -1e-9, 1e-4, -1e-4, 0.5, -0.5, 1.0, -1.0, 3.0, -3.0, 17.0, -17.0, 30.0, -30.0, 90.0, -90.0]
POSITIVE = [value for value in SPECIAL_VALUES if value > 0]

# (name, function on ember and torch tensors or an (ember, torch) pair, the values to use)
SMOOTH_AT_SPECIAL_VALUES = [
    ("exp", lambda x: x.exp(), [value for value in SPECIAL_VALUES if value < 80]),
    ("expm1", lambda x: x.expm1(), [value for value in SPECIAL_VALUES if value < 80]),
    ("log", lambda x: x.log(), POSITIVE),
    ("log1p", lambda x: x.log1p(), [value for value in SPECIAL_VALUES if value > -1]),
    ("sqrt", lambda x: x.sqrt(), POSITIVE),
    ("pow_2_5", lambda x: x**2.5, POSITIVE + [0.0]),
    ("pow_3", lambda x: x**3, SPECIAL_VALUES[:13]),
    ("sin", lambda x: x.sin(), SPECIAL_VALUES),
    ("cos", lambda x: x.cos(), SPECIAL_VALUES),
    ("tanh", lambda x: x.tanh(), SPECIAL_VALUES),
    ("sigmoid", lambda x: x.sigmoid(), SPECIAL_VALUES),
    ("softplus", (lambda x: x.softplus(), F.softplus), SPECIAL_VALUES[1:]),
    ("logsigmoid", (lambda x: x.logsigmoid(), F.logsigmoid), SPECIAL_VALUES),
    ("silu", (lambda x: x.silu(), F.silu), SPECIAL_VALUES),
    ("gelu", (lambda x: x.gelu(), _torch_gelu), SPECIAL_VALUES),
    ("gelu_tanh", (lambda x: x.gelu("tanh"), lambda x: F.gelu(x, approximate="tanh")), SPECIAL_VALUES),
    ("mish", (lambda x: x.mish(), F.mish), SPECIAL_VALUES),
    ("elu", (lambda x: x.elu(), F.elu), SPECIAL_VALUES[1:]),
    ("selu", (lambda x: x.selu(), F.selu), SPECIAL_VALUES[1:]),
    ("erf", lambda x: x.erf(), SPECIAL_VALUES),
    ("softsign", (lambda x: x.softsign(), F.softsign), SPECIAL_VALUES[1:]),
    ("log_softmax", lambda x: x.log_softmax(0), SPECIAL_VALUES),
    ("softmax", lambda x: x.softmax(0), SPECIAL_VALUES[:13]),
    ("logsumexp", lambda x: x.logsumexp(0), SPECIAL_VALUES),
    ("norm", lambda x: x.norm(), SPECIAL_VALUES[:13]),
]


@pytest.mark.parametrize("name, function, values",
                         [pytest.param(*entry, id=entry[0]) for entry in SMOOTH_AT_SPECIAL_VALUES])
def test_gradient_at_special_values(name: str, function: Any, values: list[float], device: str) -> None:
    ember_function, torch_function = function if isinstance(function, tuple) else (function, function)
    check_gradients(Case(name, ember_function, [], torch_function=torch_function, data=[values], atol=1e-6), device)


@pytest.mark.parametrize("case", [pytest.param(case, id=case.name, marks=case.marks) for case in CASES])
def test_gradient(case: Case, device: str) -> None:
    check_gradients(case, device)


def test_case_names_are_unique() -> None:
    names = [case.name for case in CASES]
    assert len(names) == len(set(names)), sorted(name for name in names if names.count(name) > 1)


# Kinks and ties, where torch picks a convention: relu'(0) = 0, |x|'(0) = 0, clamp passes the gradient at its bounds,
# max(dim) and max_pool send it to the first maximum only while amax, max() and maximum split it among ties.
KINK_VALUES = [0.0, -1.0, 1.0, 3.0, -3.0, 6.0, 0.5, 2.0, 2.0]
TIES = [[[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 5.0], [0.0, 0.0, -1.0, 0.0]]]
KINK_CASES = [
    Case("kink_relu", lambda x: x.relu(), [], data=[KINK_VALUES]),
    Case("kink_abs", lambda x: x.abs(), [], data=[KINK_VALUES]),
    Case("kink_clamp", lambda x: x.clamp(-1.0, 2.0), [], data=[KINK_VALUES]),
    Case("kink_hardtanh_relu6", lambda x: x.hardtanh(-1.0, 2.0) + (x * 2).relu6(), [], data=[KINK_VALUES],
         torch_function=lambda x: F.hardtanh(x, -1.0, 2.0) + F.relu6(x * 2)),
    Case("kink_hardsigmoid_hardswish", lambda x: x.hardsigmoid() + x.hardswish(), [], data=[KINK_VALUES],
         torch_function=lambda x: F.hardsigmoid(x) + F.hardswish(x)),
    Case("kink_leaky_relu", lambda x: x.leaky_relu(0.1), [], data=[KINK_VALUES],
         torch_function=lambda x: F.leaky_relu(x, 0.1)),
    Case("kink_floor_round_sign", lambda x: x.floor() + x.round() + x.sign() * x, [], data=[KINK_VALUES]),
    Case("ties_amax", lambda x: x.amax(1), [], data=TIES),
    Case("ties_max_all", lambda x: x.max(), [], data=TIES),
    Case("ties_max_dim", lambda x: x.max(1).values, [], data=TIES),
    Case("ties_min_dim", lambda x: x.min(1).values, [], data=TIES),
    Case("ties_cummax", lambda x: x.cummax(1).values + x.cummax(0).values, [], data=TIES),
    Case("ties_max_pool2d", lambda x: x.unsqueeze(0).max_pool2d(2, 1), [], data=TIES,
         torch_function=lambda x: F.max_pool2d(x.unsqueeze(0), 2, 1)),
    Case("zero_norm_and_std", lambda x: (x * 0).norm() + (x * 0).std(), [(2, 3)]),
    Case("sign_alone", lambda x: x.sign(), [(2, 3)]),
]


@pytest.mark.parametrize("case", [pytest.param(case, id=case.name, marks=case.marks) for case in KINK_CASES])
def test_gradient_at_kinks_and_ties(case: Case, device: str) -> None:
    check_gradients(case, device)
