"""Focused timing of a device's hot kernels (matmul, a fused elementwise chain, softmax) against torch (the C
backend by default; `--device opencl` for PoCL, whose launches are asynchronous: each run waits for the device).

The machine these run on is often shared, so ember and torch are timed alternately in one process, each run
several times, and the best (minimum) time of each is reported with the ratio. `--source` prints the generated C.
On a heavily loaded machine, `--cpu` times with the process's CPU time instead of the wall clock; run it with
OMP_NUM_THREADS=1 so that both libraries use one thread and no time is spent spinning.

    python benchmarks/c_kernels.py [matmul|linear|elementwise|softmax ...] [--repeats N] [--size N] [--source] [--cpu]
                                   [--device c|opencl|...]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import ember as em


def touched(array: np.ndarray) -> np.ndarray:
    array.reshape(-1)[:: max(1, 4096 // array.itemsize)] += 0
    return array


CLOCK = time.perf_counter
DEVICE = "c"


def tensor(array: np.ndarray) -> em.Tensor:
    return em.tensor(array, device=DEVICE)


def best_times(runners: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """The minimum seconds of each runner over `repeats` rounds, runners alternating within a round."""
    best = {name: float("inf") for name in runners}
    for runner in runners.values():
        runner()  # warm-up (compiles)
    for _ in range(repeats):
        for name, runner in runners.items():
            start = CLOCK()
            runner()
            best[name] = min(best[name], CLOCK() - start)
    return best


def ember_runner(build: Callable[[], em.Tensor]) -> Callable[[], None]:
    from ember.scheduler.devices import get_device

    device = get_device(DEVICE)

    def run() -> None:
        build().realize()
        device.synchronize()

    return run


def report(title: str, unit: str, amount: float, times: dict[str, float]) -> None:
    figures = {name: amount / seconds / 1e9 for name, seconds in times.items()}
    reference = figures.get("torch")
    parts = []
    for name, figure in figures.items():
        ratio = f" ({figure / reference:.2f}x torch)" if reference and name != "torch" else ""
        parts.append(f"{name} {figure:8.2f} {unit}{ratio}")
    print(f"{title:<34} " + " | ".join(parts), flush=True)


def matmul(size: int, repeats: int) -> None:
    generator = np.random.default_rng(0)
    a = touched(generator.standard_normal((size, size), dtype=np.float32))
    b = touched(generator.standard_normal((size, size), dtype=np.float32))
    x, y = tensor(a), tensor(b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    result = (x @ y).numpy()
    np.testing.assert_allclose(result, a @ b, rtol=1e-3, atol=1e-3 * size**0.5)
    times = best_times({"ember": ember_runner(lambda: x @ y), "torch": lambda: ta @ tb}, repeats)
    report(f"matmul {size}x{size} f32", "GFLOP/s", 2 * size**3, times)


def linear(batch: int, inputs: int, outputs: int, repeats: int) -> None:
    """x @ w.T as nn.Linear computes it: the weight is read along its rows (B transposed)."""
    generator = np.random.default_rng(3)
    a = touched(generator.standard_normal((batch, inputs), dtype=np.float32))
    w = touched(generator.standard_normal((outputs, inputs), dtype=np.float32))
    x, weight = tensor(a), tensor(w)
    ta, tw = torch.from_numpy(a), torch.from_numpy(w)
    np.testing.assert_allclose((x @ weight.T).numpy(), a @ w.T, rtol=1e-3, atol=1e-3 * inputs**0.5)
    times = best_times({"ember": ember_runner(lambda: x @ weight.T), "torch": lambda: ta @ tw.T}, repeats)
    report(f"x @ w.T {batch}x{inputs} @ {inputs}x{outputs}", "GFLOP/s", 2 * batch * inputs * outputs, times)


def elementwise(count: int, repeats: int) -> None:
    data = touched(np.random.default_rng(1).uniform(-1, 1, count).astype(np.float32))
    x, tx = tensor(data), torch.from_numpy(data)

    def chain(value: Any) -> Any:
        return ((value * 2 + 1).exp()).sqrt()

    runners: dict[str, Callable[[], Any]] = {"ember": ember_runner(lambda: chain(x)), "torch": lambda: chain(tx)}
    try:
        compiled = torch.compile(chain)
        compiled(tx)
        runners["torch.compile"] = lambda: compiled(tx)
    except Exception as error:  # noqa: BLE001 - inductor may be unavailable; the others still run
        print(f"torch.compile unavailable: {error}")
    np.testing.assert_allclose(chain(x).numpy(), chain(tx).numpy(), rtol=1e-5)
    times = best_times(runners, repeats)
    report(f"elementwise chain {count // 2**20}M f32", "GB/s", 8 * count, times)


def softmax(size: int, repeats: int) -> None:
    data = touched(np.random.default_rng(2).standard_normal((size, size), dtype=np.float32))
    x, tx = tensor(data), torch.from_numpy(data)
    np.testing.assert_allclose(x.softmax(-1).numpy(), torch.softmax(tx, -1).numpy(), rtol=1e-4, atol=1e-7)
    times = best_times({"ember": ember_runner(lambda: x.softmax(-1)), "torch": lambda: torch.softmax(tx, -1)}, repeats)
    report(f"softmax {size}x{size} f32", "GB/s", 8 * size * size, times)


def print_sources(build: Callable[[], em.Tensor]) -> None:
    os.environ["EMBER_DEBUG"] = "4"
    from ember.scheduler import profile

    profile.set_debug_level(4)
    build().realize()
    profile.set_debug_level(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=["matmul", "elementwise", "softmax"])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--size", type=int, default=0, help="matmul/softmax size (default 1024/4096)")
    parser.add_argument("--source", action="store_true", help="print the generated source of each case")
    parser.add_argument("--cpu", action="store_true", help="time by process CPU time (use with OMP_NUM_THREADS=1)")
    parser.add_argument("--device", default="c", help="the ember device to time (default c)")
    arguments = parser.parse_args()
    global DEVICE
    DEVICE = arguments.device
    if arguments.cpu:
        global CLOCK
        CLOCK = time.process_time
    print(f"device {DEVICE}, load average: {os.getloadavg()[0]:.1f}, torch threads: {torch.get_num_threads()}, "
          f"EMBER_NOOPT={os.environ.get('EMBER_NOOPT', '0')}")
    for case in arguments.cases:
        if case == "matmul":
            size = arguments.size or 1024
            if arguments.source:
                square = tensor(np.zeros((size, size), np.float32))
                print_sources(lambda square=square: square @ square)
            matmul(size, arguments.repeats)
        elif case == "linear":
            linear(256, 784, 512, arguments.repeats)
            linear(1024, 1024, 1024, arguments.repeats)
        elif case == "elementwise":
            if arguments.source:
                print_sources(lambda: ((tensor(np.zeros(1 << 24, np.float32)) * 2 + 1).exp()).sqrt())
            elementwise(1 << 24, arguments.repeats)
        elif case == "softmax":
            size = arguments.size or 4096
            if arguments.source:
                print_sources(lambda size=size: tensor(np.zeros((size, size), np.float32)).softmax(-1))
            softmax(size, arguments.repeats)
        else:
            parser.error(f"unknown case {case!r}: choose from matmul, linear, elementwise, softmax")


if __name__ == "__main__":
    main()
