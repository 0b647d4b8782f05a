"""The c pool's huge-page slabs (backends/host_slabs.py): size classes, slot lifetimes (a slot is lent again only
once nothing can read it), slabs given back, several threads at once, and c programs over slab memory against
numpy."""

from __future__ import annotations

import errno
import gc
import itertools
import mmap
import threading
from pathlib import Path

import numpy as np
import pytest

import ember as em
from ember.backends import host_slabs
from ember.backends.host_slabs import (
    HUGE_PAGE_BYTES,
    MAX_SHARED_SLOT_BYTES,
    MIN_SLOT_BYTES,
    SLABS,
    HugePageSlabs,
    slot_bytes,
)
from tests.conftest import TEST_DEVICES


def _array(slabs: HugePageSlabs, nbytes: int) -> np.ndarray:
    owner, address = slabs.carve(nbytes)
    array = np.ndarray((nbytes,), np.uint8, owner)
    assert array.ctypes.data == address
    return array


def test_size_classes_hold_the_size_asked_for_with_at_most_an_eighth_more() -> None:
    sizes = [MIN_SLOT_BYTES, 65_600, 100_000, 1 << 20, (1 << 20) + 1, 1_327_104, 3_000_001, MAX_SHARED_SLOT_BYTES]
    sizes += list(np.random.default_rng(0).integers(MIN_SLOT_BYTES, MAX_SHARED_SLOT_BYTES, 500))
    for nbytes in sizes:
        size = slot_bytes(int(nbytes))
        assert nbytes <= size <= nbytes * 1.125 and size % 64 == 0, (nbytes, size)
    assert slot_bytes(1 << 20) == 1 << 20
    assert slot_bytes(MAX_SHARED_SLOT_BYTES + 1) == MAX_SHARED_SLOT_BYTES + mmap.PAGESIZE  # (a slab of its own)


def test_slots_are_aligned_and_a_slab_starts_at_a_huge_page() -> None:
    slabs = HugePageSlabs()
    arrays = [_array(slabs, 300_000) for _ in range(10)]
    addresses = sorted(array.ctypes.data for array in arrays)
    assert addresses[0] % HUGE_PAGE_BYTES == 0  # (the first slot of a fresh slab)
    assert all(address % 64 == 0 for address in addresses)
    assert all(b - a >= 300_000 for a, b in itertools.pairwise(addresses))  # no two slots overlap


def test_a_slot_is_lent_again_only_once_nothing_reads_it() -> None:
    slabs = HugePageSlabs()
    first = _array(slabs, 1 << 20)
    address = first.ctypes.data
    first[:] = 7
    view = first[1000:2000]  # (numpy points a view at the memory's owner: the slot's object)
    del first
    gc.collect()
    second = _array(slabs, 1 << 20)
    second[:] = 9
    assert second.ctypes.data != address and (view == 7).all()
    del view
    gc.collect()
    assert _array(slabs, 1 << 20).ctypes.data == address  # (the lowest free slot is lent first)


def test_slabs_whose_slots_all_came_back_are_unmapped() -> None:
    slabs = HugePageSlabs()
    arrays = [_array(slabs, 2_000_000) for _ in range(40)]  # several slabs of one size class
    mapped = slabs.mapped_bytes
    assert mapped >= 40 * slot_bytes(2_000_000)
    del arrays
    gc.collect()
    assert slabs.mapped_bytes == 0 < mapped


def test_a_large_buffer_has_a_slab_of_its_own_from_a_huge_page_on() -> None:
    slabs = HugePageSlabs()
    nbytes = 7_000_003
    arrays = [_array(slabs, nbytes) for _ in range(3)]
    assert all(array.ctypes.data % HUGE_PAGE_BYTES == 0 for array in arrays)
    assert slabs.mapped_bytes == 3 * (slot_bytes(nbytes) + HUGE_PAGE_BYTES)  # (each mapped a huge page longer)
    arrays[1][-1] = 5
    del arrays
    gc.collect()
    assert slabs.mapped_bytes == 0


def test_several_threads_carving_and_giving_back_never_share_a_slot() -> None:
    slabs = HugePageSlabs()
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        held: list[tuple[np.ndarray, int]] = []
        for round_ in range(300):
            nbytes = int(rng.choice([70_000, 300_000, 1 << 20]))
            array = _array(slabs, nbytes)
            mark = seed * 1000 + round_ % 251
            array.view(np.uint8)[:] = mark % 256
            held.append((array, mark % 256))
            if len(held) > 6:
                for old, value in held[: int(rng.integers(1, 4))]:
                    if not (old == value).all():
                        errors.append(f"thread {seed}: a slot it held was written by another")
                del held[: 3]
        for old, value in held:
            if not (old == value).all():
                errors.append(f"thread {seed}: a slot it held was written by another")

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]


def test_advised_slabs_are_marked_for_huge_pages() -> None:
    if not SLABS.advise:
        pytest.skip("this system has no transparent huge pages")
    slabs = HugePageSlabs()
    array = _array(slabs, 1 << 20)
    array[:] = 1
    address = array.ctypes.data
    for line_number, line in enumerate(lines := Path("/proc/self/smaps").read_text().splitlines()):
        first = line.partition(" ")[0]
        if "-" in first and not first.endswith(":"):
            start, end = (int(part, 16) for part in first.split("-"))
            if start <= address < end:
                flags = next(entry for entry in lines[line_number + 1:] if entry.startswith("VmFlags:"))
                assert " hg" in flags, flags  # (MADV_HUGEPAGE applied to the slab)
                return
    raise AssertionError("the slab's mapping is not in /proc/self/smaps")


@pytest.mark.skipif("c:0" not in TEST_DEVICES, reason="needs the c backend")
def test_a_mapping_the_system_refuses_is_an_out_of_memory_error(monkeypatch: pytest.MonkeyPatch) -> None:
    if not SLABS.advise:
        pytest.skip("this system has no transparent huge pages: the pool does not use slabs")

    def refused(size: int, advise: bool) -> None:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(host_slabs, "Slab", refused)
    with pytest.raises(em.OutOfMemoryError, match="could not map 7340000 bytes .*Cannot allocate memory"):
        em.zeros(1_835_000, device="c").realize()  # (a size no slab of this process has a free slot for)


@pytest.mark.skipif("c:0" not in TEST_DEVICES, reason="needs the c backend")
def test_c_programs_over_slab_memory_match_numpy() -> None:
    """Twelve steps over 512 x 1024 floats (2 MiB: slab slots) and 300 x 300 (360 KB), intermediates released and
    their slots lent again inside queued programs, a result read while later ones are computed."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((512, 1024)).astype(np.float32)
    b = rng.standard_normal((300, 300)).astype(np.float32)
    x, y, w = em.tensor(a, device="c"), em.tensor(b, device="c"), em.tensor(b, device="c")
    if SLABS.advise:
        assert type(x.realize().node.buffer.handle.base).__name__ == "SlotMemory"
    expected_a, expected_b = a, b
    kept = []
    for step in range(12):
        x = (x * 0.5 + 1.0).tanh() + x.exp().clamp(max=3.0) * 0.25
        y = ((y @ w) * (1.0 / 17)).tanh() + y.abs().sqrt() * 0.1
        expected_a = np.tanh(expected_a * 0.5 + 1.0) + np.minimum(np.exp(expected_a), 3.0) * 0.25
        expected_b = np.tanh((expected_b @ b) * (1.0 / 17)) + np.sqrt(np.abs(expected_b)) * 0.1
        if step % 4 == 0:
            kept.append((x.numpy(), expected_a.copy()))
    np.testing.assert_allclose(x.numpy(), expected_a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y.numpy(), expected_b, rtol=1e-4, atol=1e-4)
    for value, expected in kept:
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-5)
