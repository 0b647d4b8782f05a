"""ggml's block-quantized formats (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K): raw blocks whose dequantization is lazy ember ops.

A `QuantizedTensor` keeps the file's bytes as a uint8 tensor of shape (*rows, row_bytes). `dequantize()` records
the dequantization as ops on those bytes (views that pick each element's bytes, shifts, masks, a float16 bitcast
and scales): nothing is computed until a consumer needs the values, and then the ops fuse into the consumer's
kernel, so a matmul with a quantized weight reads the blocks and never stores a dequantized copy.
Block layouts follow ggml (ggml-common.h); the results are those of the `gguf` package's numpy dequantizers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ember.core import dtype as dtypes
from ember.core.creation import arange
from ember.core.movement import cat
from ember.core.ops import Op
from ember.core.tensor import Tensor

QK_K = 256  # elements of a k-quant super-block
# products with at least this many input rows unpack the weight once into a float32 temporary (of at most
# DEQUANTIZE_BYTES) read by a float matrix product; fewer rows unpack the blocks inside the product's kernel
DEQUANTIZE_ROWS = 32
DEQUANTIZE_BYTES = 64 << 20
# formats whose products read the blocks' scales where they lie rather than a decoded copy
# (`QuantizedTensor.decoded_scales`, which QuantizedLinear.decode_scales makes for the others): Q8_0's one float16
# in front of its 32 bytes, on the same cache line. Gemma-3-270M's 262144 x 640 output layer: a decoded copy is
# 10 MiB more resident (its scales alone) and no faster (one thread 9.2-9.7 ms with it, 9.2-12.2 without; two
# threads 5.4-9.9 ms with it, 5.0-9.7 without; fastest of 20, a loaded machine, three runs each)
SCALES_IN_BLOCKS = frozenset({"Q8_0"})


@dataclass(frozen=True, eq=False)
class QuantFormat:
    """A block-quantized element format: `block_elements` values stored in `block_bytes` bytes.

    `block_scales` picks each block's scales out (float16 and small integers, broadcastable to the layout: 2 to 20
    bytes a block, which `QuantizedTensor.decoded_scales` stores once), `values_from` gives the
    block's values laid out as `layout` (whose row-major order is the elements' order) from the blocks and those
    scales: the layout's last axis runs over consecutive bytes of the block with one shift and one scale, so a
    product over the values (`QuantizedTensor.matmul`) reads the bytes as vectors and each scale once per run."""

    name: str
    block_elements: int
    block_bytes: int
    layout: tuple[int, ...]
    block_scales: Callable[[Tensor], tuple[Tensor, ...]]  # (..., blocks, block_bytes) -> float32 (..., blocks, ...)
    values_from: Callable[[Tensor, tuple[Tensor, ...]], Tensor]  # blocks, scales -> (..., blocks, *layout) float32
    integer_from: Callable[[Tensor, tuple[Tensor, ...]], IntegerForm]  # blocks, scales -> the integer form

    def block_values(self, blocks: Tensor, scales: tuple[Tensor, ...] | None = None) -> Tensor:
        """(..., blocks, block_bytes) uint8 -> (..., blocks, *layout) float32, lazily (scales decoded here unless
        given)."""
        return self.values_from(blocks, self.block_scales(blocks) if scales is None else scales)

    def integer_form(self, blocks: Tensor, scales: tuple[Tensor, ...] | None = None) -> IntegerForm:
        """The blocks' values as unsigned integer quants with an offset and per-group float factors, lazily (scales
        decoded here unless given)."""
        return self.integer_from(blocks, self.block_scales(blocks) if scales is None else scales)

    def dequantize_blocks(self, blocks: Tensor) -> Tensor:
        """(..., blocks, block_bytes) uint8 -> (..., blocks, block_elements) float32, lazily."""
        return self.block_values(blocks).reshape(*blocks.shape[:-1], self.block_elements)

    def __repr__(self) -> str:
        return f"ember.io.{self.name.lower()}"


class IntegerForm(NamedTuple):
    """A block's values as value = factor * (quants - offset) - minimum: `quants` (uint8, (..., blocks, *layout))
    are the unsigned integers the block stores, `offset` a constant of the format, and `factor` and `minimum`
    (float32, or None for no minimum) are one number per group of elements: broadcast over the last `group_axes`
    axes of the layout (a group is 16 or 32 consecutive elements). A product then sums quants times integers per
    group and scales each group's sum once (ember/io/quantized_dot.py)."""

    quants: Tensor
    offset: int
    factor: Tensor
    minimum: Tensor | None
    group_axes: int


def _float16(blocks: Tensor, start: int) -> Tensor:
    """The little-endian float16 at byte `start` of every block, as float16 of shape (..., blocks, 1)."""
    low = blocks[..., start : start + 1].cast(dtypes.uint16)
    high = blocks[..., start + 1 : start + 2].cast(dtypes.uint16)
    return (low | (high << 8)).bitcast(dtypes.float16)


def _scale(blocks: Tensor, start: int, axes: int) -> Tensor:
    """The float16 at byte `start` of every block (float16), shaped to broadcast over `axes` axes of its layout."""
    return _float16(blocks, start).reshape(*blocks.shape[:-1], *([1] * axes))


def _float(value: Tensor) -> Tensor:
    return value.cast(dtypes.float32)


def _bytes(blocks: Tensor, start: int, view: tuple[int, ...], layout: tuple[int, ...]) -> Tensor:
    """Bytes start.. of every block viewed as `view` (after the block axes) and broadcast to `layout`."""
    count = 1
    for size in view:
        count *= size
    leading = blocks.shape[:-1]
    return blocks[..., start : start + count].reshape(*leading, *view).expand(*leading, *layout)


def _shifts(step: int, shape: tuple[int, ...], device: str) -> Tensor:
    """Shift amounts 0, step, 2 step, ... (uint8) laid out row-major as `shape` (broadcast over the blocks): index
    arithmetic, not memory, so a kernel's lanes get them as constants."""
    count = 1
    for size in shape:
        count *= size
    return (arange(count, dtype=dtypes.uint8, device=device) * step).reshape(shape)


def _shift_right(values: Tensor, amounts: Tensor) -> Tensor:
    """values >> amounts (uint8) as the bare shift: every amount here is below 8, so the range check of `>>` (a
    select per element, which keeps a kernel from running on vectors) is left out."""
    amounts = amounts.expand(*values.shape)
    return values._apply(Op.SHR, amounts)


def _quants(bits: Tensor, offset: float) -> Tensor:
    """Unsigned quantized values as float32, less the format's offset (done on floats: vectors convert the bits
    lane by lane and never do integer arithmetic)."""
    values = bits.cast(dtypes.float32)
    return values - offset if offset else values


def _d_scale(axes: int) -> Callable[[Tensor], tuple[Tensor, ...]]:
    """The scales of a format with one float16 scale d at byte 0, broadcast over `axes` axes of its layout."""
    return lambda blocks: (_scale(blocks, 0, axes),)


def q8_0_values(blocks: Tensor, scales: tuple[Tensor, ...]) -> Tensor:
    """Q8_0: a float16 scale d and 32 int8 values q; x = q * d. Layout (32,)."""
    return blocks[..., 2:34].bitcast(dtypes.int8).cast(dtypes.float32) * _float(scales[0])


def q8_0_integers(blocks: Tensor, scales: tuple[Tensor, ...]) -> IntegerForm:
    """Q8_0 as d * (u - 128): u = q + 128 is the byte with its top bit flipped."""
    return IntegerForm(blocks[..., 2:34] ^ 0x80, 128, _float(scales[0]), None, 1)


def q4_0_bits(blocks: Tensor) -> Tensor:
    """Q4_0's unsigned 4-bit values (uint8), layout (2, 16): elements 0-15 are the low nibbles, 16-31 the high."""
    return _shift_right(_bytes(blocks, 2, (1, 16), (2, 16)), _shifts(4, (2, 1), blocks.device)) & 0x0F


def q4_0_values(blocks: Tensor, scales: tuple[Tensor, ...]) -> Tensor:
    """Q4_0: scale d, 16 bytes of nibbles (elements 0-15 low, 16-31 high); x = d * (q - 8). Layout (2, 16)."""
    return _quants(q4_0_bits(blocks), 8.0) * _float(scales[0])


def q4_0_integers(blocks: Tensor, scales: tuple[Tensor, ...]) -> IntegerForm:
    """Q4_0 as d * (q - 8)."""
    return IntegerForm(q4_0_bits(blocks), 8, _float(scales[0]), None, 2)


def q5_0_bits(blocks: Tensor) -> Tensor:
    """Q5_0's unsigned 5-bit values (uint8), layout (2, 16): element 16h + j has the nibble h of byte j and bit
    j % 8 of high byte 2h + j // 8."""
    device = blocks.device
    leading = blocks.shape[:-1]
    low = _shift_right(_bytes(blocks, 6, (1, 16), (2, 16)), _shifts(4, (2, 1), device)) & 0x0F
    high_bytes = _bytes(blocks, 2, (2, 2, 1), (2, 2, 8)).reshape(*leading, 2, 16)
    bit_shifts = _shifts(1, (1, 1, 8), device).expand(2, 2, 8).reshape(2, 16)
    high = _shift_right(high_bytes, bit_shifts) & 1
    return low | (high << 4)


def q5_0_values(blocks: Tensor, scales: tuple[Tensor, ...]) -> Tensor:
    """Q5_0: scale d, 32 high bits (a uint32), 16 bytes of low nibbles; x = d * ((low | high << 4) - 16).
    Layout (2, 16) (q5_0_bits)."""
    return _quants(q5_0_bits(blocks), 16.0) * _float(scales[0])


def q5_0_scales(blocks: Tensor) -> tuple[Tensor, ...]:
    """Q5_0: d (float16, (..., blocks, 1, 1)) and the 32 high bits as one uint32 (..., blocks, 1, 1), which the
    integer product shifts each element's bit out of (the float product reads the bytes): 6 bytes a block."""
    device = blocks.device
    words = blocks[..., 2:6].cast(dtypes.uint32) << (arange(4, dtype=dtypes.uint32, device=device) * 8)
    high_bits = words[..., 0:1] | words[..., 1:2] | words[..., 2:3] | words[..., 3:4]
    return _scale(blocks, 0, 2), high_bits.reshape(*blocks.shape[:-1], 1, 1)


def q5_0_integers(blocks: Tensor, scales: tuple[Tensor, ...]) -> IntegerForm:
    """Q5_0 as d * (q - 16); the high bits are shifted out of the block's uint32 of them (bit 16h + j for element
    16h + j, one shift per element along the bytes) rather than picked from byte j // 8 (a division per element)."""
    leading = blocks.shape[:-1]
    device = blocks.device
    low = _shift_right(_bytes(blocks, 6, (1, 16), (2, 16)), _shifts(4, (2, 1), device)) & 0x0F
    high = (_shift_right(scales[1].expand(*leading, 2, 16), arange(32, dtype=dtypes.uint32, device=device)
                         .reshape(2, 16)) & 1).cast(dtypes.uint8)
    return IntegerForm(low | (high << 4), 16, _float(scales[0]), None, 2)


def _k_scales(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """The 6-bit scales and minimums of the 8 sub-blocks of a Q4_K/Q5_K block, as uint8 (..., blocks, 8)."""
    first, second, third = blocks[..., 4:8], blocks[..., 8:12], blocks[..., 12:16]
    scales = [first & 0x3F, (third & 0x0F) | ((first >> 2) & 0x30)]
    minimums = [second & 0x3F, (third >> 4) | ((second >> 2) & 0x30)]
    return cat(scales, dim=-1), cat(minimums, dim=-1)


def k_scales(blocks: Tensor) -> tuple[Tensor, ...]:
    """Q4_K/Q5_K: d and dmin (float16, (..., blocks, 1, 1, 1)) and the 8 sub-blocks' 6-bit scales and minimums
    (uint8, (..., blocks, 4, 2, 1)): 20 bytes a block."""
    sub_scales, sub_minimums = _k_scales(blocks)
    shape = (*blocks.shape[:-1], 4, 2, 1)
    return _scale(blocks, 0, 3), _scale(blocks, 2, 3), sub_scales.reshape(shape), sub_minimums.reshape(shape)


def _k_factors(scales: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    """d * scale_j and dmin * minimum_j (float32) from `k_scales`."""
    scale, minimum, sub_scales, sub_minimums = scales
    return _float(scale) * _float(sub_scales), _float(minimum) * _float(sub_minimums)


def q4_k_bits(blocks: Tensor) -> Tensor:
    """Q4_K's unsigned 4-bit values (uint8), layout (4, 2, 32): sub-block j = 2p + h has the nibbles h of bytes
    32p.. of the values."""
    return _shift_right(_bytes(blocks, 16, (4, 1, 32), (4, 2, 32)), _shifts(4, (1, 2, 1), blocks.device)) & 0x0F


def q4_k_values(blocks: Tensor, scales: tuple[Tensor, ...]) -> Tensor:
    """Q4_K: scale d, minimum dmin, 8 6-bit (scale, minimum) pairs, 256 4-bit values in 8 sub-blocks of 32;
    x = d * scale_j * q - dmin * minimum_j. Layout (4, 2, 32) (q4_k_bits)."""
    factor, offset = _k_factors(scales)
    return factor * _quants(q4_k_bits(blocks), 0.0) - offset


def q4_k_integers(blocks: Tensor, scales: tuple[Tensor, ...]) -> IntegerForm:
    """Q4_K as (d * scale_j) * q - dmin * minimum_j, one group per sub-block of 32."""
    factor, minimum = _k_factors(scales)
    return IntegerForm(q4_k_bits(blocks), 0, factor, minimum, 1)


def q5_k_bits(blocks: Tensor) -> Tensor:
    """Q5_K's unsigned 5-bit values (uint8), layout (4, 2, 32): Q4_K's nibbles, and a fifth bit of each value in
    32 bytes of high bits (bit j of byte l for element l of sub-block j)."""
    device = blocks.device
    low = _shift_right(_bytes(blocks, 48, (4, 1, 32), (4, 2, 32)), _shifts(4, (1, 2, 1), device)) & 0x0F
    high = _shift_right(_bytes(blocks, 16, (1, 1, 32), (4, 2, 32)), _shifts(1, (4, 2, 1), device)) & 1
    return low | (high << 4)


def q5_k_values(blocks: Tensor, scales: tuple[Tensor, ...]) -> Tensor:
    """Q5_K: as Q4_K with 5-bit values; x = d * scale_j * q - dmin * minimum_j. Layout (4, 2, 32) (q5_k_bits)."""
    factor, offset = _k_factors(scales)
    return factor * _quants(q5_k_bits(blocks), 0.0) - offset


def q5_k_integers(blocks: Tensor, scales: tuple[Tensor, ...]) -> IntegerForm:
    """Q5_K as (d * scale_j) * q - dmin * minimum_j, one group per sub-block of 32."""
    factor, minimum = _k_factors(scales)
    return IntegerForm(q5_k_bits(blocks), 0, factor, minimum, 1)


def q6_k_scales(blocks: Tensor) -> tuple[Tensor, ...]:
    """Q6_K: d (float16, (..., blocks, 1, 1, 1, 1, 1)) and the 16 sub-blocks' int8 scales (..., blocks, 2, 2, 2, 2,
    1) (see q6_k_values): 18 bytes a block."""
    sub_scales = blocks[..., 192:208].bitcast(dtypes.int8)
    return _scale(blocks, 208, 5), sub_scales.reshape(*blocks.shape[:-1], 2, 2, 2, 2, 1)


def q6_k_bits(blocks: Tensor) -> Tensor:
    """Q6_K's unsigned 6-bit values (uint8), layout (2, 2, 2, 2, 16) = (n, k_high, k_low, s, l): element
    128n + 32k + 16s + l (k = 2 k_high + k_low) has the nibble k_high of byte 64n + 32k_low + 16s + l and bits 2k
    of byte 128 + 32n + 16s + l."""
    layout = (2, 2, 2, 2, 16)
    device = blocks.device
    low = _shift_right(_bytes(blocks, 0, (2, 1, 2, 2, 16), layout), _shifts(4, (1, 2, 1, 1, 1), device)) & 0x0F
    high = _shift_right(_bytes(blocks, 128, (2, 1, 1, 2, 16), layout), _shifts(2, (1, 2, 2, 1, 1), device)) & 0x03
    return low | (high << 4)


def q6_k_values(blocks: Tensor, scales: tuple[Tensor, ...]) -> Tensor:
    """Q6_K: 256 6-bit values (low nibbles, then 2-bit highs), 16 int8 scales, scale d; x = d * scale_j * (q - 32).
    Layout (2, 2, 2, 2, 16) (q6_k_bits); element 128n + 32k + 16s + l has scale 8n + 2k + s."""
    return _float(scales[0]) * _float(scales[1]) * _quants(q6_k_bits(blocks), 32.0)


def q6_k_integers(blocks: Tensor, scales: tuple[Tensor, ...]) -> IntegerForm:
    """Q6_K as (d * scale_j) * (q - 32), one group per sub-block of 16."""
    return IntegerForm(q6_k_bits(blocks), 32, _float(scales[0]) * _float(scales[1]), None, 1)


Q5_0_GROUP = 4  # Q5_0 blocks interleaved into one block of Q5_0X4


def q5_0x4_bits(blocks: Tensor) -> Tensor:
    """Q5_0X4's unsigned 5-bit values (uint8), layout (4, 2, 16) = (block b, half h, j): the nibble h of byte
    24 + 16b + j and bit 2b + h of byte 8 + j. Every byte of a run of 16 is shifted by the same amount."""
    device = blocks.device
    low = _shift_right(_bytes(blocks, 24, (4, 1, 16), (4, 2, 16)), _shifts(4, (1, 2, 1), device)) & 0x0F
    high = _shift_right(_bytes(blocks, 8, (1, 1, 16), (4, 2, 16)), _shifts(1, (4, 2, 1), device)) & 1
    return low | (high << 4)


def q5_0x4_scales(blocks: Tensor) -> tuple[Tensor, ...]:
    """Q5_0X4: the four blocks' d (float16, (..., blocks, 4, 1, 1)): 8 bytes a block."""
    pairs = blocks[..., 0:8].reshape(*blocks.shape[:-1], Q5_0_GROUP, 2).cast(dtypes.uint16)
    scales = (pairs[..., 0:1] | (pairs[..., 1:2] << 8)).bitcast(dtypes.float16)
    return (scales.reshape(*blocks.shape[:-1], Q5_0_GROUP, 1, 1),)


def q5_0x4_values(blocks: Tensor, scales: tuple[Tensor, ...]) -> Tensor:
    """Q5_0X4: four Q5_0 blocks in 88 bytes (their d's, their high bits interleaved, their nibbles);
    x = d_b * (q - 16). Layout (4, 2, 16) (q5_0x4_bits)."""
    return _quants(q5_0x4_bits(blocks), 16.0) * _float(scales[0])


def q5_0x4_integers(blocks: Tensor, scales: tuple[Tensor, ...]) -> IntegerForm:
    """Q5_0X4 as d_b * (q - 16), one group per Q5_0 block."""
    return IntegerForm(q5_0x4_bits(blocks), 16, _float(scales[0]), None, 2)


def q5_0_interleaved(blocks: Tensor) -> Tensor:
    """Q5_0 blocks (..., 4 k, 22) -> the same values as Q5_0X4 blocks (..., k, 88), lazily: the 4 float16 d's, 16
    bytes whose bit 2b + h is the high bit of element 16h + j of block b (byte j), the 4 blocks' 16 bytes of
    nibbles. The same bytes as before, laid out so that a product picks every bit with a shift per run of bytes."""
    leading = blocks.shape[:-2]
    groups = blocks.shape[-2] // Q5_0_GROUP
    grouped = blocks.reshape(*leading, groups, Q5_0_GROUP, 22)
    scales = grouped[..., 0:2].reshape(*leading, groups, 2 * Q5_0_GROUP)
    nibbles = grouped[..., 6:22].reshape(*leading, groups, 16 * Q5_0_GROUP)
    high_bytes = grouped[..., 2:6].reshape(*leading, groups, Q5_0_GROUP, 2, 2, 1)
    high_bytes = high_bytes.expand(*leading, groups, Q5_0_GROUP, 2, 2, 8).reshape(*leading, groups, Q5_0_GROUP, 2, 16)
    bits = (high_bytes >> _shifts(1, (1, 1, 8), blocks.device).expand(2, 2, 8).reshape(2, 16)) & 1
    places = (1 << arange(2 * Q5_0_GROUP, dtype=dtypes.int32, device=blocks.device)).reshape(Q5_0_GROUP, 2, 1)
    high = (bits.cast(dtypes.int32) * places).sum((-3, -2), dtype=dtypes.int32).cast(dtypes.uint8)
    return cat([scales, high, nibbles], dim=-1)


Q8_0 = QuantFormat("Q8_0", 32, 34, (32,), _d_scale(1), q8_0_values, q8_0_integers)
Q4_0 = QuantFormat("Q4_0", 32, 18, (2, 16), _d_scale(2), q4_0_values, q4_0_integers)
Q5_0 = QuantFormat("Q5_0", 32, 22, (2, 16), q5_0_scales, q5_0_values, q5_0_integers)
Q4_K = QuantFormat("Q4_K", QK_K, 144, (4, 2, 32), k_scales, q4_k_values, q4_k_integers)
Q5_K = QuantFormat("Q5_K", QK_K, 176, (4, 2, 32), k_scales, q5_k_values, q5_k_integers)
Q6_K = QuantFormat("Q6_K", QK_K, 210, (2, 2, 2, 2, 16), q6_k_scales, q6_k_values, q6_k_integers)
# a layout of ember's own (no GGUF file holds it): Q5_0's blocks interleaved by `QuantizedTensor.interleaved`
Q5_0X4 = QuantFormat("Q5_0X4", 32 * Q5_0_GROUP, 22 * Q5_0_GROUP, (Q5_0_GROUP, 2, 16), q5_0x4_scales, q5_0x4_values,
                     q5_0x4_integers)
FORMATS_BY_NAME: dict[str, QuantFormat] = {quant.name: quant for quant in (Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K)}
# a format -> (the format its blocks are interleaved into, how many of its blocks make one of that format's)
INTERLEAVED_FORMATS: dict[str, tuple[QuantFormat, int, Callable[[Tensor], Tensor]]] = {
    "Q5_0": (Q5_0X4, Q5_0_GROUP, q5_0_interleaved)}


def q5_0_widened(blocks: Tensor) -> Tensor:
    """Q5_0 blocks (..., 22) -> Q8_0 blocks (..., 34) of the same values, lazily: the same float16 d, and each
    5-bit value less 16 (-16..15) as an int8. Exact: d * (q - 16) is d * q8."""
    values = (q5_0_bits(blocks).cast(dtypes.int16) - 16).cast(dtypes.int8).bitcast(dtypes.uint8)
    return cat([blocks[..., 0:2], values.reshape(*blocks.shape[:-1], 32)], dim=-1)


def q6_kw_scales(blocks: Tensor) -> tuple[Tensor, ...]:
    """Q6_KW: d (float16, (..., blocks, 1, 1, 1)) and the 16 sub-blocks' int8 scales (..., blocks, 8, 2, 1)."""
    sub_scales = blocks[..., 256:272].bitcast(dtypes.int8)
    return _scale(blocks, 272, 3), sub_scales.reshape(*blocks.shape[:-1], 8, 2, 1)


def q6_kw_values(blocks: Tensor, scales: tuple[Tensor, ...]) -> Tensor:
    """Q6_KW: Q6_K's 256 6-bit values a byte each in the elements' order, then its 16 int8 scales and d;
    x = d * scale_j * (q - 32), element e of sub-block e // 16. Layout (8, 2, 16)."""
    return _float(scales[0]) * _float(scales[1]) * _quants(_q6_kw_bytes(blocks), 32.0)


def q6_kw_integers(blocks: Tensor, scales: tuple[Tensor, ...]) -> IntegerForm:
    """Q6_KW as (d * scale_j) * (q - 32), one group per sub-block of 16."""
    return IntegerForm(_q6_kw_bytes(blocks), 32, _float(scales[0]) * _float(scales[1]), None, 1)


def _q6_kw_bytes(blocks: Tensor) -> Tensor:
    return blocks[..., 0:256].reshape(*blocks.shape[:-1], 8, 2, 16)


def q6_k_widened(blocks: Tensor) -> Tensor:
    """Q6_K blocks (..., 210) -> Q6_KW blocks (..., 274) of the same values, lazily: the values' bits joined into a
    byte each (q6_k_bits, whose layout's order is the elements'), then the block's scales and d as they were."""
    values = q6_k_bits(blocks).reshape(*blocks.shape[:-1], QK_K)
    return cat([values, blocks[..., 192:210]], dim=-1)


# a layout of ember's own: Q6_K widened to a byte a value (`QuantizedTensor.widened`)
Q6_KW = QuantFormat("Q6_KW", QK_K, 274, (8, 2, 16), q6_kw_scales, q6_kw_values, q6_kw_integers)


# a format -> (the format of a byte a value its blocks widen into, how they are widened): where a device sums
# bytes in integers (DeviceInfo.integer_dot_products), picking values out of their bits costs more than reading
# more bytes. Measured on c (AVX512-VNNI, 2 threads) with Gemma-3-270M's weights, a token's products: the gated
# MLP's of 18 layers 2.74-2.88 -> 1.68-2.28 ms and the queries' 0.66-0.78 -> 0.35-0.36 ms (Q5_0X4 -> Q8_0, 55% more
# bytes), the 9 Q6_K downs' 0.88-0.91 ms in floats -> 0.53-0.55 ms in integers (Q6_KW, 30% more bytes). Q4_K's
# (its 4-bit values take one shift per run of bytes) would double its bytes: the model's resident memory then
# passes 1.5x its file
WIDENED_FORMATS: dict[str, tuple[QuantFormat, Callable[[Tensor], Tensor]]] = {
    "Q5_0": (Q8_0, q5_0_widened), "Q6_K": (Q6_KW, q6_k_widened)}


def many_rows_product(product: Tensor) -> Tensor:
    """A product of many input rows, stored (`contiguous`): left lazy, two of them under one elementwise op (a gated
    MLP's gelu(x @ gate.T) * (x @ up.T)) fused into one kernel of two nested reductions, not the tiled matrix
    product (256 x 640 by 2048 x 640 twice: 236 ms instead of 2 x 15 on one thread)."""
    return product.contiguous()


@dataclass(frozen=True)
class MappedRows:
    """Where the rows of a 2-d quantized tensor lie in a file, so single rows can be memory-mapped on their own."""

    path: str
    offset: int
    row_bytes: int
    row_elements: int
    quant_format: QuantFormat

    def row(self, index: int) -> QuantizedTensor:
        """Row `index` as a (1, row_elements) quantized disk tensor (only its bytes are read when used)."""
        from ember.scheduler.buffers import mapped_node

        node = mapped_node(self.path, self.offset + index * self.row_bytes, (1, self.row_bytes), dtypes.uint8)
        return QuantizedTensor(Tensor._from_node(node), self.quant_format, (1, self.row_elements))

    def row_bytes_of(self, index: int) -> np.ndarray:
        """Row `index`'s bytes read from the file, as a (1, row_bytes) uint8 array (an IndexError outside the
        file)."""
        data = b""
        if index >= 0:
            with open(self.path, "rb") as file:
                file.seek(self.offset + index * self.row_bytes)
                data = file.read(self.row_bytes)
        if len(data) != self.row_bytes:
            raise IndexError(f"row {index} lies outside {self.path}'s table at byte {self.offset}")
        return np.frombuffer(data, dtype=np.uint8).reshape(1, self.row_bytes)

    def rows(self, indices: Sequence[int]) -> QuantizedTensor:
        """Rows `indices` (within the tensor) as a (len(indices), row_elements) quantized tensor on the default
        device: their bytes gathered from the file into one host array (only their pages are read), so no kernel
        joins them (a join of a prompt's 256 mapped rows was one kernel choosing among 256 inputs per element)."""
        import numpy as np

        from ember.core.creation import tensor

        table = np.memmap(self.path, dtype=np.uint8, mode="r", offset=self.offset,
                          shape=(max(indices) + 1, self.row_bytes))
        gathered = np.ascontiguousarray(table[list(indices)])
        del table
        return QuantizedTensor(tensor(gathered, dtype=dtypes.uint8), self.quant_format,
                               (len(indices), self.row_elements))


class QuantizedTensor:
    """A tensor stored as ggml blocks: `raw` holds the bytes (uint8, (*rows, row_bytes)), `shape` the values'.
    `source` says where a 2-d tensor's rows lie in a file (embedding tables look rows up there). `scales`, when
    given, are the blocks' scales picked out once (`decoded_scales`): products then read them instead of picking
    them out of every block again (2 to 20 bytes a block more memory)."""

    def __init__(
        self, raw: Tensor, quant_format: QuantFormat, shape: tuple[int, ...], source: MappedRows | None = None,
        scales: tuple[Tensor, ...] | None = None,
    ) -> None:
        if raw.dtype != dtypes.uint8:
            raise TypeError(f"QuantizedTensor: the raw blocks must be uint8, got {raw.dtype.name}")
        if not shape or shape[-1] % quant_format.block_elements:
            raise ValueError(f"QuantizedTensor: {quant_format.name} needs rows of a multiple of "
                             f"{quant_format.block_elements} elements, got shape {shape}")
        row_bytes = shape[-1] // quant_format.block_elements * quant_format.block_bytes
        if tuple(raw.shape) != (*shape[:-1], row_bytes):
            raise ValueError(f"QuantizedTensor: {quant_format.name} values of shape {shape} need raw bytes of shape "
                             f"{(*shape[:-1], row_bytes)}, got {tuple(raw.shape)}")
        self.raw, self.format, self.shape, self.source = raw, quant_format, tuple(shape), source
        self.scales = scales

    @property
    def dtype(self) -> QuantFormat:
        return self.format

    @property
    def device(self) -> str:
        return self.raw.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def to(self, device: str) -> QuantizedTensor:
        """The same blocks on another device (copied when realized; the values stay quantized)."""
        scales = None if self.scales is None else tuple(scale.to(device) for scale in self.scales)
        return QuantizedTensor(self.raw.to(device), self.format, self.shape, self.source, scales)

    def blocks(self) -> Tensor:
        """The raw bytes as (*rows, blocks per row, block_bytes)."""
        return self.raw.reshape(*self.shape[:-1], self.shape[-1] // self.format.block_elements,
                                self.format.block_bytes)

    def decoded_scales(self) -> QuantizedTensor:
        """The same blocks with their scales picked out once, now (`format.block_scales`, on the blocks' device)."""
        from ember.core.tensor import realize

        scales = self.format.block_scales(self.blocks())
        realize(*scales)
        return QuantizedTensor(self.raw, self.format, self.shape, self.source, scales)

    def interleaved(self) -> QuantizedTensor:
        """The same values in the format its blocks interleave into (`INTERLEAVED_FORMATS`: Q5_0 -> Q5_0X4, the
        same bytes laid out so that a product's bit picking runs on byte vectors), computed now on the blocks'
        device; itself when its format has none or its rows' blocks do not group evenly."""
        target = INTERLEAVED_FORMATS.get(self.format.name)
        blocks_per_row = self.shape[-1] // self.format.block_elements
        if target is None or blocks_per_row % target[1]:
            return self
        quant_format, _, interleave = target
        return self._laid_out(quant_format, interleave)

    def widened(self) -> QuantizedTensor:
        """The same values in the format its blocks widen into (`WIDENED_FORMATS`: Q5_0 -> Q8_0, Q6_K -> Q6_KW, a
        byte a value, which integer products read with no bits picked), computed now on the blocks' device; itself
        when its format has none."""
        target = WIDENED_FORMATS.get(self.format.name)
        if target is None:
            return self
        return self._laid_out(*target)

    def _laid_out(self, quant_format: QuantFormat, lay_out: Callable[[Tensor], Tensor]) -> QuantizedTensor:
        """The same values as blocks of `quant_format`, which `lay_out` makes of this tensor's blocks (lazily),
        computed now on the blocks' device."""
        row_bytes = self.shape[-1] // quant_format.block_elements * quant_format.block_bytes
        raw = lay_out(self.blocks()).reshape(*self.shape[:-1], row_bytes).contiguous().realize()
        return QuantizedTensor(raw, quant_format, self.shape)

    def repacked(self) -> QuantizedTensor:
        """The same values in the layout its products run fastest from on its device: widened (`widened`) where
        the device sums bytes in integers (DeviceInfo.integer_dot_products: its few-row products run in
        integers), else interleaved (`interleaved`: the same bytes, unpacked on byte vectors)."""
        from ember.io import quantized_dot

        if self.format.name in WIDENED_FORMATS and quantized_dot.integer_dot_products(self.device):
            return self.widened()
        return self.interleaved()

    def realize(self) -> QuantizedTensor:
        self.raw.realize()
        return self

    def dequantize(self, dtype: Any = dtypes.float32) -> Tensor:
        """The values, lazily: ops on the raw blocks that fuse into whatever kernel consumes them."""
        values = self.format.block_values(self.blocks(), self.scales).reshape(self.shape)
        return values if dtypes.to_dtype(dtype) == dtypes.float32 else values.cast(dtype)

    def matmul(self, input: Tensor, integer: bool | None = None) -> Tensor:
        """input @ values.T for a 2-d quantized tensor (out_features, in_features): (..., in) -> (..., out), lazily.

        The product runs over the blocks' own layout (blocks, then `format.layout`): each block's scales are read
        once per run of consecutive bytes, the bits are picked with one shift per run, and no dequantized weight
        is stored; the kernel reads the blocks (0.5 to 1.1 bytes a weight instead of 4).
        With `integer` (by default: a few input rows that need no gradient, of a format in INTEGER_FORMATS, on a
        device with integer dot products, DeviceInfo), the input is quantized to int8 per block of 32 and the
        products summed in integers (quantized_dot.integer_matmul), within the input's 8-bit rounding of the float
        product."""
        if len(self.shape) != 2:
            raise ValueError(f"QuantizedTensor.matmul: needs a 2-d (out_features, in_features) tensor, got {self.shape}")
        in_features = self.shape[1]
        if not input.shape or input.shape[-1] != in_features:
            raise ValueError(f"QuantizedTensor.matmul: input of shape {tuple(input.shape)} does not end in the "
                             f"{in_features} input features of the {self.format.name} weight {self.shape}")
        if not input.dtype.is_float:
            raise TypeError(f"QuantizedTensor.matmul: the input must be floating point, got {input.dtype.name}")
        from ember.io import quantized_dot

        rows = 1
        for size in input.shape[:-1]:
            rows *= size
        if integer is None:
            integer = (rows <= quantized_dot.INTEGER_ROWS and self.format.name in quantized_dot.INTEGER_FORMATS
                       and not input.requires_grad and quantized_dot.integer_dot_products(self.device))
        if integer and input.requires_grad:
            raise ValueError("QuantizedTensor.matmul: integer=True rounds the input to int8, which has no gradient; "
                             "the input requires one (use integer=False or None)")
        # the product's graph (hundreds of ops picking bits, scales and sums) is recorded once per format, shapes and
        # path and copied at each call (core/graph_templates.py): built op by op, Gemma-3's 126 products of a short
        # prompt's pass took ~0.15 s of Python, half of its first token
        from ember.core.graph_templates import TEMPLATES

        scales = self.scales or ()
        quant_format, shape = self.format, self.shape

        def build(raw: Tensor, *operands: Tensor) -> Tensor:
            weight = QuantizedTensor(raw, quant_format, shape, scales=tuple(operands[:-1]) or None)
            return weight._product(operands[-1], bool(integer), rows)

        signature = ("QuantizedTensor.matmul", quant_format.name, shape, bool(integer), len(scales))
        return TEMPLATES.instantiate(signature, build, (self.raw, *scales, input))

    def _product(self, input: Tensor, integer: bool, rows: int) -> Tensor:
        """matmul's graph, for the path it chose (integers, a float32 copy for many rows, or the blocks)."""
        from ember.io import quantized_dot

        out_features, in_features = self.shape
        if integer:
            return quantized_dot.integer_matmul(self, input)
        if rows >= DEQUANTIZE_ROWS and out_features * in_features * 4 <= DEQUANTIZE_BYTES:
            # many rows (a prompt's pass): every block unpacked once into a float32 temporary that a float matrix
            # product reads in tiles, instead of each output's product unpacking the blocks again per input row;
            # the product stored (`many_rows_product`)
            return many_rows_product(input.cast(dtypes.float32).linear(self.dequantize().contiguous()))
        blocks_per_row = in_features // self.format.block_elements
        layout = self.format.layout
        values = self.format.block_values(self.blocks(), self.scales)
        leading = tuple(input.shape[:-1])
        spread = input.cast(dtypes.float32).reshape(*leading, 1, blocks_per_row, *layout)
        axes = tuple(range(-1 - len(layout), 0))
        return (spread * values).sum(axes)

    def __repr__(self) -> str:
        return f"QuantizedTensor(shape={self.shape}, format={self.format.name}, device={self.device!r})"
