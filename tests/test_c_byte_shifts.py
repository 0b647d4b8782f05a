"""Bytes shifted right by one amount for every lane of a vector (the c backend's ember_shr_uint8xN helper: 16-bit
word shifts and a mask, where gcc widened every byte): a product over bits picked per run of bytes with amounts 0 to 7
(as the quantized formats pick theirs) gives numpy's values, and its kernel uses the helper."""

from __future__ import annotations

import numpy as np
import pytest

import ember as em
from ember.io.quantized import _shift_right, _shifts
from ember.scheduler import compile_cache
from ember.scheduler.devices import get_device
from ember.scheduler.schedule import SCHEDULES


@pytest.mark.parametrize("step", [1, 2, 4])
def test_bytes_shifted_by_one_amount_per_run_match_numpy(step: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_NOOPT", "0")  # vector lanes are an optional transform: this test is about them
    runs = 8 // step
    values = np.random.default_rng(step).integers(0, 256, (64, runs, 32), dtype=np.uint8)
    weights = np.random.default_rng(step + 10).standard_normal((1, runs, 32)).astype(np.float32)
    blocks = em.tensor(values, device="c").realize()
    bits = _shift_right(blocks, _shifts(step, (runs, 1), "c")) & 0x3F
    product = (em.tensor(weights, device="c") * bits.cast(em.float32)).sum((-2, -1))
    program, _ = SCHEDULES.schedule([product.node])
    sources = [get_device("c:0").renderer.render(compile_cache.compile_kernel(get_device("c:0"), item.kernel).ir)
               for item in program.steps]
    expected_bits = (values >> (np.arange(runs, dtype=np.uint8) * step).reshape(runs, 1)) & 0x3F
    expected = (weights.astype(np.float64) * expected_bits).sum((-2, -1))
    np.testing.assert_allclose(product.numpy(), expected, rtol=1e-5, atol=1e-3)
    assert any("ember_shr_uint8x" in source for source in sources), "the kernel shifts its bytes another way"


def test_bytes_shifted_by_eight_or_more_are_zero_as_in_numpy() -> None:
    values = np.random.default_rng(0).integers(0, 256, (16, 2, 32), dtype=np.uint8)
    amounts = np.array([8, 0], dtype=np.uint8).reshape(2, 1)
    shifted = em.tensor(values, device="c") >> em.tensor(amounts, device="c")
    np.testing.assert_array_equal(shifted.numpy(), values >> amounts)
