"""Stable sorting of rows with primitives: integer records, a counting rank for short rows, a bitonic network for long.

Each element becomes an integer *record* whose signed order is torch's sort order (NaN after +inf, -0.0 tied with
0.0, descending by complementing the key) followed by its position, so ties keep their input order (the sort is
stable) and every device gives the same result. Records of types up to 32 bits are one int64
(key * 2^32 + position * 2 + sign-of-zero flag); 64-bit types use two int64 rows (key, position * 2 + flag); other
callers (unique) sort records of several rows, compared in order.

- Counting, for rows of at most COUNTING_LIMIT or while batch * n^2 <= COUNTING_WORK_LIMIT: rank[i] = #{j : record
  j < record i}, then each rank takes its record with a one-hot max: two kernels, n^2 work per row.
- Otherwise rows are padded to a power of two N, blocks of NETWORK_BLOCK are sorted by counting, and the blocks
  are merged by a bitonic network: each compare-exchange step is a select between the records and a flipped view
  of them (each element's partner), STEPS_PER_KERNEL steps fused per kernel, stored in rows of STORED_ROW (a CPU
  work item's tile). That is about N log^2 N work and, with L = log2(N / 32), ceil(L (L + 11) / 4) + 2 kernels for
  one-row records: 34 for N = 4096, 97 for N = 2^20.

Measured on the C backend (one thread, a loaded machine), float32: counting sorts [1, 1024] in 4 ms where the
network takes 50 ms (mostly building its graph); the network wins from about batch * n^2 = 2^22 on ([8, 1024]: 58 ms
against 114 ms; [1, 4096]: 79 ms against 198 ms).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.core import dtype as dtypes
from ember.core.elementwise import where
from ember.core.movement import cat, stack
from ember.core.ops import Op

if TYPE_CHECKING:
    from ember.core.dtype import DType
    from ember.core.tensor import Tensor

COUNTING_LIMIT = 64  # rows up to this length are ranked by counting; longer rows sort blocks of it, then merge
COUNTING_WORK_LIMIT = 2**22  # longer rows are still ranked by counting while batch * n^2 stays below this
STEPS_PER_KERNEL = 2  # network steps fused per kernel (each fused step doubles the reads; 3 outgrow the row tile)
LOW_BITS = 2**32
NETWORK_BLOCK = 32  # the network's rows start as blocks of this length sorted by counting (n work per element)
STORED_ROW = 64  # the network's kernels store rows of this length: the C lowering's row tile, one row per work item


def sort_rows(values: Tensor, descending: bool) -> tuple[Tensor, Tensor]:
    """Sort each row of values [B, n] stably: (sorted values with their exact bits, int64 positions)."""
    keys, flags = order_keys(values, descending)
    low = values._arange_primitive(values.shape[-1], dtypes.int64, values.device) * 2 + flags
    if keys.dtype.itemsize == 4:
        records = sort_records((keys.cast(dtypes.int64) * LOW_BITS + low).unsqueeze(1))
        packed = records.reshape(records.shape[0], records.shape[2])
        keys = _shift_right(packed, 32).cast(dtypes.int32)
        low = packed & (LOW_BITS - 1)
    else:
        keys, low = _rows(sort_records(stack([keys, low], 1)))
    return values_from_keys(keys, low & 1, values.dtype, descending), _shift_right(low, 1)


def sort_records(records: Tensor) -> Tensor:
    """Sort the distinct int64 records [B, R, n] of each batch row in lexicographic order of their R rows.

    R = 1 is the packed form of sort_rows (key * 2^32 + low); for R > 1 the last row must lie in [0, 2n) (a position)
    unless an earlier row is below the int64 maximum, so the padding of the network sorts after every record.
    """
    size = records.shape[-1]
    if size <= 1:
        return records
    if size <= COUNTING_LIMIT or records.shape[0] * size * size <= COUNTING_WORK_LIMIT:
        return _counting_sort(records)
    return _network_sort(records)


def order_keys(values: Tensor, descending: bool = False) -> tuple[Tensor, Tensor]:
    """Integer keys (int32, or int64 for 64-bit types) in torch's sort order of values (NaN largest, zeros of both
    signs equal; the order reversed when descending), and int64 flags marking -0.0."""
    kind = dtypes.int64 if values.dtype.itemsize == 8 else dtypes.int32
    sign_bit = int(dtypes.min_value(kind))
    flags = values._full(values.shape, 0, dtypes.int64, values.device)
    if values.dtype.is_float:
        source = values.cast(dtypes.float32) if values.dtype.itemsize == 2 else values
        flags = (source == 0).logical_and(source.bitcast(kind) < 0).cast(dtypes.int64)
        canonical = where(source.isnan(), float("nan"), where(source == 0, 0.0, source))
        bits = canonical.bitcast(kind)
        keys = where(bits < 0, bits ^ ~sign_bit, bits)  # negative floats: larger magnitude, smaller key
    elif values.dtype.is_unsigned and values.dtype.itemsize >= 4:
        keys = values.bitcast(kind) ^ sign_bit
    else:
        keys = values.cast(kind)
    return (~keys if descending else keys), flags


def values_from_keys(keys: Tensor, flags: Tensor, dtype: DType, descending: bool = False) -> Tensor:
    """The inverse of order_keys (keys may have been widened to int64; NaN comes back as the canonical NaN)."""
    kind = dtypes.int64 if dtype.itemsize == 8 else dtypes.int32
    keys = keys.cast(kind)
    keys = ~keys if descending else keys
    sign_bit = int(dtypes.min_value(kind))
    if dtype.is_float:
        bits = where(keys < 0, keys ^ ~sign_bit, keys)
        values = bits.bitcast(dtypes.float64 if kind.itemsize == 8 else dtypes.float32)
        return where(flags == 1, -0.0, values).cast(dtype)
    if dtype.is_unsigned and dtype.itemsize >= 4:
        return (keys ^ sign_bit).bitcast(dtype)
    return keys.cast(dtype)


def _shift_right(tensor: Tensor, bits: int) -> Tensor:
    """An arithmetic right shift by a constant (the primitive: the Tensor method also checks the amount)."""
    return tensor._apply(Op.SHR, tensor._full(tensor.shape, bits, tensor.dtype, tensor.device))


def _rows(records: Tensor) -> list[Tensor]:
    """The rows of [B, R, ...] records, each [B, ...]."""
    if records.shape[1] == 1:
        return [records.reshape(records.shape[:1] + records.shape[2:])]
    return [records[:, row] for row in range(records.shape[1])]


def _before(first: list[Tensor], second: list[Tensor]) -> Tensor:
    """Whether records `first` sort before records `second` (lexicographic over the rows)."""
    result = first[-1] < second[-1]
    for row in reversed(range(len(first) - 1)):
        result = (first[row] < second[row]).logical_or((first[row] == second[row]).logical_and(result))
    return result


def _counting_sort(records: Tensor) -> Tensor:
    """Sort [B, R, n] records by rank: n^2 comparisons per row, then a one-hot max places each record."""
    batch, count, size = records.shape
    rows = _rows(records)
    before = _before([row.unsqueeze(1) for row in rows], [row.unsqueeze(2) for row in rows])  # [B, i, j]: j < i
    rank = before.sum(2)  # [B, n]
    slots = records._arange_primitive(size, dtypes.int64, records.device).reshape(size, 1)
    chosen = rank.reshape(batch, 1, 1, size) == slots  # [B, 1, r, i]
    return where(chosen, records.unsqueeze(2), dtypes.min_value(dtypes.int64)).amax(3)


def _network_sort(records: Tensor) -> Tensor:
    """Pad rows to a power of two, sort blocks by counting, merge them with a bitonic network, crop."""
    batch, count, size = records.shape
    padded_size = 1 << (size - 1).bit_length()
    # padding records sort after every real one: the largest leading rows, then distinct positions beyond the row
    low = records._arange_primitive(padded_size - size, dtypes.int64, records.device) * 2 + 2 * size
    if count == 1:
        padding = (low + dtypes.max_value(dtypes.int32) * LOW_BITS).reshape(1, 1, -1)
    else:
        highest = low._full(low.shape, dtypes.max_value(dtypes.int64), dtypes.int64, low.device)
        padding = stack([highest] * (count - 1) + [low]).unsqueeze(0)
    padded = cat([records, padding.expand(batch, count, padded_size - size)], 2) if padded_size > size else records
    block = min(NETWORK_BLOCK, padded_size)
    blocks = padded.reshape(batch, count, padded_size // block, block).permute(0, 2, 1, 3)
    blocks = _counting_sort(blocks.reshape(-1, count, block)).reshape(batch, padded_size // block, count, block)
    merged = blocks.permute(0, 2, 1, 3).reshape(batch, count, padded_size).contiguous()
    steps = []
    width = 2 * block
    while width <= padded_size:
        steps.append((width // 2, True))  # each element meets its mirror image in its block of `width`
        steps.extend((distance, False) for distance in _halvings(width // 4))  # then the element `distance` away
        width *= 2
    upper = records._arange_primitive(2, dtypes.int64, records.device).reshape(2, 1) == 1
    for number, (distance, mirror) in enumerate(steps):
        merged = _compare_exchange(merged, distance, mirror, upper)
        if (number + 1) % STEPS_PER_KERNEL == 0 and number + 1 < len(steps):
            merged = _stored(merged)
    return merged._pad_and_shrink([(0, 0), (0, 0), (0, size - padded_size)])


def _stored(records: Tensor) -> Tensor:
    """Records [B, R, N] stored as rows of STORED_ROW, which a CPU lowers as one row per work item (opt.row_tile):
    the partners' index arithmetic (a division and remainder per axis) is done once per row and the offsets within
    it are constants, where a flat [B, R, N] store paid it for every record (10^6 float32: ~10 ms a kernel, now
    ~2 ms on the C backend). A device with warps tiles no row this long and lowers it as before."""
    batch, count, size = records.shape
    row = min(STORED_ROW, size)
    return records.reshape(batch * count, size // row, row).contiguous().reshape(batch, count, size)


def _halvings(distance: int) -> list[int]:
    result = []
    while distance >= 1:
        result.append(distance)
        distance //= 2
    return result


def _compare_exchange(records: Tensor, distance: int, mirror: bool, upper: Tensor) -> Tensor:
    """One network step: in each group of 2 * distance, element i meets its partner (i + distance, or the mirror
    image 2 * distance - 1 - i); the lower half keeps the record that sorts first, the upper half the other."""
    batch, count, size = records.shape
    grouped = records.reshape(batch, count, size // (2 * distance), 2, distance)
    partner = grouped._apply(Op.FLIP, arg=(3, 4) if mirror else (3,))
    partner_first = _before(_rows(partner), _rows(grouped))  # [B, G, 2, D]
    take_partner = partner_first._apply(Op.XOR, upper.expand(partner_first.shape))
    if count > 1:
        take_partner = take_partner.unsqueeze(1).expand(grouped.shape)
    else:
        take_partner = take_partner.reshape(grouped.shape)
    return take_partner._apply(Op.WHERE, partner, grouped).reshape(batch, count, size)
