"""A pytest plugin: every kernel the test session compiles (on any device) is rendered to PTX at the end of the
session and assembled with `ptxas` for sm_75 (the oldest architecture ember targets) and sm_90 (an H100, with that
target's PTX header), many kernels per ptxas call. The renderer emits the same instructions for every target, and
`tests/test_ptx.py` assembles every primitive op and dtype for each of `ptx.ASSEMBLY_TARGETS`. Workers only hand
their kernels over and the controller renders them once they have all finished (a full run that rendered in the
workers' sessionfinish was interrupted at its end, most likely by xdist's 10-second shutdown of the workers).

There is no GPU in CI, so this is how every kernel the op suite produces is checked to give valid PTX. On when
ptxas is on PATH; EMBER_PTX_CHECK=0 turns it off. A kernel ptxas rejects fails the session (exit status 1) and is
printed with ptxas's message; the summary line gives the number of kernels assembled.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ember.backends import ptx
from ember.capabilities import DeviceInfo
from ember.core.errors import CompileError
from ember.ir.kernel import Kernel
from ember.plan.kernel_codec import decode, encode

DIRECTORY_VARIABLE = "EMBER_PTX_RECORD_DIR"
SESSION_TARGETS = ("sm_75", "sm_90")
KERNELS_PER_MODULE = 150
_recorded: set[Kernel] = set()


def enabled() -> bool:
    return os.environ.get("EMBER_PTX_CHECK", "1") not in ("", "0") and ptx.ptxas_path() is not None


def pytest_configure(config: pytest.Config) -> None:
    if not enabled():
        return
    if DIRECTORY_VARIABLE not in os.environ:  # the controller (or a run without xdist); workers inherit it
        os.environ[DIRECTORY_VARIABLE] = tempfile.mkdtemp(prefix="ember-ptx-kernels-")
    from ember.scheduler import compile_cache

    original = compile_cache.compile_kernel
    if getattr(original, "records_kernels", False):
        return

    def recording(device: Any, kernel: Kernel) -> Any:
        compiled = original(device, kernel)
        _recorded.add(kernel)
        return compiled

    recording.records_kernels = True  # type: ignore[attr-defined]
    compile_cache.compile_kernel = recording


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not enabled():
        return
    directory = Path(os.environ[DIRECTORY_VARIABLE])
    worker = getattr(session.config, "workerinput", None)
    if worker is not None:  # an xdist worker hands its kernels to the controller
        (directory / f"kernels-{worker['workerid']}.pkl").write_bytes(pickle.dumps([encode(k) for k in _recorded]))
        return
    kernels = set(_recorded)
    for path in directory.glob("kernels-*.pkl"):
        kernels |= {decode(kernel) for kernel in pickle.loads(path.read_bytes())}
        path.unlink()
    if not kernels:
        return
    start = time.perf_counter()
    failures = assemble_all(sorted(kernels, key=repr))
    seconds = time.perf_counter() - start
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    targets = ", ".join(SESSION_TARGETS)
    if reporter is not None:
        reporter.write("\n")
        reporter.write_line(f"PTX check: {len(kernels)} kernels of this session rendered to PTX and assembled by "
                            f"ptxas for {targets} in {seconds:.1f} s; {len(failures)} rejected")
        for failure in failures[:10]:
            reporter.write_line(failure, red=True)
    if failures:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def assemble_all(kernels: list[Kernel]) -> list[str]:
    """Render each kernel's PTX and assemble them in modules of many entries; the messages of rejected ones. The
    modules are rendered and assembled in worker processes, one a core (rendering is Python: in the controller alone
    it took half of the check's minutes while ptxas ran beside it)."""
    modules = [[encode(kernel) for kernel in kernels[start:start + KERNELS_PER_MODULE]]
               for start in range(0, len(kernels), KERNELS_PER_MODULE)]
    workers = min(len(modules), os.cpu_count() or 2)
    if workers <= 1:
        return [message for number, module in enumerate(modules) for message in _check_module(number, module)]
    failures = []
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for messages in pool.map(_check_module, range(len(modules)), modules):
            failures.extend(messages)
    return failures


def _check_module(number: int, encoded: list[Any]) -> list[str]:
    """Render the kernels of one module (encoded, `plan.kernel_codec`) and assemble it for each session target."""
    from ember.backends.dummy import H100_LIMITS
    from ember.ir.flash_attention import attention_parts
    from ember.ir.opt import build_kernel_ir

    renderer = ptx.PTXRenderer()
    info = DeviceInfo()
    gpu = DeviceInfo(**H100_LIMITS)  # (a fused attention's kernel exists only for a device with warps: its flash one)
    entries, failures = [], []
    for index, kernel in enumerate(map(decode, encoded)):
        try:
            kernel_info = gpu if attention_parts(kernel) is not None else info
            name = f"kernel{number * KERNELS_PER_MODULE + index}"
            entries.append(renderer.render_entry(build_kernel_ir(kernel, name, kernel_info)))
        except Exception as error:  # noqa: BLE001 - reported with the kernel that caused it
            failures.append(f"rendering PTX failed ({type(error).__name__}: {error}) for {kernel!r}")
    for target in SESSION_TARGETS:
        failures.extend(_assemble_module(entries, ptx.PTXRenderer(target)))
    return failures


def _assemble_module(entries: list[str], renderer: ptx.PTXRenderer) -> list[str]:
    try:
        ptx.assemble(ptx.module_of(entries, renderer), renderer.target, optimization=0)
        return []
    except CompileError:
        pass
    messages = []  # find the entries ptxas rejects, one by one
    for entry in entries:
        try:
            ptx.assemble(ptx.module_of([entry], renderer), renderer.target, optimization=0)
        except CompileError as error:
            messages.append(str(error)[:4000])
    return messages
