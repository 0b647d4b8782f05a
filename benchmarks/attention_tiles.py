"""Flash attention's tile choices timed on a GPU against torch's scaled_dot_product_attention on the same device.

Each shape (batch, heads, length, head width, causal) runs with ember's default choice and then with each entry of
ir/flash_attention.py's TILE_CHOICES put first (each lowered and compiled afresh: the in-memory and on-disk caches
of lowered kernels are bypassed), best of the runs, each waited for; the line prints torch's time, each variant's,
torch's over ember's (higher is better for ember) and the largest difference from torch. A measuring script for a
session lent a GPU, to pick the default, never a test.

    python benchmarks/attention_tiles.py [--device cuda] [--runs 10]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = ((4, 16, 1024, 64, True), (4, 16, 1024, 64, False), (1, 8, 4096, 64, True), (4, 16, 1024, 128, True),
          (8, 12, 512, 64, True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="ember's device (default cuda)")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per variant (the best is kept)")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of timed runs per variant at most")
    args = parser.parse_args(argv)
    import torch
    from gpu import Synchronizer, best_time, tensor

    import ember as em
    import ember.ir.flash_attention as flash
    from ember.ir import lowered_cache
    from ember.scheduler.compile_cache import COMPILED
    from ember.scheduler.schedule import SCHEDULES

    lowered_cache.load = lambda *arguments, **named: None  # (each variant lowered again, not read back from disk)
    torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    default = flash.TILE_CHOICES
    for batch, heads, length, width, causal in SHAPES:
        arrays = [np.random.default_rng(number).standard_normal((batch, heads, length, width), dtype=np.float32)
                  for number in range(3)]
        torch_inputs = [tensor(torch, array, torch_device) for array in arrays]
        torch_time, expected = best_time(
            lambda inputs=torch_inputs, causal=causal: torch.nn.functional.scaled_dot_product_attention(
                *inputs, is_causal=causal),
            Synchronizer(torch, torch_device), args.runs, args.budget)
        expected = expected.float().cpu().numpy()
        flops = 4.0 * batch * heads * length * length * width / (2 if causal else 1)
        line = f"{(batch, heads, length, width, 'causal' if causal else 'full')}: torch {torch_time * 1e3:.3f} ms " \
               f"({flops / torch_time / 1e12:.1f} TFLOP/s)"
        inputs = [tensor(em, array, args.device) for array in arrays]
        for variant in (None, *default):
            flash.TILE_CHOICES = default if variant is None else (variant, *default)
            COMPILED.clear()
            SCHEDULES.entries.clear()
            try:
                seconds, got = best_time(
                    lambda inputs=inputs, causal=causal: em.nn.functional.scaled_dot_product_attention(
                        *inputs, is_causal=causal),
                    Synchronizer(em, args.device), args.runs, args.budget)
                difference = float(np.abs(got.numpy() - expected).max())
                line += f" | {variant or 'default'} {seconds * 1e3:.3f} ms {torch_time / seconds:.2f}x ({difference:.0e})"
            except Exception as error:  # noqa: BLE001 (a variant the device cannot run: say why, time the others)
                line += f" | {variant} failed: {type(error).__name__}: {str(error)[:120]}"
        flash.TILE_CHOICES = default
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
