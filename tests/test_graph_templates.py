"""Graph templates (core/graph_templates.py): random draws recorded once per signature and copied afterwards give
the numbers of ember's documented generator (a numpy reference of its hash), and a repeated draw neither records
again nor schedules a new graph."""

from __future__ import annotations

import numpy as np
import pytest

import ember as em
from ember.core.creation import random_key
from ember.core.graph_templates import TEMPLATES
from ember.scheduler.schedule import SCHEDULES
from tests.reference_random import uniform_float32


def _reference_uniform(seed: int, counter: int, count: int) -> np.ndarray:
    """The float32 uniform numbers `count` draws from position `counter` of `seed` give (tests/reference_random.py:
    24 bits of the double hash of (counter + position) keyed by the seed, times 2**-24)."""
    return uniform_float32(random_key(seed, counter), count)


def test_repeated_draws_match_the_reference_and_record_once() -> None:
    em.manual_seed(11)
    recorded = TEMPLATES.recorded
    counter = 0
    for _ in range(4):
        values = em.rand(3, 5).numpy()
        np.testing.assert_array_equal(values, _reference_uniform(11, counter, 15).reshape(3, 5))
        counter += 15
    assert TEMPLATES.recorded <= recorded + 1  # the first draw of this shape at most; the others copy it


def test_a_template_is_per_shape() -> None:
    em.manual_seed(5)
    first = em.rand(4).numpy()
    second = em.rand(2, 3).numpy()
    np.testing.assert_array_equal(first, _reference_uniform(5, 0, 4))
    np.testing.assert_array_equal(second, _reference_uniform(5, 4, 6).reshape(2, 3))


def test_repeated_normal_draws_schedule_one_graph_structure() -> None:
    em.manual_seed(2)
    em.randn(7, 3).numpy()
    misses = SCHEDULES.misses
    samples = [em.randn(7, 3).numpy() for _ in range(3)]
    assert SCHEDULES.misses == misses  # the copied graphs have the recorded graph's structure: schedule hits
    assert not np.array_equal(samples[0], samples[1])  # (new numbers each draw)
    assert all(np.isfinite(sample).all() for sample in samples)


def test_dropout_under_a_template_keeps_torch_scaling() -> None:
    em.manual_seed(3)
    values = em.ones(64, 32)
    for _ in range(3):
        dropped = em.nn.functional.dropout(values, 0.25).numpy()
        kept = dropped != 0
        np.testing.assert_allclose(dropped[kept], 1 / 0.75, rtol=1e-6)  # torch's inverted-dropout scale
        assert 0.6 < kept.mean() < 0.9


def test_recorded_compositions_are_copied_and_match_torch() -> None:
    """exp, sigmoid, relu, tanh, gelu and (log_)softmax along each axis: the second and third calls copy the first's
    graph; values and gradients as torch's, per axis and dtype (a template per signature)."""
    import torch

    data = np.random.default_rng(0).standard_normal((5, 7))
    for dtype, torch_dtype, tolerance in ((em.float32, torch.float32, 1e-5), (em.float64, torch.float64, 1e-6)):
        for _ in range(3):
            instantiated = TEMPLATES.instantiated
            x = em.tensor(data, dtype=dtype, requires_grad=True)
            t = torch.tensor(data, dtype=torch_dtype, requires_grad=True)
            outputs = [f(x) for f in (em.exp, em.sigmoid, em.relu, em.tanh, em.nn.functional.gelu,
                                      lambda v: v.softmax(0), lambda v: v.softmax(1), lambda v: v.log_softmax(1))]
            expected = [f(t) for f in (torch.exp, torch.sigmoid, torch.relu, torch.tanh, torch.nn.functional.gelu,
                                       lambda v: v.softmax(0), lambda v: v.softmax(1), lambda v: v.log_softmax(1))]
            assert TEMPLATES.instantiated - instantiated == len(outputs)
            weights = np.arange(35, dtype=np.float64).reshape(5, 7) / 35
            sum(((output * em.tensor(weights, dtype=dtype)).sum() for output in outputs), em.tensor(0.0, dtype=dtype)) \
                .backward()
            sum(((output * torch.tensor(weights, dtype=torch_dtype)).sum() for output in expected)).backward()
            for output, reference in zip(outputs, expected):
                np.testing.assert_allclose(output.numpy(), reference.detach().numpy(), rtol=tolerance, atol=tolerance)
            assert x.grad is not None and t.grad is not None
            np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=tolerance * 10, atol=tolerance * 10)


def test_signatures_name_the_code_and_plain_values_only() -> None:
    import functools

    from ember.core.graph_templates import function_signature

    def scaled(x: em.Tensor, factor: float = 2.0) -> em.Tensor:
        return x * factor

    assert function_signature(functools.partial(scaled, factor=2.0)) == function_signature(
        functools.partial(scaled, factor=2.0))
    assert function_signature(functools.partial(scaled, factor=2.0)) != function_signature(
        functools.partial(scaled, factor=3.0))
    held = em.ones(3)
    assert function_signature(lambda x: x + held) is None  # a closure over a tensor: no template
    bag: list[int] = []
    assert function_signature(lambda x: x * len(bag)) is None  # over a mutable object: no template


def test_repeated_convolutions_and_pools_are_copied_and_match_torch() -> None:
    """conv2d (stride 1 and 2, groups, dilation) and max_pool2d steps: after the first call of each geometry the
    recorded graph is copied; values and gradients as torch's."""
    import torch

    rng = np.random.default_rng(1)
    cases = [dict(stride=1, padding=1, dilation=1, groups=1), dict(stride=2, padding=0, dilation=1, groups=2),
             dict(stride=1, padding=2, dilation=2, groups=1)]
    for case in cases:
        images = rng.standard_normal((2, 4, 9, 9)).astype(np.float32)
        filters = rng.standard_normal((6, 4 // case["groups"], 3, 3)).astype(np.float32)
        for call in range(3):
            instantiated = TEMPLATES.instantiated
            x, w = em.tensor(images, requires_grad=True), em.tensor(filters, requires_grad=True)
            tx, tw = torch.tensor(images, requires_grad=True), torch.tensor(filters, requires_grad=True)
            output = em.nn.functional.max_pool2d(em.nn.functional.conv2d(x, w, **case), 2)
            expected = torch.nn.functional.max_pool2d(torch.nn.functional.conv2d(tx, tw, **case), 2)
            if call > 0:
                assert TEMPLATES.instantiated - instantiated >= 2  # the convolution and the pool
            (output * output).sum().backward()
            (expected * expected).sum().backward()
            np.testing.assert_allclose(output.numpy(), expected.detach().numpy(), rtol=1e-4, atol=1e-4)
            assert x.grad is not None and w.grad is not None and tx.grad is not None and tw.grad is not None
            np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-3)
            np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def _conv_net_step(device: str, images: np.ndarray, labels: np.ndarray, filters: np.ndarray,
                   input_grad: bool) -> tuple[em.Tensor, em.Tensor | None, em.Tensor]:
    """conv2d (stride 2, padding 1), max_pool2d, cross entropy against labels that live on the device (so that the
    loss carries a lazy check of their range into every gradient); returns the loss and the gradients."""
    x = em.tensor(images, device=device, requires_grad=input_grad)
    w = em.tensor(filters, device=device, requires_grad=True)
    targets = em.tensor(labels, device=device)
    targets.realize()  # (on the device: its range is checked lazily, not read on the host)
    features = em.nn.functional.max_pool2d(em.nn.functional.conv2d(x, w, stride=2, padding=1), 2)
    loss = em.nn.functional.cross_entropy(features.reshape(features.shape[0], -1), targets)
    loss.backward()
    assert w.grad is not None
    return loss, x.grad, w.grad


def test_backward_rules_of_convolutions_and_pools_are_copied_and_match_torch(device: str) -> None:
    """The gradients of a convolution and a pool are copied from a template from the second step on, also where the
    gradient carries the loss's lazy label check; an input that needs no gradient gets none built. Values as
    torch's at every step."""
    import torch

    from ember.autograd import engine

    rng = np.random.default_rng(3)
    filters = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    built: list[int] = []
    original = engine._wanted_gradients

    def counting(*arguments):  # each build is a rule run op by op: at the first step only
        build = original(*arguments)
        return lambda *inputs: (built.append(1), build(*inputs))[1]

    engine._wanted_gradients = counting  # type: ignore[assignment]
    try:
        for step in range(3):
            images = rng.standard_normal((4, 3, 12, 12)).astype(np.float32)
            labels = rng.integers(0, 45, 4)
            for input_grad in (True, False):
                before = len(built)
                loss, x_grad, w_grad = _conv_net_step(device, images, labels, filters, input_grad)
                tx = torch.tensor(images, requires_grad=input_grad)
                tw = torch.tensor(filters, requires_grad=True)
                features = torch.nn.functional.max_pool2d(torch.nn.functional.conv2d(tx, tw, stride=2, padding=1), 2)
                expected = torch.nn.functional.cross_entropy(features.reshape(4, -1), torch.tensor(labels))
                expected.backward()
                np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-5)
                np.testing.assert_allclose(w_grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-5)
                if input_grad:
                    assert x_grad is not None and tx.grad is not None
                    np.testing.assert_allclose(x_grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
                else:
                    assert x_grad is None
                if step > 0:
                    assert len(built) == before, "a rule ran op by op again instead of being copied"
    finally:
        engine._wanted_gradients = original  # type: ignore[assignment]


def test_a_copied_gradient_keeps_the_lazy_check_it_was_computed_from(device: str) -> None:
    """A label out of range, checked lazily on the device, still raises from gradients copied from a template."""
    from ember.core.checks import IndexOutOfRangeError

    rng = np.random.default_rng(4)
    images = rng.standard_normal((4, 3, 12, 12)).astype(np.float32)
    filters = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    _conv_net_step(device, images, np.array([1, 2, 3, 4]), filters, True)  # (records the templates)
    with pytest.raises(IndexOutOfRangeError):
        _conv_net_step(device, images, np.array([1, 2, 45, 4]), filters, True)


def test_batch_norm_statistics_and_gradients_are_copied_and_match_torch(device: str) -> None:
    """A BatchNorm2d layer in training: its statistics (forward) and its gradients (backward) are copied from
    templates from the second step on; outputs, running statistics and gradients as torch's at every step."""
    import torch

    from ember.autograd import engine
    from ember.core import functional

    built: list[str] = []
    original_rule, original_statistics = engine._wanted_gradients, functional.batch_statistics

    def counting_rule(*arguments):
        build = original_rule(*arguments)
        return lambda *inputs: (built.append("rule"), build(*inputs))[1]

    def counting_statistics(*arguments):
        built.append("statistics")
        return original_statistics(*arguments)

    engine._wanted_gradients = counting_rule  # type: ignore[assignment]
    functional.batch_statistics = counting_statistics  # type: ignore[assignment]
    try:
        rng = np.random.default_rng(9)
        layer, reference = em.nn.BatchNorm2d(6).to(device), torch.nn.BatchNorm2d(6)
        for step in range(3):
            before = len(built)
            images = (rng.standard_normal((5, 6, 7, 7)) * 3 + 1).astype(np.float32)
            x, tx = em.tensor(images, device=device, requires_grad=True), torch.tensor(images, requires_grad=True)
            output, expected = layer(x), reference(tx)
            (output * output).sum().backward()
            (expected * expected).sum().backward()
            np.testing.assert_allclose(output.numpy(), expected.detach().numpy(), rtol=1e-4, atol=1e-4)
            assert x.grad is not None and tx.grad is not None
            np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-3, atol=1e-3)
            for mine, theirs in ((layer.weight.grad, reference.weight.grad), (layer.bias.grad, reference.bias.grad),
                                 (layer.running_mean, reference.running_mean),
                                 (layer.running_var, reference.running_var)):
                np.testing.assert_allclose(mine.numpy(), theirs.detach().numpy(), rtol=1e-4, atol=1e-3)
            layer.zero_grad()
            reference.zero_grad()
            if step > 0:
                assert len(built) == before, built[before:]
    finally:
        engine._wanted_gradients = original_rule  # type: ignore[assignment]
        functional.batch_statistics = original_statistics  # type: ignore[assignment]


def test_a_build_sees_a_lazy_input_as_lazy() -> None:
    """A build's `contiguous()` of its input stores a lazy input (one kernel of its own) and leaves a realized one as
    it is, copied from the template as when the build runs itself: the stand-in a template records on is a value
    still to compute where the input is one (a stand-in that looked realized dropped an LSTM rule's store of its
    incoming gradient, so every time step recomputed the decoder's matmul: 64 more matmul kernels to compile)."""
    data = np.arange(12, dtype=np.float32).reshape(3, 4)

    def build(value: em.Tensor) -> em.Tensor:
        stored = value.contiguous()
        return stored[:2] * 3.0 + stored[1:]

    for attempt in range(2):  # recorded, then copied
        realized = em.tensor(data, device="c").realize()
        lazy = realized * 2.0
        with em.profile() as record:
            first = TEMPLATES.instantiate(("a lazy input", 1), build, (lazy,))
            em.realize(first)
        assert len(record.kernels) == 2, [kernel.name for kernel in record.kernels]  # the store, then the result
        np.testing.assert_allclose(first.numpy(), data[:2] * 6.0 + data[1:] * 2.0)
        with em.profile() as record:
            second = TEMPLATES.instantiate(("a lazy input", 1), build, (realized,))
            em.realize(second)
        assert len(record.kernels) == 1, [kernel.name for kernel in record.kernels]
        np.testing.assert_allclose(second.numpy(), data[:2] * 3.0 + data[1:])


def test_equal_constants_of_a_template_are_one_node_in_its_copies() -> None:
    """A build that makes the same constant several times (a hash's multipliers, Box-Muller's fixed point) copies
    as one constant node per value; the values stay the reference's."""
    from ember.core.graph_templates import expand_in_place
    from ember.core.walk import post_order

    em.manual_seed(4)
    em.rand(6, 4)  # (records the template)
    drawn = em.rand(6, 4)
    copy = drawn.node.srcs[0]  # (under the CONTIGUOUS that stores a user's draw: creation.kept)
    assert copy.op.name == "TEMPLATE"  # (the copy is one node until the scheduler expands it)
    expand_in_place([copy])
    constants = [node for node in post_order([copy], lambda node: node.srcs) if node.op.name == "CONST"]
    described = [(type(node.arg), node.arg, node.shape, node.dtype) for node in constants]
    assert len(described) == len(set(described)) > 0
    np.testing.assert_array_equal(drawn.numpy(), _reference_uniform(4, 24, 24).reshape(6, 4))


TRACED_CASES = {
    "matmul": (lambda lib, a, b, c: a @ b, ((4, 5), (5, 3), (3,))),
    "batched matmul": (lambda lib, a, b, c: (a @ b).sum(0), ((2, 4, 5), (5, 3), (3,))),
    "vector matmul": (lambda lib, a, b, c: a @ b, ((5,), (5, 3), (3,))),
    "linear": (lambda lib, a, b, c: lib.nn.functional.linear(a, b, c), ((4, 5), (3, 5), (3,))),
    "mse": (lambda lib, a, b, c: lib.nn.functional.mse_loss(a @ b, c.expand(4, 3)), ((4, 5), (5, 3), (3,))),
    "bce": (lambda lib, a, b, c: lib.nn.functional.binary_cross_entropy((a @ b).sigmoid(), c.sigmoid().expand(4, 3),
                                                                      reduction="sum"), ((4, 5), (5, 3), (3,))),
    "l1": (lambda lib, a, b, c: lib.nn.functional.l1_loss(a @ b, c.expand(4, 3), reduction="none"),
           ((4, 5), (5, 3), (3,))),
    "layer_norm": (lambda lib, a, b, c: lib.nn.functional.layer_norm(a @ b, (3,), c, c * 2), ((4, 5), (5, 3), (3,))),
    "layer_norm without affine": (lambda lib, a, b, c: lib.nn.functional.layer_norm(a @ b + c, (4, 3)),
                                  ((2, 4, 5), (5, 3), (3,))),
    "rms_norm": (lambda lib, a, b, c: lib.nn.functional.rms_norm(a @ b, (3,), c, eps=1e-6), ((4, 5), (5, 3), (3,))),
    "smooth_l1": (lambda lib, a, b, c: lib.nn.functional.smooth_l1_loss(a @ b, c.expand(4, 3), beta=0.5),
                  ((4, 5), (5, 3), (3,))),
    "huber": (lambda lib, a, b, c: lib.nn.functional.huber_loss(a @ b, c.expand(4, 3), reduction="sum", delta=0.7),
              ((4, 5), (5, 3), (3,))),
    "kl_div": (lambda lib, a, b, c: lib.nn.functional.kl_div((a @ b).log_softmax(-1), c.softmax(-1).expand(4, 3),
                                                             reduction="batchmean"), ((4, 5), (5, 3), (3,))),
    "bce_with_logits": (lambda lib, a, b, c: lib.nn.functional.binary_cross_entropy_with_logits(
        a @ b, c.sigmoid().expand(4, 3), weight=c.detach().abs(), pos_weight=c.detach().exp()), ((4, 5), (5, 3), (3,))),
    "nll_loss": (lambda lib, a, b, c: lib.nn.functional.nll_loss(
        (a @ b).log_softmax(-1), lib.tensor([0, 2, -100, 1], device=a.device), weight=c.detach().exp()),
        ((4, 5), (5, 3), (3,))),
    "cross_entropy smoothed": (lambda lib, a, b, c: lib.nn.functional.cross_entropy(
        a @ b, lib.tensor([0, 2, 2, 1], device=a.device), weight=c.detach().exp(), label_smoothing=0.2),
        ((4, 5), (5, 3), (3,))),
}
ONE_STEP = ("matmul", "linear", "vector matmul", "layer_norm", "rms_norm", "smooth_l1", "huber", "kl_div",
            "bce_with_logits", "nll_loss", "cross_entropy smoothed")


@pytest.mark.parametrize("case", list(TRACED_CASES))
def test_traced_functions_are_one_step_copied_and_match_torch_with_gradients(case: str, device: str) -> None:
    """Traced compositions (matmul, linear, the losses): recorded as one autograd step, copied from their templates at
    the second call, values and gradients as torch's (class weights, ignored targets, label smoothing included)."""
    import torch

    from ember.core.ops import Composite

    function, shapes = TRACED_CASES[case]
    generator = np.random.default_rng(1)
    arrays = [generator.standard_normal(shape).astype(np.float32) for shape in shapes]
    for attempt in range(2):
        instantiated = TEMPLATES.instantiated
        inputs = [em.tensor(array, device=device, requires_grad=True) for array in arrays]
        expected_inputs = [torch.tensor(array, requires_grad=True) for array in arrays]
        output = function(em, *inputs)
        expected = function(torch, *expected_inputs)
        if case in ONE_STEP:
            assert output._context[0] is Composite.TRACED
        if attempt:
            assert TEMPLATES.instantiated > instantiated
        np.testing.assert_allclose(output.numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-5)
        weights = np.linspace(-1, 1, int(np.prod(expected.shape))).reshape(expected.shape).astype(np.float32)
        (output * em.tensor(weights, device=device)).sum().backward()
        (expected * torch.tensor(weights)).sum().backward()
        for value, reference in zip(inputs, expected_inputs):
            if reference.grad is None:
                continue
            np.testing.assert_allclose(value.grad.numpy(), reference.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_a_traced_matmul_of_one_tensor_twice_and_its_second_derivative_match_torch(device: str) -> None:
    """x @ x gives x each use's gradient once; create_graph keeps the traced gradients' history (double backward)."""
    import torch

    data = np.random.default_rng(2).standard_normal((4, 4)).astype(np.float32)
    x = em.tensor(data, device=device, requires_grad=True)
    t = torch.tensor(data, requires_grad=True)
    (first,) = em.autograd.grad((x @ x).square().sum(), [x], create_graph=True)
    (expected,) = torch.autograd.grad((t @ t).square().sum(), [t], create_graph=True)
    np.testing.assert_allclose(first.numpy(), expected.detach().numpy(), rtol=1e-4, atol=1e-4)
    (second,) = em.autograd.grad(first.sum(), [x])
    (expected_second,) = torch.autograd.grad(expected.sum(), [t])
    np.testing.assert_allclose(second.numpy(), expected_second.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("create_graph", [False, True])
def test_a_hook_on_a_traced_functions_source_runs_once_with_its_whole_gradient(create_graph: bool) -> None:
    """A traced step's rule runs its function again apart from the sources: a source's hook sees its one, whole
    gradient (both uses of x in x @ x summed) with and without create_graph, as torch's."""
    import torch

    data = np.random.default_rng(3).standard_normal((3, 3)).astype(np.float32)
    seen: list[np.ndarray] = []
    expected_seen: list[np.ndarray] = []
    x = em.tensor(data, requires_grad=True)
    t = torch.tensor(data, requires_grad=True)
    x.register_hook(lambda gradient: seen.append(gradient.numpy()))
    t.register_hook(lambda gradient: expected_seen.append(gradient.detach().numpy()))
    (gradient,) = em.autograd.grad((x @ x).sum(), [x], create_graph=create_graph)
    (expected,) = torch.autograd.grad((t @ t).sum(), [t], create_graph=create_graph)
    assert len(seen) == len(expected_seen) == 1
    np.testing.assert_allclose(seen[0], expected_seen[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gradient.numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-5)
