"""ember.cuda: torch.cuda's everyday questions (is there a GPU, how many, wait for it) answered by the cuda backend."""

from __future__ import annotations

from typing import Any

from ember.backends.registry import REGISTRY
from ember.core.errors import BackendUnavailable, DeviceError


def _devices() -> list[Any]:
    try:
        return list(REGISTRY.probe("cuda"))
    except (BackendUnavailable, DeviceError):
        return []


def is_available() -> bool:
    """Whether the cuda backend found a GPU (a driver, cuda-python and at least one device)."""
    return bool(_devices())


def device_count() -> int:
    """How many cuda devices there are (0 without a GPU)."""
    return len(_devices())


def _device(device: Any, caller: str) -> Any:
    from ember.scheduler.devices import backend_device

    return REGISTRY.device(backend_device("cuda", device, f"ember.cuda.{caller}"))


def current_device() -> int:
    """The index of the device `x.cuda()` uses (the first one); a DeviceError saying why where there is none."""
    return int(_device(None, "current_device").name.partition(":")[2])


def get_device_name(device: Any = None) -> str:
    """The GPU's name as the driver reports it (the device's name where the driver gives none)."""
    found = _device(device, "get_device_name")
    return str(found.info.extra.get("name") or found.info.extra.get("device") or found.name)


def synchronize(device: Any = None) -> None:
    """Wait until every kernel and copy queued on the device has finished."""
    found = _device(device, "synchronize")
    if hasattr(found, "synchronize"):
        found.synchronize()


def manual_seed(seed: int) -> None:
    """Seed the random numbers (ember has one counter-based generator for every device, so this is manual_seed)."""
    from ember.core.creation import manual_seed as seed_every_device

    seed_every_device(seed)


manual_seed_all = manual_seed
