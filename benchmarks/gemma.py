"""Gemma-3-270M (Q4_K_M GGUF) on this machine: ember (quantized and float32 weights) against transformers + PyTorch
(float32) and llama.cpp (llama-cpp-python, where installed: `pip install -e .[llama]`, a ~20 minute build).

Each implementation runs in a process of its own (so its peak resident memory is its own), one after another,
`--rounds` times (alternating: the machine may be shared; the medians are printed), all on `--threads` threads
(ember's OpenMP kernels, torch, llama.cpp's decode and batch threads), all decoding greedily:
- decode: tokens per second of the generated tokens after the first, from PROMPT, after a warm-up generation of
  WARM_UP_TOKENS tokens (llama.cpp's run has one too; ember's first step compiles its kernels, the second records
  them under ember.jit, later ones replay them: the timed steps replay), ember's key/value cache of
  `--cache-length` slots (default: generate's, the prompt and new tokens rounded up to 128; its steps attend over
  the filled slots rounded up to 128 whatever the length);
- first token: seconds from the call to the first new token of PROMPT, in a second run;
- prefill: tokens per second of a 256-token prompt's pass (its second run: 256 / the seconds to its first token);
- peak RSS, next to the file's size, and the greedy tokens compared with ember float32's (quantized arithmetic may
  differ: the count of leading tokens that agree is printed).
The load average is printed too.

    python benchmarks/gemma.py [--tokens 16] [--rounds 1] [--threads 2] [--device c] [--cache-length 2048]
                               [--skip transformers,llama.cpp]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

PROMPT = "The capital of France is"
PREFILL_TOKENS = 256
WARM_UP_TOKENS = 4  # a generation before the timed one, of each implementation (ember: compiles and captures)
IMPLEMENTATIONS = ("ember quantized", "ember float32", "transformers", "llama.cpp")


def peak_rss() -> int:
    """This process's peak resident memory in bytes: VmHWM on Linux (ru_maxrss keeps the high-water mark of the
    process that exec'd this one), else ru_maxrss."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def decode(tokens: Iterator[int]) -> tuple[float, list[int]]:
    """Tokens per second after the first of a greedy generation (an iterator yielding each token when chosen)."""
    stamps, chosen = [], []
    for token in tokens:
        stamps.append(time.perf_counter())
        chosen.append(int(token))
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0, chosen


def first_token_seconds(start: Callable[[], Iterator[int]]) -> float:
    """Seconds from starting a generation to its first token."""
    begin = time.perf_counter()
    next(iter(start()))
    return time.perf_counter() - begin


def ember_run(path: str, ids: list[int], long_ids: list[int], tokens: int, device: str, quantized: bool,
              cache_length: int | None) -> dict:
    from ember.models.gemma import Gemma3
    from ember.models.generate import default_cache_length, generate

    model = Gemma3.from_gguf(path, float32_weights=not quantized)
    length = cache_length or default_cache_length(len(ids) + tokens)
    list(generate(model, ids, max_new_tokens=WARM_UP_TOKENS, device=device, cache_length=length))  # as llama.cpp's
    rate, chosen = decode(generate(model, ids, max_new_tokens=tokens, device=device, cache_length=length))
    first = first_token_seconds(lambda: generate(model, ids, max_new_tokens=1, device=device))
    first_token_seconds(lambda: generate(model, long_ids, max_new_tokens=1, device=device))  # compiles its pass
    prefill = first_token_seconds(lambda: generate(model, long_ids, max_new_tokens=1, device=device))
    return {"rate": rate, "first": first, "prefill": len(long_ids) / prefill, "tokens": chosen}


def transformers_run(path: str, ids: list[int], long_ids: list[int], tokens: int, threads: int) -> dict:
    import torch
    import transformers

    torch.set_num_threads(threads)
    folder, name = str(Path(path).parent), Path(path).name
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)

    stamps: list[float] = []

    class Clock(transformers.generation.streamers.BaseStreamer):
        def put(self, value: torch.Tensor) -> None:
            stamps.append(time.perf_counter())

        def end(self) -> None:
            pass

    def timed(prompt: list[int], count: int) -> tuple[list[float], list[int]]:
        stamps.clear()
        begin = time.perf_counter()
        output = model.generate(torch.tensor([prompt]), max_new_tokens=count, do_sample=False, streamer=Clock())
        return [begin] + stamps[1:], output[0, len(prompt):].tolist()  # the first put is the prompt

    times, chosen = timed(ids, tokens)
    rate = (len(times) - 2) / (times[-1] - times[1])
    first = timed(ids, 1)[0]
    timed(long_ids, 1)
    prefill = timed(long_ids, 1)[0]
    return {"rate": rate, "first": first[1] - first[0], "prefill": len(long_ids) / (prefill[1] - prefill[0]),
            "tokens": chosen}


def llama_run(path: str, ids: list[int], long_ids: list[int], tokens: int, threads: int) -> dict:
    import llama_cpp

    model = llama_cpp.Llama(model_path=path, n_threads=threads, n_threads_batch=threads,
                            n_ctx=max(512, len(long_ids) + tokens + 8), n_batch=512, verbose=False)

    def greedy(prompt: list[int], count: int) -> Iterator[int]:
        model.reset()  # no reuse of the previous run's cache for a repeated prompt
        for number, token in enumerate(model.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0)):
            yield token
            if number + 1 == count:
                return

    list(greedy(ids, 1))  # a warm-up run
    rate, chosen = decode(greedy(ids, tokens))
    first = first_token_seconds(lambda: greedy(ids, 1))
    first_token_seconds(lambda: greedy(long_ids, 1))
    prefill = first_token_seconds(lambda: greedy(long_ids, 1))
    return {"rate": rate, "first": first, "prefill": len(long_ids) / prefill, "tokens": chosen}


def child(arguments: list) -> dict:
    """One implementation's run (in a process of its own): its figures and its peak resident memory."""
    name, path, ids, long_ids, tokens, device, threads, cache_length = arguments
    if name.startswith("ember"):
        result = ember_run(path, ids, long_ids, tokens, device, name == "ember quantized", cache_length)
    elif name == "transformers":
        result = transformers_run(path, ids, long_ids, tokens, threads)
    else:
        result = llama_run(path, ids, long_ids, tokens, threads)
    return {**result, "peak": peak_rss()}


def run_child(arguments: list, threads: int) -> dict:
    """`child` in a fresh process with `threads` OpenMP threads."""
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    output = subprocess.run([sys.executable, __file__, "--child", json.dumps(arguments)], check=True,
                            capture_output=True, text=True, env=environment).stdout
    return json.loads(output.strip().splitlines()[-1])


def prompt_ids(path: str) -> tuple[list[int], list[int]]:
    """The ids of PROMPT and of a PREFILL_TOKENS-token prompt (this file's text), with the model's tokenizer."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(Path(path).parent), gguf_file=Path(path).name)
    text = Path(__file__).read_text()
    while len(tokenizer(text).input_ids) < PREFILL_TOKENS:
        text += text
    return tokenizer(PROMPT).input_ids, tokenizer(text).input_ids[:PREFILL_TOKENS]


def agreement(tokens: list[int], reference: list[int]) -> str:
    """How many leading tokens equal the reference's."""
    same = next((number for number, (one, other) in enumerate(zip(tokens, reference)) if one != other),
                min(len(tokens), len(reference)))
    return f"{same}/{len(reference)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16, help="new tokens to decode (default 16)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each implementation, alternating")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads for every implementation")
    parser.add_argument("--device", default="c", help="ember's device (default c)")
    parser.add_argument("--cache-length", type=int, default=None,
                        help="ember's key/value cache slots in the decode run (default: generate's)")
    parser.add_argument("--skip", default="", help="implementations to leave out, comma-separated")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one run, in a process of its own
    arguments = parser.parse_args()
    if arguments.child:
        print(json.dumps(child(json.loads(arguments.child))))
        return
    from ember.models.gemma import default_gguf_path
    from ember.scheduler.devices import get_device

    device = get_device(arguments.device).name
    path = default_gguf_path()
    ids, long_ids = prompt_ids(path)
    skipped = {name.strip() for name in arguments.skip.split(",") if name.strip()}
    unknown = skipped - set(IMPLEMENTATIONS)
    if unknown:
        parser.error(f"--skip: unknown {', '.join(sorted(unknown))}; choose from {', '.join(IMPLEMENTATIONS)}")
    names = [name for name in IMPLEMENTATIONS if name not in skipped]
    if "llama.cpp" in names:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("llama.cpp: llama-cpp-python is not installed (pip install -e .[llama], ~20 minutes); left out")
            names.remove("llama.cpp")
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for _ in range(arguments.rounds):
        for name in names:
            runs[name].append(run_child([name, path, ids, long_ids, arguments.tokens, device, arguments.threads,
                                         arguments.cache_length], arguments.threads))
    size = os.path.getsize(path)
    print(f"load average {os.getloadavg()[0]:.1f}; {arguments.threads} threads; prompt {PROMPT!r} ({len(ids)} tokens),"
          f" {arguments.tokens} new; prefill of {len(long_ids)} tokens; {arguments.rounds} round(s), medians"
          + (f"; ember's cache {arguments.cache_length} slots" if arguments.cache_length else ""))
    reference = runs.get("ember float32", next(iter(runs.values())))[0]["tokens"]
    print(f"{'':<16} | {'decode tok/s':>12} | {'prefill tok/s':>13} | {'first token s':>13} | {'peak RSS MiB':>12} | "
          f"{'x file':>6} | tokens as ember f32")
    medians: dict[str, dict[str, float]] = {}
    for name, results in runs.items():
        medians[name] = {key: statistics.median(result[key] for result in results)
                         for key in ("rate", "prefill", "first")}
        peak = max(result["peak"] for result in results)
        figures = medians[name]
        print(f"{name:<16} | {figures['rate']:>12.2f} | {figures['prefill']:>13.1f} | {figures['first']:>13.3f} | "
              f"{peak / 2**20:>12.0f} | {peak / size:>6.2f} | {agreement(results[0]['tokens'], reference)}")
    for one, other in (("ember quantized", "ember float32"), ("ember quantized", "llama.cpp"),
                       ("ember float32", "transformers"), ("ember quantized", "transformers")):
        if one in medians and other in medians:
            print(f"{one} / {other}: decode {medians[one]['rate'] / medians[other]['rate']:.2f}x, "
                  f"prefill {medians[one]['prefill'] / medians[other]['prefill']:.2f}x")


if __name__ == "__main__":
    main()
