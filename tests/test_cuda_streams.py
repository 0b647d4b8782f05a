"""The cuda backend's two streams and events, against a fake driver whose streams are queues that run only when
the host synchronizes: a copy or launch missing its cuStreamWaitEvent would read memory not yet written, and the
values (compared with torch) would be wrong."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.backends import cuda
from ember.backends.registry import REGISTRY
from ember.scheduler.buffers import release_finished
from tests.helpers import assert_close, random_array
from tests.test_ptx import FakeDriver


INVALID_HANDLE = 400  # CUDA_ERROR_INVALID_HANDLE


class StreamDriver(FakeDriver):
    """FakeDriver with real stream semantics: commands queue per stream; cuEventSynchronize runs the event's stream
    up to it (and, for a cuStreamWaitEvent met on the way, the other stream up to that event)."""

    def __init__(self) -> None:
        super().__init__()
        self.queues: dict[int, list[tuple[str, Any, tuple]]] = {}
        self.events: dict[int, dict[str, Any]] = {}
        self.next_handle = 1
        self.host_syncs = 0
        self.stream_waits: list[tuple[int, int]] = []
        self.unsafe_frees: list[int] = []
        self.launched_streams: list[int] = []
        self.launch_arguments: list[Any] = []
        self.events_created = 0
        self.destroyed: set[int] = set()

    def _handle(self) -> int:
        self.next_handle += 1
        return self.next_handle

    def _enqueue(self, stream: int, action: Callable[[], Any], pointers: tuple) -> tuple:
        self.queues[stream].append(("run", action, pointers))
        return (0,)

    def _run_until(self, event: int) -> None:
        stream = self.events[event]["stream"]
        while not self.events[event]["done"]:
            kind, argument, _ = self.queues[stream].pop(0)
            if kind == "record":
                self.events[argument]["done"] = True
            elif kind == "wait":
                self._run_until(argument)
            else:
                argument()

    def cuStreamCreate(self, flags: int) -> tuple:
        stream = self._handle()
        self.queues[stream] = []
        return 0, stream

    def cuEventCreate(self, flags: int) -> tuple:
        self.events_created += 1
        event = self._handle()
        self.events[event] = {"done": True, "stream": None}
        return 0, event

    def cuEventRecord(self, event: int, stream: int) -> tuple:
        self.events[event] = {"done": False, "stream": stream}
        self.queues[stream].append(("record", event, ()))
        return (0,)

    def cuEventDestroy(self, event: int) -> tuple:
        self.destroyed.add(event)  # (a wait or record already enqueued still completes, as CUDA's does)
        return (0,)

    def cuStreamWaitEvent(self, stream: int, event: int, flags: int) -> tuple:
        if event in self.destroyed:  # the real driver failed here ("context is destroyed") on an H100
            return (INVALID_HANDLE,)
        self.stream_waits.append((stream, event))
        self.queues[stream].append(("wait", event, ()))
        return (0,)

    def cuEventSynchronize(self, event: int) -> tuple:
        self.host_syncs += 1
        self._run_until(event)
        return (0,)

    def cuEventQuery(self, event: int) -> tuple:
        return (0 if self.events[event]["done"] else cuda.NOT_READY,)

    def cuStreamSynchronize(self, stream: int) -> tuple:
        self.host_syncs += 1
        marker = self._handle()
        self.cuEventRecord(marker, stream)
        self._run_until(marker)
        return (0,)

    def cuMemFree(self, pointer: int) -> tuple:
        if any(pointer in pointers for queue in self.queues.values() for _, _, pointers in queue):
            self.unsafe_frees.append(pointer)
        return super().cuMemFree(pointer)

    def cuMemcpyHtoDAsync(self, pointer: int, host: np.ndarray, nbytes: int, stream: int) -> tuple:
        return self._enqueue(stream, lambda: FakeDriver.cuMemcpyHtoDAsync(self, pointer, host, nbytes, stream),
                             (pointer,))

    def cuMemcpyDtoHAsync(self, host: np.ndarray, pointer: int, nbytes: int, stream: int) -> tuple:
        return self._enqueue(stream, lambda: FakeDriver.cuMemcpyDtoHAsync(self, host, pointer, nbytes, stream),
                             (pointer,))

    def cuMemcpyDtoDAsync(self, target: int, source: int, nbytes: int, stream: int) -> tuple:
        def copy() -> None:
            self.memory[target][:nbytes] = self.memory[source][:nbytes]

        return self._enqueue(stream, copy, (target, source))

    def cuStreamQuery(self, stream: int) -> tuple:
        return (0 if not self.queues[stream] else cuda.NOT_READY,)

    def cuLaunchKernel(self, function: Any, *arguments: Any) -> tuple:
        stream, pointers = arguments[7], self.kernel_pointers(function, arguments[8])
        self.launched_streams.append(stream)
        self.launch_arguments.append(arguments[8])
        # the driver copies the parameters when the launch is enqueued (the caller may write its array again)
        copied = (*arguments[:8], (pointers, (None,) * len(pointers)), *arguments[9:])
        return self._enqueue(stream, lambda: FakeDriver.cuLaunchKernel(self, function, *copied), pointers)


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> tuple[StreamDriver, cuda.CudaDevice]:
    driver = StreamDriver()
    device = cuda.CudaDevice(driver, 0)
    monkeypatch.setitem(REGISTRY.devices, "cuda", [device])
    return driver, device


def test_the_stream_driver_matches_cuda_python_names() -> None:
    try:
        from cuda.bindings import driver
    except ImportError:
        pytest.skip("cuda-python is not installed")
    assert [name for name in dir(StreamDriver) if name.startswith("cu") and not hasattr(driver, name)] == []


def test_launch_waits_for_the_copy_on_the_gpu_not_the_host(streams: tuple[StreamDriver, cuda.CudaDevice]) -> None:
    driver, device = streams
    a_data, b_data = random_array((7, 9)), random_array((9, 4), seed=1)
    b = em.tensor(b_data, device="cuda:0").realize()  # uploaded now (em.tensor alone uploads at first use)
    a = em.tensor(a_data, device="c").realize()
    syncs = driver.host_syncs
    result = (a.to("cuda:0") @ b).relu().realize()
    assert driver.host_syncs == syncs  # the copy and the launch are queued; nothing waited
    copy_events = [event for event, state in driver.events.items() if state["stream"] == device.transfer_stream
                   and not state["done"]]
    assert any((device.stream, event) in driver.stream_waits for event in copy_events)
    assert_close(result, (torch.tensor(a_data) @ torch.tensor(b_data)).relu(), atol=1e-5)


def test_round_trips_between_c_and_cuda_match_torch(streams: tuple[StreamDriver, cuda.CudaDevice]) -> None:
    driver, _ = streams
    for seed in range(3):
        data = random_array((33,), seed=seed)
        x = em.tensor(data, device="c")
        on_gpu = x.to("cuda:0") * 2 + 1
        back = (on_gpu.to("c") - x).exp()
        again = (back.to("cuda:0") * on_gpu).sum()
        moved = on_gpu.to("cuda:0")  # same device: no copy
        torch_x = torch.tensor(data)
        expected_on_gpu = torch_x * 2 + 1
        assert_close(again, ((expected_on_gpu - torch_x).exp() * expected_on_gpu).sum(), atol=1e-4)
        assert_close(moved, expected_on_gpu)
    del x, on_gpu, back, again, moved
    gc.collect()
    assert driver.unsafe_frees == []


def test_a_device_to_device_copy_stays_on_the_gpu(streams: tuple[StreamDriver, cuda.CudaDevice],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    driver, device = streams
    second = cuda.CudaDevice(driver, 1)
    second.name, second.context = "cuda:1", device.context  # a second device sharing the context: DtoD
    monkeypatch.setitem(REGISTRY.devices, "cuda", [device, second])
    data = random_array((4, 6))
    x = em.tensor(data, device="cuda:0").realize() * 3  # uploaded now, through a staging buffer
    before = set(driver.host_memory)
    moved = x.to("cuda:1").realize()
    assert any(kind == "run" for kind, _, pointers in driver.queues[second.transfer_stream] if len(pointers) == 2)
    assert set(driver.host_memory) == before  # no staging buffer: the bytes did not pass through the host
    assert_close(moved, torch.tensor(data) * 3)


def test_replayed_launches_pass_packed_parameters_and_record_no_event(
        streams: tuple[StreamDriver, cuda.CudaDevice]) -> None:
    """ember.jit's replays launch through `CudaProgram.bind`: the kernel parameters packed once (cuLaunchKernel gets
    the address of their void** array), one driver call a launch and no CUDA event created per launch; the values
    match torch, and a copy to the host still waits for the launches (transfer stream)."""
    driver, _ = streams
    a_data, b_data = random_array((5, 70)), random_array((70, 6), seed=1)
    a = em.tensor(a_data, device="cuda:0").realize()
    b = em.tensor(b_data, device="cuda:0").realize()
    step = em.jit(lambda left, right: ((left @ right).relu() * 2).sum(1))
    for _ in range(2):  # the eager call, then the capture
        step(a, b).numpy()
    expected = ((torch.tensor(a_data) @ torch.tensor(b_data)).relu() * 2).sum(1)
    for round_ in range(3):
        events, launches = driver.events_created, len(driver.launched_streams)
        result = step(a * (round_ + 1), b)
        assert driver.events_created == events, "a replayed launch created a CUDA event"
        assert len(driver.launched_streams) > launches
        assert_close(result, expected * (round_ + 1), atol=1e-4)
    assert step.replays >= 3
    packed = [arguments for arguments in driver.launch_arguments if isinstance(arguments, int)]
    assert packed, "no launch passed packed parameters"


def test_free_bytes_are_the_gpus_or_what_the_pool_limit_leaves(streams: tuple[StreamDriver, cuda.CudaDevice]) -> None:
    """The sharding rules and memory errors read free_bytes: a pool limit (EMBER_POOL_LIMITS) below the GPU's free
    memory is what they must see (it was the GPU's free memory alone, 70 GiB for a pool limited to 3 MB)."""
    _, device = streams
    pool = device.pool
    gpu_free = pool.free_bytes
    assert gpu_free is not None and gpu_free > 1 << 20
    before = pool.limit_bytes
    try:
        pool.limit_bytes = pool.used_bytes + 1000
        assert pool.free_bytes == 1000
        pool.limit_bytes = pool.used_bytes + 10 * gpu_free
        assert pool.free_bytes == gpu_free
    finally:
        pool.limit_bytes = before


def test_synchronize_waits_only_for_the_streams_with_work(streams: tuple[StreamDriver, cuda.CudaDevice],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Device.synchronize (benchmarks call it after every run) waits for the compute stream unless it was seen idle
    since its last launch, and for the transfer stream only after a copy: a cuStreamSynchronize each otherwise. A
    copy enqueued without a launch, and a launch without a copy, are still waited for (the values match torch)."""
    driver, device = streams
    synchronized: list[int] = []
    synchronize = driver.cuStreamSynchronize
    monkeypatch.setattr(driver, "cuStreamSynchronize",
                        lambda stream: synchronized.append(stream) or synchronize(stream))
    device.synchronize()  # (a new device's compute stream was not seen idle yet)
    synchronized.clear()
    data = random_array((16, 8))
    x = em.tensor(data, device="cuda:0").realize()  # an upload: on the transfer stream
    device.synchronize()
    device.synchronize()
    assert synchronized == [device.transfer_stream]
    synchronized.clear()
    y = (x * 2).realize()
    device.synchronize()
    device.synchronize()
    assert synchronized == [device.stream]
    assert not driver.queues[device.stream] and not driver.queues[device.transfer_stream]
    assert_close(y, torch.tensor(data) * 2)


def test_free_bytes_follow_the_pools_own_allocations_and_ask_the_driver_only_when_needed(
        streams: tuple[StreamDriver, cuda.CudaDevice], monkeypatch: pytest.MonkeyPatch) -> None:
    """The sharding decision reads free_bytes at every realize of a large output, and a cuMemGetInfo cost 9 us on
    an H100: the pool estimates the GPU's free memory from its own allocations and frees, and asks the driver again
    only when its last answer is old (other processes allocate too), when the estimate is short, or when an
    allocation fails. The estimate matches the driver's own count wherever only the pool allocated."""
    driver, device = streams
    pool = device.pool
    asked: list[int] = []
    ask = driver.cuMemGetInfo

    def counted() -> tuple:
        asked.append(1)
        return ask()

    monkeypatch.setattr(driver, "cuMemGetInfo", counted)
    monkeypatch.setattr(cuda, "FREE_RECHECK_SECONDS", 1e9)
    before = pool.free_bytes
    assert before is not None
    x = em.tensor(random_array((512, 512)), device="cuda:0").realize()
    after = pool.free_bytes
    assert after is not None and before - after >= 512 * 512 * 4
    assert after == ask()[1] + pool.kept_bytes
    del x
    gc.collect()
    assert pool.kept_bytes >= 512 * 512 * 4 and pool.free_bytes == before  # (a kept buffer counts as free)
    pool.drop_kept()
    assert pool.free_bytes == before == ask()[1] + pool.kept_bytes
    assert asked == []
    driver.FREE_BYTES -= 2**28  # another process allocates: seen once the last answer is old
    assert pool.free_bytes == before
    monkeypatch.setattr(cuda, "FREE_RECHECK_SECONDS", 0.0)
    assert pool.free_bytes == before - 2**28 and len(asked) == 1
    monkeypatch.setattr(cuda, "FREE_RECHECK_SECONDS", 1e9)
    assert pool.free_bytes == before - 2**28 and len(asked) == 1
    driver.FREE_BYTES = driver.TOTAL_BYTES // 16  # once seen short (here: old), asked at each read
    monkeypatch.setattr(cuda, "FREE_RECHECK_SECONDS", 0.0)
    assert pool.free_bytes == ask()[1] + pool.kept_bytes
    monkeypatch.setattr(cuda, "FREE_RECHECK_SECONDS", 1e9)
    asked.clear()
    assert pool.free_bytes == pool.free_bytes and len(asked) == 2
    asked.clear()
    driver.FREE_BYTES = 2**30
    allocate = driver.cuMemAlloc
    monkeypatch.setattr(driver, "cuMemAlloc", lambda nbytes: (cuda.OUT_OF_MEMORY, 0))
    with pytest.raises(cuda.CudaError, match="cuMemAlloc"):
        em.tensor(random_array((64, 64)), device="cuda:0").realize()
    assert len(asked) == 1  # a failed allocation asks
    monkeypatch.setattr(driver, "cuMemAlloc", allocate)
    assert pool.free_bytes == ask()[1] + pool.kept_bytes


def test_released_buffers_of_every_size_are_reused_without_driver_allocations(
        streams: tuple[StreamDriver, cuda.CudaDevice], monkeypatch: pytest.MonkeyPatch) -> None:
    """A training-like loop allocates the same intermediates every round: from the second round on they come from
    the buffers kept at release (a cuMemAlloc and a cuMemFree per intermediate cost driver calls, and cuMemFree
    waits for the whole GPU); the values still match torch with the streams run lazily. When the GPU is full, the
    kept buffers are given back and the allocation tried again."""
    driver, device = streams
    allocations: list[int] = []
    allocate = driver.cuMemAlloc

    def counted(nbytes: int) -> tuple:
        allocations.append(nbytes)
        return allocate(nbytes)

    monkeypatch.setattr(driver, "cuMemAlloc", counted)
    data = random_array((37, 5))
    x = em.tensor(data, device="cuda:0").realize()
    rounds = []
    for round_ in range(3):
        before = len(allocations)
        result = ((x * (round_ + 1)).exp() + 1).log().sum(0)  # three small intermediates, none kept by the graph
        assert_close(result, ((torch.tensor(data) * (round_ + 1)).exp() + 1).log().sum(0), atol=1e-5)
        del result
        gc.collect()
        rounds.append(len(allocations) - before)
    assert rounds[0] > 0 and rounds[1:] == [0, 0], rounds
    assert device.pool.kept_bytes > 0

    def full(nbytes: int) -> tuple:  # out of memory while anything is kept
        allocations.append(nbytes)
        return (cuda.OUT_OF_MEMORY, 0) if device.pool.kept_bytes else allocate(nbytes)

    monkeypatch.setattr(driver, "cuMemAlloc", full)
    larger = em.tensor(random_array((64, 64)), device="cuda:0").realize()
    assert device.pool.kept_bytes == 0 and larger.shape == (64, 64)


def test_a_busy_stream_is_asked_about_once_per_launch_or_less(streams: tuple[StreamDriver, cuda.CudaDevice],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager launches ask whether their inputs' writers and their buffers' readers are done: on cuda all of them
    are the compute stream's one mark, and each answer was a cuStreamQuery (a driver call costing about what the
    launch does). A busy answer is kept for BUSY_RECHECK_SECONDS (an idle one until the next launch), so a chain
    of launches on a stream that has not run yet asks the driver at most once a launch, and a launch is taken as
    busy without asking (its reader's bookkeeping asked at every eager launch); the values match torch."""
    driver, device = streams
    monkeypatch.setattr(cuda, "BUSY_RECHECK_SECONDS", 60.0)  # (this test's launches may be slower than a GPU's)
    queries = []
    query = driver.cuStreamQuery
    monkeypatch.setattr(driver, "cuStreamQuery", lambda stream: queries.append(stream) or query(stream))
    data = random_array((16, 8))
    x = em.tensor(data, device="cuda:0").realize()
    expected = torch.tensor(data)
    launches = len(driver.launched_streams)
    for step in range(12):
        x = (x * 0.5 + step).realize()
        expected = expected * 0.5 + step
    assert len(driver.launched_streams) - launches == 12
    assert len(queries) <= 12, len(queries)
    assert_close(x, expected)
    device.synchronize()  # (the mark idle again: the buffers this test dropped go back to the pool)
    queries.clear()
    y = (x + 1).realize()
    assert queries == []  # (its input's writer is idle, its own launch busy)
    assert_close(y, expected + 1)
    del x, y
    gc.collect()
    release_finished()
