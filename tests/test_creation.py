"""Creation functions against PyTorch, and random numbers: deterministic, the same bits on every device, sane."""

import math

import numpy as np
import pytest
import torch

import ember as em
from tests.conftest import TEST_DEVICES
from tests.helpers import TORCH_DTYPES, assert_close, assert_close_batch


def test_tensor_from_data_infers_like_torch(device: str) -> None:
    for data in ([1.5, -2.0], [[1, 2], [3, 4]], [True, False], 3.5, 7, True, [], [[1, 2.5]], [True, 2],
                 np.arange(6, dtype=np.int16).reshape(2, 3), np.float64(2.5), np.array(4, dtype=np.uint8)):
        assert_close(em.tensor(data, device=device), torch.tensor(data))
    for dtype in TORCH_DTYPES:  # floats truncate toward zero when the dtype is an integer
        assert_close(em.tensor([[1.7, 0.0], [3.0, 2.2]], dtype=dtype, device=device),
                     torch.tensor([[1.7, 0.0], [3.0, 2.2]], dtype=torch.float64).to(TORCH_DTYPES[dtype]), atol=0,
                     rtol=0)
    assert_close(em.tensor(torch.tensor([1.0, 2.5], dtype=torch.bfloat16), device=device),
                 torch.tensor([1.0, 2.5], dtype=torch.bfloat16).float())
    assert em.tensor(2.5, device=device).shape == ()
    with pytest.raises(ValueError, match="ragged"):
        em.tensor([[1, 2], [3]])


def test_constant_creation(device: str) -> None:
    cases = []
    for em_function, torch_function in ((em.zeros, torch.zeros), (em.ones, torch.ones)):
        for size in ((), (0,), (3,), (2, 3), (1, 0, 4)):
            assert em_function(*size, device=device).shape == size  # f(2, 3) and f((2, 3)) both work
            cases += [(f"{em_function.__name__}{size}", em_function(size, device=device), torch_function(size)),
                      (f"{em_function.__name__}{size} int32", em_function(list(size), dtype=em.int32, device=device),
                       torch_function(list(size), dtype=torch.int32))]
    assert em.empty(2, 3, device=device).shape == (2, 3) and em.empty(2, device=device).dtype is em.float32
    cases += [(f"full {value!r}", em.full((2, 3), value, device=device), torch.full((2, 3), value))
              for value in (2.5, 7, True, -1.0)]
    cases.append(("full int64 3.7", em.full((2,), 3.7, dtype=em.int64, device=device),
                  torch.full((2,), 3.7).to(torch.int64)))
    assert_close_batch(cases, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [em.float16, em.bfloat16])
def test_constant_half_tensors(dtype: em.DType, device: str) -> None:
    """A kernel storing only a constant into a half buffer converts it (was `data0[gid] = 1.0f;` into ushort*)."""
    assert_close(em.full((3,), 1.5, dtype=dtype, device=device), torch.full((3,), 1.5, dtype=TORCH_DTYPES[dtype]))
    assert_close(em.full((), 1.0, device=device).to(dtype), torch.full((), 1.0).to(TORCH_DTYPES[dtype]))


def test_like_functions_keep_shape_dtype_device(device: str) -> None:
    source = em.tensor([[1, 2, 3]], dtype=em.int16, device=device)
    torch_source = torch.tensor([[1, 2, 3]], dtype=torch.int16)
    assert_close_batch([
        ("zeros_like", em.zeros_like(source), torch.zeros_like(torch_source)),
        ("ones_like", em.ones_like(source), torch.ones_like(torch_source)),
        ("full_like", em.full_like(source, 7.9), torch.full_like(torch_source, 7.9)),
        ("ones_like float64", em.ones_like(source, dtype=em.float64),
         torch.ones_like(torch_source, dtype=torch.float64)),
    ])
    assert em.empty_like(source).shape == (1, 3) and em.empty_like(source).dtype is em.int16
    for result in (em.zeros_like(source), em.rand_like(source, dtype=em.float32), em.randn_like(source.float())):
        assert result.device == source.device and result.shape == source.shape


def test_arange_like_torch(device: str) -> None:
    cases = [(f"arange{arguments}", em.arange(*arguments, device=device), torch.arange(*arguments))
             for arguments in [(5,), (0,), (2, 9), (2, 9, 3), (9, 2, -2), (-3, 3), (0.0, 1.0, 0.1), (1, 2.5, 0.5),
                               (0, 1, 0.3), (10.0, 0.0, -1.5), (5, 5)]]
    cases += [("float16", em.arange(6, dtype=em.float16, device=device), torch.arange(6, dtype=torch.float16)),
              ("int32", em.arange(0, 1000, 7, dtype=em.int32, device=device),
               torch.arange(0, 1000, 7, dtype=torch.int32))]
    cases += [(f"int64 {arguments}", em.arange(*arguments, dtype=em.int64, device=device),
               torch.arange(*arguments, dtype=torch.int64))  # integer dtypes truncate the arguments first
              for arguments in ((0, 5.5, 1), (0, 5, 1.5), (-2.5, 3, 2))]
    assert_close_batch(cases, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="step must be nonzero"):
        em.arange(0, 2.5, 0.5, dtype=em.int64)
    with pytest.raises(ValueError, match="step must be nonzero"):
        em.arange(0, 5, 0)
    with pytest.raises(ValueError, match="opposite signs"):
        em.arange(5, 0)
    with pytest.raises(ValueError, match="finite"):
        em.arange(0, math.inf)


def test_linspace_and_eye_like_torch(device: str) -> None:
    cases = [(f"linspace({start}, {end}, {steps})", em.linspace(start, end, steps, device=device),
              torch.linspace(start, end, steps))
             for start, end, steps in ((0, 1, 5), (-3.5, 7.25, 17), (1, 1, 3), (0, 10, 1), (2, -2, 0), (0, 1, 1000))]
    cases += [("linspace int64", em.linspace(0, 10, 5, dtype=em.int64, device=device),
               torch.linspace(0, 10, 5, dtype=torch.int64)),
              ("linspace float64", em.linspace(0, 1, 7, dtype=em.float64, device=device),
               torch.linspace(0, 1, 7, dtype=torch.float64), 1e-15, 1e-15),
              ("logspace", em.logspace(0, 3, 4, device=device), torch.logspace(0, 3, 4), 0, 2e-6)]
    cases += [(f"eye{arguments}", em.eye(*arguments, device=device), torch.eye(*arguments))
              for arguments in ((3,), (2, 4), (4, 2), (0,), (1, 0))]
    cases.append(("eye bool", em.eye(3, dtype=em.bool, device=device), torch.eye(3, dtype=torch.bool)))
    assert_close_batch(cases, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="steps must be non-negative"):
        em.linspace(0, 1, -1)
    with pytest.raises(em.ShapeError, match="eye: sizes must be non-negative, got -1 x -1"):
        em.eye(-1)


def test_negative_sizes_raise_naming_the_size() -> None:
    for call in (lambda: em.zeros(2, -1), lambda: em.ones((-3,)), lambda: em.full((1, -2), 0.0),
                 lambda: em.rand(-1), lambda: em.randn(2, -5), lambda: em.randint(0, 3, (-1,))):
        with pytest.raises(em.ShapeError, match=r"negative dimension in size \(.*-\d.*\)"):
            call()


def test_manual_seed_is_deterministic_and_draws_advance(device: str) -> None:
    em.manual_seed(7)
    first = em.rand(100, device=device).numpy()
    second = em.rand(100, device=device).numpy()
    em.manual_seed(7)
    np.testing.assert_array_equal(em.rand(100, device=device).numpy(), first)
    np.testing.assert_array_equal(em.rand(100, device=device).numpy(), second)
    assert not np.array_equal(first, second)
    em.manual_seed(8)
    assert not np.array_equal(em.rand(100, device=device).numpy(), first)


def _draw_everything(device: str) -> list[np.ndarray]:
    em.manual_seed(1234)
    return [em.rand(3000, device=device).numpy(), em.randn(3000, device=device).numpy(),
            em.randint(-50, 10**6, (3000,), device=device).numpy(),
            em.rand(500, dtype=em.float64, device=device).numpy(),
            em.randn(500, dtype=em.float64, device=device).numpy(),
            em.rand(300, dtype=em.float16, device=device).numpy(),
            em.randint(0, 2**40, (300,), device=device).numpy(), em.randperm(300, device=device).numpy()]


def test_same_seed_same_bits_on_every_device() -> None:
    """Integer hashing and fixed-point Box-Muller: bitwise equal across c and opencl (not merely close)."""
    assert len(TEST_DEVICES) >= 1
    reference = _draw_everything(TEST_DEVICES[0])
    for device in TEST_DEVICES[1:]:
        for expected, actual in zip(reference, _draw_everything(device)):
            assert expected.dtype == actual.dtype
            np.testing.assert_array_equal(actual.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("dtype", [em.float32, em.float64, em.float16, em.bfloat16], ids=lambda dtype: dtype.name)
def test_normal_draws_are_the_numpy_references_bits(device: str, dtype: em.DType,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """randn is the integer Box-Muller of tests/reference_random.py bit for bit (the same seeds and counters, past
    2**32 too), and the counter moves on by the two draws of each call."""
    from ember.core import creation
    from ember.core.creation import random_key
    from tests.helpers import require_dtypes
    from tests.reference_random import standard_normal

    require_dtypes(device, dtype)
    for seed, counter in ((0, 0), (7, 12345), (2**40 + 3, 2**32 - 100)):
        em.manual_seed(seed)
        monkeypatch.setattr(creation.RandomState, "counter", counter)
        for shape in ((1,), (64, 16), (4096,)):
            count = int(np.prod(shape))
            drawn = em.randn(*shape, dtype=dtype, device=device)
            expected = standard_normal(random_key(seed, counter), random_key(seed, counter + count), count,
                                       dtype is em.float64)
            if dtype in (em.float16, em.bfloat16):  # (float32 values rounded to the dtype: torch's rounding)
                rounded = torch.tensor(expected).to(getattr(torch, dtype.name)).float().numpy()
                np.testing.assert_array_equal(drawn.float().numpy().reshape(-1), rounded)
            else:
                np.testing.assert_array_equal(drawn.numpy().reshape(-1).view(np.uint8), expected.view(np.uint8))
            counter += 2 * count
        assert creation.RandomState.counter == counter


def test_rand_statistics(device: str) -> None:
    em.manual_seed(0)
    samples = em.rand(200_000, device=device).numpy().astype(np.float64)
    assert samples.min() >= 0.0 and samples.max() < 1.0
    assert abs(samples.mean() - 0.5) < 0.005 and abs(samples.var() - 1 / 12) < 0.002
    counts = np.bincount((samples * 20).astype(int), minlength=20)
    chi_squared = ((counts - 10_000) ** 2 / 10_000).sum()
    assert chi_squared < 45, chi_squared  # 19 degrees of freedom: p < 0.001
    assert abs(np.corrcoef(samples[:-1], samples[1:])[0, 1]) < 0.01  # neighbours independent
    for dtype in (em.float16, em.bfloat16, em.float64):
        values = em.rand(20_000, dtype=dtype, device=device)
        assert values.dtype is dtype
        array = values.numpy().astype(np.float64)
        assert array.min() >= 0.0 and array.max() < 1.0 and abs(array.mean() - 0.5) < 0.02


def test_randn_statistics(device: str) -> None:
    em.manual_seed(0)
    samples = em.randn(200_000, device=device).numpy().astype(np.float64)
    assert abs(samples.mean()) < 0.01 and abs(samples.std() - 1) < 0.01
    assert abs(((samples - samples.mean()) ** 3).mean()) < 0.03  # skewness
    assert abs((samples**4).mean() / samples.var() ** 2 - 3) < 0.06  # kurtosis of a normal
    # the fraction beyond each threshold against the normal distribution's tail, erfc(t / sqrt 2)
    for threshold in (1.0, 2.0, 3.0):
        assert abs((np.abs(samples) > threshold).mean() - math.erfc(threshold / math.sqrt(2))) < 0.003
    assert abs(np.corrcoef(samples[:-1], samples[1:])[0, 1]) < 0.01
    assert em.randn(3, 4, dtype=em.float64, device=device).dtype is em.float64


def test_randint_statistics_and_range(device: str) -> None:
    em.manual_seed(0)
    values = em.randint(-3, 7, (100_000,), device=device)
    assert values.dtype is em.int64
    counts = np.bincount(values.numpy() + 3, minlength=10)
    assert values.numpy().min() == -3 and values.numpy().max() == 6
    assert ((counts - 10_000) ** 2 / 10_000).sum() < 30  # 9 degrees of freedom: p < 0.001
    assert em.randint(5, (2, 3), device=device).shape == (2, 3)
    assert em.randint(10, size=(4,), dtype=em.int8, device=device).dtype is em.int8
    wide = em.randint(-(2**62), 2**62, (10_000,), device=device).numpy()
    assert wide.min() < -(2**60) and wide.max() > 2**60  # spans the range
    with pytest.raises(ValueError, match=r"high \(3\) must be greater than low \(3\)"):
        em.randint(3, 3, (2,))


def test_randperm_is_a_permutation(device: str) -> None:
    for count in (0, 1, 2, 17, 500):
        permutation = em.randperm(count, device=device)
        assert permutation.dtype is em.int64
        np.testing.assert_array_equal(np.sort(permutation.numpy()), np.arange(count))
    assert not np.array_equal(em.randperm(500, device=device).numpy(), np.arange(500))


def test_a_draw_is_computed_once_and_then_read(device: str) -> None:
    """Random tensors the user holds (randn, rand, randint, randperm, the in-place fills) are values, as torch's: the
    first realize that needs one stores it and later ones read it, instead of recomputing its draw inside each kernel
    that reads it (in a matmul, once per column tile: a 64 x 784 randn input ran 300x slower than a stored one)."""
    from ember.core.ops import Op
    from ember.scheduler.kernelize import kernelize
    from ember.scheduler.program import Launch

    weight = em.tensor(np.random.default_rng(0).standard_normal((96, 40)).astype(np.float32), device=device)
    filled = em.empty(64, 96, device=device)
    filled.normal_(0.0, 2.0)
    drawn = {"randn": em.randn(64, 96, device=device), "rand": em.rand(64, 96, device=device), "normal_": filled,
             "randint": em.randint(0, 9, (64, 96), device=device).float(),
             "randperm": em.randperm(96, device=device).float().reshape(1, 96).expand(64, 96)}
    for name, draw in drawn.items():
        first = (draw @ weight).numpy()
        product = draw @ weight
        (launch,) = [item for item in kernelize([product.node]) if isinstance(item, Launch)]  # the matmul alone
        assert Op.XOR not in {step.op for step in launch.kernel.steps}, name  # (no counter hashed: no draw made)
        np.testing.assert_array_equal(product.numpy(), first, err_msg=name)  # (the same values, read back)
        np.testing.assert_allclose(first, draw.numpy() @ weight.numpy(), rtol=1e-4, atol=1e-3, err_msg=name)


def test_permutation_from_tied_keys(device: str) -> None:
    """Ties between random keys (rare with 32-bit keys, but possible) still give a permutation."""
    from ember.core.creation import _permutation_from_keys

    for keys in ([5, 5, 5, 5], [3, 1, 3, 1, 2, 3], [7]):
        ranks = _permutation_from_keys(em.tensor(keys, dtype=em.uint32, device=device)).numpy()
        np.testing.assert_array_equal(np.sort(ranks), np.arange(len(keys)))
        np.testing.assert_array_equal(ranks, np.argsort(np.argsort(keys, kind="stable"), kind="stable"))


def test_random_dtype_errors() -> None:
    with pytest.raises(em.DTypeError, match="rand: random floats need a floating point dtype, got int64"):
        em.rand(3, dtype=em.int64)
    with pytest.raises(em.DTypeError, match="randn: .*got int32"):
        em.randn_like(em.zeros(2, dtype=em.int32))
    with pytest.raises(RuntimeError):
        torch.rand(3, dtype=torch.int64)
