"""Building a schedule's new kernels on c (backends/c.py, scheduler/compile_cache.py): one compiler run per build
class (register tiles with the scheduling flags where the compiler does not target AVX-512, scalar tiles at -O1
with FMA contraction, the rest at -O3; a few small ones of the rest join the register tiles' run, all of them where
the two commands are one), and a batch whose build fails or whose library cannot be loaded falls back to one build
per kernel, with a warning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.backends import c as c_backend
from ember.core.errors import CompileError, CompileFallbackWarning
from ember.ir.kernel import Kernel
from ember.scheduler import compile_cache
from ember.scheduler.compile_cache import first_error_line
from ember.scheduler.devices import get_device
from ember.scheduler.kernelize import kernelize
from ember.scheduler.program import Launch
from ember.settings import CONFIG


def _inputs(seed: int, rows: int) -> list[np.ndarray]:
    generator = np.random.default_rng(seed)
    return [generator.standard_normal((rows, 64), dtype=np.float32) for _ in range(2)] + [
        generator.standard_normal((64, 64), dtype=np.float32)]


def _outputs(library: Any, arrays: list[np.ndarray], make: Any) -> list[Any]:
    """Four kernels of distinct structure: two elementwise, a row reduction and a matmul (a packed matmul: its
    library is built with the register tiles' flags)."""
    a, b, weight = (make(array) for array in arrays)
    return [(a * 1.5 + b).exp(), a.maximum(b) - 0.25, (a * b).sum(1), a @ weight]


def _kernels(outputs: list[em.Tensor]) -> list[Kernel]:
    kernels: dict[Kernel, None] = {}
    for item in kernelize([output.node for output in outputs]):
        if isinstance(item, Launch):
            kernels[item.kernel] = None
    return list(kernels)


def _runs_of(kind: str, compiler_runs: list[list[str]]) -> list[list[str]]:
    """The compiler runs made with a build class's command."""
    command = c_backend.class_compiler_command(kind)
    return [run for run in compiler_runs if run[:len(command)] == command]


def _check_against_torch(outputs: list[em.Tensor], arrays: list[np.ndarray]) -> None:
    expected = _outputs(torch, arrays, torch.from_numpy)
    for output, values in zip(outputs, expected):
        np.testing.assert_allclose(output.numpy(), values.numpy(), rtol=1e-4, atol=1e-4)


def test_new_kernels_build_in_one_compiler_run_per_build_class(cold: None, compiler_runs: list[list[str]],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # the kernels are kernelized here directly, as recorded: realize must launch those (the graph rewrites, which
    # realize applies, may give a kernel of the same code another key, compiled once more)
    monkeypatch.setattr(CONFIG, "rewrites", False)
    device = get_device("c")
    arrays = _inputs(1, 301)  # rows no multiple of a tile, enough for a 6-row tile on many cores
    outputs = _outputs(em, arrays, lambda array: em.tensor(array, device="c"))
    # 64 x 12 outputs: 12 columns take no vectors, so a tile of 8 x 4 scalar accumulators
    narrow = em.tensor(arrays[0][:64], device="c") @ em.tensor(arrays[2][:, :12], device="c")
    outputs.append(narrow)
    kernels = _kernels(outputs)
    assert len(kernels) == 5
    irs = [compile_cache.lower_for(device, kernel) for kernel in kernels]
    classes = [c_backend.build_class(ir) for ir in irs]
    assert classes == [c_backend.SCALAR] * 3 + [c_backend.TILE, c_backend.LIGHT]
    compile_cache.compile_kernels(device, kernels, irs)
    one_command = c_backend.class_compiler_command(c_backend.TILE) == c_backend.class_compiler_command(c_backend.SCALAR)
    assert 2 <= len(compiler_runs) <= 3  # (and the packed matmul's library, where this process had not built it)
    packed_command = c_backend.packed_compiler_command()
    packed_runs = [run for run in compiler_runs if run[:len(packed_command)] == packed_command]
    assert len(packed_runs) <= 1 and all("-O2" in run for run in packed_runs)
    tile_runs = _runs_of(c_backend.TILE, compiler_runs)
    # where the scalar kernels' command is the tiles' (AVX-512: no scheduling flags), their runs are one
    assert len(tile_runs) == (len(compiler_runs) - len(packed_runs) - 1 if one_command else 1)
    assert "-O3" in tile_runs[0]
    assert ("-fschedule-insns" in tile_runs[0]) == (not c_backend._targets_avx512("cc"))
    light_runs = [run for run in compiler_runs if run[1:3] == list(c_backend.LIGHT_LEVEL)]
    assert len(light_runs) == 1
    runs = len(compiler_runs)
    _check_against_torch(outputs[:4], arrays)  # the programs built are the ones realize launches
    np.testing.assert_allclose(narrow.numpy(), (torch.from_numpy(arrays[0][:64]) @ torch.from_numpy(arrays[2][:, :12])
                                                ).numpy(), rtol=1e-4, atol=1e-4)
    assert len(compiler_runs) == runs  # all five came from the compile cache


def test_small_kernels_join_the_register_tiles_run(cold: None, compiler_runs: list[list[str]]) -> None:
    device = get_device("c")
    arrays = _inputs(6, 293)  # (shapes no other test builds: the device keeps its programs by source)
    # an elementwise kernel and a matmul with a fused epilogue (a register tile: a plain matmul is a packed one, a
    # call of the packed matmul's library, built once, compiled with no kernel)
    a, b, weight = (em.tensor(array, device="c") for array in arrays)
    outputs = [(a * 1.5 + b).exp(), (a @ weight).relu()]
    kernels = _kernels(outputs)
    irs = [compile_cache.lower_for(device, kernel) for kernel in kernels]
    assert [c_backend.build_class(ir) for ir in irs] == [c_backend.SCALAR, c_backend.TILE]
    compile_cache.compile_kernels(device, kernels, irs)
    assert len(compiler_runs) == 1 and _runs_of(c_backend.TILE, compiler_runs) == compiler_runs
    ta, tb, tweight = (torch.from_numpy(array) for array in arrays)
    for output, expected in zip(outputs, [(ta * 1.5 + tb).exp(), (ta @ tweight).relu()]):
        np.testing.assert_allclose(output.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


def test_kernels_without_a_tile_build_without_the_scheduling_flags(cold: None, compiler_runs: list[list[str]]) -> None:
    device = get_device("c")
    arrays = _inputs(2, 29)
    outputs = _outputs(em, arrays, lambda array: em.tensor(array, device="c"))[:3]
    kernels = _kernels(outputs)
    classes = {c_backend.build_class(compile_cache.lower_for(device, kernel)) for kernel in kernels}
    compile_cache.compile_kernels(device, kernels)
    assert len(compiler_runs) == len(classes) and not any("-fschedule-insns" in run for run in compiler_runs)
    generator_outputs = _outputs(torch, arrays, torch.from_numpy)[:3]
    for output, values in zip(outputs, generator_outputs):
        np.testing.assert_allclose(output.numpy(), values.numpy(), rtol=1e-4, atol=1e-4)


def test_register_tiles_schedule_for_register_pressure_only_without_avx512(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduling flags keep a tile's accumulators in AVX2's 16 vector registers; AVX-512's 32 hold them without
    the flags' compile time."""
    for targets_avx512 in (False, True):
        monkeypatch.setattr(c_backend, "_targets_avx512", lambda compiler, answer=targets_avx512: answer)
        c_backend.scheduling_flags.cache_clear()
        try:
            tile = c_backend.class_compiler_command(c_backend.TILE)
            assert ("-fschedule-insns" in tile and "-fsched-pressure" in tile) == (not targets_avx512)
            assert "-fschedule-insns" not in c_backend.class_compiler_command(c_backend.SCALAR)
            assert "-fschedule-insns" not in c_backend.quick_compiler_command()
        finally:
            c_backend.scheduling_flags.cache_clear()


def test_a_failed_batch_is_built_kernel_by_kernel_with_a_warning(cold: None, compiler_runs: list[list[str]],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    real_build = c_backend.build_library

    def failing_batches(source: str, key_prefix: str, command: list[str] | None = None,
                        names: list[str] | None = None) -> Any:
        if names is not None and len(names) > 1:
            raise em.CompileError("the C compiler rejected a kernel:\nkernel.c:1: error: simulated")
        return real_build(source, key_prefix, command, names)

    monkeypatch.setattr(c_backend, "build_library", failing_batches)
    device = get_device("c")
    arrays = _inputs(3, 23)
    outputs = _outputs(em, arrays, lambda array: em.tensor(array, device="c"))
    kernels = _kernels(outputs)
    with pytest.warns(CompileFallbackWarning, match="building 4 kernels together on c:0 failed .*one by one"):
        compile_cache.compile_kernels(device, kernels)
    assert len(compiler_runs) == 4  # each kernel alone
    _check_against_torch(outputs, arrays)


def test_a_batch_library_that_does_not_load_is_built_kernel_by_kernel(cold: None, compiler_runs: list[list[str]],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = c_backend.open_library
    opened: list[Path] = []

    def corrupt_first(path: Path) -> Any:
        opened.append(path)
        if len(opened) == 1:
            raise OSError(f"{path}: invalid ELF header")
        return real_open(path)

    monkeypatch.setattr(c_backend, "open_library", corrupt_first)
    device = get_device("c")
    arrays = _inputs(4, 31)
    outputs = _outputs(em, arrays, lambda array: em.tensor(array, device="c"))[:3]
    kernels = _kernels(outputs)
    with pytest.warns(CompileFallbackWarning, match="cannot be loaded: .*invalid ELF header"):
        compile_cache.compile_kernels(device, kernels)
    classes = {c_backend.build_class(compile_cache.lower_for(device, kernel)) for kernel in kernels}
    assert len(compiler_runs) == 1 + 3 and len(classes) == 1  # the batch (its first run), then each kernel alone
    generator_outputs = _outputs(torch, arrays, torch.from_numpy)[:3]
    for output, values in zip(outputs, generator_outputs):
        np.testing.assert_allclose(output.numpy(), values.numpy(), rtol=1e-4, atol=1e-4)


def test_kernel_libraries_link_without_the_c_library_and_compute_torchs_values(
        cold: None, compiler_runs: list[list[str]]) -> None:
    """From gcc, kernel libraries link only libm (and libmvec), libgcc and OpenMP's runtime: what kernels call of
    the C library (a memcpy gcc may emit, the packed matmul's aligned_alloc) the loader finds in the process. Every
    kind of kernel loads and computes torch's values: elementwise with exp, a reduction, a packed matmul with its
    OpenMP threads."""
    arrays = _inputs(7, 263)  # (rows no other test uses: kernels this process has not built)
    outputs = _outputs(em, arrays, lambda array: em.tensor(array, device="c"))
    _check_against_torch(outputs, arrays)
    kernel_runs = [run for run in compiler_runs if "-pthread" not in run]
    assert kernel_runs
    if c_backend._is_gcc("cc"):
        assert all("-nodefaultlibs" in run and "-lgcc" in run for run in kernel_runs)


def test_a_library_missing_a_symbol_after_the_lean_link_is_linked_again_with_every_library(
        cold: None, compiler_runs: list[list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = c_backend.open_library
    opened: list[Path] = []

    def missing_symbol_first(path: Path) -> Any:
        opened.append(path)
        if len(opened) == 1:
            raise OSError(f"{path}: undefined symbol: ember_missing")
        return real_open(path)

    monkeypatch.setattr(c_backend, "open_library", missing_symbol_first)
    lean = ["-nodefaultlibs", *c_backend.math_libraries(), "-lgcc"]
    monkeypatch.setattr(c_backend, "link_libraries", lambda: lean)
    arrays = _inputs(8, 37)  # (rows no other test uses)
    outputs = _outputs(em, arrays, lambda array: em.tensor(array, device="c"))[:1]
    _check_against_torch(outputs, arrays)
    assert len(compiler_runs) == 2
    assert "-nodefaultlibs" in compiler_runs[0] and "-nodefaultlibs" not in compiler_runs[1]
    assert compiler_runs[0] == compiler_runs[1][:-len(c_backend.full_link_libraries())] + lean


def test_adding_negative_zero_is_simplified_away_exactly() -> None:
    """x + -0.0 is x for every float (+0.0, -0.0, NaN, inf): the simplifier drops it, and values stay torch's."""
    from ember.ir.ir import Builder

    builder = Builder()
    x = builder.load(builder.param(1, em.float32, False), builder.const(0, em.int32), None)
    assert builder.alu(em.core.ops.Op.ADD, em.float32, x, builder.const(-0.0, em.float32)) is x
    assert builder.alu(em.core.ops.Op.ADD, em.float32, builder.const(-0.0, em.float32), x) is x
    kept = builder.alu(em.core.ops.Op.ADD, em.float32, x, builder.const(0.0, em.float32))
    assert kept is not x  # x + 0.0 is +0.0 for x = -0.0: kept
    values = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1.5, -2.0, -0.0], dtype=np.float32)
    first, second = values[:5], values[3:]
    # two padded views summed (a concatenation's backward): each output adds a -0.0 fill to a value
    total = (em.tensor(first, device="c").pad((0, 3), value=-0.0)
             + em.tensor(second, device="c").pad((3, 0), value=-0.0))
    reference = (torch.nn.functional.pad(torch.from_numpy(first), (0, 3), value=-0.0)
                 + torch.nn.functional.pad(torch.from_numpy(second), (3, 0), value=-0.0)).numpy()
    np.testing.assert_array_equal(np.signbit(total.numpy()), np.signbit(reference))
    np.testing.assert_array_equal(total.numpy(), reference)


def test_a_fallback_warning_names_the_compilers_error() -> None:
    """A compiler's output starts with a line naming the function; the warning's one line carries the error."""
    error = CompileError("the C compiler rejected a kernel:\n/tmp/k/kernel.c: In function 'r_1':\n"
                         "/tmp/k/kernel.c:85:24: error: 'v1' undeclared (first use in this function)\n   85 | x")
    assert first_error_line(error) == ("the C compiler rejected a kernel: /tmp/k/kernel.c:85:24: error: 'v1' "
                                       "undeclared (first use in this function)")
    assert first_error_line(CompileError("clBuildProgram failed: BUILD_PROGRAM_FAILURE\nmore")) == \
        "clBuildProgram failed: BUILD_PROGRAM_FAILURE"
    assert first_error_line(CompileError("")) == "CompileError"
