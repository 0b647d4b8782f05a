"""Graph-parallel execution (EMBER_PARALLEL_KERNELS) with and without: two independent MLP towers on a small batch
(every kernel runs on one thread), realized together eagerly and as ember.jit replays; two independent reductions
of one work item each (one thread for a few hundred microseconds: what the launch groups hold); and two independent
large matmuls, each filling the machine, where gathering must not help and must not hurt.

Each case alternates runs without and with the setting (the machine is shared) and prints the median time of each,
the ratio without/with (above 1: faster with), and the load average.

    python benchmarks/parallel_branches.py [--batch 2] [--width 256] [--depth 4] [--size 512] [--length 16384]
                                           [--repeats 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

import ember as em
from ember.settings import CONFIG


def tower(x: em.Tensor, weights: list[em.Tensor]) -> em.Tensor:
    """An MLP tower: matmul and relu per layer, a matmul last."""
    for weight in weights[:-1]:
        x = (x @ weight).relu()
    return x @ weights[-1]


def median_times(run: Callable[[bool], object], repeats: int) -> tuple[float, float]:
    """Median seconds of `run(False)` and `run(True)`, alternated, after a warm-up of each."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for setting in (False, True):
        run(setting)
    for index in range(2 * repeats):
        setting = index % 2 == 1
        start = time.perf_counter()
        run(setting)
        times[setting].append(time.perf_counter() - start)
    return statistics.median(times[False]), statistics.median(times[True])


def report(name: str, without: float, with_: float) -> None:
    print(f"{name:<34} without {without * 1e3:8.3f} ms   with {with_ * 1e3:8.3f} ms   "
          f"ratio {without / with_:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--size", type=int, default=512, help="the large matmuls' side")
    parser.add_argument("--length", type=int, default=16384, help="the one-thread reductions' length")
    parser.add_argument("--repeats", type=int, default=200)
    arguments = parser.parse_args()
    generator = np.random.default_rng(0)
    x = em.tensor(generator.standard_normal((arguments.batch, arguments.width)).astype(np.float32), device="c")
    towers = [[em.tensor(generator.standard_normal((arguments.width, arguments.width)).astype(np.float32)
                         / np.float32(np.sqrt(arguments.width)), device="c").realize()
               for _ in range(arguments.depth)]
              for _ in range(2)]
    x.realize()

    def eager(setting: bool) -> None:
        CONFIG.parallel_kernels = setting
        outputs = [tower(x, weights) for weights in towers]
        em.realize(*outputs)

    def both(input_: em.Tensor) -> tuple[em.Tensor, em.Tensor]:
        return tower(input_, towers[0]), tower(input_, towers[1])

    replays = {}
    for setting in (False, True):  # each captured as it runs (with the setting: its steps interleaved)
        CONFIG.parallel_kernels = setting
        replays[setting] = em.jit(both)
        for _ in range(3):
            replays[setting](x)

    def replay(setting: bool) -> None:
        CONFIG.parallel_kernels = setting
        replays[setting](x)

    vectors = [em.tensor(generator.standard_normal(arguments.length).astype(np.float32), device="c").realize()
               for _ in range(2)]

    def reductions(setting: bool) -> None:
        CONFIG.parallel_kernels = setting
        em.realize(*[vector.sin().exp().sin().exp().sin().sum() for vector in vectors])

    big = [em.tensor(generator.standard_normal((arguments.size, arguments.size)).astype(np.float32),
                     device="c").realize() for _ in range(4)]

    def large(setting: bool) -> None:
        CONFIG.parallel_kernels = setting
        em.realize(big[0] @ big[1], big[2] @ big[3])

    for name, run in (("two towers", eager), ("two reductions", reductions)):
        for _ in range(2):  # (the first run times the one-thread kernels: the next holds those long enough)
            with em.profile() as record:
                run(True)
        kernels = sorted(record.kernels, key=lambda kernel: kernel.start)
        overlapping = sum(later.start < earlier.end for earlier, later in zip(kernels, kernels[1:]))
        print(f"{name}: {len(kernels)} kernels, {overlapping} starting before the previous one ended (with the "
              f"setting, in a profile)")
    print(f"towers of {arguments.depth} layers, batch {arguments.batch}, width {arguments.width}")
    report("two towers, eager realize", *median_times(eager, arguments.repeats))
    report("two towers, ember.jit replay", *median_times(replay, arguments.repeats))
    report(f"two one-thread reductions of {arguments.length}", *median_times(reductions, arguments.repeats // 4))
    report(f"two {arguments.size}x{arguments.size} matmuls", *median_times(large, max(10, arguments.repeats // 5)))
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
