"""GPU kernels against PyTorch on the same GPU: ember's cuda backend (or any device) next to torch CUDA, in one run.

Issue 28's cases: softmax and sum over 4096x4096 rows, layer norm over 4096x1024, matmul in float32 at 1024^2 and
4096^2 and in float16 at 4096^2, causal scaled-dot-product attention, an MLP (784-512-10) SGD training step, and a
tiny op realized each time (the launch path's cost). Each case is written once against a module namespace (`torch`
or `ember`) and timed for both, best of N runs after warm-up, each run ending when the device has finished; the
table prints each side's time, torch's over ember's (higher is better for ember; 1.0 is parity) and the largest
difference of the results. A case one side cannot run prints why and the run goes on. This is a measuring
script, never a test.

    python benchmarks/gpu.py [--device cuda] [--torch-device cuda] [--runs 10] [--case NAME]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class Synchronizer:
    """How a side makes a result ready: `queue` starts its work (ember realizes it; torch has already launched),
    `wait` also waits until the device has finished."""

    def __init__(self, lib: Any, device: str) -> None:
        self.lib, self.device = lib, device
        self.ember_device: Any = None
        if lib.__name__ != "torch":
            from ember.backends.registry import REGISTRY
            from ember.scheduler.devices import backend_device

            self.ember_device = REGISTRY.device(backend_device(device.partition(":")[0], None, "benchmarks/gpu.py"))

    def queue(self, result: Any) -> None:
        if self.ember_device is not None:
            results = result if isinstance(result, (tuple, list)) else (result,)
            self.lib.realize(*[r for r in results if isinstance(r, self.lib.Tensor)])

    def wait(self, result: Any) -> None:
        self.queue(result)
        if self.ember_device is not None:
            if hasattr(self.ember_device, "synchronize"):
                self.ember_device.synchronize()
        elif self.device.startswith("cuda"):
            self.lib.cuda.synchronize()


def tensor(lib: Any, array: np.ndarray, device: str, dtype: str = "float32", requires_grad: bool = False) -> Any:
    made = lib.tensor(array, device=device, dtype=getattr(lib, dtype))
    if lib.__name__ != "torch":
        made.realize()  # (stored in its dtype, as torch's: a lazy cast would be computed again inside each op)
    if requires_grad:
        made.requires_grad_(True)
    return made


def case_softmax(lib: Any, device: str) -> tuple[Callable[[], Any], float]:
    x = tensor(lib, np.random.default_rng(0).standard_normal((4096, 4096), dtype=np.float32), device)
    return (lambda: lib.nn.functional.softmax(x, dim=-1)), 2 * x.numel() * 4


def case_sum(lib: Any, device: str) -> tuple[Callable[[], Any], float]:
    x = tensor(lib, np.random.default_rng(0).standard_normal((4096, 4096), dtype=np.float32), device)
    return (lambda: x.sum(1)), x.numel() * 4


def case_layer_norm(lib: Any, device: str) -> tuple[Callable[[], Any], float]:
    rng = np.random.default_rng(0)
    x = tensor(lib, rng.standard_normal((4096, 1024), dtype=np.float32), device)
    weight = tensor(lib, rng.standard_normal(1024, dtype=np.float32), device)
    bias = tensor(lib, rng.standard_normal(1024, dtype=np.float32), device)
    return (lambda: lib.nn.functional.layer_norm(x, (1024,), weight, bias)), 2 * x.numel() * 4


def matmul_case(size: int, dtype: str) -> Callable[[Any, str], tuple[Callable[[], Any], float]]:
    def case(lib: Any, device: str) -> tuple[Callable[[], Any], float]:
        rng = np.random.default_rng(0)
        a = tensor(lib, rng.standard_normal((size, size), dtype=np.float32), device, dtype)
        b = tensor(lib, rng.standard_normal((size, size), dtype=np.float32), device, dtype)
        return (lambda: a @ b), 2.0 * size ** 3

    return case


def case_attention(lib: Any, device: str) -> tuple[Callable[[], Any], float]:
    batch, heads, length, width = 4, 16, 1024, 64
    rng = np.random.default_rng(0)
    q, k, v = (tensor(lib, rng.standard_normal((batch, heads, length, width), dtype=np.float32), device)
               for _ in range(3))
    flops = 4.0 * batch * heads * length * length * width / 2  # causal: half the scores
    return (lambda: lib.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)), flops


def case_mlp_step(lib: Any, device: str) -> tuple[Callable[[], Any], float]:
    lib.manual_seed(0)
    model = lib.nn.Sequential(lib.nn.Linear(784, 512), lib.nn.ReLU(), lib.nn.Linear(512, 10)).to(device)
    optimizer = lib.optim.SGD(model.parameters(), lr=0.01)
    rng = np.random.default_rng(0)
    images = tensor(lib, rng.standard_normal((128, 784), dtype=np.float32), device)
    labels = lib.tensor(rng.integers(0, 10, 128), device=device)

    def step() -> Any:
        optimizer.zero_grad()
        loss = lib.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss

    return step, 2.0 * 3 * 128 * (784 * 512 + 512 * 10)


def case_tiny(lib: Any, device: str) -> tuple[Callable[[], Any], float]:
    x = tensor(lib, np.arange(16, dtype=np.float32), device)
    return (lambda: x + 1), 0.0


CASES: dict[str, tuple[Callable[[Any, str], tuple[Callable[[], Any], float]], str]] = {
    "softmax 4096x4096": (case_softmax, "GB/s"),
    "sum(1) 4096x4096": (case_sum, "GB/s"),
    "layer_norm 4096x1024": (case_layer_norm, "GB/s"),
    "matmul f32 1024": (matmul_case(1024, "float32"), "TFLOP/s"),
    "matmul f32 4096": (matmul_case(4096, "float32"), "TFLOP/s"),
    "matmul f16 4096": (matmul_case(4096, "float16"), "TFLOP/s"),
    "sdpa causal 4x16x1024x64": (case_attention, "TFLOP/s"),
    "mlp 784-512-10 sgd step": (case_mlp_step, "TFLOP/s"),
    "tiny op (x + 1, 16 elements)": (case_tiny, "us"),
}


def queued_time(run: Callable[[], Any], sync: Synchronizer, runs: int) -> float:
    """Seconds per run of `runs` runs queued back to back (each realized, none waited for but the last): where the
    device's work takes longer than the host's, this is the kernels' time, the host's cost hidden behind it."""
    results = []
    begin = time.perf_counter()
    for _ in range(runs):
        result = run()
        sync.queue(result)
        results.append(result)
    sync.wait(results[-1])
    return (time.perf_counter() - begin) / runs


def best_time(run: Callable[[], Any], sync: Synchronizer, runs: int, budget: float) -> tuple[float, Any]:
    """The best of `runs` timed runs after two warm-ups (fewer when one run takes over budget/runs seconds)."""
    result = None
    for _ in range(2):
        result = run()
        sync.wait(result)
    times = []
    started = time.perf_counter()
    for _ in range(runs):
        begin = time.perf_counter()
        result = run()
        sync.wait(result)
        times.append(time.perf_counter() - begin)
        if time.perf_counter() - started > budget:
            break
    return min(times), result


@contextmanager
def driver_calls(device: Any) -> Iterator[dict[str, list[float]]]:
    """Each call the block makes to `device`'s driver module (cuda's `cuLaunchKernel`, `cuStreamQuery`, ...): its
    name and seconds, counted by wrapping the module's functions for the block's time (none for a device without
    a driver module: the c backend's kernels are ctypes calls)."""
    calls: dict[str, list[float]] = {}
    driver = getattr(device, "driver", None)
    originals = {name: getattr(driver, name) for name in dir(driver) if name.startswith("cu")
                 and callable(getattr(driver, name))} if driver is not None else {}

    def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*arguments: Any) -> Any:
            begin = time.perf_counter()
            try:
                return function(*arguments)
            finally:
                calls.setdefault(name, []).append(time.perf_counter() - begin)
        return call

    try:
        for name, function in originals.items():
            setattr(driver, name, timed(name, function))
        yield calls
    finally:
        for name, function in originals.items():
            setattr(driver, name, function)


def profile_run(ember: Any, run: Callable[[], Any], sync: Synchronizer) -> None:
    """How long the host took to queue one run (building, scheduling and launching) against the whole run (until
    the device finished), the driver calls the run made (count and microseconds each: where the host's time goes
    below Python), then one more run under ember.profile() for its kernels and compiles (a profile times each
    kernel, waiting for it, so a kernel's microseconds include its launch and wait; no measure of the host's
    share)."""
    begin = time.perf_counter()
    result = run()
    sync.queue(result)
    queued = time.perf_counter() - begin
    sync.wait(result)
    whole = time.perf_counter() - begin
    with driver_calls(sync.ember_device) as calls:
        runs = 20
        for _ in range(runs):
            result = run()
            sync.queue(result)
        sync.wait(result)
    if calls:
        spent = sorted(calls.items(), key=lambda item: -sum(item[1]))
        print("    driver calls a run: " + ", ".join(
            f"{name} {len(times) / runs:.1f} x {sum(times) / len(times) * 1e6:.1f}us" for name, times in spent),
            flush=True)
    with ember.profile() as record:
        sync.wait(run())
    kernels = ", ".join(f"{kernel.name}[{kernel.global_size}] {kernel.seconds * 1e6:.0f}us" for kernel in record.kernels[:12])
    more = f" and {len(record.kernels) - 12} more" if len(record.kernels) > 12 else ""
    print(f"    profile: host {queued * 1e3:.3f} ms of {whole * 1e3:.3f} ms; {len(record.compiles)} compiles; "
          f"{len(record.kernels)} kernels: {kernels}{more}", flush=True)


def as_numpy(lib: Any, result: Any) -> np.ndarray | None:
    try:
        if lib.__name__ == "torch":
            return result.detach().float().cpu().numpy()
        return np.asarray(result.float().numpy())
    except Exception:  # noqa: BLE001 - a result that cannot be read is reported as '-'
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="ember's device (default cuda)")
    parser.add_argument("--torch-device", default=None, help="torch's device (default: cuda if it has one, else cpu)")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per case and side (best is kept)")
    parser.add_argument("--budget", type=float, default=5.0, help="seconds of timed runs per case and side at most")
    parser.add_argument("--case", action="append", help="a case name's start (repeatable; default all)")
    parser.add_argument("--profile", action="store_true", help="after each case, one more ember run under "
                        "ember.profile(): its kernels (name, global size), compiles, and the host's share of its time")
    args = parser.parse_args(argv)

    import ember
    import torch

    torch_device = args.torch_device or ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"ember on {args.device}, torch {torch.__version__} on {torch_device}"
          + (f" ({torch.cuda.get_device_name()})" if torch_device.startswith("cuda") else ""))
    print(f"{'case':32} {'torch':>10} {'ember':>10} {'torch/ember':>11} {'unit':>8} {'torch':>9} {'ember':>9} "
          f"{'max diff':>9} {'torch q':>10} {'ember q':>10}")
    for name, (build, unit) in CASES.items():
        if args.case and not any(name.startswith(wanted) for wanted in args.case):
            continue
        seconds: dict[str, float | None] = {}
        queued: dict[str, float | None] = {}
        values: dict[str, np.ndarray | None] = {}
        work = 0.0
        for lib, device in ((torch, torch_device), (ember, args.device)):
            try:
                run, work = build(lib, device)
                sync = Synchronizer(lib, device)
                taken, result = best_time(run, sync, args.runs, args.budget)
                seconds[lib.__name__] = taken
                queued[lib.__name__] = queued_time(run, sync, args.runs) if taken < 0.05 else None
                values[lib.__name__] = as_numpy(lib, result)
                if args.profile and lib is ember:
                    profile_run(ember, run, sync)
            except Exception as error:  # noqa: BLE001 - one side failing is reported, the others still run
                seconds[lib.__name__] = values[lib.__name__] = None
                print(f"  {name}: {lib.__name__} failed: {type(error).__name__}: {str(error)[:300]}")
                traceback.print_exc(limit=3)

        def rate(side: str) -> str:
            taken = seconds.get(side)
            if taken is None:
                return "-"
            if unit == "us":
                return f"{taken * 1e6:.1f}"
            scale = 1e9 if unit == "GB/s" else 1e12
            return f"{work / taken / scale:.2f}"

        torch_s, ember_s = seconds.get("torch"), seconds.get("ember")
        ratio = f"{torch_s / ember_s:.3f}" if torch_s and ember_s else "-"
        diff = "-"
        theirs, mine = values.get("torch"), values.get("ember")
        if theirs is not None and mine is not None and theirs.shape == mine.shape:
            scale = max(1.0, float(np.max(np.abs(theirs))))
            diff = f"{float(np.max(np.abs(theirs - mine))) / scale:.1e}"
        ms = lambda taken: f"{taken * 1e3:.3f}ms" if taken is not None else "-"  # noqa: E731
        print(f"{name:32} {ms(torch_s):>10} {ms(ember_s):>10} {ratio:>11} {unit:>8} {rate('torch'):>9} "
              f"{rate('ember'):>9} {diff:>9} {ms(queued.get('torch')):>10} {ms(queued.get('ember')):>10}", flush=True)
    print("times: the best of the runs, each waited for; q: per run of runs queued back to back (the kernels' time "
          "where they take longer than the host's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
