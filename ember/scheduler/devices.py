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
        from ember.settings import CONFIG

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
    if name == "cpu" or name.startswith("cpu:"):  # torch's name for the host: ember's c device
        name = "c" + name[3:]
    cached = _resolved.get(name)
    if cached is not None:
        return cached
    resolved = REGISTRY.device(name).name
    _resolved[name] = resolved
    return resolved


def get_device(name: str) -> Device:
    return REGISTRY.device(name)


NOT_COMPUTE_BACKENDS = ("dummy", "disk")  # devices that hold or render, never listed as somewhere to compute


def compute_devices() -> list[str]:
    """The names of every device that computes (probing each backend once)."""
    return [device.name for backend, devices in REGISTRY.available().items() if backend not in NOT_COMPUTE_BACKENDS
            for device in devices]


def backend_device(backend: str, which: Any, caller: str) -> str:
    """The device `which` of a backend (None: its first; an int index; 'cuda:1'), as x.cuda() and x.cpu() want it,
    or a DeviceError naming why the backend has none and which devices there are."""
    try:
        devices = REGISTRY.probe(backend)
    except (BackendUnavailable, DeviceError):
        reason = REGISTRY.unavailable.get(backend, "unknown backend")
        raise DeviceError(
            f"{caller}: no {backend} device: {reason}; available devices: {', '.join(compute_devices()) or 'none'}"
        ) from None
    if which is None:
        return devices[0].name
    index_text = str(which.name if isinstance(which, Device) else which)
    if index_text.startswith(f"{backend}:"):
        index_text = index_text.partition(":")[2]
    elif index_text == backend:
        return devices[0].name
    if isinstance(which, bool) or not index_text.lstrip("-").isdigit():
        raise DeviceError(f"{caller}: expected a {backend} device index or '{backend}:N', got {which!r}")
    name = f"{backend}:{int(index_text)}"
    if name not in [device.name for device in devices]:
        raise DeviceError(f"{caller}: no device {name}; the {backend} devices are "
                          f"{', '.join(device.name for device in devices)}")
    return name
