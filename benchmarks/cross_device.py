"""Timing of graphs that cross devices: c -> opencl -> c pipelines whose copies are scheduled operations.

Each case builds `--steps` independent pipelines and realizes them in one schedule, then reads the results; the
time is the best of `--repeats` runs (the machine is shared: the load average is printed with the figures).

    python benchmarks/cross_device.py [--steps N] [--size N] [--repeats N] [--device opencl:0]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np

import ember as em


def pipeline(inputs: list[np.ndarray], weight: em.Tensor, device: str) -> list[em.Tensor]:
    """Per input: upload from c, matmul and relu on the device, bring back to c, scale and sum on c."""
    outputs = []
    for array in inputs:
        on_device = (em.tensor(array, device="c").to(device) @ weight).relu()
        outputs.append((on_device.to("c") * 0.5).sum(1))
    return outputs


def elementwise_round_trip(inputs: list[np.ndarray], device: str) -> list[em.Tensor]:
    """Copies dominate: c -> device (x * 2 + 1) -> c (exp) -> device (+ 1) -> c."""
    outputs = []
    for array in inputs:
        there = em.tensor(array, device="c").to(device) * 2 + 1
        back = (there.to("c") * 0.001).exp()
        outputs.append((back.to(device) + there).to("c"))
    return outputs


def best_time(build: Callable[[], list[em.Tensor]], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = build()
        em.realize(*outputs)
        for output in outputs:
            output.numpy()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="opencl:0")
    options = parser.parse_args()
    generator = np.random.default_rng(0)
    size = options.size
    inputs = [generator.standard_normal((size, size), dtype=np.float32) for _ in range(options.steps)]
    weight = em.tensor(generator.standard_normal((size, size), dtype=np.float32), device=options.device)
    vectors = [generator.standard_normal(size * size * 4, dtype=np.float32) for _ in range(options.steps)]
    cases = {
        "matmul pipeline": lambda: pipeline(inputs, weight, options.device),
        "elementwise round trips": lambda: elementwise_round_trip(vectors, options.device),
    }
    for name, build in cases.items():
        best_time(build, 1)  # compile
        seconds = best_time(build, options.repeats)
        print(f"{name:<26} {options.steps} x {size}: {seconds * 1e3:8.1f} ms   load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
