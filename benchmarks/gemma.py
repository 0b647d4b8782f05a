"""Decoding speed of Gemma-3-270M (Q4_K_M GGUF): ember against transformers + PyTorch (float32) on this machine.

All decode greedily from the same prompt ids; the figure is tokens per second of the generated tokens after the
first (ember's first step compiles its kernels, the second records them under ember.jit, later ones replay them),
and ember's time to the first token of a second run (the prompt's pass, compiled by then). ember runs twice, each
in a process of its own: with the file's quantized blocks (its default) and with float32 weights (as transformers
keeps them); each line gives that process's peak resident memory next to the file's size. The load average is
printed too: the machine may be shared.

    python benchmarks/gemma.py [--tokens N] [--device c]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from ember.models.gemma import Gemma3, default_gguf_path
from ember.models.generate import generate
from ember.scheduler.devices import get_device

PROMPT = "The capital of France is"


def ember_rate(path: str, ids: list[int], tokens: int, device: str, quantized: bool) -> tuple[float, float, list[int]]:
    """Tokens per second after the first, the seconds to the first token of a second run, and the tokens."""
    model = Gemma3.from_gguf(path, float32_weights=not quantized)
    stamps, chosen = [], []
    for token in generate(model, ids, max_new_tokens=tokens, device=device):
        stamps.append(time.perf_counter())
        chosen.append(token)
    start = time.perf_counter()
    next(generate(model, ids, max_new_tokens=1, device=device))
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), time.perf_counter() - start, chosen


def peak_rss() -> int:
    """This process's peak resident memory in bytes: VmHWM on Linux (ru_maxrss keeps the high-water mark of the
    process that exec'd this one, here the parent holding transformers), else ru_maxrss."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def ember_child(path: str, ids: list[int], tokens: int, device: str, quantized: bool) -> dict:
    """ember_rate in a fresh process (so its peak resident memory is its own): rate, first token, tokens, peak."""
    arguments = [sys.executable, __file__, "--child", json.dumps([path, ids, tokens, device, quantized])]
    output = subprocess.run(arguments, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def torch_rate(path: str, ids: list[int], tokens: int) -> tuple[float, list[int]]:
    import torch
    import transformers

    folder, name = str(Path(path).parent), Path(path).name
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    stamps, chosen = [], []

    class Clock(transformers.generation.streamers.BaseStreamer):
        def put(self, value: torch.Tensor) -> None:
            stamps.append(time.perf_counter())

        def end(self) -> None:
            pass

    output = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False, streamer=Clock())
    chosen = output[0, len(ids):].tolist()
    stamps = stamps[1:]  # the first put is the prompt
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--device", default="c")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one ember run, in a process of its own
    arguments = parser.parse_args()
    if arguments.child:
        path, ids, tokens, device, quantized = json.loads(arguments.child)
        rate, first, chosen = ember_rate(path, ids, tokens, device, quantized)
        print(json.dumps({"rate": rate, "first": first, "tokens": chosen, "peak": peak_rss()}))
        return
    # the device first: the c backend's probe sets GOMP_SPINCOUNT before an OpenMP runtime starts, and torch
    # (imported by transformers) shares that runtime (libgomp), so both run under the same policy, printed below
    device = get_device(arguments.device).name
    import transformers

    path = default_gguf_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(Path(path).parent), gguf_file=Path(path).name)
    ids = tokenizer(PROMPT).input_ids
    runs = {name: ember_child(path, ids, arguments.tokens, device, quantized)
            for name, quantized in (("quantized", True), ("float32", False))}
    torch_speed, torch_tokens = torch_rate(path, ids, arguments.tokens)
    print(f"load average {os.getloadavg()[0]:.1f}; OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
          f"GOMP_SPINCOUNT {os.environ.get('GOMP_SPINCOUNT', 'unset')}; "
          f"prompt {PROMPT!r} ({len(ids)} tokens), {arguments.tokens} new")
    size = os.path.getsize(path)
    for name, run in runs.items():
        print(f"ember ({arguments.device}, {name} weights): {run['rate']:.2f} tokens/s ({run['rate'] / torch_speed:.2f}x "
              f"torch); first token after {run['first']:.2f} s; peak RSS {run['peak'] / 2**20:.0f} MiB "
              f"({run['peak'] / size:.2f}x the {size / 2**20:.0f} MiB file); same tokens as torch: "
              f"{run['tokens'] == torch_tokens}")
    print(f"transformers + torch f32: {torch_speed:.2f} tokens/s")
    print(f"ember quantized / float32: {runs['quantized']['rate'] / runs['float32']['rate']:.2f}x; same tokens: "
          f"{runs['quantized']['tokens'] == runs['float32']['tokens']}")


if __name__ == "__main__":
    main()
