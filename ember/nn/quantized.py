"""Layers whose weights are ggml quantized blocks (or plain tensors): QuantizedLinear and QuantizedEmbedding.

The raw blocks are a buffer of the module (they move with `Module.to`); each forward records the product over the
blocks' own layout (`QuantizedTensor.matmul`), which fuses the unpacking into the product's kernel, so no
dequantized copy is ever stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ember.core import dtype as dtypes
from ember.core.tensor import Tensor
from ember.io.quantized import DEQUANTIZE_ROWS, SCALES_IN_BLOCKS, QuantizedTensor, many_rows_product
from ember.nn import functional as F
from ember.nn.module import Module


class QuantizedLinear(Module):
    """y = x @ weight.T for a weight (out_features, in_features) given as a QuantizedTensor or a float tensor."""

    def __init__(self, weight: QuantizedTensor | Tensor) -> None:
        super().__init__()
        if len(weight.shape) != 2:
            raise ValueError(f"QuantizedLinear: the weight must be 2-d (out_features, in_features), got {weight.shape}")
        self.out_features, self.in_features = weight.shape
        self.format = weight.format if isinstance(weight, QuantizedTensor) else None
        self.register_buffer("raw", weight.raw if isinstance(weight, QuantizedTensor) else weight)
        self.scales: tuple[Tensor, ...] | None = None  # the blocks' scales decoded once (`decode_scales`)

    def weight(self) -> Tensor:
        """The float32 weight, lazily (dequantized inside the kernel that uses it)."""
        if self.format is None:
            return self.raw if self.raw.dtype == dtypes.float32 else self.raw.cast(dtypes.float32)
        return self.quantized().dequantize()

    def quantized(self) -> QuantizedTensor:
        """The weight as a QuantizedTensor (with the decoded scales, where they are on the blocks' device)."""
        if self.format is None:
            raise ValueError("QuantizedLinear.quantized: the weight is stored as plain floats")
        scales = self.scales if self.scales is not None and self.scales[0].device == self.raw.device else None
        return QuantizedTensor(self.raw, self.format, (self.out_features, self.in_features), scales=scales)

    def forward(self, input: Tensor) -> Tensor:
        if self.format is None:
            rows = 1
            for size in input.shape[:-1]:
                rows *= size
            product = F.linear(input, self.weight())
            return many_rows_product(product) if rows >= DEQUANTIZE_ROWS else product
        return self.quantized().matmul(input)

    def decode_scales(self) -> None:
        """Pick the blocks' scales out once where the blocks lie (2 to 20 bytes a block): each forward then reads
        them instead of picking them out of the blocks again, in a kernel of its own that reads every block. Blocks
        of a format with a layout of ember's own for the device (Q5_0, Q6_K) are laid out so first
        (`QuantizedTensor.repacked`: widened to a byte a value, Q8_0 and Q6_KW, where the device sums bytes in
        integers; else Q5_0's interleaved, the same bytes unpacked on byte vectors). A format of SCALES_IN_BLOCKS
        keeps reading its scale from the blocks."""
        if self.format is not None:
            repacked = self.quantized().repacked()
            self.raw, self.format = repacked.raw, repacked.format
            if self.format.name not in SCALES_IN_BLOCKS:
                self.scales = repacked.decoded_scales().scales

    def store_float32(self) -> None:
        """Keep the weight as float32 from now on, dequantized once where it lies (4 bytes a weight instead of the
        format's 0.5 to 1): each forward then reads plain floats instead of unpacking blocks again. The values are
        the same; a model that is short of memory keeps the blocks instead."""
        if self.format is not None:
            self.raw = self.weight().realize()
            self.format, self.scales = None, None

    def extra_repr(self) -> str:
        kind = self.format.name if self.format is not None else self.raw.dtype.name
        return f"in_features={self.in_features}, out_features={self.out_features}, format={kind}"


class QuantizedEmbedding(Module):
    """Rows of a (num_embeddings, embedding_dim) table stored as quantized blocks, looked up by token ids.

    A table memory-mapped from a file (`rows_source`) is looked up by reading just the rows of the ids asked for
    (one id: its row mapped; several: their bytes gathered into one host array, `MappedRows.rows`; the kernel that
    unpacks them depends only on how many ids there are); otherwise by a one-hot selection over the table, which
    reads all of it.
    """

    def __init__(self, weight: QuantizedTensor | Tensor) -> None:
        super().__init__()
        self.linear = QuantizedLinear(weight)
        self.num_embeddings, self.embedding_dim = weight.shape
        self.rows_source = weight.source if isinstance(weight, QuantizedTensor) else None

    def forward(self, ids: Sequence[int] | Tensor) -> Tensor:
        """Embeddings (len(ids), embedding_dim) of Python ints, or (*ids.shape, embedding_dim) of an id tensor."""
        if isinstance(ids, Tensor) or self.rows_source is None:
            from ember.core.creation import tensor

            ids = ids if isinstance(ids, Tensor) else tensor(list(ids), dtype=dtypes.int64, device=self.linear.raw.device)
            return F.embedding(ids, self.linear.weight())
        self._check_ids(ids)
        if len(ids) == 1:
            return self.rows_source.row(ids[0]).dequantize()
        return self.rows_source.rows(ids).dequantize()

    def row_bytes(self, index: int) -> Any:
        """The blocks of row `index` of a table memory-mapped from a file, read from it: a (1, row_bytes) uint8 numpy
        array (what a jitted decode step stages and unpacks)."""
        if self.rows_source is None:
            raise ValueError("QuantizedEmbedding.row_bytes: the table is not quantized rows of a file")
        self._check_ids([index])
        return self.rows_source.row_bytes_of(index)

    def _check_ids(self, ids: Sequence[int]) -> None:
        bad = [index for index in ids if not 0 <= index < self.num_embeddings]
        if bad:
            raise IndexError(f"QuantizedEmbedding: ids {bad[:5]} are outside the table of {self.num_embeddings} rows")
