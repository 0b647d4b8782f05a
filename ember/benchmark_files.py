"""`python -m ember bench`: the repository's benchmark scripts (benchmarks/suite.py, the suite's cases, and
benchmarks/programs.py, tutorial-style PyTorch programs written once for torch and ember), loaded by path and run;
they are not part of an installed ember."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS_FOLDER = Path(__file__).resolve().parent.parent / "benchmarks"
PROGRAMS_PATH = BENCHMARKS_FOLDER / "programs.py"
SUITE_PATH = BENCHMARKS_FOLDER / "suite.py"


class BenchmarksMissing(RuntimeError):
    """A benchmarks/ script is not next to this ember (an installed package has no benchmarks/ folder)."""


ProgramsMissing = BenchmarksMissing  # (the name the programs case raised first)


def load_benchmark(path: Path) -> ModuleType:
    """The benchmark script at `path` as a module (imported once per process and path, as ember_benchmark_<stem>)."""
    name = f"ember_benchmark_{path.stem}"
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    if not path.is_file():
        raise BenchmarksMissing(
            f"`python -m ember bench` runs the repository's benchmarks/{path.name}, which is not at {path} (an "
            f"installed ember ships without benchmarks/): run it from a checkout of the repository, or run "
            f"`python benchmarks/{path.name}` there")
    specification = importlib.util.spec_from_file_location(name, path)
    assert specification is not None and specification.loader is not None
    module = importlib.util.module_from_spec(specification)
    sys.modules[name] = module  # its dataclasses look their module up by name
    try:
        specification.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_programs(path: Path = PROGRAMS_PATH) -> ModuleType:
    """The programs module (the repository's benchmarks/programs.py, or `path`)."""
    return load_benchmark(path)


def load_suite() -> ModuleType:
    """The benchmark suite module (the repository's benchmarks/suite.py)."""
    return load_benchmark(SUITE_PATH)


def main_bench(devices: list[str] | None, quick: bool, json_path: str | None, compare: list[str] | None,
               cases: list[str] | None = None, repeats: int | None = None) -> int:
    """`python -m ember bench`: the suite's table (and JSON), a comparison of two JSON runs, or the programs case."""
    try:
        suite = load_suite()
    except BenchmarksMissing as error:
        print(f"ember bench: {error}")
        return 1
    return int(suite.main_bench(devices, quick, json_path, compare, cases, repeats))


def main_programs(device: str, quick: bool, steps: int | None) -> int:
    """Run every program on `device` (tiny sizes if `quick`) and print the table; 1 if one failed or none ran."""
    try:
        programs = load_programs()
    except BenchmarksMissing as error:
        print(f"ember bench: {error}")
        return 1
    arguments = ["--device", device, "--steps", str(steps or (2 if quick else 10))] + (["--quick"] if quick else [])
    return int(programs.main(arguments))
