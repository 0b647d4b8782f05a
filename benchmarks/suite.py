"""The benchmark suite (`python -m ember bench`): ember on each device next to PyTorch and numpy, in one run.

Every case of BENCHMARKS.md is timed for each implementation in the same process (medians of N runs after
warm-up, the implementations taking turns; inputs are touched before timing), and the cold-start cases run in fresh
processes with empty kernel caches. Results print as one table with speed ratios and can be written as JSON; `--compare a.json b.json` shows
how two runs differ. This is a measuring script, never a test: nothing here fails on a slow number.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ember.scheduler import quick_compile

Runner = Callable[[], Any]  # one timed run; its return value is ignored


@dataclass
class Result:
    """One implementation's timing of one case."""

    case: str
    implementation: str
    metric: float | None  # in the case's unit; None if the implementation could not run
    unit: str
    higher_is_better: bool
    median_seconds: float | None = None
    runs: list[float] = field(default_factory=list)
    note: str = ""


@dataclass
class Case:
    """A benchmark: how to build each implementation's runner, and how seconds become the reported metric."""

    name: str
    unit: str
    higher_is_better: bool
    to_metric: Callable[[float], float]
    builders: dict[str, Callable[[], Runner]]
    inner_loops: int = 1  # a runner repeats the op this many times (per-op overhead cases)


# ---- timing --------------------------------------------------------------------------------------------------------


def measure(runner: Runner, repeats: int, warmup: int) -> list[float]:
    """Seconds of each of `repeats` runs after `warmup` runs."""
    for _ in range(warmup):
        runner()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner()
        times.append(time.perf_counter() - start)
    return times


# a library's worker threads that keep spinning after its call returns (OpenBLAS's: 50-200 ms after each threaded
# matmul here) take the cores from the next implementation timed: ember's 1024^2 matmul measured 84-88 GFLOP/s when
# timed right after numpy's and 161-166 after a 0.2 s pause (192 alone), which made every matmul ratio a measure of
# the order of the turns. Before each timed run the process waits until its own threads are idle.
SETTLE_WINDOW = 0.005  # seconds of sleep over which the process's CPU time is read
SETTLE_BUSY = 0.2  # the share of one core the process's threads may use while the main thread sleeps: idle
SETTLE_LIMIT = 1.0  # seconds waited at most (a library whose threads never sleep is timed as it is)


def settle() -> float:
    """Wait until no thread of this process keeps a core busy (another library's spinning workers), at most
    SETTLE_LIMIT seconds; the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < SETTLE_LIMIT:
        cpu = time.process_time()  # (all of the process's threads)
        time.sleep(SETTLE_WINDOW)
        if time.process_time() - cpu < SETTLE_BUSY * SETTLE_WINDOW:
            break
    return time.perf_counter() - start


# untimed calls before back-to-back timed ones: right after another library's threads ran, the first ~10-40 ms of
# calls ran at half speed here (1024^2: ember 140-190 GFLOP/s for 2-4 calls, then 330-350; numpy likewise after
# ember's), as the kernel's scheduler had both of a side's threads on one core until it spread them again (binding
# OpenMP's threads, OMP_PROC_BIND=true, removed the dip, but it pins the interpreter's main thread and every thread
# it starts later to one core); a program calling matmuls back to back runs at the later speed
WARM_SECONDS = 0.05


def warm_up(run: Callable[[], Any]) -> None:
    """Call `run` for WARM_SECONDS (at least once), untimed."""
    warm_until = time.perf_counter() + WARM_SECONDS
    run()
    while time.perf_counter() < warm_until:
        run()


def touched(array: np.ndarray) -> np.ndarray:
    """The array with every page written once (first touches of fresh memory are slow on some VMs)."""
    array.reshape(-1)[:: max(1, 4096 // array.itemsize)] += 0
    return array


# ---- implementations -------------------------------------------------------------------------------------------------


def ember_runner(device: str, build: Callable[[Any], Callable[[], Any]]) -> Callable[[], Runner]:
    """A runner that realizes ember tensors on `device` and waits for the device."""

    def make() -> Runner:
        import ember
        from ember.scheduler.devices import get_device

        target = get_device(device)
        step = build(ember)

        def run() -> None:
            outputs = step()
            ember.realize(*(outputs if isinstance(outputs, tuple) else (outputs,)))
            target.synchronize()

        return run

    return make


def torch_module() -> Any:
    import torch

    return torch


def compiled(function: Callable[..., Any]) -> Callable[..., Any]:
    """torch.compile of a function (raises if inductor cannot work here; the case then notes it)."""
    return torch_module().compile(function)


def matmul_case(size: int, devices: list[str], with_compile: bool) -> Case:
    generator = np.random.default_rng(0)
    a = touched(generator.standard_normal((size, size), dtype=np.float32))
    b = touched(generator.standard_normal((size, size), dtype=np.float32))

    def ember_build(device: str) -> Callable[[Any], Callable[[], Any]]:
        def build(ember: Any) -> Callable[[], Any]:
            x, y = ember.tensor(a, device=device), ember.tensor(b, device=device)
            return lambda: x @ y

        return build

    def torch_build(use_compile: bool) -> Callable[[], Runner]:
        def make() -> Runner:
            torch = torch_module()
            x, y = torch.from_numpy(a), torch.from_numpy(b)
            function = compiled(torch.matmul) if use_compile else torch.matmul
            return lambda: function(x, y)

        return make

    builders: dict[str, Callable[[], Runner]] = {f"ember {device}": ember_runner(device, ember_build(device)) for device in devices}
    builders["torch"] = torch_build(False)
    if with_compile:
        builders["torch.compile"] = torch_build(True)
    builders["numpy"] = lambda: (lambda: np.matmul(a, b))
    return Case(f"matmul {size}x{size} f32", "GFLOP/s", True, lambda seconds: 2 * size**3 / seconds / 1e9, builders)


def elementwise_case(count: int, devices: list[str], with_compile: bool) -> Case:
    data = touched(np.random.default_rng(1).uniform(-1, 1, count).astype(np.float32))

    def chain(x: Any) -> Any:
        return ((x * 2 + 1).exp()).sqrt()

    def ember_build(device: str) -> Callable[[Any], Callable[[], Any]]:
        def build(ember: Any) -> Callable[[], Any]:
            x = ember.tensor(data, device=device)
            return lambda: chain(x)

        return build

    def torch_build(use_compile: bool) -> Callable[[], Runner]:
        def make() -> Runner:
            x = torch_module().from_numpy(data)
            function = compiled(chain) if use_compile else chain
            return lambda: function(x)

        return make

    builders: dict[str, Callable[[], Runner]] = {f"ember {device}": ember_runner(device, ember_build(device)) for device in devices}
    builders["torch"] = torch_build(False)
    if with_compile:
        builders["torch.compile"] = torch_build(True)
    builders["numpy"] = lambda: (lambda: np.sqrt(np.exp(data * 2 + 1)))
    name = f"elementwise ((x*2+1).exp()).sqrt(), {count // 2**20}M f32" if count >= 2**20 else (
        f"elementwise ((x*2+1).exp()).sqrt(), {count} f32")
    return Case(name, "GB/s", True, lambda seconds: 2 * 4 * count / seconds / 1e9, builders)


def softmax_case(size: int, devices: list[str], with_compile: bool) -> Case:
    data = touched(np.random.default_rng(2).standard_normal((size, size), dtype=np.float32))

    def ember_build(device: str) -> Callable[[Any], Callable[[], Any]]:
        def build(ember: Any) -> Callable[[], Any]:
            x = ember.tensor(data, device=device)
            return lambda: x.softmax(-1)

        return build

    def torch_build(use_compile: bool) -> Callable[[], Runner]:
        def make() -> Runner:
            torch = torch_module()
            x = torch.from_numpy(data)

            def softmax(value: Any) -> Any:
                return torch.softmax(value, -1)

            function = compiled(softmax) if use_compile else softmax
            return lambda: function(x)

        return make

    def numpy_softmax() -> None:
        exponentials = np.exp(data - data.max(-1, keepdims=True))
        exponentials / exponentials.sum(-1, keepdims=True)

    builders: dict[str, Callable[[], Runner]] = {f"ember {device}": ember_runner(device, ember_build(device)) for device in devices}
    builders["torch"] = torch_build(False)
    if with_compile:
        builders["torch.compile"] = torch_build(True)
    builders["numpy"] = lambda: numpy_softmax
    return Case(f"softmax last axis {size}x{size} f32", "GB/s", True, lambda s: 2 * 4 * size * size / s / 1e9, builders)


MLP_SOURCE = """
def build_ember_mlp(ember, device, batch, inputs, hidden, classes, seed):
    import numpy as np
    import ember.nn as nn
    import ember.nn.functional as F
    import ember.optim as optim
    ember.manual_seed(seed)
    model = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, classes)).to(device)
    optimizer = optim.SGD(model.parameters(), lr=0.01)
    generator = np.random.default_rng(seed)
    x = ember.tensor(generator.standard_normal((batch, inputs), dtype=np.float32), device=device)
    y = ember.tensor(generator.integers(0, classes, batch), device=device)

    def step():
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return (loss, *model.parameters())

    return step


def build_torch_mlp(torch, batch, inputs, hidden, classes, seed, use_compile=False):
    import numpy as np
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, classes))
    forward = torch.compile(model) if use_compile else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = np.random.default_rng(seed)
    x = torch.from_numpy(generator.standard_normal((batch, inputs), dtype=np.float32))
    y = torch.from_numpy(generator.integers(0, classes, batch))

    def step():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(forward(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step
"""
_mlp_namespace: dict[str, Any] = {}
exec(compile(MLP_SOURCE, "<benchmarks/suite.py mlp>", "exec"), _mlp_namespace)  # the same code runs in cold-start processes


def mlp_case(batch: int, devices: list[str], with_compile: bool) -> Case:
    shape = (batch, 784, 512, 10, 0)

    def ember_build(device: str) -> Callable[[Any], Callable[[], Any]]:
        return lambda ember: _mlp_namespace["build_ember_mlp"](ember, device, *shape)

    def torch_build(use_compile: bool) -> Callable[[], Runner]:
        def make() -> Runner:
            step = _mlp_namespace["build_torch_mlp"](torch_module(), *shape, use_compile=use_compile)
            return lambda: step()

        return make

    def ember_jit_build(device: str) -> Callable[[Any], Callable[[], Any]]:
        return lambda ember: ember.jit(_mlp_namespace["build_ember_mlp"](ember, device, *shape))

    builders: dict[str, Callable[[], Runner]] = {}
    for device in devices:
        builders[f"ember {device}"] = ember_runner(device, ember_build(device))
        builders[f"ember {device} jit"] = ember_runner(device, ember_jit_build(device))
    builders["torch"] = torch_build(False)
    if with_compile:
        builders["torch.compile"] = torch_build(True)
    return Case(f"MLP 784-512-10 SGD step, batch {batch}", "ms", False, lambda seconds: seconds * 1e3, builders)


def graph_ops(function: Callable[[], Any]) -> int:
    """How many primitive ops (graph nodes) one eager call of `function` records."""
    from ember.core.graph import Node

    created = 0
    original = Node.__init__

    def counting(node: Node, *args: Any, **kwargs: Any) -> None:
        nonlocal created
        created += 1
        original(node, *args, **kwargs)

    Node.__init__ = counting  # type: ignore[method-assign, assignment]
    try:
        function()
    finally:
        Node.__init__ = original  # type: ignore[method-assign]
    return created


def jit_replay_case(devices: list[str], loops: int) -> Case:
    """ember.jit replays of a small MLP training step (launch overhead dominates), as tensor ops per second: the
    primitive ops the eager step records, per second of replay; torch's eager step is timed the same way."""
    shape = (4, 16, 32, 4, 0)
    ops: dict[str, int] = {}

    def ember_build(device: str) -> Callable[[], Runner]:
        def make() -> Runner:
            import ember
            from ember.scheduler.devices import get_device

            target = get_device(device)
            step = _mlp_namespace["build_ember_mlp"](ember, device, *shape)
            ops["ember"] = graph_ops(lambda: ember.realize(*step()))
            jitted = ember.jit(step)

            def run() -> None:
                for _ in range(loops):
                    jitted()
                target.synchronize()

            return run

        return make

    def torch_make() -> Runner:
        step = _mlp_namespace["build_torch_mlp"](torch_module(), *shape)

        def run() -> None:
            for _ in range(loops):
                step()

        return run

    builders: dict[str, Callable[[], Runner]] = {f"ember {device} jit": ember_build(device) for device in devices}
    builders["torch"] = torch_make
    return Case("jit replay: MLP 16-32-4 SGD step, batch 4", "M ops/s", True,
                lambda seconds: ops.get("ember", 0) * loops / seconds / 1e6, builders)


def overhead_case(devices: list[str], loops: int) -> Case:
    data = np.ones(16, dtype=np.float32)

    def ember_build(device: str) -> Callable[[], Runner]:
        def make() -> Runner:
            import ember
            from ember.scheduler.devices import get_device

            target = get_device(device)
            x = ember.tensor(data, device=device)

            def run() -> None:
                for _ in range(loops):
                    (x + 1).realize()
                target.synchronize()

            return run

        return make

    def torch_make() -> Runner:
        x = torch_module().from_numpy(data)

        def run() -> None:
            for _ in range(loops):
                x + 1

        return run

    def numpy_make() -> Runner:
        def run() -> None:
            for _ in range(loops):
                data + 1

        return run

    builders: dict[str, Callable[[], Runner]] = {f"ember {device}": ember_build(device) for device in devices}
    builders["torch"] = torch_make
    builders["numpy"] = numpy_make
    return Case("per-op overhead (x+1).realize(), 16 elements", "us", False, lambda s: s / loops * 1e6, builders)


# ---- cold start (fresh processes, empty caches) -------------------------------------------------------------------

COLD_GRAPH = """
import json, os, sys, time
start = time.perf_counter()
import numpy as np
import ember
imported = time.perf_counter()
device = sys.argv[1]
x = ember.tensor(np.random.default_rng(0).standard_normal((64, 64), dtype=np.float32), device=device)
w = ember.tensor(np.random.default_rng(1).standard_normal((64, 64), dtype=np.float32), device=device)
h = (x @ w).relu().contiguous()                  # kernel 1
out = (h.softmax(0) * 2 + x).contiguous().sum(0)  # kernels 2-3 (column max, sum of exponentials), 4 (store), 5 (sum)
with ember.profile() as profile:
    first = time.perf_counter()
    out.realize()
    ember.scheduler.devices.get_device(device).synchronize()
    done = time.perf_counter()
print(json.dumps({"import": imported - start, "first": done - first, "kernels": len(profile.kernels)}))
"""

COLD_MLP = """
import json, sys, time
start = time.perf_counter()
import ember
from ember.benchmark_files import load_suite
_mlp_namespace = load_suite()._mlp_namespace
imported = time.perf_counter()
device = sys.argv[1]
step = _mlp_namespace["build_ember_mlp"](ember, device, int(sys.argv[2]), 784, 512, 10, 0)
with ember.profile() as profile:
    first = time.perf_counter()
    ember.realize(*step())
    ember.scheduler.devices.get_device(device).synchronize()
    done = time.perf_counter()
print(json.dumps({"import": imported - start, "first": done - first, "kernels": len(profile.kernels)}))
"""

COLD_TORCH_MLP = """
import json, sys, time
start = time.perf_counter()
import torch
from ember.benchmark_files import load_suite
_mlp_namespace = load_suite()._mlp_namespace
imported = time.perf_counter()
step = _mlp_namespace["build_torch_mlp"](torch, int(sys.argv[2]), 784, 512, 10, 0)
first = time.perf_counter()
step()
done = time.perf_counter()
print(json.dumps({"import": imported - start, "first": done - first, "kernels": 0}))
"""


def cold_start(source: str, arguments: list[str], extra_environment: dict[str, str] | None = None) -> dict[str, float]:
    """Run a script in a fresh process with empty ember, PoCL and Mesa caches; its JSON report."""
    with tempfile.TemporaryDirectory(prefix="ember-cold-") as folder:
        environment = dict(os.environ)
        environment.update({
            "EMBER_CACHE_DIR": os.path.join(folder, "ember"), "POCL_CACHE_DIR": os.path.join(folder, "pocl"),
            "MESA_SHADER_CACHE_DIR": os.path.join(folder, "mesa"), "XDG_CACHE_HOME": os.path.join(folder, "xdg"),
        }, **(extra_environment or {}))
        result = subprocess.run([sys.executable, "-c", source, *arguments], capture_output=True, text=True,
                                env=environment, timeout=1800)
        if result.returncode != 0:
            raise RuntimeError(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed")
        return json.loads(result.stdout.strip().splitlines()[-1])


def cold_results(devices: list[str], batch: int, repeats: int) -> list[Result]:
    """Cold-start cases: first realize of a 5-kernel graph, first MLP training step (ember and torch)."""
    results = []
    cases = [("cold start: first realize of a 5-kernel graph", COLD_GRAPH, devices, False),
             (f"cold start: first MLP training step, batch {batch}", COLD_MLP, devices, True)]
    for name, source, case_devices, with_torch in cases:
        runs: list[tuple[str, list[str], str, dict[str, str]]] = [
            (f"ember {device}", [device, str(batch)], source, {}) for device in case_devices]
        for device in [device for device in case_devices if device.split(":")[0] == "c"][:1]:
            # quick builds first, EMBER_QUICK_COMPILE=1 (opt-in: values within float tolerance of the optimized ones)
            runs.append((f"ember {device} quick", [device, str(batch)], source,
                         {"EMBER_QUICK_COMPILE": "1"}))
        if with_torch:
            runs.append(("torch", ["cpu", str(batch)], COLD_TORCH_MLP, {}))
        for implementation, arguments, script, extra in runs:
            try:
                reports = [cold_start(script, arguments, extra) for _ in range(repeats)]
            except Exception as error:  # noqa: BLE001 - a case that cannot run is reported, not fatal
                results.append(Result(name, implementation, None, "ms", False, note=f"failed: {error}"))
                continue
            firsts = [report["first"] for report in reports]
            median = statistics.median(firsts)
            note = f"{reports[0]['kernels']} kernels; import {statistics.median(r['import'] for r in reports):.2f} s"
            results.append(Result(name, implementation, median * 1e3, "ms", False, median, firsts,
                                  note if implementation != "torch" else note.split("; ")[1]))
    return results


# ---- running and reporting ----------------------------------------------------------------------------------------


def run_case(case: Case, repeats: int, warmup: int, log: Callable[[str], None], warm_turns: bool = True) -> \
        list[Result]:
    """Warm every implementation up, then time them in turns (run 1 of each, run 2 of each, ...), each run once the
    threads the previous one left spinning are idle (`settle`) and, with `warm_turns`, after WARM_SECONDS of its own
    untimed calls (`warm_up`).

    Taking turns spreads the noise of other processes evenly over the implementations, so ratios hold up better
    than absolute numbers on a busy machine. The warm calls of each turn keep a turn's timed run from being the first
    call after another library's: ember's 1024^2 matmul timed right after numpy's (OpenBLAS's threads idle again)
    measured 145-168 GFLOP/s, and 335-347 after its warm calls (numpy's and torch's alike, 326-354), so the table gave
    0.64x numpy for what runs at 1.06x back to back (benchmarks/blas_matmul.py)."""
    runners: dict[str, Runner] = {}
    failures: dict[str, str] = {}
    for implementation, builder in case.builders.items():
        try:
            runner = builder()
            measure(runner, 0, warmup)
            quick_compile.wait_for_optimized()  # time the optimized kernels, not a cold start's quick builds
            runners[implementation] = runner
        except Exception as error:  # noqa: BLE001 - e.g. torch.compile without a working inductor here
            message = str(error).strip().splitlines()[0][:120] if str(error).strip() else type(error).__name__
            failures[implementation] = f"failed: {type(error).__name__}: {message}"
    times: dict[str, list[float]] = {implementation: [] for implementation in runners}
    for _ in range(repeats):
        for implementation, runner in runners.items():
            settle()
            if warm_turns:
                warm_up(runner)
            times[implementation] += measure(runner, 1, 0)
    results = []
    for implementation in case.builders:
        if implementation in failures:
            results.append(Result(case.name, implementation, None, case.unit, case.higher_is_better,
                                  note=failures[implementation]))
            log(f"  {implementation:<16} {failures[implementation]}")
            continue
        median = statistics.median(times[implementation])
        results.append(Result(case.name, implementation, case.to_metric(median), case.unit, case.higher_is_better,
                              median, times[implementation]))
        log(f"  {implementation:<16} {case.to_metric(median):12.4g} {case.unit}")
    return results


def speed_ratio(result: Result, baseline: Result | None) -> float | None:
    """How many times faster result is than baseline (both in the case's unit)."""
    if baseline is None or result.metric is None or baseline.metric is None or not baseline.metric or not result.metric:
        return None
    return result.metric / baseline.metric if result.higher_is_better else baseline.metric / result.metric


def format_table(results: list[Result]) -> str:
    """One row per case and implementation, with the speed of ember relative to torch, torch.compile and numpy."""
    baselines = ("torch", "torch.compile", "numpy")
    header = f"| {'case':<50} | {'implementation':<16} | {'value':>11} | {'unit':<7} | " + " | ".join(
        f"{'vs ' + name:>16}" for name in baselines) + " | note"
    lines = [header, "|" + "|".join("-" * (len(part) + 0) for part in header.split("|")[1:-1]) + "|---"]
    for result in results:
        same_case = {other.implementation: other for other in results if other.case == result.case}
        ratios = []
        for name in baselines:
            ratio = speed_ratio(result, same_case.get(name)) if result.implementation.startswith("ember") else None
            ratios.append(f"{ratio:>15.2f}x" if ratio is not None else " " * 16)
        value = f"{result.metric:11.4g}" if result.metric is not None else f"{'n/a':>11}"
        lines.append(f"| {result.case:<50} | {result.implementation:<16} | {value} | {result.unit:<7} | "
                     + " | ".join(ratios) + f" | {result.note}")
    return "\n".join(lines)


def compare_files(first_path: str, second_path: str) -> str:
    """A table of two JSON runs: each case and implementation in both, and how much faster the second is."""
    with open(first_path) as file:
        first = {(row["case"], row["implementation"]): row for row in json.load(file)["results"]}
    with open(second_path) as file:
        second_rows = json.load(file)["results"]
    lines = [f"| {'case':<50} | {'implementation':<16} | {'first':>11} | {'second':>11} | {'unit':<7} | speedup",
             "|" + "-" * 52 + "|" + "-" * 18 + "|" + "-" * 13 + "|" + "-" * 13 + "|" + "-" * 9 + "|--------"]
    for row in second_rows:
        before = first.get((row["case"], row["implementation"]))
        if before is None:
            continue
        ratio = speed_ratio(Result(**row), Result(**before))
        shown = f"{ratio:.2f}x" if ratio is not None else "n/a"
        value = lambda entry: f"{entry['metric']:11.4g}" if entry["metric"] is not None else f"{'n/a':>11}"  # noqa: E731
        lines.append(f"| {row['case']:<50} | {row['implementation']:<16} | {value(before)} | {value(row)} | "
                     f"{row['unit']:<7} | {shown}")
    return "\n".join(lines)


def available_devices() -> list[str]:
    """Every device that runs kernels (not the render-only dummy devices)."""
    from ember.backends.registry import REGISTRY

    found: list[str] = []
    for backend, devices in REGISTRY.available().items():
        if backend != "dummy":
            found.extend(device.name for device in devices[:1] if device.info.can_run)
    return found


CASE_NAMES = ("matmul", "elementwise", "softmax", "mlp", "jit", "overhead", "cold")


def run_benchmarks(devices: list[str] | None = None, quick: bool = False, cases: tuple[str, ...] = CASE_NAMES,
                   with_compile: bool | None = None, repeats: int | None = None,
                   log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the suite; the results with a description of the machine and versions (what --json writes)."""
    import ember
    from ember.scheduler.devices import resolve_device

    devices = [resolve_device(device) for device in devices] if devices else available_devices()
    with_compile = (not quick) if with_compile is None else with_compile
    repeats = repeats or (3 if quick else 10)
    warmup = 1 if quick else 2
    sizes = {"matmul": 64, "elementwise": 1 << 12, "softmax": 64, "batch": 16, "loops": 100} if quick else (
        {"matmul": 1024, "elementwise": 1 << 24, "softmax": 4096, "batch": 256, "loops": 1000})
    results: list[Result] = []
    builders = {
        "matmul": lambda: matmul_case(sizes["matmul"], devices, with_compile),
        "elementwise": lambda: elementwise_case(sizes["elementwise"], devices, with_compile),
        "softmax": lambda: softmax_case(sizes["softmax"], devices, with_compile),
        "mlp": lambda: mlp_case(sizes["batch"], devices, with_compile),
        "jit": lambda: jit_replay_case(devices, sizes["loops"]),
        "overhead": lambda: overhead_case(devices, sizes["loops"]),
    }
    for name in cases:
        if name == "cold":
            log("cold start (fresh processes, empty caches)")
            results += cold_results(devices, sizes["batch"], 1 if quick else 3)
            continue
        case = builders[name]()
        log(case.name)
        results += run_case(case, repeats, warmup, log, warm_turns=not quick)
    return {
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": quick, "repeats": repeats, "warmup": warmup,
            "devices": devices, "python": platform.python_version(), "ember": ember.__version__,
            "numpy": np.__version__, "torch": _torch_version(), "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "load_average_before": os.getloadavg()[0], "load_average_after": None,
        },
        "results": [asdict(result) for result in results],
    }


def _torch_version() -> str:
    try:
        return torch_module().__version__
    except ImportError:
        return "not installed"


def main_bench(devices: list[str] | None, quick: bool, json_path: str | None, compare: list[str] | None,
               cases: list[str] | None = None, repeats: int | None = None) -> int:
    """`python -m ember bench`: run and print the table (and write JSON), or compare two JSON runs."""
    if compare:
        print(compare_files(compare[0], compare[1]))
        return 0
    status = 0
    if cases and "programs" in cases:  # tutorial-style programs: their own table (ember/benchmark_files.py)
        from ember.benchmark_files import main_programs
        from ember.scheduler.devices import resolve_device

        status = main_programs(resolve_device(devices[0]) if devices else "c", quick, repeats)
        cases = [case for case in cases if case != "programs"]
        if not cases:
            return status
    report = run_benchmarks(devices, quick, tuple(cases) if cases else CASE_NAMES, repeats=repeats)
    meta = report["meta"]
    meta["load_average_after"] = os.getloadavg()[0]
    print(f"\n{meta['date']}: {meta['cpus']} CPUs, load average {meta['load_average_before']:.1f} before and "
          f"{meta['load_average_after']:.1f} after (other processes make every number noisy); torch {meta['torch']}, "
          f"numpy {meta['numpy']}; medians of {meta['repeats']} runs after {meta['warmup']} warm-up"
          + ("" if meta["quick"] else f", each run after {WARM_SECONDS * 1e3:.0f} ms of untimed calls"))
    print(format_table([Result(**row) for row in report["results"]]))
    if json_path:
        with open(json_path, "w") as file:
            json.dump(report, file, indent=2)
        print(f"\nwrote {json_path}")
    return status
