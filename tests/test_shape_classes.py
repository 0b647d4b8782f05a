"""Shape classes (scheduler/shape_classes.py): kernels met again with other sizes run one kernel compiled for the
class, its varying sizes read at launch. A generation loop whose context grows by a token each step compiles no
kernels after its first few tokens and matches torch; ops on several sizes of a varying dim (matmuls, reduces
over it, softmax, causal masks, views, concatenation, slices from the end, flips, NaN and infinities) match torch
through the class kernels; every class kernel renders to OpenCL C and assembles as PTX for sm_75 and sm_90."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.backends import opencl, ptx
from ember.core.ops import Op
from ember.ir.ir import IROp, topological_nodes
from ember.scheduler import shape_classes

WIDTH, HEADS = 16, 2


@pytest.fixture(autouse=True)
def classes_on(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shape classes on (they are off by default), with compile caches and class structures of this test's own, so
    that no class kernel made here is launched by another test."""
    from ember.scheduler import compile_cache

    monkeypatch.setenv("EMBER_SHAPE_CLASSES", "1")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_cache, "COMPILED", compile_cache.CompileCache())
    monkeypatch.setattr(shape_classes, "STRUCTURES", type(shape_classes.STRUCTURES)())


def _close(values: np.ndarray, expected: torch.Tensor) -> None:
    """ember's values (read) against torch's: the same shape and dtype, within float32 tolerance, NaN in place."""
    reference = expected.detach().numpy()
    assert values.dtype == reference.dtype and values.shape == reference.shape
    np.testing.assert_allclose(values, reference, atol=1e-5, rtol=1e-5)


def _attention_step(lib: Any, x: Any, weight: Any) -> Any:
    """One causal self-attention layer on [1, T, WIDTH] with a layer norm; the last position's values."""
    length = x.shape[1]
    q, k, v = (x @ weight).split(WIDTH, dim=2)
    q, k, v = (part.reshape(1, length, HEADS, WIDTH // HEADS).transpose(1, 2) for part in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(WIDTH // HEADS))
    scores = scores.masked_fill(lib.tril(lib.ones(length, length)) == 0, float("-inf"))
    y = (lib.nn.functional.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(1, length, WIDTH)
    return lib.nn.functional.layer_norm(y + x, (WIDTH,))[:, -1, :]


def test_a_growing_context_stops_compiling(device: str) -> None:
    generator = np.random.default_rng(3)
    weight = generator.normal(size=(WIDTH, 3 * WIDTH)).astype(np.float32) * 0.3
    tokens = generator.normal(size=(1, 24, WIDTH)).astype(np.float32)
    compiles = []
    for length in range(1, 25):
        with em.profile() as record:
            output = _attention_step(em, em.tensor(tokens[:, :length], device=device), em.tensor(weight, device=device))
            values = output.numpy()
        compiles.append(len(record.compiles))
        expected = _attention_step(torch, torch.tensor(tokens[:, :length]), torch.tensor(weight))
        _close(values, expected)
    assert sum(compiles[5:]) <= 4, compiles  # (a few structures change with size: a kernel split differently)
    assert compiles[-6:] == [0] * 6, compiles


def _growing_ops(lib: Any, a: Any, b: Any, codes: Any) -> list[Any]:
    """Ops whose sizes depend on the length of a's dim 1 (b: [length, 5], codes: [length] int64)."""
    length = a.shape[1]
    return [
        a @ b,  # the reduced dim varies
        a.transpose(0, 1) * 2.0 + 1.0,
        a.sum(1), a.amax(1), a.exp().sum(0),
        lib.nn.functional.softmax(a, dim=-1),
        lib.flip(a, (1,)),
        a[:, -1], a[:, -3:],
        lib.cat([a, a[:, :1] * 3.0], 1),
        a.reshape(3, length, 1).expand(3, length, 2).reshape(3, 2 * length),
        a.masked_fill(lib.tril(lib.ones(3, length)) == 0, float("-inf")).amax(0),
        a.argmax(1), (codes * 2 + length).cumsum(0),
        lib.arange(length, device=a.device if lib is em else "cpu") * a[0],
    ]


@pytest.mark.parametrize("lengths", [(4, 7, 5, 12, 9, 33)])
def test_class_kernels_match_torch_at_every_size(device: str, lengths: tuple[int, ...]) -> None:
    generator = np.random.default_rng(5)
    compiles = []
    for length in lengths:
        a = generator.normal(size=(3, length)).astype(np.float32)
        a[1, length // 2] = np.nan
        a[2, 0] = np.inf
        b = generator.normal(size=(length, 5)).astype(np.float32)
        codes = generator.integers(0, 9, size=length)
        with em.profile() as record:
            values = [output.numpy() for output in _growing_ops(em, em.tensor(a, device=device),
                                                                em.tensor(b, device=device),
                                                                em.tensor(codes, device=device))]
        compiles.append(len(record.compiles))
        expected = _growing_ops(torch, torch.tensor(a), torch.tensor(b), torch.tensor(codes))
        for mine, theirs in zip(values, expected):
            _close(mine, theirs)
    assert compiles[-1] == 0 and compiles[-2] == 0, compiles  # the last sizes run the classes' kernels


def test_class_kernels_render_for_every_backend() -> None:
    """Every class kernel compiled in this session renders as OpenCL C and assembles as PTX (sm_75, sm_90)."""
    irs = [compiled.ir for known in shape_classes.STRUCTURES.values() for compiled in known.classes]
    if not irs:
        _attention_step(em, em.tensor(np.ones((1, 3, WIDTH), np.float32)), em.tensor(np.ones((WIDTH, 3 * WIDTH),
                                                                                             np.float32))).numpy()
        _attention_step(em, em.tensor(np.ones((1, 4, WIDTH), np.float32)), em.tensor(np.ones((WIDTH, 3 * WIDTH),
                                                                                             np.float32))).numpy()
        irs = [compiled.ir for known in shape_classes.STRUCTURES.values() for compiled in known.classes]
    irs = list({ir.name: ir for ir in irs}.values())  # (a class met on several devices: one kernel)
    assert irs
    renderer = opencl.OpenCLRenderer()
    for ir in irs:
        source = renderer.render(ir)
        assert f"data{ir.size_parameter}[0]" in source
    if ptx.ptxas_path() is None:
        pytest.skip("ptxas is not on PATH")
    for target in ("sm_75", "sm_90"):
        ptx_renderer = ptx.PTXRenderer(target)
        ptx.assemble(ptx.module_of([ptx_renderer.render_entry(ir) for ir in irs], ptx_renderer), target,
                     optimization=0)


def test_a_varying_dim_keeps_the_index_bounds_of_the_others(device: str) -> None:
    """Attention weights [4, 5, S] times values with a bias broadcast over [S, 2, 8] read as [S, 4, 4] heads, S
    varying: the remainders of the fixed dims stay in the class's kernel (a work item number without an upper bound,
    once divided, must not bound an index to 0)."""
    generator = np.random.default_rng(9)
    bias = generator.normal(size=(8,)).astype(np.float32)

    def heads(lib: Any, weights: np.ndarray, x: np.ndarray, dev: str) -> Any:
        tensor = (lambda a: torch.tensor(a)) if lib is torch else (lambda a: em.tensor(a, device=dev))
        values = (tensor(x) + tensor(bias)).reshape(x.shape[0], 4, 4).permute(1, 0, 2)
        return tensor(weights) @ values

    for length in (4, 6, 5, 7, 3):
        weights = generator.normal(size=(4, 5, length)).astype(np.float32)
        x = generator.normal(size=(length, 2, 8)).astype(np.float32)
        _close(heads(em, weights, x, device).numpy(), heads(torch, weights, x, device))


def _windows(lib: Any, x: Any, start: int) -> list[Any]:
    """A window of x's columns from `start` (a shrink's bounds), padded back to a fixed width (pad amounts from 0)."""
    window = x[:, start:start + 3] * 2.0 + 1.0
    padded = lib.nn.functional.pad(window, (start, 6 - start), value=-1.0)
    return [padded, padded.amax(1) + x[:, start]]


def test_offsets_from_zero_are_read_at_launch(device: str) -> None:
    """A shrink's start and a pad's amounts are offsets: a class holds them from 0 (a size stays >= 2), so windows
    at starts 0 and 1 make the class and every later start runs its kernels, like torch, NaN and infinity in place."""
    generator = np.random.default_rng(4)
    values = generator.normal(size=(4, 12)).astype(np.float32)
    values[1, 4], values[2, 1] = np.nan, -np.inf
    compiles = []
    for start in (0, 1, 6, 2, 5, 3):
        with em.profile() as record:
            results = [output.numpy() for output in _windows(em, em.tensor(values, device=device), start)]
        compiles.append(len(record.compiles))
        for mine, theirs in zip(results, _windows(torch, torch.tensor(values), start)):
            np.testing.assert_allclose(mine, theirs.numpy(), atol=1e-6, equal_nan=True)
    assert compiles[0] > 0 and compiles[2:] == [0] * 4, compiles


def test_auto_mode_compiles_a_growing_context_by_class_after_its_first_lengths(device: str,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The default mode: the first lengths compile for their sizes, and once the length's places have taken
    DYNAMIC_AFTER values the next lengths run class kernels, compiling nothing; every length as torch's."""
    monkeypatch.delenv("EMBER_SHAPE_CLASSES")
    assert shape_classes.enabled() and shape_classes.automatic()
    generator = np.random.default_rng(7)
    weight = generator.normal(size=(WIDTH, 3 * WIDTH)).astype(np.float32) * 0.3
    tokens = generator.normal(size=(1, 40, WIDTH)).astype(np.float32)
    compiles = []
    for length in range(1, 41):  # (devices with local memory change some kernels' structure past 16: they start over)
        with em.profile() as record:
            output = _attention_step(em, em.tensor(tokens[:, :length], device=device), em.tensor(weight, device=device))
            values = output.numpy()
        compiles.append(len(record.compiles))
        _close(values, _attention_step(torch, torch.tensor(tokens[:, :length]), torch.tensor(weight)))
    first = shape_classes.DYNAMIC_AFTER + 1  # (lengths 2 .. DYNAMIC_AFTER + 1 give a place that many values)
    assert min(compiles[1:first]) > 0, compiles  # each of the first lengths compiles for its sizes
    assert compiles[-8:] == [0] * 8, (device, str(compiles))
    assert sum(compiles) < 0.5 * compiles[1] * len(compiles), compiles  # far fewer than a kernel set per length


def test_auto_mode_compiles_layers_of_a_few_widths_for_their_own_sizes(device: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose layers share a structure at a few widths (fewer than DYNAMIC_AFTER values in a place) makes
    no class: every layer runs a kernel compiled, tiled and vectorized, for its sizes; values as torch's."""
    monkeypatch.delenv("EMBER_SHAPE_CLASSES")
    widths = [12, 40, 24, 56, 8]
    assert len(widths) < shape_classes.DYNAMIC_AFTER
    generator = np.random.default_rng(8)
    weights = [generator.normal(size=(out, inp)).astype(np.float32) * 0.2 for inp, out in zip(widths, widths[1:])]
    inputs = generator.normal(size=(16, widths[0])).astype(np.float32)
    for _ in range(2):
        x, expected = em.tensor(inputs, device=device), torch.tensor(inputs)
        for weight in weights:
            x = em.nn.functional.linear(x, em.tensor(weight, device=device)).tanh()
            expected = torch.nn.functional.linear(expected, torch.tensor(weight)).tanh()
        _close(x.numpy(), expected)
    assert not any(known.classes for known in shape_classes.STRUCTURES.values())


def test_class_kernels_sum_in_simd_lanes_on_c() -> None:
    """A class kernel's loop that only sums floats renders as an `omp simd reduction` on the c backend, its loads
    at the counter from an offset pointer (the compiler vectorizes it with whole vector loads: an untiled class
    matmul was a chain of dependent additions, then gathers); a loop of a max does not (its NaN rule is ember's
    own). Values: the tests above, through these kernels."""
    from ember.backends.c import CRenderer

    for length in (3, 4, 5):
        x = em.tensor(np.ones((2, length, 6), np.float32))
        (x @ em.tensor(np.ones((6, 5), np.float32))).numpy()
        x.amax(1).numpy()
    rendered = [(compiled.ir, CRenderer().render(compiled.ir)) for known in shape_classes.STRUCTURES.values()
                for compiled in known.classes]
    sums = [source for ir, source in rendered if any(node.op is IROp.REDUCE and node.arg is Op.SUM
                                                     for node in topological_nodes(ir.sink))]
    maxima = [source for ir, source in rendered if all(node.arg is not Op.SUM for node in topological_nodes(ir.sink)
                                                       if node.op is IROp.REDUCE) and "acc" in source]
    assert sums and all("#pragma omp simd reduction(+:acc" in source for source in sums), rendered
    # the matmul's rows read at the loop's counter from an offset pointer: consecutive elements, no gathers
    assert any(re.search(r"\(data\d+\+v\d+\)\[loop\d+\]", source) for source in sums), sums
    assert maxima and not any("omp simd" in source for source in maxima), rendered


def test_class_kernels_compute_their_work_items_in_simd_lanes_on_c() -> None:
    """A scalar class kernel without a loop of its own (an elementwise chain) renders its parallel loop as `omp
    parallel for simd` on the c backend: gcc vectorizes no loop OpenMP outlined unless told, and relu(x + bias) over a
    class's 1M floats ran scalar, ten times slower than the same op's kernel for its size. A kernel with a guarded
    load (a concatenation) keeps the plain loop (gcc 12's if-conversion miscompiled such loads: c.compiler_command).
    The launch's threshold for threads is an `if(parallel: ...)`: a plain `if` turns the simd loop off as well.
    Values against torch at every length, up to 10^7 + 323 elements (rows of 509: no length a multiple of the vector
    lanes, so each simd loop ends in a remainder), with NaN and infinities."""
    from ember.backends.c import CRenderer

    generator = np.random.default_rng(13)
    bias = generator.normal(size=509).astype(np.float32)
    for rows in (3, 5, 8, 13, 2051, 19647):
        values = generator.normal(size=(rows, 509)).astype(np.float32)
        values[rows // 2, 7] = np.nan
        values[0, 3], values[-1, -1] = np.inf, -np.inf
        x, expected_x = em.tensor(values, device="c"), torch.tensor(values)
        mine = [(x + em.tensor(bias, device="c")).relu(), (x * 0.5).exp(), em.cat([x, x * 2], dim=0)]
        theirs = [(expected_x + torch.tensor(bias)).relu(), (expected_x * 0.5).exp(),
                  torch.cat([expected_x, expected_x * 2], dim=0)]
        for output, reference in zip(mine, theirs):
            np.testing.assert_allclose(output.numpy(), reference.numpy(), rtol=1e-6, atol=0, equal_nan=True)
    rendered = [(compiled.ir, CRenderer().render(compiled.ir)) for known in shape_classes.STRUCTURES.values()
                for compiled in known.classes]
    plain = [source for ir, source in rendered
             if not any(node.op in (IROp.RANGE, IROp.LOOP) or (node.op is IROp.LOAD and len(node.srcs) == 3)
                        for node in topological_nodes(ir.sink))]
    guarded = [source for ir, source in rendered if any(node.op is IROp.LOAD and len(node.srcs) == 3
                                                        for node in topological_nodes(ir.sink))]
    assert len(plain) >= 2 and all("#pragma omp parallel for simd" in source for source in plain), rendered
    # the threshold for threads names the construct it decides: an `if` without one applies to the simd loop too
    # (OpenMP 5.0), so gcc ran every launch below the threshold scalar (a relu gradient of 64 x 128: 5 us -> 1 us)
    pragmas = [line for source in plain for line in source.splitlines() if "omp parallel for simd" in line]
    assert all(" if(parallel: " in line for line in pragmas), pragmas
    assert guarded and not any("omp parallel for simd" in source for source in guarded), rendered


def test_auto_mode_makes_no_class_of_sizes_met_in_one_realize(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight row sums of eight lengths realized together are a fixed set (a sort's merge passes, a model's layers):
    each compiles for its sizes. The same lengths met one realize at a time keep changing: they make a class."""
    monkeypatch.delenv("EMBER_SHAPE_CLASSES")
    generator = np.random.default_rng(11)
    arrays = [generator.normal(size=(3, length)).astype(np.float32) for length in range(20, 28)]
    together = [em.tensor(array).exp().sum(1) for array in arrays]
    em.realize(*together)
    for mine, array in zip(together, arrays):
        _close(mine.numpy(), torch.tensor(array).exp().sum(1))
    assert not any(known.classes for known in shape_classes.STRUCTURES.values())
    for array in arrays:  # (other lengths than above, each in a realize of its own)
        wider = np.concatenate([array, array[:, :9]], axis=1)
        _close(em.tensor(wider).exp().sum(1).numpy(), torch.tensor(wider).exp().sum(1))
    assert any(known.classes for known in shape_classes.STRUCTURES.values())
