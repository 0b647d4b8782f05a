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
