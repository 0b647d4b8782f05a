"""Backend discovery: built-in backends and the `ember.backends` entry point, probed lazily, with reasons."""

from __future__ import annotations

import importlib
import threading
import traceback
from importlib import metadata
from typing import Any

from ember.backends.base import Device
from ember.core.errors import BackendUnavailable, DeviceError

BUILTIN_BACKENDS: dict[str, str] = {
    "c": "ember.backends.c",
    "opencl": "ember.backends.opencl",
    "wgpu": "ember.backends.wgpu",
    "cuda": "ember.backends.cuda",
    "dummy": "ember.backends.dummy",
    "disk": "ember.backends.disk",
}
PREFERENCE = ("c", "opencl", "wgpu", "cuda")  # the default device is the first available of these


class Registry:
    """Every backend ember knows of; each is imported and probed the first time it is asked for."""

    def __init__(self) -> None:
        self.modules: dict[str, str | Any] = dict(BUILTIN_BACKENDS)
        self.devices: dict[str, list[Device]] = {}
        self.unavailable: dict[str, str] = {}
        self._entry_points_loaded = False
        # name -> (its backend, the backend's device list when it was found, the device)
        self._by_name: dict[str, tuple[str, list[Device], Device]] = {}
        self._lock = threading.RLock()  # probing (a backend's probe may ask for another backend's devices)

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        try:
            points = metadata.entry_points(group="ember.backends")
        except Exception:  # noqa: BLE001 - a broken environment must not break import ember
            return
        for point in points:
            self.modules.setdefault(point.name, point)

    def backend_names(self) -> list[str]:
        self._load_entry_points()
        return list(self.modules)

    def probe(self, backend: str) -> list[Device]:
        """The devices of one backend, or a BackendUnavailable/DeviceError saying why there are none. One thread
        probes at a time: two threads asking for a backend first at once get the same devices (two wgpu devices
        made at once, one thread's buffers bound on the other's device, abort the interpreter in wgpu-core)."""
        devices = self.devices.get(backend)
        if devices is not None:
            return devices
        with self._lock:
            return self._probe(backend)

    def _probe(self, backend: str) -> list[Device]:
        self._load_entry_points()
        if backend in self.devices:
            return self.devices[backend]
        if backend in self.unavailable:
            raise BackendUnavailable(f"backend '{backend}' is not available: {self.unavailable[backend]}")
        if backend not in self.modules:
            raise DeviceError(f"unknown backend '{backend}'; known backends: {', '.join(self.backend_names())}")
        from ember.settings import CONFIG

        always_on = ("dummy", "disk")
        if CONFIG.enabled_backends is not None and backend not in CONFIG.enabled_backends and backend not in always_on:
            self.unavailable[backend] = f"disabled by the configuration ({CONFIG.source}); enabled: " + ", ".join(
                CONFIG.enabled_backends
            )
            raise BackendUnavailable(f"backend '{backend}' is not available: {self.unavailable[backend]}")
        source = self.modules[backend]
        try:
            module = source.load() if hasattr(source, "load") else importlib.import_module(source)
            devices = list(module.probe())
            if not devices:
                raise BackendUnavailable("the backend found no devices")
        except BackendUnavailable as error:
            self.unavailable[backend] = str(error)
            raise BackendUnavailable(f"backend '{backend}' is not available: {error}") from None
        except Exception as error:  # noqa: BLE001 - a broken driver is reported, never fatal
            reason = f"{type(error).__name__}: {error}"
            self.unavailable[backend] = reason
            if __import__("os").environ.get("EMBER_DEBUG"):
                traceback.print_exc()
            raise BackendUnavailable(f"backend '{backend}' is not available: {reason}") from None
        for device in devices:
            limit = CONFIG.pool_limits.get(device.name)
            if limit is not None:
                device.pool.limit_bytes = limit
        self.devices[backend] = devices
        return devices

    def available(self) -> dict[str, list[Device]]:
        """Probe every backend; the devices of those that work."""
        found = {}
        for backend in self.backend_names():
            try:
                found[backend] = self.probe(backend)
            except (BackendUnavailable, DeviceError):
                pass
        return found

    def device(self, name: str) -> Device:
        """The device called `name` ("c:0", "opencl:1", "dummy:c")."""
        cached = self._by_name.get(name)
        if cached is not None and cached[1] is self.devices.get(cached[0]):  # the hot path: every op asks
            return cached[2]
        backend, _, which = name.partition(":")
        devices = self.probe(backend)
        for device in devices:
            if device.name == name or (which == "" and device is devices[0]):
                self._by_name[name] = (backend, devices, device)
                return device
        listed = ", ".join(device.name for device in devices)
        raise DeviceError(f"no device '{name}'; backend '{backend}' has {listed}")


REGISTRY = Registry()
