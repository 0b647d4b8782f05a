"""The scheduler's lock: what several threads share on the way to the devices (the schedule and compile caches'
entries, memory pools, deferred frees, device queues) is used by one thread at a time.

Realizes, reads, writes, uploads and ember.jit replays hold it while they run (re-entrant: a realize started inside
one on the same thread, by a check or a callback, goes on). Kernels are launched asynchronously and compiles run in
their own threads, so what it serializes is mostly the Python bookkeeping. A buffer dropped by a thread that does
not hold it is not released there (a finalizer must not wait for another thread): it joins the deferred frees, which
the next realize gives back (buffers.py)."""

from __future__ import annotations

import threading

SCHEDULER_LOCK = threading.RLock()
# the bound methods, called positionally, for the per-op path (`with SCHEDULER_LOCK:` costs about twice as much)
acquire, release = SCHEDULER_LOCK.acquire, SCHEDULER_LOCK.release
