"""Data-parallel training of the digits CNN on 1, 2 and 4 MPI ranks: samples per second and the time in collectives.

Every configuration is one `mpiexec -n N` run of this file (its --worker part): each rank wraps examples/
train_digits.py's DigitsCNN in DistributedDataParallel, trains on its share (DistributedSampler) of a global batch
of --batch images with AdamW, and after --warmup steps (compiles, capture) times --steps steps. The table gives the
samples per second of the whole world, the ratio against one rank measured in the same invocation, and per step
the seconds the slowest rank spent in collectives (MPI waits, the load imbalance between ranks included) and the
bytes each rank sent into them. Each rank's C kernels get cpus/N OpenMP threads, so N ranks share the machine's
cores instead of oversubscribing them. On one machine this measures the overhead of the averaging; across machines
(mpiexec -f hostfile) the same script measures scaling.

    python benchmarks/distributed.py [--ranks 1 2 4] [--batch 256] [--steps 20] [--warmup 3] [--jit]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(options: argparse.Namespace) -> None:
    """One rank's training run; rank 0 prints the measurements as a JSON line."""
    sys.path.insert(0, str(ROOT / "examples"))
    import numpy as np
    from train_digits import DigitsCNN, digits

    import ember as em
    import ember.distributed as dist
    import ember.nn.functional as F
    from ember.nn.parallel import DistributedDataParallel
    from ember.utils.data import DistributedSampler

    dist.init_process_group("mpi")
    rank, world = dist.get_rank(), dist.get_world_size()
    if options.batch % world:
        raise SystemExit(f"--batch {options.batch} is not a multiple of {world} ranks")
    train_images, _, train_labels, _ = digits(0)
    em.manual_seed(0)
    model = DistributedDataParallel(DigitsCNN())
    optimizer = em.optim.AdamW(model.parameters(), lr=0.01, weight_decay=1e-4)

    def step(images: em.Tensor, labels: em.Tensor) -> em.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss

    train = em.jit(step) if options.jit else step
    steps_per_epoch = len(train_images) // options.batch
    batches = []  # (images, labels) of this rank, each step's share of the global batch
    for epoch in range((options.warmup + options.steps) // steps_per_epoch + 1):
        order = np.random.default_rng(epoch).permutation(len(train_images))
        sampler = DistributedSampler(range(options.batch), shuffle=False)
        for index in range(steps_per_epoch):
            mine = order[index * options.batch:(index + 1) * options.batch][list(sampler)]
            batches.append((em.tensor(train_images[mine]).realize(), em.tensor(train_labels[mine]).realize()))
    for images, labels in batches[:options.warmup]:
        train(images, labels).item()
    dist.barrier()
    dist.collective_statistics(reset=True)
    start = time.perf_counter()
    for images, labels in batches[options.warmup:options.warmup + options.steps]:
        loss = train(images, labels)
    final_loss = loss.item()
    statistics = dist.collective_statistics()
    dist.barrier()
    seconds = time.perf_counter() - start
    slowest = em.tensor([statistics.seconds])
    dist.all_reduce(slowest, dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps({"ranks": world, "seconds": seconds, "samples_per_second": options.steps * options.batch /
                          seconds, "collective_seconds": float(slowest.item()) / options.steps,
                          "collectives": statistics.calls / options.steps, "bytes": statistics.bytes / options.steps,
                          "loss": final_loss, "buckets": len(model.reducer.buckets)}))
    dist.destroy_process_group()


def measure(ranks: int, options: argparse.Namespace) -> dict:
    """One mpiexec run of `ranks` workers; rank 0's measurements."""
    import ember.distributed as dist

    mpiexec = dist.find_mpiexec()
    if mpiexec is None:
        raise SystemExit("mpiexec not found: pip install mpi4py mpich (or install an MPI with mpiexec on PATH)")
    threads = max(1, (os.cpu_count() or 1) // ranks)
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    command = [mpiexec, "-n", str(ranks), sys.executable, __file__, "--worker", "--batch", str(options.batch),
               "--steps", str(options.steps), "--warmup", str(options.warmup)] + (["--jit"] if options.jit else [])
    result = subprocess.run(command, env=environment, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"mpiexec -n {ranks} failed:\n{result.stdout}\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--batch", type=int, default=256, help="the global batch, split evenly over the ranks")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--jit", action="store_true", help="the training step under ember.jit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        worker(options)
        return
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"digits CNN, AdamW, global batch {options.batch}, {options.steps} timed steps"
          f"{' under ember.jit' if options.jit else ''}")
    print("  ranks  samples/s  vs 1 rank  collectives/step  in collectives/step  sent/step  buckets")
    baseline = None
    for ranks in options.ranks:
        row = measure(ranks, options)
        baseline = baseline or (row["samples_per_second"] if ranks == 1 else None)
        ratio = f"{row['samples_per_second'] / baseline:8.2f}x" if baseline else "        -"
        print(f"  {ranks:5d}  {row['samples_per_second']:9.0f}  {ratio}  {row['collectives']:16.1f}  "
              f"{row['collective_seconds'] * 1e3:16.2f} ms  {row['bytes'] / 1024:6.1f} KiB  {row['buckets']:7d}")


if __name__ == "__main__":
    main()
