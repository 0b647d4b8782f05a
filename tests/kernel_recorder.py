"""A pytest plugin: every kernel the test session compiles (on any device) is rendered to PTX and assembled with
`ptxas` at the end of the session, many kernels per ptxas call.

There is no GPU in CI, so this is how every kernel the op suite produces is checked to give valid PTX. Each xdist
worker renders its own kernels when it finishes (both cores render), the controller joins the entries (a kernel
several workers compiled is assembled once) and assembles them for sm_75, the oldest architecture ember targets, and
for sm_90 (an H100) with that target's PTX header. The renderer emits the same instructions for every target, and
`tests/test_ptx.py` assembles every primitive op and dtype for each of `ptx.ASSEMBLY_TARGETS`. On when ptxas is on
PATH; EMBER_PTX_CHECK=0 turns it off. A kernel ptxas rejects fails the session (exit status 1) and is printed with
ptxas's message; the summary line gives the number of kernels assembled.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ember.backends import ptx
from ember.capabilities import DeviceInfo
from ember.core.errors import CompileError
from ember.ir.kernel import Kernel

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
    entries, failures = render_entries(_recorded)
    worker = getattr(session.config, "workerinput", None)
    if worker is not None:  # an xdist worker hands its rendered kernels to the controller
        (directory / f"kernels-{worker['workerid']}.pkl").write_bytes(pickle.dumps((entries, failures)))
        return
    for path in directory.glob("kernels-*.pkl"):
        worker_entries, worker_failures = pickle.loads(path.read_bytes())
        entries.update(worker_entries)
        failures.extend(worker_failures)
        path.unlink()
    if not entries and not failures:
        return
    start = time.perf_counter()
    failures.extend(assemble_all([entries[name] for name in sorted(entries)]))
    seconds = time.perf_counter() - start
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")
        reporter.write_line(f"PTX check: {len(entries)} kernels of this session rendered to PTX and assembled by "
                            f"ptxas for {', '.join(SESSION_TARGETS)} in {seconds:.1f} s; {len(failures)} rejected")
        for failure in failures[:10]:
            reporter.write_line(failure, red=True)
    if failures:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def render_entries(kernels: set[Kernel]) -> tuple[dict[str, str], list[str]]:
    """Each kernel's PTX entry, named by a hash of the kernel (so workers name a kernel alike), and the messages of
    kernels whose rendering failed."""
    from ember.ir.opt import build_kernel_ir

    renderer = ptx.PTXRenderer()
    info = DeviceInfo()
    entries, failures = {}, []
    for kernel in kernels:
        name = "kernel_" + hashlib.sha256(repr(kernel).encode()).hexdigest()[:20]
        try:
            entries[name] = renderer.render_entry(build_kernel_ir(kernel, name, info))
        except Exception as error:  # noqa: BLE001 - reported with the kernel that caused it
            failures.append(f"rendering PTX failed ({type(error).__name__}: {error}) for {kernel!r}")
    return entries, failures


def assemble_all(entries: list[str]) -> list[str]:
    """Assemble the entries in modules of many, for each session target; the messages of rejected ones."""
    modules = [entries[start:start + KERNELS_PER_MODULE] for start in range(0, len(entries), KERNELS_PER_MODULE)]
    jobs = [(module, ptx.PTXRenderer(target)) for module in modules for target in SESSION_TARGETS]
    failures = []
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for messages in pool.map(lambda job: _assemble_module(*job), jobs):
            failures.extend(messages)
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
