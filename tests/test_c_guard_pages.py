"""No c kernel reads or writes outside its buffers: in a subprocess, every buffer of the c device's pool is placed
against an inaccessible page (right after its last byte, or right before its first), and kernels whose vectors
are built near a buffer's ends (a row's even and odd elements picked from vector loads, a padded copy's strided
phases, a max pool's windows, a strided convolution forward and backward, odd-sized matmuls, reductions and a
softmax over rows of odd lengths) run on it: a read or write past an end would take the process down with a
segmentation fault (as it would a user's), so the test asks for the child's "ok". Values are numpy's and torch's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import ctypes, mmap, sys
import numpy as np
import torch
import ember as em
import ember.nn.functional as F
from ember.backends import c as c_backend

PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
PLACEMENT = sys.argv[1]


class GuardedArray(c_backend.HostArray):
    "A buffer against an inaccessible page (its mapping kept alive by the array's base)."


def create_buffer(self, nbytes):
    pages = -(-max(nbytes, 1) // PAGE) + 1
    region = mmap.mmap(-1, pages * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    if PLACEMENT == "after":  # the buffer's last byte is the last before the guard page
        guard, start = base + (pages - 1) * PAGE, (pages - 1) * PAGE - nbytes
    else:  # the buffer's first byte is the first after the guard page
        guard, start = base, PAGE
    if libc.mprotect(guard, PAGE, 0) != 0:
        raise OSError(ctypes.get_errno(), "mprotect failed")
    array = np.ndarray.__new__(GuardedArray, nbytes, np.uint8, region, start)
    array.address = base + start
    return array


c_backend.HostMemoryPool.create_buffer = create_buffer
generator = np.random.default_rng(0)


def data(*shape):
    values = generator.standard_normal(shape).astype(np.float32)
    values.flat[::97] = np.nan
    values.flat[5::101] = np.inf
    return values


def close(ember_value, expected, tolerance=1e-4):
    np.testing.assert_allclose(ember_value.numpy(), np.asarray(expected, dtype=np.float32), rtol=tolerance,
                               atol=tolerance)


for shape in [(63, 130), (5, 33), (3, 16), (7, 31)]:
    values = data(*shape)
    x = em.tensor(values, device="c")
    close(x[:, ::2] + 1, values[:, ::2] + 1)
    close(x[:, 1::2] * 2, values[:, 1::2] * 2)
    close(F.pad(x, (1, 1))[:, ::2], np.pad(values, ((0, 0), (1, 1)))[:, ::2])
    close(x[:, ::3].contiguous(), values[:, ::3])
    close(x.sum(1), values.sum(1), 1e-3)
    close(x.softmax(1), torch.tensor(values).softmax(1))
images = data(2, 3, 10, 11)
close(F.max_pool2d(em.tensor(images, device="c"), 2), torch.nn.functional.max_pool2d(torch.tensor(images), 2))
for (n, c, h, w), (o, k, stride, pad) in [((2, 4, 11, 11), (5, 3, 2, 1)), ((1, 3, 16, 16), (8, 3, 2, 1)),
                                           ((2, 16, 9, 9), (16, 3, 1, 1))]:
    inputs = generator.standard_normal((n, c, h, w)).astype(np.float32)
    weights = generator.standard_normal((o, c, k, k)).astype(np.float32)
    x = em.tensor(inputs, device="c").requires_grad_()
    weight = em.tensor(weights, device="c").requires_grad_()
    tx, tw = torch.tensor(inputs, requires_grad=True), torch.tensor(weights, requires_grad=True)
    out = x.conv2d(weight, stride=stride, padding=pad)
    expected = torch.nn.functional.conv2d(tx, tw, stride=stride, padding=pad)
    close(out, expected.detach(), 1e-3)
    gradient = generator.standard_normal(tuple(expected.shape)).astype(np.float32)
    out.backward(em.tensor(gradient, device="c"))
    expected.backward(torch.tensor(gradient))
    close(x.grad, tx.grad, 1e-3)
    close(weight.grad, tw.grad, 1e-2)
for a_shape, b_shape in [((127, 255), (255, 63)), ((64, 128), (128, 512)), ((3, 17, 9), (3, 9, 33)),
                         ((200, 300), (300, 100))]:
    a, b = generator.standard_normal(a_shape).astype(np.float32), generator.standard_normal(b_shape).astype(np.float32)
    transposed = np.ascontiguousarray(np.swapaxes(b, -1, -2))  # (B read transposed: x @ W.T)
    close(em.tensor(a, device="c") @ em.tensor(b, device="c"), a @ b, 1e-3)
    close(em.tensor(a, device="c") @ em.tensor(transposed, device="c").mT, a @ b, 1e-3)
print("ok")
"""


@pytest.mark.parametrize("placement", ["after", "before"])
def test_c_kernels_stay_inside_their_buffers(placement: str) -> None:
    environment = dict(os.environ, EMBER_NOOPT="0", OMP_NUM_THREADS="2")
    done = subprocess.run([sys.executable, "-c", SCRIPT, placement], capture_output=True, text=True, timeout=600,
                          check=False, env=environment)
    assert done.stdout.strip().endswith("ok"), (
        f"the child ended with {done.returncode} (-11: a segmentation fault, a kernel reading or writing past a "
        f"buffer's {'end' if placement == 'after' else 'start'}):\n{done.stderr[-3000:]}")
