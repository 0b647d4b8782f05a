"""Device names: the default device (EMBER_DEVICE or the first available), resolving 'opencl' to 'opencl:0'."""

from __future__ import annotations

from typing import Any

from ember.backends.base import Device
from ember.backends.registry import PREFERENCE, REGISTRY
from ember.core.errors import BackendUnavailable, DeviceError


class DefaultDevice:
    name: str | None = None


def set_default_device(device: Any) -> None:
    """Make `device` the device new tensors are created on when they name none."""
    DefaultDevice.name = resolve_device(device) if device is not None else None


def get_default_device() -> str:
    if DefaultDevice.name is None:
        from ember.backends.config import CONFIG

        requested = CONFIG.default_device
        if requested:
            DefaultDevice.name = resolve_device(requested)
        else:
            for backend in PREFERENCE:
                try:
                    DefaultDevice.name = REGISTRY.probe(backend)[0].name
                    break
                except BackendUnavailable:
                    continue
            else:
                reasons = "; ".join(f"{name}: {why}" for name, why in REGISTRY.unavailable.items())
                raise DeviceError(f"no device is available ({reasons})")
    return DefaultDevice.name


_resolved: dict[str, str] = {}


def resolve_device(device: Any) -> str:
    """The canonical name of a device ('opencl' -> 'opencl:0'); None means the default device."""
    if device is None:
        return get_default_device()
    name = str(device.name if isinstance(device, Device) else device)
    if name == "cpu":
        name = "c"
    cached = _resolved.get(name)
    if cached is not None:
        return cached
    resolved = REGISTRY.device(name).name
    _resolved[name] = resolved
    return resolved


def get_device(name: str) -> Device:
    return REGISTRY.device(name)
