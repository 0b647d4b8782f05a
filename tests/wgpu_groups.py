"""A test backend, "wgpugroups:0": the WebGPU adapter (lavapipe here) with a GPU's warp width in its DeviceInfo, so
that workgroup kernels (ir/group_reduce.py), which a CPU adapter's own DeviceInfo never asks for, run on it."""

from __future__ import annotations

from dataclasses import replace

from ember.backends.base import Device
from ember.backends.wgpu import WGPUDevice, request_adapter


def probe() -> list[Device]:
    device = WGPUDevice(request_adapter(), "wgpugroups:0")
    device.info = replace(device.info, warp_width=32)
    return [device]


def group_devices(test_devices: list[str]) -> list[str]:
    """The devices here that run workgroup kernels: this backend's device where wgpu is among `test_devices` (its
    lavapipe's own DeviceInfo asks for none), tests/opencl_groups.py's likewise where opencl is (PoCL), and the PTX
    simulator (an H100's DeviceInfo)."""
    from ember.backends.registry import REGISTRY

    devices = ["ptxsim:0"]
    if any(name.startswith("opencl") for name in test_devices):
        devices.insert(0, REGISTRY.probe("openclgroups")[0].name)
    if any(name.startswith("wgpu") for name in test_devices):
        devices.insert(0, REGISTRY.probe("wgpugroups")[0].name)
    return devices
