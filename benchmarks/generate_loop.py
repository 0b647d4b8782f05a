"""A nanoGPT-style generation loop, ember against torch: the `gpt_manual` program's model (benchmarks/programs.py,
weights copied from torch) decodes greedily, one token at a time, the context growing by one each step (cropped to
the block size, as nanoGPT's `generate` does). Reported: the whole loop cold (an empty kernel cache directory) and
warm (the same loop again in the same process), the kernels compiled for each token, and whether every token and
the logits agree with torch.

    python benchmarks/generate_loop.py [--tokens 100] [--device c] [--prompt 1]

Shape classes are automatic by default (a sequence length compiles its own kernels until its dims have taken a few
values, then one kernel per shape class serves every later length): EMBER_SHAPE_CLASSES=1 makes classes from the
second length, EMBER_SHAPE_CLASSES=0 compiles one kernel set per sequence length.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def generate(lib: Any, model: Any, codes: Any, tokens: int, block: int, device: str,
             compiles: list[int] | None = None, logits_out: list[np.ndarray] | None = None) -> Any:
    """Greedy decoding of `tokens` tokens after `codes` [1, T]; per token, the compiles (ember) and last logits."""
    import ember

    for _ in range(tokens):
        context = codes[:, -block:]
        positions = lib.arange(context.shape[1], device=device)
        with ember.profile() as record:
            logits = model(context, positions)[:, -1, :]
            following = logits.argmax(-1, keepdim=True)
            codes = lib.cat([codes, following], 1)
            if lib is ember:  # computed now, as torch's is: else each token's graph holds every earlier token's
                ember.realize(codes)  # argmax, concatenated (a kernel of as many inputs as tokens: new each time)
            if logits_out is not None:
                logits_out.append(np.array(logits.detach().cpu().numpy() if lib.__name__ == "torch"
                                           else logits.numpy()))
        if compiles is not None:
            compiles.append(len(record.compiles))
    return codes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--device", default="c")
    parser.add_argument("--prompt", type=int, default=1, help="prompt tokens")
    arguments = parser.parse_args()
    os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-generate-")  # cold: an empty kernel cache
    import torch

    import ember
    from benchmarks.programs import Size, build_pair

    size = Size()
    torch_program, ember_program = build_pair("gpt_manual", arguments.device, size, deterministic=True)
    torch_program.model.eval()
    ember_program.model.eval()
    prompt = np.arange(arguments.prompt, dtype=np.int64).reshape(1, -1) % 7
    torch_logits: list[np.ndarray] = []
    start = time.perf_counter()
    with torch.no_grad():
        torch_codes = generate(torch, torch_program.model, torch.tensor(prompt), arguments.tokens, size.block, "cpu",
                               logits_out=torch_logits)
    torch_seconds = time.perf_counter() - start
    with torch.no_grad():
        start = time.perf_counter()
        generate(torch, torch_program.model, torch.tensor(prompt), arguments.tokens, size.block, "cpu")
        torch_warm = time.perf_counter() - start
    results = {}
    for label in ("cold", "warm"):
        compiles: list[int] = []
        logits: list[np.ndarray] = []
        start = time.perf_counter()
        with ember.no_grad():
            codes = generate(ember, ember_program.model, ember.tensor(prompt, device=arguments.device),
                             arguments.tokens, size.block, arguments.device, compiles, logits)
        results[label] = (time.perf_counter() - start, compiles, codes.numpy(), logits)
    print(f"generate {arguments.tokens} tokens (gpt_manual, embed {size.embed}, {size.layers} layers, block "
          f"{size.block}) on {arguments.device}; EMBER_SHAPE_CLASSES={os.environ.get('EMBER_SHAPE_CLASSES', 'auto')}")
    print(f"  torch: {torch_seconds:.3f} s (again: {torch_warm:.3f} s)")
    for label, (seconds, compiles, codes, logits) in results.items():
        same = np.array_equal(codes, torch_codes.numpy())
        difference = max(float(np.abs(mine - theirs).max()) for mine, theirs in zip(logits, torch_logits))
        print(f"  ember {label}: {seconds:.3f} s, {sum(compiles)} kernels compiled (first tokens {compiles[:6]}, "
              f"after token 6: {sum(compiles[6:])}); tokens as torch's: {same}; largest logit difference "
              f"{difference:.2e}")


if __name__ == "__main__":
    main()
