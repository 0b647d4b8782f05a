"""ggml's block-quantized formats (Q4_K, Q5_0, Q6_K, Q8_0): raw blocks whose dequantization is lazy ember ops.

A `QuantizedTensor` keeps the file's bytes as a uint8 tensor of shape (*rows, row_bytes). `dequantize()` records
the dequantization as ops on those bytes (views that pick each element's bytes, shifts, masks, a float16 bitcast
and scales): nothing is computed until a consumer needs the values, and then the ops fuse into the consumer's
kernel, so a matmul with a quantized weight reads the blocks and never stores a dequantized copy.
Block layouts follow ggml (ggml-common.h); the results are those of the `gguf` package's numpy dequantizers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ember.core import dtype as dtypes
from ember.core.creation import arange
from ember.core.movement import cat
from ember.core.tensor import Tensor

QK_K = 256  # elements of a k-quant super-block


@dataclass(frozen=True, eq=False)
class QuantFormat:
    """A block-quantized element format: `block_elements` values stored in `block_bytes` bytes."""

    name: str
    block_elements: int
    block_bytes: int
    dequantize_blocks: Callable[[Tensor], Tensor]  # (..., blocks, block_bytes) uint8 -> (..., blocks, elements) f32

    def __repr__(self) -> str:
        return f"ember.io.{self.name.lower()}"


def _float16(blocks: Tensor, start: int) -> Tensor:
    """The little-endian float16 at byte `start` of every block, as float32 of shape (..., blocks, 1)."""
    low = blocks[..., start : start + 1].cast(dtypes.uint16)
    high = blocks[..., start + 1 : start + 2].cast(dtypes.uint16)
    return (low | (high << 8)).bitcast(dtypes.float16).cast(dtypes.float32)


def _shifts(values: list[int], shape: tuple[int, ...], device: str) -> Tensor:
    """Per-position shift amounts `values[i]` laid along the axis of `shape` whose size is len(values)."""
    step = values[1] - values[0] if len(values) > 1 else 0
    return (arange(len(values), dtype=dtypes.uint8, device=device) * step + values[0]).reshape(shape)


def _spread(part: Tensor, view: tuple[int, ...], expanded: tuple[int, ...]) -> Tensor:
    """Bytes of every block reshaped to `view` (after the block axes) and broadcast to `expanded`."""
    leading = part.shape[:-1]
    return part.reshape(*leading, *view).expand(*leading, *expanded)


def _flatten_blocks(values: Tensor, block_dims: int) -> Tensor:
    return values.reshape(*values.shape[:-block_dims], -1)


def dequantize_q8_0(blocks: Tensor) -> Tensor:
    """Q8_0: a float16 scale d and 32 int8 values q; x = q * d."""
    scale = _float16(blocks, 0)
    return blocks[..., 2:34].bitcast(dtypes.int8).cast(dtypes.float32) * scale


def dequantize_q5_0(blocks: Tensor) -> Tensor:
    """Q5_0: scale d, 32 high bits (a uint32), 16 bytes of low nibbles; x = d * ((low | high << 4) - 16)."""
    device = blocks.device
    scale = _float16(blocks, 0)
    high_bytes = _flatten_blocks(_spread(blocks[..., 2:6], (4, 1), (4, 8)), 2)  # element i reads byte i // 8
    high = (high_bytes >> _flatten_blocks(_shifts(list(range(8)), (1, 8), device).expand(4, 8), 2)) & 1
    low = _spread(blocks[..., 6:22], (1, 16), (2, 16)) >> _shifts([0, 4], (2, 1), device)
    low = _flatten_blocks(low & 0x0F, 2)
    quants = (low | (high << 4)).bitcast(dtypes.int8) - 16
    return scale * quants.cast(dtypes.float32)


def _q4_k_scales(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """The 6-bit scales and minimums of the 8 sub-blocks of a Q4_K/Q5_K block, as uint8 (..., blocks, 8)."""
    first, second, third = blocks[..., 4:8], blocks[..., 8:12], blocks[..., 12:16]
    scales = [first & 0x3F, (third & 0x0F) | ((first >> 2) & 0x30)]
    minimums = [second & 0x3F, (third >> 4) | ((second >> 2) & 0x30)]
    return cat(scales, dim=-1), cat(minimums, dim=-1)


def dequantize_q4_k(blocks: Tensor) -> Tensor:
    """Q4_K: scale d, minimum dmin, 8 6-bit (scale, minimum) pairs, 256 4-bit values in 8 sub-blocks of 32;
    x = d * scale_j * q - dmin * minimum_j."""
    device = blocks.device
    scale, minimum = _float16(blocks, 0), _float16(blocks, 2)
    sub_scales, sub_minimums = _q4_k_scales(blocks)
    factor = (scale * sub_scales.cast(dtypes.float32)).unsqueeze(-1)  # (..., blocks, 8, 1)
    offset = (minimum * sub_minimums.cast(dtypes.float32)).unsqueeze(-1)
    quants = _spread(blocks[..., 16:144], (4, 1, 32), (4, 2, 32)) >> _shifts([0, 4], (2, 1), device)
    quants = (quants & 0x0F).reshape(*blocks.shape[:-1], 8, 32).cast(dtypes.float32)
    return _flatten_blocks(factor * quants - offset, 2)


def dequantize_q6_k(blocks: Tensor) -> Tensor:
    """Q6_K: 256 6-bit values (low nibbles, then 2-bit highs), 16 int8 scales, scale d; x = d * scale_j * (q - 32)."""
    device = blocks.device
    scale = _float16(blocks, 208)
    factor = (scale * blocks[..., 192:208].bitcast(dtypes.int8).cast(dtypes.float32)).unsqueeze(-1)  # (.., 16, 1)
    low = _spread(blocks[..., 0:128], (2, 1, 64), (2, 2, 64)) >> _shifts([0, 4], (2, 1), device)
    high = _spread(blocks[..., 128:192], (2, 1, 32), (2, 4, 32)) >> _shifts([0, 2, 4, 6], (4, 1), device)
    low = (low & 0x0F).reshape(*blocks.shape[:-1], 256)
    high = (high & 0x03).reshape(*blocks.shape[:-1], 256)
    quants = ((low | (high << 4)).bitcast(dtypes.int8) - 32).reshape(*blocks.shape[:-1], 16, 16)
    return _flatten_blocks(factor * quants.cast(dtypes.float32), 2)


Q8_0 = QuantFormat("Q8_0", 32, 34, dequantize_q8_0)
Q5_0 = QuantFormat("Q5_0", 32, 22, dequantize_q5_0)
Q4_K = QuantFormat("Q4_K", QK_K, 144, dequantize_q4_k)
Q6_K = QuantFormat("Q6_K", QK_K, 210, dequantize_q6_k)
FORMATS_BY_NAME: dict[str, QuantFormat] = {quant.name: quant for quant in (Q8_0, Q5_0, Q4_K, Q6_K)}


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


class QuantizedTensor:
    """A tensor stored as ggml blocks: `raw` holds the bytes (uint8, (*rows, row_bytes)), `shape` the values'.
    `source` says where a 2-d tensor's rows lie in a file (embedding tables look rows up there)."""

    def __init__(
        self, raw: Tensor, quant_format: QuantFormat, shape: tuple[int, ...], source: MappedRows | None = None
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
        return QuantizedTensor(self.raw.to(device), self.format, self.shape, self.source)

    def realize(self) -> QuantizedTensor:
        self.raw.realize()
        return self

    def dequantize(self, dtype: Any = dtypes.float32) -> Tensor:
        """The values, lazily: ops on the raw blocks that fuse into whatever kernel consumes them."""
        blocks = self.raw.reshape(*self.shape[:-1], self.shape[-1] // self.format.block_elements,
                                  self.format.block_bytes)
        values = self.format.dequantize_blocks(blocks).reshape(self.shape)
        return values if dtypes.to_dtype(dtype) == dtypes.float32 else values.cast(dtype)

    def __repr__(self) -> str:
        return f"QuantizedTensor(shape={self.shape}, format={self.format.name}, device={self.device!r})"
