"""ember's disk cache: the folder, the one checked entry format every cache uses (atomic writes, checksums), a
scratch folder for builds, the size bound, and the one warning when the folder cannot be used."""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import tempfile
import threading
import time
import warnings
from array import array
from collections.abc import Iterator
from pathlib import Path

# An entry is one file `<folder>/<sha256 of its key, hex>.entry`:
#   MAGIC, the format version (uint32), the sha256 of the key (32 bytes), the payload's length (uint64), the sha256
#   of the payload (32 bytes), then the payload.
# A reader checks all of them; an entry that fails any check (truncated, corrupt, another format, another key) is
# deleted and reported missing, so its producer rebuilds it: a cached payload never reaches a compiler, a loader or
# a driver unchecked. Writers write a temporary file and rename it over the entry, so readers never see half an entry.
# A payload that passes these checks is still only bytes someone wrote under this key: each consumer checks that it
# is what the key names (the kernels a library or program defines, the IR's name) and discards it when not.
MAGIC = b"EMBER-CACHE\n"
FORMAT_VERSION = 1
_HEADER = struct.Struct(f"<{len(MAGIC)}sI32sQ32s")

LIMIT_VARIABLE = "EMBER_CACHE_LIMIT"
DEFAULT_LIMIT_BYTES = 2 * 1024**3  # the disk cache's size bound unless EMBER_CACHE_LIMIT says
TRIM_TO = 0.8  # a trim deletes the least recently used entries until the cache holds this share of the bound
TRIM_EVERY = 16  # ... and runs at a process's first write, then after each 1/TRIM_EVERY of the bound written
STALE_TEMPORARY_SECONDS = 3600.0  # temporary files and build folders older than this are a dead process's

_warned: set[str] = set()  # cache folders already warned about in this process
_created: set[Path] = set()  # folders known to exist (a mkdir per lookup costs a system call)
_lock = threading.Lock()
_written_since_trim: int | None = None  # bytes written since the last trim (None: no trim in this process yet)
_trimming: threading.Thread | None = None  # the trim a write started (`_start_trim`)


class CacheWarning(RuntimeWarning):
    """ember's disk cache folder cannot be used (unwritable, missing, not a folder): kernels are built again."""


def root() -> Path:
    """The cache folder: EMBER_CACHE_DIR, else $XDG_CACHE_HOME/ember, else ~/.cache/ember."""
    return Path(os.environ.get("EMBER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "ember"))


def warn_unusable(folder: Path, error: BaseException) -> None:
    """Say once per process and cache folder that it cannot be used, and why (each use then costs a rebuild)."""
    base = str(root())
    with _lock:
        if base in _warned:
            return
        _warned.add(base)
    reason = f"{type(error).__name__}: {error}"
    warnings.warn(f"ember: the disk cache folder {base} cannot be written ({reason}, at {folder}); kernels built "
                  f"now are not cached, so each process builds them again (set EMBER_CACHE_DIR to a writable folder)",
                  CacheWarning, stacklevel=3)


def cache_directory(*parts: str) -> Path:
    """ember's disk cache folder (or the folder `parts` inside it), created if it can be; one that cannot be is
    still returned (reads then find nothing and writes are skipped, after one CacheWarning)."""
    path = root().joinpath(*parts)
    if path not in _created:
        try:
            path.mkdir(parents=True, exist_ok=True)
            _created.add(path)
        except OSError as error:  # read-only, a file in the way, no permission: a rebuild, never an error
            if not path.is_dir():
                warn_unusable(path, error)
    return path


def entry_path(kind: str, key: str) -> Path:
    """Where the entry of `key` in the cache folder `kind` ("c", "opencl", "ir", ...) lives."""
    return cache_directory(kind) / f"{hashlib.sha256(key.encode()).hexdigest()}.entry"


def read_entry(path: Path) -> bytes | None:
    """The payload of the entry at `path`, or None when there is none or it fails a check (then it is deleted).
    A hit marks the entry used (its modification time), which the size bound's trim goes by."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) >= _HEADER.size:
        magic, version, key_digest, length, checksum = _HEADER.unpack_from(data)
        payload = data[_HEADER.size:]
        if (magic == MAGIC and version == FORMAT_VERSION and key_digest.hex() == path.stem
                and length == len(payload) and hashlib.sha256(payload).digest() == checksum):
            with contextlib.suppress(OSError):  # a read-only cache is still read
                os.utime(path)
            return payload
    discard(path)
    return None


def write_entry(path: Path, payload: bytes) -> None:
    """Write the entry at `path` (from entry_path) atomically; a cache that cannot be written only costs a rebuild
    (with one CacheWarning per process)."""
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, bytes.fromhex(path.stem), len(payload),
                          hashlib.sha256(payload).digest())
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        try:
            temporary.write_bytes(header + payload)
        except FileNotFoundError:  # the folder went since it was made (a test's, a user's clean-up): made again
            _created.discard(path.parent)
            cache_directory(path.parent.name)
            temporary.write_bytes(header + payload)
        os.replace(temporary, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        warn_unusable(path.parent, error)
        return
    _count_written(len(header) + len(payload))


def discard(path: Path) -> None:
    """Delete an entry (one that failed a check, or whose payload its consumer rejected); in a read-only cache it
    stays, and is rejected again at each read."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def load(kind: str, key: str) -> bytes | None:
    """The checked payload cached under `key` in `kind`, or None."""
    return read_entry(entry_path(kind, key))


def store(kind: str, key: str, payload: bytes) -> Path:
    """Cache `payload` under `key` in `kind`; the entry's path."""
    path = entry_path(kind, key)
    write_entry(path, payload)
    return path


@contextlib.contextmanager
def scratch_directory(kind: str, prefix: str, warn: bool = True) -> Iterator[Path]:
    """A temporary folder for a build, inside the cache folder `kind` where it can be written (the same file
    system as its entries), else in the system's temporary folder (with the CacheWarning, unless `warn` is False:
    loading from a read-only cache is no loss)."""
    try:
        try:
            folder = tempfile.TemporaryDirectory(prefix=prefix, dir=cache_directory(kind))
        except FileNotFoundError:  # the folder went since it was made: made again
            _created.discard(root() / kind)
            folder = tempfile.TemporaryDirectory(prefix=prefix, dir=cache_directory(kind))
    except OSError as error:
        if warn:
            warn_unusable(cache_directory(kind), error)
        folder = tempfile.TemporaryDirectory(prefix=prefix)
    with folder as name:
        yield Path(name)


# ---- the size bound ------------------------------------------------------------------------------------------


def limit_bytes() -> int:
    """The disk cache's size bound: EMBER_CACHE_LIMIT ('500MB', '2GiB', a byte count), else DEFAULT_LIMIT_BYTES."""
    from ember.settings import parse_bytes  # (a pure function: no backend is loaded)

    text = os.environ.get(LIMIT_VARIABLE, "").strip()
    return parse_bytes(text, LIMIT_VARIABLE) if text else DEFAULT_LIMIT_BYTES


def _count_written(nbytes: int) -> None:
    global _written_since_trim
    with _lock:
        due = _written_since_trim is None or _written_since_trim + nbytes >= limit_bytes() // TRIM_EVERY
        _written_since_trim = 0 if due else (_written_since_trim or 0) + nbytes
    if due:
        _start_trim()


def _start_trim() -> None:
    """trim() in a thread of its own, unless one is running: a cache of hundreds of thousands of entries takes a
    second or more to list, which the write that found the trim due (a first kernel's) should not wait for."""
    global _trimming
    with _lock:
        if _trimming is not None and _trimming.is_alive():
            return
        _trimming = threading.Thread(target=_trim_quietly, name="ember-cache-trim", daemon=True)
        _trimming.start()


def _trim_quietly() -> None:
    try:
        trim()
    except Exception:  # noqa: BLE001, S110 - a trim is housekeeping: a failed one leaves the cache as it was
        pass


def wait_for_trim() -> None:
    """Wait for the trim a write started in the background (tests; a process needing the bound kept now)."""
    thread = _trimming
    if thread is not None:
        thread.join()


def trim(limit: int | None = None) -> int:
    """Delete the least recently used entries (by modification time: reads touch it) until the cache holds at most
    TRIM_TO of `limit` (default limit_bytes()), once it holds more than `limit`; also temporary files and build
    folders a dead process left. Returns the bytes deleted. Entries another process deletes meanwhile are skipped;
    one a reader needs later is rebuilt (a library's index entry whose library went is discarded on read).

    The entries are listed twice, streamed, keeping only each one's time and size in compact arrays (16 bytes an
    entry): a list of every entry's path and status took ~1.5 KB each, 670 MB for a cache of 446,000 lowered
    kernels, in every process that wrote one (the first write of a process trims)."""
    import numpy as np

    limit = limit_bytes() if limit is None else limit
    base, now = root(), time.time()
    try:
        folders = [folder for folder in base.iterdir() if folder.is_dir()]
    except OSError:
        return 0
    times, sizes = array("d"), array("q")
    for folder in folders:
        for name, status in _entries(folder):
            if name.endswith(".entry"):
                times.append(status.st_mtime)
                sizes.append(status.st_size)
            elif now - status.st_mtime > STALE_TEMPORARY_SECONDS and (
                    name.endswith(".tmp") or name.startswith("ember-")):
                path = folder / name
                _remove_stale(path, path.is_dir())
    total = sum(sizes)
    if total <= limit:
        return 0
    # the newest modification time among the oldest entries that together hold what must go
    order = np.argsort(np.frombuffer(times, dtype=np.float64), kind="stable")
    needed = total - int(limit * TRIM_TO)
    held = np.cumsum(np.frombuffer(sizes, dtype=np.int64)[order])
    cutoff = float(times[int(order[min(int(np.searchsorted(held, needed)), len(order) - 1)])])
    del order, held, times, sizes
    deleted = 0
    for folder in folders:
        for name, status in _entries(folder):
            if deleted >= needed:
                return deleted
            if name.endswith(".entry") and status.st_mtime <= cutoff:
                try:
                    (folder / name).unlink()
                    deleted += status.st_size
                except OSError:
                    continue
    return deleted


def _entries(folder: Path) -> Iterator[tuple[str, os.stat_result]]:
    """The names in a cache folder with their status, streamed (a file that goes meanwhile is skipped)."""
    try:
        with os.scandir(folder) as children:
            for child in children:
                try:
                    yield child.name, child.stat(follow_symlinks=False)
                except OSError:
                    continue
    except OSError:
        return


def _remove_stale(path: Path, is_folder: bool) -> None:
    import shutil

    if is_folder:
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
