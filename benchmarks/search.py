"""What the kernel search (EMBER_SEARCH, ember/ir/search.py) buys: each case timed with ember's default kernels,
searched (and how long the search took), and with torch and numpy, in one process.

The search starts from an empty disk cache (a temporary folder), so every kernel of each case is searched. The
phases alternate (default, searched, default, searched: the in-memory compile cache is emptied between them, the
programs come from the disk cache) and each reports its best time, as the machine may be shared. Automatic
sharding is off (EMBER_AUTO_SHARD=0 unless set): each case runs on the one device measured.

On a loaded machine, EMBER_C_DEVICES=2 gives c:0 one core (and torch one thread): a one-thread kernel is not held
up by its other thread being descheduled.

    python benchmarks/search.py [CASE ...] [--device c|wgpu] [--beam 4] [--budget 10] [--repeats 10]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("EMBER_AUTO_SHARD", "0")  # one device's kernels (not split with another device)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from suite import settle, warm_up  # noqa: E402  (benchmarks/, this script's folder)

import ember as em  # noqa: E402
from ember.ir import search  # noqa: E402
from ember.scheduler import compile_cache  # noqa: E402
from ember.scheduler.devices import get_device  # noqa: E402

Arrays = tuple[np.ndarray, ...]


def _inputs(*shapes: tuple[int, ...]) -> Arrays:
    generator = np.random.default_rng(0)
    return tuple(generator.standard_normal(shape).astype(np.float32) for shape in shapes)


CASES: dict[str, tuple[Callable[[], Arrays], Callable[..., Any], Callable[..., Any], Callable[..., Any] | None]] = {
    # name: (inputs, ember, torch, numpy)
    "matmul 1024x1024 @ 1024x1024": (lambda: _inputs((1024, 1024), (1024, 1024)), lambda a, b: a @ b,
                                     torch.matmul, np.matmul),
    "matmul 4096x4096 @ 4096x4096": (lambda: _inputs((4096, 4096), (4096, 4096)), lambda a, b: a @ b,
                                     torch.matmul, np.matmul),
    "matmul 1000x1000 @ 1000x1000": (lambda: _inputs((1000, 1000), (1000, 1000)), lambda a, b: a @ b,
                                     torch.matmul, np.matmul),
    "matmul 4096x64 @ 64x4096": (lambda: _inputs((4096, 64), (64, 4096)), lambda a, b: a @ b, torch.matmul,
                                 np.matmul),
    "matmul 127x255 @ 255x63": (lambda: _inputs((127, 255), (255, 63)), lambda a, b: a @ b, torch.matmul, np.matmul),
    # the MLP training step's three products (784-512-10, batch 256): forward, weight gradient, input gradient
    "linear 256x784 @ (512x784)^T": (lambda: _inputs((256, 784), (512, 784)), lambda x, w: x @ w.T,
                                     lambda x, w: x @ w.T, lambda x, w: x @ w.T),
    "matmul (256x512)^T @ 256x784": (lambda: _inputs((256, 512), (256, 784)), lambda g, x: g.T @ x,
                                     lambda g, x: g.T @ x, lambda g, x: g.T @ x),
    "matmul 256x512 @ 512x784": (lambda: _inputs((256, 512), (512, 784)), lambda a, b: a @ b, torch.matmul,
                                 np.matmul),
    "bmm 8x512x64 @ 8x64x512": (lambda: _inputs((8, 512, 64), (8, 64, 512)), lambda a, b: a @ b, torch.matmul,
                                np.matmul),
    "conv2d 8x64x56x56, 64x64x3x3": (lambda: _inputs((8, 64, 56, 56), (64, 64, 3, 3)),
                                     lambda x, w: em.nn.functional.conv2d(x, w, padding=1),
                                     lambda x, w: torch.nn.functional.conv2d(x, w, padding=1), None),
}


def best(run: Callable[[], Any], repeats: int) -> float:
    """The least seconds of `repeats` runs after warm-up runs (suite.warm_up), once no other
    library's threads keep the cores busy (torch's and OpenBLAS's workers spin a while after each call)."""
    settle()
    warm_up(run)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help="substrings of case names (default: every case)")
    parser.add_argument("--device", default="c")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--budget", type=float, default=10.0, help="search seconds per kernel")
    parser.add_argument("--repeats", type=int, default=10)
    arguments = parser.parse_args()
    os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-search-bench-")
    os.environ.setdefault("EMBER_SHAPE_CLASSES", "0")
    device = get_device(arguments.device)
    if device.name.startswith("c:"):
        torch.set_num_threads(device.info.compute_units)  # the same cores for both (EMBER_C_DEVICES=2: one each)
    print(f"device {device.name}, beam {arguments.beam}, budget {arguments.budget:g} s per kernel, "
          f"torch threads {torch.get_num_threads()}, cache {os.environ['EMBER_CACHE_DIR']}")
    print(f"{'case':<32}{'default ms':>11}{'searched ms':>12}{'speedup':>8}{'torch ms':>10}{'numpy ms':>10}"
          f"{'search s':>10}{'kernels':>8}")
    for name, (make, ember_op, torch_op, numpy_op) in CASES.items():
        if arguments.cases and not any(wanted in name for wanted in arguments.cases):
            continue
        arrays = make()
        tensors = [em.tensor(array, device=device.name) for array in arrays]
        torch_tensors = [torch.from_numpy(array) for array in arrays]
        expected = torch_op(*torch_tensors).numpy()

        def run_ember() -> None:
            ember_op(*tensors).realize()
            device.synchronize()

        compile_cache.COMPILED.clear()
        with search.search(0):
            default_result = ember_op(*tensors).numpy()
        before = len(search.STATISTICS.searches)
        compile_cache.COMPILED.clear()
        settle()  # (the candidates' times are not taken beside another library's spinning threads)
        start = time.perf_counter()
        with search.search(arguments.beam, arguments.budget):
            searched_result = ember_op(*tensors).numpy()
        search_seconds = time.perf_counter() - start
        searched_kernels = search.STATISTICS.searches[before:]
        for label, result in (("default", default_result), ("searched", searched_result)):
            error = float(np.abs(result - expected).max() / (np.abs(expected).max() + 1e-30))
            if not error < 1e-4:
                raise SystemExit(f"{name}: ember {label} differs from torch by {error:.2e} (relative to the largest)")
        times: dict[str, list[float]] = {"default": [], "searched": []}
        for _ in range(2):
            for label in times:
                compile_cache.COMPILED.clear()
                if label == "default":
                    with search.search(0):
                        times[label].append(best(run_ember, arguments.repeats))
                else:  # the stored winners (no search: every kernel has one now)
                    times[label].append(best(run_ember, arguments.repeats))
        torch_seconds = best(lambda: torch_op(*torch_tensors), arguments.repeats)
        numpy_seconds = best(lambda: numpy_op(*arrays), arguments.repeats) if numpy_op else float("nan")
        default, searched = min(times["default"]), min(times["searched"])
        print(f"{name:<32}{default * 1e3:>11.3f}{searched * 1e3:>12.3f}{default / searched:>7.2f}x"
              f"{torch_seconds * 1e3:>10.3f}{numpy_seconds * 1e3:>10.3f}{search_seconds:>10.1f}"
              f"{len(searched_kernels):>8}")
        for record in searched_kernels:
            print(f"    {record.name}: kernel {record.default_seconds * 1e3:.3f} -> {record.winner_seconds * 1e3:.3f} "
                  f"ms, {record.candidates_timed} variants timed ({record.wrong} wrong), winner {record.winner}")


if __name__ == "__main__":
    main()
