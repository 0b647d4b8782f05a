"""Python's cyclic garbage collector paused while ember builds many short-lived objects that form no cycles.

Lowering a kernel makes hundreds of thousands of IR nodes, lowering requests and generators; each is freed by its
reference count, but their number triggers the collector's full passes, and a full pass walks every object the
program holds (its modules, tensors, graphs): on a cold start about half the time spent lowering kernels went to
those passes. `collection_paused()` turns the collector off for such a stretch and back on after it, where it was on
(nested uses and a user's own `gc.disable()` are respected); what the stretch left behind is collected by the
collector's next ordinary pass. Realize, lowering, `backward()` and a recurrent layer's time steps run paused.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0  # stretches in progress, in any thread
_paused_by_us = False  # whether the outermost stretch turned the collector off (so that it turns it back on)


@contextmanager
def collection_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the duration (reference counting still frees everything else)."""
    global _depth, _paused_by_us
    with _lock:
        if _depth == 0:
            _paused_by_us = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _paused_by_us:
                _paused_by_us = False
                gc.enable()
