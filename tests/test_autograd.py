"""Autograd semantics against PyTorch: .grad, backward, em.grad, grad modes, higher order, hooks, in-place, errors."""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.autograd.rules import BACKWARD
from ember.core.ops import Op
from tests.conftest import TEST_DEVICES
from tests.helpers import assert_close, pair, random_array


def _leaves(device: str, *shapes: tuple[int, ...]) -> tuple[list[em.Tensor], list[torch.Tensor]]:
    tensors = [pair(random_array(shape, seed=seed), device, requires_grad=True) for seed, shape in enumerate(shapes)]
    return [ember for ember, _ in tensors], [reference for _, reference in tensors]


# ---- backward and .grad ---------------------------------------------------------------------------------------------


def test_backward_fills_and_accumulates_grad(device: str) -> None:
    (x, w), (tx, tw) = _leaves(device, (4, 3), (3, 2))
    for _ in range(2):  # the second backward adds to .grad
        loss = ((x @ w).tanh() * x.sum(1, keepdim=True)).mean()
        torch_loss = ((tx @ tw).tanh() * tx.sum(1, keepdim=True)).mean()
        loss.backward()
        torch_loss.backward()
        assert_close(x.grad, tx.grad)
        assert_close(w.grad, tw.grad)
    for leaf in (x, w):
        assert leaf.grad.node.realized, "backward realizes .grad"
        assert leaf.grad.is_leaf and not leaf.grad.requires_grad, ".grad keeps no graph alive"
        assert leaf.grad.dtype == leaf.dtype and leaf.grad.shape == leaf.shape and leaf.grad.device == leaf.device


def test_backward_realizes_all_gradients_in_one_schedule(device: str) -> None:
    (x, w, b), _ = _leaves(device, (8, 5), (5, 3), (3,))
    loss = (x @ w + b).relu().sum()
    loss.realize()
    with em.profile() as profile:
        loss.backward()
    assert profile.realizes == 1, str(profile)
    assert all(leaf.grad is not None for leaf in (x, w, b))


def test_backward_with_gradient_for_non_scalar(device: str) -> None:
    (x,), (tx,) = _leaves(device, (3, 4))
    upstream, torch_upstream = pair(random_array((4, 3), seed=7), device)
    x.exp().T.backward(upstream)
    tx.exp().T.backward(torch_upstream)
    assert_close(x.grad, tx.grad)


def test_one_element_outputs_need_no_gradient(device: str) -> None:
    (x,), (tx,) = _leaves(device, (2, 3))
    x.sum(keepdim=True, dim=(0, 1)).backward()
    tx.sum(keepdim=True, dim=(0, 1)).backward()
    assert_close(x.grad, tx.grad)


def test_backward_of_a_leaf_and_of_a_realized_forward(device: str) -> None:
    (x,), (tx,) = _leaves(device, (5,))
    upstream = em.ones(5, device=device) * 2
    x.backward(upstream)
    assert_close(x.grad, torch.full((5,), 2.0))
    y = (x * x).sum()
    y.realize()
    y.numpy()  # realizing never destroys the history
    x.grad = None
    y.backward()
    assert_close(x.grad, 2 * tx.detach())


def test_gradient_dtype_follows_the_leaf(device: str) -> None:
    data = random_array((3, 4), dtype=np.float64)
    x, tx = pair(data, device, requires_grad=True)
    (x.float().exp().sum()).backward()
    (tx.float().exp().sum()).backward()
    assert x.grad.dtype == em.float64
    assert_close(x.grad, tx.grad)


def test_shared_subexpressions_and_unused_branches(device: str) -> None:
    (x, y), (tx, ty) = _leaves(device, (3,), (3,))
    z = x * y
    loss = (z * z + z.sin() + x).sum()
    torch_z = tx * ty
    (torch_z * torch_z + torch_z.sin() + tx).sum().backward()
    unused = y * 3  # computed but not part of the loss
    loss.backward()
    assert_close(x.grad, tx.grad)
    assert_close(y.grad, ty.grad)
    assert unused.requires_grad


def test_backward_inputs_restricts_accumulation(device: str) -> None:
    (x, y), (tx, _) = _leaves(device, (3,), (3,))
    (x * y).sum().backward(inputs=[y])
    assert x.grad is None
    assert_close(y.grad, tx.detach())


# ---- graph bookkeeping --------------------------------------------------------------------------------------------


def test_leaves_grad_fn_and_requires_grad(device: str) -> None:
    x = em.tensor([1.0, 2.0], device=device, requires_grad=True)
    constant = em.tensor([3.0, 4.0], device=device)
    y = x * constant
    assert x.is_leaf and x.grad_fn is None and x.requires_grad
    assert constant.is_leaf and not constant.requires_grad
    assert not y.is_leaf and y.requires_grad and y.grad_fn is not None
    assert y.grad_fn.name() == "MulBackward" and "MulBackward" in repr(y.grad_fn)
    assert len(y.grad_fn.next_functions) == 2
    assert (constant * 2).grad_fn is None and not (constant * 2).requires_grad


def test_comparisons_and_integer_results_do_not_require_grad(device: str) -> None:
    x = em.tensor([1.5, -2.0, 0.5], device=device, requires_grad=True)
    for result in (x > 0, x == 1.5, x.long(), x.argmax(), x.isnan(), x.int() + 1):
        assert not result.requires_grad and result.grad_fn is None, result
    assert x.max(0).values.requires_grad and not x.max(0).indices.requires_grad


def test_detach_and_detach_(device: str) -> None:
    x = em.tensor([1.0, 2.0], device=device, requires_grad=True)
    y = x * 2
    detached = y.detach()
    assert detached.is_leaf and not detached.requires_grad
    np.testing.assert_array_equal(detached.numpy(), [2.0, 4.0])
    (detached * x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])  # no gradient through the detached factor
    y.detach_()
    assert y.is_leaf and not y.requires_grad


def test_requires_grad_setter_and_leaf_rules(device: str) -> None:
    x = em.tensor([1.0, 2.0], device=device)
    x.requires_grad = True
    assert x.requires_grad and x.requires_grad_(False) is x and not x.requires_grad
    y = x.requires_grad_() * 2
    with pytest.raises(em.AutogradError, match="not a leaf"):
        y.requires_grad_(False)
    assert em.zeros(2, device=device, requires_grad=True).requires_grad
    assert em.rand(3, device=device, requires_grad=True).is_leaf


# ---- grad modes -----------------------------------------------------------------------------------------------------


def test_no_grad_context_and_decorators(device: str) -> None:
    x = em.tensor([1.0, 2.0], device=device, requires_grad=True)
    assert em.is_grad_enabled()
    with em.no_grad():
        assert not em.is_grad_enabled()
        y = x * 2
        with em.enable_grad():
            assert em.is_grad_enabled()
            z = x * 2
        assert not em.is_grad_enabled()
    assert em.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None
    assert z.requires_grad

    @em.no_grad()
    def called() -> em.Tensor:
        return x * 3

    @em.no_grad
    def bare() -> em.Tensor:
        return x * 3

    assert not called().requires_grad and not bare().requires_grad and em.is_grad_enabled()
    assert called.__name__ == "called"


def test_set_grad_enabled_forms(device: str) -> None:
    x = em.tensor([1.0], device=device, requires_grad=True)
    with em.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert em.is_grad_enabled()
    em.set_grad_enabled(False)
    try:
        assert not (x * 2).requires_grad
    finally:
        em.set_grad_enabled(True)
    assert (x * 2).requires_grad

    @em.set_grad_enabled(False)
    def inside() -> bool:
        return em.is_grad_enabled()

    assert em.is_grad_enabled() and inside() is False and em.is_grad_enabled()


def test_no_grad_restores_mode_after_an_exception(device: str) -> None:
    with pytest.raises(ValueError), em.no_grad():
        raise ValueError("inside")
    assert em.is_grad_enabled()


# ---- em.grad --------------------------------------------------------------------------------------------------------


def test_grad_matches_torch_and_leaves_dot_grad_alone(device: str) -> None:
    (x, w), (tx, tw) = _leaves(device, (3, 4), (4, 2))
    hidden, torch_hidden = x @ w, tx @ tw
    out, torch_out = hidden.sigmoid().sum(), torch_hidden.sigmoid().sum()
    grads = em.grad(out, [w, hidden])  # with respect to a leaf and to an intermediate tensor
    torch_grads = torch.autograd.grad(torch_out, [tw, torch_hidden])
    assert_close(list(grads), list(torch_grads))
    assert x.grad is None and w.grad is None
    assert isinstance(grads, tuple)


def test_grad_with_several_outputs_and_grad_outputs(device: str) -> None:
    (x,), (tx,) = _leaves(device, (2, 3))
    upstream, torch_upstream = pair(random_array((2, 3), seed=5), device)
    (gx,) = em.grad([x.exp(), x.sum()], x, [upstream, None])
    (tgx,) = torch.autograd.grad([tx.exp(), tx.sum()], tx, [torch_upstream, None])
    assert_close(gx, tgx)


def test_grad_unused_inputs(device: str) -> None:
    (x, y), _ = _leaves(device, (3,), (3,))
    out = (x * 2).sum()
    with pytest.raises(em.AutogradError, match=r"input 1 \(shape \(3,\)\) was not used.*allow_unused=True"):
        em.grad(out, [x, y], retain_graph=True)
    gx, gy = em.grad(out, [x, y], allow_unused=True, retain_graph=True)
    assert gy is None
    np.testing.assert_array_equal(gx.numpy(), [2.0, 2.0, 2.0])
    _, zeros = em.grad(out, [x, y], materialize_grads=True)
    np.testing.assert_array_equal(zeros.numpy(), [0.0, 0.0, 0.0])


def test_backward_frees_the_history_it_walked_as_torch_does(device: str) -> None:
    (x, w), (tx, tw) = _leaves(device, (4, 3), (3, 2))
    loss, torch_loss = (x @ w).tanh().sum(), (tx @ tw).tanh().sum()
    loss.backward()
    torch_loss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch_loss.backward()
    with pytest.raises(em.AutogradError, match=r"second time.*shape \(\).*retain_graph=True"):
        loss.backward()
    assert not loss.is_leaf and loss.grad_fn is not None and loss.requires_grad
    assert_close(x.grad, tx.grad)  # (the failed second call added nothing)
    with pytest.raises(em.AutogradError, match="second time"):
        em.grad(loss, [x])
    # retain_graph=True keeps it (the second backward adds to .grad), and so does create_graph=True
    for retain in ({"retain_graph": True}, {"create_graph": True}):
        x.grad = w.grad = tx.grad = tw.grad = None
        loss, torch_loss = (x @ w).tanh().sum(), (tx @ tw).tanh().sum()
        loss.backward(**retain)
        torch_loss.backward(**retain)
        loss.backward()
        torch_loss.backward()
        assert_close(x.grad.detach(), tx.grad.detach())
        assert_close(w.grad.detach(), tw.grad.detach())
    # autograd.grad frees too, unless retained; a step of leaves only (x * 2) holds nothing beyond them, so ember
    # keeps it and differentiates it again (torch 2.13 frees the scalar it saved: it needs retain_graph here)
    out, torch_out = (x.exp() * 3).sum(), (tx.exp() * 3).sum()
    gradient, torch_gradient = em.grad(out, x, retain_graph=True)[0], torch.autograd.grad(torch_out, tx,
                                                                                          retain_graph=True)[0]
    assert_close(gradient, torch_gradient)
    em.grad(out, x)
    with pytest.raises(em.AutogradError, match="second time"):
        em.grad(out, x)
    doubled, torch_doubled = x * 2, tx * 2
    x.grad = tx.grad = None
    for _ in range(2):
        doubled.sum().backward()
        torch_doubled.sum().backward(retain_graph=True)
    assert_close(x.grad, tx.grad)


def test_a_held_loss_keeps_no_intermediate_or_old_parameter_alive(device: str) -> None:
    layer = em.nn.Linear(3, 4).to(device)
    inputs = em.tensor(random_array((5, 3), seed=1), device=device)
    hidden = layer(inputs)
    hidden_alive = weakref.ref(hidden)
    loss = (hidden.relu() * hidden).sum()  # (the relu's and the product's steps read the intermediate)
    del hidden
    loss.backward()
    gc.collect()
    assert hidden_alive() is None, "backward freed the history: the held loss keeps no intermediate alive"
    # nothing but the parameter holds its node (getrefcount's argument is the other reference): an optimizer can
    # update it in place without a copy first
    holders = [sys.getrefcount(layer.weight.node), sys.getrefcount(layer.bias.node)]
    assert holders == [2, 2]
    loss.item()  # (the loss itself keeps its value)


# ---- higher order ----------------------------------------------------------------------------------------------------


def test_second_and_third_derivatives(device: str) -> None:
    (x,), (tx,) = _leaves(device, (5,))
    function = lambda t: (t.sin() * t * t).sum()
    first, torch_first = em.grad(function(x), x, create_graph=True)[0], torch.autograd.grad(
        function(tx), tx, create_graph=True)[0]
    assert first.requires_grad and not first.is_leaf
    second = em.grad(first.sum(), x, create_graph=True)[0]
    torch_second = torch.autograd.grad(torch_first.sum(), tx, create_graph=True)[0]
    third = em.grad(second.sum(), x)[0]
    torch_third = torch.autograd.grad(torch_second.sum(), tx)[0]
    assert_close([first, second, third], [torch_first, torch_second, torch_third], atol=1e-4)
    assert not third.requires_grad


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_backward_with_create_graph_then_gradient_penalty(device: str) -> None:
    (x, w), (tx, tw) = _leaves(device, (4, 3), (3, 3))
    (x @ w).tanh().sum().backward(create_graph=True)
    (tx @ tw).tanh().sum().backward(create_graph=True)
    assert x.grad.requires_grad
    penalty, torch_penalty = (x.grad * x.grad).sum(), (tx.grad * tx.grad).sum()
    (gw,) = em.grad(penalty, w)
    (tgw,) = torch.autograd.grad(torch_penalty, tw)
    assert_close(gw, tgw)


# ---- hooks, retain_grad, in-place ------------------------------------------------------------------------------------


def test_hooks_and_retain_grad(device: str) -> None:
    (x,), (tx,) = _leaves(device, (3,))
    seen = []
    y, ty = x * 2, tx * 2
    y.retain_grad()
    ty.retain_grad()
    handle = y.register_hook(lambda grad: seen.append(grad) or grad * 10)
    ty.register_hook(lambda grad: grad * 10)
    x.register_hook(lambda grad: grad + 1)
    tx.register_hook(lambda grad: grad + 1)
    (y * y).sum().backward()
    (ty * ty).sum().backward()
    assert len(seen) == 1 and y.retains_grad
    assert_close(x.grad, tx.grad)
    assert_close(y.grad, ty.grad)
    handle.remove()
    x.grad = None
    (y * y).sum().backward()
    assert len(seen) == 1


def test_in_place_ops_on_non_leaves(device: str) -> None:
    (x,), (tx,) = _leaves(device, (4,))
    y, ty = x * 2, tx * 2
    y += 1
    ty += 1
    y.mul_(x)
    ty.mul_(tx)
    z, tz = y.exp() * x, ty.exp() * tx
    z.sum().backward()
    tz.sum().backward()
    assert_close(x.grad, tx.grad)
    assert not y.is_leaf


def test_in_place_on_a_leaf_under_no_grad_keeps_it_a_leaf(device: str) -> None:
    x = em.tensor([1.0, 2.0], device=device, requires_grad=True)
    (x * x).sum().backward()
    with em.no_grad():
        x -= x.grad * 0.5
    assert x.is_leaf and x.requires_grad
    np.testing.assert_allclose(x.numpy(), [0.0, 0.0])


def test_in_place_into_a_tensor_without_grad(device: str) -> None:
    (x,), (tx,) = _leaves(device, (3,))
    buffer, torch_buffer = em.zeros(3, device=device), torch.zeros(3)
    buffer += x * 3
    torch_buffer += tx * 3
    assert buffer.requires_grad and not buffer.is_leaf
    (buffer * buffer).sum().backward()
    (torch_buffer * torch_buffer).sum().backward()
    assert_close(x.grad, tx.grad)


# ---- devices -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, target",
    [(source, target) for source in TEST_DEVICES for target in TEST_DEVICES if source != target] or [
        pytest.param(None, None, marks=pytest.mark.skip(reason="needs two test devices"))
    ],
)
def test_gradient_flows_back_across_devices(source: str, target: str) -> None:
    x, tx = pair(random_array((3, 2)), source, requires_grad=True)
    y = x.to(target).exp().sum()
    y.backward()
    tx.exp().sum().backward()
    assert x.grad.device == x.device
    assert_close(x.grad, tx.grad)


# ---- errors ----------------------------------------------------------------------------------------------------------


def test_errors_name_the_problem(device: str) -> None:
    x = em.tensor([[1.0, 2.0, 3.0]], device=device, requires_grad=True)
    constant = em.tensor([1.0, 2.0], device=device)
    with pytest.raises(em.AutogradError, match=r"shape \(2,\) does not require grad"):
        (constant * 2).backward(em.ones(2, device=device))
    with pytest.raises(em.AutogradError, match=r"only for a one-element output.*shape \(1, 3\)"):
        (x * 2).backward()
    with pytest.raises(em.ShapeError, match=r"gradient has shape \(3,\) but the tensor has shape \(1, 3\)"):
        (x * 2).backward(em.ones(3, device=device))
    with pytest.raises(em.AutogradError, match="must be floating point"):
        (x * 2).backward(em.ones((1, 3), dtype=em.int32, device=device))
    with pytest.raises(TypeError, match="must be a Tensor"):
        (x * 2).backward([[1.0, 1.0, 1.0]])
    with pytest.raises(em.DTypeError, match="only floating point tensors can require gradients.*int64"):
        em.tensor([1, 2], device=device, requires_grad=True)
    with pytest.raises(em.DTypeError, match="int32"):
        em.tensor([1, 2], dtype=em.int32, device=device).requires_grad_()
    with pytest.raises(em.AutogradError, match=r"input 0 \(shape \(2,\)\) does not require grad"):
        em.grad((x * 2).sum(), [constant])
    with pytest.raises(em.AutogradError, match="leaf tensor of shape .* in place"):
        x += 1
    with pytest.raises(em.AutogradError, match="does not require grad"):
        constant.register_hook(lambda grad: grad)
    with pytest.raises(ValueError, match="2 gradients for 1 tensors"):
        em.grad((x * 2).sum(), x, [em.ones((), device=device), em.ones((), device=device)])


def test_every_primitive_op_has_one_backward_rule() -> None:
    sources = {Op.BUFFER, Op.CONST, Op.ARANGE}
    assert set(BACKWARD) == set(Op) - sources - {Op.TEMPLATE}  # (a template's copy is never recorded)


def test_relu_gradient_at_special_values_is_torchs(device: str) -> None:
    # torch's threshold_backward: 0 where the output is <= 0 (-0.0, 0, -inf), the gradient elsewhere (NaN inputs
    # pass it); an infinite or NaN gradient at 0 gives 0, not inf * 0
    values = np.array([-2.0, -0.0, 0.0, 1.5, np.nan, np.inf, -np.inf, 3.0], dtype=np.float32)
    gradient = np.array([1.0, 2.0, np.inf, 4.0, 5.0, np.nan, 7.0, -np.inf], dtype=np.float32)
    x = em.tensor(values, device=device, requires_grad=True)
    y = x.relu()
    y.backward(em.tensor(gradient, device=device))
    expected_x = torch.tensor(values, requires_grad=True)
    expected_y = torch.relu(expected_x)
    expected_y.backward(torch.tensor(gradient))
    assert_close(y, expected_y.detach())
    assert np.array_equal(np.signbit(y.numpy()), np.signbit(expected_y.detach().numpy()))  # -0.0 stays -0.0
    assert_close(x.grad, expected_x.grad)


@pytest.mark.parametrize("bounds", ["numbers", "tensors"])
def test_clamp_gradient_at_nan_and_at_its_bounds_is_torchs(device: str, bounds: str) -> None:
    """torch's clamp_backward: the input gets the gradient where min <= x <= max (both included), a tensor bound
    where it is the result, and nothing where a NaN (in the input or a bound) makes the comparisons false (ember
    passed a NaN input its gradient). Number bounds go through clamp's traced step, twice (the template copy)."""
    generator = np.random.default_rng(17)
    values = generator.standard_normal((4, 6)).astype(np.float32)
    values[0, 0], values[1, 2], values[2, 3], values[3, 4] = np.nan, 1.0, -1.0, np.inf
    low = (generator.standard_normal((4, 6)) - 1).astype(np.float32)
    low[1, 1], low[2, 2] = np.nan, values[2, 2]
    high = (generator.standard_normal(6) + 1).astype(np.float32)
    high[5] = np.nan
    weights = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    for _ in range(2):
        arrays = (values,) if bounds == "numbers" else (values, low, high)
        mine = [em.tensor(array, device=device, requires_grad=True) for array in arrays]
        theirs = [torch.tensor(array, requires_grad=True) for array in arrays]
        if bounds == "numbers":
            result, expected = mine[0].clamp(-1, 1.0), theirs[0].clamp(-1, 1.0)
        else:
            result, expected = mine[0].clamp(mine[1], mine[2]), theirs[0].clamp(theirs[1], theirs[2])
        (result * em.tensor(weights, device=device)).sum().backward()
        (expected * torch.tensor(weights)).sum().backward()
        np.testing.assert_array_equal(result.numpy(), expected.detach().numpy())
        for value, reference in zip(mine, theirs):
            np.testing.assert_array_equal(value.grad.numpy(), reference.grad.numpy())


def test_each_grad_is_a_tensor_of_its_own(device: str) -> None:
    """An add hands one gradient to both operands, and a leaf's seed is the caller's tensor: each `.grad` must still
    be changed in place alone, as in torch (clip_grad_norm_ scales every .grad in place: a shared one was scaled
    twice)."""
    def run(lib: Any, nn_utils: Any, on: dict[str, Any]) -> list[Any]:
        a = lib.ones(3, requires_grad=True, **on)
        b = lib.ones(3, requires_grad=True, **on)
        ((a + b) * lib.tensor([1.0, 2.0, 3.0], **on)).sum().backward()
        a.grad.mul_(10)
        c = lib.ones(2, requires_grad=True, **on)
        d = lib.ones(2, requires_grad=True, **on)
        (c + d).pow(2).sum().backward()
        nn_utils.clip_grad_norm_([c, d], 1.0)
        x = lib.ones(3, requires_grad=True, **on)
        seed = lib.tensor([1.0, 2.0, 3.0], **on)
        x.backward(seed)
        seed.mul_(5)
        return [a.grad, b.grad, c.grad, d.grad, x.grad]

    import ember.nn.utils as ember_nn_utils

    ours = run(em, ember_nn_utils, {"device": device})
    theirs = run(torch, torch.nn.utils, {})
    for actual, expected in zip(ours, theirs):
        assert_close(actual, expected)
