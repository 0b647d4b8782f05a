"""The fuzzer: a fixed, derandomized budget of random programs per device, and checks that the fuzzer itself works."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ember as em
from ember.core import dtype as dtypes
from ember.core.ops import Op
from ember.testing.fuzz import EmberMaker, FuzzMismatch, FuzzStats, check_program, compare, fuzz_test
from ember.testing.program import Call, Program, Ref, Source
from ember.testing.strategies import programs

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
    import ember.scheduler.realize as realize_module
    from ember.scheduler.devices import get_device

    device = get_device("c")
    monkeypatch.setattr(realize_module, "_compiled", {})
    monkeypatch.setitem(device.renderer.alu, Op.CMPLT, lambda operands, _, __: f"({operands[0]}<={operands[1]})")
    monkeypatch.setattr(device, "_programs", {})
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
    assert result.returncode == (1 if "MISMATCH" in result.stdout or "CRASH" in result.stdout else 0), result.stdout


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
