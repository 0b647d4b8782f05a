"""Progress bars (tqdm, on stderr) for long work: shown when stderr is a terminal or EMBER_PROGRESS=1, never when
EMBER_PROGRESS=0."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Self


def progress_enabled() -> bool:
    """EMBER_PROGRESS=1 shows bars, 0 hides them; unset, they are shown when stderr is a terminal."""
    setting = os.environ.get("EMBER_PROGRESS", "")
    if setting in ("0", "1"):
        return setting == "1"
    return sys.stderr.isatty()


class Progress:
    """A progress bar of `total` steps with a description, or nothing at all when bars are off (or `shown` is
    False: work too short for one); `advance` may be called from several threads. Use as a context manager: the bar
    is closed at the end of the block."""

    def __init__(self, total: int, description: str, unit: str = "step", shown: bool = True) -> None:
        self._bar: Any = None
        self._lock = threading.Lock()
        if shown and progress_enabled():
            from tqdm import tqdm  # type: ignore[import-untyped]

            self._bar = tqdm(total=total, desc=description, unit=unit, file=sys.stderr, leave=False,
                             dynamic_ncols=True)

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.update(steps)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exception: object) -> None:
        self.close()
