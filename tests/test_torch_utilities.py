"""torch-level utilities against torch: finfo/iinfo, the default dtype, result_type, can_cast, broadcast_shapes,
is_tensor, scalar_tensor, seeds, inference_mode, set_printoptions, and the in-place variants made by one rule."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

import ember as em
from ember.core.in_place import NOT_IN_PLACE_FORMS, VIEW_IN_PLACE
from ember.torch_names import TENSOR_METHODS
from tests.helpers import EMBER_DTYPES, TORCH_DTYPES, BatchedChecks, pair, random_array

FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTEGER_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
                  torch.uint64]


# ---- dtype queries ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("torch_dtype", FLOAT_DTYPES)
def test_finfo_matches_torch(torch_dtype: torch.dtype) -> None:
    ours, theirs = em.finfo(EMBER_DTYPES[torch_dtype]), torch.finfo(torch_dtype)
    for name in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution", "dtype"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("torch_dtype", INTEGER_DTYPES)
def test_iinfo_matches_torch(torch_dtype: torch.dtype) -> None:
    ours, theirs = em.iinfo(EMBER_DTYPES[torch_dtype]), torch.iinfo(torch_dtype)
    for name in ("bits", "max", "min", "dtype"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert repr(ours) == repr(theirs)


def test_finfo_and_iinfo_errors_are_torch_s() -> None:
    assert em.finfo().dtype == torch.finfo().dtype == "float32"
    for module, call in ((torch, lambda m: m.finfo(m.int32)), (torch, lambda m: m.iinfo(m.float32)),
                         (torch, lambda m: m.iinfo(m.bool))):
        with pytest.raises(TypeError):
            call(module)
        with pytest.raises(TypeError):
            call(em)


@pytest.fixture
def default_float64() -> Iterator[None]:
    em.set_default_dtype(em.float64)
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        em.set_default_dtype(em.float32)
        torch.set_default_dtype(torch.float32)


def test_default_dtype_changes_what_creation_and_promotion_give(device: str, default_float64: None) -> None:
    assert em.get_default_dtype() is em.float64 and torch.get_default_dtype() is torch.float64
    check = BatchedChecks(atol=0, rtol=0)
    check(em.tensor([1.1, 2.2], device=device), torch.tensor([1.1, 2.2]), "tensor")
    check(em.zeros(2, device=device), torch.zeros(2), "zeros")
    check(em.ones(2, device=device), torch.ones(2), "ones")
    check(em.arange(0.0, 2.0, device=device), torch.arange(0.0, 2.0), "arange")
    check(em.full((2,), 1.5, device=device), torch.full((2,), 1.5), "full")
    check(em.tensor([1, 2], device=device) * 1.5, torch.tensor([1, 2]) * 1.5, "int * float")
    check(em.tensor([1, 4], device=device).sqrt(), torch.tensor([1, 4]).sqrt(), "sqrt of int")
    check(em.scalar_tensor(3, device=device), torch.scalar_tensor(3), "scalar_tensor")
    check.verify()
    assert em.rand(2, device=device).dtype is em.float64 and em.finfo().dtype == "float64"


def test_set_default_dtype_takes_only_floats() -> None:
    for module in (torch, em):
        with pytest.raises(TypeError):
            module.set_default_dtype(module.int64)
    assert em.get_default_dtype() is em.float32


def test_result_type_and_can_cast_match_torch(device: str) -> None:
    samples = {
        "int8 vector": (em.tensor([1], dtype=em.int8, device=device), torch.tensor([1], dtype=torch.int8)),
        "int64 scalar tensor": (em.tensor(5, device=device), torch.tensor(5)),
        "float16 vector": (em.ones(2, dtype=em.float16, device=device), torch.ones(2, dtype=torch.float16)),
        "bool vector": (em.tensor([True], device=device), torch.tensor([True])),
        "float64 scalar tensor": (em.tensor(1.0, dtype=em.float64, device=device),
                                  torch.tensor(1.0, dtype=torch.float64)),
        "int": (3, 3), "float": (2.5, 2.5), "bool": (True, True),
    }
    for first_name, (first, torch_first) in samples.items():
        for second_name, (second, torch_second) in samples.items():
            expected = torch.result_type(torch_first, torch_second)
            assert TORCH_DTYPES[em.result_type(first, second)] == expected, (first_name, second_name)
    with pytest.raises(TypeError):
        torch.result_type("a", torch.ones(1))
    with pytest.raises(TypeError):
        em.result_type("a", em.ones(1))
    for source in TORCH_DTYPES.values():
        for target in TORCH_DTYPES.values():
            assert em.can_cast(EMBER_DTYPES[source], EMBER_DTYPES[target]) == torch.can_cast(source, target), (
                source, target)


def test_broadcast_shapes_is_torch_s() -> None:
    for shapes in (((2, 1), (3,)), (2, (3, 1)), ((), (4, 1, 2)), ((1,), (1, 1)), ()):
        assert em.broadcast_shapes(*shapes) == tuple(torch.broadcast_shapes(*shapes))
    with pytest.raises(RuntimeError):
        torch.broadcast_shapes((2,), (3,))
    with pytest.raises(RuntimeError, match=r"\(2,\), \(3,\)"):
        em.broadcast_shapes((2,), (3,))


def test_is_tensor_numel_and_is_floating_point(device: str) -> None:
    x, tx = pair(random_array((2, 3)), device)
    assert em.is_tensor(x) and torch.is_tensor(tx)
    for other in (1, [1.0], np.ones(2)):
        assert em.is_tensor(other) is torch.is_tensor(other) is False
    assert em.is_tensor(em.nn.Parameter(em.ones(2, device=device)))
    assert em.numel(x) == torch.numel(tx) == 6
    assert em.is_floating_point(x) is torch.is_floating_point(tx) is True
    assert em.is_floating_point(x.long()) is torch.is_floating_point(tx.long()) is False


def test_scalar_tensor_is_a_0d_default_float(device: str) -> None:
    check = BatchedChecks(atol=0, rtol=0)
    for value in (3, 2.5, True):
        check(em.scalar_tensor(value, device=device), torch.scalar_tensor(value), repr(value))
    check(em.scalar_tensor(3, dtype=em.int32, device=device), torch.scalar_tensor(3, dtype=torch.int32), "int32")
    check.verify()
    assert em.scalar_tensor(1.5, requires_grad=True, device=device).requires_grad
    with pytest.raises(TypeError):
        torch.scalar_tensor("a")
    with pytest.raises(TypeError):
        em.scalar_tensor("a")


def test_seed_and_initial_seed(device: str) -> None:
    em.manual_seed(1234)
    assert em.initial_seed() == 1234
    first = em.rand(4, device=device).numpy()
    chosen = em.seed()
    assert em.initial_seed() == chosen and 0 <= chosen < 2**63
    em.manual_seed(1234)
    np.testing.assert_array_equal(em.rand(4, device=device).numpy(), first)
    em.manual_seed(chosen)
    second = em.rand(4, device=device).numpy()
    assert not np.array_equal(first, second)


def test_inference_mode_is_no_grad_as_context_and_decorator(device: str) -> None:
    x = em.ones(2, device=device, requires_grad=True)
    with em.inference_mode():
        assert not em.is_grad_enabled() and em.is_inference_mode_enabled()
        assert not (x * 2).requires_grad
    assert em.is_grad_enabled() and not em.is_inference_mode_enabled()
    with em.inference_mode(False):
        assert em.is_grad_enabled() and (x * 2).requires_grad

    @em.inference_mode
    def bare() -> bool:
        return (x * 2).requires_grad

    @em.inference_mode()
    def called() -> bool:
        return (x * 2).requires_grad

    assert bare() is False and called() is False and em.is_grad_enabled()
    with torch.inference_mode():
        assert torch.is_inference_mode_enabled() and not torch.is_grad_enabled()


# ---- set_printoptions ------------------------------------------------------------------------------------------


@pytest.fixture
def restore_printoptions() -> Iterator[None]:
    try:
        yield
    finally:
        em.set_printoptions(profile="default")
        torch.set_printoptions(profile="default")


@pytest.mark.parametrize("options", [
    {"precision": 2}, {"precision": 6}, {"sci_mode": True}, {"sci_mode": False}, {"threshold": 5},
    {"threshold": 5, "edgeitems": 1}, {"linewidth": 30}, {"profile": "short"}, {"profile": "full"},
    {"precision": 1, "sci_mode": True, "linewidth": 40},
])
def test_set_printoptions_prints_as_torch(options: dict, restore_printoptions: None) -> None:
    em.set_printoptions(**options)
    torch.set_printoptions(**options)
    arrays = [np.array([1.12345678, -2.5, 3.0], dtype=np.float32), np.arange(12, dtype=np.float32) * 1000.5,
              np.arange(20, dtype=np.int64), np.array([[1e-5, 2.0], [3.0, 4.0]], dtype=np.float32),
              np.arange(2000, dtype=np.float32).reshape(40, 50) / 7]
    for array in arrays:
        assert repr(em.tensor(array, device="c:0")) == repr(torch.tensor(array)), (options, array.shape)


def test_set_printoptions_unknown_profile() -> None:
    with pytest.raises(ValueError, match="profile"):
        em.set_printoptions(profile="long")


# ---- in-place variants ----------------------------------------------------------------------------------------

UNARY_IN_PLACE = ["exp_", "log_", "sqrt_", "rsqrt_", "sigmoid_", "tanh_", "relu_", "sin_", "cos_", "tan_", "erf_",
                  "erfc_", "exp2_", "expm1_", "log10_", "log1p_", "log2_", "reciprocal_", "neg_", "negative_",
                  "floor_", "ceil_", "round_", "trunc_", "fix_", "frac_", "square_", "sign_", "sgn_", "absolute_"]


def test_in_place_unary_variants_match_torch_values_and_gradients(device: str) -> None:
    data = random_array((3, 4), low=0.2, high=2.0)
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    for name in UNARY_IN_PLACE:
        x, tx = pair(data, device, requires_grad=True)
        y, ty = x * 1.5, tx * 1.5
        returned, torch_returned = getattr(y, name)(), getattr(ty, name)()
        assert returned is y and torch_returned is ty
        check(y, ty, name)
        (y * em.tensor(data, device=device)).sum().backward()
        (ty * torch.tensor(data)).sum().backward()
        check(x.grad, tx.grad, f"{name} gradient")
    check.verify()


def test_in_place_variants_with_arguments_match_torch(device: str) -> None:
    data = random_array((3, 4))
    other = random_array((3, 4), seed=1)
    cases = [("clamp_min_", (0.1,)), ("clamp_max_", (0.2,)), ("clip_", (-0.5, 0.5)), ("cumsum_", (1,)),
             ("cumprod_", (0,)), ("lerp_", ("other", 0.3)), ("multiply_", ("other",)), ("subtract_", ("other",)),
             ("divide_", ("other",)), ("true_divide_", (2.0,)), ("fmod_", (0.7,)), ("remainder_", (0.7,)),
             ("floor_divide_", (0.7,)), ("eq_", ("other",)), ("ge_", (0.0,)), ("lt_", ("other",)),
             ("logical_and_", ("other",)), ("logical_not_", ()), ("nan_to_num_", ()), ("renorm_", (2, 0, 1.0)),
             ("greater_", (0.0,)), ("not_equal_", ("other",))]
    check = BatchedChecks(atol=1e-5, rtol=1e-5)
    for name, arguments in cases:
        x, tx = pair(data, device, requires_grad=True)
        o, to = pair(other, device)
        y, ty = x * 1.0, tx * 1.0
        getattr(y, name)(*(o if a == "other" else a for a in arguments))
        getattr(ty, name)(*(to if a == "other" else a for a in arguments))
        check(y, ty, name)
        if name not in ("eq_", "ge_", "lt_", "logical_and_", "logical_not_", "greater_", "not_equal_",
                        "floor_divide_"):
            (y * y).sum().backward()
            (ty * ty).sum().backward()
            check(x.grad, tx.grad, f"{name} gradient")
    check.verify()


def test_in_place_integer_and_bitwise_variants(device: str) -> None:
    data = random_array((2, 5), np.int32)
    check = BatchedChecks()
    for name, argument in (("bitwise_and_", 6), ("bitwise_or_", 3), ("bitwise_xor_", 5), ("bitwise_not_", None),
                           ("bitwise_left_shift_", 2), ("bitwise_right_shift_", 1), ("floor_divide_", 3),
                           ("remainder_", 3), ("clamp_min_", 0)):
        x, tx = pair(data, device)
        arguments = () if argument is None else (argument,)
        getattr(x, name)(*arguments)
        getattr(tx, name)(*arguments)
        check(x, tx, name)
    check.verify()


def test_in_place_view_variants_change_the_shape_like_torch(device: str) -> None:
    data = random_array((2, 1, 3))
    check = BatchedChecks(atol=0, rtol=0)
    for name, arguments in (("squeeze_", (1,)), ("unsqueeze_", (0,)), ("transpose_", (0, 2)),
                            ("swapaxes_", (0, 1)), ("swapdims_", (2, 1))):
        x, tx = pair(data, device, requires_grad=True)
        y, ty = x * 2, tx * 2
        getattr(y, name)(*arguments)
        getattr(ty, name)(*arguments)
        check(y, ty, name)
        weights = random_array(tuple(ty.shape), seed=3)
        (y * em.tensor(weights, device=device)).sum().backward()
        (ty * torch.tensor(weights)).sum().backward()
        check(x.grad, tx.grad, f"{name} gradient")
    x, tx = pair(random_array((2, 3)), device)
    check(x.t_(), tx.t_(), "t_")
    check.verify()


def test_in_place_errors_are_torch_s(device: str) -> None:
    calls = [
        lambda m: m.tensor([1, 4]).sqrt_(),  # the float result can't be written into int64
        lambda m: m.tensor([1, 2]).eq_(m.ones(3, 2)),  # the result would broadcast self
        lambda m: m.ones(2, requires_grad=True).exp_(),  # a leaf that requires grad
        lambda m: m.ones(2, requires_grad=True).t_(),
    ]
    for call in calls:
        with pytest.raises(RuntimeError):
            call(torch)
        with pytest.raises(RuntimeError):
            call(em)


def test_every_in_place_variant_torch_has_exists_where_ember_has_the_op() -> None:
    """The rule: each torch.Tensor.NAME_ whose NAME ember has is a method (and ember.NAME_ where torch has it)."""
    from ember.torch_names import TORCH_FUNCTIONS

    for name in TENSOR_METHODS:
        if name.endswith("_") and not name.startswith("_") and hasattr(em.Tensor, name[:-1]):
            if name not in NOT_IN_PLACE_FORMS:
                assert hasattr(em.Tensor, name), name
            if name in TORCH_FUNCTIONS and hasattr(em.Tensor, name):
                assert hasattr(em, name), f"ember.{name}"
    assert VIEW_IN_PLACE <= set(TENSOR_METHODS)
    x = em.ones(3)
    assert em.exp_(x) is x
