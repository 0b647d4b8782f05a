"""The kernel search (ir/search.py): the space of plans around the heuristic's, searched winners against PyTorch on
c and wgpu, winners reused by a second process without timing or compiling losers, and corrupt or stale entries."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import ember as em
from ember import cache
from ember.backends.c import VECTOR_OPS, CRenderer
from ember.capabilities import DeviceInfo
from ember.ir import search
from ember.ir.opt import choose_plan, lower_plan
from ember.ir.search_cache import SearchWarning
from ember.ir.search_space import actions, apply, plan_from_data, plan_to_data
from ember.scheduler.compile_cache import kernel_name
from ember.scheduler.kernelize import Launch, kernelize
from tests.conftest import TEST_DEVICES
from tests.helpers import assert_close

REPOSITORY = Path(__file__).resolve().parent.parent
SEARCH_DEVICES = [backend for backend in ("c", "wgpu") if any(name.startswith(backend) for name in TEST_DEVICES)]


def _kernels(value: em.Tensor) -> list:
    return [item.kernel for item in kernelize([value.node]) if isinstance(item, Launch)]


def _samples() -> list[em.Tensor]:
    a, b = em.randn(37, 53, device="dummy:0"), em.randn(53, 29, device="dummy:0")
    return [a @ b, a.softmax(-1), (a * 2 + 1).exp(), em.randn(4, 16, 24, device="dummy:0").sum(1)]


@pytest.mark.parametrize("vectors", [False, True])
def test_the_heuristic_picks_a_point_of_the_space(vectors: bool) -> None:
    """choose_plan's plan, lowered again by lower_plan, is byte for byte the heuristic's kernel; every action of the
    space turns it into a plan that lowers to a kernel or is refused (None), never an error."""
    info = DeviceInfo(compute_units=4, preferred_vector_width=8, vector_ops=VECTOR_OPS if vectors else frozenset())
    renderer = CRenderer()
    for value in _samples():
        for kernel in _kernels(value):
            name = kernel_name(kernel)
            plan, lowered = choose_plan(kernel, name, info)
            again = lower_plan(kernel, name, info, plan)
            assert again is not None and renderer.render(again) == renderer.render(lowered)
            space = actions(kernel, info)
            assert {action.kind for action in space} >= {"untile", "upcast"} | ({"vectorize"} if vectors else set())
            for action in space:
                neighbour = apply(plan, action, kernel)
                if neighbour is not None:
                    assert plan_from_data(plan_to_data(neighbour), kernel) == neighbour
                    lower_plan(kernel, name, info, neighbour)


@pytest.fixture
def searching(cold: None, monkeypatch: pytest.MonkeyPatch) -> search.SearchStatistics:
    """A cold cache and fresh search statistics; EMBER_SEARCH unset."""
    monkeypatch.delenv("EMBER_SEARCH", raising=False)
    statistics = search.SearchStatistics()
    monkeypatch.setattr(search, "STATISTICS", statistics)
    return statistics


@pytest.mark.parametrize("backend", SEARCH_DEVICES)
def test_a_forced_winner_matches_torch(backend: str, searching: search.SearchStatistics,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Each timing is made shorter than the one before (and confirmed), so the last variant timed wins, not the
    default: the
    results (sizes that are no multiple of any tile, a NaN and an infinity in the input) still match PyTorch."""
    clock = itertools.count(1000, -1)
    monkeypatch.setattr(search, "_time", lambda *arguments: float(next(clock)))
    monkeypatch.setattr(search, "_confirmed", lambda *arguments: True)
    first = np.random.default_rng(1).standard_normal((37, 53)).astype(np.float32)
    second = np.random.default_rng(2).standard_normal((53, 29)).astype(np.float32)
    first[3, 5], first[7, 1] = np.nan, np.inf
    device = "c" if backend == "c" else "wgpu"
    with em.search(2, budget_seconds=3):
        product = em.tensor(first, device=device) @ em.tensor(second, device=device)
        rows = em.tensor(second, device=device).softmax(-1)
        assert_close(product.numpy(), (torch.tensor(first) @ torch.tensor(second)).numpy(), atol=1e-4)
        assert_close(rows.numpy(), torch.tensor(second).softmax(-1).numpy(), atol=1e-6)
    # the default's timing was the first, the longest: each winner is another variant
    assert searching.searches and all(record.candidates_timed > 1 and record.winner_seconds < record.default_seconds
                                      for record in searching.searches)
    assert len(list((Path(cache.root()) / "search").glob("*.entry"))) == len(searching.searches)


@pytest.mark.parametrize("patience", [0, 1])
def test_a_round_without_a_faster_plan_does_not_end_the_search_within_its_patience(
        patience: int, searching: search.SearchStatistics, monkeypatch: pytest.MonkeyPatch) -> None:
    """Timings by each plan's distance (in actions) from the default: every plan one action away is slower, every
    plan two away faster. With a round of patience (search.PATIENCE) the search goes on past the slower round and a
    two-action plan wins; without, the default stays."""
    depth: dict[object, int] = {}
    plan_of: dict[int, object] = {}
    original_apply, original_build, original_compile = search.apply, search.build_planned_ir, search._compile

    def applying(plan, action, kernel):  # type: ignore[no-untyped-def]
        neighbour = original_apply(plan, action, kernel)
        if neighbour is not None and neighbour not in depth:
            depth[neighbour] = depth.get(plan, 0) + 1
        return neighbour

    def building(kernel, name, info, plan):  # type: ignore[no-untyped-def]
        ir = original_build(kernel, name, info, plan)
        if ir is not None:
            plan_of[id(ir)] = plan
        return ir

    def compiling(device, irs):  # type: ignore[no-untyped-def]
        programs = original_compile(device, irs)
        for ir, program in zip(irs, programs):
            if program is not None:
                plan_of[id(program)] = plan_of.get(id(ir))
        return programs

    def timing(bench, program, global_size, deadline):  # type: ignore[no-untyped-def]
        distance = depth.get(plan_of.get(id(program)), 0)
        return {0: 1.0, 1: 2.0}.get(distance, 0.5)

    for name, replacement in (("apply", applying), ("build_planned_ir", building), ("_compile", compiling),
                              ("_time", timing), ("_confirmed", lambda *arguments: True), ("PATIENCE", patience)):
        monkeypatch.setattr(search, name, replacement)
    values = np.random.default_rng(1).standard_normal((37, 53)).astype(np.float32)
    with em.search(2, budget_seconds=30):
        sums = (em.tensor(values, device="c").exp() * 2).sum(0)
        assert_close(sums.numpy(), (torch.tensor(values).exp() * 2).sum(0).numpy(), rtol=1e-5)
    (record,) = searching.searches
    assert record.winner_seconds == (0.5 if patience else 1.0)
    assert depth.get(record.winner, 0) == (2 if patience else 0)


def test_outputs_are_compared_with_the_default() -> None:
    reference = np.array([1.0, np.nan, np.inf, -2.0, 1e-9], dtype=np.float32)
    assert search._same_output(reference.copy(), reference, em.float32)
    assert search._same_output(reference + np.float32(1e-5), reference, em.float32)
    for wrong in ([1.0, 0.0, np.inf, -2.0, 1e-9], [1.0, np.nan, -np.inf, -2.0, 1e-9], [1.0, np.nan, np.inf, -2.1, 0]):
        assert not search._same_output(np.array(wrong, dtype=np.float32), reference, em.float32)
    assert not search._same_output(np.array([1, 2], dtype=np.int32), np.array([1, 3], dtype=np.int32), em.int32)


SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import ember as em
    from ember.ir import search
    from ember.scheduler.devices import get_device
    device = get_device(em.get_default_device())
    built = []
    compile_one, compile_many = device.compile, device.compile_many
    device.compile = lambda ir: built.append(ir.name) or compile_one(ir)
    device.compile_many = lambda irs: built.extend(ir.name for ir in irs) or compile_many(irs)
    first = np.random.default_rng(1).standard_normal((45, 70)).astype(np.float32)
    second = np.random.default_rng(2).standard_normal((70, 33)).astype(np.float32)
    result = (em.tensor(first) @ em.tensor(second)).numpy()
    print(json.dumps({"error": float(np.abs(result - first @ second).max()), "built": built,
                      "searched": len(search.STATISTICS.searches), "loaded": search.STATISTICS.winners_loaded}))
""")


def _run(environment: dict[str, str]) -> dict:
    completed = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                               cwd=REPOSITORY, env={**os.environ, "PYTHONPATH": str(REPOSITORY), **environment})
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_the_winner_only(tmp_path: Path) -> None:
    environment = {"EMBER_CACHE_DIR": str(tmp_path), "EMBER_SHAPE_CLASSES": "0", "EMBER_DEVICE": "c"}
    first = _run({**environment, "EMBER_SEARCH": "2", "EMBER_SEARCH_BUDGET": "2"})
    assert first["searched"] == 1 and len(first["built"]) > 2 and first["error"] < 1e-3
    second = _run({key: value for key, value in environment.items()})
    assert second == {"error": second["error"], "built": second["built"][:1], "searched": 0, "loaded": 1}
    assert second["error"] < 1e-3 and len(second["built"]) == 1  # the winner only: nothing timed, no loser built


def _searched_entry(statistics: search.SearchStatistics) -> Path:
    """Search the kernel of a small matmul on c; its winner entry."""
    with em.search(2, budget_seconds=1):
        _matmul()
    (entry,) = (Path(cache.root()) / "search").glob("*.entry")
    assert len(statistics.searches) == 1
    return entry


def _matmul_without_search(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.scheduler import compile_cache

    monkeypatch.setattr(compile_cache, "COMPILED", compile_cache.CompileCache())
    _matmul()


def _matmul() -> None:
    """A 20 x 30 @ 30 x 12 matmul on c (one kernel: its inputs come from numpy) against PyTorch."""
    first, second = np.ones((20, 30), dtype=np.float32), np.arange(360, dtype=np.float32).reshape(30, 12) / 100
    assert_close((em.tensor(first, device="c") @ em.tensor(second, device="c")).numpy(),
                 (torch.tensor(first) @ torch.tensor(second)).numpy(), atol=1e-4)


@pytest.mark.parametrize("damage", ["corrupt", "format", "plan", "kernel"])
def test_a_corrupt_or_stale_winner_falls_back_to_the_default(damage: str, searching: search.SearchStatistics,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    entry = _searched_entry(searching)
    if damage == "corrupt":
        data = bytearray(entry.read_bytes())
        data[-3] ^= 0xFF
        entry.write_bytes(bytes(data))
    else:
        payload = json.loads(cache.read_entry(entry) or b"")
        if damage == "format":
            payload["format"] = 99
        elif damage == "plan":
            payload["plan"]["upcast"] = [1, 2, 3]  # a rank the kernel's output does not have
        else:
            payload["plan"]["vector_width"] = 3  # no device has vectors of 3 lanes: the plan does not lower
        cache.write_entry(entry, json.dumps(payload).encode())
    reason = "corrupt" if damage == "corrupt" else "stale"
    with pytest.warns(SearchWarning, match=f"is not used: the entry is {reason}.*default lowering"):
        _matmul_without_search(monkeypatch)
    assert searching.winners_loaded == 0 and len(searching.searches) == 1  # nothing searched again


def test_search_zero_ignores_winners(searching: search.SearchStatistics, monkeypatch: pytest.MonkeyPatch) -> None:
    _searched_entry(searching)
    with em.search(0):
        _matmul_without_search(monkeypatch)
    assert searching.winners_loaded == 0
    _matmul_without_search(monkeypatch)
    assert searching.winners_loaded == 1


def test_bad_settings_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_SEARCH", "wide")
    with pytest.raises(ValueError, match="EMBER_SEARCH='wide'"):
        search.beam_width()
    monkeypatch.setenv("EMBER_SEARCH_BUDGET", "-1")
    with pytest.raises(ValueError, match="EMBER_SEARCH_BUDGET='-1'"):
        search.budget_seconds()
    with pytest.raises(ValueError, match="beam width"):
        em.search(-2)


def test_tune_runs_a_script_with_search_on(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text("import sys, numpy as np, ember as em\n"
                      "x = em.tensor(np.ones((24, 40), dtype=np.float32), device='c')\n"
                      "print(float((x @ x.T).sum().numpy()), sys.argv[1:])\n")
    completed = subprocess.run([sys.executable, "-m", "ember", "tune", "--beam", "1", "--budget", "1", str(script),
                                "--flag"], capture_output=True, text=True, timeout=300, cwd=REPOSITORY,
                               env={**os.environ, "PYTHONPATH": str(REPOSITORY), "EMBER_CACHE_DIR": str(tmp_path)})
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == [str(24.0 * 24 * 40), "['--flag']"]
    assert "kernels searched" in completed.stderr and len(list((tmp_path / "search").glob("*.entry"))) >= 1


def test_a_plan_carries_the_winners(tmp_path: Path) -> None:
    searched_cache, empty_cache = tmp_path / "searched", tmp_path / "empty"
    trace, plan = tmp_path / "trace.json", tmp_path / "run.plan"
    environment = {"EMBER_SHAPE_CLASSES": "0", "EMBER_DEVICE": "c"}
    first = _run({**environment, "EMBER_CACHE_DIR": str(searched_cache), "EMBER_SEARCH": "1",
                  "EMBER_SEARCH_BUDGET": "1", "EMBER_TRACE": str(trace)})
    assert first["searched"] == 1
    planned = subprocess.run([sys.executable, "-m", "ember", "plan", str(trace), "-o", str(plan)], capture_output=True,
                             text=True, timeout=300, cwd=REPOSITORY, env={**os.environ, "PYTHONPATH": str(REPOSITORY),
                                                                          "EMBER_CACHE_DIR": str(searched_cache)})
    assert planned.returncode == 0, planned.stderr
    winners = {entry.name for entry in (searched_cache / "search").glob("*.entry")}
    assert {entry.name for entry in (plan / "cache" / "search").glob("*.entry")} == winners
    loaded = _run({**environment, "EMBER_CACHE_DIR": str(empty_cache), "EMBER_PLAN": str(plan)})
    assert loaded["searched"] == 0 and loaded["loaded"] == 1 and loaded["error"] < 1e-3
    assert {entry.name for entry in (empty_cache / "search").glob("*.entry")} == winners
