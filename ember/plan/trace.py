"""Recording a trace of a run (`ember.record_trace(path)`, EMBER_TRACE=path): which graphs ran with their schedules, kernel
times, the memory plans of jit captures and the dirty regions of incremental updates, written as JSON for
`python -m ember plan` (plan/planner.py)."""

from __future__ import annotations

import atexit
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ember.context import CONTEXT, DEFAULTS, set_defaults, update
from ember.core.graph import Node
from ember.scheduler import profile
from ember.plan.kernel_codec import CodecError, encode, signature_digest

TRACE_FORMAT = "ember-trace"
TRACE_VERSION = 1


class Trace:
    """What one recording saw; `write` saves it. Each graph structure is kept once, with how often it ran."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.schedules: dict[str, dict[str, Any]] = {}  # signature digest -> its schedule and run count
        self.digests: dict[tuple, str] = {}  # signature -> its digest (a training loop repeats a few structures)
        self.kernel_times: dict[str, dict[str, Any]] = {}  # kernel name -> device, runs, seconds
        self.arenas: dict[str, dict[str, Any]] = {}  # arena key -> a jit capture's memory plan on one device
        self.regions: list[dict[str, Any]] = []  # dirty regions reported by incremental updates (record_region)
        self.unencodable = 0  # graphs whose structure has no JSON form (left out of the trace)
        self.compiles = 0  # kernels compiled while recording (what a plan saves a later run)
        self.timing = profile.Profile()  # on the profile stack while recording: launch.py times every kernel

    def record_realize(self, key: tuple, items: list[Any], graph_nodes: list[Node],
                       extra_slots: tuple[Any, ...] = ()) -> None:
        """One realize of the graph with signature `key`, run as the steps `items` of its program (program.py), whose
        slots past the graph's nodes are `extra_slots` (CommandProgram.extra_slots)."""
        from ember.scheduler.program import Copy

        digest = self.digests.get(key)
        if digest is None:
            try:
                digest = self.digests[key] = signature_digest(key)
            except CodecError:
                self.unencodable += 1
                return
        entry = self.schedules.get(digest)
        if entry is None:
            roots = set(key[1])
            encoded: list[dict[str, Any]] = []
            keep: list[dict[str, Any]] = []
            devices: list[str | None] = []
            for item in items:
                if isinstance(item, Copy):
                    encoded.append({"copy": [item.output, item.source]})
                    continue
                node = graph_nodes[item.output]
                encoded.append({"kernel": [item.output, list(item.inputs), encode(item.kernel)],
                                "device": node.device})
                devices.append(node.device)
                if item.output not in roots:  # an intermediate the kernelizer decided to store
                    keep.append({"position": item.output, "shape": list(node.shape), "dtype": node.dtype.name,
                                 "device": node.device, "bytes": node.size * node.dtype.itemsize})
                    link = extra_slots[item.output - len(key[0])][3] if item.output >= len(key[0]) else None
                    if link is not None:  # (a node of a template's copy, kept for it after the run)
                        keep[-1]["link"] = list(link)
            # (the key lists the graph's nodes; slots past them hold nodes of templates' graphs: schedule.py)
            entry = self.schedules[digest] = {"signature": digest, "runs": 0, "nodes": len(key[0]),
                                              "devices": sorted({str(name) for name in devices}), "items": encoded, "keep": keep}
        entry["runs"] += 1
        self._collect_kernel_times()

    def _collect_kernel_times(self) -> None:
        """Fold the kernels timed since the last call into `kernel_times`, and count the compiles (the profile's
        lists are emptied, so a long traced run does not grow them)."""
        for record in self.timing.kernels:
            times = self.kernel_times.setdefault(record.name, {"device": record.device, "runs": 0, "seconds": 0.0})
            times["runs"] += 1
            times["seconds"] += record.seconds
        self.compiles += len(self.timing.compiles)
        for listed in (self.timing.kernels, self.timing.compiles, self.timing.copies):
            listed.clear()

    def record_arena(self, device: str, alignment: int, lifetimes: list[tuple[int, int, int]], offsets: list[int],
                     arena_bytes: int, peak_bytes: int) -> None:
        """A jit capture's arena on `device`: each intermediate's (bytes, first, last command) and its offset."""
        key = arena_key(device, alignment, lifetimes)
        self.arenas[key] = {"device": device, "alignment": alignment, "lifetimes": [list(t) for t in lifetimes],
                            "offsets": list(offsets), "arena_bytes": arena_bytes, "peak_bytes": peak_bytes}

    def as_json(self) -> dict[str, Any]:
        from ember.plan.planner import environment

        return {"format": TRACE_FORMAT, "version": TRACE_VERSION, **environment(), "schedules":
                list(self.schedules.values()), "kernel_times": self.kernel_times, "jit_arenas":
                list(self.arenas.values()), "regions": self.regions, "unencodable_graphs": self.unencodable,
                "compiles": self.compiles}

    def write(self) -> None:
        self._collect_kernel_times()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps(self.as_json()))
        os.replace(temporary, self.path)


def arena_key(device: str, alignment: int, lifetimes: list[tuple[int, int, int]]) -> str:
    """The name of one arena layout problem: the device, the alignment and the buffers' lifetimes."""
    return f"{device}|{alignment}|" + ";".join(f"{size},{first},{last}" for size, first, last in lifetimes)


def start(path: str | os.PathLike[str]) -> Trace:
    """Start recording a trace to `path` of what the calling thread runs (one at a time per thread)."""
    context = CONTEXT.get()
    if context.trace is not None:
        raise RuntimeError(f"ember.record_trace: already recording a trace to {context.trace.path}; "
                           "finish it before starting another")
    active = Trace(path)
    update(trace=active, profiles=(*context.profiles, active.timing))  # launch.py times every kernel
    return active


def stop() -> Trace | None:
    """Stop recording and write the trace; the trace, or None when none was being recorded."""
    active = _end()
    if active is not None:
        active.write()
    return active


def discard() -> None:
    """Stop recording without writing anything (`python -m ember plan` under EMBER_TRACE must not overwrite the
    trace it reads)."""
    _end()


def _end() -> Trace | None:
    """Take the trace being recorded out of the calling thread's context (and out of the defaults every thread
    starts from, when EMBER_TRACE put it there); the trace, or None."""
    active = CONTEXT.get().trace
    if active is None:
        return None
    if DEFAULTS.trace is active:
        set_defaults(trace=None, profiles=_without(DEFAULTS.profiles, active.timing))
    context = CONTEXT.get()
    if context.trace is active:
        update(trace=None, profiles=_without(context.profiles, active.timing))
    return active


def _without(profiles: tuple[profile.Profile, ...], timing: profile.Profile) -> tuple[profile.Profile, ...]:
    return tuple(record for record in profiles if record is not timing)


@contextmanager
def record_trace(path: str | os.PathLike[str]) -> Iterator[Trace]:
    """Record what every realize inside the block runs and write it to `path` (JSON) at the end:
    `with ember.record_trace("trace.json"): step()`, then `python -m ember plan trace.json`. Kernels are timed (each
    launch waits for its kernel, as under EMBER_DEBUG=2), so a traced run is slower."""
    recording = start(path)
    try:
        yield recording
    finally:
        if CONTEXT.get().trace is recording:
            stop()


def record_region(node: str, shape: tuple[int, ...], ranges: list[tuple[int, int]]) -> None:
    """The hook for incremental updates (ember/incremental): the runner calls it with each node's dirty region (a
    name for the node, its shape and one half-open range per axis) when it recomputes only that region; the trace's
    `regions` field lists them in order (empty while nothing calls this)."""
    active = CONTEXT.get().trace
    if active is not None:
        active.regions.append({"node": node, "shape": list(shape), "ranges": [list(r) for r in ranges]})


def start_from_environment() -> None:
    """EMBER_TRACE=path: record the whole run and write the trace when the process exits. The variable is removed
    from the environment, so child processes (ember's own OpenCL probe, a user's workers) do not record into, and
    overwrite, the same file."""
    path = os.environ.pop("EMBER_TRACE", None)
    if path and DEFAULTS.trace is None:
        active = Trace(path)
        set_defaults(trace=active, profiles=(*DEFAULTS.profiles, active.timing))  # every thread records into it
        atexit.register(_stop_environment_trace, active)


def _stop_environment_trace(active: Trace) -> None:
    """At exit: write EMBER_TRACE's trace, unless it was stopped (and written or discarded) already."""
    if DEFAULTS.trace is active:
        set_defaults(trace=None, profiles=_without(DEFAULTS.profiles, active.timing))
        active.write()
