"""`python -m ember bench --case programs`: the repository's benchmarks/programs.py (tutorial-style PyTorch
programs written once for torch and ember), loaded by path and run; it is not part of an installed ember."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PROGRAMS_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "programs.py"


class ProgramsMissing(RuntimeError):
    """benchmarks/programs.py is not next to this ember (an installed package has no benchmarks/ folder)."""


def load_programs(path: Path = PROGRAMS_PATH) -> ModuleType:
    """The programs module, imported from `path` (the repository's benchmarks/programs.py)."""
    if not path.is_file():
        raise ProgramsMissing(
            f"the 'programs' benchmark case runs the repository's benchmarks/programs.py, which is not at {path} "
            "(an installed ember ships without benchmarks/): run `python -m ember bench --case programs` from a "
            "checkout of the repository, or `python benchmarks/programs.py` there")
    specification = importlib.util.spec_from_file_location("ember_benchmark_programs", path)
    assert specification is not None and specification.loader is not None
    module = importlib.util.module_from_spec(specification)
    sys.modules[specification.name] = module  # its dataclasses look their module up by name
    specification.loader.exec_module(module)
    return module


def main_programs(device: str, quick: bool, steps: int | None) -> int:
    """Run every program on `device` (tiny sizes if `quick`) and print the table; 1 if one failed or none ran."""
    try:
        programs = load_programs()
    except ProgramsMissing as error:
        print(f"ember bench: {error}")
        return 1
    arguments = ["--device", device, "--steps", str(steps or (2 if quick else 10))] + (["--quick"] if quick else [])
    return int(programs.main(arguments))
