"""The per-call context: grad mode, active profiles, memory budget, jit capture, trace recording and debug output,
one immutable object per thread and per asyncio task (a contextvars.ContextVar); a new thread starts from the
defaults (grad enabled, nothing recorded, EMBER_DEBUG and EMBER_VIZ as read at import), as torch's grad mode does.

Every switch (`no_grad`, `ember.profile()`, `ember.memory_budget`, `ember.jit`'s capture, `ember.record_trace`,
`set_debug_level`) sets a new object with its field changed in the calling thread's context only, and restores its
field on exit. The realize path reads the object once per realize (`CONTEXT.get()`), never a module global."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any


class CallContext:
    """What the calls of one thread (or task) are inside of. Never changed in place: `replace` makes a new one."""

    __slots__ = ("budget", "debug_level", "grad_enabled", "inference", "plain", "profiles", "recorder", "trace",
                 "viz_folder", "_grad_twin")

    def __init__(self, grad_enabled: bool = True, inference: bool = False, profiles: tuple[Any, ...] = (),
                 budget: int | None = None, recorder: Any = None, trace: Any = None, debug_level: int = 0,
                 viz_folder: str = "") -> None:
        self.grad_enabled = grad_enabled  # ops on tensors that require grad record their history (no_grad: off)
        self.inference = inference  # inside ember.inference_mode()
        self.profiles = profiles  # the ember.profile() records open (innermost last), each given what runs
        self.budget = budget  # ember.memory_budget: bytes per pool a realize may hold, or None
        self.recorder = recorder  # the ember.jit capture in progress (capture/recording.Recorder), or None
        self.trace = trace  # the trace being recorded (plan/trace.Trace), or None
        self.debug_level = debug_level  # EMBER_DEBUG or set_debug_level: 0 quiet .. 5 every copy and free
        self.viz_folder = viz_folder  # EMBER_VIZ: where each realize writes its graph as DOT ("": nowhere)
        # nothing to record, time, budget or print: a realize may launch from a schedule's launch plan
        self.plain = budget is None and recorder is None and not profiles and debug_level == 0
        self._grad_twin: CallContext | None = None

    def replace(self, **changes: Any) -> CallContext:
        """A copy with `changes` (field name -> value)."""
        fields = {name: getattr(self, name) for name in FIELDS}
        fields.update(changes)
        return CallContext(**fields)

    def with_grad(self, enabled: bool) -> CallContext:
        """This context with grad recording `enabled` (the copy is kept, with no link back that would make a cycle
        holding a capture's buffers: composite ops switch grad off around each op)."""
        if self.grad_enabled == enabled:
            return self
        twin = self._grad_twin
        if twin is None:
            twin = self._grad_twin = self.replace(grad_enabled=enabled)
        return twin

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in FIELDS)
        return f"CallContext({shown})"


FIELDS = ("grad_enabled", "inference", "profiles", "budget", "recorder", "trace", "debug_level", "viz_folder")


def _debug_level_from_environment() -> int:
    text = os.environ.get("EMBER_DEBUG", "0") or "0"
    try:
        return int(text)
    except ValueError:
        print(f"ember: EMBER_DEBUG={text!r} is not a number (use 0-5); debug output stays off", file=sys.stderr)
        return 0


DEFAULTS = CallContext(debug_level=_debug_level_from_environment(), viz_folder=os.environ.get("EMBER_VIZ", ""))
CONTEXT: ContextVar[CallContext] = ContextVar("ember_call_context", default=DEFAULTS)
current = CONTEXT.get  # the calling thread's (task's) context


def update(**changes: Any) -> CallContext:
    """Change fields of the calling thread's (task's) context from now on; returns the context it had before."""
    before = CONTEXT.get()
    CONTEXT.set(before.replace(**changes))
    return before


@contextmanager
def overriding(**changes: Any) -> Iterator[CallContext]:
    """Change fields of the calling thread's context inside the block, restoring each changed field after it."""
    before = update(**changes)
    try:
        yield CONTEXT.get()
    finally:
        update(**{name: getattr(before, name) for name in changes})


def set_defaults(**changes: Any) -> None:
    """Change the defaults in place: what every thread that has not changed its context yet runs in (and each new
    one starts from). For what the environment turns on for the whole process when ember is imported (EMBER_TRACE):
    a thread that changed its context before keeps its own."""
    fields = DEFAULTS.replace(**changes)
    for name in (*FIELDS, "plain"):
        setattr(DEFAULTS, name, getattr(fields, name))
    DEFAULTS._grad_twin = None
