"""The fuzzer: a fixed, derandomized budget of random programs per device, and checks that the fuzzer itself works."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

import ember as em
from ember.backends.base import ProgramTable
from ember.core import dtype as dtypes
from ember.core.ops import Op
from ember.core.errors import DTypeError
from ember.testing.fuzz import (EXIT_CLEAN, EXIT_FINDINGS, EXIT_FUZZER_BUG, EXIT_UNAVAILABLE, EmberMaker, FuzzMismatch,
                                FuzzStats, check_program, compare, fuzz, fuzz_test)
from ember.testing.program import Call, Program, Ref, Source
from ember.testing.strategies import broadcast_shape, broadcastable, programs, shapes

# Examples per device: the C backend compiles a kernel in ~70 ms, PoCL in ~0.3 s (a cold cache costs ~1 s/example).
EXAMPLES = {"c": 150}
OTHER_EXAMPLES = 50
# Set to False to draw one output per program (a switch for working around an open bug in multi-output realizes).
EXTRA_OUTPUTS = True


def test_fuzz_budget(device: str) -> None:
    examples = int(os.environ.get("EMBER_FUZZ_EXAMPLES", EXAMPLES.get(device.split(":")[0], OTHER_EXAMPLES)))
    stats = FuzzStats()
    fuzz_test(device, stats, examples, max_calls=6, derandomize=True, extra_outputs=EXTRA_OUTPUTS)()
    assert stats.passed == examples and stats.elements_compared > examples


# Gradient programs compile forward and backward kernels: a smaller budget.
GRADIENT_EXAMPLES = {"c": 40}
OTHER_GRADIENT_EXAMPLES = 15
GRADIENT_EXCLUDED: frozenset[str] = frozenset()


def test_gradient_fuzz_budget(device: str) -> None:
    from ember.testing.gradient_fuzz import gradient_fuzz_test

    examples = GRADIENT_EXAMPLES.get(device.split(":")[0], OTHER_GRADIENT_EXAMPLES)
    stats = FuzzStats()
    gradient_fuzz_test(device, stats, examples, derandomize=True, exclude=GRADIENT_EXCLUDED)()
    assert stats.passed == examples


def test_fuzzer_finds_and_shrinks_an_injected_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break `<` in the C renderer (render it as `<=`): the fuzzer must notice and print a short program."""
    from ember.scheduler import compile_cache
    from ember.scheduler.devices import get_device

    device = get_device("c")
    monkeypatch.setattr(compile_cache, "COMPILED", compile_cache.CompileCache())
    monkeypatch.setitem(device.renderer.alu, Op.CMPLT, lambda operands, _, __: f"({operands[0]}<={operands[1]})")
    monkeypatch.setattr(device, "_programs", ProgramTable())
    with pytest.raises(FuzzMismatch) as failure:
        fuzz_test("c:0", FuzzStats(), 200, max_calls=6, derandomize=True, extra_outputs=EXTRA_OUTPUTS)()
    message = str(failure.value)
    assert "values differ" in message, message
    code = message.split("--- program (paste to reproduce) ---")[1]
    calls = [line for line in code.splitlines() if line.startswith("t") and " = em." not in line]
    assert 1 <= len(calls) <= 3, message
    monkeypatch.undo()
    namespace: dict = {}
    exec(code.replace("print(", "(lambda *a: None)("), namespace)  # the printed program runs as it is


def test_compare_rules() -> None:
    exact = np.array([1.0, math.nan, math.inf, 2.0, 5.0], dtype=np.float32)
    noisy = np.array([1.0, math.nan, math.inf, 2.0 + 1e-6, 5.0], dtype=np.float32)
    uncertain = np.array([1.0, 3.0, 7.0, 2.0, 5.0], dtype=np.float32)  # NaN and inf flip: not compared
    assert not compare(exact.copy(), [exact, noisy], em.float32).problem
    assert compare(np.array([1.0, 0.0, math.inf, 2.0, 5.0], np.float32), [exact, noisy], em.float32).problem
    assert compare(np.array([1.0, math.nan, -math.inf, 2.0, 5.0], np.float32), [exact, noisy], em.float32).problem
    assert compare(np.array([1.0, math.nan, math.inf, 2.01, 5.0], np.float32), [exact, noisy], em.float32).problem
    loose = compare(np.array([1.0, 0.0, 0.0, 2.0, 5.0], np.float32), [exact, uncertain], em.float32)
    assert not loose.problem and loose.uncertain == 2
    integers = np.array([1, 2, 3], dtype=np.int32)
    assert compare(np.array([1, 2, 4], np.int32), [integers, integers], em.int32).problem
    flipped = compare(np.array([1, 2, 4], np.int32), [integers, np.array([1, 2, 5], np.int32)], em.int32)
    assert not flipped.problem and flipped.uncertain == 1


def test_a_program_prints_as_code_that_computes_the_same(device: str) -> None:
    values = np.array([[1.5, -2.0, math.nan], [0.25, math.inf, 3.0]], dtype=np.float32)
    program = Program(
        [Source("tensor", dtypes.float32, (2, 3), values=values),
         Call(0, "sum", (1,), (("keepdim", True),)),
         Call(1, "pad", ((1, -1),), (("value", 2.0),)),
         Source("full", dtypes.int32, (3,), fill=-4),
         Call(2, "__add__", (Ref(3),)),
         Call(4, "__getitem__", ((slice(None, None, 2), None),)),
         Call(0, "exp")],  # not needed by the output: left out of the code
        outputs=(5, 4))
    check_program(program, device)
    code = program.code(device)
    assert ".exp()" not in code and "t0.sum(1, keepdim=True)" in code and "t4[::2, None]" in code
    namespace: dict = {}
    exec(code.replace("print(", "(lambda *a: None)("), namespace)
    expected = program.run(EmberMaker(device))[5].numpy()
    np.testing.assert_array_equal(namespace["t5"].numpy(), expected)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_generated_programs_are_valid_on_the_reference(data: st.DataObject) -> None:
    """Generation alone (no device): every program runs on the reference and prints as code."""
    program = data.draw(programs((dtypes.float32, dtypes.int32, dtypes.bool_, dtypes.float16, dtypes.uint8)))
    from ember.testing.strategies import ReferenceMaker

    values = program.run(ReferenceMaker())
    assert all(values[index] is not None for index in program.outputs)
    assert "em.realize(" in program.code("c")


def test_command_line_fuzz_runs_and_reports() -> None:
    result = subprocess.run([sys.executable, "-m", "ember", "fuzz", "--device", "c", "--minutes", "0.05", "--seed", "4"],
                            capture_output=True, text=True, timeout=300)
    assert "examples" in result.stdout and "/s" in result.stdout, result.stdout + result.stderr
    found = "MISMATCH" in result.stdout or "CRASH" in result.stdout
    expected = EXIT_FINDINGS if found else EXIT_FUZZER_BUG if "FUZZER BUG" in result.stdout else EXIT_CLEAN
    assert result.returncode == expected, result.stdout + result.stderr


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_a_broadcast_shape_broadcasts(data: st.DataObject) -> None:
    shape = data.draw(shapes())
    first = data.draw(broadcast_shape(shape))
    assert broadcastable(first, shape), (first, shape)
    joint = np.broadcast_shapes(shape, first)
    second = data.draw(broadcast_shape(joint))  # what `where` draws its other value with
    np.broadcast_shapes(shape, first, second)


GENERATOR_SEEDS = range(201)  # the chunk seeds a fuzz run starting at 0 goes through first


def test_both_generators_draw_valid_programs_for_many_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The op fuzzer's and the gradient fuzzer's Hypothesis tests, two programs for each seed, with the device check
    replaced by the rest of the harness (the reference's noisy runs; torch's gradients) and the printing: nothing
    raises, and every call drawn is one the reference accepts unless it mixes dtypes a user may not mix (shapes are
    drawn to fit: operands broadcast, dims exist, crops stay inside)."""
    import ember.testing.fuzz as fuzz_module
    import ember.testing.gradient_fuzz as gradient_module
    import ember.testing.strategies as strategies
    from ember.core.checks import IntegerDivisionByZeroError

    rejected: list[str] = []
    run_reference = strategies._run_reference

    def watched(node: object, values: list) -> object:
        try:
            return run_reference(node, values)
        except (DTypeError, IntegerDivisionByZeroError):  # dtypes a user may not mix; an integer divisor holding 0
            raise
        except Exception as error:
            rejected.append(f"{node}: {type(error).__name__}: {error}")
            raise

    def harness_only(program: Program, device: str) -> tuple[int, int]:
        fuzz_module.reference_samples(program.pruned())
        compile(program.code(device), "<program>", "exec")
        return 1, 0

    def gradient_harness_only(program: Program, device: str) -> None:
        gradient_module.gradients(program.pruned(), gradient_module.TorchMaker(), gradient_module.torch_adapters())
        compile(gradient_module.gradient_code(program, device), "<program>", "exec")

    monkeypatch.setattr(strategies, "_run_reference", watched)
    monkeypatch.setattr(fuzz_module, "check_program", harness_only)
    monkeypatch.setattr(gradient_module, "check_gradients", gradient_harness_only)
    stats = FuzzStats()
    for chunk_seed in GENERATOR_SEEDS:
        for test in (fuzz_test("dummy:0", stats, 2), gradient_module.gradient_fuzz_test("dummy:0", stats, 2)):
            try:
                seed(chunk_seed)(test)()
            except Exception as error:  # noqa: BLE001 - the seed goes into the failure
                pytest.fail(f"seed {chunk_seed}: the generator or harness raised {type(error).__name__}: {error}")
        assert not rejected, f"seed {chunk_seed}: drew calls the reference rejects:\n" + "\n".join(rejected)
    assert stats.passed == stats.examples == 4 * len(GENERATOR_SEEDS)


def test_a_generator_error_is_a_fuzzer_bug_with_its_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    import ember.testing.strategies as strategies

    def broken(draw: object, builder: object, target: int) -> None:
        raise ValueError("planted generator error")

    monkeypatch.setattr(strategies, "KINDS", {"unary": broken})
    lines: list[str] = []
    stats = fuzz("dummy:0", 2.0, start_seed=40, chunk=2, report=lines.append, gradients=False, large_percent=0)
    assert not stats.failures and stats.fuzzer_bugs and stats.examples == 0, lines
    assert lines[0].startswith("FUZZER BUG on dummy:0 (seed 40):"), lines[0]
    assert "the fuzzer itself raised ValueError: planted generator error" in lines[0]
    assert "not in dummy:0" in lines[0] and "--seed 40" in lines[0] and "MISMATCH" not in "".join(lines)


def test_command_line_exit_status_tells_a_fuzzer_bug_and_an_unavailable_device(tmp_path) -> None:
    # a sitecustomize on PYTHONPATH plants a generator error in the command and in its worker processes, in both
    # generators: the dummy device computes nothing, so any program that ran would be a (true) mismatch there
    (tmp_path / "sitecustomize.py").write_text(
        "import ember.testing.gradient_fuzz as gradient_fuzz\n"
        "import ember.testing.strategies as strategies\n"
        "def broken(draw, builder, target):\n"
        "    raise ValueError('planted generator error')\n"
        "strategies.KINDS = {'unary': broken}\n"
        "import ember.testing.large as large\n"
        "large.LARGE_PERCENT = 0\n"
        "gradient_fuzz.KINDS = {'unary': broken}\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), root, os.environ.get("PYTHONPATH", "")]))
    # (6 s: the worker's start-up counts against its time, and on a loaded machine, 15 test processes on a GPU
    # host, 2.4 s ended before its first example, so nothing was generated and the run was clean)
    command = [sys.executable, "-m", "ember", "fuzz", "--device", "dummy", "--minutes", "0.1", "--seed", "8"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    assert result.returncode == EXIT_FUZZER_BUG, result.stdout + result.stderr
    assert "FUZZER BUG on dummy:0 (seed 8)" in result.stdout and "planted generator error" in result.stdout
    assert "MISMATCH" not in result.stdout and "CRASH" not in result.stdout and "FUZZER BUGS" in result.stdout
    unavailable = subprocess.run([sys.executable, "-m", "ember", "fuzz", "--device", "opencl", "--minutes", "0.04"],
                                 capture_output=True, text=True, timeout=300, env=dict(os.environ, EMBER_BACKENDS="c"))
    assert unavailable.returncode == EXIT_UNAVAILABLE, unavailable.stdout + unavailable.stderr
    assert "backend 'opencl' is not available" in unavailable.stdout and "Traceback" not in unavailable.stderr


def test_a_gradient_mismatch_in_a_worker_is_reported_not_a_crash(tmp_path) -> None:
    # the worker runs as __main__; the gradient fuzzer's FuzzMismatch must still be the class the worker catches
    stats, program = tmp_path / "stats.json", tmp_path / "program.py"
    code = (
        "import runpy, sys\n"
        "import ember.testing.gradient_fuzz as gradient_fuzz\n"
        "from ember.testing.fuzz import FuzzMismatch\n"
        "def planted(program, device):\n"
        "    raise FuzzMismatch('planted gradient mismatch')\n"
        "gradient_fuzz.check_gradients = planted\n"
        f"sys.argv = ['fuzz', '--device', 'c:0', '--seconds', '3', '--seed', '3', '--stats', {str(stats)!r}, "
        f"'--program', {str(program)!r}]\n"
        "runpy.run_module('ember.testing.fuzz', run_name='__main__')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "MISMATCH on c:0 (seed 3)" in result.stdout and "planted gradient mismatch" in stats.read_text()
