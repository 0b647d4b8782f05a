"""A smoke run of the benchmark suite (tiny sizes): it runs, prints its table, writes JSON, and compares two runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


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
    from ember.bench import COLD_GRAPH, cold_start

    report = cold_start(COLD_GRAPH, ["c:0"])
    assert report["kernels"] == 5 and report["first"] > 0
