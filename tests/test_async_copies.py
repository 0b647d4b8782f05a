"""Copies between pools are enqueued operations with events: the realize loop never waits for them, a read waits
only for the commands of what it reads, memory is freed only behind its commands, and the values match torch."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.backends.registry import REGISTRY
from ember.core.errors import BackendUnavailable
from ember.scheduler import profile
from ember.scheduler.buffers import DEFERRED_FREES, release_finished
from tests.helpers import assert_close, random_array
from tests.queued_device import QueuedDevice


def _first_device(backend: str) -> str | None:
    try:
        return REGISTRY.probe(backend)[0].name
    except BackendUnavailable:
        return None


OPENCL = _first_device("opencl")
needs_opencl = pytest.mark.skipif(OPENCL is None, reason="needs an OpenCL device")


@pytest.fixture(scope="module")
def queued() -> Iterator[QueuedDevice]:
    """The deferred-command test device of tests/queued_device.py, registered as the "queued" backend."""
    REGISTRY.modules["queued"] = "tests.queued_device"
    device = REGISTRY.probe("queued")[0]
    yield device
    device.synchronize()
    REGISTRY.modules.pop("queued", None)
    REGISTRY.devices.pop("queued", None)


def _kernels(labels: list[str]) -> list[str]:
    return [label for label in labels if not label.startswith("copy")]


def test_realize_enqueues_copies_and_a_read_runs_its_chain(queued: QueuedDevice) -> None:
    data = random_array((64,))
    x = em.tensor(data, device="c")
    y = (x.to("queued:0") * 2 + 1).to("c")
    queued.log.ran.clear()
    y.realize()
    assert queued.log.ran == []  # the copy in, the kernel and the copy out are all still queued
    values = y.numpy()
    assert queued.log.ran[0] == "copy in 256" and queued.log.ran[-1] == "copy out 256"
    assert len(_kernels(queued.log.ran)) == 1
    assert_close(em.tensor(values), torch.tensor(data) * 2 + 1)


def test_a_read_waits_only_for_what_it_reads(queued: QueuedDevice) -> None:
    data = random_array((5, 7))
    x = em.tensor(data, device="queued:0")
    first, second = (x * 3).sum(1), (x - 1).exp()
    em.realize(first, second)
    queued.log.ran.clear()
    first_values = first.numpy()
    assert len(_kernels(queued.log.ran)) == 1 and queued.log.ran[-1] == "copy out 20"  # not second's kernel
    second_values = second.numpy()
    assert len(_kernels(queued.log.ran)) == 2
    assert_close(em.tensor(first_values), (torch.tensor(data) * 3).sum(1))
    assert_close(em.tensor(second_values), (torch.tensor(data) - 1).exp())


def test_dropped_buffers_are_freed_only_after_their_commands(queued: QueuedDevice) -> None:
    pool = queued.pool
    data = random_array((100,))
    x = em.tensor(data, device="queued:0").realize()  # its memory now (em.tensor alone allocates at first use)
    gc.collect()
    release_finished()
    baseline = pool.used_bytes
    doubled = (x * 2).realize()
    shifted = (doubled + 1).realize()  # reads doubled's buffer in a command that has not run
    del doubled
    gc.collect()
    assert pool.used_bytes == baseline + 800 and len(DEFERRED_FREES) == 1  # dropped, still in use: not freed
    moved = x.to("c").realize()  # a copy out of a buffer, then the source dropped before the copy ran
    values = shifted.numpy()
    del shifted
    gc.collect()
    release_finished()
    assert queued.log.unsafe_frees == []
    assert pool.used_bytes == baseline and not DEFERRED_FREES
    np.testing.assert_array_equal(moved.numpy(), data)
    assert_close(em.tensor(values), torch.tensor(data) * 2 + 1)


def test_a_full_pool_waits_for_buffers_dropped_behind_commands(queued: QueuedDevice) -> None:
    pool = queued.pool
    gc.collect()
    release_finished()
    saved = pool.limit_bytes
    pool.limit_bytes = pool.used_bytes + 1000
    try:
        data = random_array((100,))
        x = em.tensor(data, device="queued:0").realize()  # 400 bytes
        y = (x + 1).realize()  # 400 bytes, queued
        del x
        gc.collect()
        z = (y * 2).realize()  # 400 more do not fit until x's buffer is released: that waits for y's command
        assert_close(z, (torch.tensor(data) + 1) * 2)
        with pytest.raises(em.OutOfMemoryError, match="queued:0: cannot allocate 4000 bytes"):
            em.zeros(1000, device="queued:0").realize()
    finally:
        pool.limit_bytes = saved


def test_many_frees_waiting_behind_commands_are_bounded(queued: QueuedDevice) -> None:
    """Events that report done only once waited must not hold memory back forever: past MAX_DEFERRED_FREES dropped
    buffers, the next realize waits for them and frees them."""
    from ember.scheduler import buffers

    x = em.tensor(random_array((4,)), device="queued:0")
    gc.collect()
    queued.synchronize()
    release_finished()
    for _ in range(buffers.MAX_DEFERRED_FREES + 1):
        (x + 1).realize()  # queued, never read, dropped at once
    assert len(DEFERRED_FREES) == buffers.MAX_DEFERRED_FREES + 1
    assert_close((x * 2).realize(), torch.tensor(x.numpy()) * 2)
    assert len(DEFERRED_FREES) <= 1 and queued.log.unsafe_frees == []


@needs_opencl
def test_opencl_launch_waits_for_the_copy_event_not_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.backends import opencl

    data = random_array((300,))
    expected = torch.tensor(data) * 2 - 1
    assert_close((em.tensor(data, device="c").to(OPENCL) * 2 - 1), expected)  # compiled and cached
    copies, launches, host_waits = [], [], []
    copy_in_async = opencl.OpenCLMemoryPool.copy_in_async
    enqueue_kernel = opencl.cl.enqueue_nd_range_kernel

    def recording_copy(self: Any, *args: Any, **kwargs: Any) -> Any:
        copies.append(copy_in_async(self, *args, **kwargs))
        return copies[-1]

    def recording_launch(*args: Any, **kwargs: Any) -> Any:
        launches.append(kwargs.get("wait_for"))
        return enqueue_kernel(*args, **kwargs)

    monkeypatch.setattr(opencl.OpenCLMemoryPool, "copy_in_async", recording_copy)
    monkeypatch.setattr(opencl.cl, "enqueue_nd_range_kernel", recording_launch)
    monkeypatch.setattr(opencl.OpenCLEvent, "wait", lambda self: host_waits.append(self) or self.event.wait())
    source = em.tensor(data, device="c").realize()  # its buffer exists now
    device = REGISTRY.device(OPENCL)
    gate = opencl.cl.UserEvent(device.context)  # the source "is still being written" until the test opens the gate
    source.node.buffer.event = opencl.OpenCLEvent(gate, device.context)
    result = (source.to(OPENCL) * 2 - 1).realize()  # returns with the copy and the launch still waiting
    assert len(copies) == 1 and len(launches) == 1 and host_waits == []
    assert not copies[0].done and copies[0].event in launches[0]
    queue_of = opencl.cl.event_info.COMMAND_QUEUE
    assert copies[0].event.get_info(queue_of) == device.transfer_queue != device.queue  # two queues, one event
    gate.set_status(opencl.cl.command_execution_status.COMPLETE)
    assert_close(result, expected)
    assert len(host_waits) == 1  # the read waited for its copy out, nothing else


@needs_opencl
def test_copies_both_ways_between_c_and_opencl_match_torch() -> None:
    a_data, b_data = random_array((17, 9)), random_array((9, 3), seed=1)
    a, b = em.tensor(a_data, device="c"), em.tensor(b_data, device=OPENCL)
    with em.profile() as record:
        on_opencl = (a.to(OPENCL) @ b).relu()
        back = (on_opencl.to("c") + a.sum(1, keepdim=True)).exp2()
        result = (back.to(OPENCL) * b.sum()).realize()
    assert [(s, t) for s, t, _ in record.copies] == [("c:0", OPENCL), (OPENCL, "c:0"), ("c:0", OPENCL)]
    a_torch, b_torch = torch.tensor(a_data), torch.tensor(b_data)
    expected = ((a_torch @ b_torch).relu() + a_torch.sum(1, keepdim=True)).exp2() * b_torch.sum()
    assert_close(result, expected, atol=1e-3, rtol=1e-4)


@needs_opencl
def test_copies_and_launches_on_two_queues_stay_ordered() -> None:
    """Large buffers through copy queue and compute queue and back, many times, each read checked."""
    generator = np.random.default_rng(0)
    for _ in range(25):
        data = generator.standard_normal(1 << 16, dtype=np.float32)
        x = em.tensor(data, device="c")
        on_device = x.to(OPENCL) * 3 + 1
        on_host = on_device.to("c") - 2
        again = (on_host.to(OPENCL) * on_device).to("c")
        expected = (data * 3 + 1 - 2) * (data * 3 + 1)
        np.testing.assert_allclose(again.numpy(), expected, rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(on_host.numpy(), data * 3 - 1, rtol=1e-6, atol=1e-6)


@needs_opencl
def test_a_copy_out_of_a_buffer_is_read_before_a_later_in_place_write() -> None:
    """OpenCL runs copies on a queue of their own: a kernel writing a buffer in place waits for the copies out of it
    enqueued before (Buffer.add_reader), not only for the kernels before it on its own queue. Before, a copy of a
    buffer (copies.copied_leaf, what an optimizer's or clip_grad_norm_'s replayed step keeps for a value held from
    before the step) read the in-place add enqueued after it 9 times in 10, and so did a copy to the host. Large
    buffers (64 MB), each way ten times; a replayed SGD step keeps a lazy value of its parameter's old value."""
    from ember.core.tensor import Tensor
    from ember.scheduler.copies import copied_leaf

    for _ in range(10):
        x = (em.tensor(np.zeros(1 << 24, dtype=np.float32), device=OPENCL) + 0).realize()
        copy = Tensor._from_node(copied_leaf(x.node))
        to_host = x.to("c").realize()  # (enqueued: nothing lazy holds x's node, so the add writes in place)
        x.add_(1).realize()
        assert float(copy.max().item()) == 0.0 and float(to_host.max().item()) == 0.0
        assert float(x.min().item()) == 1.0
    parameter = em.nn.Parameter(em.tensor(np.ones((2048, 2048), dtype=np.float32), device=OPENCL))
    optimizer = em.optim.SGD([parameter], lr=0.5)
    for step in range(6):
        held = parameter * 1.0  # (lazy: reads the parameter before the step)
        (parameter * parameter).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        expected = 0.0 ** step  # (1, then 1 - 0.5 * 2 = 0 from the first step on)
        assert float(held.min().item()) == float(held.max().item()) == expected, step


@needs_opencl
def test_debug_output_shows_every_copy(capsys: pytest.CaptureFixture[str]) -> None:
    x = em.tensor(random_array((8,)), device="c")
    level = profile.debug_level()
    profile.set_debug_level(1)
    try:
        (x.to(OPENCL) + 1).to("c").realize()
    finally:
        profile.set_debug_level(level)
    error = capsys.readouterr().err
    assert f"copy c:0 -> {OPENCL}: 32 bytes (from host memory)" in error
    assert f"copy {OPENCL} -> c:0: 32 bytes (into host memory" in error  # ", after 1 unfinished event" if so


def test_device_to_device_copies_are_staged_through_host_memory(capsys: pytest.CaptureFixture[str]) -> None:
    wgpu = _first_device("wgpu")
    if OPENCL is None or wgpu is None:
        pytest.skip("needs OpenCL and wgpu devices")
    data = random_array((6, 5))
    x = em.tensor(data, device=OPENCL)
    level = profile.debug_level()
    profile.set_debug_level(1)
    try:
        result = ((x * 2).to(wgpu) + 1).to(OPENCL).relu().realize()
    finally:
        profile.set_debug_level(level)
    error = capsys.readouterr().err
    assert f"copy {OPENCL} -> {wgpu}: 120 bytes (staged through host memory" in error
    assert_close(result, (torch.tensor(data) * 2 + 1).relu())


GATED_COPY_SCRIPT = """
import numpy as np, pyopencl as cl
import ember as em
from ember.backends import opencl
from ember.backends.registry import REGISTRY
from ember.scheduler.buffers import DEFERRED_FREES
device = REGISTRY.device("{device}")
gate = cl.UserEvent(device.context)
source = em.tensor(np.arange(1000, dtype=np.float32), device="c").realize()
source.node.buffer.event = opencl.OpenCLEvent(gate, device.context)
result = (source.to("{device}") * 2).realize()
del source  # the copy still waits for the gate: the host buffer it reads must stay, and nothing may block
assert len(DEFERRED_FREES) == 1, DEFERRED_FREES
staged = np.ones(1000, dtype=np.float32)
pending = device.pool.copy_in_async(device.pool.allocate(4000), memoryview(staged).cast("B"),
                                    (opencl.OpenCLEvent(gate, device.context),))
del pending, staged  # an unfinished pyopencl copy event dropped here would wait for the gate: the pool holds it
gate.set_status(cl.command_execution_status.COMPLETE)
np.testing.assert_array_equal(result.numpy(), np.arange(1000, dtype=np.float32) * 2)
assert not DEFERRED_FREES
print("ok")
"""


@needs_opencl
def test_dropping_buffers_behind_a_waiting_copy_neither_blocks_nor_frees_early() -> None:
    """In a subprocess: a wait hidden in a destructor would hang (pyopencl's events of copies wait when dropped)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", GATED_COPY_SCRIPT.format(device=OPENCL)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
