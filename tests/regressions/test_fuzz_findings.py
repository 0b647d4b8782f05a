"""Failures the fuzzer found, each kept as a test. An open one is xfail(strict=True) on the backends where it fails:
when it is fixed the test passes, the strict marker turns that into a failure, and the marker must go."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember as em
from ember.testing.reference import ReferenceTensor


def known_bug(request: pytest.FixtureRequest, device: str, backends: set[str], reason: str) -> None:
    """Mark this test as an expected failure on `backends` (strict: passing there fails the test)."""
    if device.split(":")[0] in backends:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


def test_realize_a_constant_with_its_consumer(device: str, request: pytest.FixtureRequest) -> None:
    known_bug(request, device, {"c", "opencl", "wgpu"},
              "scheduler/realize.py: realizing a lazy constant (em.full) together with a consumer of it raises "
              "AttributeError: 'NoneType' object has no attribute 'handle'")
    constant = em.full((2,), 1.5, device=device)
    negated = -constant
    em.realize(negated, constant)
    assert negated.tolist() == [-1.5, -1.5] and constant.tolist() == [1.5, 1.5]


def test_a_view_of_a_constant_realized_with_its_reduction(device: str, request: pytest.FixtureRequest) -> None:
    known_bug(request, device, {"c", "opencl", "wgpu"},
              "scheduler/realize.py: the same bug through views that return the constant itself (pad by 0)")
    constant = em.full((1,), 2, dtype=em.uint64, device=device)
    view = constant.pad((0, 0)).permute((0,))
    smallest = view.min()
    em.realize(smallest, view)
    assert smallest.item() == 2 and view.tolist() == [2]


def test_a_constant_stored_as_a_half_type(device: str, request: pytest.FixtureRequest) -> None:
    known_bug(request, device, {"c", "opencl"},
              "ir: a constant stored straight to a float16/bfloat16 buffer is written as a float literal without "
              "conversion (data0[0] = -2.5f into unsigned short): em.ones(3, dtype=em.bfloat16) gives 9.18e-41 "
              "on c and opencl, em.ones(3, dtype=em.float16) gives 6e-08 on opencl")
    assert em.full((1, 1), -2.5, dtype=em.bfloat16, device=device).tolist() == [[-2.5]]
    assert em.ones(3, dtype=em.bfloat16, device=device).tolist() == [1.0, 1.0, 1.0]
    assert em.ones(3, dtype=em.float16, device=device).tolist() == [1.0, 1.0, 1.0]


def test_negative_zero_keeps_its_sign_through_constant_folding(device: str, request: pytest.FixtureRequest) -> None:
    known_bug(request, device, {"c", "opencl"},
              "ir constant folding turns -(0.0) into +0.0: (-em.zeros(3)).reciprocal() is inf, torch gives -inf")
    known_bug(request, device, {"wgpu"},
              "wgpu: a constant-folded 1.0/0.0 is rendered as a WGSL literal expression that naga rejects "
              "('Float literal is infinite')")
    expected = (-ReferenceTensor(np.zeros(3, dtype=np.float32))).reciprocal().numpy()
    assert expected.tolist() == [-math.inf] * 3
    assert (-em.zeros(3, device=device)).reciprocal().tolist() == expected.tolist()
    assert (-em.arange(1, dtype=em.float32, device=device)).reciprocal().tolist() == [-math.inf]
