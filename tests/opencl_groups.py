"""A test backend, "openclgroups:0": the first OpenCL device (PoCL here) with a GPU's warp width in its DeviceInfo, so
that workgroup kernels (ir/group_reduce.py, ir/group_matmul.py, ir/flash_attention.py), which a CPU device's own
DeviceInfo never asks for, run on it."""

from __future__ import annotations

from dataclasses import replace

from ember.backends.base import Device
from ember.backends.opencl import OpenCLDevice
from ember.backends.opencl import probe as probe_opencl


def probe() -> list[Device]:
    first = probe_opencl()[0]
    assert isinstance(first, OpenCLDevice)
    device = OpenCLDevice("openclgroups:0", first.cl_device)
    device.info = replace(device.info, warp_width=32)
    return [device]
