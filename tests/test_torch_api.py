"""PyTorch's API surface in ember: numpy's axis=/keepdims= names, torch.NAME function forms of Tensor methods, the
names a PyTorch user reaches for in the first hour, `python -m ember parity`, and small Tensor utilities
(new_*, type_as, stride, copy_, ...), each compared with torch."""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import types
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
import ember.nn.functional as EF
from ember.core.aliases import ALIASES
from ember.function_forms import NOT_FUNCTION_FORMS
from ember.parity import FIRST_HOUR, missing_first_hour
from ember.torch_names import TORCH_FUNCTIONS, TORCH_VERSION
from tests.helpers import BatchedChecks, assert_close, pair, random_array

# ---- axis= and keepdims= ---------------------------------------------------------------------------------------

# (method, extra positional arguments before dim, whether it takes keepdim)
DIM_METHODS = [
    ("sum", (), True), ("mean", (), True), ("prod", (), True), ("any", (), True), ("all", (), True),
    ("std", (), True), ("var", (), True), ("amax", (), True), ("amin", (), True), ("argmax", (), True),
    ("argmin", (), True), ("logsumexp", (), True), ("norm", (2,), True), ("cumsum", (), False),
    ("cumprod", (), False), ("softmax", (), False), ("log_softmax", (), False), ("count_nonzero", (), False),
    ("squeeze", (), False), ("unsqueeze", (), False), ("unbind", (), False), ("chunk", (2,), False),
]


def test_axis_and_keepdims_are_numpy_names_for_dim_and_keepdim(device: str) -> None:
    data = random_array((3, 4), low=0.1, high=2.0)
    x, tx = pair(data, device)
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    for name, leading, has_keepdim in DIM_METHODS:
        keywords = {"axis": 1, "keepdims": True} if has_keepdim else {"axis": 1}
        torch_keywords = {"dim": 1, "keepdim": True} if has_keepdim else {"dim": 1}
        check(getattr(x, name)(*leading, **keywords), getattr(tx, name)(*leading, **torch_keywords), name)
        check(getattr(em, name)(x, *leading, **keywords), getattr(tx, name)(*leading, **torch_keywords),
              f"ember.{name}")
    check(x.max(axis=1, keepdims=True), tuple(tx.max(dim=1, keepdim=True)), "max")
    check(x.min(axis=0), tuple(tx.min(dim=0)), "min")
    check(list(x.var_mean(axis=1, keepdims=True)), list(torch.var_mean(tx, dim=1, keepdim=True)), "var_mean")
    check(list(x.std_mean(axis=0)), list(torch.std_mean(tx, dim=0)), "std_mean")
    check(list(x.aminmax(axis=1, keepdims=True)), list(tx.aminmax(dim=1, keepdim=True)), "aminmax")
    check(em.cat([x, x], axis=1), torch.cat([tx, tx], axis=1), "cat")
    check(em.stack([x, x], axis=2), torch.stack([tx, tx], axis=2), "stack")
    check(list(x.split(2, axis=1)), list(tx.split(2, dim=1)), "split")
    check(x.gather(axis=1, index=em.zeros(3, 1, dtype=em.int64, device=device)),
          tx.gather(dim=1, index=torch.zeros(3, 1, dtype=torch.int64)), "gather")
    assert x.size(axis=1) == tx.size(axis=1) == 4
    check.verify()


def test_giving_a_name_and_its_alias_is_a_type_error_like_torch(device: str) -> None:
    x, tx = pair(random_array((2, 3)), device)
    for call in (lambda m, t: t.sum(dim=0, axis=1), lambda m, t: t.sum(0, axis=1),
                 lambda m, t: t.sum(0, keepdim=True, keepdims=True), lambda m, t: m.cat([t, t], 0, axis=0)):
        with pytest.raises(TypeError):
            call(torch, tx)
        with pytest.raises(TypeError, match="numpy's name for"):
            call(em, x)


def test_every_method_with_a_dim_parameter_accepts_the_aliases() -> None:
    """The one mechanism covers every public method with dim/keepdim, added by any mixin, on every tensor class."""
    from ember.sharding.tensor import ShardedTensor
    from ember.testing.reference import ReferenceTensor

    for tensor_class in (em.Tensor, ReferenceTensor, ShardedTensor, em.nn.Parameter):
        covered = 0
        for name in dir(tensor_class):
            method = inspect.getattr_static(tensor_class, name)
            if name.startswith("_") or not inspect.isfunction(method):
                continue
            parameters = inspect.signature(method).parameters
            if any(real in parameters and alias not in parameters for alias, real in ALIASES.items()):
                assert getattr(method, "_numpy_argument_names", False), f"{tensor_class.__name__}.{name}"
                covered += 1
        assert covered >= 30, tensor_class


# ---- ember.NAME function forms ------------------------------------------------------------------------------------


def test_function_forms_match_torch(device: str) -> None:
    data = random_array((3, 4), low=0.2, high=2.0)
    x, tx = pair(data, device)
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    for name in ("exp", "sqrt", "abs", "relu", "sigmoid", "tanh", "log", "sum", "mean", "amax", "cumsum",
                 "square", "rsqrt", "exp2", "log10", "trunc", "fix", "frac", "sgn", "ravel", "neg", "sign"):
        arguments = (1,) if name == "cumsum" else ()
        check(getattr(em, name)(x, *arguments), getattr(torch, name)(tx, *arguments), name)
    check(em.clamp(x, min=0.5, max=1.5), torch.clamp(tx, min=0.5, max=1.5), "clamp")
    check(em.max(x, 1)[0], torch.max(tx, 1)[0], "max")
    check(em.maximum(x, x * 0.5), torch.maximum(tx, tx * 0.5), "maximum")
    check(em.gather(x, 1, em.zeros(3, 1, dtype=em.int64, device=device)),
          torch.gather(tx, 1, torch.zeros(3, 1, dtype=torch.int64)), "gather")
    check(em.sum(input=x, dim=0), torch.sum(input=tx, dim=0), "input=")
    for name in ("add", "sub", "mul", "div", "pow", "remainder", "floor_divide", "true_divide"):
        check(getattr(em, name)(2, x), getattr(torch, name)(2, tx), f"{name}(number, tensor)")
    check(em.sub(2, x, alpha=3), torch.sub(2, tx, alpha=3), "sub alpha")
    check(em.var_mean(x, 1)[0], torch.var_mean(tx, 1)[0], "var_mean")
    check.verify()
    assert em.is_floating_point(x) is torch.is_floating_point(tx) is True
    assert em.numel(x) == torch.numel(tx) == 12
    for bad in (2.0, [1.0, 2.0]):
        with pytest.raises(TypeError, match=r"exp\(\): argument 'input' \(position 1\) must be Tensor"):
            em.exp(bad)
        with pytest.raises(TypeError):
            torch.exp(bad)


def test_the_rule_makes_every_matching_method_a_function() -> None:
    """ember.NAME exists for each Tensor method named like a torch function, except the documented exclusions;
    torch's own aliases of ember's functions (ember.where, ember.cat, ...) are ember's, not method forms."""
    for name in TORCH_FUNCTIONS:
        method = inspect.getattr_static(em.Tensor, name, None)
        if inspect.isfunction(method) and name not in NOT_FUNCTION_FORMS:
            assert hasattr(em, name), name
    for name in NOT_FUNCTION_FORMS:
        assert name in TORCH_FUNCTIONS and (not hasattr(em, name) or not callable(getattr(em, name)) or
                                            getattr(em, name).__module__ != "ember"), name
    assert em.where.__module__ == "ember.core.elementwise" and em.cat.__module__ == "ember.core.movement"
    assert em.exp.__name__ == "exp" and "exp" in em.exp.__doc__


# ---- the names a PyTorch user reaches for in the first hour ---------------------------------------------------

# Written out here on purpose (ember.parity.FIRST_HOUR must say the same): everything issue 11 names plus the
# everyday API. Each must exist everywhere torch has it: torch.NAME, torch.Tensor.NAME, torch.nn.functional.NAME.
FIRST_HOUR_NAMES = """
tensor as_tensor from_numpy zeros ones full empty zeros_like ones_like full_like empty_like rand randn randint
randperm rand_like randn_like arange linspace eye manual_seed no_grad enable_grad save load
shape ndim dim size numel item tolist numpy to cpu cuda float double long int bool half type_as is_floating_point
detach clone contiguous requires_grad requires_grad_ grad backward is_leaf zero_ fill_ copy_ new_zeros new_ones
new_full new_tensor new_empty stride is_contiguous nelement element_size
reshape view view_as flatten unflatten squeeze unsqueeze permute transpose t T mT expand expand_as repeat
repeat_interleave cat concat stack split chunk unbind narrow select flip roll movedim gather scatter scatter_add
index_select masked_fill masked_select where nonzero tril triu ravel take_along_dim
add sub mul div pow sqrt rsqrt exp exp2 log log2 log10 log1p expm1 abs neg sign sin cos tan tanh sigmoid relu
clamp clip clamp_min clamp_max floor ceil round trunc frac remainder fmod maximum minimum lerp square reciprocal
erf isnan isinf isfinite nan_to_num eq ne lt le gt ge logical_and logical_or logical_not
acos asin atan acosh asinh atanh sinh cosh atan2 copysign logaddexp logaddexp2 hypot isclose allclose
sum mean prod max min amax amin argmax argmin std var std_mean var_mean norm logsumexp cumsum cumprod any all
count_nonzero aminmax
matmul mm bmm mv dot outer einsum diag diagonal diag_embed trace kron tensordot cross cdist
topk sort argsort kthvalue median mode msort unique searchsorted bucketize histc
softmax log_softmax dropout linear conv1d conv2d conv_transpose1d conv_transpose2d conv_transpose3d fold unfold
max_pool2d avg_pool2d pad layer_norm one_hot cross_entropy nll_loss mse_loss l1_loss binary_cross_entropy gelu
silu scaled_dot_product_attention normalize
bernoulli multinomial normal uniform_ normal_
is_tensor get_default_dtype set_default_dtype finfo iinfo set_printoptions inference_mode seed data hstack vstack
atleast_2d addcmul addmm baddbmm relu_ exp_ sigmoid_ clamp_ interpolate cosine_similarity pairwise_distance
""".split()




def test_first_hour_names_exist_wherever_torch_has_them() -> None:
    assert FIRST_HOUR_NAMES == list(FIRST_HOUR), "ember/parity.py's FIRST_HOUR and this list must agree"
    places = ((torch, em, "torch."), (torch.Tensor, em.Tensor, "Tensor."),
              (torch.nn.functional, EF, "nn.functional."))

    def torch_has(place: Any, name: str) -> bool:
        """A Tensor attribute, or a function of torch / torch.nn.functional (torch.cuda, a module, is not one)."""
        value = getattr(place, name, None)
        if place is torch.Tensor:
            return hasattr(place, name)
        return callable(value) and not isinstance(value, types.ModuleType)

    missing = []
    for name in FIRST_HOUR_NAMES:
        found_in_torch = False
        for torch_place, ember_place, label in places:
            if torch_has(torch_place, name):
                found_in_torch = True
                if not hasattr(ember_place, name):
                    missing.append(label + name)
        assert found_in_torch, f"{name} is not a torch name"
    assert missing == missing_first_hour(), "the parity report computes the same gap from the committed names"
    assert not missing, f"missing first-hour names: {', '.join(missing)}"


def test_committed_torch_names_match_the_installed_torch() -> None:
    """ember/torch_names.py is what tools/generate_torch_names.py writes for the torch installed here."""
    if torch.__version__.split("+")[0] != TORCH_VERSION:
        pytest.skip(f"the names were generated from torch {TORCH_VERSION}, torch {torch.__version__} is installed")
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("generate_torch_names", root / "tools" / "generate_torch_names.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert (root / "ember" / "torch_names.py").read_text() == generator.render()


def test_parity_command_prints_counts_and_missing_names() -> None:
    from ember.__main__ import main

    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        assert main(["parity"]) == 0
    text = output.getvalue()
    assert f"PyTorch {TORCH_VERSION}" in text and "first-hour names:" in text
    assert "torch functions:" in text and "torch.Tensor methods and attributes:" in text
    assert "missing in-place variants" in text
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        assert main(["parity", "--json"]) == 0
    found = json.loads(output.getvalue())
    tensor = found["torch.Tensor methods and attributes"]
    missing = [name for group in tensor["missing"].values() for name in group]
    assert tensor["count"] - tensor["present"] == len(missing)
    assert "sum" not in missing and all(not hasattr(em.Tensor, name) for name in missing)
    assert found["first_hour"]["missing"] == missing_first_hour()


# ---- small Tensor utilities -------------------------------------------------------------------------------------


def test_new_constructors_take_self_dtype_and_device(device: str) -> None:
    x, tx = pair(random_array((2, 3)).astype(np.float16), device)
    check = BatchedChecks()
    check(x.new_zeros(2, 3), tx.new_zeros(2, 3), "new_zeros")
    check(x.new_ones((4,)), tx.new_ones((4,)), "new_ones")
    check(x.new_full((2, 2), 3), tx.new_full((2, 2), 3), "new_full")
    check(x.new_empty(0), tx.new_empty(0), "new_empty")
    check(x.new_tensor([1, 2]), tx.new_tensor([1, 2]), "new_tensor")
    check(x.new_zeros(3, dtype=em.int64), tx.new_zeros(3, dtype=torch.int64), "new_zeros dtype")
    ints, torch_ints = pair(np.array([1, 2], dtype=np.int64), device)
    check(ints.new_tensor([1.5, -2.5]), torch_ints.new_tensor([1.5, -2.5]), "new_tensor truncates to int")
    check.verify()
    assert x.new_ones(2).device == device and x.new_ones(2, requires_grad=True).requires_grad
    with pytest.raises(TypeError, match="tuple of ints"):
        x.new_full(2, 1.0)


def test_layout_queries_and_conversions(device: str) -> None:
    x, tx = pair(random_array((2, 3, 4)), device)
    assert x.stride() == tx.stride() and x.stride(1) == tx.stride(1) and x.stride(-1) == tx.stride(-1)
    assert x.storage_offset() == tx.storage_offset() == 0
    assert x.is_contiguous() and x.permute(2, 0, 1).contiguous().is_contiguous()
    assert x.nelement() == tx.nelement() and x.ndimension() == tx.ndimension() == 3
    assert x.is_floating_point() and not em.ones(2, dtype=em.int32, device=device).is_floating_point()
    assert not x.is_complex() and not tx.is_complex()
    check = BatchedChecks()
    check(x.ravel(), tx.ravel(), "ravel")
    check(x.permute(2, 0, 1).ravel(), tx.permute(2, 0, 1).ravel(), "ravel of a permuted view")
    check(x.type_as(em.ones(1, dtype=em.int32)), tx.type_as(torch.ones(1, dtype=torch.int32)), "type_as")
    check(x.t() if x.ndim == 2 else x.flatten(1).t(), tx.flatten(1).t(), "t")
    check.verify()


def test_copy_broadcasts_casts_and_carries_the_gradient(device: str) -> None:
    target, torch_target = pair(np.zeros((2, 3), dtype=np.float32), device)
    source, torch_source = pair(np.array([1.5, -2.0, 3.25], dtype=np.float32), device, requires_grad=True)
    result, torch_result = target.copy_(source * 2), torch_target.copy_(torch_source * 2)
    assert result is target
    (result * em.tensor([[1.0], [2.0]], device=device)).sum().backward()
    (torch_result * torch.tensor([[1.0], [2.0]])).sum().backward()
    assert_close(target, torch_target.detach())
    assert_close(source.grad, torch_source.grad)
    ints, torch_ints = pair(np.zeros(3, dtype=np.int32), device)
    assert_close(ints.copy_(em.tensor([1.7, -2.7, 3.0], device=device)),
                 torch_ints.copy_(torch.tensor([1.7, -2.7, 3.0])))
    with pytest.raises(RuntimeError):
        target.copy_(em.ones(4, device=device))
    with pytest.raises(TypeError, match="must be Tensor"):
        target.copy_([1, 2, 3])


def _module(tensor: Any) -> Any:
    """ember or torch, whichever the tensor belongs to (for torch functions that are not Tensor methods)."""
    return em if isinstance(tensor, em.Tensor) else torch


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_])
def test_early_math_methods_match_torch(dtype: Any, device: str) -> None:
    data = random_array((3, 5), dtype=dtype, low=-3.0, high=3.0)
    x, tx = pair(data, device)
    positive, torch_positive = pair(np.abs(random_array((3, 5), low=0.5, high=3.0)).astype(
        dtype if dtype != np.bool_ else np.float32), device)
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    calls: list[tuple[str, Any]] = [
        ("square", lambda t: t.square()), ("sgn", lambda t: t.sgn()), ("count_nonzero", lambda t: t.count_nonzero()),
        ("count_nonzero dims", lambda t: t.count_nonzero((0, 1))), ("count_nonzero 1", lambda t: t.count_nonzero(1)),
        ("exp2", lambda t: t.exp2()), ("log10", lambda t: (t.abs() + 1).log10() if t.dtype not in (
            em.bool, torch.bool) else t.log10()),
        ("true_divide", lambda t: t.true_divide(2)), ("clamp_min", lambda t: t.clamp_min(0)),
        ("clamp_max", lambda t: t.clamp_max(1)),
    ]
    if dtype != np.bool_:
        calls += [("floor_divide", lambda t: t.floor_divide(2)), ("trunc", lambda t: t.trunc()),
                  ("fix", lambda t: t.fix())]
    if dtype in (np.float32, np.float64):
        calls += [("rsqrt", lambda t: t.abs().rsqrt()), ("frac", lambda t: t.frac()),
                  ("var_mean", lambda t: list(_module(t).var_mean(t, 1))),
                  ("std_mean", lambda t: list(_module(t).std_mean(t, 0, correction=0))),
                  ("aminmax", lambda t: list(t.aminmax())), ("aminmax dim", lambda t: list(t.aminmax(dim=0)))]
    for name, call in calls:
        check(call(x), call(tx), name)
    check(positive.floor_divide(x.clamp_min(1)) if dtype != np.bool_ else positive,
          torch_positive.floor_divide(tx.clamp_min(1)) if dtype != np.bool_ else torch_positive, "floor_divide tensor")
    check.verify()
    named = x.aminmax() if dtype != np.bool_ else None
    if named is not None:
        assert named.min.shape == named[0].shape == ()


# ---- random fills and sampling ---------------------------------------------------------------------------------


def test_uniform_and_normal_fill_in_place(device: str) -> None:
    x = em.empty(200_000, device=device)
    assert x.uniform_(-2.0, 3.0) is x
    values = x.numpy()
    assert values.min() >= -2.0 and values.max() < 3.0
    assert abs(values.mean() - 0.5) < 0.02 and abs(values.var() - 25 / 12) < 0.03
    values = em.empty(200_000, dtype=em.float64, device=device).normal_(1.5, 2.0).numpy()
    assert values.dtype == np.float64
    assert abs(values.mean() - 1.5) < 0.02 and abs(values.std() - 2.0) < 0.02
    np.testing.assert_array_equal(em.ones(5, device=device).normal_(std=0.0).numpy(), np.zeros(5))
    em.manual_seed(3)
    first = em.empty(8, device=device).uniform_(**{"from": 1.0, "to": 2.0}).numpy()
    em.manual_seed(3)
    np.testing.assert_array_equal(first, em.empty(8, device=device).uniform_(1.0, 2.0).numpy())
    with pytest.raises(em.DTypeError):
        em.ones(3, dtype=em.int64, device=device).uniform_()


def test_bernoulli_frequencies(device: str) -> None:
    probabilities = np.array([0.0, 0.1, 0.5, 0.9, 1.0], dtype=np.float32)
    draws = 40_000
    p = em.tensor(np.tile(probabilities, (draws, 1)), device=device)
    samples = em.bernoulli(p)
    assert samples.dtype == em.float32 and not samples.requires_grad
    frequencies = samples.numpy().mean(0)
    standard_error = np.sqrt(probabilities * (1 - probabilities) / draws)
    assert np.all(np.abs(frequencies - probabilities) <= 5 * standard_error + 1e-9), frequencies
    assert set(np.unique(samples.numpy())) <= {0.0, 1.0}
    fixed = em.zeros(draws, dtype=em.int64, device=device).bernoulli_(0.25).numpy()
    assert fixed.dtype == np.int64 and abs(fixed.mean() - 0.25) < 5 * np.sqrt(0.25 * 0.75 / draws)
    by_tensor = em.zeros(draws, 2, device=device).bernoulli_(em.tensor([0.2, 0.7], device=device)).numpy()
    assert np.all(np.abs(by_tensor.mean(0) - [0.2, 0.7]) < 5 * np.sqrt(0.25 / draws))
    from_p = em.zeros(draws, device=device).bernoulli(0.3).numpy()
    assert abs(from_p.mean() - 0.3) < 5 * np.sqrt(0.21 / draws)


def test_multinomial_with_replacement_frequencies(device: str) -> None:
    weights = np.array([[1.0, 0.0, 3.0, 6.0], [5.0, 5.0, 0.0, 0.0]], dtype=np.float32)
    draws = 30_000
    samples = em.multinomial(em.tensor(weights, device=device), draws, replacement=True)
    torch_samples = torch.multinomial(torch.tensor(weights), draws, replacement=True)
    assert samples.shape == tuple(torch_samples.shape) and samples.dtype == em.int64
    values = samples.numpy()
    probabilities = weights / weights.sum(1, keepdims=True)
    for row in range(2):
        frequencies = np.bincount(values[row], minlength=4) / draws
        assert np.all(np.abs(frequencies - probabilities[row]) <= 5 * np.sqrt(probabilities[row] / draws) + 1e-9)
    assert not np.isin(values[0], [1]).any() and not np.isin(values[1], [2, 3]).any()  # zero weights never drawn
    one = em.tensor([0.2, 0.8], device=device).multinomial(1)
    assert one.shape == (1,) and one.item() in (0, 1)


@pytest.mark.parametrize("count", [2, 20])
def test_multinomial_without_replacement(count: int, device: str) -> None:
    """Distinct indices; the first two picks follow sequential sampling: P(i, j) = p_i * p_j / (1 - p_i)."""
    categories = 24
    weights = np.linspace(1.0, 4.0, categories).astype(np.float32)
    rows = 6_000
    samples = em.multinomial(em.tensor(np.tile(weights, (rows, 1)), device=device), count).numpy()
    assert samples.shape == (rows, count)
    assert all(len(set(row)) == count for row in samples[:500])
    probabilities = weights / weights.sum()
    first = np.bincount(samples[:, 0], minlength=categories) / rows
    assert np.all(np.abs(first - probabilities) <= 5 * np.sqrt(probabilities / rows))
    second = np.bincount(samples[:, 1], minlength=categories) / rows
    expected_second = np.array([sum(probabilities[i] * probabilities[j] / (1 - probabilities[i])
                                    for i in range(categories) if i != j) for j in range(categories)])
    assert np.all(np.abs(second - expected_second) <= 5 * np.sqrt(expected_second / rows))
    every = em.multinomial(em.tensor(weights, device=device), categories).numpy()
    assert sorted(every.tolist()) == list(range(categories))
    zeros_last = em.tensor([0.0, 1.0, 0.0, 2.0], device=device).multinomial(4).numpy()
    assert set(zeros_last[:2].tolist()) == {1, 3} and zeros_last[2:].tolist() == [0, 2]  # as torch: index order


def test_multinomial_without_replacement_from_a_gemma_sized_vocabulary(device: str) -> None:
    """40 draws from 262,144 categories (the keys' top-k; ranking every pair of keys would compare 7 * 10^10)."""
    categories = 262_144
    weights = np.zeros((2, categories), dtype=np.float32)
    random = np.random.default_rng(8)
    allowed = random.choice(categories, 100, replace=False)
    weights[0, allowed] = random.uniform(0.5, 2.0, 100)
    weights[1, allowed[:30]] = 1.0  # fewer than the draws: the zero weights follow in index order, as torch's
    samples = em.multinomial(em.tensor(weights, device=device), 40).numpy()
    assert samples.shape == (2, 40) and len(set(samples[0])) == 40 and set(samples[0]) <= set(allowed)
    assert set(samples[1, :30]) == set(allowed[:30])
    assert samples[1, 30:].tolist() == [index for index in range(categories) if index not in allowed[:30]][:10]


# ---- devices ------------------------------------------------------------------------------------------------------


def test_cpu_moves_to_the_c_device(device: str) -> None:
    x = em.tensor([1.0, 2.0], device=device)
    moved = x.cpu()
    assert moved.device == "c:0" and moved.tolist() == [1.0, 2.0]
    model = em.nn.Linear(2, 2).to(device)
    assert model.cpu() is model and model.weight.device == "c:0"


def test_cuda_moves_or_says_why_it_cannot() -> None:
    from ember.backends.registry import REGISTRY
    from ember.core.errors import BackendUnavailable

    x = em.tensor([1.0, 2.0])
    try:
        devices = REGISTRY.probe("cuda")
    except BackendUnavailable:
        devices = []
    if not devices:
        reason = REGISTRY.unavailable["cuda"]
        for call in (lambda: x.cuda(), lambda: x.cuda(0), lambda: em.nn.Linear(2, 2).cuda()):
            expected = r"cuda\(\): no cuda device: .*; available devices: .*c:0"
            with pytest.raises(em.DeviceError, match=expected) as raised:
                call()
            assert reason in str(raised.value) and isinstance(raised.value, RuntimeError)
        return
    moved = x.cuda()
    assert moved.device == devices[0].name and moved.tolist() == [1.0, 2.0]
    assert x.cuda(0).device == "cuda:0" and x.cuda("cuda:0").device == "cuda:0"
    assert moved.cpu().device == "c:0"
    model = em.nn.Linear(2, 2).cuda()
    assert model.weight.device == devices[0].name
    with pytest.raises(em.DeviceError, match="no device cuda:99"):
        x.cuda(99)


# ---- scans and NaN-skipping reductions, dtype shorthands, size queries, tile/fliplr/flipud -----------------------


def test_cummin_logcumsumexp_and_nan_reductions_with_gradients(device: str) -> None:
    data = np.array([[1.0, np.nan, -2.0, 3.0, 3.0, -5.0], [0.0, 2.0, 2.0, -1.0, 0.5, 4.0],
                     [0.0, 80.0, -80.0, 5.0, -np.inf, 3.0]], dtype=np.float32)
    finite = np.nan_to_num(data, nan=0.25, neginf=-7.0)
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    x, tx = pair(data, device)
    for dim in (0, 1, -1):
        check(list(x.cummin(dim)), list(tx.cummin(dim)), f"cummin {dim}")
        check(x.logcumsumexp(dim), tx.logcumsumexp(dim), f"logcumsumexp {dim}")
        check(em.nansum(x, dim), torch.nansum(tx, dim), f"nansum {dim}")
        check(x.nanmean(axis=dim, keepdims=True), tx.nanmean(dim=dim, keepdim=True), f"nanmean {dim}")
    check(x.nansum(), tx.nansum(), "nansum all")
    check(em.nanmean(x), torch.nanmean(tx), "nanmean all")
    check(em.tensor([np.nan], device=device).nanmean(), torch.tensor([np.nan]).nanmean(), "nanmean of only NaN")
    integers, torch_integers = pair(np.array([[3, 1, 2, 1, 5], [-4, 0, -4, 7, -9]], dtype=np.int32), device)
    check(list(integers.cummin(1)), list(torch_integers.cummin(1)), "cummin int32")
    check(integers.nansum(1), torch_integers.nansum(1), "nansum int32 widens to int64")
    check(em.tensor(2.5, device=device).logcumsumexp(0), torch.tensor(2.5).logcumsumexp(0), "0-d")
    check.verify()
    # gradients: cummin to the index it returns, logcumsumexp's softmax of each prefix, NaN counted as absent
    for name, call in (("cummin", lambda t: t.cummin(1)[0]), ("logcumsumexp", lambda t: t.logcumsumexp(1)),
                       ("nansum", lambda t: t.nansum(0)), ("nanmean", lambda t: t.nanmean(1))):
        source = data if name.startswith("nan") else finite
        y, ty = pair(source, device, requires_grad=True)
        weights = random_array(tuple(call(ty).shape), low=0.5, high=2.0)
        (call(y) * em.tensor(weights, device=device)).sum().backward()
        (call(ty) * torch.tensor(weights)).sum().backward()
        assert_close(y.grad, ty.grad, atol=1e-5, rtol=1e-5)
    with pytest.raises(em.DTypeError, match="nanmean"):
        integers.nanmean()


def test_dtype_shorthands_size_queries_and_flips(device: str) -> None:
    data = random_array((2, 3, 4), low=-3.0, high=300.0)
    x, tx = pair(data, device)
    check = BatchedChecks()
    for name in ("byte", "char", "short"):
        check(getattr(x.abs(), name)(), getattr(tx.abs(), name)(), name)
    check(x.tile(2), tx.tile(2), "tile fewer counts")
    check(x.tile((2, 1, 1, 3)), tx.tile((2, 1, 1, 3)), "tile more counts")
    check(em.tile(x, (1, 2)), torch.tile(tx, (1, 2)), "ember.tile")
    check(x.fliplr(), tx.fliplr(), "fliplr")
    check(em.flipud(x), torch.flipud(tx), "flipud")
    check.verify()
    assert x.itemsize == tx.itemsize == 4 and x.nbytes == tx.nbytes == 96
    assert x.short().nbytes == tx.short().nbytes
    for dtype, torch_dtype in ((em.float32, torch.float32), (em.uint8, torch.uint8), (em.bool, torch.bool),
                               (em.int16, torch.int16)):
        assert em.zeros(1, dtype=dtype, device=device).is_signed() == torch.zeros(1, dtype=torch_dtype).is_signed()
    assert x.is_same_size(x + 1) and not x.is_same_size(x[0])
    assert em.tensor([0.5], device=device).is_nonzero() and not em.tensor([[0.0]], device=device).is_nonzero()
    with pytest.raises(RuntimeError):
        torch.ones(2).is_nonzero()
    with pytest.raises(RuntimeError):
        em.ones(2, device=device).is_nonzero()
    nan = em.tensor([1.0, np.nan], device=device)
    assert em.equal(x, x + 0) and not em.equal(x, x[:1]) and not x.equal(x + 1)
    assert em.equal(nan, nan) is torch.equal(torch.tensor([1.0, np.nan]), torch.tensor([1.0, np.nan])) is False
    assert em.ones(1, device=device).cpu().is_cpu and x.is_cpu == (device.split(":")[0] == "c")
    for call in (lambda m: m.ones(3).fliplr(), lambda m: m.tensor(1.0).flipud()):
        with pytest.raises(RuntimeError):
            call(torch)
        with pytest.raises(RuntimeError):
            call(em)
