"""OpenCL robustness: vector forms come from a probe run in a child process (a driver crash there is contained,
blamed, cached, and the op falls back to a narrower width), and a kernel the driver fails on in-process is built
again with narrower vectors or none. The two PoCL failures of issue 10 (16-wide sqrt in AdamW, 16-wide select in
relu) run here with 16-wide vectors forced, against PyTorch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from ember.backends import opencl, opencl_probe
from ember.backends.registry import REGISTRY
from ember.core.errors import BackendUnavailable, CompileFallbackWarning
from ember.core.ops import Op
from ember.ir.ir import IROp
from ember.ir.vectorize import vector_width
from ember.scheduler.compile_cache import COMPILED
from tests.helpers import assert_close, pair, random_array

REPOSITORY = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def opencl_device() -> str:
    try:
        return REGISTRY.probe("opencl")[0].name
    except BackendUnavailable as error:
        pytest.skip(f"no OpenCL device here: {error}")


# ---- the issue's cases in a fresh process with 16-wide vectors forced ------------------------------------------

WORKLOADS = textwrap.dedent("""
    import json
    import numpy as np, torch
    import ember as em, ember.nn as nn, ember.optim as optim
    import ember.nn.functional as F
    from ember.backends.registry import REGISTRY
    from ember.ir.ir import IROp
    from ember.ir.vectorize import vector_width
    from ember.core.ops import Op
    from ember.scheduler.compile_cache import COMPILED

    device = "opencl:0"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    errors = {}
    errors["relu"] = np.abs(em.tensor(x, device=device).relu().numpy() - torch.relu(torch.tensor(x)).numpy()).max()
    vector = rng.standard_normal(64).astype(np.float32)
    product = (em.tensor(x, device=device) @ em.tensor(vector, device=device)).numpy()
    errors["matrix_vector"] = np.abs(product - (torch.tensor(x) @ torch.tensor(vector)).numpy()).max()
    logits = rng.standard_normal((8, 32)).astype(np.float32)
    probabilities = rng.random((8, 32)).astype(np.float32)
    probabilities /= probabilities.sum(1, keepdims=True)
    loss = F.cross_entropy(em.tensor(logits, device=device), em.tensor(probabilities, device=device)).item()
    expected = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(probabilities)).item()
    errors["cross_entropy"] = abs(loss - expected)
    layer, torch_layer = nn.Linear(64, 10).to(device), torch.nn.Linear(64, 10)
    with torch.no_grad():
        torch_layer.weight.copy_(torch.tensor(layer.weight.numpy()))
        torch_layer.bias.copy_(torch.tensor(layer.bias.numpy()))
    optimizer = optim.AdamW(layer.parameters(), lr=1e-2)
    torch_optimizer = torch.optim.AdamW(torch_layer.parameters(), lr=1e-2)
    (layer(em.tensor(x, device=device)) ** 2).mean().backward()
    optimizer.step()
    (torch_layer(torch.tensor(x)) ** 2).mean().backward()
    torch_optimizer.step()
    errors["adamw"] = max(np.abs(layer.weight.numpy() - torch_layer.weight.detach().numpy()).max(),
                          np.abs(layer.bias.numpy() - torch_layer.bias.detach().numpy()).max())

    def widths_of(op):
        found = set()
        for (name, _), compiled in COMPILED.items():
            stack, seen = [compiled.ir.sink], set()
            while stack:
                node = stack.pop()
                if id(node) not in seen:
                    seen.add(id(node))
                    if node.op is op and node.width > 1:
                        found.add(node.width * node.dtype.itemsize // 4)
                    stack.extend(node.srcs)
        return sorted(found)

    info = REGISTRY.device(device).info
    print(json.dumps({
        "errors": {name: float(value) for name, value in errors.items()},
        "kernel_widths": sorted({vector_width(compiled.ir) for compiled in COMPILED.values()}),
        "sqrt_widths": widths_of(Op.SQRT), "select_widths": widths_of(Op.WHERE),
        "reduce_widths": widths_of(IROp.REDUCE),
        "preferred_vector_width": info.preferred_vector_width,
        "probe": info.extra.get("vector_probe"), "failures": info.extra.get("vector_probe_failures", []),
    }))
""")


PROBE_ONLY = textwrap.dedent("""
    import json
    from ember.backends.opencl_probe import op_name
    from ember.backends.registry import REGISTRY
    info = REGISTRY.device("opencl:0").info
    fallbacks = [[width, sorted(op_name(op) for op in ops)] for width, ops in info.fallback_vector_widths]
    print(json.dumps({"probe": info.extra.get("vector_probe"), "fallbacks": fallbacks,
                      "failures": info.extra.get("vector_probe_failures", [])}))
""")


def run_workloads(cache: Path, script: str = WORKLOADS, **variables: str) -> dict[str, Any]:
    """Run the issue's workloads (or another script) in a new interpreter with 16-wide OpenCL vectors and the
    given variables; every kernel compiled for its sizes (shape classes off: AdamW's updates of the weight and the
    bias would share a flat class's kernel, which has no vectors of its own)."""
    environment = dict(os.environ, EMBER_CACHE_DIR=str(cache), EMBER_OPENCL_VECTOR_WIDTH="16",
                       EMBER_SHAPE_CLASSES="0", **variables)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), environment.get("PYTHONPATH")]))
    environment.pop("EMBER_NOOPT", None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment,
                          timeout=900, cwd=str(REPOSITORY))
    assert done.returncode == 0, f"the process died ({done.returncode}):\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_match_torch(found: dict[str, Any]) -> None:
    tolerances = {"relu": 0.0, "matrix_vector": 1e-4, "cross_entropy": 1e-5, "adamw": 1e-6}
    for name, error in found["errors"].items():
        assert error <= tolerances[name], (name, error)


@pytest.fixture(scope="module")
def workload_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ember-cache")


def assert_widths_follow_the_probe(found: dict[str, Any]) -> None:
    """A form the probe failed at 16 lanes is never emitted 16 wide; one it passed is (these workloads need it).
    A failure is a driver's crash or error, never wrong values (which would be a bug in the renderer)."""
    assert not any("wrong values" in failure for failure in found["failures"]), found["failures"]
    for op, widths in (("SQRT", "sqrt_widths"), ("WHERE", "select_widths"), ("REDUCE", "reduce_widths")):
        failed = any(failure.startswith(f"{op} float32 x16:") for failure in found["failures"])
        assert (16 not in found[widths]) if failed else (16 in found[widths]), (op, found)


def test_issue_cases_with_16_wide_vectors_match_torch(opencl_device: str, workload_cache: Path) -> None:
    """PoCL on AVX-512 crashed on exactly these forms: AdamW's 16-wide sqrt, relu's 16-wide select, 16-wide
    reduces of a matrix-vector product and of cross-entropy with class probabilities. Here they either run 16 wide
    and match torch, or (where this machine's driver fails them) were probed out and still match torch."""
    found = run_workloads(workload_cache)
    assert found["preferred_vector_width"] == 16
    assert_widths_follow_the_probe(found)
    assert_match_torch(found)


def test_a_probe_crash_is_contained_cached_and_falls_back(opencl_device: str, workload_cache: Path) -> None:
    """The probe's child aborts on 16-wide sqrt (as LLVM's `Cannot select ... fsqrt` does): this process lives on,
    AdamW's sqrt runs 8 wide, everything else still 16 wide, and the next process reads the verdict from the cache."""
    crash = {opencl_probe.CRASH_VARIABLE: "SQRT:16"}
    found = run_workloads(workload_cache, **crash)
    assert any(failure.startswith("SQRT float32 x16: the driver crashed the process (SIGABRT")
               for failure in found["failures"]), found
    if not any(failure.startswith("LOAD float32 x16:") for failure in found["failures"]):
        assert 16 in found["kernel_widths"], found  # one bad op leaves the other ops 16 wide
    assert found["probe"] != "from the cache"
    assert found["sqrt_widths"] == [8], found  # the narrower width, probed in a second child
    assert_widths_follow_the_probe(found)
    assert_match_torch(found)
    again = run_workloads(workload_cache, PROBE_ONLY, **crash)
    assert again["probe"] == "from the cache" and again["failures"] == found["failures"]
    assert [width for width, ops in again["fallbacks"]] == [8] and "SQRT" in again["fallbacks"][0][1]


# ---- the probe itself ------------------------------------------------------------------------------------------


def _target(device_name: str) -> tuple[dict[str, Any], bool]:
    cl_device = REGISTRY.device(device_name).cl_device
    has_fp64 = em.float64 in REGISTRY.device(device_name).info.supported_dtypes
    target = {"platform": cl_device.platform.name, "device": cl_device.name, "index": 0, "has_fp64": has_fp64,
              "options": opencl.build_options(cl_device)}
    return target, has_fp64


def test_a_crash_while_building_is_blamed_cached_and_a_corrupt_entry_probed_again(
        opencl_device: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(opencl_probe.CRASH_VARIABLE, "MAX:4:build")
    target, has_fp64 = _target(opencl_device)
    key = "robustness test key"
    support = opencl_probe.vector_support(target, key, opencl.VECTOR_OPS, 4, has_fp64)
    assert Op.MAX not in support.ops and support.ops == opencl.VECTOR_OPS - {Op.MAX}
    assert support.width == 4 and support.fallbacks == ((2, opencl.VECTOR_OPS),)  # MAX at 2 lanes
    bad = {case.name for case, verdict in support.report.verdicts.items() if verdict != opencl_probe.OK}
    assert bad == {"probe_max_float32_x4"} | ({"probe_max_float64_x2"} if has_fp64 else set())
    assert all("SIGABRT" in support.report.verdicts[case] for case in support.report.verdicts
               if case.name in bad)
    children = support.report.children
    assert 2 <= children <= 5  # a crashing unit, its cases one by one, then width 2: never one child per case
    # cached: no child at all the next time
    assert opencl_probe.vector_support(target, key, opencl.VECTOR_OPS, 4, has_fp64).report.children == 0
    # a corrupt entry (a verdict edited behind the checksum's back, then a truncated file) is probed again
    monkeypatch.delenv(opencl_probe.CRASH_VARIABLE)
    path = opencl_probe.cache_path(key)
    verdict = f'"probe_add_float32_x4": "{opencl_probe.OK}"'.encode()
    assert verdict in path.read_bytes()
    path.write_bytes(path.read_bytes().replace(verdict, b'"probe_add_float32_x4": "no"'))  # behind the checksum
    again = opencl_probe.vector_support(target, key, opencl.VECTOR_OPS, 4, has_fp64)
    # (the next narrower width is offered with the same ops: tiles too long to lower in the wider vectors)
    assert again.report.children >= 1 and again.ops == opencl.VECTOR_OPS
    assert again.fallbacks == ((2, opencl.VECTOR_OPS),)
    assert verdict in path.read_bytes()
    path.write_bytes(path.read_bytes()[:50])
    assert opencl_probe.load_verdicts(path, key) == {} and not path.exists()


def test_a_softmax_row_too_long_for_the_widest_tiles_runs_in_narrower_vectors(opencl_device: str) -> None:
    """A softmax over rows of 1024 is a tile of exp2 chains too long to lower in 16 lanes (ir/opt.py
    MAX_LOWERED_STEPS): the probe offers the next narrower width with the same ops, so the row is vectorized there
    instead of walked lane by lane in scalars (PoCL's scalar exp2 calls: 129 ms for 4096 x 1024, 13 ms in float8)."""
    info = REGISTRY.device(opencl_device).info
    if info.preferred_vector_width < 4 or Op.EXP2 not in info.vector_ops:
        pytest.skip("this OpenCL device gets no wide vectors of exp2")
    assert info.fallback_vector_widths and info.fallback_vector_widths[0][0] == info.preferred_vector_width // 2
    before = set(COMPILED)
    x, tx = pair(random_array((64, 1024)) * 4, opencl_device)
    assert_close(x.softmax(-1), tx.softmax(-1))
    assert_close(x.log_softmax(-1), tx.log_softmax(-1), atol=1e-5)
    widths = [vector_width(compiled.ir) for compiled in _compiled_since(opencl_device, before)]
    assert widths and all(width > 1 for width in widths), widths


def test_kernels_of_masks_and_concatenated_rows_run_in_vectors(opencl_device: str) -> None:
    """Ops that kept whole kernels scalar on OpenCL (the c device had them): a float compared equal to a constant and
    masks combined (`x < c | x == c`: nanoGPT's GELU, 56 ms a launch on PoCL), and a concatenation along an axis
    other than the vectors', whose one condition per row selects whole vectors (char_lstm's gradients: scalar rows of
    128 outputs, 5.2 MB of source for its first step)."""
    info = REGISTRY.device(opencl_device).info
    if info.preferred_vector_width < 4:
        pytest.skip("this OpenCL device gets no vectors")
    values = random_array((64, 256))
    values[0, :3] = 0.0
    x, tx = pair(values, opencl_device)
    before = set(COMPILED)
    either, teither = (x < 0.5) | (x == 0.0), (tx < 0.5) | (tx == 0.0)
    assert_close(em.where(either, x.exp(), x * 2), torch.where(teither, tx.exp(), tx * 2))
    assert_close(em.where((x == 0.0) & (x < 1.0), 1.0, x), torch.where((tx == 0.0) & (tx < 1.0), 1.0, tx))
    rows, trows = x.reshape(64, 2, 128), tx.reshape(64, 2, 128)  # (a concatenation picks a whole row of vectors)
    assert_close(em.cat([rows, rows * 2], 1) * 3 - 1, torch.cat([trows, trows * 2], 1) * 3 - 1)
    assert_close(em.cat([rows, rows.exp()], 0) + 1, torch.cat([trows, trows.exp()], 0) + 1)
    widths = [vector_width(compiled.ir) for compiled in _compiled_since(opencl_device, before)]
    assert len(widths) >= 4 and all(width > 1 for width in widths), widths


def test_every_op_the_renderer_puts_on_vectors_has_a_probe_case() -> None:
    renderer = opencl.OpenCLRenderer(has_fp64=True)
    cases = opencl_probe.cases_for(opencl.VECTOR_OPS, 16, True)
    assert {case.op for case in cases} == {opencl_probe.op_name(op) for op in opencl.VECTOR_OPS}
    for dtype in ("float32", "float64"):
        unit = tuple(case for case in cases if case.dtype == dtype)
        kernel, inputs, regions, expected = opencl_probe.unit_kernel(unit, "probe_test")
        source = renderer.render(kernel)
        lanes = unit[0].lanes
        for function in ("sqrt(", "exp2(", "log2(", "sin(", "trunc(", "select("):
            assert function in source
        assert f"{'float' if dtype == 'float32' else 'double'}{lanes} " in source
        sqrt = next(case for case in unit if case.op == "SQRT")
        values = inputs[: expected[regions[sqrt]].size]
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(expected[regions[sqrt]], np.sqrt(values))
    assert [case.lanes for case in opencl_probe.cases_for(opencl.VECTOR_OPS, 2, True)] == [2] * len(opencl.VECTOR_OPS)


def test_the_vector_width_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(opencl_probe.VECTOR_WIDTH_VARIABLE, "3")
    with pytest.raises(BackendUnavailable, match=r"EMBER_OPENCL_VECTOR_WIDTH='3' .* 1, 2, 4, 8, 16"):
        opencl_probe.vector_width(8)
    monkeypatch.setenv(opencl_probe.VECTOR_WIDTH_VARIABLE, "16")
    assert opencl_probe.vector_width(8) == 16
    monkeypatch.delenv(opencl_probe.VECTOR_WIDTH_VARIABLE)
    assert [opencl_probe.vector_width(width) for width in (8, 6, 16, 0)] == [8, 4, 16, 1]


# ---- failures the driver reports in-process: the kernel is built again, narrower -------------------------------

VECTOR_TYPE = re.compile(r"\b(float|double)(2|4|8|16)\b")


def _vector_source(program: Any) -> bool:
    return bool(VECTOR_TYPE.search(program.get_info(opencl.cl.program_info.SOURCE)))


def _compiled_since(device: str, before: set) -> list[Any]:
    return [compiled for key, compiled in COMPILED.items() if key[0] == device and key not in before]


def test_a_kernel_the_driver_cannot_create_is_built_again_without_vectors(
        opencl_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if not REGISTRY.device(opencl_device).info.vector_ops:
        pytest.skip("this OpenCL device gets no vector kernels")
    original = opencl.cl.Kernel

    def failing_kernel(program: Any, name: str) -> Any:  # what PoCL did with a 16-wide select on AVX-512
        if _vector_source(program):
            raise opencl.cl.LogicError("clCreateKernel failed: INVALID_KERNEL_NAME")
        return original(program, name)

    monkeypatch.setattr(opencl.cl, "Kernel", failing_kernel)
    before = set(COMPILED)
    x, tx = pair(random_array((24, 40)), opencl_device)
    v, tv = pair(random_array((40,), seed=1), opencl_device)
    with pytest.warns(CompileFallbackWarning, match=rf"{opencl_device} failed on kernel \w+ with vectors of \d+ "
                                                    r"float32 lanes \(.*INVALID_KERNEL_NAME\); using no vectors"):
        assert_close(x.relu(), tx.relu())
        assert_close(x @ v, tx @ tv, atol=1e-4)
    widths = [vector_width(compiled.ir) for compiled in _compiled_since(opencl_device, before)]
    assert len(widths) >= 2 and set(widths) == {1}


def test_a_kernel_the_driver_cannot_launch_is_built_again_without_vectors(
        opencl_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if not REGISTRY.device(opencl_device).info.vector_ops:
        pytest.skip("this OpenCL device gets no vector kernels")
    original = opencl.cl.enqueue_nd_range_kernel

    def failing_launch(queue: Any, kernel: Any, *arguments: Any, **options: Any) -> Any:
        if _vector_source(kernel.program):  # a driver that makes machine code at the first launch, and fails
            raise opencl.cl.RuntimeError("clEnqueueNDRangeKernel failed: BUILD_PROGRAM_FAILURE")
        return original(queue, kernel, *arguments, **options)

    monkeypatch.setattr(opencl.cl, "enqueue_nd_range_kernel", failing_launch)
    before = set(COMPILED)
    x, tx = pair(random_array((12, 56)), opencl_device)
    with pytest.warns(CompileFallbackWarning, match=r"could not launch kernel .* BUILD_PROGRAM_FAILURE"):
        assert_close((x * 2).sqrt(), (tx * 2).sqrt())
    assert [vector_width(compiled.ir) for compiled in _compiled_since(opencl_device, before)] == [1]
    assert IROp.LOAD in REGISTRY.device(opencl_device).info.vector_ops  # the device keeps its vectors for others
