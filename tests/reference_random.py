"""A numpy reference of ember's random numbers (core/creation.py), written apart from it: the double hash of a
draw's key and the integer Box-Muller of randn, bit for bit, with the primitives' semantics (uint32 arithmetic
wraps, `>>` of int64 is arithmetic, integer division truncates toward zero, the float32 square root is an estimate
the integer steps after it correct). tests/test_creation.py checks the device graphs against it."""

from __future__ import annotations

import math

import numpy as np

# Box-Muller's fixed point (Q30: value * 2**30), as creation.py defines them
Q = 30
ONE = 1 << Q
LN_2_Q = round(math.log(2.0) * ONE)
SQRT_2_Q = round(math.sqrt(2.0) * ONE)
HALF_PI_Q = round(math.pi / 2 * ONE)


def hashed(state: np.ndarray) -> np.ndarray:
    """creation._hash_tensor on uint32 values."""
    state = state ^ (state >> np.uint32(16))
    state = state * np.uint32(0x7FEB352D)
    state = state ^ (state >> np.uint32(15))
    state = state * np.uint32(0x846CA68B)
    return state ^ (state >> np.uint32(16))


def random_bits(key: np.ndarray, count: int) -> np.ndarray:
    """creation._bits_of_key: `count` uint32 values from a draw's key (offset, first, second)."""
    offset, first, second = (np.uint32(value) for value in key)
    position = np.arange(count, dtype=np.uint32) + offset  # (array arithmetic wraps without a warning)
    return hashed(hashed(position ^ first) + second)


def uniform_float32(key: np.ndarray, count: int) -> np.ndarray:
    """creation._uniform_of_keys for float32: the top 24 of a draw's random bits, times 2**-24."""
    return (random_bits(key, count) >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)


def _truncated_division(numerator: np.ndarray, denominator: np.ndarray | int) -> np.ndarray:
    """int64 division rounding toward zero (the IDIV primitive's), for positive denominators: a negative
    numerator's floor division of numerator + denominator - 1 is its ceiling, which is its truncation."""
    return (numerator + (numerator < 0) * (denominator - 1)) // denominator


def _multiply(first: np.ndarray, second: np.ndarray | np.int64) -> np.ndarray:
    """The product of two Q30 numbers (creation._fixed_multiply)."""
    return (first * second) >> Q


def standard_normal(first_key: np.ndarray, second_key: np.ndarray, count: int, float64: bool) -> np.ndarray:
    """creation._normal_of_keys: Box-Muller in int64 fixed point, as float32 (or float64) values."""
    first = random_bits(first_key, count).astype(np.int64) + 1  # u = first / 2**32 in (0, 1]
    second = random_bits(second_key, count).astype(np.int64)
    # the graph's binary search for the highest set bit of first (at most 2**32, exact in float64): frexp's exponent
    exponent = np.frexp(first.astype(np.float64))[1].astype(np.int64) - 1
    mantissa = (first << Q) >> exponent
    large = SQRT_2_Q < mantissa
    mantissa = np.where(large, mantissa >> 1, mantissa)
    exponent = np.where(large, exponent + 1, exponent)
    x = mantissa - ONE
    ratio = _truncated_division(x << Q, x + 2 * ONE)
    ratio_squared = _multiply(ratio, ratio)
    term, series = ratio, ratio
    for odd in (3, 5, 7, 9, 11):
        term = _multiply(term, ratio_squared)
        series = series + _truncated_division(term, odd)
    radius_squared = series * -4 + (32 - exponent) * (2 * LN_2_Q)
    target = radius_squared << 18
    radius = np.sqrt(target.astype(np.float32)).astype(np.int64) + 1
    radius = (radius + _truncated_division(target, radius)) >> 1
    radius = np.where(target < radius * radius, radius - 1, radius)
    radius = np.where((radius + 1) * (radius + 1) <= target, radius + 1, radius)
    angle = _multiply(second & (ONE - 1), np.int64(HALF_PI_Q))
    angle_squared = _multiply(angle, angle)
    cosine = np.full(count, ONE, np.int64)
    for denominator in (18 * 17, 16 * 15, 14 * 13, 12 * 11, 10 * 9, 8 * 7, 6 * 5, 4 * 3, 2 * 1):
        cosine = ONE - _truncated_division(_multiply(angle_squared, cosine), denominator)
    cosine = np.where(0 < (second & ONE), -cosine, cosine)
    normal = (radius * cosine) >> Q  # Q24
    kind = np.float64 if float64 else np.float32
    return normal.astype(kind) * kind(2.0**-24)
