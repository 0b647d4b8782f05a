"""Golden files of generated code: a handful of kernels rendered by every backend's renderer and compared exactly
with tests/golden/<target>/<case>.<extension>, so any change to generated code shows as a diff in review.

Regenerate after an intended change with `EMBER_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py` and
review the diff. Kernels are lowered for a fixed capability table, so the files do not depend on the machine.
Workgroup kernels (ir/group_reduce.py: rows reduced by a group in local memory) are lowered for an H100's limits
and rendered by the targets that have workgroups (WORKGROUP_CASES).
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import ember as em
from ember.backends.c import CRenderer
from ember.backends.opencl import OpenCLRenderer
from ember.backends.ptx import PTXRenderer
from ember.backends.wgsl import WGSLRenderer
from ember.backends.dummy import H100_LIMITS
from ember.capabilities import DeviceInfo
from ember.ir.opt import build_kernel_ir
from ember.scheduler.kernelize import kernelize
from ember.scheduler.program import Launch

GOLDEN = Path(__file__).resolve().parent / "golden"
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "backend_example"
UPDATE = os.environ.get("EMBER_UPDATE_GOLDEN", "0") not in ("", "0")
CAPABILITIES = DeviceInfo(compute_units=4, preferred_vector_width=4)


def _python_renderer() -> object:
    sys.path.insert(0, str(EXAMPLE))
    try:
        from ember_python_backend import PythonRenderer
    finally:
        sys.path.remove(str(EXAMPLE))
    return PythonRenderer()


TARGETS: dict[str, tuple[Callable[[], object], str]] = {
    "c": (CRenderer, "c"),
    "opencl": (OpenCLRenderer, "cl"),
    "wgsl": (lambda: WGSLRenderer(int64=True, float64=True), "wgsl"),
    "ptx": (PTXRenderer, "ptx"),
    "python": (_python_renderer, "py"),
}


def _tensor(*shape: int, dtype: em.DType = em.float32) -> em.Tensor:
    return em.tensor(np.zeros(shape, dtype=dtype.numpy), device="dummy:0")


CASES: dict[str, Callable[[], em.Tensor]] = {
    "elementwise_broadcast": lambda: ((_tensor(3, 1, 4) * _tensor(1, 5, 1) + _tensor(4)).exp()
                                      .maximum(_tensor(5, 1))),
    "reduce": lambda: _tensor(3, 17, 5).sum(1),
    "matmul": lambda: _tensor(16, 33) @ _tensor(33, 8),
    "padded_permuted_view": lambda: _tensor(2, 3, 4).permute(2, 0, 1).pad((1, 2, 0, 0, 1, 0), value=-1.0) * 2 + 1,
    "small_types": lambda: ((_tensor(6, dtype=em.int8) * 3).half() > _tensor(6, dtype=em.bfloat16).float()),
}


WORKGROUP_CASES: dict[str, Callable[[], em.Tensor]] = {
    "softmax_workgroups": lambda: _tensor(2, 300).softmax(-1),
    "sum_workgroups": lambda: _tensor(3, 512, dtype=em.float64).sum(-1),
}
WORKGROUP_TARGETS = ("opencl", "ptx", "wgsl")


def rendered(case: str, target: str) -> str:
    renderer = TARGETS[target][0]()
    workgroups = case in WORKGROUP_CASES
    capabilities = DeviceInfo(**H100_LIMITS) if workgroups else CAPABILITIES  # type: ignore[arg-type]
    tensor = (WORKGROUP_CASES if workgroups else CASES)[case]()
    items = [item for item in kernelize([tensor.node]) if isinstance(item, Launch)]
    kernels = [build_kernel_ir(item.kernel, f"{case}_{number}", capabilities) for number, item in enumerate(items)]
    sources = [renderer.render(kernel) for kernel in kernels]  # type: ignore[attr-defined]
    return "\n".join(sources)


@pytest.mark.parametrize(("target", "case"), [(target, case) for target in sorted(TARGETS) for case in sorted(CASES)]
                         + [(target, case) for target in WORKGROUP_TARGETS for case in sorted(WORKGROUP_CASES)])
def test_generated_code_matches_the_golden_file(target: str, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_NOOPT", "0")  # the files show the code with the default transforms
    source = rendered(case, target)
    path = GOLDEN / target / f"{case}.{TARGETS[target][1]}"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        return
    assert path.exists(), f"no golden file {path}: create it with EMBER_UPDATE_GOLDEN=1 pytest {__file__}"
    expected = path.read_text()
    if source != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), source.splitlines(True), str(path), "rendered"))
        pytest.fail(f"generated {target} code for '{case}' changed (EMBER_UPDATE_GOLDEN=1 accepts it):\n{diff}")


def test_rendering_is_deterministic() -> None:
    for target in TARGETS:
        assert rendered("matmul", target) == rendered("matmul", target)
