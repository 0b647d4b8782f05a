"""Gemma's tokenizer from a GGUF file's `tokenizer.ggml.*` metadata: SentencePiece BPE with byte fallback, in Python.

The file lists the vocabulary, each token's type and score, and no merges. Encoding follows the tokenizer
transformers builds from the same file (the reference the tests compare with, id for id):

1. Control tokens (`<bos>`, `<start_of_turn>`, ...) and user-defined ones (`<b>`, `\\n\\n`, `\\t`, ...) are cut out of
   the raw text first, leftmost-longest, and become their own ids.
2. In the text between them a space is written `▁` (there is no dummy prefix and no other normalization), and the
   text is split into characters; a character outside the vocabulary becomes its UTF-8 bytes (`<0xE2>` ...).
3. Adjacent pieces whose concatenation is a token are merged, the best pair first, until none is left. A pair is
   better when its merged token comes earlier in the vocabulary (Gemma's order of merges; its scores put the
   user-defined tokens first), then when its left piece is longer; among equal pairs the leftmost is merged.

A token of spaces only is stored as real spaces ("  ") but stands for "▁▁": it is reached by merges, not cut out.
"""

from __future__ import annotations

import heapq
import os
import re
from collections.abc import Iterable, Sequence

import numpy as np

from ember.io.gguf import PackedStrings, pack_strings
from ember.models.vocabulary import Vocabulary

SPACE = "\u2581"  # SentencePiece's visible space
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # tokenizer.ggml.token_type values


class SentencePieceTokenizer:
    """Text to token ids and back for a SentencePiece BPE vocabulary (a GGUF file's `llama` tokenizer model)."""

    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int],
        bos_id: int | None,
        eos_id: int | None,
        unknown_id: int | None,
        add_bos: bool = True,
    ) -> None:
        if len(tokens) != len(token_types):
            raise ValueError(f"SentencePieceTokenizer: {len(tokens)} tokens but {len(token_types)} token types")
        packed = tokens if isinstance(tokens, PackedStrings) else pack_strings(tokens)
        self.token_types = bytes(token_types)  # small ints, a byte each (262,144 of them for Gemma)
        # tokens of spaces only stand for as many "▁" (the merges reach them like any other token)
        lengths = np.diff(packed.offsets)
        starts_with_space = np.flatnonzero(lengths > 0)
        starts_with_space = starts_with_space[np.frombuffer(packed.data, dtype=np.uint8)[
            packed.offsets[starts_with_space]] == 0x20].tolist()
        spaces_only = [index for index in starts_with_space if not packed.encoded(index).strip(b" ")]
        self.pieces = packed.with_strings({index: SPACE * int(lengths[index]) for index in spaces_only})
        self.ids = Vocabulary(self.pieces)
        self.bos_id, self.eos_id, self.unknown_id, self.add_bos = bos_id, eos_id, unknown_id, add_bos
        types = np.frombuffer(self.token_types, dtype=np.uint8)
        self.byte_ids = {int(piece[3:5], 16): int(index) for index in np.flatnonzero(types == BYTE)
                         if re.fullmatch(r"<0x[0-9A-F]{2}>", piece := self.pieces[int(index)])}
        self.special_ids = frozenset(np.flatnonzero(types == CONTROL).tolist())
        replaced = set(spaces_only)
        whole = [self.pieces[index] for index in np.flatnonzero((types == CONTROL) | (types == USER_DEFINED)).tolist()
                 if lengths[index] > 0 and index not in replaced]
        # an alternation tried longest first finds the leftmost-longest match
        whole.sort(key=len, reverse=True)
        self.whole_tokens = re.compile("|".join(map(re.escape, whole))) if whole else None

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> SentencePieceTokenizer:
        """The tokenizer stored in a GGUF file's metadata (`tokenizer.ggml.model` must be `llama`)."""
        from ember.io import read_gguf_header

        metadata = read_gguf_header(path, skip_keys=("tokenizer.ggml.scores",),  # (the order is the merges')
                                    packed_keys=("tokenizer.ggml.tokens",)).metadata
        model = metadata.get("tokenizer.ggml.model")
        if model != "llama":
            raise ValueError(f"{path}: tokenizer.ggml.model is {model!r}; SentencePieceTokenizer reads only 'llama' "
                             "(SentencePiece) vocabularies")
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            if key not in metadata:
                raise ValueError(f"{path}: the metadata has no {key}")
        return cls(
            metadata["tokenizer.ggml.tokens"],
            metadata["tokenizer.ggml.token_type"],
            bos_id=metadata.get("tokenizer.ggml.bos_token_id"),
            eos_id=metadata.get("tokenizer.ggml.eos_token_id"),
            unknown_id=metadata.get("tokenizer.ggml.unknown_token_id"),
            add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", True)),
        )

    def __len__(self) -> int:
        return len(self.pieces)

    def token_id(self, token: str) -> int:
        """The id of a token as the vocabulary spells it (`"<end_of_turn>"`), or a KeyError naming it."""
        found = self.ids.get(token)
        if found is None:
            raise KeyError(f"the vocabulary has no token {token!r}")
        return found

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """The token ids of `text`, after the beginning-of-text id when add_bos (default: the file's setting)."""
        if not isinstance(text, str):
            raise TypeError(f"encode: text must be a str, got {type(text).__name__}")
        ids = [self.bos_id] if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None else []
        start = 0
        if self.whole_tokens is not None:
            for match in self.whole_tokens.finditer(text):
                ids.extend(self._merge(text[start : match.start()]))
                ids.append(self.ids[match.group()])
                start = match.end()
        ids.extend(self._merge(text[start:]))
        return ids

    def _initial_pieces(self, text: str) -> list[str]:
        pieces: list[str] = []
        for character in text.replace(" ", SPACE):
            if character in self.ids:
                pieces.append(character)
                continue
            encoded = character.encode("utf-8")
            if all(byte in self.byte_ids for byte in encoded):
                pieces.extend(self.pieces[self.byte_ids[byte]] for byte in encoded)
            elif self.unknown_id is None:
                raise ValueError(f"encode: {character!r} is not in the vocabulary, which has no byte or unknown tokens")
            elif not pieces or pieces[-1] != self.pieces[self.unknown_id]:  # runs of unknowns fuse into one
                pieces.append(self.pieces[self.unknown_id])
        return pieces

    def _merge(self, text: str) -> list[int]:
        """BPE over one stretch of text without whole tokens: merge the best adjacent pair until none is left."""
        pieces = self._initial_pieces(text)
        following = list(range(1, len(pieces) + 1))
        preceding = list(range(-1, len(pieces) - 1))
        queue: list[tuple[int, int, int, str, str]] = []

        def push(left: int) -> None:
            right = following[left]
            if right < len(pieces):
                merged = self.ids.get(pieces[left] + pieces[right])
                if merged is not None:
                    heapq.heappush(queue, (merged, -len(pieces[left]), left, pieces[left], pieces[right]))

        for position in range(len(pieces) - 1):
            push(position)
        while queue:
            _, _, left, left_piece, right_piece = heapq.heappop(queue)
            right = following[left]
            if pieces[left] != left_piece or right >= len(pieces) or pieces[right] != right_piece:
                continue  # a stale pair: one of its pieces was merged into another since
            pieces[left] = left_piece + right_piece
            pieces[right] = ""
            following[left] = following[right]
            if following[left] < len(pieces):
                preceding[following[left]] = left
            if preceding[left] >= 0:
                push(preceding[left])
            push(left)
        return [self.ids[piece] for piece in pieces if piece]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of token ids: `▁` becomes a space, runs of byte tokens their UTF-8 text (U+FFFD per invalid
        byte, as transformers' decoder gives); control tokens are left out when skip_special_tokens."""
        parts: list[str] = []
        pending = bytearray()
        for index in ids:
            index = int(index)
            if not 0 <= index < len(self.pieces):
                raise IndexError(f"decode: id {index} is outside the vocabulary of {len(self.pieces)} tokens")
            if self.token_types[index] == BYTE:
                pending.append(int(self.pieces[index][3:5], 16))
                continue
            if pending:
                parts.append(_bytes_text(bytes(pending)))
                pending.clear()
            if skip_special_tokens and index in self.special_ids:
                continue
            parts.append(self.pieces[index].replace(SPACE, " "))
        if pending:
            parts.append(_bytes_text(bytes(pending)))
        return "".join(parts)


def _bytes_text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(data)
