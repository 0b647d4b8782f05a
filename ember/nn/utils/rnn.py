"""Variable-length sequences for recurrent layers, with torch's names: PackedSequence, packing, padding, unpadding.

Packing and padding are one gather each (index_select of rows by an index computed on the host from the
lengths), so gradients flow through them and a batch costs one kernel, not one per time step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import ember as em
from ember.core.tensor import Tensor


def _int_list(values: Any, what: str) -> list[int]:
    """Lengths, batch sizes or indices as Python ints (from a list, tuple, numpy array or ember tensor)."""
    if isinstance(values, Tensor):
        if values.ndim != 1:
            raise ValueError(f"{what} must be a 1-d tensor, got shape {values.shape}")
        values = values.tolist()
    elif hasattr(values, "tolist"):
        values = values.tolist()
    return [int(value) for value in values]


def _host_indices(values: Sequence[int]) -> Tensor:
    """A 1-d int64 tensor on ember's CPU device, as torch keeps lengths and batch sizes on the CPU."""
    return em.tensor(list(values), dtype=em.int64)


def invert_permutation(permutation: Tensor | None) -> Tensor | None:
    """The permutation that undoes `permutation` (None for None)."""
    if permutation is None:
        return None
    order = _int_list(permutation, "permutation")
    inverse = [0] * len(order)
    for position, index in enumerate(order):
        inverse[index] = position
    return em.tensor(inverse, dtype=em.int64, device=permutation.device)


class _PackedSequenceFields(NamedTuple):
    data: Tensor
    batch_sizes: Tensor
    sorted_indices: Tensor | None
    unsorted_indices: Tensor | None


class PackedSequence(_PackedSequenceFields):
    """The rows of a batch of sequences in time order: at step t, the first batch_sizes[t] sequences (longest first).

    sorted_indices[j] is the batch index of the j-th longest sequence (None when the batch was already sorted);
    unsorted_indices is its inverse.
    """

    def __new__(
        cls,
        data: Tensor,
        batch_sizes: Tensor | None = None,
        sorted_indices: Tensor | None = None,
        unsorted_indices: Tensor | None = None,
    ) -> PackedSequence:
        if batch_sizes is None:
            raise TypeError("PackedSequence: batch_sizes is required (use pack_padded_sequence or pack_sequence)")
        if unsorted_indices is None:
            unsorted_indices = invert_permutation(sorted_indices)
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def to(self, *args: Any, **kwargs: Any) -> PackedSequence:
        """Move or cast data (the indices follow data's device; batch_sizes stay on the CPU, as torch's)."""
        data = self.data.to(*args, **kwargs)
        if data is self.data:
            return self
        move = (lambda index: None if index is None else index.to(data.device))
        return type(self)(data, self.batch_sizes, move(self.sorted_indices), move(self.unsorted_indices))

    def cpu(self) -> PackedSequence:
        return self.to("cpu")

    def cuda(self, device: Any = None) -> PackedSequence:
        return self.to(self.data.cuda(device).device)

    def float(self) -> PackedSequence:
        return self.to(dtype=em.float32)

    def double(self) -> PackedSequence:
        return self.to(dtype=em.float64)

    def half(self) -> PackedSequence:
        return self.to(dtype=em.float16)

    @property
    def is_cuda(self) -> bool:
        return str(self.data.device).startswith("cuda")

    def is_pinned(self) -> bool:
        return False


def _sorting(lengths: list[int], enforce_sorted: bool) -> list[int] | None:
    """The batch order longest first, None where `lengths` are already in decreasing order as enforce_sorted asks."""
    if enforce_sorted:
        if any(later > earlier for earlier, later in zip(lengths, lengths[1:])):
            raise RuntimeError(
                "`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. You can pass "
                "`enforce_sorted=False` to pack_padded_sequence and/or pack_sequence to sidestep this requirement "
                "if you do not need ONNX exportability."
            )
        return None
    return sorted(range(len(lengths)), key=lambda index: -lengths[index])  # stable, as torch's sort on the CPU


def _batch_sizes(sorted_lengths: list[int]) -> list[int]:
    return [sum(1 for length in sorted_lengths if length > time) for time in range(sorted_lengths[0])]


def _pack_rows(flat: Tensor, row_of: Any, lengths: list[int], enforce_sorted: bool) -> PackedSequence:
    """Gather the packed rows from `flat` (one row per (sequence, time)); row_of(sequence, time) is its row."""
    if not lengths:
        raise ValueError("pack: expected at least one sequence")
    if min(lengths) <= 0:
        raise RuntimeError(
            "Length of all samples has to be greater than 0, but found an element in 'lengths' that is <= 0"
        )
    order = _sorting(lengths, enforce_sorted)
    sorted_order = order if order is not None else list(range(len(lengths)))
    batch_sizes = _batch_sizes([lengths[index] for index in sorted_order])
    rows = [row_of(sorted_order[position], time) for time, size in enumerate(batch_sizes) for position in range(size)]
    data = flat.index_select(0, em.tensor(rows, dtype=em.int64, device=flat.device))
    sorted_indices = None if order is None else em.tensor(order, dtype=em.int64, device=flat.device)
    return PackedSequence(data, _host_indices(batch_sizes), sorted_indices, None)


def pack_padded_sequence(
    input: Tensor,  # noqa: A002
    lengths: Any,
    batch_first: bool = False,
    enforce_sorted: bool = True,
) -> PackedSequence:
    """Pack a padded batch (T, B, *) ((B, T, *) with batch_first) of sequences of the given lengths."""
    lengths = _int_list(lengths, "lengths")
    if input.ndim < 2:
        raise ValueError(f"pack_padded_sequence: expected an input of at least 2 dims (T, B, *), got {input.shape}")
    batch = input.shape[0] if batch_first else input.shape[1]
    steps = input.shape[1] if batch_first else input.shape[0]
    if len(lengths) != batch:
        raise ValueError(
            f"Expected `len(lengths)` to be equal to batch_size, but got {len(lengths)} (batch_size={batch})"
        )
    if lengths and max(lengths) > steps:
        raise RuntimeError(
            f"pack_padded_sequence: a length ({max(lengths)}) is larger than the padded sequences' length ({steps})"
        )
    flat = input.reshape(batch * steps, *input.shape[2:])
    if batch_first:
        return _pack_rows(flat, lambda sequence, time: sequence * steps + time, lengths, enforce_sorted)
    return _pack_rows(flat, lambda sequence, time: time * batch + sequence, lengths, enforce_sorted)


def pack_sequence(sequences: Sequence[Tensor], enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of sequences (L_i, *) (longest first unless enforce_sorted=False)."""
    lengths = [sequence.shape[0] for sequence in sequences]
    starts = [sum(lengths[:index]) for index in range(len(lengths))]
    flat = em.cat(list(sequences)) if sequences else None
    if flat is None:
        raise ValueError("pack_sequence: expected at least one sequence")
    return _pack_rows(flat, lambda sequence, time: starts[sequence] + time, lengths, enforce_sorted)


def _sequence_lengths(batch_sizes: list[int]) -> list[int]:
    """Length of each sequence in sorted order, from the batch sizes."""
    return [sum(1 for size in batch_sizes if size > position) for position in range(batch_sizes[0])]


def pad_packed_sequence(
    sequence: PackedSequence,
    batch_first: bool = False,
    padding_value: float = 0.0,
    total_length: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Undo pack_padded_sequence: (padded (T, B, *) or (B, T, *), lengths in the original batch order)."""
    batch_sizes = _int_list(sequence.batch_sizes, "batch_sizes")
    steps = len(batch_sizes)
    if total_length is not None:
        if total_length < steps:
            raise ValueError(
                "Expected total_length to be at least the length of the longest sequence in input, but got "
                f"total_length={total_length} and max sequence length being {steps}"
            )
        steps = total_length
    batch = batch_sizes[0]
    data = sequence.data
    unsorted = (
        list(range(batch)) if sequence.unsorted_indices is None else _int_list(sequence.unsorted_indices, "indices")
    )
    offsets = [sum(batch_sizes[:time]) for time in range(len(batch_sizes))]
    padding_row = data.shape[0]
    rows = []
    for outer in range(batch if batch_first else steps):
        for inner in range(steps if batch_first else batch):
            original, time = (outer, inner) if batch_first else (inner, outer)
            position = unsorted[original]
            rows.append(offsets[time] + position if time < len(batch_sizes) and position < batch_sizes[time]
                        else padding_row)
    padding = em.full((1, *data.shape[1:]), padding_value, dtype=data.dtype, device=data.device)
    gathered = em.cat([data, padding]).index_select(0, em.tensor(rows, dtype=em.int64, device=data.device))
    shape = (batch, steps) if batch_first else (steps, batch)
    sorted_lengths = _sequence_lengths(batch_sizes)
    lengths = [sorted_lengths[unsorted[original]] for original in range(batch)]
    return gathered.reshape(*shape, *data.shape[1:]), _host_indices(lengths)


def pad_sequence(
    sequences: Tensor | Iterable[Tensor],
    batch_first: bool = False,
    padding_value: float = 0.0,
    padding_side: str = "right",
) -> Tensor:
    """Stack sequences (L_i, *) into (max L, B, *) ((B, max L, *) with batch_first), padded on `padding_side`."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"Expected padding_side to be one of left or right, but got {padding_side}.")
    parts = list(sequences.unbind(0)) if isinstance(sequences, Tensor) else list(sequences)
    if not parts:
        raise RuntimeError("received an empty list of sequences")
    longest = max(part.shape[0] for part in parts)
    padded = []
    for part in parts:
        missing = longest - part.shape[0]
        if missing:
            filler = em.full((missing, *part.shape[1:]), padding_value, dtype=part.dtype, device=part.device)
            part = em.cat([part, filler] if padding_side == "right" else [filler, part])
        padded.append(part)
    return em.stack(padded, dim=0 if batch_first else 1)


def unpad_sequence(padded_sequences: Tensor, lengths: Any, batch_first: bool = False) -> list[Tensor]:
    """Undo pad_sequence: the list of sequences padded_sequences[:L_i, i] (right padding)."""
    lengths = _int_list(lengths, "lengths")
    batched = padded_sequences if batch_first else padded_sequences.transpose(0, 1)
    return [batched[index, :length] for index, length in enumerate(lengths)]


def unpack_sequence(packed_sequences: PackedSequence) -> list[Tensor]:
    """Undo pack_sequence: the list of sequences in their original order."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
