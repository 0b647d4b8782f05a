"""Python's cyclic garbage collector paused while ember builds many short-lived objects that form no cycles.

Lowering a kernel makes hundreds of thousands of IR nodes, lowering requests and generators; each is freed by its
reference count, but their number triggers the collector's full passes, and a full pass walks every object the
program holds (its modules, tensors, graphs): on a cold start about half the time spent lowering kernels went to
those passes. `collection_paused()` turns the collector off for such a stretch and back on after it, where it was on
(nested uses and a user's own `gc.disable()` are respected); what the stretch left behind is collected by the
collector's next ordinary pass. Realize, lowering, `backward()` and a recurrent layer's time steps run paused.

`tune_young_generation()` (at `import ember`) raises the youngest generation's threshold from Python's 700 to
`YOUNG_GENERATION_THRESHOLD`: a training step's graph lives for the whole step, so each young pass found it alive and
promoted it, and the promoted objects are what sets off full passes (one once they reach a quarter of everything the
program holds, ~170 ms with torch and scikit-learn imported). The full passes' cost per step is four times the
objects one step promotes, whatever the heap's size: the VAE's mean step was 2.5x its median (6.2 ms against 2.8),
with the threshold raised 2.6 ms. A threshold the program set itself (anything but Python's default) is left alone.
"""

from __future__ import annotations

import gc
import threading

PYTHON_YOUNG_THRESHOLD = 700  # CPython's default threshold of generation 0
YOUNG_GENERATION_THRESHOLD = 30_000  # allocations between young passes (a step's graph mostly freed by then)

_lock = threading.Lock()


class _Pause:
    """The one context manager `collection_paused` returns (a class, not a @contextmanager generator: every realize
    enters it, and the generator's machinery cost twice what the pause itself does, ~1.5 us)."""

    depth = 0  # stretches in progress, in any thread
    paused_by_us = False  # whether the outermost stretch turned the collector off (so that it turns it back on)

    def __enter__(self) -> None:
        with _lock:
            if _Pause.depth == 0:
                _Pause.paused_by_us = gc.isenabled()
                gc.disable()
            _Pause.depth += 1

    def __exit__(self, *exception: object) -> None:
        with _lock:
            _Pause.depth -= 1
            if _Pause.depth == 0 and _Pause.paused_by_us:
                _Pause.paused_by_us = False
                gc.enable()


_PAUSE = _Pause()


def collection_paused() -> _Pause:
    """The cyclic garbage collector off for the duration of a `with` block (reference counting still frees
    everything else)."""
    return _PAUSE


def tune_young_generation() -> None:
    """Raise generation 0's collection threshold to YOUNG_GENERATION_THRESHOLD where it is Python's default (the
    program's own `gc.set_threshold` is kept, before or after importing ember)."""
    young, middle, old = gc.get_threshold()
    if young == PYTHON_YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_GENERATION_THRESHOLD, middle, old)
