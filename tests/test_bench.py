"""A smoke run of the benchmark suite (tiny sizes): it runs, prints its table, writes JSON, and compares two runs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest


def test_quick_benchmark_run_and_compare(tmp_path: Path) -> None:
    output = tmp_path / "quick.json"
    command = [sys.executable, "-m", "ember", "bench", "--quick", "--device", "c", "--case", "matmul", "--case",
               "overhead", "--repeats", "2", "--json", str(output)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| matmul 64x64 f32" in result.stdout and "ember c:0" in result.stdout and "vs torch" in result.stdout
    report = json.loads(output.read_text())
    rows = {(row["case"], row["implementation"]): row for row in report["results"]}
    assert rows[("matmul 64x64 f32", "ember c:0")]["metric"] > 0
    assert rows[("matmul 64x64 f32", "numpy")]["metric"] > 0
    assert rows[("per-op overhead (x+1).realize(), 16 elements", "ember c:0")]["metric"] > 0
    compared = subprocess.run([sys.executable, "-m", "ember", "bench", "--compare", str(output), str(output)],
                              capture_output=True, text=True, timeout=120)
    assert compared.returncode == 0 and "1.00x" in compared.stdout, compared.stdout + compared.stderr


def test_cold_start_runs_in_a_fresh_process_with_empty_caches() -> None:
    from ember.benchmark_files import load_suite

    suite = load_suite()
    COLD_GRAPH, cold_start = suite.COLD_GRAPH, suite.cold_start

    report = cold_start(COLD_GRAPH, ["c:0"])
    assert report["kernels"] == 5 and report["first"] > 0


def test_tutorial_programs_give_torch_losses_from_the_same_weights() -> None:
    """Every program of benchmarks/programs.py, tiny, two steps on c: ember's losses are torch's (same weights)."""
    from ember.benchmark_files import load_programs

    programs = load_programs()
    for name in programs.PROGRAMS:
        torch_program, ember_program = programs.build_pair(name, "c", programs.QUICK, deterministic=True)
        torch_losses = [loss for _, loss in programs.run_steps(torch_program, 2)]
        ember_losses = [loss for _, loss in programs.run_steps(ember_program, 2)]
        assert all(math.isfinite(loss) for loss in torch_losses), (name, torch_losses)
        assert math.isclose(ember_losses[0], torch_losses[0], rel_tol=1e-4, abs_tol=1e-6), (name, ember_losses,
                                                                                            torch_losses)
        assert math.isclose(ember_losses[1], torch_losses[1], rel_tol=1e-3, abs_tol=1e-5), (name, ember_losses,
                                                                                            torch_losses)


def test_programs_table_and_missing_benchmarks_folder(tmp_path: Path) -> None:
    """The table runs for one program (timings are printed, never checked); an absent programs.py is named."""
    from ember.benchmark_files import ProgramsMissing, load_programs

    programs = load_programs()
    reports = programs.run_programs(["tabular_mlp"], steps=1, quick=True, log=lambda line: None)
    table = programs.format_reports(reports)
    assert "| tabular_mlp" in table and not any(note.startswith("failed") for note in reports[0].notes), table
    assert reports[0].loss_difference is not None and reports[0].loss_difference < 1e-4, table
    with pytest.raises(ProgramsMissing, match="benchmarks/programs.py"):
        load_programs(tmp_path / "programs.py")


def test_programs_cold_step_on_an_empty_cache_runs_in_a_fresh_process() -> None:
    """--empty-cache's first step: a child process with new empty kernel caches runs one step and reports its
    seconds (a time, never checked beyond being one); a program that fails there is named in the error."""
    from ember.benchmark_files import load_programs

    programs = load_programs()
    assert programs.empty_cache_cold_step("tabular_mlp", "c", 1) > 0
    with pytest.raises(RuntimeError, match="the cold step of tabular_mlp failed"):
        programs.empty_cache_cold_step("tabular_mlp", "no-such-device", 1)


def test_programs_empty_cache_column_is_the_median_of_its_fresh_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """--empty-cache times each program's first step in --empty-cache-runs fresh processes: the column shows their
    median and the notes list every run (one run on a shared machine can be a third slower than the next)."""
    from ember.benchmark_files import load_programs

    programs = load_programs()
    runs = iter([3.0, 1.0, 2.0])
    monkeypatch.setattr(programs, "empty_cache_cold_step", lambda name, device, threads: next(runs))
    report, = programs.run_programs(["tabular_mlp"], steps=1, quick=True, log=lambda line: None, empty_cache=True,
                                    empty_cache_runs=3)
    assert report.empty_cache_cold == 2.0
    assert "empty-cache first steps: 3.00, 1.00, 2.00 s" in report.notes
