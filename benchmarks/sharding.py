"""The cost of sharding: a matmul on one device against the same matmul sharded by rows over several devices.

On one CPU the c backend splits its cores into `EMBER_C_DEVICES` devices, so sharding cannot be faster there: the
figures show what splitting, the per-shard launches and the gathering copies cost. Every configuration runs in a
fresh process (the device split is fixed at start-up); times are medians of `--repeats` runs after a warm-up, with
the load average, and the ratio is against the single device measured in the same invocation.

    python benchmarks/sharding.py [--size 1024] [--repeats 10] [--devices 2 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MEASURE = """
import json, statistics, sys, time
import numpy as np
import ember as em
size, repeats, shards = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
generator = np.random.default_rng(0)
a_data = generator.standard_normal((size, size), dtype=np.float32)
b_data = generator.standard_normal((size, size), dtype=np.float32)
devices = [f"c:{index}" for index in range(shards)]
a = em.tensor(a_data, device="c:0").realize()
b = em.tensor(b_data, device="c:0").realize()
if shards > 1:
    a = a.shard(devices, dim=0).realize()
times = []
for run in range(repeats + 2):
    start = time.perf_counter()
    result = (a @ b).numpy()
    if run >= 2:
        times.append(time.perf_counter() - start)
error = float(np.abs(result - a_data @ b_data).max())
print(json.dumps({"median": statistics.median(times), "error": error}))
"""


def measure(size: int, repeats: int, shards: int) -> dict:
    environment = {**os.environ, "EMBER_C_DEVICES": str(shards), "EMBER_BACKENDS": "c"}
    result = subprocess.run([sys.executable, "-c", MEASURE, str(size), str(repeats), str(shards)], env=environment,
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 3])
    options = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"matmul {options.size}x{options.size} f32, result read back, median of {options.repeats}")
    single = measure(options.size, options.repeats, 1)
    print(f"  1 c device (all cores)            {single['median'] * 1e3:9.1f} ms")
    for shards in options.devices:
        sharded = measure(options.size, options.repeats, shards)
        ratio = sharded["median"] / single["median"]
        print(f"  sharded by rows over {shards} c devices  {sharded['median'] * 1e3:9.1f} ms   {ratio:.2f}x the time "
              f"of one device (max error vs numpy {sharded['error']:.1e})")
    print(f"  load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
