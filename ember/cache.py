"""ember's disk cache: the folder, and the one checked entry format every cache uses (atomic writes, checksums)."""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from pathlib import Path

# An entry is one file `<folder>/<sha256 of its key, hex>.entry`:
#   MAGIC, the format version (uint32), the sha256 of the key (32 bytes), the payload's length (uint64), the sha256
#   of the payload (32 bytes), then the payload.
# A reader checks all of them; an entry that fails any check (truncated, corrupt, another format, another key) is
# deleted and reported missing, so its producer rebuilds it: a cached payload never reaches a compiler, a loader or
# a driver unchecked. Writers write a temporary file and rename it over the entry, so readers never see half an entry.
MAGIC = b"EMBER-CACHE\n"
FORMAT_VERSION = 1
_HEADER = struct.Struct(f"<{len(MAGIC)}sI32sQ32s")


def cache_directory(*parts: str) -> Path:
    """ember's disk cache folder (EMBER_CACHE_DIR, else $XDG_CACHE_HOME/ember, else ~/.cache/ember), created."""
    base = os.environ.get("EMBER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ember"
    )
    path = Path(base, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def entry_path(kind: str, key: str) -> Path:
    """Where the entry of `key` in the cache folder `kind` ("c", "opencl", "ir", ...) lives."""
    return cache_directory(kind) / f"{hashlib.sha256(key.encode()).hexdigest()}.entry"


def read_entry(path: Path) -> bytes | None:
    """The payload of the entry at `path`, or None when there is none or it fails a check (then it is deleted)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) >= _HEADER.size:
        magic, version, key_digest, length, checksum = _HEADER.unpack_from(data)
        payload = data[_HEADER.size:]
        if (magic == MAGIC and version == FORMAT_VERSION and key_digest.hex() == path.stem
                and length == len(payload) and hashlib.sha256(payload).digest() == checksum):
            return payload
    discard(path)
    return None


def write_entry(path: Path, payload: bytes) -> None:
    """Write the entry at `path` (from entry_path) atomically; a cache that cannot be written only costs a rebuild."""
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, bytes.fromhex(path.stem), len(payload),
                          hashlib.sha256(payload).digest())
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        temporary.write_bytes(header + payload)
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)


def discard(path: Path) -> None:
    """Delete an entry (one that failed a check, or whose payload its consumer rejected)."""
    path.unlink(missing_ok=True)


def load(kind: str, key: str) -> bytes | None:
    """The checked payload cached under `key` in `kind`, or None."""
    return read_entry(entry_path(kind, key))


def store(kind: str, key: str, payload: bytes) -> Path:
    """Cache `payload` under `key` in `kind`; the entry's path."""
    path = entry_path(kind, key)
    write_entry(path, payload)
    return path
