"""The fuzzer: random programs run by ember on a device and by the reference tensor, compared value by value.

Floats are compared with a tolerance that follows the rounding sensitivity of each element: the program also runs
on the reference with random relative noise of a few units in the last place on every rounding op (Monte Carlo
arithmetic) and once with float16/bfloat16 intermediates unrounded (ember rounds them only where a kernel stores
them), and the spread of those runs widens the tolerance where the result is ill-conditioned. Elements whose
NaN-ness, infinity, integer or boolean value changes between the noisy runs are uncertain and not compared; every
other integer and boolean element must match exactly, and NaN and infinity positions must match.

A few examples in a hundred (large.LARGE_PERCENT) are one reduction or matmul over 10^5 to 10^8 elements instead,
compared with the exact float64 result and a float32 error bound (large.py says why it is right).

A run keeps to its time: no example starts after the deadline, a large one only if its estimated time still fits,
and once Hypothesis is shrinking a failure, running out of time stops the shrinking (TimeUp) and the smallest
failing program found so far is reported.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis.errors import FlakyFailure

from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.scheduler.schedule import SCHEDULES
from ember.settings import CONFIG
from ember.testing import large
from ember.testing.large import estimated_seconds, large_problem, largest_bytes, program_truth, source_values
from ember.testing.program import Call, Program, Source, run_node
from ember.testing.reference import UNIT_ROUNDOFF, halves_unrounded, perturbation, store
from ember.testing.strategies import ReferenceMaker, fuzz_examples

NOISE_SCALE = 4.0  # units in the last place of noise per rounding op (covers library functions' ulp errors)
NOISY_RUNS = 5
SPREAD_FACTOR = 4.0
RELATIVE_ULPS = 16.0
SMALLEST_NORMAL = {dtypes.float16: 6.1e-5, dtypes.bfloat16: 1.2e-38, dtypes.float32: 1.2e-38, dtypes.float64: 2.3e-308}


class FuzzMismatch(AssertionError):
    """ember and the reference disagree on a program (the message holds the program as code)."""


class EmberMaker:
    """Sources as ember tensors on one device."""

    def __init__(self, device: str) -> None:
        self.device = device

    def tensor(self, values: np.ndarray, dtype: DType, requires_grad: bool = False) -> Any:
        import ember

        return ember.tensor(values, dtype=dtype, device=self.device, requires_grad=requires_grad)

    def full(self, shape: tuple[int, ...], value: Any, dtype: DType) -> Any:
        import ember

        return ember.full(shape, value, dtype=dtype, device=self.device)

    def arange(self, count: int, dtype: DType) -> Any:
        import ember

        return ember.arange(count, dtype=dtype, device=self.device)


def largest_buffer(device: str) -> int:
    """The bytes of the largest buffer the device holds (DeviceInfo.max_buffer_bytes)."""
    from ember.scheduler.devices import get_device

    return get_device(device).info.max_buffer_bytes


def device_dtypes(device: str) -> tuple[DType, ...]:
    """The dtypes a device can run, most interesting first (float32 is what shrinking goes to)."""
    from ember.scheduler.devices import get_device

    order = (dtypes.float32, dtypes.int32, dtypes.bool_, dtypes.int64, dtypes.float16, dtypes.float64,
             dtypes.bfloat16, dtypes.uint8, dtypes.int8, dtypes.int16, dtypes.uint16, dtypes.uint32, dtypes.uint64)
    unsupported = get_device(device).info.unsupported(set(order))
    return tuple(dtype for dtype in order if dtype not in unsupported)


# ---- comparing --------------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    """The comparison of one output: where it differs (a boolean mask) and why."""

    problem: str = ""
    bad: np.ndarray | None = None
    compared: int = 0
    uncertain: int = 0


def compare(actual: np.ndarray, samples: list[np.ndarray], dtype: DType) -> Verdict:
    """Check ember's values against the exact reference run (samples[0]) and the noisy runs (samples[1:])."""
    expected = samples[0]
    if actual.shape != expected.shape:
        return Verdict(f"shape {actual.shape} != reference {expected.shape}")
    stack = np.stack([np.asarray(sample) for sample in samples]) if samples else expected[None]
    if not dtype.is_float:
        agreed = np.all(stack == stack[0], axis=0)
        bad = agreed & (actual != expected)
        return Verdict("values differ" if bad.any() else "", bad, int(agreed.sum()), int((~agreed).sum()))
    stack = stack.astype(np.float64)
    got = np.asarray(actual).astype(np.float64)
    nan = np.isnan(stack)
    all_nan, any_nan = nan.all(axis=0), nan.any(axis=0)
    infinite = np.isinf(stack)
    same_infinity = infinite.all(axis=0) & np.all(stack == stack[0], axis=0)
    any_infinite = infinite.any(axis=0)
    finite = ~any_nan & ~any_infinite
    uncertain = (any_nan & ~all_nan) | (any_infinite & ~same_infinity)
    with np.errstate(all="ignore"):
        low = np.where(finite, stack.min(axis=0), 0.0)
        high = np.where(finite, stack.max(axis=0), 0.0)
        center = np.where(finite, stack[0], 0.0)
        unit = UNIT_ROUNDOFF[dtype]
        tolerance = SMALLEST_NORMAL[dtype] + RELATIVE_ULPS * unit * np.abs(center) + SPREAD_FACTOR * (high - low)
        wrong_finite = finite & ~(np.abs(got - center) <= tolerance)
    wrong_nan = all_nan & ~np.isnan(got)
    wrong_infinity = same_infinity & ~(got == stack[0])
    bad = wrong_finite | wrong_nan | wrong_infinity
    return Verdict("values differ" if bad.any() else "", bad, int((~uncertain).sum()), int(uncertain.sum()))


def check_large(program: Program, device: str) -> tuple[int, int]:
    """Run a large program on ember and compare it with its float64 truth; raise FuzzMismatch if out of bounds."""
    import ember

    sources = [node for node in program.nodes if isinstance(node, Source)]
    inputs = [source_values(source) for source in sources]
    truth = program_truth(program, inputs)
    try:
        maker = EmberMaker(device)
        values: list[Any] = []
        for node in program.nodes:
            if isinstance(node, Source) and node.kind == "random":  # the values the truth was computed from
                values.append(maker.tensor(inputs[sources.index(node)], node.dtype))
            else:
                values.append(run_node(node, values, maker))
        output = values[program.outputs[0]]
        ember.realize(output)
        actual = output.numpy()
    except Exception as error:  # noqa: BLE001 - any error of ember on a valid program is a finding
        raise FuzzMismatch(_report(program, device, f"ember raised {type(error).__name__}: {error}")) from error
    del values, inputs
    call = program.nodes[-1]
    assert isinstance(call, Call)
    expected_dtype = dtypes.int64 if call.method in ("argmax", "argmin") else dtypes.float32
    if output.dtype != expected_dtype:
        raise FuzzMismatch(_report(program, device, f"dtype {output.dtype.name} != {expected_dtype.name}"))
    problem = large_problem(actual, truth)
    if problem:
        raise FuzzMismatch(_report(program, device, f"output {program.outputs[0]}: {problem}"))
    return int(np.size(actual)), 0


def reference_samples(program: Program) -> list[list[np.ndarray]]:
    """Output values of the exact reference run, of a run with half types unrounded, and of the noisy runs."""
    runs = []
    for run in range(NOISY_RUNS + 2):
        context = halves_unrounded() if run == 1 else perturbation(NOISE_SCALE, seed=run) if run else nullcontext()
        with context:
            values = program.run(ReferenceMaker())
        runs.append([store(values[index].array, values[index].dtype, always=True) for index in program.outputs])
    return runs


def check_program(program: Program, device: str) -> tuple[int, int]:
    """Run a program on ember and on the reference; raise FuzzMismatch (with the code) if they disagree.

    Returns the numbers of output elements compared and of elements left uncertain by the noisy runs."""
    import ember

    program = program.pruned()  # what the printed code shows, numbered the same way
    if program.large:
        return check_large(program, device)
    try:
        expected_values = program.run(ReferenceMaker())
        runs = reference_samples(program)
    except Exception as error:  # noqa: BLE001 - the reference itself failed on a program the generator accepted
        raise FuzzMismatch(_report(program, device, f"the reference raised {type(error).__name__}: {error}")) from error
    try:
        values = program.run(EmberMaker(device))
        outputs = [values[index] for index in program.outputs]
        ember.realize(*outputs)
        actual = [output.numpy() for output in outputs]
    except Exception as error:  # noqa: BLE001 - any error of ember on a valid program is a finding
        raise FuzzMismatch(_report(program, device, f"ember raised {type(error).__name__}: {error}")) from error
    compared = uncertain = 0
    for position, (index, result) in enumerate(zip(program.outputs, actual)):
        expected = expected_values[index]
        if outputs[position].dtype != expected.dtype:
            raise FuzzMismatch(_report(program, device, f"t{index}: dtype {outputs[position].dtype.name} != "
                                                        f"reference {expected.dtype.name}"))
        verdict = compare(result, [run[position] for run in runs], expected.dtype)
        if verdict.problem:
            raise FuzzMismatch(_report(program, device, _describe(index, verdict, result, expected.numpy())))
        compared += verdict.compared
        uncertain += verdict.uncertain
    return compared, uncertain


def _describe(index: int, verdict: Verdict, actual: np.ndarray, expected: np.ndarray) -> str:
    if verdict.bad is None:
        return f"output {index}: {verdict.problem}"
    positions = np.argwhere(verdict.bad)[:4]
    shown = ", ".join(
        f"at {tuple(int(p) for p in position)} ember {actual[tuple(position)]!r} "
        f"reference {expected[tuple(position)]!r}"
        for position in positions
    )
    return f"output {index}: {verdict.problem} in {int(verdict.bad.sum())} of {verdict.bad.size} elements: {shown}"


def _report(program: Program, device: str, problem: str) -> str:
    return f"{problem}\n--- program (paste to reproduce) ---\n{program.code(device)}\n"


# ---- running ----------------------------------------------------------------------------------------------------


@dataclass
class FuzzStats:
    """What a fuzz run did."""

    examples: int = 0
    gradient_examples: int = 0
    large_examples: int = 0
    large_skipped: int = 0  # drawn when their estimated time no longer fitted before the deadline
    large_beyond_device: int = 0  # drawn with a tensor larger than the device holds (DeviceInfo.max_buffer_bytes)
    passed: int = 0
    elements_compared: int = 0
    elements_uncertain: int = 0
    failures: list[str] = field(default_factory=list)  # ember disagreed with the reference, raised, or crashed
    fuzzer_bugs: list[str] = field(default_factory=list)  # the fuzzer itself failed (its generator or its harness)
    seconds: float = 0.0
    rewritten_graphs: int = 0  # new graph structures the graph rewrites changed (scheduler/graph_rewrite.py)

    @property
    def examples_per_second(self) -> float:
        return self.examples / self.seconds if self.seconds else 0.0


class TimeUp(BaseException):
    """A fuzz run's time ran out while Hypothesis was shrinking a failure.

    A BaseException (like KeyboardInterrupt), so that Hypothesis stops at once instead of taking it for a failure of
    the program; the run then reports the smallest failure recorded in its Budget."""


@dataclass
class Budget:
    """The deadline of one fuzz test (time.monotonic(); None: none) and the failures it raised so far."""

    deadline: float | None = None
    failures: list[str] = field(default_factory=list)

    def allows(self, seconds: float = 0.0) -> bool:
        """Whether an example expected to take `seconds` may start now.

        Once a failure was raised, Hypothesis is shrinking it and a skipped example would look like one that passes
        (so that the failure could not be replayed): running out of time then raises TimeUp instead."""
        if self.deadline is None or time.monotonic() + seconds <= self.deadline:
            return True
        if self.failures:
            raise TimeUp(f"the time ran out while shrinking ({len(self.failures)} failing programs run)")
        return False

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Record the message of a FuzzMismatch raised inside (and let it go on)."""
        try:
            yield
        except FuzzMismatch as mismatch:
            self.failures.append(str(mismatch))
            raise

    def smallest_failure(self) -> str:
        """The shortest failure message recorded (its program is the most shrunk one)."""
        return min(self.failures, key=len)


def fuzz_test(device: str, stats: FuzzStats, max_examples: int, max_calls: int = 8, derandomize: bool = False,
              deadline: float | None = None, extra_outputs: bool = True, other_devices: tuple[str, ...] = (),
              large_percent: int = 0, budget: Budget | None = None) -> Callable[[], None]:
    """A Hypothesis test that checks random programs on `device` (call it to run; it raises on a mismatch).

    `large_percent` of the examples are large programs (see large.py); `budget` (or `deadline`) bounds the time."""
    allowed = device_dtypes(device)
    budget = budget if budget is not None else Budget(deadline)
    largest = largest_buffer(device)

    @settings(max_examples=max_examples, deadline=None, derandomize=derandomize, database=None, print_blob=False,
              phases=(Phase.generate, Phase.shrink), report_multiple_bugs=False, verbosity=Verbosity.quiet,
              suppress_health_check=list(HealthCheck))
    @given(fuzz_examples(allowed, max_calls, extra_outputs, other_devices, large_percent))
    def test(program: Program) -> None:
        if not budget.allows(estimated_seconds(program) if program.large else 0.0):
            stats.large_skipped += program.large
            return
        if program.large and largest_bytes(program) > largest:  # (the device says so: a DeviceError, not a bug)
            stats.large_beyond_device += 1
            return
        stats.examples += 1
        stats.large_examples += program.large
        with CurrentProgram.running(lambda: program.code(device)), budget.recording():
            compared, uncertain = check_program(program, device)
        stats.passed += 1
        stats.elements_compared += compared
        stats.elements_uncertain += uncertain

    return test


def fuzz(device: str, seconds: float, start_seed: int = 0, chunk: int = 50, max_calls: int = 8,
         report: Callable[[str], None] = print, progress_seconds: float = 30.0, extra_outputs: bool = True,
         gradients: bool = True, other_devices: tuple[str, ...] = (), large_percent: int | None = None) -> FuzzStats:
    """Fuzz `device` for `seconds`, in chunks of `chunk` examples seeded start_seed, start_seed + 1, ...

    Every fourth chunk checks gradients against torch instead (when `gradients` is set). A chunk whose generator or
    harness raises (anything but a FuzzMismatch) is a fuzzer bug: reported with its seed, and the next chunk goes on.
    `large_percent` of the examples (default: large.LARGE_PERCENT) are large programs. A mismatch's report ends with
    the command that repeats it; a failure whose shrinking the deadline cut off is reported with the smallest program
    found."""
    if large_percent is None:
        large_percent = large.LARGE_PERCENT
    stats = FuzzStats()
    start = time.monotonic()
    deadline = start + seconds
    chunk_seed = start_seed
    last_report = start
    seen: set[str] = set()
    while time.monotonic() < deadline:
        budget = Budget(deadline)
        if gradients and chunk_seed % 4 == 3:
            from ember.testing.gradient_fuzz import gradient_fuzz_test

            test = seed(chunk_seed)(gradient_fuzz_test(device, stats, max(1, chunk // 2), budget=budget))
        else:
            test = seed(chunk_seed)(fuzz_test(device, stats, chunk, max_calls, extra_outputs=extra_outputs,
                                              other_devices=other_devices, large_percent=large_percent,
                                              budget=budget))
        repeat = repeat_command(device, chunk_seed, max_calls)
        try:
            test()
        except TimeUp:
            text = f"{budget.smallest_failure()}(shrinking stopped at the time limit)\n{repeat}"
            stats.failures.append(text)
            report(f"MISMATCH on {device} (seed {chunk_seed}):\n{text}")
        except Exception as failure:  # noqa: BLE001 - sorted below: a finding about ember, or a bug of the fuzzer
            if is_fuzzer_bug(failure):
                text = fuzzer_bug_text(failure, device, chunk_seed, max_calls)
                stats.fuzzer_bugs.append(text)
                kind, key = "FUZZER BUG", "".join(traceback.format_exception(failure))
            else:
                text = f"{failure_text(failure)}\n{repeat}"
                stats.failures.append(text)
                kind, key = "MISMATCH", text
            if key in seen:
                report(f"{kind} on {device} (seed {chunk_seed}): the same as an earlier one")
            else:
                report(f"{kind} on {device} (seed {chunk_seed}):\n{text}")
            seen.add(key)
        chunk_seed += 1
        stats.seconds = time.monotonic() - start
        if time.monotonic() - last_report > progress_seconds:
            last_report = time.monotonic()
            report(f"{device}: {stats.examples} examples ({stats.gradient_examples} of gradients, "
                   f"{stats.large_examples} large), {stats.passed} "
                   f"passed, {len(stats.failures)} failures, {len(stats.fuzzer_bugs)} fuzzer bugs, "
                   f"{stats.examples_per_second:.2f} examples/s")
    stats.seconds = time.monotonic() - start
    return stats


def is_fuzzer_bug(failure: BaseException) -> bool:
    """Whether a failed chunk is the fuzzer's own fault: anything but a FuzzMismatch (a program ember got wrong) and
    a FlakyFailure made of FuzzMismatches (ember got a program wrong only sometimes). A FlakyStrategyDefinition
    (the generator drew differently from the same choices) is the generator's fault too."""
    if isinstance(failure, FlakyFailure):
        return not all(isinstance(error, FuzzMismatch) for error in failure.exceptions)
    return not isinstance(failure, FuzzMismatch)


def failure_text(failure: BaseException) -> str:
    """The message of a fuzz failure; a flaky one (failing only sometimes) names itself and shows its programs."""
    if isinstance(failure, FlakyFailure):
        inner = "\n".join(failure_text(error) for error in failure.exceptions)
        return f"FLAKY: the program failed once and then passed when run again\n{inner}"
    return str(failure)


def repeat_command(device: str, chunk_seed: int, max_calls: int = 8) -> str:
    """The sentence with the command that runs a chunk again (its seed is the first one of a new run)."""
    calls = f" --max-calls {max_calls}" if max_calls != 8 else ""
    return f"Repeat it with: python -m ember fuzz --device {device.split(':')[0]} --seed {chunk_seed}{calls} --minutes 1"


def fuzzer_bug_text(failure: BaseException, device: str, chunk_seed: int, max_calls: int = 8) -> str:
    """The report of an error of the fuzzer itself: what raised, the traceback, and the command that repeats it."""
    return (f"the fuzzer itself raised {type(failure).__name__}: {failure}\n"
            f"This is a bug in ember/testing (the program generator or the checking harness), not in {device}. "
            f"{repeat_command(device, chunk_seed, max_calls)}\n"
            + "".join(traceback.format_exception(failure)).rstrip())


WORKER_SECONDS = 300.0  # a fresh worker process every 5 minutes: compiled libraries do not pile up in one process

# Exit statuses of `python -m ember fuzz` (2 is argparse's for a bad command line).
EXIT_CLEAN = 0
EXIT_FINDINGS = 1  # ember disagreed with the reference or torch, raised on a valid program, or crashed
EXIT_FUZZER_BUG = 3  # no finding about ember, but the fuzzer itself failed (its generator or its harness)
EXIT_BAD_DEVICE = 2  # no such backend or device
EXIT_UNAVAILABLE = 77  # the device's backend is not available here: nothing fuzzed (77: "skipped", as in automake)


def main_fuzz(device: str, minutes: float, start_seed: int | None = None, max_calls: int = 8,
              keep_cache: bool = False, other_devices: tuple[str, ...] = ()) -> int:
    """`python -m ember fuzz`: fuzz until the time is up; print every failure; return the exit status.

    The fuzzing runs in worker processes, so a crash of a kernel (a segfault) is reported with the program that
    caused it and the run goes on. Exit status: EXIT_FINDINGS on a mismatch or crash, else EXIT_FUZZER_BUG if the
    fuzzer itself failed, else EXIT_CLEAN; EXIT_UNAVAILABLE (with the reason printed) if the device is not here."""
    import json
    import signal
    import subprocess
    import sys
    import tempfile

    from ember.core.errors import BackendUnavailable, DeviceError
    from ember.scheduler.devices import resolve_device

    try:
        device = resolve_device(device)
        other_devices = tuple(resolve_device(other) for other in other_devices)
    except BackendUnavailable as error:
        print(f"ember fuzz: {error}; nothing fuzzed (exit status {EXIT_UNAVAILABLE}: skipped)", flush=True)
        return EXIT_UNAVAILABLE
    except DeviceError as error:
        print(f"ember fuzz: {error}", flush=True)
        return EXIT_BAD_DEVICE
    if start_seed is None:
        start_seed = int.from_bytes(os.urandom(3), "little")
    also = f" (moving values to {', '.join(other_devices)} too)" if other_devices else ""
    rewrites = "on" if CONFIG.rewrites else "off (EMBER_REWRITES=0)"
    print(f"fuzzing {device}{also} for {minutes:g} minutes from seed {start_seed}, graph rewrites {rewrites}",
          flush=True)
    total = FuzzStats()
    started = time.monotonic()
    deadline = started + minutes * 60
    crashes = 0
    with tempfile.TemporaryDirectory(prefix="ember-fuzz-") as work:
        environment = dict(os.environ)
        if not keep_cache:  # fuzz kernels are one-off: keep them out of the user's kernel cache
            environment["EMBER_CACHE_DIR"] = os.path.join(work, "cache")
        worker = 0
        while (remaining := deadline - time.monotonic()) > 1:
            stats_path, program_path = os.path.join(work, "stats.json"), os.path.join(work, "program.py")
            for path in (stats_path, program_path):
                if os.path.exists(path):
                    os.remove(path)
            worker_seed = start_seed + 10_000 * worker
            # the worker's time is a point on the wall clock: its start-up (imports, devices) counts against it
            until = time.time() + min(remaining, WORKER_SECONDS)
            command = [sys.executable, "-m", "ember.testing.fuzz", "--device", device, "--until", repr(until),
                       "--seed", str(worker_seed),
                       "--max-calls", str(max_calls), "--stats", stats_path, "--program", program_path]
            command += [argument for other in other_devices for argument in ("--with-device", other)]
            result = subprocess.run(command, env=environment)
            worker += 1
            if os.path.exists(stats_path):
                with open(stats_path) as file:
                    done = json.load(file)
                total.examples += done["examples"]
                total.gradient_examples += done["gradient_examples"]
                total.large_examples += done["large_examples"]
                total.large_skipped += done["large_skipped"]
                total.large_beyond_device += done.get("large_beyond_device", 0)
                total.passed += done["passed"]
                total.elements_compared += done["elements_compared"]
                total.elements_uncertain += done["elements_uncertain"]
                total.rewritten_graphs += done.get("rewritten_graphs", 0)
                total.failures += done["failures"]
                total.fuzzer_bugs += done["fuzzer_bugs"]
                continue
            # the worker died: while running a program (its code is still in program_path), or by a signal, is a
            # crash of ember; a worker that exited with a Python traceback between programs is a fuzzer bug
            running = os.path.exists(program_path)
            how = (f"killed by {signal.Signals(-result.returncode).name}" if result.returncode < 0 and
                   -result.returncode in signal.valid_signals() else f"exit status {result.returncode}")
            if running or result.returncode < 0:
                crashes += 1
                program = open(program_path).read() if running else "(no program: it died between programs)"
                message = f"the worker died ({how}) while running:\n{program}"
                total.failures.append(message)
                print(f"CRASH on {device}: {message}", flush=True)
            else:
                message = (f"the fuzz worker (seeds from {worker_seed}) stopped with {how} outside any program "
                           "(its traceback is above): a bug in the fuzzer, not in the device")
                total.fuzzer_bugs.append(message)
                print(f"FUZZER BUG on {device}: {message}", flush=True)
    total.seconds = time.monotonic() - started
    bugs = f", {len(total.fuzzer_bugs)} FUZZER BUGS (in ember/testing, not in {device})" if total.fuzzer_bugs else ""
    skipped = f", {total.large_skipped} large ones skipped for lack of time" if total.large_skipped else ""
    if total.large_beyond_device:
        skipped += (f", {total.large_beyond_device} large ones skipped: larger than the device's largest buffer "
                    f"({largest_buffer(device)} bytes)")
    print(f"done: {total.examples} examples ran ({total.gradient_examples} of gradients, {total.large_examples} "
          f"large{skipped}) in {total.seconds:.0f} s "
          f"({total.examples_per_second:.2f}/s), "
          f"{total.passed} without a mismatch, {len(total.failures)} failures ({crashes} crashes){bugs}; "
          f"{total.elements_compared} output elements compared, {total.elements_uncertain} left uncertain; "
          f"{total.rewritten_graphs} graphs rewritten", flush=True)
    if total.failures:
        return EXIT_FINDINGS
    return EXIT_FUZZER_BUG if total.fuzzer_bugs else EXIT_CLEAN


def _worker(argv: list[str] | None = None) -> int:
    """One fuzz worker process (started by main_fuzz): fuzz, then write the statistics as JSON."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description="one ember fuzz worker")
    parser.add_argument("--device", required=True)
    timing = parser.add_mutually_exclusive_group(required=True)
    timing.add_argument("--seconds", type=float, help="how long to fuzz")
    timing.add_argument("--until", type=float, help="when to stop, as time.time()")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--max-calls", type=int, default=8)
    parser.add_argument("--stats", required=True)
    parser.add_argument("--program", required=True)
    parser.add_argument("--with-device", action="append", default=[])
    arguments = parser.parse_args(argv)
    CurrentProgram.path = arguments.program
    seconds = arguments.seconds if arguments.until is None else arguments.until - time.time()
    stats = fuzz(arguments.device, seconds, arguments.seed, max_calls=arguments.max_calls,
                 report=lambda line: print(line, flush=True), other_devices=tuple(arguments.with_device))
    with open(arguments.stats, "w") as file:
        json.dump({"examples": stats.examples, "gradient_examples": stats.gradient_examples,
                   "large_examples": stats.large_examples, "large_skipped": stats.large_skipped,
                   "large_beyond_device": stats.large_beyond_device, "passed": stats.passed,
                   "elements_compared": stats.elements_compared, "elements_uncertain": stats.elements_uncertain,
                   "failures": stats.failures, "fuzzer_bugs": stats.fuzzer_bugs,
                   "rewritten_graphs": SCHEDULES.rewritten}, file)
    return 0


class CurrentProgram:
    """Where a worker writes the program it is about to run (so a crash can name it); None: nowhere."""

    path: str | None = None

    @classmethod
    @contextmanager
    def running(cls, code: Callable[[], str]) -> Iterator[None]:
        """Keep the program's code in `path` while it runs: only a worker that dies meanwhile leaves it there."""
        if cls.path is None:
            yield
            return
        with open(cls.path, "w") as file:
            file.write(code())
        try:
            yield
        finally:
            os.remove(cls.path)


if __name__ == "__main__":
    import sys

    # run the worker of the imported module, not of __main__: the gradient fuzzer imports ember.testing.fuzz, and
    # its FuzzMismatch and CurrentProgram must be the classes the worker catches and fills
    from ember.testing import fuzz as imported

    sys.exit(imported._worker())
