"""Reductions against PyTorch: dims (int, tuple, negative, None, ()), keepdim, empty tensors, NaN, dtype rules."""

import warnings

import numpy as np
import pytest
import torch

import ember as em
from tests.helpers import TORCH_DTYPES, assert_close, assert_close_batch, random_array

DIMS = [None, 0, -1, 1, (0, 2), (-1, 0), ()]
DATA = random_array((3, 4, 5))


def _call(tensor, name: str, dim, keepdim: bool, **kwargs):
    method = getattr(tensor, name)
    if dim is None:
        return method(**kwargs) if not keepdim else method(dim=None, keepdim=True, **kwargs)
    return method(dim, keepdim=keepdim, **kwargs)


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "logsumexp", "var", "std", "any", "all"])
def test_reductions_over_every_kind_of_dim(name: str, device: str) -> None:
    data = DATA if name not in ("any", "all") else (DATA > 0.5)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    cases = []
    for dim in DIMS:
        if name == "logsumexp" and dim in (None, ()):
            continue  # torch requires a dim
        if name in ("any", "all") and dim in (None, (0, 2), (-1, 0), ()):
            continue  # torch's any/all take one dim; over every element see test_any_all_over_every_element
        for keepdim in (False, True) if dim in (None, -1, (0, 2)) else (False,):
            cases.append((f"{name} dim={dim} keepdim={keepdim}", _call(x, name, dim, keepdim),
                          _call(tx, name, dim, keepdim)))
    assert_close_batch(cases, atol=1e-5, rtol=2e-6)


@pytest.mark.parametrize("name", ["prod", "max", "min", "argmax", "argmin"])
def test_single_dim_reductions(name: str, device: str) -> None:
    x, tx = em.tensor(DATA, device=device), torch.tensor(DATA)
    cases = [(f"{name}()", getattr(x, name)(), getattr(tx, name)())]
    for dim in (0, -1, 1):
        for keepdim in (False, True) if dim == -1 else (False,):
            result, expected = getattr(x, name)(dim, keepdim), getattr(tx, name)(dim, keepdim)
            label = f"{name}({dim}, keepdim={keepdim})"
            if name in ("max", "min"):
                assert isinstance(result, tuple) and result._fields == ("values", "indices")
                cases += [(label + " values", result.values, expected.values),
                          (label + " indices", result.indices, expected.indices)]
            else:
                cases.append((label, result, expected))
    if name in ("argmax", "argmin"):
        cases.append((f"{name}(keepdim)", getattr(x, name)(keepdim=True), getattr(tx, name)(keepdim=True)))
    assert_close_batch(cases, rtol=2e-6)


def test_result_dtypes_like_torch(device: str) -> None:
    """The result dtype of every reduction for every input dtype (inferred, no kernel), values for a few."""
    for dtype in (em.bool, em.uint8, em.int8, em.int32, em.int64, em.float16, em.bfloat16, em.float64):
        x = em.zeros(3, 4, 5, dtype=dtype)
        tx = torch.zeros(3, 4, 5, dtype=getattr(torch, dtype.name))
        for name in ("sum", "prod", "cumsum", "amax", "any", "all", "argmax", "logsumexp", "mean", "var"):
            try:
                expected = getattr(tx, name)(1)
            except RuntimeError:
                with pytest.raises(em.DTypeError):
                    getattr(x, name)(1)
                continue
            assert TORCH_DTYPES[getattr(x, name)(1).dtype] == expected.dtype, (name, dtype)
        assert TORCH_DTYPES[x.max(2).indices.dtype] == tx.max(2).indices.dtype
        assert TORCH_DTYPES[x.sum(dtype=em.float64).dtype] == tx.sum(dtype=torch.float64).dtype
    cases = []
    for dtype in (em.bool, em.uint8, em.float16):
        data = (DATA * 10).astype(np.int64)
        data = data > 3 if dtype is em.bool else np.abs(data).astype(np.uint8) if dtype is em.uint8 else data
        torch_data = torch.tensor(data).to(getattr(torch, dtype.name))
        x = em.tensor(torch_data.numpy(), dtype=dtype, device=device)
        cases += [(f"{name} {dtype.name}", getattr(x, name)(1), getattr(torch_data, name)(1))
                  for name in ("sum", "prod", "cumsum", "amax", "any", "all")]
        cases.append((f"max indices {dtype.name}", x.max(2).indices, torch_data.max(2).indices))
    ints = em.tensor([[1, 2], [3, 4]], device=device)
    torch_ints = torch.tensor([[1, 2], [3, 4]])
    cases += [("sum(dtype=float64)", ints.sum(dtype=em.float64), torch_ints.sum(dtype=torch.float64)),
              ("mean(dtype=float32)", ints.mean(1, dtype=em.float32), torch_ints.mean(1, dtype=torch.float32)),
              ("logsumexp int", ints.logsumexp(1), torch_ints.logsumexp(1))]
    assert_close_batch(cases, rtol=2e-2)


def test_empty_tensors_and_zero_size_dims(device: str) -> None:
    cases = []
    for shape in ((0,), (3, 0), (2, 0, 4)):
        data = np.zeros(shape, dtype=np.float32)
        x, tx = em.tensor(data, device=device), torch.tensor(data)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that var's degrees of freedom are <= 0
            cases += [
                (f"sum {shape}", x.sum(), tx.sum()), (f"sum(0) {shape}", x.sum(0), tx.sum(0)),
                (f"prod(-1) {shape}", x.prod(-1), tx.prod(-1)), (f"mean {shape}", x.mean(), tx.mean()),  # NaN
                (f"mean(0) {shape}", x.mean(0), tx.mean(0)), (f"var {shape}", x.var(), tx.var()),
                (f"logsumexp(-1) {shape}", x.logsumexp(-1), tx.logsumexp(-1)),  # -inf
                (f"any {shape}", x.any(), tx.any()), (f"all {shape}", x.all(), tx.all()),
                (f"any(-1) {shape}", x.any(-1), tx.any(-1)), (f"cumsum(0) {shape}", x.cumsum(0), tx.cumsum(0)),
                (f"count_nonzero {shape}", x.count_nonzero(), tx.count_nonzero()),
            ]
    zero_rows, torch_zero_rows = em.zeros(0, 3, device=device), torch.zeros(0, 3)
    cases += [("amax(1) (0, 3)", zero_rows.amax(1), torch_zero_rows.amax(1)),
              ("argmax(1) (0, 3)", zero_rows.argmax(1), torch_zero_rows.argmax(1)),
              ("max(1) (0, 3)", zero_rows.max(1).values, torch_zero_rows.max(1).values)]
    assert_close_batch(cases)


def test_empty_reduction_errors_name_the_shape_and_dim() -> None:
    empty = em.zeros(0, 3)
    with pytest.raises(em.ShapeError, match=r"max: cannot reduce over the zero-size dim 0 of a tensor of shape \(0, "):
        empty.max()
    with pytest.raises(em.AxisError, match=r"amax: .*zero-size dim 0 .*\(0, 3\)"):
        empty.amax(0)
    with pytest.raises(em.AxisError, match=r"argmax: the tensor of shape \(0, 3\) is empty"):
        empty.argmax()
    with pytest.raises(em.AxisError, match="zero-size dim 0"):
        empty.max(0)
    with pytest.raises(em.AxisError, match="zero-size dim 0"):
        empty.argmin(0)
    for torch_call in (lambda: torch.zeros(0, 3).max(), lambda: torch.zeros(0, 3).amax(0),
                       lambda: torch.zeros(0, 3).argmax(0)):
        with pytest.raises((RuntimeError, IndexError)):
            torch_call()


def test_nan_propagates_through_max_min_and_argmax(device: str) -> None:
    data = np.array([[1.0, np.nan, 3.0, np.nan], [4.0, 2.0, -np.inf, 0.0], [np.inf, 5.0, np.nan, 1.0]],
                    dtype=np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    cases = []
    for dim in (0, 1):
        cases += [(f"amax({dim})", x.amax(dim), tx.amax(dim)), (f"amin({dim})", x.amin(dim), tx.amin(dim)),
                  (f"argmax({dim})", x.argmax(dim), tx.argmax(dim)),  # the first NaN
                  (f"argmin({dim})", x.argmin(dim), tx.argmin(dim)),
                  (f"max({dim}).indices", x.max(dim).indices, tx.max(dim).indices),
                  (f"min({dim}).values", x.min(dim).values, tx.min(dim).values),
                  (f"logsumexp({dim})", x.logsumexp(dim), tx.logsumexp(dim))]
    cases += [("max()", x.max(), tx.max()), ("argmax()", x.argmax(), tx.argmax()), ("sum(1)", x.sum(1), tx.sum(1)),
              ("row without NaN", x[1].max(), tx[1].max())]
    assert_close_batch(cases)


def test_ties_pick_the_first_index_and_integer_extremes(device: str) -> None:
    data = np.array([[2, 7, 7, 1], [-128, 5, -128, 127], [3, 3, 3, 3]], dtype=np.int8)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    unsigned = em.tensor([[0, 255, 3]], dtype=em.uint8, device=device)
    cases = [("uint8 amin", unsigned.amin(1), torch.tensor([[0, 255, 3]], dtype=torch.uint8).amin(1))]
    for dim in (0, 1):
        cases += [(f"argmax({dim})", x.argmax(dim), tx.argmax(dim)), (f"argmin({dim})", x.argmin(dim), tx.argmin(dim)),
                  (f"amin({dim})", x.amin(dim), tx.amin(dim))]  # -128 has no negation in int8: min must not overflow
    assert_close_batch(cases)


def test_logsumexp_is_stable(device: str) -> None:
    data = np.array([[1000.0, 1000.0, -np.inf], [-1000.0, -1000.0, -1001.0], [-np.inf, -np.inf, -np.inf],
                     [np.inf, 0.0, 1.0]], dtype=np.float32)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    assert_close_batch([("logsumexp(1)", x.logsumexp(1), tx.logsumexp(1)),
                        ("logsumexp(-1, keepdim)", x.logsumexp(-1, keepdim=True), tx.logsumexp(-1, keepdim=True))])


def test_var_and_std_corrections(device: str) -> None:
    x, tx = em.tensor(DATA, device=device), torch.tensor(DATA)
    cases = []
    pair = em.tensor([1.0, 2.0], device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that the degrees of freedom are <= 0
        for kwargs in ({"correction": 0}, {"correction": 2}, {"unbiased": False}, {"correction": 5}):
            cases += [(f"var {kwargs}", x.var(1, **kwargs), tx.var(1, **kwargs)),
                      (f"std {kwargs}", x.std((0, 2), keepdim=True, **kwargs), tx.std((0, 2), keepdim=True, **kwargs))]
        cases += [("n - correction = 0: inf", pair.var(correction=2), torch.tensor([1.0, 2.0]).var(correction=2)),
                  ("one element: NaN", pair[:1].std(), torch.tensor([1.0]).std())]
    variance, mean = x.var_mean(0)
    torch_variance, torch_mean = torch.var_mean(tx, 0)
    cases += [("var_mean variance", variance, torch_variance), ("var_mean mean", mean, torch_mean)]
    assert_close_batch(cases, rtol=2e-6)


def test_zero_dim_tensors(device: str) -> None:
    x, tx = em.tensor(2.5, device=device), torch.tensor(2.5)
    cases = [(f"{name}({dim})", getattr(x, name)(dim), getattr(tx, name)(dim))
             for name in ("sum", "mean", "amax", "argmax", "logsumexp", "cumsum", "prod") for dim in (0, -1)]
    cases += [("sum()", x.sum(), tx.sum()), ("max(0).indices", x.max(0).indices, tx.max(0).indices)]
    assert_close_batch(cases)


@pytest.mark.parametrize("size", [0, 1, 3, 17, 1000])
def test_sizes(size: int, device: str) -> None:
    data = random_array((2, size), seed=size)
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    cases = [("sum(1)", x.sum(1), tx.sum(1)), ("sum()", x.sum(), tx.sum()), ("cumsum(1)", x.cumsum(1), tx.cumsum(1))]
    if size:
        cases += [("max(1).values", x.max(1).values, tx.max(1).values), ("argmin()", x.argmin(), tx.argmin()),
                  ("mean(-1)", x.mean(-1), tx.mean(-1))]
    assert_close_batch(cases, rtol=1e-5, atol=1e-4)


def test_non_contiguous_inputs(device: str) -> None:
    data = random_array((6, 17))
    x, tx = em.tensor(data, device=device), torch.tensor(data)
    assert_close_batch([
        ("transposed sum", x.T.sum(0), tx.T.sum(0)), ("stepped amax", x[::2, 1::3].amax(1), tx[::2, 1::3].amax(1)),
        ("expanded mean", x[:, :1].expand(6, 17).mean(1), tx[:, :1].expand(6, 17).mean(1)),
        ("flipped argmax", x.flip(1).argmax(1), tx.flip(1).argmax(1)),
        ("sliced cumsum", x.T[3:9].cumsum(0), tx.T[3:9].cumsum(0)),
        ("logsumexp", x[1::2].T.logsumexp(0), tx[1::2].T.logsumexp(0)),
    ], rtol=1e-5)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 16, 31, 64, 100, 255, 256, 511, 999, 1000])
def test_cumsum_sizes(size: int, device: str) -> None:
    floats = random_array((size,), seed=size)
    integers = np.random.default_rng(size).integers(-(2**40), 2**40, (2, size))
    assert_close(em.tensor(floats, device=device).cumsum(0), torch.tensor(floats).cumsum(0), rtol=1e-5, atol=1e-4)
    assert_close(em.tensor(integers, device=device).cumsum(-1), torch.tensor(integers).cumsum(-1))  # exact


def test_cumsum_dims_and_dtypes(device: str) -> None:
    x, tx = em.tensor(DATA, device=device), torch.tensor(DATA)
    flags = em.tensor(DATA > 0, device=device)
    cases = [(f"cumsum({dim})", x.cumsum(dim), tx.cumsum(dim)) for dim in (0, 1, 2, -1, -3)]
    cases += [("bool", flags.cumsum(1), torch.tensor(DATA > 0).cumsum(1)),
              ("dtype=float64", x.cumsum(1, dtype=em.float64), tx.cumsum(1, dtype=torch.float64))]
    assert_close_batch(cases, rtol=1e-5)


def test_axis_errors_name_the_dim_and_the_valid_range() -> None:
    x = em.ones(2, 3)
    for call in (lambda: x.sum(2), lambda: x.mean(-3), lambda: x.amax((0, 5)), lambda: x.argmax(2),
                 lambda: x.cumsum(2), lambda: x.max(-3), lambda: x.var(4), lambda: x.any(2)):
        with pytest.raises(em.AxisError, match=r"dim -?\d is out of range for a tensor of rank 2 \(valid: -2 to 1\)"):
            call()
    with pytest.raises(em.ArgumentError, match="repeats an axis"):  # a RuntimeError, as torch raises
        x.sum((0, -2))
    with pytest.raises(TypeError, match="dim must be a single int"):
        x.max((0, 1))


def test_dtype_errors() -> None:
    ints, flags = em.tensor([1, 2]), em.tensor([True, False])
    with pytest.raises(em.DTypeError, match="mean: .*floating point tensor, got int64"):
        ints.mean()
    with pytest.raises(em.DTypeError, match="mean: .*got bool"):
        flags.mean()
    with pytest.raises(em.DTypeError, match="var/std: .*got int64"):
        ints.var()
    with pytest.raises(em.DTypeError, match="argmax: bool tensors are not supported"):
        flags.argmax()
    with pytest.raises(em.DTypeError, match="argmin: bool"):
        flags.argmin(0)
    for torch_call in (lambda: torch.tensor([1, 2]).mean(), lambda: torch.tensor([1, 2]).var(),
                       lambda: torch.tensor([True]).argmax()):
        with pytest.raises(RuntimeError):
            torch_call()


def test_any_all_of_bytes(device: str) -> None:
    """A max over 0/1 bytes is rendered as an OR (gcc 12's SLP vectorizer gave 255 for a byte max made by `!`)."""
    rows = np.array([[1, 0, 1, 0], [1, 1, 1, 0], [0, 0, 1, 1]]) > 0
    small = (np.abs(DATA) * 3).astype(np.uint8)
    x, tx = em.tensor(rows, device=device), torch.tensor(rows)
    y, ty = em.tensor(small, device=device), torch.tensor(small)
    assert_close(x.all(-1), tx.all(-1))  # each on its own: in a batch the kernel changes and the bug hides
    assert_close(x.all(), tx.all())
    assert_close(y.any(), ty.any())
    assert_close(y.all(), ty.all())


def test_cummax_values_and_indices_like_torch(device: str) -> None:
    """torch.cummax's (values, indices): the last index where the running maximum was reached; a NaN stays."""
    ties = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 5.0], [0.0, 0.0, -1.0, 0.0]], dtype=np.float32)
    cases = [(ties, 1), (ties, 0), (ties, -1), (np.array([1.0, np.nan, 2.0, np.nan, 0.0], dtype=np.float32), 0),
             (np.array([True, False, True]), 0), (np.array([4, -2, 7, 7], dtype=np.int32), 0),
             (np.zeros((2, 0), dtype=np.float32), 1)]
    checks = []
    for data, dim in cases:
        mine, theirs = em.tensor(data, device=device).cummax(dim), torch.tensor(data).cummax(dim)
        checks += [(f"values {data.dtype} {dim}", mine.values, theirs.values),
                   (f"indices {data.dtype} {dim}", mine.indices, theirs.indices)]
    assert_close_batch(checks)


@pytest.mark.parametrize("function", ["exp", "sin", "log", "softmax", "sigmoid"])
def test_argmax_of_a_computed_value_finds_its_maximum_against_torch(function: str, device: str) -> None:
    """argmax compares each value with its row's maximum, which another kernel reduces: a lazy value with a
    transcendental in it is stored once for both (core/read_alike.py). Computed again in each, gcc vectorized one
    kernel (libmvec's exp2, sin, log2) and not the other (libm's), the bits differed, and exp(x).argmax(0) returned
    the row count for 183 of 480 float32 and float64 cases on c. argmax, argmin and max's indices over both axes and
    the whole tensor, float32 (and float64 where the device has it), at 64 x 33 and 300 x 1000; a realized input is
    read as it is (no copy)."""
    from ember.core.ops import Op
    from ember.core.read_alike import read_alike
    from ember.scheduler.devices import get_device

    def apply(tensor: em.Tensor | torch.Tensor) -> em.Tensor | torch.Tensor:
        if function == "log":
            return (tensor.abs() + 1).log()
        if function == "softmax":
            return tensor.softmax(-1)
        return getattr(tensor, function)()

    supported = get_device(device).info.supported_dtypes
    dtypes = [np.float32] + ([np.float64] if em.float64 in supported else [])
    for dtype in dtypes:
        for shape, seed in (((64, 33), 0), ((300, 1000), 1)):
            data = random_array(shape, seed=seed).astype(dtype)
            x, tx = em.tensor(data, device=device), apply(torch.from_numpy(data))
            values = apply(x).numpy()  # (ember's own values: the indices must point at their first extreme)
            for axis in (0, 1):
                found = {"argmax": apply(x).argmax(axis).numpy(), "argmin": apply(x).argmin(axis).numpy(),
                         "max": apply(x).max(axis).indices.numpy()}
                for name, indices in found.items():
                    expected = (values.argmin if name == "argmin" else values.argmax)(axis)
                    np.testing.assert_array_equal(indices, expected, err_msg=f"{name} over axis {axis}")
                if shape == (64, 33):  # (at 300 x 1000, near ties: the last bits of ember's and torch's sin differ)
                    np.testing.assert_array_equal(found["argmax"], tx.argmax(axis).numpy())
                    np.testing.assert_array_equal(found["argmin"], tx.argmin(axis).numpy())
            assert int(apply(x).argmax().item()) == int(values.argmax())
    realized = em.tensor(random_array((8, 5), seed=2), device=device)
    view = realized.T[1:]
    assert read_alike(realized) is realized and read_alike(view) is view  # (a buffer and a view of it: no copy)
    assert read_alike(realized.exp()).node.op is Op.CONTIGUOUS
    stored = read_alike(realized.exp())
    stored_view = stored.T
    assert read_alike(stored) is stored and read_alike(stored_view) is stored_view  # (stored once: not again)


@pytest.mark.parametrize("function", ["exp", "sin", "log"])
def test_order_statistics_and_max_gradients_of_a_computed_value_against_torch(function: str, device: str) -> None:
    """Every op that compares a value with a reduce, a scan or a sort of that value reads one stored copy of a
    computed one (core/read_alike.py): computed again in two kernels, its bits differed on c (libm against libmvec)
    and, more rarely, on opencl. Before: `x.exp().cummin(1).indices` held -1 in each of 20 cases on c, the gradient
    of `x.sin().amax(0)` was 0 in whole columns (the backward's comparison with the forward's maximum matched
    nothing), median() could miss its own value. cummax and cummin indices over both axes, the gradients of amax,
    amin, max() and min(), median (whole and along a dim, with its gradient), kthvalue, topk, sort, mode and quantile,
    at 64 x 33 float32, against torch."""

    def apply(tensor: em.Tensor | torch.Tensor) -> em.Tensor | torch.Tensor:
        return (tensor.abs() + 1).log() if function == "log" else getattr(tensor, function)()

    data = random_array((64, 33), seed=3).astype(np.float32)
    x, tx = em.tensor(data, device=device), torch.from_numpy(data)
    checks: list = []
    for axis in (0, 1):
        for name in ("cummax", "cummin"):
            mine, theirs = getattr(apply(x), name)(axis), getattr(apply(tx), name)(axis)
            checks += [(f"{name} indices {axis}", mine.indices, theirs.indices),
                       (f"{name} values {axis}", mine.values, theirs[0])]
        mine_median, theirs_median = apply(x).median(axis), apply(tx).median(axis)
        checks += [(f"median values {axis}", mine_median.values, theirs_median.values),
                   (f"median indices {axis}", mine_median.indices, theirs_median.indices),
                   (f"kthvalue {axis}", apply(x).kthvalue(5, axis).indices, apply(tx).kthvalue(5, axis).indices),
                   (f"topk {axis}", apply(x).topk(4, axis).indices, apply(tx).topk(4, axis).indices),
                   (f"sort {axis}", apply(x).sort(axis).indices, apply(tx).sort(axis).indices),
                   (f"mode {axis}", apply(x).mode(axis).values, apply(tx).mode(axis).values)]
    checks += [("median", apply(x).median(), apply(tx).median()),
               ("quantile", apply(x).quantile(0.3), apply(tx).quantile(0.3))]
    weights = random_array((64, 33), seed=4).astype(np.float32)
    reductions = {"amax 0": lambda value: value.amax(0), "amax 1": lambda value: value.amax(1),
                  "amin 0": lambda value: value.amin(0), "max()": lambda value: value.max(),
                  "min()": lambda value: value.min(), "median()": lambda value: value.median(),
                  "cummax 0": lambda value: value.cummax(0)[0]}
    for name, reduce in reductions.items():
        leaf = em.tensor(data, device=device, requires_grad=True)
        torch_leaf = torch.from_numpy(data).requires_grad_()
        result, torch_result = reduce(apply(leaf)), reduce(apply(torch_leaf))
        scale = weights.reshape(-1)[:result.numel()].reshape(tuple(result.shape))
        (result * em.tensor(scale, device=device)).sum().backward()
        (torch_result * torch.from_numpy(scale)).sum().backward()
        checks.append((f"gradient of {name}", leaf.grad, torch_leaf.grad))
    assert_close_batch(checks, rtol=1e-4, atol=1e-5)
