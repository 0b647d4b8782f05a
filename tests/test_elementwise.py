"""Arithmetic, division rules, pow, comparisons, logic and bits, where, clamp, operators: ember against PyTorch."""

import operator

import numpy as np
import pytest
import torch

import ember as em
from tests.helpers import TORCH_DTYPES, assert_close, assert_close_batch, random_array

INTEGER_DTYPES = [em.int8, em.int16, em.int32, em.int64, em.uint8]
FLOAT_DTYPES = [em.float32, em.float64, em.float16, em.bfloat16]
FLOAT_VALUES = np.array([-7.5, -3.0, -2.5, -1.0, -0.0, 0.0, 0.5, 1.0, 2.0, 3.0, 7.5, np.inf, -np.inf, np.nan])
HALF_TOLERANCE = {em.float16: 1e-3, em.bfloat16: 8e-3}


def _grid(values: np.ndarray, dtype: em.DType, device: str):
    """Every pair of values: an ember and a torch tensor of shape (n, 1) and (1, n) (broadcast to n x n)."""
    torch_values = torch.tensor(values).to(TORCH_DTYPES[dtype])
    numpy_values = torch_values.float().numpy() if dtype is em.bfloat16 else torch_values.numpy()
    column = em.tensor(numpy_values, dtype=dtype, device=device).reshape(-1, 1)
    row = em.tensor(numpy_values, dtype=dtype, device=device).reshape(1, -1)
    return column, row, torch_values.reshape(-1, 1), torch_values.reshape(1, -1)


def _integer_values(dtype: em.DType) -> np.ndarray:
    values = np.array([-128, -7, -3, -2, -1, 0, 1, 2, 3, 7, 127])
    if dtype.is_unsigned:
        values = np.array([0, 1, 2, 3, 7, 128, 255])
    return values


BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
    "floordiv": operator.floordiv, "mod": operator.mod, "fmod": lambda a, b: a.fmod(b), "pow": operator.pow,
    "maximum": lambda a, b: a.maximum(b), "minimum": lambda a, b: a.minimum(b), "fmax": lambda a, b: a.fmax(b),
    "fmin": lambda a, b: a.fmin(b), "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
    "gt": operator.gt, "ge": operator.ge, "div_trunc": lambda a, b: a.div(b, rounding_mode="trunc"),
}


@pytest.mark.parametrize("dtype", [em.float32, em.float64])
def test_binary_float_special_values(dtype: em.DType, device: str) -> None:
    """Every pair of -7.5 .. 7.5, +-0, +-inf and NaN: division by zero, x // inf, (-1) ** inf, NaN ordering."""
    column, row, torch_column, torch_row = _grid(FLOAT_VALUES, dtype, device)
    assert_close_batch([(name, function(column, row), function(torch_column, torch_row))
                        for name, function in BINARY.items()], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [em.float16, em.bfloat16])
def test_binary_half_types(dtype: em.DType, device: str) -> None:
    column, row, torch_column, torch_row = _grid(FLOAT_VALUES, dtype, device)
    assert_close_batch([(name, BINARY[name](column, row), BINARY[name](torch_column, torch_row))
                        for name in ("add", "mul", "truediv", "floordiv", "mod", "pow", "maximum", "lt")],
                       atol=1e-3, rtol=HALF_TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", INTEGER_DTYPES)
def test_binary_integers_with_negative_operands(dtype: em.DType, device: str) -> None:
    """Python floor semantics for // and % (like torch), C semantics for fmod and trunc division; wraparound."""
    values = _integer_values(dtype)
    column, row, torch_column, torch_row = _grid(values, dtype, device)
    keep = values != 0  # torch raises on integer division by zero (see test_integer_division_by_zero_gives_zero)
    divisor = em.tensor(values[keep], dtype=dtype, device=device).reshape(1, -1)
    torch_divisor = torch_row[:, torch.tensor(keep)]
    cases = []
    for name in ("add", "sub", "mul", "truediv", "maximum", "minimum", "lt", "le", "eq"):
        cases.append((name, BINARY[name](column, row), BINARY[name](torch_column, torch_row)))
    for name in ("floordiv", "mod", "fmod", "div_trunc"):
        cases.append((name, BINARY[name](column, divisor), BINARY[name](torch_column, torch_divisor)))
    assert_close_batch(cases)


def test_integer_division_by_zero_raises(device: str) -> None:
    """torch raises RuntimeError('ZeroDivisionError'); so does ember (tests/test_index_checks.py has the lazy cases)."""
    x = em.tensor([-7, 0, 5], device=device)
    zero = em.zeros(3, dtype=em.int64, device=device)
    for divide in (lambda a, b: a // b, lambda a, b: a % b, lambda a, b: a.fmod(b),
                   lambda a, b: a.div(b, rounding_mode="trunc")):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            divide(torch.tensor([-7, 0, 5]), torch.zeros(3, dtype=torch.int64))
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            divide(x, zero).numpy()


def test_floor_division_and_remainder_of_floats_like_python(device: str) -> None:
    data = random_array((200,), low=-50, high=50)
    divisors = random_array((200,), low=-5, high=5, seed=1)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    y, ty = em.tensor(divisors, device=device), torch.tensor(divisors)
    assert_close_batch([
        ("//", x // y, tx // ty, 0, 0), ("%", x % y, tx % ty), ("fmod", x.fmod(y), tx.fmod(ty)),
        ("// 3", x // 3, tx // 3, 0, 0), ("-7.5 //", -7.5 // y, -7.5 // ty, 0, 0),
        ("remainder -2.5", x.remainder(-2.5), tx.remainder(-2.5)),
    ], atol=2e-5, rtol=1e-5)


def test_integer_pow(device: str) -> None:
    """Tensor exponents (negative, zero, large: wraparound like torch) and Python exponents, every integer dtype."""
    cases = []
    for dtype in INTEGER_DTYPES:
        bases = _integer_values(dtype)
        exponents = np.array([0, 1, 2, 3, 5, 7, 8, 13, 31, 62, 63, 64, 100, 127])
        if not dtype.is_unsigned:
            exponents = np.concatenate([exponents, [-1, -2, -3, -128]])
        exponents = exponents[exponents <= np.iinfo(dtype.numpy).max]
        base, exponent, torch_base, torch_exponent = (
            em.tensor(bases, dtype=dtype, device=device).reshape(-1, 1),
            em.tensor(exponents, dtype=dtype, device=device).reshape(1, -1),
            torch.tensor(bases).to(TORCH_DTYPES[dtype]).reshape(-1, 1),
            torch.tensor(exponents).to(TORCH_DTYPES[dtype]).reshape(1, -1),
        )
        cases.append((f"tensor exponent {dtype.name}", base**exponent, torch_base**torch_exponent))
        cases += [(f"** {scalar} {dtype.name}", base**scalar, torch_base**scalar) for scalar in (0, 3, 10, 64)]
    x = em.tensor([3, -4, 0], device=device)
    cases += [("2 ** x", 2**x, 2 ** torch.tensor([3, -4, 0])), ("x ** 2.0", x**2.0, torch.tensor([3, -4, 0]) ** 2.0),
              ("bool ** 2", em.tensor([True, False], device=device) ** 2, torch.tensor([True, False]) ** 2)]
    assert_close_batch(cases)


def test_integer_pow_graph_stays_small() -> None:
    """A tensor exponent costs about one squaring per exponent bit, combined as a balanced product."""
    from ember.core.graph import Node

    base = em.tensor([3], dtype=em.int64, device="c")
    result = base ** em.tensor([5], dtype=em.int64, device="c")
    seen, stack, depth = set(), [(result.node, 0)], 0
    while stack:
        node, level = stack.pop()
        depth = max(depth, level)
        if id(node) not in seen:
            seen.add(id(node))
            stack.extend((source, level + 1) for source in node.srcs)
    assert isinstance(result.node, Node) and len(seen) < 400 and depth < 100, (len(seen), depth)


def test_float_pow_special_values_and_scalars(device: str) -> None:
    data = np.array([-2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, 10.0, np.inf, -np.inf, np.nan], dtype=np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    cases = [(f"x ** {exponent}", x**exponent, tx**exponent)
             for exponent in (0, 1, 2, 3, -1, -2, 0.5, -0.5, 2.5, -3.5, 1 / 3, 64, np.inf, -np.inf)]
    cases += [(f"{base} ** x", base**x, base**tx) for base in (2.0, 0.5, -2.0, 0.0, 1.0)]
    nan_exponent = np.full(12, np.nan, dtype=np.float32)
    cases.append(("x ** nan tensor", x ** em.tensor(nan_exponent, device=device), tx ** torch.tensor(nan_exponent)))
    assert_close_batch(cases, atol=1e-6, rtol=2e-6)
    with pytest.raises(em.DTypeError, match="negative integer powers"):
        em.tensor([2, 3], device=device) ** -1


def test_pow_with_a_nan_scalar_exponent(device: str) -> None:
    data = np.array([-2.0, 0.0, 0.5, 1.0, 2.0, np.inf], dtype=np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    assert_close(x ** float("nan"), tx ** float("nan"))  # NaN, except 1 ** NaN = 1


def test_shifts_by_any_amount_like_torch(device: str) -> None:
    cases = []
    for dtype in (em.int8, em.uint8, em.int32, em.int64):
        values = _integer_values(dtype)
        amounts = np.array([-1, 0, 1, 3, 7, 8, 9, 31, 32, 63, 64, 70])
        amounts = amounts[(amounts <= np.iinfo(dtype.numpy).max) & (amounts >= np.iinfo(dtype.numpy).min)]
        value, amount, torch_value, torch_amount = (
            em.tensor(values, dtype=dtype, device=device).reshape(-1, 1),
            em.tensor(amounts, dtype=dtype, device=device).reshape(1, -1),
            torch.tensor(values).to(TORCH_DTYPES[dtype]).reshape(-1, 1),
            torch.tensor(amounts).to(TORCH_DTYPES[dtype]).reshape(1, -1),
        )
        cases += [(f"<< {dtype.name}", value << amount, torch_value << torch_amount),
                  (f">> {dtype.name}", value >> amount, torch_value >> torch_amount)]
    flags = em.tensor([True, False], device=device)
    cases.append(("bool << 1", flags << 1, torch.tensor([True, False]) << 1))  # promoted to int64
    assert_close_batch(cases)


def test_logical_and_bitwise_ops(device: str) -> None:
    a, b = np.array([0, 1, -3, 6, 0, 255]), np.array([0, 5, 6, 0, -1, 15])
    cases = []
    for dtype in (em.int8, em.uint8, em.int64, em.bool):
        left, right = a.astype(dtype.numpy), b.astype(dtype.numpy)
        x, y, tx, ty = (em.tensor(left, device=device), em.tensor(right, device=device), torch.tensor(left),
                        torch.tensor(right))
        cases += [(f"{function.__name__} {dtype.name}", function(x, y), function(tx, ty))
                  for function in (operator.and_, operator.or_, operator.xor)]
        cases += [(f"~ {dtype.name}", ~x, ~tx), (f"logical_and {dtype.name}", x.logical_and(y), tx.logical_and(ty)),
                  (f"logical_or {dtype.name}", x.logical_or(y), tx.logical_or(ty)),
                  (f"logical_xor {dtype.name}", x.logical_xor(y), tx.logical_xor(ty)),
                  (f"logical_not {dtype.name}", x.logical_not(), tx.logical_not())]
    floats = np.array([0.0, -0.0, 1.5, np.nan, -np.inf], dtype=np.float32)
    f, tf = em.tensor(floats, device=device), torch.tensor(floats)
    cases += [("logical_not float", f.logical_not(), tf.logical_not()),  # NaN is truthy
              ("logical_and float int", f.logical_and(em.tensor([1, 1, 0, 1, 1], device=device)),
               tf.logical_and(torch.tensor([1, 1, 0, 1, 1]))),
              ("bool & 1", em.tensor([True, False], device=device) & 1, torch.tensor([True, False]) & 1)]
    assert_close_batch(cases)


def test_bool_arithmetic_is_logical(device: str) -> None:
    flags = np.array([True, False, True, False])
    other = np.array([True, True, False, False])
    x, y = em.tensor(flags, device=device), em.tensor(other, device=device)
    tx, ty = torch.tensor(flags), torch.tensor(other)
    assert_close_batch([
        ("+", x + y, tx + ty),  # or, stored as 1 (not 2)
        ("+ == True", (x + y) == em.tensor([True] * 4, device=device), (tx + ty) == torch.tensor([True] * 4)),
        ("*", x * y, tx * ty), ("/", x / y, tx / ty), ("+ 1", x + 1, tx + 1), ("+ 1.5", x + 1.5, tx + 1.5),
        ("maximum", x.maximum(y), tx.maximum(ty)), ("minimum", x.minimum(y), tx.minimum(ty)),
    ])


def test_comparisons_promote_and_broadcast(device: str) -> None:
    unsigned = em.tensor([3, 4, 255], dtype=em.uint8, device=device)
    torch_unsigned = torch.tensor([3, 4, 255], dtype=torch.uint8)
    ints, floats = em.tensor([[1], [2]], device=device), em.tensor([1.5, 2.0, np.nan], device=device)
    torch_ints, torch_floats = torch.tensor([[1], [2]]), torch.tensor([1.5, 2.0, np.nan])
    cases = [("uint8 < -1", unsigned < -1, torch_unsigned < -1)]  # -1 becomes 255 in uint8, as in torch
    for function in (operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne):
        cases += [(f"{function.__name__} int float", function(ints, floats), function(torch_ints, torch_floats)),
                  (f"{function.__name__} float 2", function(floats, 2), function(torch_floats, 2)),
                  (f"{function.__name__} 2.0 float", function(2.0, floats), function(2.0, torch_floats))]
    assert_close_batch(cases)


def test_where_is_a_real_select(device: str) -> None:
    """The branch not taken never leaks: not a NaN, not an inf, not a division by zero computed there."""
    x = em.tensor([1.0, 0.0, -1.0, 4.0], device=device)
    tx = torch.tensor([1.0, 0.0, -1.0, 4.0])
    safe = em.where(x > 0, x.log(), em.zeros(4, device=device))
    assert_close(safe, torch.where(tx > 0, tx.log(), torch.zeros(4)))
    assert not np.isnan(safe.numpy()).any()
    ratio = em.where(x != 0, 1 / x, x)
    assert_close(ratio, torch.where(tx != 0, 1 / tx, tx))
    assert np.isfinite(ratio.numpy()).all()
    nan_branch = em.where(x < 10, x, em.tensor([np.nan, np.inf, -np.inf, np.nan], device=device))
    assert_close(nan_branch, tx)
    assert_close(x.sqrt().where(x > 0, -x), tx.sqrt().where(tx > 0, -tx))  # torch's method: self is the input
    assert_close(x.where(x > 0, 7), tx.where(tx > 0, 7))


def test_primitive_add_and_max_of_bools_are_or(device: str) -> None:
    """Op.ADD and Op.MAX on bool store True (1), not 2 or 255: comparing the result with True must hold."""
    from ember.core.ops import Op

    left, right = np.array([True, True, False, False]), np.array([True, False, True, False])
    a, b = em.tensor(left, device=device), em.tensor(right, device=device)
    ta, tb = torch.tensor(left), torch.tensor(right)
    assert_close_batch([
        ("add", a._apply(Op.ADD, b) == em.tensor(True, device=device), (ta + tb) == torch.tensor(True)),
        ("max", a._apply(Op.MAX, b) == em.tensor(True, device=device), torch.maximum(ta, tb) == torch.tensor(True)),
        ("+", (a + b) == True, (ta + tb) == True),  # noqa: E712 - the comparison is the point
    ])


def test_where_promotes_and_broadcasts_like_torch(device: str) -> None:
    condition = em.tensor([[True], [False]], device=device)
    torch_condition = torch.tensor([[True], [False]])
    small = em.tensor([1, 2, 3], dtype=em.int8, device=device)
    torch_small = torch.tensor([1, 2, 3], dtype=torch.int8)
    half = em.tensor([1.0, 2.0], dtype=em.float16, device=device)
    assert_close_batch([
        ("int8, 2.5", em.where(condition, small, 2.5), torch.where(torch_condition, torch_small, 2.5)),
        ("int8, 0-d int64", em.where(condition, small, em.tensor(300, device=device)),
         torch.where(torch_condition, torch_small, torch.tensor(300))),
        ("1, 2", em.where(condition, 1, 2), torch.where(torch_condition, 1, 2)),
        ("1, 2.0", em.where(condition, 1, 2.0), torch.where(torch_condition, 1, 2.0)),
        ("float16, 3.5", em.where(em.tensor([True, False], device=device), half, 3.5),
         torch.where(torch.tensor([True, False]), torch.tensor([1.0, 2.0], dtype=torch.float16), 3.5)),
    ])


def test_clamp_minimum_maximum_with_nan(device: str) -> None:
    data = np.array([-5.0, -1.0, 0.0, 0.5, 3.0, np.nan, np.inf, -np.inf], dtype=np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    low, high = em.tensor(data[::-1].copy(), device=device), em.tensor(np.full(8, 1.0, np.float32), device=device)
    torch_low, torch_high = torch.tensor(data[::-1].copy()), torch.ones(8)
    ints = em.tensor([-128, -5, 0, 127], dtype=em.int8, device=device)
    torch_ints = torch.tensor([-128, -5, 0, 127], dtype=torch.int8)
    assert_close_batch([
        ("clamp(-1, 2)", x.clamp(-1, 2), tx.clamp(-1, 2)),
        ("clamp(min)", x.clamp(min=0.25), tx.clamp(min=0.25)),
        ("clamp(max)", x.clamp(max=0), tx.clamp(max=0)),
        ("clamp(2, -1)", x.clamp(2, -1), tx.clamp(2, -1)),  # min > max gives max
        ("clamp(tensors)", x.clamp(low, high), tx.clamp(torch_low, torch_high)),
        ("maximum", x.maximum(low), tx.maximum(torch_low)),  # NaN propagates
        ("minimum", x.minimum(low), tx.minimum(torch_low)),
        ("fmax", x.fmax(low), tx.fmax(torch_low)),  # NaN ignored
        ("fmin", x.fmin(low), tx.fmin(torch_low)),
        ("int8 minimum", ints.minimum(ints.flip(0)), torch_ints.minimum(torch_ints.flip(0))),  # no overflow at -128
        ("int8 clamp", ints.clamp(-100, 100), torch_ints.clamp(-100, 100)),
        ("int8 clamp 0.5", ints.clamp(0.5), torch_ints.clamp(0.5)),  # promotes to float32 like torch
        ("bool clamp", em.tensor([True, False], device=device).clamp(0, 1), torch.tensor([True, False]).clamp(0, 1)),
    ])


def test_reflected_operators(device: str) -> None:
    data = random_array((3, 4), low=0.5, high=3.0)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    functions = {"2 + a": lambda a: 2 + a, "2 - a": lambda a: 2 - a, "2 * a": lambda a: 2 * a,
                 "2 / a": lambda a: 2 / a, "7 // a": lambda a: 7 // a, "7 % a": lambda a: 7 % a,
                 "2 ** a": lambda a: 2**a, "1.5 - a": lambda a: 1.5 - a, "-a": lambda a: -a, "+a": lambda a: +a,
                 "abs(-a)": lambda a: abs(-a), "float32 * a": lambda a: np.float32(2.0) * a}
    ints = em.tensor([1, 6, 12], device=device)
    torch_ints = torch.tensor([1, 6, 12])
    integer_functions = {"5 & a": lambda a: 5 & a, "5 | a": lambda a: 5 | a, "5 ^ a": lambda a: 5 ^ a,
                         "1 << a": lambda a: 1 << a, "4096 >> a": lambda a: 4096 >> a}
    assert_close_batch([(name, function(x), function(tx)) for name, function in functions.items()]
                       + [(name, function(ints), function(torch_ints)) for name, function in integer_functions.items()],
                       atol=1e-5, rtol=2e-6)


def test_in_place_operators(device: str) -> None:
    data = random_array((2, 3))
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    alias = x
    x += 1
    x *= em.tensor([1.0, 2.0, 3.0], device=device)
    x -= 0.5
    x /= 4
    x **= 2
    x //= 0.25
    x %= 3
    tx += 1
    tx *= torch.tensor([1.0, 2.0, 3.0])
    tx -= 0.5
    tx /= 4
    tx **= 2
    tx //= 0.25
    tx %= 3
    assert alias is x
    assert_close(x, tx)
    y, ty = em.tensor([5, 6, 7], device=device), torch.tensor([5, 6, 7])
    y.add_(2, alpha=3).mul_(2).sub_(1).clamp_(0, 30)
    y &= 29
    y |= 1
    y ^= 2
    y <<= 1
    y >>= 1
    ty.add_(2, alpha=3).mul_(2).sub_(1).clamp_(0, 30)
    ty &= 29
    ty |= 1
    ty ^= 2
    ty <<= 1
    ty >>= 1
    assert_close(y, ty)
    assert_close(y.fill_(4), ty.fill_(4))
    assert_close(y.zero_(), ty.zero_())


def test_in_place_result_must_fit_the_dtype_and_shape(device: str) -> None:
    ints = em.tensor([1, 2], device=device)
    with pytest.raises(em.DTypeError, match="result type float32 can't be cast to the dtype int64"):
        ints += 1.5
    with pytest.raises(em.DTypeError, match="float32.*int64"):
        ints /= 2
    flags = em.tensor([True, False], device=device)
    with pytest.raises(em.DTypeError, match="int64.*bool"):
        flags += 1
    small = em.zeros(3, device=device)
    with pytest.raises(em.ShapeError, match=r"shape \(2, 3\) does not fit the tensor of shape \(3,\)"):
        small += em.ones(2, 3, device=device)


@pytest.mark.parametrize("size", [0, 1, 3, 17, 1000])
def test_sizes_and_broadcasting(size: int, device: str) -> None:
    a = random_array((size,))
    b = random_array((3, 1), seed=1)
    c = random_array((size,), dtype=np.int32, seed=2)
    x, y, z = em.tensor(a, device=device), em.tensor(b, device=device), em.tensor(c, device=device)
    tx, ty, tz = torch.tensor(a), torch.tensor(b), torch.tensor(c)
    assert_close_batch([("x * y + z", x * y + z, tx * ty + tz),
                        ("where", em.where(x > 0, z, y), torch.where(tx > 0, tz, ty)),
                        ("z // 3 - z % 3", z // 3 - z % 3, tz // 3 - tz % 3)])


def test_non_contiguous_operands(device: str) -> None:
    a = random_array((6, 17))
    b = random_array((17, 6), seed=1)
    x, y, tx, ty = em.tensor(a, device=device), em.tensor(b, device=device), torch.tensor(a), torch.tensor(b)
    assert_close_batch([
        ("transposed", x + y.T, tx + ty.T),
        ("stepped", x[::2, 1::3] * y.T[::2, 1::3], tx[::2, 1::3] * ty.T[::2, 1::3]),
        ("expanded", x[:, :1].expand(6, 17) - y.T, tx[:, :1].expand(6, 17) - ty.T),
        ("flipped", em.where(x.T > 0, y, x.T.flip(1)), torch.where(tx.T > 0, ty, tx.T.flip(1))),
        ("sliced", x[2:5, 3:9] // y.T[1:4, ::3].maximum(em.tensor(0.5, device=device)),
         tx[2:5, 3:9] // ty.T[1:4, ::3].maximum(torch.tensor(0.5))),
    ])


def test_shape_errors_name_both_shapes() -> None:
    x, y = em.ones(2, 3), em.ones(4)
    for function in (operator.add, operator.mul, operator.lt, lambda a, b: a.maximum(b), lambda a, b: a ** b):
        with pytest.raises(em.ShapeError, match=r"\(2, 3\), \(4,\) cannot be broadcast.*sizes \[3, 4\]"):
            function(x, y)
    with pytest.raises(em.ShapeError, match=r"where: shapes .*\(5,\)"):
        em.where(em.ones(5, dtype=em.bool), x, 0.0)


def test_dtype_errors_name_the_dtypes() -> None:
    floats, flags = em.ones(2), em.ones(2, dtype=em.bool)
    with pytest.raises(em.DTypeError, match="bitwise_and: .*float32"):
        floats & floats
    with pytest.raises(em.DTypeError, match="bitwise not.*float32"):
        _ = ~floats
    with pytest.raises(em.DTypeError, match="shifts need integer tensors, got float32"):
        floats << 1
    with pytest.raises(em.DTypeError, match="subtraction with a bool operand"):
        flags - flags
    with pytest.raises(em.DTypeError, match="subtraction with a bool operand"):
        floats - True
    with pytest.raises(em.DTypeError, match="subtraction with a bool operand"):
        1 - flags
    with pytest.raises(em.DTypeError, match="floor_divide: not supported for bool"):
        flags // flags
    with pytest.raises(em.DTypeError, match="pow: bool"):
        flags**flags
    with pytest.raises(em.DTypeError, match="where: the condition must be a bool tensor, got float32"):
        em.where(floats, floats, floats)
    with pytest.raises(em.DTypeError, match="where: the condition must be a bool tensor, got float32"):
        flags.where(floats, 1.0)  # torch's order: input.where(condition, other)
    with pytest.raises(em.DTypeError, match="where: the condition must be a bool tensor, got bool"):
        floats.where(True, 1.0)
    with pytest.raises(em.DTypeError, match="masked_fill: mask must be a bool tensor"):
        floats.masked_fill(floats, 0.0)
    with pytest.raises(TypeError, match="unsupported operand type str"):
        floats + "a"
    for torch_call in (lambda: torch.ones(2) & torch.ones(2), lambda: torch.ones(2, dtype=torch.bool) - True):
        with pytest.raises((RuntimeError, TypeError, NotImplementedError)):
            torch_call()


def test_masked_fill_and_lerp(device: str) -> None:
    data = random_array((3, 4))
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    mask = em.tensor([[True, False, True, False]], device=device)
    torch_mask = torch.tensor([[True, False, True, False]])
    assert_close_batch([
        ("masked_fill -inf", x.masked_fill(mask, -np.inf), tx.masked_fill(torch_mask, -np.inf)),
        ("masked_fill 0-d", x.masked_fill(mask, em.tensor(2.0, device=device)),
         tx.masked_fill(torch_mask, torch.tensor(2.0))),
        ("lerp", x.lerp(em.zeros(3, 4, device=device), 0.25), tx.lerp(torch.zeros(3, 4), 0.25)),
        ("nan_to_num", x.nan_to_num(), tx.nan_to_num()),
    ])
    with pytest.raises(em.ShapeError, match=r"masked_fill: shapes \(3, 4\), \(2, 4\) cannot be broadcast"):
        x.masked_fill(em.ones(2, 4, dtype=em.bool, device=device), 0.0)
    with pytest.raises(em.ShapeError, match=r"mask of shape \(2, 1, 4\) must broadcast to the tensor's shape \(3, 4\)"):
        x.masked_fill(em.ones(2, 1, 4, dtype=em.bool, device=device), 0.0)


@pytest.mark.parametrize("dtype", [em.uint16, em.uint32, em.uint64])
def test_wide_unsigned_types_against_numpy(dtype: em.DType, device: str) -> None:
    """torch has almost no kernels for uint16/32/64; ember computes them like numpy (wraparound modulo 2**bits)."""
    top = np.iinfo(dtype.numpy).max
    left = np.array([0, 1, 7, 1000, top // 3, top - 1, top], dtype=dtype.numpy)
    right = np.array([1, 3, 7, 9, 2, top, 5], dtype=dtype.numpy)
    x, y = em.tensor(left, device=device), em.tensor(right, device=device)
    with np.errstate(over="ignore"):
        results = {"+": (x + y, left + right), "-": (x - y, left - right), "*": (x * y, left * right),
                   "//": (x // y, left // right), "%": (x % y, left % right),
                   "max": (x.maximum(y), np.maximum(left, right)), "min": (x.minimum(y), np.minimum(left, right)),
                   "<": (x < y, left < right), "&": (x & y, left & right),
                   ">> 3": (x >> 3, left >> 3), "<< 2": (x << 2, left << np.array(2, dtype=dtype.numpy)),
                   "~": (~x, ~left), "sum": (x.sum(), np.array(left.astype(np.uint64).sum().astype(np.int64))),
                   "amax": (x.amax(), left.max())}
    groups: dict[em.DType, list[str]] = {}
    for name, (actual, _) in results.items():
        assert actual.dtype.name == ("int64" if name == "sum" else "bool" if name == "<" else dtype.name), name
        groups.setdefault(actual.dtype, []).append(name)
    for names in groups.values():  # one kernel per result dtype
        values, start = em.cat([results[name][0].reshape(-1) for name in names]).numpy(), 0
        for name in names:
            expected = np.asarray(results[name][1]).reshape(-1)
            np.testing.assert_array_equal(values[start:start + expected.size], expected, err_msg=name)
            start += expected.size
