"""Incremental recomputation against a full recompute: a pre-norm transformer block (causal attention, GELU MLP)
over a fixed buffer of token embeddings; appending the last token recomputes only what depends on it
(ember/incremental's IncrementalGraph) instead of the whole block.

Reported: the kernel FLOPs of a full recompute and of the incremental update (elementwise ops and reduce inputs
per element, as `runner.kernel_flops` counts them) and the wall time of each, timed alternately in one process
(the machine is often shared), best of several rounds. The update is timed in its steady state: the same position
rewritten with new values, whose recorded launches the runner replays (no graph, schedule or compile-cache work);
the first update at a position, which builds its restricted graphs and compiles their kernels (box offsets are
compiled in), is reported on its own.

`--decode N` decodes N tokens one at a time instead, from the middle of the buffer (each step writes a new position
and needs only its row): the compiles of each step (the restricted kernels compile by shape class, their box offsets
and causal prefix lengths read at launch: none after the first two positions), how many steps worked out their plan
and how many took it from a family planned once over a range of positions (all after the first three), how many ran
the family's replay at a new position (position_replay.py: every step after the family's first three, which are
recorded for it), and the step times against a full recompute.

    python benchmarks/incremental.py [--tokens 512] [--width 512] [--heads 8] [--hidden 2048] [--rounds 5]
                                     [--device c] [--decode N]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import ember as em
import ember.nn.functional as F
from ember.incremental.region import Region
from ember.incremental.runner import IncrementalGraph, kernel_flops


def block(x: em.Tensor, weights: dict[str, em.Tensor], heads: int) -> em.Tensor:
    length, width = x.shape
    normed = F.layer_norm(x, (width,))
    query, key, value = (F.linear(normed, weights[name]).reshape(length, heads, width // heads).permute(1, 0, 2)
                         for name in ("query", "key", "value"))
    attended = F.scaled_dot_product_attention(query, key, value, is_causal=True).permute(1, 0, 2)
    x = x + F.linear(attended.reshape(length, width), weights["out"])
    hidden = F.gelu(F.linear(F.layer_norm(x, (width,)), weights["up"]))
    return x + F.linear(hidden, weights["down"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="c")
    parser.add_argument("--decode", type=int, default=0, help="decode this many tokens one at a time")
    arguments = parser.parse_args()
    if arguments.decode:
        decode(arguments)
        return
    tokens, width, device = arguments.tokens, arguments.width, arguments.device
    random = np.random.default_rng(0)
    shapes = {"query": (width, width), "key": (width, width), "value": (width, width), "out": (width, width),
              "up": (arguments.hidden, width), "down": (width, arguments.hidden)}
    weights = {name: em.tensor((random.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32),
                               device=device) for name, shape in shapes.items()}
    embeddings = random.standard_normal((tokens, width)).astype(np.float32)
    last = tokens - 1

    def full() -> Any:
        return block(em.tensor(embeddings, device=device), weights, arguments.heads).realize()

    full_flops = kernel_flops([block(em.tensor(embeddings, device=device), weights, arguments.heads).node])
    expected = full().numpy()
    x = em.tensor(embeddings, device=device)
    start = time.perf_counter()
    graph = IncrementalGraph([block(x, weights, arguments.heads)], [x], count_flops=True)
    first_run = time.perf_counter() - start
    region = Region.from_index(x.shape, last)

    def append() -> Any:
        x[last] = em.tensor(embeddings[last], device=device)
        return graph.update({x: region})[0].realize()

    start = time.perf_counter()
    output = append()
    first_update = time.perf_counter() - start
    error = float(np.abs(output.numpy() - expected).max())
    update_flops = graph.last_flops
    graph.count_flops = False
    full_times, update_times = [], []
    for _ in range(arguments.rounds):
        start = time.perf_counter()
        full().numpy()
        full_times.append(time.perf_counter() - start)
        embeddings[last] = random.standard_normal(width)
        start = time.perf_counter()
        append().numpy()
        update_times.append(time.perf_counter() - start)
    error = max(error, float(np.abs(graph.outputs[0].numpy() - full().numpy()).max()))
    full_time, update_time = min(full_times), min(update_times)
    print(f"transformer block: {tokens} tokens, width {width}, {arguments.heads} heads, MLP {arguments.hidden}, "
          f"device {device}; appending token {last}")
    print(f"  FLOPs   full {full_flops / 1e9:.3f} G   update {update_flops / 1e6:.3f} M   "
          f"ratio 1/{full_flops / max(update_flops, 1):.0f}")
    print(f"  time    full {full_time * 1e3:.1f} ms   update {update_time * 1e3:.2f} ms (steady state)   "
          f"speedup {full_time / update_time:.1f}x   (best of {arguments.rounds}, alternated; {graph.replayed} "
          "updates replayed)")
    print(f"  first run (realize, keeping {len(graph.values)} values) {first_run * 1e3:.0f} ms; first update at a "
          f"new position (compiles its restricted kernels) {first_update * 1e3:.0f} ms")
    print(f"  max |incremental - full| = {error:.2e}")


def decode(arguments: argparse.Namespace) -> None:
    """Decode `arguments.decode` tokens one at a time from the middle of the buffer; print compiles per step and the
    step times against a full recompute. Each is timed as a program runs it, in a loop of its own: the steps of one
    decode, then full recomputes one after the other (interleaved, each would evict the other's working set from
    the caches, which no decoding loop does). A row decoded at position p depends on the rows up to p only (the
    attention is causal), so one full recompute over the final buffer checks every decoded row."""
    tokens, width, device, steps = arguments.tokens, arguments.width, arguments.device, arguments.decode
    if steps >= tokens // 2:
        raise SystemExit(f"--decode {steps}: at most {tokens // 2 - 1} for {tokens} tokens (decoding starts halfway)")
    random = np.random.default_rng(0)
    shapes = {"query": (width, width), "key": (width, width), "value": (width, width), "out": (width, width),
              "up": (arguments.hidden, width), "down": (width, arguments.hidden)}
    weights = {name: em.tensor((random.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32),
                               device=device) for name, shape in shapes.items()}
    start = tokens // 2
    embeddings = np.zeros((tokens, width), np.float32)
    embeddings[:start] = random.standard_normal((start, width))
    x = em.tensor(embeddings, device=device)
    graph = IncrementalGraph([block(x, weights, arguments.heads)], [x])
    compiles, step_times, rows = [], [], []
    for position in range(start, start + steps):
        embeddings[position] = random.standard_normal(width)
        begin = time.perf_counter()
        with em.profile() as record:
            row = graph.write(x, position, em.tensor(embeddings[position], device=device))  # (x[position] = ...)
            rows.append(graph.update({x: row}, [Region.from_index((tokens, width), position)])[0].numpy()[position])
        step_times.append(time.perf_counter() - begin)
        compiles.append(len(record.compiles))
    full_times = []
    for _ in range(max(3, min(steps, 10))):
        begin = time.perf_counter()
        expected = block(em.tensor(embeddings, device=device), weights, arguments.heads).numpy()
        full_times.append(time.perf_counter() - begin)
    error = max(float(np.abs(row - expected[position]).max()) for position, row in zip(range(start, start + steps),
                                                                                        rows))
    later = step_times[5:] or step_times
    full_time, step_time = float(np.median(full_times)), float(np.median(later))
    print(f"transformer block: {tokens} tokens, width {width}, {arguments.heads} heads, MLP {arguments.hidden}, "
          f"device {device}; decoding {steps} tokens from position {start}")
    print(f"  compiles per step: {compiles}")
    print(f"  plans worked out {graph.planned}, taken from a family {graph.from_family}; restricted graphs built "
          f"{graph.restricts}; steps run by the family's replay at a new position {graph.position_replayed}")
    print(f"  step   first {step_times[0] * 1e3:.0f} ms, second {step_times[min(1, steps - 1)] * 1e3:.0f} ms, "
          f"from the sixth on median {step_time * 1e3:.2f} ms (min {min(later) * 1e3:.2f})   full recompute median "
          f"{full_time * 1e3:.1f} ms (min {min(full_times) * 1e3:.1f})   speedup {full_time / step_time:.1f}x")
    print(f"  max |decoded row - full| = {error:.2e}")


if __name__ == "__main__":
    main()
