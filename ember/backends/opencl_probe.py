"""Which vector forms an OpenCL driver builds and runs correctly: probed in a child process, cached on disk.

A driver's compiler can abort the process using it (PoCL 3.0 with LLVM 14 on an AVX-512 CPU: `LLVM ERROR: Cannot
select ... fsqrt` for a 16-wide sqrt), and PoCL compiles lazily: clBuildProgram makes LLVM IR, machine code comes at
kernel creation or at the first launch of each local size. So before ember emits a vector form on a device, a child
process (`python -m ember.backends.opencl_probe`: a new interpreter, never a fork of one holding an OpenCL context)
tries every case, (op of the renderer's vector table `VECTOR_OPS`, dtype, width): the cases of one dtype and width
as one program with one kernel (a unit), built, created, launched once with the largest local size ember uses, and
its values checked against the numpy reference tensor's table of ops. The child reports each step on its own line
as it goes, so a crash or a hang, which kills only the child, is blamed on the unit it was on (see `probe_cases`).
The common case costs one child; a bad op costs a few more, and a narrower width is probed for it.

Verdicts are cached per (device, driver, platform, build options, digest of the renderer's code) in
`<cache dir>/opencl-probe/*.json`, with a checksum: an entry that does not check is deleted and probed again.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ember import cache
from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.errors import BackendUnavailable
from ember.core.ops import BINARY_OPS, COMPARISON_OPS, REDUCE_OPS, UNARY_OPS, Op
from ember.ir.ir import BufferParam, Builder, IRNode, IROp, KernelIR
from ember.ir.vectorize import SCALAR_CONDITION, VECTOR_DTYPES

PROBE_FORMAT = 1
WORK_ITEMS = 32  # one work group as large as the largest local size ember launches (opencl.LOCAL_SIZE)
REDUCE_ROWS = 3
INPUTS = 4  # input vectors of each case (WHERE reads four)
CHILD_TIMEOUT_SECONDS = 300.0  # a compiler that hangs this long counts as a crash of the case it was on
# test hook: "OP:WIDTH" makes the child abort (os.abort) before creating a kernel that has a case of that op and
# width, "OP:WIDTH:build" before building its program; comma-separated
CRASH_VARIABLE = "EMBER_OPENCL_PROBE_CRASH"
VECTOR_WIDTH_VARIABLE = "EMBER_OPENCL_VECTOR_WIDTH"  # float32 lanes of ember's vectors, instead of the device's
VECTOR_WIDTHS = (1, 2, 4, 8, 16)  # OpenCL's vector sizes that ember uses (1: no vectors)
OK = "ok"
TOLERANCES = {dtypes.float32: (1e-5, 1e-6), dtypes.float64: (1e-12, 1e-14)}  # (relative, absolute)
MASK_OPS = frozenset({Op.AND, Op.OR})  # probed on the masks of comparisons, the only vectors of them ember packs here
SCALAR_WHERE = "SCALAR_WHERE"  # the case name of vectorize.SCALAR_CONDITION: a select of vectors by one condition


def op_name(op: Any) -> str:
    """A vector op's name in probe cases (IROp.LOAD -> "LOAD", Op.SQRT -> "SQRT", SCALAR_CONDITION -> SCALAR_WHERE)."""
    return SCALAR_WHERE if op == SCALAR_CONDITION else op.name


@dataclass(frozen=True, order=True)
class ProbeCase:
    """One vector form: an op of the renderer's vector table on vectors of `width` float32 lanes of one dtype."""

    op: str  # the op's name (IROp.LOAD -> "LOAD", Op.SQRT -> "SQRT")
    dtype: str
    width: int  # vector register width in float32 lanes (DeviceInfo.preferred_vector_width); float64 has half

    @property
    def name(self) -> str:
        return f"probe_{self.op.lower()}_{self.dtype}_x{self.lanes}"

    @property
    def lanes(self) -> int:
        return self.width * 4 // dtypes.DTYPES_BY_NAME[self.dtype].itemsize


def cases_for(vector_ops: frozenset, width: int, has_fp64: bool) -> list[ProbeCase]:
    """Every case of one width: each op the renderer emits on vectors, on each vector dtype with 2 lanes or more."""
    vector_dtypes = [dtype for dtype in sorted(VECTOR_DTYPES, key=lambda d: d.itemsize)
                     if has_fp64 or dtype != dtypes.float64]
    cases = [ProbeCase(op_name(op), dtype.name, width) for op in vector_ops for dtype in vector_dtypes]
    return sorted(case for case in cases if case.lanes >= 2)


# ---- the kernels of cases and the values they must give -------------------------------------------------------


def case_expression(op: Any) -> tuple:
    """The expression a case computes, as a tree: (op, *operands); an int is an input vector, a float a constant.
    Ops with a bool result feed a select (vectors of bools are masks, never stored)."""
    if op is Op.WHERE:
        return (Op.WHERE, (Op.CMPLT, 0, 1), 2, 3)
    if op is Op.CMPEQ:  # x == x: true but in the NaN lane (inputs of two rows never hold one value in one lane)
        return (Op.WHERE, (op, 0, 0), 1.0, 0.0)
    if op in COMPARISON_OPS:
        return (Op.WHERE, (op, 0, 1), 1.0, 0.0)
    if op in MASK_OPS:  # masks combined (the lanes of comparisons: signed integers as wide as the values compared)
        return (Op.WHERE, (op, (Op.CMPLT, 0, 1), (Op.CMPLT, 2, 3)), 1.0, 0.0)
    if op in UNARY_OPS:
        return (op, 0)
    if op in BINARY_OPS:
        return (op, 0, 1)
    raise NotImplementedError(f"the OpenCL vector probe has no case for {op}: add one to case_expression")


def probe_inputs(count: int, dtype: DType) -> np.ndarray:
    """INPUTS deterministic vectors of `count` values, one after another: the first in (-1.97, 1.97) with a NaN, the
    others in (0.28, 4.22), exact in binary, never 0; neighbouring lanes all differ."""
    positions = np.arange(count)
    inputs = []
    for index in range(INPUTS):
        steps = ((positions * (7 + 2 * index) + 3 * index) % 64 + 0.5) / 16
        values = (steps - 2.0 if index == 0 else steps + 0.25).astype(dtype.numpy)
        if index == 0:
            values[1] = np.nan
        inputs.append(values)
    return np.concatenate(inputs)


def unit_kernel(unit: tuple[ProbeCase, ...], name: str) -> tuple[KernelIR, np.ndarray, dict[ProbeCase, slice],
                                                                  np.ndarray]:
    """One kernel computing every case of a unit (cases of one dtype and width): the kernel, its input, where each
    case's results lie in the output, and the expected output. One work item per vector, WORK_ITEMS of them."""
    dtype, lanes = dtypes.DTYPES_BY_NAME[unit[0].dtype], unit[0].lanes
    count = WORK_ITEMS * lanes
    builder = Builder()
    global_id = builder.global_id(WORK_ITEMS, dtypes.int32)
    origin = builder.mul(global_id, lanes)
    output, source = builder.param(0, dtype, True), builder.param(1, dtype, False)
    inputs = probe_inputs(count, dtype)
    stores: list[IRNode] = []
    expected: list[np.ndarray] = []
    regions: dict[ProbeCase, slice] = {}
    for case in unit:
        offset = sum(values.size for values in expected)
        values = _case(builder, case, source, output, origin, offset, inputs.reshape(INPUTS, count), stores)
        regions[case] = slice(offset, offset + values.size)
        expected.append(values.astype(dtype.numpy))
    wanted = np.concatenate(expected)
    params = [BufferParam(0, dtype, wanted.size, True), BufferParam(1, dtype, inputs.size, False)]
    kernel = KernelIR(name, params, WORK_ITEMS, builder.sink(stores), dtypes.int32)
    return kernel, inputs, regions, wanted


def _case(builder: Builder, case: ProbeCase, source: IRNode, output: IRNode, origin: IRNode, offset: int,
          inputs: np.ndarray, stores: list[IRNode]) -> np.ndarray:
    """Add the stores of one case (its results from `offset` on) and return the values they must store."""
    from ember.backends.opencl import VECTOR_OPS

    op = {op_name(entry): entry for entry in VECTOR_OPS}[case.op]
    dtype, lanes, count = dtypes.DTYPES_BY_NAME[case.dtype], case.lanes, inputs.shape[1]

    def load(row: IRNode | int, valid: IRNode | None = None) -> IRNode:
        start = builder.add(builder.mul(row, count), origin) if isinstance(row, IRNode) else builder.add(
            origin, row * count)
        return builder.vector_load(source, start, valid, lanes)

    def store(number: int, value: IRNode) -> None:
        stores.append(builder.store(output, builder.add(origin, offset + number * count), value))

    if op is IROp.LOAD:  # vectors in memory and their lanes (every vector kernel needs them): a guarded load (the
        # last work item's vector is not valid and reads as zeros), a round trip through a private scratch array
        # (ir/stage.py), and the lanes of a vector reversed (lane reads, a vector built from scalars)
        store(0, load(0, builder.less(builder.global_id(WORK_ITEMS, dtypes.int32), WORK_ITEMS - 1)))
        row = builder.new_range(REDUCE_ROWS, dtypes.int32)
        scratch = builder.define_local(dtype, REDUCE_ROWS * lanes)
        filled = builder.after(scratch, [builder.loop([builder.store(scratch, builder.mul(row, lanes), load(row))],
                                                      (row,))])
        store(1, builder.vector_load(filled, builder.const(lanes, dtypes.int32), None, lanes))
        vector = load(2)
        store(2, builder.vectorize([builder.gep(vector, lanes - 1 - lane) for lane in range(lanes)]))
        guarded = inputs[0].copy()
        guarded[-lanes:] = 0
        return np.concatenate([guarded, inputs[1], inputs[2].reshape(-1, lanes)[:, ::-1].reshape(-1)])
    if op == SCALAR_CONDITION:  # one condition for every lane of a work item's vectors: the first half of the work
        # items select the third input's vector, the others the fourth's (a padded axis' bound, a causal mask's row)
        first_half = builder.less(builder.global_id(WORK_ITEMS, dtypes.int32), WORK_ITEMS // 2)
        store(0, builder.vector_alu(Op.WHERE, dtype, first_half, load(2), load(3)))
        half = WORK_ITEMS // 2 * lanes
        return np.concatenate([inputs[2][:half], inputs[3][half:]])
    if op is IROp.REDUCE:  # each reduce op over the first REDUCE_ROWS inputs, one after another
        row = builder.new_range(REDUCE_ROWS, dtypes.int32)
        reduce_ops = sorted(REDUCE_OPS, key=lambda reduce_op: reduce_op.name)
        for number, reduce_op in enumerate(reduce_ops):
            store(number, builder.reduce(reduce_op, load(row), (row,)))
        return np.concatenate([_reference(reduce_op, [inputs[:REDUCE_ROWS]], (0,), dtype).reshape(-1)
                               for reduce_op in reduce_ops])
    expression = case_expression(op)
    store(0, _build(builder, expression, load, lanes, dtype))
    return _evaluate(expression, inputs, dtype)


def _build(builder: Builder, expression: Any, load: Any, lanes: int, dtype: DType) -> IRNode:
    if isinstance(expression, int):
        return load(expression)
    if isinstance(expression, float):
        return builder.vectorize([builder.const(expression, dtype)] * lanes)
    op, *operands = expression
    sources = [_build(builder, operand, load, lanes, dtype) for operand in operands]
    return builder.vector_alu(op, _result_dtype(op, dtype), *sources)


def _evaluate(expression: Any, inputs: np.ndarray, dtype: DType) -> np.ndarray:
    if isinstance(expression, int):
        return inputs[expression]
    if isinstance(expression, float):
        return np.full(inputs.shape[1], expression, dtype=dtype.numpy)
    op, *operands = expression
    sources = [_evaluate(operand, inputs, dtype) for operand in operands]
    return _reference(op, sources, None, _result_dtype(op, dtype))


def _result_dtype(op: Op, dtype: DType) -> DType:
    """The dtype of a case expression's op on values of `dtype`: bool for comparisons and masks combined."""
    return dtypes.bool_ if op in COMPARISON_OPS | MASK_OPS else dtype


def _reference(op: Op, sources: list[np.ndarray], arg: Any, dtype: DType) -> np.ndarray:
    """One op by the numpy reference tensor's table (the independent truth the tests use too)."""
    from ember.testing.reference import Output, evaluate

    source_dtypes = tuple(dtypes.from_numpy(source.dtype) for source in sources)
    shape = np.broadcast_shapes(*(source.shape for source in sources))
    if arg is not None:
        shape = tuple(1 if axis in arg else size for axis, size in enumerate(shape))
    return evaluate(op, sources, arg, Output(shape, dtype, source_dtypes))


def check_values(case: ProbeCase, result: np.ndarray, expected: np.ndarray) -> str:
    """OK, or what differs."""
    relative, absolute = TOLERANCES[dtypes.DTYPES_BY_NAME[case.dtype]]
    close = np.isclose(result, expected, rtol=relative, atol=absolute, equal_nan=True)
    if close.all():
        return OK
    position = int(np.argmin(close))
    return f"wrong values: element {position} is {result[position]!r}, expected {expected[position]!r}"


# ---- the child: build, create, launch, check; one line per event on stdout ----------------------------------


def crash_hooks() -> set[tuple[str, int, str]]:
    """(op, width, phase) of EMBER_OPENCL_PROBE_CRASH: where a child aborts on purpose (tests only)."""
    hooks = set()
    for entry in filter(None, (part.strip() for part in os.environ.get(CRASH_VARIABLE, "").split(","))):
        op, width, *phase = entry.split(":")
        hooks.add((op.upper(), int(width), phase[0] if phase else "launch"))
    return hooks


def _find_device(request: dict[str, Any]) -> Any:
    import pyopencl as cl

    matches = [device for platform in cl.get_platforms() if platform.name == request["platform"]
               for device in platform.get_devices() if device.name == request["device"]]
    return matches[min(request["index"], len(matches) - 1)]


def child_main() -> int:
    """Run the units of the request on stdin, each as its own program (so a crash in any step, the build included,
    is the current unit's). Prints `ready`, then per unit `start N`, then `ok CASE` or `failed CASE WHY` for each of
    its cases or `unit-failed N WHY`, and `done N`."""
    import pyopencl as cl

    from ember.backends.opencl import LOCAL_SIZE, OpenCLRenderer

    request = json.loads(sys.stdin.read())
    cl_device = _find_device(request)
    if request.get("smoke"):
        return _smoke_child(cl_device, request["options"])
    units = [tuple(ProbeCase(*entry) for entry in unit) for unit in request["units"]]
    hooks = crash_hooks()
    renderer = OpenCLRenderer(has_fp64=request["has_fp64"])
    context = cl.Context([cl_device])
    queue = cl.CommandQueue(context)
    flags = cl.mem_flags
    print("ready", flush=True)
    for number, unit in enumerate(units):
        print(f"start {number}", flush=True)
        kernel_ir, inputs, regions, expected = unit_kernel(unit, f"probe_unit{number}")
        try:
            if any((case.op, case.width, "build") in hooks for case in unit):
                os.abort()
            program = cl.Program(context, renderer.render(kernel_ir)).build(options=request["options"])
            if any((case.op, case.width, "launch") in hooks for case in unit):
                os.abort()
            kernel = cl.Kernel(program, kernel_ir.name)
            limit = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, cl_device)
            local = max(1, min(LOCAL_SIZE, WORK_ITEMS, cl_device.max_work_group_size, limit))
            output = np.zeros_like(expected)
            buffers = [cl.Buffer(context, flags.WRITE_ONLY, output.nbytes),
                       cl.Buffer(context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=inputs)]
            kernel.set_args(*buffers)
            cl.enqueue_nd_range_kernel(queue, kernel, (-(-WORK_ITEMS // local) * local,), (local,))
            cl.enqueue_copy(queue, output, buffers[0], is_blocking=True)
        except (cl.RuntimeError, cl.LogicError, cl.MemoryError) as error:
            print(f"unit-failed {number} the driver failed: {_one_line(error)}", flush=True)
        else:
            for case, region in regions.items():
                verdict = check_values(case, output[region], expected[region])
                print(f"ok {case.name}" if verdict == OK else f"failed {case.name} {verdict}", flush=True)
        print(f"done {number}", flush=True)
    return 0


def smoke_kernel() -> tuple[KernelIR, np.ndarray, np.ndarray]:
    """A plain scalar kernel (out[i] = in[i] * 2 + 1 on float32), its input and the values it must give."""
    builder = Builder()
    index = builder.global_id(WORK_ITEMS, dtypes.int32)
    output, source = builder.param(0, dtypes.float32, True), builder.param(1, dtypes.float32, False)
    value = builder.alu(Op.ADD, dtypes.float32, builder.alu(Op.MUL, dtypes.float32, builder.load(source, index, None),
                                                             builder.const(2.0, dtypes.float32)),
                        builder.const(1.0, dtypes.float32))
    params = [BufferParam(0, dtypes.float32, WORK_ITEMS, True), BufferParam(1, dtypes.float32, WORK_ITEMS, False)]
    kernel = KernelIR("probe_smoke", params, WORK_ITEMS, builder.sink([builder.store(output, index, value)]),
                      dtypes.int32)
    inputs = np.arange(WORK_ITEMS, dtype=np.float32)
    return kernel, inputs, inputs * 2 + 1


def _smoke_child(cl_device: Any, options: list[str]) -> int:
    """Build, create and launch the smoke kernel once (a driver that aborts takes only this process down)."""
    import pyopencl as cl

    from ember.backends.opencl import OpenCLRenderer

    print("ready", flush=True)
    print("start 0", flush=True)
    kernel_ir, inputs, expected = smoke_kernel()
    try:
        context = cl.Context([cl_device])
        queue = cl.CommandQueue(context)
        program = cl.Program(context, OpenCLRenderer(has_fp64=False).render(kernel_ir)).build(options=options)
        kernel = cl.Kernel(program, kernel_ir.name)
        output = np.zeros_like(expected)
        flags = cl.mem_flags
        buffers = [cl.Buffer(context, flags.WRITE_ONLY, output.nbytes),
                   cl.Buffer(context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=inputs)]
        kernel.set_args(*buffers)
        cl.enqueue_nd_range_kernel(queue, kernel, (WORK_ITEMS,), None)
        cl.enqueue_copy(queue, output, buffers[0], is_blocking=True)
    except (cl.RuntimeError, cl.LogicError, cl.MemoryError) as error:
        print(f"unit-failed 0 {_build_error(error)}", flush=True)
    else:
        wrong = np.flatnonzero(output != expected)
        print("ok smoke" if wrong.size == 0 else f"failed smoke wrong values: element {wrong[0]} is "
              f"{output[wrong[0]]!r}, expected {expected[wrong[0]]!r}", flush=True)
    print("done 0", flush=True)
    return 0


def _build_error(error: object) -> str:
    """A driver's error on one line, its `error:` lines first (what the compiler said, not the call that failed)."""
    lines = [line.strip() for line in str(error).splitlines()]
    said = [line for line in lines if "error:" in line.lower() and "failed" not in line.lower()[:30]]
    return _one_line("; ".join(said) if said else error)


def _one_line(text: object, limit: int = 300) -> str:
    return " ".join(str(text).split())[:limit]


# ---- the parent: run children, blame cases ---------------------------------------------------------------------


@dataclass
class ProbeReport:
    """The verdict of every case probed (OK or why it is unusable), and what probing cost in this process."""

    verdicts: dict[ProbeCase, str] = field(default_factory=dict)
    children: int = 0
    seconds: float = 0.0


@dataclass
class ChildResult:
    verdicts: dict[str, str]  # case name -> verdict from the values of a unit that ran
    unit_failures: dict[int, str]  # unit number -> why its kernel could not be created or launched
    current: int | None  # the unit it had started and not finished
    clean: bool  # exited with status 0 after reporting every unit
    detail: str  # how it ended: the signal or status and the last line of its error output
    started: bool  # it found the device (else its failure is no verdict on any case)


def run_child(target: dict[str, Any], units: list[tuple[ProbeCase, ...]], smoke: bool = False) -> ChildResult:
    """Run a child process on the units (or the smoke kernel) and read what it reported, however it ended."""
    request = json.dumps({**target, "smoke": smoke,
                          "units": [[[case.op, case.dtype, case.width] for case in unit] for unit in units]})
    environment = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # the child imports this same ember
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, (package_root, environment.get("PYTHONPATH"))))
    try:
        finished = subprocess.run([sys.executable, "-m", "ember.backends.opencl_probe"], input=request,
                                  capture_output=True, text=True, env=environment, timeout=CHILD_TIMEOUT_SECONDS)
        stdout, stderr, status = finished.stdout, finished.stderr, finished.returncode
    except subprocess.TimeoutExpired as error:
        stdout, stderr, status = _text(error.stdout), _text(error.stderr), None
    result = ChildResult({}, {}, None, False, "", False)
    done = set()
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "ready":
            result.started = True
        elif word == "start":
            result.current = int(rest)
        elif word == "done":
            done.add(int(rest))
            result.current = None
        elif word in ("ok", "failed"):
            name, _, reason = rest.partition(" ")
            result.verdicts[name] = OK if word == "ok" else reason
        elif word == "unit-failed":
            number, _, reason = rest.partition(" ")
            result.unit_failures[int(number)] = reason
    last_error = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    if status is None:
        result.detail = f"the compiler hung (killed after {CHILD_TIMEOUT_SECONDS:.0f} s)"
    elif status < 0:
        result.detail = f"the driver crashed the process ({_signal_name(-status)}"
        result.detail += f": {_one_line(last_error, 200)})" if last_error else ")"
    else:
        result.detail = f"the probe process exited with status {status}" + (
            f": {_one_line(last_error, 200)}" if last_error else "")
    result.clean = status == 0 and len(done) == (1 if smoke else len(units))
    return result


def _text(value: str | bytes | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def probe_cases(target: dict[str, Any], cases: list[ProbeCase]) -> ProbeReport:
    """The verdict of each case, from as few children as failures allow. All cases of one dtype and width form one
    unit (one program, one kernel), and the first child runs every unit. A unit that fails or crashes is split into
    one unit per case; once a case is found bad, the cases of its op leave the other units too, and run last (a
    driver that fails an op on one dtype often fails it on the others). After a crash, the units not done run again
    in a new child; a crash at exit (no unit to blame but those that failed catchably, which a driver may abort for
    later) runs every unit not blamed again, and if none failed, splits the units in halves."""
    report, start = ProbeReport(), time.perf_counter()
    by_dtype_width: dict[tuple[str, int], list[ProbeCase]] = {}
    for case in cases:
        by_dtype_width.setdefault((case.dtype, case.width), []).append(case)
    pending = [[tuple(unit) for unit in by_dtype_width.values()]] if cases else []
    while pending:
        units = pending.pop()
        result = run_child(target, units)
        report.children += 1
        if not result.started:
            raise RuntimeError(f"the OpenCL vector probe could not start: {result.detail}")
        blamed = dict(result.unit_failures)
        if result.current is not None:
            blamed[result.current] = result.detail
        if not result.clean and not blamed:  # a crash after every unit was done: bisect
            if len(units) > 1:
                pending.extend([units[len(units) // 2:], units[:len(units) // 2]])
            elif len(units[0]) > 1:
                pending.append([(case,) for case in units[0]])
            else:
                report.verdicts[units[0][0]] = result.detail
            continue
        again: list[tuple[ProbeCase, ...]] = []
        for number, unit in enumerate(units):
            if number in blamed:
                reason = blamed[number] if result.clean or number == result.current else (
                    f"{blamed[number]}; then {result.detail}")
                if len(unit) == 1:
                    report.verdicts[unit[0]] = reason
                else:
                    again.extend((case,) for case in unit)
                continue
            for case in unit:  # wrong values are a verdict; right ones too unless the child crashed at exit
                verdict = result.verdicts.get(case.name)
                if verdict is not None and (result.clean or result.current is not None or verdict != OK):
                    report.verdicts[case] = verdict
            rest = tuple(case for case in unit if case not in report.verdicts)
            if rest:
                again.append(rest)
        if again:
            pending.append(_suspects_last(again, {case.op for case, verdict in report.verdicts.items()
                                                  if verdict != OK}))
    report.seconds = time.perf_counter() - start
    return report


def _suspects_last(units: list[tuple[ProbeCase, ...]], bad_ops: set[str]) -> list[tuple[ProbeCase, ...]]:
    """The units with each case of an op found bad elsewhere taken out into a unit of its own, at the end."""
    kept: list[tuple[ProbeCase, ...]] = []
    suspects: list[tuple[ProbeCase, ...]] = []
    for unit in units:
        suspect = tuple(case for case in unit if case.op in bad_ops)
        rest = tuple(case for case in unit if case.op not in bad_ops)
        if rest:
            kept.append(rest)
        suspects.extend((case,) for case in suspect)
    return kept + suspects


# ---- the cache --------------------------------------------------------------------------------------------


def renderer_digest() -> str:
    """A digest of the code that decides what OpenCL source ember emits, and of this probe."""
    folder = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in ("opencl.py", "c_style.py", "opencl_probe.py"):
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes())
    return digest.hexdigest()[:16]


def cache_path(key: str) -> Path:
    return cache.entry_path("opencl-probe", key)


def load_verdicts(path: Path, key: str) -> dict[str, str]:
    """The cached verdicts by case name; an entry that fails ember/cache.py's checks, or of another probe format
    or key, is deleted (and so probed again), never trusted."""
    payload = cache.read_entry(path)
    if payload is None:
        return {}
    try:
        entry = json.loads(payload)
        verdicts = entry["verdicts"]
        if (entry["format"] != PROBE_FORMAT or entry["key"] != key or not isinstance(verdicts, dict)
                or not all(isinstance(value, str) for value in verdicts.values())):
            raise ValueError("not a valid probe cache entry")
        return verdicts
    except (ValueError, KeyError, TypeError):
        cache.discard(path)
        return {}


def store_verdicts(path: Path, key: str, verdicts: dict[str, str]) -> None:
    entry = {"format": PROBE_FORMAT, "key": key, "verdicts": verdicts}
    cache.write_entry(path, json.dumps(entry, indent=1, sort_keys=True).encode())


def cached_probe(target: dict[str, Any], key: str, cases: list[ProbeCase]) -> ProbeReport:
    """The verdicts of the cases: from the cache, probing (and caching) the ones it lacks."""
    path = cache_path(key)
    stored = load_verdicts(path, key)
    missing = [case for case in cases if case.name not in stored]
    report = probe_cases(target, missing) if missing else ProbeReport()
    if missing:
        stored = {**load_verdicts(path, key), **stored, **{case.name: verdict
                                                           for case, verdict in report.verdicts.items()}}
        store_verdicts(path, key, stored)
    report.verdicts = {case: stored[case.name] for case in cases}
    return report


# ---- whether a device builds anything at all -------------------------------------------------------------------

POCL_PLATFORM = "Portable Computing Language"
SMOKE_FORMAT = 1
_BUILDS: dict[str, str] = {}  # smoke key -> OK or why the device builds nothing (this process's answers)


def linker_problem(platform_name: str) -> str | None:
    """Why a platform's compiler cannot link kernels here, where that can be told without building one: PoCL links
    each kernel's machine code into a shared library with the system linker `ld`, and aborts the process without
    it (no error a caller could catch)."""
    import shutil

    if platform_name.startswith(POCL_PLATFORM) and shutil.which("ld") is None:
        return ("PoCL links every kernel with the system linker 'ld', which is not on PATH (install binutils, or put "
                "the folder holding ld on PATH)")
    return None


def check_builds(cl_device: Any, options: list[str]) -> None:
    """Raise BackendUnavailable (with the driver's reason) unless the device's compiler builds, creates and runs a
    plain kernel: tried in a child process (a driver that aborts takes only the child down), once per device,
    driver and linker, the verdict cached on disk (a hang is not cached)."""
    import shutil

    platform = cl_device.platform
    where = f"{cl_device.name.strip()} ({platform.name.strip()})"
    problem = linker_problem(platform.name)
    if problem is not None:
        raise BackendUnavailable(f"{where} cannot build kernels: {problem}")
    key = "|".join((f"smoke {SMOKE_FORMAT}", cl_device.name, cl_device.driver_version, platform.name,
                    platform.version, " ".join(options), str(shutil.which("ld")), renderer_digest()))
    verdict = _BUILDS.get(key)
    if verdict is None:
        path = cache.entry_path("opencl-probe", key)
        payload = cache.read_entry(path)
        verdict = payload.decode(errors="replace") if payload is not None else None
        if verdict is None:
            verdict, lasting = _smoke(cl_device, options)
            if lasting:
                cache.write_entry(path, verdict.encode())
        _BUILDS[key] = verdict
    if verdict != OK:
        raise BackendUnavailable(f"{where} cannot build a plain kernel: {verdict}")


def _smoke(cl_device: Any, options: list[str]) -> tuple[str, bool]:
    """(OK or why not, whether that verdict lasts): the smoke kernel run in a child process."""
    platform = cl_device.platform
    alike = [device for device in platform.get_devices() if device.name == cl_device.name]
    target = {"platform": platform.name, "device": cl_device.name, "has_fp64": False, "options": options,
              "index": alike.index(cl_device) if cl_device in alike else 0}
    result = run_child(target, [], smoke=True)
    if result.clean and result.verdicts.get("smoke") is not None:
        return result.verdicts["smoke"], True
    if result.unit_failures.get(0):
        return result.unit_failures[0], True
    return result.detail, result.started and "hung" not in result.detail  # (a child that did not start: no verdict)


# ---- what a device may use -----------------------------------------------------------------------------------


@dataclass
class VectorSupport:
    """The widths (float32 lanes) ember may use on a device and the ops usable at each, from the probe."""

    width: int  # the widest width whose vector loads work (1: none)
    ops: frozenset  # the ops usable at that width
    fallbacks: tuple[tuple[int, frozenset], ...]  # narrower widths with ops the wider ones lack, widest first
    failures: list[str]  # "SQRT float32 x16: why", one per unusable case
    report: ProbeReport


def usable_ops(vector_ops: frozenset, verdicts: dict[ProbeCase, str], width: int) -> frozenset:
    """The ops all of whose cases at this width passed."""
    return frozenset(op for op in vector_ops
                     if all(verdict == OK for case, verdict in verdicts.items()
                            if case.width == width and case.op == op_name(op)))


def vector_support(target: dict[str, Any], key: str, vector_ops: frozenset, preferred: int,
                   has_fp64: bool) -> VectorSupport:
    """Probe the preferred width and the next narrower one, each in its own child (together, a driver that crashes
    on the wide vectors took the narrow cases down with it: 16 children instead of 10); while some op works at no
    width probed yet, the narrower widths after them too. The next narrower width is offered even with no op the
    preferred one lacks: lowering refuses tiles too long to lower (ir/opt.py MAX_LOWERED_STEPS), and a kernel whose
    tile of the wide vectors is refused fits in the narrower ones instead of falling back to scalars (PoCL: a 4096 x
    1024 softmax in float16 was refused, its scalar row loop called exp2 lane by lane, 129 ms; in float8 13 ms)."""
    widths = [width for width in (16, 8, 4, 2) if width <= preferred]
    report, usable = ProbeReport(), {}
    if not widths:
        return VectorSupport(1, frozenset(), (), [], report)
    for width in widths:
        partial = cached_probe(target, key, cases_for(vector_ops, width, has_fp64))
        report.verdicts.update(partial.verdicts)
        report.children += partial.children
        report.seconds += partial.seconds
        usable[width] = usable_ops(vector_ops, report.verdicts, width)
        if len(usable) >= 2 and all(any(op in ops for ops in usable.values()) for op in vector_ops):
            break
    loads = [width for width, ops in usable.items() if IROp.LOAD in ops]
    failures = [f"{case.op} {case.dtype} x{case.lanes}: {verdict}" for case, verdict in sorted(report.verdicts.items())
                if verdict != OK]
    if not loads:
        return VectorSupport(1, frozenset(), (), failures, report)
    width = loads[0]
    fallbacks, covered = [], set(usable[width])
    for narrower in loads[1:]:
        if usable[narrower] - covered or narrower == loads[1]:
            fallbacks.append((narrower, usable[narrower]))
            covered |= usable[narrower]
    return VectorSupport(width, usable[width], tuple(fallbacks), failures, report)


_SUPPORT: dict[tuple[str, int, bool], VectorSupport] = {}  # what this process probed or read already, by key


def device_vector_support(cl_device: Any, preferred: int, has_fp64: bool, options: list[str]) -> VectorSupport:
    """The vector support of an OpenCL device (probed once per device, driver and renderer code, then read from the
    cache; once per process from memory)."""
    from ember.backends.opencl import VECTOR_OPS

    platform = cl_device.platform
    key = "|".join((f"format {PROBE_FORMAT}", cl_device.name, cl_device.driver_version, platform.name,
                    platform.version, " ".join(options), renderer_digest()))
    if os.environ.get(CRASH_VARIABLE):  # verdicts of injected crashes are never mistaken for the driver's
        key += f"|{CRASH_VARIABLE}={os.environ[CRASH_VARIABLE]}"
    remembered = _SUPPORT.get((key, preferred, has_fp64))
    if remembered is not None:
        return remembered
    alike = [device for device in platform.get_devices() if device.name == cl_device.name]
    target = {"platform": platform.name, "device": cl_device.name, "has_fp64": has_fp64, "options": options,
              "index": alike.index(cl_device) if cl_device in alike else 0}
    support = vector_support(target, key, VECTOR_OPS, preferred, has_fp64)
    _SUPPORT[(key, preferred, has_fp64)] = support
    return support


def vector_width(device_width: int) -> int:
    """The float32 lanes of the vectors ember emits: EMBER_OPENCL_VECTOR_WIDTH, else the device's preferred width
    (rounded down to one of VECTOR_WIDTHS)."""
    text = os.environ.get(VECTOR_WIDTH_VARIABLE, "").strip()
    if not text:
        return max(width for width in VECTOR_WIDTHS if width <= max(1, device_width))
    if not text.isdigit() or int(text) not in VECTOR_WIDTHS:
        raise BackendUnavailable(f"{VECTOR_WIDTH_VARIABLE}={text!r} is not a vector width ember uses: "
                                 f"{', '.join(map(str, VECTOR_WIDTHS))} float32 lanes (1: no vectors)")
    return int(text)


def vector_capabilities(cl_device: Any, device_width: int, has_fp64: bool) -> dict[str, Any]:
    """The DeviceInfo fields on vectors: only the vector forms the device's compiler built and ran correctly in the
    probe (a child process, cached on disk: opencl_probe.py), widest first."""
    from ember.backends.opencl import VECTOR_OPS, build_options

    width = vector_width(device_width)
    fields: dict[str, Any] = {"preferred_vector_width": width, "vector_ops": frozenset(),
                              "fallback_vector_widths": ()}
    if width < 2:
        return fields
    try:
        support = device_vector_support(cl_device, width, has_fp64, build_options(cl_device))
    except (RuntimeError, OSError) as error:  # the probe itself could not run: no vectors, said once
        warnings.warn(f"ember: {cl_device.name.strip()}: OpenCL vector types are not used, the vector probe "
                      f"failed: {error}", RuntimeWarning, stacklevel=2)
        return fields
    described = [f"{support.width} float32 lanes: " + (
        "every vector op" if support.ops == VECTOR_OPS else ", ".join(sorted(op_name(op) for op in support.ops)))]
    described += [f"{narrower} lanes: " + (", ".join(sorted(op_name(op) for op in ops - support.ops))
                                            or "the same ops, for tiles too long in the wider vectors")
                  for narrower, ops in support.fallbacks]
    fields.update(preferred_vector_width=support.width if support.ops else width, vector_ops=support.ops,
                  fallback_vector_widths=support.fallbacks)
    fields["extra"] = {"vector_widths": "; ".join(described) if support.ops else "none (the probe failed them all)",
                       "vector_probe": (f"{support.report.children} child process(es), {support.report.seconds:.1f} s"
                                        if support.report.children else "from the cache")}
    if support.failures:
        fields["extra"]["vector_probe_failures"] = support.failures
    return fields


if __name__ == "__main__":
    sys.exit(child_main())
