"""The fuzzer's large examples, its NaN and infinity draws, and its time budget: the fuzzer's own behaviour.

Nothing here runs a large program on a real backend and expects it to pass: these tests check what the fuzzer
draws, how it judges a result (against numpy and torch), and that it keeps to its time.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from ember.core import dtype as dtypes
from ember.testing import fuzz as fuzz_module
from ember.testing.fuzz import Budget, FuzzMismatch, FuzzStats, check_large, compare, device_dtypes, fuzz, fuzz_test
from ember.testing.large import (ELEMENT_COUNTS, LARGE_PERCENT, LARGE_REDUCTIONS, Truth, estimated_seconds,
                                 large_problem, large_programs, matmul_truth, program_truth, reduction_truth,
                                 source_values)
from ember.testing.program import Call, Program, SeededValues, Source
from ember.testing.reference import ReferenceTensor
from ember.testing.strategies import NON_FINITE, fuzz_examples

SAMPLING = settings(max_examples=400, deadline=None, derandomize=True, database=None, phases=(Phase.generate,),
                    suppress_health_check=list(HealthCheck))


def sampled(strategy: st.SearchStrategy, count: int = 400) -> list:
    """`count` examples of a strategy as the fuzzer draws them (derandomized: the same every run)."""
    drawn: list = []

    @settings(SAMPLING, max_examples=count)
    @given(strategy)
    def collect(example: object) -> None:
        drawn.append(example)

    collect()
    return drawn


# ---- what is drawn -----------------------------------------------------------------------------------------------


def test_large_programs_are_drawn_at_their_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 50 examples from their own seeds, as a fuzz run draws them (Hypothesis draws the first choice of
    neighbouring examples alike, so the rate is measured over many chunks), with the check replaced."""
    monkeypatch.setattr(fuzz_module, "check_program", lambda program, device: (1, 0))
    stats = FuzzStats()
    for chunk_seed in range(20):
        seed(chunk_seed)(fuzz_test("dummy:0", stats, 50, large_percent=LARGE_PERCENT, deadline=math.inf))()
    assert 1 <= LARGE_PERCENT <= 5 and stats.examples == 1000 and not stats.large_skipped
    assert 0.2 * LARGE_PERCENT / 100 * stats.examples <= stats.large_examples <= 3 * LARGE_PERCENT / 100 * 1000
    assert not any(program.large for program in sampled(fuzz_examples((dtypes.float32,), large_percent=0), 200))


def test_large_programs_cover_the_ops_and_sizes_and_fit_in_memory() -> None:
    drawn = sampled(large_programs(), 400)
    methods = {program.nodes[-1].method for program in drawn}
    assert set(LARGE_REDUCTIONS) | {"__matmul__"} <= methods, methods
    counts = [max(math.prod(node.shape) for node in program.nodes if isinstance(node, Source)) for program in drawn]
    counts = [max(count, outputs(program)) for count, program in zip(counts, drawn)]
    assert min(ELEMENT_COUNTS) > 65_535 and max(ELEMENT_COUNTS) >= 2**24 + 1
    assert max(counts) >= 2**24 and sum(count > 65_535 for count in counts) >= 0.9 * len(counts)
    for program in drawn:
        inputs = sum(4 * math.prod(node.shape) for node in program.nodes if isinstance(node, Source))
        assert inputs <= 2**29, program  # 512 MB of float32 inputs at most: 10^8 elements (and ember's buffers)
        assert estimated_seconds(program) < 15
        assert program.large and program.pruned().large


def outputs(program: Program) -> int:
    """The number of output elements of a large program."""
    shapes = [node.shape for node in program.nodes if isinstance(node, Source)]
    if program.nodes[-1].method == "__matmul__":
        return shapes[0][0] * (shapes[1][1] if len(shapes[1]) == 2 else 1)
    return 1


def test_nan_and_inf_are_drawn_on_every_device(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The programs a fuzz run checks on the device (chunks from their own seeds, the check replaced by a count):
    some of them compute with NaN and infinities."""
    seen = {"programs": 0, "nan": 0, "inf": 0}

    def count(program: Program, device: str) -> tuple[int, int]:
        sources = [np.asarray(node.values, dtype=np.float64) for node in program.pruned().nodes
                   if isinstance(node, Source) and node.kind == "tensor" and node.dtype.is_float]
        seen["programs"] += 1
        seen["nan"] += any(np.isnan(values).any() for values in sources)
        seen["inf"] += any(np.isinf(values).any() for values in sources)
        return 1, 0

    monkeypatch.setattr(fuzz_module, "check_program", count)
    assert dtypes.float32 in device_dtypes(device)
    for chunk_seed in range(12):
        seed(chunk_seed)(fuzz_test(device, FuzzStats(), 50, deadline=math.inf))()
    assert seen["programs"] == 600
    assert 0.015 * 600 <= seen["nan"] <= 0.3 * 600 and 0.015 * 600 <= seen["inf"] <= 0.3 * 600, seen


def test_a_large_program_prints_as_code_that_makes_the_same_values() -> None:
    for fill in (SeededValues(7, 2.0, -1.0), SeededValues(3, 5.0, -2.0, integral=True)):
        source = Source("random", dtypes.float32, (3, 1000), fill=fill)
        made = eval(fill.code(source.shape), {"np": np})
        np.testing.assert_array_equal(made, source_values(source))
        assert made.dtype == np.float32
    program = Program([Source("random", dtypes.float32, (100_000,), fill=SeededValues(1, 1.0, 0.0)),
                       Call(0, "sum")], outputs=(1,), large=True)
    code = program.code("c:0")
    assert "np.random.default_rng(1).random((100000,), dtype=np.float32)" in code and "t1 = t0.sum()" in code


def test_a_wrong_large_result_is_a_mismatch_with_its_program() -> None:
    # the dummy device computes nothing (its results are 0): every large program is out of bounds there
    program = Program([Source("random", dtypes.float32, (5, 20_000), fill=SeededValues(2, 1.0, 0.5)),
                       Call(0, "sum", (1,))], outputs=(1,), large=True)
    with pytest.raises(FuzzMismatch) as failure:
        check_large(program, "dummy:0")
    message = str(failure.value)
    assert "out of the float32 error bound" in message and "np.random.default_rng(2)" in message, message


# ---- how large results are judged --------------------------------------------------------------------------------


def _sum_program(values: np.ndarray) -> Truth:
    return reduction_truth("sum", values, None)


def test_the_sum_bound_accepts_correct_float32_sums_of_ten_million_values() -> None:
    generator = np.random.default_rng(0)
    for values in (generator.random(10_000_000, dtype=np.float32),
                   generator.random(10_000_000, dtype=np.float32) * np.float32(2.0) - np.float32(1.0)):
        truth = _sum_program(values)
        pairwise = np.sum(values, dtype=np.float32)  # numpy's float32 sum is pairwise
        assert not large_problem(np.asarray(pairwise), truth)
        # chunks of 4096 added one after the other in float32, then the chunks' sums pairwise
        chunked = np.sum(np.cumsum(values[: 10_000_000 // 4096 * 4096].reshape(-1, 4096), axis=1,
                                   dtype=np.float32)[:, -1], dtype=np.float32)
        tail = np.sum(values[10_000_000 // 4096 * 4096:], dtype=np.float32)
        assert not large_problem(np.asarray(np.float32(chunked + tail)), truth)
        assert not large_problem(np.asarray(np.float32(torch.from_numpy(values).sum().item())), truth)


def test_the_sum_bound_rejects_a_sum_stuck_at_two_to_the_24() -> None:
    ones = np.broadcast_to(np.float32(1.0), (20_000_000,))
    problem = large_problem(np.asarray(np.float32(16_777_216.0)), _sum_program(ones))
    assert "out of the float32 error bound" in problem, problem
    assert not large_problem(np.asarray(np.float32(20_000_000.0)), _sum_program(ones))
    values = np.random.default_rng(1).random(20_000_000, dtype=np.float32)
    sequential = np.cumsum(values, dtype=np.float32)[-1]  # one float32 accumulator: stalls as it grows
    assert large_problem(np.asarray(sequential), _sum_program(values))


def test_the_sum_bound_rejects_a_sum_that_stopped_at_65535_elements() -> None:
    for values in (np.random.default_rng(2).random(100_000, dtype=np.float32), np.ones(100_000, np.float32)):
        stuck = np.sum(values[:65_535], dtype=np.float32)
        assert large_problem(np.asarray(stuck), _sum_program(values))
        assert not large_problem(np.asarray(np.sum(values, dtype=np.float32)), _sum_program(values))
    rows = np.random.default_rng(3).random((3, 100_000), dtype=np.float32)
    truth = reduction_truth("mean", rows, 1)
    assert not large_problem(rows.mean(axis=1, dtype=np.float32), truth)
    assert large_problem(rows[:, :65_535].mean(axis=1, dtype=np.float32), truth)


def test_the_product_and_matmul_bounds() -> None:
    count = 1_000_003
    width = 1.0 / math.sqrt(count)
    values = SeededValues(4, 2 * width, 1 - width).array((count,))
    truth = reduction_truth("prod", values, None)
    assert not large_problem(np.asarray(np.prod(values, dtype=np.float32)), truth)
    assert not large_problem(np.asarray(np.float32(torch.from_numpy(values).prod().item())), truth)
    assert large_problem(np.asarray(np.prod(values[:65_535], dtype=np.float32)), truth)
    left = np.random.default_rng(5).random((2, 300_000), dtype=np.float32) - np.float32(0.5)
    right = np.random.default_rng(6).random((300_000, 3), dtype=np.float32)
    truth = matmul_truth(left, right)
    assert not large_problem((torch.from_numpy(left) @ torch.from_numpy(right)).numpy(), truth)
    assert large_problem(left[:, :65_535] @ right[:65_535], truth)


def test_large_extremes_and_indices_are_exact() -> None:
    values = np.floor(np.random.default_rng(7).random((50, 2_000), dtype=np.float32) * np.float32(5.0))
    for method in ("argmax", "argmin"):
        truth = reduction_truth(method, values, 1)
        expected = getattr(torch.from_numpy(values), method)(dim=1).numpy()  # torch: the first of equal extremes
        assert not large_problem(expected, truth)
        shifted = expected.copy()
        shifted[0] += 1
        assert large_problem(shifted, truth)
    truth = reduction_truth("amax", values, 0)
    assert not large_problem(values.max(axis=0), truth) and large_problem(values.max(axis=0) - 1, truth)
    program = Program([Source("full", dtypes.float32, (200_000,), fill=3.0), Call(0, "argmax")], (1,), large=True)
    assert program_truth(program, [source_values(program.nodes[0])]).expected == 0


# ---- NaN and infinity ----------------------------------------------------------------------------------------------


def test_nan_and_infinities_are_compared_exactly() -> None:
    exact = np.array([math.nan, math.inf, -math.inf, 1.0], np.float32)
    assert not compare(exact.copy(), [exact, exact], dtypes.float32).problem
    for wrong in ([0.0, math.inf, -math.inf, 1.0], [math.nan, 3e38, -math.inf, 1.0],
                  [math.nan, math.inf, math.inf, 1.0], [math.nan, math.inf, -math.inf, math.nan]):
        verdict = compare(np.array(wrong, np.float32), [exact, exact], dtypes.float32)
        assert verdict.problem and verdict.bad is not None and verdict.bad.sum() == 1, wrong
    truth = Truth(np.array([2.0, 5.0]), np.array([1e-3, 1e-3]))
    assert large_problem(np.array([math.nan, 5.0], np.float32), truth)
    assert large_problem(np.array([2.0, math.inf], np.float32), truth)


NAN_SENSITIVE = ["max", "min", "amax", "amin", "argmax", "argmin", "sum", "prod", "mean", "cumsum", "softmax",
                 "logsumexp"]


def test_the_reference_follows_torch_on_nan_and_infinities() -> None:
    """Where NaN and infinities go is torch's: max, min and their indices propagate NaN (a NaN is the extreme)."""
    values = np.array([[1.0, math.nan, 3.0, -math.inf], [2.0, -1.0, math.inf, 0.5], [math.inf, -math.inf, 1.0, 0.0],
                       [4.0, 4.0, -2.0, 1.0]], np.float32)
    mine, theirs = ReferenceTensor(values, dtype=dtypes.float32), torch.from_numpy(values)
    for method in NAN_SENSITIVE:
        for args in ([], [0], [1]):
            if method in ("cumsum", "softmax", "logsumexp") and not args:
                continue
            if method in ("max", "min") and args:
                got, want = getattr(mine, method)(*args)[0].numpy(), getattr(theirs, method)(*args)[0].numpy()
            else:
                got, want = getattr(mine, method)(*args).numpy(), getattr(theirs, method)(*args).numpy()
            special = ~np.isfinite(want) if want.dtype.kind == "f" else np.zeros(want.shape, bool)
            assert np.array_equal(got[special], want[special], equal_nan=True), (method, args, got, want)
            assert np.array_equal(np.isnan(got), np.isnan(want)) if want.dtype.kind == "f" else (got == want).all()
    other = np.array([math.nan, 0.0, -math.inf, 2.0], np.float32)
    for method in ("maximum", "minimum", "__add__", "__mul__", "__truediv__", "__pow__", "fmod"):
        got = getattr(mine, method)(ReferenceTensor(other, dtype=dtypes.float32)).numpy()
        want = getattr(theirs, method)(torch.from_numpy(other)).numpy()
        special = ~np.isfinite(want)
        assert np.array_equal(got[special], want[special], equal_nan=True), (method, got, want)
        assert np.array_equal(np.isfinite(got), np.isfinite(want)), (method, got, want)
    vector = np.array([[math.nan, 0.0]], np.float32)
    ones = np.array([[0.0], [1.0]], np.float32)
    assert np.isnan((ReferenceTensor(vector, dtype=dtypes.float32) @ ReferenceTensor(ones, dtype=dtypes.float32))
                    .numpy()).all()  # [nan, 0] @ [0, 1] is NaN (NaN * 0 is NaN), as in torch
    assert NON_FINITE[0] != NON_FINITE[0] and set(NON_FINITE[1:]) == {math.inf, -math.inf}


# ---- keeping to the time ---------------------------------------------------------------------------------------------


def test_large_examples_that_do_not_fit_are_skipped_not_run() -> None:
    stats = FuzzStats()
    fuzz_test("dummy:0", stats, 20, large_percent=100, deadline=time.monotonic() + 1.0)()
    assert stats.examples == 0 and stats.large_skipped == 20 and not stats.failures
    assert Budget(time.monotonic() + 60).allows(30.0) and not Budget(time.monotonic() + 1).allows(30.0)


def test_large_examples_beyond_the_device_s_largest_buffer_are_skipped_not_failed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor larger than the device holds raises DeviceError naming the limit (WebGPU on lavapipe: 128 MB), which
    is no bug: the fuzzer skips such large programs (50M float32 elements drew 'cannot hold a buffer' failures)."""
    checked: list[Program] = []
    monkeypatch.setattr(fuzz_module, "check_program", lambda program, device: (checked.append(program), (1, 0))[1])
    monkeypatch.setattr(fuzz_module, "largest_buffer", lambda device: 4 * 10**6)  # a million float32 elements
    stats = FuzzStats()
    seed(3)(fuzz_test("dummy:0", stats, 60, large_percent=100, deadline=math.inf))()
    sizes = [max(math.prod(node.shape) for node in program.nodes if isinstance(node, Source)) for program in checked]
    assert stats.large_beyond_device > 0 and stats.examples == len(checked) > 0 and not stats.failures
    assert all(size <= 10**6 for size in sizes), sizes


def test_running_out_of_time_while_shrinking_reports_the_smallest_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    start = time.monotonic()

    def slow_failure(program: Program, device: str) -> tuple[int, int]:
        if len(program.pruned()) >= 3:  # fails, and takes until past the deadline: shrinking must stop
            time.sleep(max(0.0, start + 1.6 - time.monotonic()))
            raise FuzzMismatch(fuzz_module._report(program, device, "planted mismatch"))
        return 1, 0

    monkeypatch.setattr(fuzz_module, "check_program", slow_failure)
    lines: list[str] = []
    stats = fuzz("dummy:0", 1.5, start_seed=5, report=lines.append, gradients=False, large_percent=0)
    assert time.monotonic() - start < 4.0
    assert len(stats.failures) == 1 and not stats.fuzzer_bugs, lines
    assert "planted mismatch" in lines[0] and "shrinking stopped at the time limit" in lines[0], lines[0]
    assert "Repeat it with: python -m ember fuzz --device dummy --seed 5" in lines[0]


def test_the_command_keeps_to_a_short_time() -> None:
    minutes = 0.1
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "ember", "fuzz", "--device", "c", "--minutes", str(minutes),
                             "--seed", "11"], capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - start
    # the worker's start-up counts against its time; what may run over is one example (a few compiles), slower on a
    # loaded machine (16.2 s on an H100 host running 15 test workers): a command that ignored its limit runs minutes
    assert elapsed < minutes * 60 + 30, (elapsed, result.stdout)
    assert "examples ran" in result.stdout and " large" in result.stdout, result.stdout + result.stderr
