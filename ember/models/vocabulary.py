"""A tokenizer's pieces -> ids, compact: the pieces as packed UTF-8 (io/gguf.PackedStrings) and a sorted table of
their hashes, ~6 MB for Gemma's 262,144 pieces where a dict of str objects took ~38 MB (the tokenizer was a tenth
of `python -m ember generate`'s peak memory)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import pairwise

import numpy as np

from ember.io.gguf import PackedStrings

HASHED_AT_ONCE = 8192  # pieces whose hashes are computed in one batch


class Vocabulary(Mapping[str, int]):
    """Pieces -> ids as a read-only mapping (`in`, `[]`, `get`, iteration over the pieces in id order). A piece
    listed twice maps to its last id, as a dict built over the list would. A lookup hashes the piece's UTF-8 bytes,
    finds the hash by bisection and compares the bytes of the pieces that share it (a few microseconds)."""

    def __init__(self, pieces: PackedStrings) -> None:
        self.pieces = pieces
        data, offsets = pieces.data, pieces.offsets
        hashes = np.empty(len(pieces), dtype=np.int64)
        for first in range(0, len(pieces), HASHED_AT_ONCE):  # (a list of every offset: 9 MB of int objects)
            bounds = offsets[first : first + HASHED_AT_ONCE + 1].tolist()
            hashes[first : first + len(bounds) - 1] = [hash(data[start:end]) for start, end in pairwise(bounds)]
        self._ids = np.argsort(hashes, kind="stable")  # equal hashes in id order: the last match is a dict's
        self._hashes = hashes[self._ids]

    def id_of(self, piece: object) -> int | None:
        """The id of a piece, or None (also for a key that is not a str)."""
        if not isinstance(piece, str):
            return None
        key = piece.encode("utf-8")
        digest = hash(key)
        position = int(np.searchsorted(self._hashes, digest))
        found = None
        while position < len(self._hashes) and self._hashes[position] == digest:
            candidate = int(self._ids[position])
            if self.pieces.encoded(candidate) == key:
                found = candidate
            position += 1
        return found

    def get(self, piece: str, default: int | None = None) -> int | None:  # type: ignore[override]
        found = self.id_of(piece)
        return default if found is None else found

    def __getitem__(self, piece: str) -> int:
        found = self.id_of(piece)
        if found is None:
            raise KeyError(piece)
        return found

    def __contains__(self, piece: object) -> bool:
        return self.id_of(piece) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.pieces)

    def __len__(self) -> int:
        return len(self.pieces)
