"""The disk cache of kernel search winners: the winning plan of a kernel, keyed by the kernel's structure, the code
that lowers it and the device's fingerprint; an entry that fails its checks falls back to the default, with a
SearchWarning."""

from __future__ import annotations

import dataclasses
import functools
import json
import platform
import warnings
from pathlib import Path
from typing import Any

from ember import cache
from ember.capabilities import host_cpu_field
from ember.ir.kernel import Kernel
from ember.ir.lowered_cache import code_digest
from ember.ir.opt import Plan
from ember.ir.search_space import plan_from_data, plan_to_data

FORMAT = 1  # the version of a winner entry's payload (an entry of another version is stale)


class SearchWarning(RuntimeWarning):
    """A kernel search winner on disk could not be used (corrupt or stale): the kernel uses its default lowering."""


def _stable(value: Any) -> str:
    """A text for a capability value that is the same in every process (sets are sorted, not in hash order)."""
    if isinstance(value, (set, frozenset)):
        return "{" + ",".join(sorted(_stable(item) for item in value)) + "}"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_stable(item) for item in value) + ")"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{_stable(item)}" for key, item in sorted(value.items())) + "}"
    return str(value)


@functools.cache
def _processor() -> str:
    """The CPU's model name (what a C kernel's speed depends on besides the capabilities), where the OS says it."""
    return host_cpu_field("model name") or platform.processor()


def device_fingerprint(device: Any) -> str:
    """What identifies a device for timings: its backend class, name, every capability, the machine and its CPU."""
    info = device.info
    capabilities = {field.name: getattr(info, field.name) for field in dataclasses.fields(info)}
    return _stable((type(device).__module__, type(device).__qualname__, device.name, capabilities,
                    platform.machine(), _processor()))


def entry_path(kernel: Kernel, name: str, fingerprint: str) -> Path:
    """Where the winner of `kernel` (named `name`) on the device with this fingerprint lives."""
    return cache.entry_path("search", "\n".join((code_digest(), name, repr(kernel), fingerprint)))


def load_winner(path: Path, kernel: Kernel, name: str) -> Plan | None:
    """The winning plan stored at `path`, or None where there is none; an entry that is corrupt, of another format
    or not a plan of this kernel is deleted, with a SearchWarning (the kernel then uses its default lowering)."""
    if not path.exists():
        return None
    payload = cache.read_entry(path)  # (deletes an entry failing its checksums)
    if payload is None:
        warn_unusable(name, path, "the entry is corrupt (it fails its checksums)")
        return None
    try:
        data = json.loads(payload.decode())
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format') if isinstance(data, dict) else None!r}, "
                             f"this ember reads {FORMAT}")
        if data.get("name") != name:
            raise ValueError(f"it is the winner of kernel {data.get('name')!r}")
        return plan_from_data(data.get("plan"), kernel)
    except (ValueError, UnicodeDecodeError) as error:
        cache.discard(path)
        warn_unusable(name, path, f"the entry is stale ({error})")
        return None


def warn_unusable(name: str, path: Path, reason: str) -> None:
    """Say that a stored winner is not used, why, and what happens instead."""
    warnings.warn(f"ember: the kernel search winner of {name} at {path} is not used: {reason}; the kernel uses its "
                  f"default lowering (EMBER_SEARCH=<beam width> searches it again)", SearchWarning, stacklevel=4)


def store_winner(path: Path, name: str, plan: Plan, default_seconds: float, winner_seconds: float) -> None:
    """Write the winner of kernel `name` (and both timings, for people reading the cache)."""
    data = {"format": FORMAT, "name": name, "plan": plan_to_data(plan), "default_seconds": default_seconds,
            "winner_seconds": winner_seconds}
    cache.write_entry(path, json.dumps(data).encode())
