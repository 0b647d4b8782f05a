"""Core records a graph and nothing else: no imports of the layers above it, no device memory when a tensor is
created, placement (and the copies it needs) decided by the scheduler at realize time; the compile cache is bounded."""

import ast
import gc
from pathlib import Path

import numpy as np
import torch

import ember as em
from ember.core.ops import Op
from ember.core.tensor import Tensor
from ember.scheduler import compile_cache
from ember.scheduler.buffers import mapped_node
from ember.scheduler.devices import get_device
from ember.scheduler.placement import place_graph
from tests.helpers import assert_close, random_array

CORE = Path(em.__file__).parent / "core"


def test_core_imports_nothing_from_the_layers_above_it() -> None:
    """Every import in ember/core, module level or inside a function, stays below the scheduler."""
    forbidden = []
    for path in sorted(CORE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[:2] in (["ember", "scheduler"], ["ember", "backends"], ["ember", "ir"]):
                    forbidden.append(f"{path.name}:{node.lineno} {name}")
    assert not forbidden, forbidden
    assert len(list(CORE.glob("*.py"))) > 30  # the scan saw the package


def test_creating_a_tensor_allocates_no_device_memory(device: str) -> None:
    pool, default_pool = get_device(device).pool, get_device(em.get_default_device()).pool
    data = random_array((64, 32))
    gc.collect()
    before, default_before = pool.used_bytes, default_pool.used_bytes
    with em.profile() as record:
        x = em.tensor(data, device=device)
        y = em.as_tensor(data, device=device)
        z = Tensor(data, None, device)
        w = em.from_numpy(data)
    assert pool.used_bytes == before and default_pool.used_bytes == default_before
    assert record.bytes_allocated == 0
    assert x.device == device and x.node.realized
    data[0, 0] = 1000.0  # the tensors hold their own copy of the values
    with em.profile() as record:
        result = (x + y * z).realize()
    expected = torch.tensor(random_array((64, 32)))
    assert_close(result, expected + expected * expected)
    # the three inputs are uploaded when the kernel first needs them, then the output is allocated
    assert record.bytes_allocated == 4 * data.nbytes
    assert pool.used_bytes >= before + 4 * data.nbytes
    np.testing.assert_array_equal(w.numpy(), random_array((64, 32)))


def test_a_mixed_device_op_is_recorded_as_is_and_placed_at_realize(tmp_path: Path) -> None:
    """A disk tensor times a tensor on the default device: recorded with its sources as they are; `.device` answers
    with the placement rule before the realize; the placement pass inserts the COPY from disk."""
    target = em.get_default_device()
    values = np.arange(12, dtype=np.float32)
    path = tmp_path / "values.bin"
    path.write_bytes(values.tobytes())
    on_disk = Tensor._from_node(mapped_node(str(path), 0, (12,), em.float32))
    scale = em.tensor(random_array((12,)), device=target)
    product = on_disk * scale
    assert product.node.srcs == (on_disk.node, scale.node)  # recorded, not placed
    assert product.device == target  # the query decides it (disk only stores) ...
    assert product.node.srcs == (on_disk.node, scale.node)  # ... and moves nothing
    alone = on_disk * 2
    assert alone.device == target and alone.node.srcs[0] is on_disk.node  # disk-only inputs: the default device

    place_graph([product.node])
    copy, kept = product.node.srcs
    assert copy.op is Op.COPY and copy.srcs == (on_disk.node,) and copy.device == target
    assert kept is scale.node
    with em.profile() as record:
        product.realize()
        alone.realize()
    assert [(source, destination) for source, destination, _ in record.copies] == [("disk:0", target)] * 2
    np.testing.assert_allclose(product.numpy(), values * scale.numpy(), rtol=1e-6)
    np.testing.assert_allclose(alone.numpy(), values * 2)


def test_the_compile_cache_evicts_beyond_its_bound(monkeypatch) -> None:
    cache = compile_cache.CompileCache(limit=2)
    monkeypatch.setattr(compile_cache, "COMPILED", cache)
    data = random_array((7, 3))
    x = em.tensor(data)
    with em.profile() as record:
        results = [(x + 1).realize(), (x * 3).exp().realize(), x.sum(0).realize()]
    assert len(cache) == 2 and cache.evictions == 1 and record.programs_evicted == 1
    assert "1 programs evicted" in str(record)
    expected = torch.tensor(data)
    for result, truth in zip(results, [expected + 1, (expected * 3).exp(), expected.sum(0)]):
        assert_close(result, truth, rtol=1e-5)
    with em.profile() as record:
        again = (x + 1).realize()  # the evicted kernel is compiled again
    assert len(record.compiles) == 1 and len(cache) == 2 and cache.evictions == 2
    assert_close(again, expected + 1)
