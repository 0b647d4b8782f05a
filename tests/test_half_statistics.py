"""float16 and bfloat16 statistics at real sizes against torch: sums, means, variances, norms and normalizations
over 10^5 values per row, where 16-bit intermediates overflow 65,504 (core/half_precision.py)."""

import numpy as np
import pytest
import torch

import ember as em
from tests.helpers import assert_close_batch, require_dtypes

F, TF = em.nn.functional, torch.nn.functional
WIDTH = 100_000  # per row: a sum of these values (about 1 each) is past float16's largest, 65,504
DTYPES = [(em.float16, torch.float16, 1e-2), (em.bfloat16, torch.bfloat16, 3e-2)]


def _rows(torch_dtype: torch.dtype) -> torch.Tensor:
    generator = np.random.default_rng(7)
    return torch.from_numpy((generator.random((4, WIDTH)) * 2).astype(np.float32)).to(torch_dtype)


def _cases(x, library, functional, labels):
    """The statistics of x (4 x WIDTH) computed by ember or torch, in one list (same order for both)."""
    weight = x[0] * 0 + 1.5
    return [
        x.sum(1), x.mean(1), x.mean(), x.var(1), x.std(), library.var_mean(x, 1)[0], library.std_mean(x, 1)[1],
        x.norm(), library.linalg.vector_norm(x, dim=1), x.logsumexp(1), x.softmax(1)[:, :5], x.log_softmax(1)[:, :5],
        functional.layer_norm(x, (WIDTH,), weight)[:, :5], functional.rms_norm(x, (WIDTH,))[:, :5],
        functional.group_norm(x.reshape(4, 4, WIDTH // 4), 2)[:, :, :5],
        functional.batch_norm(x.T, None, None, training=True)[:5],
        functional.instance_norm(x.reshape(2, 2, WIDTH))[:, :, :5],
        functional.mse_loss(x, x * 0), functional.l1_loss(x, x * 0),
        functional.cosine_similarity(x[:2], x[2:]), functional.normalize(x, dim=1)[:, :5], x @ x.T,
    ]


@pytest.mark.parametrize("ember_dtype, torch_dtype, tolerance", DTYPES, ids=["float16", "bfloat16"])
def test_half_statistics_over_long_rows_match_torch(device: str, ember_dtype, torch_dtype, tolerance) -> None:
    require_dtypes(device, ember_dtype)
    expected = _rows(torch_dtype)
    x = em.tensor(expected.float().numpy(), device=device).to(ember_dtype)
    got = _cases(x, em, F, None)
    want = _cases(expected, torch, TF, None)
    cases = []
    for position, (actual, reference) in enumerate(zip(got, want)):
        assert actual.dtype == ember_dtype, f"case {position}: {actual.dtype} (torch {reference.dtype})"
        cases.append((f"case {position}", actual.float(), reference.float(), tolerance, tolerance))
    # nanmean: torch counts the non-NaN values in float16 too (100,000 of them: inf, and inf / inf = NaN); the
    # mean computed in float64 is the truth
    truth = expected.double().mean(1).to(torch_dtype).float()
    cases.append(("nanmean", x.nanmean(1).float(), truth, tolerance, tolerance))
    assert_close_batch(cases)


def test_half_layer_norm_gradients_match_torch(device: str) -> None:
    require_dtypes(device, em.float16)
    expected = _rows(torch.float16)[:, :20_000].clone().requires_grad_()
    weight = torch.full((20_000,), 1.5, dtype=torch.float16, requires_grad=True)
    x = em.tensor(expected.detach().float().numpy(), device=device).to(em.float16).requires_grad_()
    ember_weight = em.full((20_000,), 1.5, dtype=em.float16, device=device).requires_grad_()
    upstream = np.linspace(-1, 1, 4 * 20_000, dtype=np.float32).reshape(4, 20_000)
    (F.layer_norm(x, (20_000,), ember_weight) * em.tensor(upstream, device=device).half()).sum().backward()
    (TF.layer_norm(expected, (20_000,), weight) * torch.from_numpy(upstream).half()).sum().backward()
    assert x.grad.dtype == em.float16 and ember_weight.grad.dtype == em.float16
    assert_close_batch([("input gradient", x.grad.float(), expected.grad.float(), 2e-2, 2e-2),
                        ("weight gradient", ember_weight.grad.float(), weight.grad.float(), 2e-1, 2e-2)])


def test_half_sum_past_the_largest_float16_is_inf_like_torch(device: str) -> None:
    """The float32 partials of a long float16 sum are rounded once at the end: inf past 65,504, exact below."""
    require_dtypes(device, em.float16)
    ones = np.ones(200_000, np.float16)
    assert np.isinf(em.tensor(ones, device=device).sum().float().item())
    assert em.tensor(ones[:60_000], device=device).sum().item() == 60_000
    assert em.tensor(ones, device=device).mean().item() == 1.0


def test_float16_results_read_back_as_float32_round_and_overflow_like_torch(device: str) -> None:
    """A float16 value used as float32 in the kernel that makes it is rounded to float16 first: row sums of 4 rows
    (a loop gcc's vectorizer takes 4 at a time), past 65,504 (inf) and between float16's values. gcc 12's -O3 at
    -march=native dropped the round trip where the CPU has AVX512-FP16 (backends/c.py half_precision_flags)."""
    require_dtypes(device, em.float16, em.bfloat16)
    rows = np.array([[14_300.0] * 7, [0.1] * 7, [-14_300.0] * 7, [1 / 3] * 7], np.float32)
    for ember_dtype, torch_dtype in [(em.float16, torch.float16), (em.bfloat16, torch.bfloat16)]:
        actual = em.tensor(rows, device=device).sum(1).to(ember_dtype).float().numpy()
        expected = torch.from_numpy(rows).sum(1).to(torch_dtype).float().numpy()
        np.testing.assert_array_equal(actual, expected, err_msg=f"{ember_dtype}")


def test_c_kernels_are_built_without_avx512_fp16_where_the_compiler_targets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.backends import c as c_backend

    for traits, expected in [({"__AVX512F__", "__AVX512FP16__", "__GNUC__"}, True),
                             ({"__AVX512F__", "__GNUC__"}, False)]:
        monkeypatch.setattr(c_backend, "compiler_traits", lambda compiler, found=frozenset(traits): found)
        assert ("-mno-avx512fp16" in c_backend.compiler_command()) == expected
        assert ("-mno-avx512fp16" in c_backend.quick_compiler_command()) == expected
