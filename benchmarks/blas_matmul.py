"""ember's float32 matmuls on the c backend against numpy's BLAS (OpenBLAS) on the same number of threads.

ember and numpy are timed in alternation in one process (the machine may be shared), each case several times; the
best and the median GFLOP/s of each and their ratios are printed. The sides alternate in blocks of back-to-back
calls (a program calling matmuls in a loop), each block after the process's threads are idle (suite.settle) and
untimed calls for suite.WARM_SECONDS (at least one): OpenBLAS's workers spin ~0.1 s after each call, and ember timed
call by call right after numpy shared the cores with them (127x255 @ 255x63: median 2.6 GFLOP/s, best 43), while a call
after an idle wait pays the wake-up of both sides' sleeping threads (numpy's 127x255 @ 255x63 then ran at 30
instead of 120 GFLOP/s). Both sides get `--threads` threads: OpenMP's (OMP_NUM_THREADS, read by ember's kernels)
and the BLAS's (threadpoolctl, which also reports what numpy's BLAS uses). The first line says which BLAS numpy has
and its threads. ember is timed eagerly (`(x @ y).realize()`: the graph built, scheduled and launched at every
call) and under `ember.jit` (the launch replayed): their difference is the eager path's Python, which decides a
small product (127x255 @ 255x63: ~20 us of ~45).

    python benchmarks/blas_matmul.py [CASE ...] [--threads 2] [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

SHAPES = {
    "1024^2": ((1024, 1024), (1024, 1024)), "4096^2": ((4096, 4096), (4096, 4096)),
    "1000^2": ((1000, 1000), (1000, 1000)), "127x255@255x63": ((127, 255), (255, 63)),
    "4096x64@64x4096": ((4096, 64), (64, 4096)), "bmm 8x512x64@8x64x512": ((8, 512, 64), (8, 64, 512)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", default=list(SHAPES), help=f"from {', '.join(SHAPES)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=0, help="runs of each side (default: by size)")
    arguments = parser.parse_args()
    unknown = [case for case in arguments.cases if case not in SHAPES]
    if unknown:
        parser.error(f"unknown cases {unknown}: choose from {', '.join(SHAPES)}")
    os.environ["OMP_NUM_THREADS"] = str(arguments.threads)  # (before ember's first kernel loads libgomp)
    import numpy as np
    from threadpoolctl import threadpool_info, threadpool_limits

    import ember as em
    from ember.scheduler.devices import get_device
    from suite import settle, warm_up  # (benchmarks/, this script's folder)

    device = get_device("c")
    with threadpool_limits(arguments.threads):
        blas = [(pool["internal_api"], pool["num_threads"]) for pool in threadpool_info() if pool["user_api"] == "blas"]
        print(f"numpy's BLAS (library, threads): {blas}; ember: {arguments.threads} OpenMP threads", flush=True)
        for case in arguments.cases:
            a_shape, b_shape = SHAPES[case]
            generator = np.random.default_rng(0)
            a = generator.standard_normal(a_shape, dtype=np.float32)
            b = generator.standard_normal(b_shape, dtype=np.float32)
            x, y = em.tensor(a, device="c"), em.tensor(b, device="c")
            np.testing.assert_allclose((x @ y).numpy(), a @ b, rtol=1e-3, atol=1e-3 * a_shape[-1] ** 0.5)
            flops = 2 * int(np.prod(a_shape)) * b_shape[-1]

            def run_ember() -> None:
                (x @ y).realize()
                device.synchronize()

            jitted = em.jit(lambda left, right: left @ right)

            def run_jit() -> None:
                jitted(x, y)
                device.synchronize()

            def run_numpy() -> None:
                np.matmul(a, b)

            repeats = arguments.repeats or (5 if flops > 1e10 else 20 if flops > 1e8 else 200)
            blocks = min(5, repeats)
            seconds: dict[str, list[float]] = {"ember": [], "jit": [], "numpy": []}
            for block in range(blocks):
                for name, runner in (("ember", run_ember), ("jit", run_jit), ("numpy", run_numpy)):
                    settle()
                    warm_up(runner)
                    for _ in range(repeats // blocks + (block < repeats % blocks)):
                        start = time.perf_counter()
                        runner()
                        seconds[name].append(time.perf_counter() - start)
            best = {name: flops / min(times) / 1e9 for name, times in seconds.items()}
            median = {name: flops / statistics.median(times) / 1e9 for name, times in seconds.items()}
            print(f"{case:<22} ember best {best['ember']:6.1f} median {median['ember']:6.1f} | numpy best "
                  f"{best['numpy']:6.1f} median {median['numpy']:6.1f} GFLOP/s | ember/numpy best "
                  f"{best['ember'] / best['numpy']:.2f} median {median['ember'] / median['numpy']:.2f} | jit/numpy "
                  f"best {best['jit'] / best['numpy']:.2f} median {median['jit'] / median['numpy']:.2f}", flush=True)


if __name__ == "__main__":
    main()
