"""How many threads the c backend runs a kernel on (backends/c.py kernel_threads): its estimated work counts loops
one after another as a sum and nested loops as a product, so a softmax over a few rows (three loops over each row)
runs on one thread while a matrix-vector product of a decoder's size is split across cores; and the OpenMP spin
setting the probe gives its runtime is not left in the environment for other libraries."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.backends.c import PARALLEL_THRESHOLD, _loop_work, kernel_threads
from ember.scheduler import compile_cache
from ember.scheduler.devices import get_device
from ember.scheduler.schedule import SCHEDULES

from tests.helpers import assert_close


def _compiled(graph: em.Tensor) -> list[Any]:
    """The compiled programs of the kernels the scheduler makes for `graph` (ops on realized tensors)."""
    program, _ = SCHEDULES.schedule([graph.node])
    return [compile_cache.compile_kernel(get_device("c:0"), step.kernel) for step in program.steps]


def test_loops_one_after_another_add_and_a_short_softmax_runs_on_one_thread() -> None:
    values = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    scores = em.tensor(values, device="c").realize()
    (compiled,) = _compiled(scores.softmax(-1))
    work = compiled.ir.global_size * _loop_work(compiled.ir)
    assert work < PARALLEL_THRESHOLD, work  # 4 rows x 3 loops over a row, not 4 x (a row's loop) ** 3
    assert kernel_threads(compiled.ir, 2) == 1
    assert_close(scores.softmax(-1).numpy(), torch.from_numpy(values).softmax(-1).numpy())


def test_nested_loops_multiply_and_a_matrix_vector_product_is_split_across_cores() -> None:
    generator = np.random.default_rng(1)
    weight = generator.standard_normal((2048, 640)).astype(np.float32)
    vector = generator.standard_normal((1, 640)).astype(np.float32)
    weight_tensor, vector_tensor = em.tensor(weight, device="c").realize(), em.tensor(vector, device="c").realize()
    (compiled,) = _compiled(vector_tensor @ weight_tensor.T)
    assert compiled.ir.global_size * _loop_work(compiled.ir) >= PARALLEL_THRESHOLD
    assert kernel_threads(compiled.ir, 2) == 2
    expected = torch.from_numpy(vector) @ torch.from_numpy(weight).T
    assert_close((vector_tensor @ weight_tensor.T).numpy(), expected.numpy(), atol=1e-4)


def test_an_integer_product_of_a_decoders_query_size_is_split_across_cores() -> None:
    """A token's product with a 1024 x 640 Q5_0 weight (Gemma-3's query projection) in integers: its loops of byte
    sums count a share of their iterations (INTEGER_LOOP_SHARE; gcc vectorizes them, yet each picks bits, multiplies
    and adds), enough to split it across cores (it ran on one thread: 55 us, 34 us on two); within the input's
    rounding of the product of gguf's dequantized weight."""
    pytest.importorskip("gguf", reason="the gguf package dequantizes the reference weight")
    from ember.io import QuantizedTensor
    from ember.io.quantized import FORMATS_BY_NAME
    from ember.io.quantized_dot import integer_matmul
    from tests.test_gguf import random_blocks
    from tests.test_quantized_dot import reference_weight, rounding_bound

    raw = random_blocks("Q5_0", rows=1024, blocks=20, seed=4)
    weight = QuantizedTensor(em.tensor(raw, device="c"), FORMATS_BY_NAME["Q5_0"], (1024, 640))
    weight = weight.interleaved().decoded_scales()
    vector = np.random.default_rng(5).standard_normal((1, 640)).astype(np.float32)
    product = integer_matmul(weight, em.tensor(vector, device="c").realize())
    heaviest = max(_compiled(product), key=lambda compiled: compiled.ir.global_size * _loop_work(compiled.ir))
    assert heaviest.ir.global_size == 1024 and kernel_threads(heaviest.ir, 2) == 2
    reference = reference_weight("Q5_0", raw)
    expected = vector.astype(np.float64) @ reference.T
    assert (np.abs(product.numpy() - expected) <= rounding_bound(reference, vector.astype(np.float64))).all()


SPIN_REPORT = """
import os
from ember.scheduler.devices import get_device
get_device("c")
maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
print(repr(os.environ.get("GOMP_SPINCOUNT")), "libgomp" in maps)
"""


@pytest.mark.parametrize(("environment", "expected"), [
    ({}, "None"),  # ember's own setting, read by its OpenMP runtime and not left for other libraries
    ({"GOMP_SPINCOUNT": "123"}, "'123'"),  # a user's setting wins and stays
    ({"OMP_WAIT_POLICY": "PASSIVE"}, "None"),
])
def test_the_openmp_spin_setting_is_read_at_probe_and_not_inherited(environment: dict[str, str],
                                                                    expected: str) -> None:
    """probe sets GOMP_SPINCOUNT for the runtime its kernels link and loads that runtime there, so the setting is
    read; then it leaves the environment as it found it: a libgomp loaded later (torch's own, imported after ember)
    or a child process would otherwise spin less too (torch's char_lstm step 13.7 -> 19-23 ms)."""
    base = {key: value for key, value in os.environ.items() if key not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    result = subprocess.run([sys.executable, "-c", SPIN_REPORT], env={**base, **environment}, capture_output=True,
                            text=True, timeout=120, check=True)
    spin, loaded = result.stdout.split()
    assert spin == expected
    if not environment and sys.platform.startswith("linux"):
        assert loaded == "True"  # (the runtime was loaded while the setting was in the environment)
