"""The cuda backend without a GPU: PTX of every primitive op and dtype assembled by ptxas (sm_75, sm_80, sm_90),
the driver-API code path run against a fake driver that executes the PTX in tests/ptx_simulator.py, the
unavailable reason, and the float64/float32 math expansions the PTX renderer relies on (checked on the C backend).
The PTX of every kernel the whole test session compiles is assembled too, by tests/kernel_recorder.py."""

from __future__ import annotations

import ctypes
import itertools
import math
import warnings
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

import ember as em
from ember.backends import cuda, ptx
from ember.backends.c import CDevice
from ember.backends.registry import REGISTRY
from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.errors import BackendUnavailable
from ember.core.ops import BINARY_OPS, FLOAT_ONLY_OPS, INT_ONLY_OPS, Op
from ember.ir.ir import BufferParam, Builder, IRNode, KernelIR
from ember.ir.libm import expand_math
from ember.capture.arena import ArenaView
from ember.scheduler.executor import JoinedLaunches
from tests.helpers import assert_close, random_array
from tests.ptx_simulator import Machine, Module

needs_ptxas = pytest.mark.skipif(ptx.ptxas_path() is None, reason="ptxas (CUDA toolkit) is not on PATH")
ALL = dtypes.ALL_DTYPES


# ---- kernels built directly in the IR: one per (op, dtype) ------------------------------------------------------


def _kernel(name: str, output: DType, inputs: list[DType], body: Any, index_dtype: DType = dtypes.int32,
            size: int = 7) -> KernelIR:
    builder = Builder()
    gid = builder.global_id(size, index_dtype)
    valid = builder.less(gid, size - 1)
    loads = [builder.load(builder.param(position + 1, dtype, False), gid, valid if position == 0 else None)
             for position, dtype in enumerate(inputs)]
    value = body(builder, loads)
    sink = builder.sink([builder.store(builder.param(0, output, True), gid, value)])
    params = [BufferParam(0, output, size, True)] + [BufferParam(i + 1, d, size, False) for i, d in enumerate(inputs)]
    return KernelIR(name, params, size, sink, index_dtype)


def _accepts(op: Op, dtype: DType) -> bool:
    if op in FLOAT_ONLY_OPS:
        return dtype.is_float
    if op in INT_ONLY_OPS:
        return dtype.is_int
    if op in (Op.NEG, Op.SUB):
        return not dtype.is_bool
    return True


def every_op_kernel() -> list[KernelIR]:
    """Each elementwise op on each dtype it accepts, every cast and bitcast, and each reduce."""
    kernels: list[KernelIR] = []

    def add(output: DType, inputs: list[DType], body: Any, index_dtype: DType = dtypes.int32) -> None:
        kernels.append(_kernel(f"k{len(kernels)}", output, inputs, body, index_dtype))

    for dtype in ALL:
        compute = dtypes.float32 if dtype in (dtypes.float16, dtypes.bfloat16) else dtype
        for op in (Op.NEG, Op.RECIPROCAL, Op.SQRT, Op.EXP2, Op.LOG2, Op.SIN, Op.TRUNC, Op.NOT):
            if _accepts(op, dtype) and not (op is Op.NOT and dtype.is_float):
                add(compute, [compute], lambda b, x, op=op, compute=compute: b.alu(op, compute, x[0]))
        for op in BINARY_OPS:
            if _accepts(op, dtype) and not (op in (Op.AND, Op.OR, Op.XOR) and dtype.is_float):
                result = dtypes.bool_ if op in (Op.CMPLT, Op.CMPEQ) else compute
                add(result, [compute, compute], lambda b, x, op=op, result=result: b.alu(op, result, x[0], x[1]))
        add(compute, [dtypes.bool_, compute, compute], lambda b, x, compute=compute: b.alu(Op.WHERE, compute, *x))
        add(dtype, [dtype], lambda b, x: x[0])  # load and store of the storage type
        for op in (Op.SUM, Op.PROD, Op.REDUCE_MAX):
            def reduce(b: Builder, x: list[IRNode], op: Op = op, compute: DType = compute) -> IRNode:
                loop = b.new_range(5, dtypes.int32)
                return b.reduce(op, b.alu(Op.ADD, compute, x[0], b.alu(Op.CAST, compute, loop)) if compute !=
                                dtypes.bool_ else x[0], (loop,))
            add(compute, [compute], reduce)
    for source, target in itertools.product(ALL, ALL):
        add(target, [source], lambda b, x, target=target: b.alu(Op.CAST, target, x[0]))
        if source.itemsize == target.itemsize and source != target and dtypes.bool_ not in (source, target):
            add(target, [source], lambda b, x, target=target: b.alu(Op.BITCAST, target, x[0]))
    add(dtypes.float32, [dtypes.float32], lambda b, x: b.alu(Op.ADD, dtypes.float32, x[0], x[0]), dtypes.int64)
    return kernels


@needs_ptxas
def test_every_primitive_op_and_dtype_assembles_for_each_architecture() -> None:
    renderer = ptx.PTXRenderer()
    kernels = every_op_kernel()
    module = ptx.module_of([renderer.render_entry(kernel) for kernel in kernels], renderer)
    for target in ptx.ASSEMBLY_TARGETS:
        assert ptx.assemble(module, target, optimization=0)
    assert len(kernels) > 400


@needs_ptxas
def test_dummy_ptx_device_renders_and_assembles_each_kernel() -> None:
    device = REGISTRY.device("dummy:ptx")
    assert device.info.extra["compile_check"] == "yes" and not device.info.can_run
    device.clear()
    x = em.tensor(random_array((3, 17)), device="dummy:ptx")
    (x.softmax(-1) @ x.T).realize()
    names = [name for name, _ in device.rendered]
    assert names and all(source.startswith("//\n// Generated by ember") for _, source in device.rendered)
    assert all(".target sm_75" in source for _, source in device.rendered)


def test_targets_name_the_ptx_version_they_need() -> None:
    assert ".version 7.5\n.target sm_75" in ptx.PTXRenderer("sm_75").header()
    assert ".version 7.8\n.target sm_90" in ptx.PTXRenderer("sm_90").header()
    assert ptx.float_bits(math.nan, dtypes.float32) == "0f7FC00000"
    assert ptx.float_bits(-0.0, dtypes.float64) == "0d8000000000000000"


# ---- what a GPU may do where IEEE arithmetic is exact: the simulator does it too ---------------------------------


def _run_float32(body: list[str], inputs: list[float], contract: bool = True) -> float:
    """PTX instructions run by the simulator on one thread: %f1, %f2, %f3 hold the inputs, %f9 is the result."""
    loads = ["ld.global.f32 %f1, [%rd2];", "add.s64 %rd3, %rd2, 4;", "ld.global.f32 %f2, [%rd3];",
             "add.s64 %rd3, %rd2, 8;", "ld.global.f32 %f3, [%rd3];"]
    lines = ["ld.param.u64 %rd1, [data0];", "ld.param.u64 %rd2, [data1];", *loads, *body,
             "st.global.f32 [%rd1], %f9;", "ret;"]
    source = ".visible .entry snippet(\n\t.param .u64 data0,\n\t.param .u64 data1\n)\n{\n" + "\n".join(
        f"\t{line}" for line in lines) + "\n}\n"
    output = np.zeros(4, np.uint8)
    values = np.zeros(3, np.float32)
    values[: len(inputs)] = inputs
    Machine(Module(source), [output, values.view(np.uint8)], 1, contract).run()
    return float(output.view(np.float32)[0])


def test_the_simulator_fuses_a_product_into_a_sum_as_ptxas_may() -> None:
    """mul + add without rounding modifiers may become one fma (ptxas --fmad=true, its default): a*b + c with
    a = b = 1 + 2^-12 and c = -(1 + 2^-11) is 2^-24 rounded once, 0 with the product rounded first."""
    a, c = 1 + 2.0**-12, -(1 + 2.0**-11)
    assert _run_float32(["mul.f32 %f4, %f1, %f2;", "add.f32 %f9, %f4, %f3;"], [a, a, c]) == 2.0**-24
    assert _run_float32(["mul.f32 %f4, %f1, %f2;", "sub.f32 %f9, %f3, %f4;"], [a, a, -c]) == -(2.0**-24)
    assert _run_float32(["mul.f32 %f4, %f1, %f2;", "add.f32 %f9, %f4, %f3;"], [a, a, c], contract=False) == 0.0
    assert _run_float32(["mul.rn.f32 %f4, %f1, %f2;", "add.f32 %f9, %f4, %f3;"], [a, a, c]) == 0.0  # never fused


def test_the_simulator_gives_approximate_instructions_their_documented_error() -> None:
    exact_root = float(np.float32(math.sqrt(2.0)))
    ulp = float(np.spacing(np.float32(exact_root)))
    root = _run_float32(["ex2.approx.f32 %f9, %f1;"], [0.5])
    assert root != exact_root and abs(root - exact_root) <= 2 * ulp
    assert _run_float32(["ex2.approx.ftz.f32 %f9, %f1;"], [-130.0]) == 0.0  # a subnormal result is flushed
    assert abs(_run_float32(["ex2.approx.f32 %f9, %f1;"], [-130.0]) - 2.0**-130) <= 2.0**-148  # kept, 2 ulp
    tanh = _run_float32(["tanh.approx.f32 %f9, %f1;"], [0.5])
    assert 2.0**-12 < abs(tanh / math.tanh(0.5) - 1) <= 2.0**-10.9
    assert _run_float32(["rcp.rn.f32 %f9, %f1;"], [3.0]) == float(np.float32(1 / 3))
    assert _run_float32(["rcp.approx.f32 %f9, %f1;"], [3.0]) != float(np.float32(1 / 3))


def test_the_simulator_max_is_the_isas() -> None:
    """max.f32 returns the number where the other operand is NaN and orders -0.0 below +0.0."""
    assert _run_float32(["max.f32 %f9, %f1, %f2;"], [math.nan, 1.0]) == 1.0
    assert _run_float32(["max.f32 %f9, %f1, %f2;"], [1.0, math.nan]) == 1.0
    assert math.copysign(1, _run_float32(["max.f32 %f9, %f1, %f2;"], [-0.0, 0.0])) == 1
    assert math.copysign(1, _run_float32(["max.f32 %f9, %f1, %f2;"], [0.0, -0.0])) == 1


@pytest.mark.parametrize("dtype", (dtypes.float32, dtypes.float64), ids=lambda dtype: dtype.name)
def test_max_is_the_same_on_ptx_and_c_bit_for_bit(dtype: DType) -> None:
    """MAX is C's (a > b or a is NaN ? a : b): NaN from either side, the second operand on a tie (so -0.0/+0.0
    keep their order), whatever max.f32 itself does."""
    numpy_dtype = np.float32 if dtype == dtypes.float32 else np.float64
    values = [math.nan, -math.inf, -1.0, -0.0, 0.0, 2.0, math.inf]
    pairs = np.array(list(itertools.product(values, values)), dtype=numpy_dtype)
    size = len(pairs) + 1
    kernel = _kernel("max", dtype, [dtype, dtype], lambda b, x: b.alu(Op.MAX, dtype, x[0], x[1]), size=size)
    left, right = (np.concatenate([pairs[:, side], [0]]).astype(numpy_dtype) for side in (0, 1))
    on_c, on_ptx = np.empty(size, numpy_dtype), np.zeros(size, numpy_dtype)
    CDevice().compile(kernel)([on_c, left, right], size)
    Machine(Module(ptx.PTXRenderer().render(kernel)), [on_ptx.view(np.uint8), left.view(np.uint8),
                                                         right.view(np.uint8)], 256).run()
    assert (on_c[:-1].view(np.uint8) == on_ptx[:-1].view(np.uint8)).all(), (pairs, on_c, on_ptx)


def test_ptx_uses_no_approximate_or_flushing_instructions() -> None:
    """Every op, and the math compositions built on them, render to instructions exact to IEEE (rounded once),
    so that what the simulator runs is what a GPU runs: no `.approx`, no `.ftz`."""
    device = REGISTRY.device("dummy:ptx")
    device.clear()
    x = em.tensor(random_array((4, 5)), device="dummy:ptx")
    em.realize(x.gelu(), x.gelu("tanh"), x.erf(), x.tanh(), x.sigmoid(), x.exp(), x.log(), x.sin(), x.cos(),
               x.sqrt(), x.rsqrt(), x.reciprocal(), x.silu(), x.softplus(), x.double().exp())
    renderer = ptx.PTXRenderer()
    sources = [renderer.render_entry(kernel) for kernel in every_op_kernel()] + [s for _, s in device.rendered]
    assert len(sources) > 400
    for source in sources:
        assert ".approx" not in source and ".ftz" not in source, source


# ---- the driver-API code path, with a fake driver that runs the PTX in the simulator ----------------------------


class FakeDriver:
    """cuda-python's driver calls ember uses, each returning (status, values...); launches run the simulator."""

    CUdevice_attribute = SimpleNamespace(**{f"CU_DEVICE_ATTRIBUTE_{name}": name for name in (
        "COMPUTE_CAPABILITY_MAJOR", "COMPUTE_CAPABILITY_MINOR", "MULTIPROCESSOR_COUNT", "MAX_THREADS_PER_BLOCK",
        "MAX_SHARED_MEMORY_PER_BLOCK", "WARP_SIZE")})
    ATTRIBUTES: ClassVar[dict[str, int]] = {
        "COMPUTE_CAPABILITY_MAJOR": 8, "COMPUTE_CAPABILITY_MINOR": 6, "MULTIPROCESSOR_COUNT": 4,
        "MAX_THREADS_PER_BLOCK": 1024, "MAX_SHARED_MEMORY_PER_BLOCK": 49152, "WARP_SIZE": 32,
    }

    CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)

    def __init__(self) -> None:
        self.memory: dict[int, np.ndarray] = {}
        self.host_memory: dict[int, np.ndarray] = {}
        self.modules: list[str] = []
        self.launches: list[tuple[int, int]] = []
        self.next_pointer = 0x1000
        self.captured: list[tuple] | None = None  # the launches of a stream capture under way
        self.graph_launches = 0
        self.live_graphs: set[int] = set()

    def cuInit(self, flags: int) -> tuple:
        return (0,)

    def cuDeviceGetCount(self) -> tuple:
        return 0, 1

    def cuDeviceGet(self, ordinal: int) -> tuple:
        return 0, ordinal

    def cuDevicePrimaryCtxRetain(self, device: int) -> tuple:
        return 0, "context"

    def cuCtxSetCurrent(self, context: Any) -> tuple:
        return (0,)

    def cuStreamCreate(self, flags: int) -> tuple:
        return 0, "stream"

    def cuDeviceGetAttribute(self, attribute: str, device: int) -> tuple:
        return 0, self.ATTRIBUTES[attribute]

    def cuDeviceGetName(self, length: int, device: int) -> tuple:
        return 0, b"Simulated GPU\0\0"

    def cuMemAlloc(self, nbytes: int) -> tuple:
        pointer = self.next_pointer
        self.next_pointer += nbytes + 256
        self.memory[pointer] = np.zeros(nbytes, dtype=np.uint8)
        return 0, pointer

    def cuMemFree(self, pointer: int) -> tuple:
        del self.memory[pointer]
        return (0,)

    def cuMemAllocHost(self, nbytes: int) -> tuple:  # page-locked staging memory of the copies
        host = np.zeros(nbytes, dtype=np.uint8)
        self.host_memory[host.ctypes.data] = host
        return 0, host.ctypes.data

    def cuMemFreeHost(self, pointer: int) -> tuple:
        del self.host_memory[pointer]
        return (0,)

    def at(self, pointer: int) -> np.ndarray:
        """The device bytes from a pointer into an allocation (its start, or inside it: a view) to its end."""
        for start, memory in self.memory.items():
            if start <= pointer <= start + len(memory):
                return memory[pointer - start:]
        raise AssertionError(f"pointer {pointer:#x} is in no allocation")

    def cuMemcpyHtoDAsync(self, pointer: int, host: np.ndarray, nbytes: int, stream: Any) -> tuple:
        self.at(pointer)[:nbytes] = host[:nbytes]
        return (0,)

    def cuMemcpyDtoHAsync(self, host: np.ndarray, pointer: int, nbytes: int, stream: Any) -> tuple:
        host[:nbytes] = self.at(pointer)[:nbytes]
        return (0,)

    def cuStreamSynchronize(self, stream: Any) -> tuple:
        return (0,)

    def cuStreamQuery(self, stream: Any) -> tuple:
        return (0,)

    FREE_BYTES = 2**30  # free before any allocation, of TOTAL_BYTES
    TOTAL_BYTES = 2**31

    def cuMemGetInfo(self) -> tuple:
        """Free memory less what is allocated (in the 256-byte units cuMemAlloc hands out), and the total."""
        used = sum(-(-len(memory) // 256) * 256 for memory in self.memory.values())
        return 0, self.FREE_BYTES - used, self.TOTAL_BYTES

    def cuModuleLoadData(self, image: bytes) -> tuple:
        assert image.endswith(b"\0")
        self.modules.append(image[:-1].decode())
        return 0, len(self.modules) - 1

    def cuModuleGetFunction(self, module: int, name: bytes) -> tuple:
        assert f".entry {name.decode()}(" in self.modules[module]
        return 0, Module(self.modules[module])

    @staticmethod
    def kernel_pointers(function: Module, arguments: tuple | int) -> tuple[int, ...]:
        """The buffer pointers a launch passes: cuda-python's (values, types) tuples, or the address of a void**
        array (what cuLaunchKernel reads; cuda-python passes an int through as that address)."""
        if isinstance(arguments, int):
            size = ctypes.sizeof(ctypes.c_void_p)
            return tuple(ctypes.c_void_p.from_address(ctypes.c_void_p.from_address(arguments + index * size).value
                                                      ).value or 0 for index in range(len(function.parameters)))
        values, types = arguments
        assert len(values) == len(types)
        return tuple(values)

    def cuLaunchKernel(self, function: Module, grid_x: int, grid_y: int, grid_z: int, block_x: int, block_y: int,
                       block_z: int, shared: int, stream: Any, arguments: tuple | int, extra: int) -> tuple:
        values = self.kernel_pointers(function, arguments)
        assert len(values) == len(function.parameters) and (grid_y, grid_z, block_y, block_z) == (1,) * 4
        if self.captured is not None:  # (the parameters are read now, as the driver copies them into the graph)
            self.captured.append((function, values, grid_x, block_x))
            return (0,)
        self._run(function, values, grid_x, block_x)
        return (0,)

    def _run(self, function: Module, values: tuple[int, ...], grid_x: int, block_x: int) -> None:
        self.launches.append((grid_x, block_x))
        Machine(function, [self.at(pointer) for pointer in values], grid_x * block_x, block_size=block_x).run()

    def cuStreamBeginCapture(self, stream: Any, mode: int) -> tuple:
        assert self.captured is None and mode == 1
        self.captured = []
        return (0,)

    def cuStreamEndCapture(self, stream: Any) -> tuple:
        graph, self.captured = self.captured, None
        assert graph is not None
        return 0, graph

    def cuGraphInstantiate(self, graph: list[tuple], flags: int) -> tuple:
        executable = tuple(graph)
        self.live_graphs.add(id(executable))
        return 0, executable

    def cuGraphLaunch(self, executable: tuple, stream: Any) -> tuple:
        assert id(executable) in self.live_graphs
        self.graph_launches += 1
        for launch in executable:
            self._run(*launch)
        return (0,)

    def cuGraphExecDestroy(self, executable: tuple) -> tuple:
        self.live_graphs.discard(id(executable))
        return (0,)

    def cuGraphDestroy(self, graph: list[tuple]) -> tuple:
        return (0,)

    def cuEventCreate(self, flags: int) -> tuple:
        return 0, "event"

    def cuEventRecord(self, event: Any, stream: Any) -> tuple:
        return (0,)

    def cuEventSynchronize(self, event: Any) -> tuple:
        return (0,)

    def cuEventQuery(self, event: Any) -> tuple:
        return (0,)

    def cuEventDestroy(self, event: Any) -> tuple:
        return (0,)

    def cuStreamWaitEvent(self, stream: Any, event: Any, flags: int) -> tuple:
        return (0,)

    def cuGetErrorString(self, status: Any) -> tuple:
        return 0, b"fake error"


def test_the_fake_driver_matches_cuda_python_names() -> None:
    try:
        from cuda.bindings import driver
    except ImportError:
        pytest.skip("cuda-python is not installed")
    called = [name for name in dir(FakeDriver) if name.startswith("cu")]
    assert [name for name in called if not hasattr(driver, name)] == []
    assert all(hasattr(driver.CUdevice_attribute, name) for name in vars(FakeDriver.CUdevice_attribute))
    assert all(hasattr(driver.CUstreamCaptureMode, name) for name in vars(FakeDriver.CUstreamCaptureMode))


def test_cuda_backend_runs_ops_through_the_driver_api(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = FakeDriver()
    device = cuda.CudaDevice(driver, 0)
    assert device.info.extra == {"gpu": "Simulated GPU", "target": "sm_86"} and device.info.compute_units == 4
    monkeypatch.setitem(REGISTRY.devices, "cuda", [device])
    a_data, b_data = random_array((17, 33)), random_array((33, 5), seed=1)
    a, b = em.tensor(a_data, device="cuda:0"), em.tensor(b_data, device="cuda:0")
    ta, tb = torch.tensor(a_data), torch.tensor(b_data)
    assert_close((a @ b).relu().softmax(-1), (ta @ tb).relu().softmax(-1))
    launches = len(driver.launches)
    assert_close((a @ b).relu().softmax(-1), (ta @ tb).relu().softmax(-1))
    assert len(driver.launches) == 2 * launches and len(driver.modules) == launches  # modules load once
    assert all(".target sm_86" in module for module in driver.modules)
    assert all(block == cuda.BLOCK_SIZE for _, block in driver.launches)
    assert_close((a > 0).sum(1), (ta > 0).sum(1))
    # the driver's free memory (the pool's estimate of it), and the buffers kept for reuse
    assert device.pool.free_bytes == driver.cuMemGetInfo()[1] + device.pool.kept_bytes
    assert device.pool.kept_bytes > 0 and device.pool.kept_bytes % 4 == 0


def test_cuda_backend_launches_workgroup_kernels_in_blocks_of_their_local_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_NOOPT", "0")  # (an optional transform)
    driver = FakeDriver()
    device = cuda.CudaDevice(driver, 0)
    assert device.info.warp_width == 32
    monkeypatch.setitem(REGISTRY.devices, "cuda", [device])
    data = random_array((3, 1000))
    assert_close(em.tensor(data, device="cuda:0").softmax(-1), torch.tensor(data).softmax(-1))
    assert driver.launches == [(3, 256)]  # a row per block of 256 threads
    assert ".shared " in driver.modules[0] and "bar.sync 0;" in driver.modules[0]


def test_cuda_jit_replays_through_an_arena_of_device_pointers(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = FakeDriver()
    device = cuda.CudaDevice(driver, 0)
    monkeypatch.setitem(REGISTRY.devices, "cuda", [device])
    weights_data = random_array((31, 6), seed=1)  # shapes of its own: kernels cached for another fake device differ
    weights = em.tensor(weights_data, device="cuda:0")
    def forward(inputs: em.Tensor) -> em.Tensor:  # (kernels after the input's: the softmax, the column sums)
        probabilities = (inputs @ weights).relu().softmax(-1)
        return probabilities + probabilities.sum(0, keepdim=True).tanh()

    model = em.jit(forward)
    for seed in range(4):
        inputs = random_array((19, 31), seed=10 + seed)
        expected = (torch.tensor(inputs) @ torch.tensor(weights_data)).relu().softmax(-1)
        assert_close(model(em.tensor(inputs, device="cuda:0")), expected + expected.sum(0, True).tanh())
    plan = model.memory_plan["cuda:0"]
    assert model.replays == 2 and plan.arena and plan.buffers == 1 and plan.intermediates >= 2
    assert model.capture is not None
    views = [buffer for buffer in model.capture.buffers if isinstance(buffer, ArenaView)]
    assert len(views) == plan.intermediates
    assert all(view.offset % 256 == 0 and view.handle == int(view.arena.handle) + view.offset for view in views)
    # the replays' launches after the input's are one CUDA graph, launched once per replay
    assert driver.graph_launches == 2 and len(driver.live_graphs) == 1
    joined = [entry for entry in model.capture.bound if isinstance(entry, JoinedLaunches)]
    assert len(joined) == 1 and joined[0].end - model.capture.bound.index(joined[0]) >= 2


def test_cuda_jit_replays_launch_one_by_one_where_a_graph_capture_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoGraphs(FakeDriver):
        def cuStreamBeginCapture(self, stream: Any, mode: int) -> tuple:
            return (801,)  # CUDA_ERROR_NOT_SUPPORTED

    driver = NoGraphs()
    device = cuda.CudaDevice(driver, 0)
    monkeypatch.setitem(REGISTRY.devices, "cuda", [device])
    weights_data, second_data = random_array((29, 7), seed=2), random_array((7, 5), seed=3)
    weights, second = em.tensor(weights_data, device="cuda:0"), em.tensor(second_data, device="cuda:0")
    model = em.jit(lambda inputs: ((inputs @ weights).relu().softmax(-1) @ second).softmax(-1) * 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in range(4):  # (each replay's output is read before the next replay overwrites it)
            inputs = random_array((11, 29), seed=20 + seed)
            hidden = (torch.tensor(inputs) @ torch.tensor(weights_data)).relu().softmax(-1)
            assert_close(model(em.tensor(inputs, device="cuda:0")), (hidden @ torch.tensor(second_data)).softmax(-1) * 3)
    said = [str(warning.message) for warning in caught if "CUDA graph" in str(warning.message)]
    assert len(said) == 1 and "fake error" in said[0], said  # (once: later replays do not try again)
    assert model.replays == 2 and driver.graph_launches == 0 and device.graphs_failed
    assert not any(isinstance(entry, JoinedLaunches) for entry in model.capture.bound)


def test_cuda_probe_says_why_without_a_driver() -> None:
    try:
        devices = REGISTRY.probe("cuda")
    except BackendUnavailable as error:
        assert "CUDA driver not found" in str(error) or "cuda-python" in str(error) or "no GPU" in str(error)
    else:
        pytest.skip(f"a GPU is present here ({devices[0].name}); the op suite runs on it with EMBER_TEST_DEVICES=cuda")


# ---- the math expansions, checked on the C backend against numpy ----------------------------------------------


@pytest.mark.parametrize("dtype", (dtypes.float32, dtypes.float64), ids=lambda dtype: dtype.name)
@pytest.mark.parametrize("op", (Op.EXP2, Op.LOG2, Op.SIN), ids=lambda op: op.name)
def test_math_expansions_are_accurate_to_a_few_ulp(op: Op, dtype: DType) -> None:
    numpy_dtype = np.float32 if dtype == dtypes.float32 else np.float64
    generator = np.random.default_rng(0)
    largest = 700 if dtype == dtypes.float64 else 87
    special = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, 2.0, 0.5, 3.0, -1.0, np.finfo(numpy_dtype).tiny / 64]
    data = np.concatenate([generator.uniform(-3, 3, 20000), generator.uniform(-9000, 9000, 20000),
                           np.exp(generator.uniform(0, math.log(np.finfo(numpy_dtype).max), 5000)),
                           np.exp(generator.uniform(-largest, largest, 20000)) * generator.choice([-1, 1], 20000),
                           special]).astype(numpy_dtype)
    if op is Op.EXP2:
        data = np.clip(data, -1100, 1100) * (1 if dtype == dtypes.float64 else 0.15)
    kernel = _kernel("expanded", dtype, [dtype], lambda b, x: b.alu(op, dtype, x[0]), size=data.size + 1)
    expanded = expand_math(kernel, frozenset({(op, dtype)}))
    assert all(node_op is not op for node_op in _ops(expanded.sink))
    output = np.empty(data.size + 1, numpy_dtype)
    CDevice().compile(expanded)([output, np.concatenate([data, [0]]).astype(numpy_dtype)], data.size + 1)
    with np.errstate(all="ignore"):
        exact = {Op.EXP2: np.exp2, Op.LOG2: np.log2, Op.SIN: np.sin}[op](data.astype(np.longdouble))
        expected = exact.astype(numpy_dtype)
    result = output[: data.size]
    same_class = (np.isnan(result) == np.isnan(expected)) & (np.isinf(result) == np.isinf(expected))
    assert same_class.all(), (data[~same_class][:5], result[~same_class][:5], expected[~same_class][:5])
    finite = np.isfinite(expected)
    error = np.abs(result[finite].astype(np.longdouble) - exact[finite])
    ulps = error / np.spacing(np.abs(expected[finite])).astype(np.longdouble)
    if op is Op.SIN:  # near the roots k*pi a relative bound is meaningless for large k: bound it relative to 1
        small = np.abs(data[finite]) < 2
        assert float(ulps[small].max()) <= 3.0
        assert float(error.max()) <= 2 * np.finfo(numpy_dtype).eps
    else:
        assert float(ulps.max()) <= 3.0
    assert (result[np.isinf(expected)] == expected[np.isinf(expected)]).all()


def _ops(sink: IRNode) -> set:
    found, stack, seen = set(), [sink], set()
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            found.add(node.op)
            stack.extend(node.srcs)
    return found


@pytest.mark.parametrize(("major", "minor", "listed"), [(7, 5, False), (8, 0, True), (9, 0, True)])
def test_tensor_cores_are_listed_from_sm_80(major: int, minor: int, listed: bool,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU of sm_80 or newer lists float16 and bfloat16 as DeviceInfo.matrix_dtypes, so half matmuls tile on its
    tensor cores (mma.sync, ir/group_matmul.py); an sm_75 one lists none (its PTX cannot hold mma.m16n8k16)."""
    driver = FakeDriver()
    monkeypatch.setitem(driver.ATTRIBUTES, "COMPUTE_CAPABILITY_MAJOR", major)
    monkeypatch.setitem(driver.ATTRIBUTES, "COMPUTE_CAPABILITY_MINOR", minor)
    device = cuda.CudaDevice(driver, 0)
    assert device.info.matrix_dtypes == (frozenset({em.float16, em.bfloat16}) if listed else frozenset())
