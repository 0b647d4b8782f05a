"""A PTX interpreter for the subset ember's PTX renderer emits, written from the PTX ISA manual, so that generated
PTX runs (slowly, on numpy) without a GPU: the "ptxsim" test backend (EMBER_TEST_DEVICES=ptxsim).

Every thread of a launch runs at once: registers are numpy arrays with one lane per thread, predicated
instructions touch only their lanes, and a forward branch parks the lanes that take it until its label. Results
the ISA leaves unspecified (integer division by zero, INT_MIN / -1) are poisoned, so kernels relying on them fail.

Where the ISA lets the GPU differ from exact IEEE arithmetic, the simulator takes the GPU's liberty too, so that a
kernel relying on more than the ISA promises fails here and not first on a GPU:
- a `mul` and an `add`/`sub` without a rounding modifier may be fused into one `fma` by ptxas (its default
  `--fmad=true`); the simulator fuses every such pair it meets (CONTRACT), rounding once;
- `.approx` instructions (ex2, lg2, sin, cos, tanh, rcp/sqrt.approx) return the exact value perturbed by the error
  bound the ISA gives them, and `.ftz` flushes subnormal inputs and results to zero;
- float `max` returns the other operand for a NaN and +0.0 for (+0.0, -0.0), as the ISA specifies.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ember.backends.base import COMPLETED, Device, Event, Program
from ember.backends.c import HostMemoryPool
from ember.backends.ptx import PTXRenderer
from ember.capabilities import DeviceInfo
from ember.ir.ir import KernelIR

BLOCK_SIZE = 256
POISON = 0x5A5A5A5A  # what this simulator gives for results PTX leaves unspecified
NUMPY_TYPES = {
    "pred": np.bool_, "b8": np.uint8, "u8": np.uint8, "s8": np.int8, "b16": np.uint16, "u16": np.uint16,
    "s16": np.int16, "f16": np.float16, "b32": np.uint32, "u32": np.uint32, "s32": np.int32, "f32": np.float32,
    "b64": np.uint64, "u64": np.uint64, "s64": np.int64, "f64": np.float64,
}
REGISTER_TYPES = {"%p": "pred", "%h": "b16", "%r": "b32", "%rd": "b64", "%f": "f32", "%fd": "f64"}
POINTER_SHIFT = 40  # a global address is (buffer number + 1) << 40 | byte offset
CONTRACT = True  # fuse mul + add/sub without rounding modifiers into one rounding, as ptxas does by default
# the error bounds the PTX ISA gives the float32 .approx instructions: (units in the last place, relative, absolute);
# the simulator returns the exact value moved by the bound, up or down by lane
APPROXIMATION_ERRORS: dict[str, tuple[int, float, float]] = {
    "ex2": (2, 0.0, 0.0),
    "lg2": (0, 0.0, 2.0**-22.6),
    "sin": (0, 0.0, 2.0**-20.9),
    "cos": (0, 0.0, 2.0**-20.9),
    "tanh": (0, 2.0**-10.987, 0.0),
    "rcp": (1, 0.0, 0.0),
    "sqrt": (0, 2.0**-23, 0.0),
    "rsqrt": (0, 2.0**-22.9, 0.0),
}


class Instruction:
    __slots__ = ("guard", "opcode", "operands", "parts")

    def __init__(self, guard: str, opcode: str, operands: list[str]) -> None:
        self.guard, self.opcode, self.operands = guard, opcode, operands
        self.parts = opcode.split(".")


class Module:
    """A parsed PTX entry: parameter names, instructions and label positions."""

    def __init__(self, source: str) -> None:
        self.parameters: list[str] = []
        self.instructions: list[Instruction] = []
        self.labels: dict[str, int] = {}
        self.shared: dict[str, int] = {}  # a `.shared` array's name -> its bytes (per block)
        in_body = False
        for raw in source.splitlines():
            line = raw.split("//", 1)[0].strip()
            if not line:
                continue
            if line.startswith(".param"):
                self.parameters.append(line.split()[-1].rstrip(","))
            elif line.startswith(".shared"):
                name, _, size = line.rstrip(";").split()[-1].partition("[")
                self.shared[name] = int(size.rstrip("]"))
            elif line == "{":
                in_body = True
            elif line == "}":
                in_body = False
            elif in_body and line.endswith(":"):
                self.labels[line[:-1]] = len(self.instructions)
            elif in_body and not line.startswith("."):
                guard = ""
                if line.startswith("@"):
                    guard, line = line[1:].split(None, 1)
                opcode, _, rest = line.rstrip(";").partition(" ")
                operands = [operand.strip() for operand in rest.split(",")] if rest.strip() else []
                self.instructions.append(Instruction(guard, opcode, operands))


def _register_type(name: str) -> str:
    match = re.match(r"(%[a-z]+)", name)
    assert match and match.group(1) in REGISTER_TYPES, f"unknown register {name}"
    return REGISTER_TYPES[match.group(1)]


def _immediate(text: str, type_name: str, lanes: int) -> np.ndarray:
    if text.startswith("0f"):  # PTX's float immediates: 0f + 8 hex digits, 0d + 16
        bits = np.full(lanes, int(text[2:], 16), dtype=np.uint32)  # noqa: FURB166
        return bits.view(np.float32).astype(NUMPY_TYPES[type_name])
    if text.startswith("0d"):
        bits = np.full(lanes, int(text[2:], 16), dtype=np.uint64)  # noqa: FURB166
        return bits.view(np.float64).astype(NUMPY_TYPES[type_name])
    value = int(text, 0)
    bits = 64 if type_name[1:] == "64" else 32 if type_name[1:] == "32" else int(type_name[1:]) if \
        type_name[1:].isdigit() else 32
    value &= (1 << bits) - 1
    unsigned = np.array([value], dtype={8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[bits])
    return np.repeat(unsigned.view(NUMPY_TYPES[type_name]) if type_name != "pred" else unsigned != 0, lanes)


class Machine:
    """The state of one launch: registers, memory and which lanes are running."""

    def __init__(self, module: Module, buffers: list[np.ndarray], threads: int, contract: bool = CONTRACT,
                 block_size: int = BLOCK_SIZE) -> None:
        self.module = module
        self.lanes = threads
        # each `.shared` array: one more buffer holding every block's copy (a lane's address starts at its block's)
        lane = np.arange(threads, dtype=np.uint32)
        self.block_of = lane // block_size
        self.shared_bases: dict[str, np.ndarray] = {}
        self.buffers = list(buffers)
        for name, size in module.shared.items():
            self.shared_bases[name] = (np.uint64(len(self.buffers) + 1) << np.uint64(POINTER_SHIFT)) + \
                (lane // block_size).astype(np.uint64) * np.uint64(size)
            self.buffers.append(np.zeros(size * (-(-threads // block_size)), np.uint8))
        self.contract = contract
        self.registers: dict[str, np.ndarray] = {}
        # register -> (a, b, lanes) of a float `mul` without rounding modifier whose result it still holds: an add or
        # sub reading it may use the unrounded product (ptxas contracts such pairs into fma)
        self.products: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.special = {"%ctaid.x": lane // block_size, "%ntid.x": np.full(threads, block_size, np.uint32),
                        "%tid.x": lane % block_size}

    # ---- operands ---------------------------------------------------------------------------------------------

    def read(self, operand: str, type_name: str) -> np.ndarray:
        """An operand as an array of the instruction's type (registers are reinterpreted or truncated)."""
        if operand in self.special:
            return self.special[operand].astype(NUMPY_TYPES[type_name])
        if operand in self.shared_bases:
            return self.shared_bases[operand]
        if not operand.startswith("%"):
            return _immediate(operand, type_name, self.lanes)
        stored = self.registers.get(operand)
        if stored is None:
            stored = np.zeros(self.lanes, NUMPY_TYPES[_register_type(operand)])
        wanted = np.dtype(NUMPY_TYPES[type_name])
        if type_name == "pred" or stored.dtype == np.bool_:
            assert stored.dtype == np.bool_ and type_name == "pred", f"{operand} used as {type_name}"
            return stored
        if stored.dtype.itemsize == wanted.itemsize:
            return stored.view(wanted)
        assert stored.dtype.itemsize > wanted.itemsize, f"{operand} is narrower than .{type_name}"
        unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32}[wanted.itemsize]
        return stored.view({4: np.uint32, 8: np.uint64, 2: np.uint16}[stored.dtype.itemsize]).astype(unsigned) \
            .view(wanted)

    def write(self, register: str, value: np.ndarray, mask: np.ndarray) -> None:
        """Store the lanes in mask; a value narrower than the register is sign- or zero-extended by its type."""
        self.products.pop(register, None)
        kind = _register_type(register)
        storage = np.dtype(NUMPY_TYPES[kind])
        current = self.registers.setdefault(register, np.zeros(self.lanes, storage))
        if kind == "pred":
            assert value.dtype == np.bool_, f"{register} is a predicate, got {value.dtype}"
            current[mask] = value[mask]
            return
        if value.dtype.itemsize < storage.itemsize:
            widened = np.int64 if value.dtype.kind == "i" else np.uint64
            value = value.astype(widened).astype({4: np.int64, 8: np.int64}[storage.itemsize])
            value = value.view(np.uint64).astype({4: np.uint32, 8: np.uint64}[storage.itemsize])
        assert value.dtype.itemsize == storage.itemsize, f"{register}: {value.dtype} does not fit .{kind}"
        current[mask] = value.view(storage)[mask]

    # ---- memory -----------------------------------------------------------------------------------------------

    def _locate(self, address: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        buffer_numbers = (address[mask] >> np.uint64(POINTER_SHIFT)).astype(np.int64) - 1
        assert buffer_numbers.size == 0 or (buffer_numbers == buffer_numbers[0]).all(), "one buffer per access"
        buffer = self.buffers[int(buffer_numbers[0])] if buffer_numbers.size else np.zeros(0, np.uint8)
        offsets = (address[mask] & np.uint64((1 << POINTER_SHIFT) - 1)).astype(np.int64)
        return buffer, offsets

    def load(self, type_name: str, address: np.ndarray, mask: np.ndarray) -> np.ndarray:
        size = np.dtype(NUMPY_TYPES[type_name]).itemsize
        result = np.zeros(self.lanes, NUMPY_TYPES[type_name])
        buffer, offsets = self._locate(address, mask)
        if offsets.size:
            assert offsets.min() >= 0 and offsets.max() + size <= buffer.size, "load out of bounds"
            gathered = buffer[offsets[:, None] + np.arange(size)]
            result[mask] = np.ascontiguousarray(gathered).view(NUMPY_TYPES[type_name]).reshape(-1)
        return result

    def store(self, type_name: str, address: np.ndarray, value: np.ndarray, mask: np.ndarray) -> None:
        size = np.dtype(NUMPY_TYPES[type_name]).itemsize
        buffer, offsets = self._locate(address, mask)
        if offsets.size:
            assert offsets.min() >= 0 and offsets.max() + size <= buffer.size, "store out of bounds"
            buffer[offsets[:, None] + np.arange(size)] = np.ascontiguousarray(value[mask]).view(np.uint8) \
                .reshape(-1, size)

    # ---- execution --------------------------------------------------------------------------------------------

    def run(self) -> None:
        instructions = self.module.instructions
        active = np.ones(self.lanes, dtype=bool)
        parked: dict[int, np.ndarray] = {}
        position = 0
        steps = 0
        while position < len(instructions):
            if position in parked:
                active = active | parked.pop(position)
            instruction = instructions[position]
            mask = active & self.read(instruction.guard, "pred") if instruction.guard else active
            steps += 1
            assert steps < 10_000_000, "runaway kernel"
            if instruction.opcode == "ret":
                return
            if instruction.parts[0] == "bra":
                target = self.module.labels[instruction.operands[0]]
                if target > position:
                    parked[target] = parked.get(target, np.zeros(self.lanes, bool)) | mask
                    active = active & ~mask
                elif mask.any():
                    if not (mask == active).all():
                        # lanes going round again while others leave: only whole blocks may (a group's own count
                        # of steps, the same for each of its items: what a loop holding a barrier needs); those
                        # leaving wait after the loop until the others leave it too
                        looping = np.isin(self.block_of, self.block_of[mask])
                        assert not (active & ~mask & looping).any(), "divergent backward branch inside a block"
                        parked[position + 1] = parked.get(position + 1, np.zeros(self.lanes, bool)) | (active & ~mask)
                        active = mask
                    position = target
                    continue
                position += 1
                continue
            if mask.any():
                execute(self, instruction, mask)
            position += 1
            # labels reached by falling through also collect parked lanes
        return


def _ints(type_name: str) -> bool:
    return type_name[0] in "sub"


def _saturating_int(value: np.ndarray, type_name: str) -> np.ndarray:
    info = np.iinfo(NUMPY_TYPES[type_name])
    value = np.where(np.isnan(value), 0, np.trunc(value)).astype(np.float64)
    clipped = np.clip(value, float(info.min), float(info.max))
    result = clipped.astype(np.longdouble).astype(NUMPY_TYPES[type_name]) if info.bits == 64 else \
        clipped.astype(NUMPY_TYPES[type_name])
    too_big = value >= float(info.max)
    result[too_big] = info.max  # float(max) of a 64-bit type rounds up past it
    return result


def _divide(a: np.ndarray, b: np.ndarray, type_name: str, remainder: bool) -> np.ndarray:
    """Truncating division; lanes with b == 0 or INT_MIN / -1 are poisoned (PTX: unspecified)."""
    wide_type = object if type_name[1:] == "64" else np.int64
    a_wide, b_wide = a.astype(wide_type), b.astype(wide_type)
    safe = np.where(b_wide == 0, 1, b_wide)
    quotient = np.array([abs(x) // abs(y) * (1 if (x >= 0) == (y >= 0) else -1) for x, y in zip(a_wide, safe)],
                        dtype=object) if wide_type is object else np.trunc(a_wide / safe).astype(np.int64)
    if wide_type is not object:  # exact integer division (float division may round for big int32 values)
        quotient = np.sign(a_wide) * np.sign(safe) * (np.abs(a_wide) // np.abs(safe))
    result = a_wide - safe * quotient if remainder else quotient
    info = np.iinfo(NUMPY_TYPES[type_name])
    poison = (b_wide == 0) | ((a_wide == info.min) & (b_wide == -1)) if type_name[0] == "s" else (b_wide == 0)
    result = np.where(poison, POISON, result)
    bits = info.bits
    masked = np.array([int(value) & ((1 << bits) - 1) for value in result], dtype=np.uint64) if wide_type is object \
        else (result.astype(np.int64) & ((1 << bits) - 1)).astype(np.uint64)
    return masked.astype({32: np.uint32, 64: np.uint64}[bits]).view(NUMPY_TYPES[type_name])


def execute(machine: Machine, instruction: Instruction, mask: np.ndarray) -> None:
    """One instruction on the lanes in mask."""
    parts, operands = instruction.parts, instruction.operands
    name = parts[0]
    type_name = parts[-1]
    read = machine.read

    def out(value: np.ndarray) -> None:
        machine.write(operands[0], value, mask)

    with np.errstate(all="ignore"):
        if name == "ld" and parts[1] == "param":
            position = machine.module.parameters.index(operands[1].strip("[]"))
            out(np.full(machine.lanes, (position + 1) << POINTER_SHIFT, dtype=np.uint64))
        elif name == "cvta":
            out(read(operands[1], "u64"))
        elif name == "ld":
            loaded = machine.load(type_name, read(operands[1].strip("[]"), "u64"), mask)
            out(loaded)
        elif name == "st":
            machine.store(type_name, read(operands[0].strip("[]"), "u64"), read(operands[1], type_name), mask)
        elif name == "mov":
            out(read(operands[1], type_name))
        elif name == "bar":  # every lane runs each instruction before the next: a barrier holds already
            pass
        elif name == "shfl":  # shfl.sync.bfly.b32 d, a, offset, 31, membermask: lane i reads lane i ^ offset
            assert parts[1:3] == ["sync", "bfly"] and operands[3:] == ["31", "0xffffffff"], instruction.opcode
            lane = np.arange(machine.lanes)
            assert all(mask[start:start + 32].all() or not mask[start:start + 32].any()
                       for start in range(0, machine.lanes, 32)), "shfl.sync with a partial warp"
            out(read(operands[1], "b32")[lane ^ int(operands[2])])
        elif name in ("add", "sub") and type_name[0] == "f" and len(parts) == 2 and machine.contract:
            out(_add_contracted(machine, operands, name == "sub", type_name))
        elif name in ("add", "sub", "mul", "mad") and parts[1] not in ("wide",):
            a, b = read(operands[1], type_name), read(operands[2], type_name)
            if name == "add":
                out(a + b)
            elif name == "sub":
                out(a - b)
            elif name == "mul":
                out(a * b)
                if type_name[0] == "f" and len(parts) == 2:  # no rounding modifier: ptxas may fuse it
                    machine.products[operands[0]] = (a, b, mask.copy())
            else:
                out(a * b + read(operands[3], type_name))
        elif name == "mul" and parts[1] == "wide":
            wide = "s64" if type_name == "s32" else "u64"
            out(read(operands[1], type_name).astype(NUMPY_TYPES[wide]) * read(operands[2], type_name)
                .astype(NUMPY_TYPES[wide]))
        elif name in ("div", "rem") and _ints(type_name):
            out(_divide(read(operands[1], type_name), read(operands[2], type_name), type_name, name == "rem"))
        elif name == "div":
            out(read(operands[1], type_name) / read(operands[2], type_name))
        elif name == "neg":
            out(-read(operands[1], type_name))
        elif name == "not":
            out(~read(operands[1], type_name))
        elif name in ("and", "or", "xor"):
            a, b = read(operands[1], type_name), read(operands[2], type_name)
            out(a & b if name == "and" else a | b if name == "or" else a ^ b)
        elif name in ("shl", "shr"):
            a = read(operands[1], type_name)
            bits = a.dtype.itemsize * 8
            amount = np.minimum(read(operands[2], "u32").astype(np.uint64), bits)  # PTX clamps to the width
            if name == "shl":
                unsigned = a.view({32: np.uint32, 64: np.uint64}[bits]).astype(object)
                out(np.array([(int(x) << int(s)) & ((1 << bits) - 1) for x, s in zip(unsigned, amount)],
                             dtype=np.uint64).astype({32: np.uint32, 64: np.uint64}[bits]).view(a.dtype))
            else:
                out(np.array([int(x) >> min(int(s), bits - 1) if type_name[0] == "s" else
                              (int(x) >> int(s) if s < bits else 0) for x, s in zip(a, amount)],
                             dtype=object).astype(np.int64 if type_name[0] == "s" else np.uint64).astype(a.dtype))
        elif name == "max":
            a, b = read(operands[1], type_name), read(operands[2], type_name)
            out(_float_max(a, b) if type_name[0] == "f" else np.maximum(a, b))
        elif name == "setp":
            comparison = parts[1]
            a, b = read(operands[1], type_name), read(operands[2], type_name)
            either_nan = (np.isnan(a) | np.isnan(b)) if type_name[0] == "f" else np.zeros(machine.lanes, bool)
            result = np.asarray({"lt": a < b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": (a != b) & ~either_nan,
                                 "neu": (a != b) | either_nan, "nan": either_nan}[comparison], dtype=bool)
            if len(parts) == 4:  # setp.cmp.bool.type d, a, b, c: the comparison combined with predicate c
                other = read(operands[3].lstrip("!"), "pred") ^ operands[3].startswith("!")
                result = {"and": result & other, "or": result | other, "xor": result ^ other}[parts[2]]
            out(result)
        elif name == "selp":
            out(np.where(read(operands[3], "pred"), read(operands[1], type_name), read(operands[2], type_name)))
        elif name == "bfe":
            a = read(operands[1], "u32")
            start, length = int(operands[2]), int(operands[3])
            out((a >> np.uint32(start)) & np.uint32((1 << length) - 1))
        elif name in ("rcp", "sqrt") and "rn" in parts:
            a = read(operands[1], type_name)
            out(np.ones_like(a) / a if name == "rcp" else np.sqrt(a))
        elif name in APPROXIMATION_ERRORS and "approx" in parts:
            out(_approximate(name, "ftz" in parts, read(operands[1], type_name)))
        elif name == "cvt":
            convert(machine, parts, operands, out)
        else:
            raise NotImplementedError(f"the PTX simulator does not know {instruction.opcode}")


def _add_contracted(machine: Machine, operands: list[str], subtract: bool, type_name: str) -> np.ndarray:
    """add/sub without rounding modifier: where an operand still holds the product of such a `mul`, the sum is
    rounded once with the unrounded product (the fma ptxas makes of the pair), elsewhere an ordinary add/sub."""
    a, b = machine.read(operands[1], type_name), machine.read(operands[2], type_name)
    result = a - b if subtract else a + b
    for position, (register, other) in enumerate(((operands[1], b), (operands[2], a))):
        product = machine.products.get(register)
        if product is None:
            continue
        x, y, lanes = product
        if position == 1 and subtract:  # a - x*y = fma(-x, y, a)
            x = -x
        addend = -other if position == 0 and subtract else other
        result = np.where(lanes, _fma(x, y, addend), result)
        break
    return result


def _fma(x: np.ndarray, y: np.ndarray, addend: np.ndarray) -> np.ndarray:
    """x * y + addend with the product unrounded: rounded once for float32; for float64 with the product's exact
    error term (Dekker), which is the fma itself but for rare ties and results near overflow or underflow."""
    if x.dtype == np.float32:
        # the product of two float32 is exact in float64; the sum is rounded to odd there, so that rounding it to
        # float32 afterwards rounds the exact value once (53 >= 24 + 2 bits)
        product, other = x.astype(np.float64) * y.astype(np.float64), addend.astype(np.float64)
        total, error = _two_sum(product, other)
        even = (total.view(np.uint64) & np.uint64(1)) == 0
        inexact = np.isfinite(total) & (error != 0) & even
        total = np.where(inexact, np.nextafter(total, np.where(error > 0, np.inf, -np.inf)), total)
        return total.astype(np.float32)
    product = x * y
    split = 134217729.0  # 2^27 + 1: Veltkamp's split of a float64 into two halves of 26 bits
    x_high = x * split - (x * split - x)
    y_high = y * split - (y * split - y)
    x_low, y_low = x - x_high, y - y_high
    product_error = ((x_high * y_high - product) + x_high * y_low + x_low * y_high) + x_low * y_low
    total, error = _two_sum(product, addend)
    fused = total + (error + product_error)
    usable = np.isfinite(fused) & (np.abs(x) < 2.0**500) & (np.abs(y) < 2.0**500) & (fused != 0)
    return np.where(usable, fused, product + addend)


def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a + b rounded, its rounding error): Knuth's error-free sum."""
    total = a + b
    back = total - a
    return total, (a - (total - back)) + (b - back)


def _float_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """PTX max.f32/f64: the other operand where one is NaN (NaN if both), +0.0 for +0.0 and -0.0."""
    larger = np.where(a > b, a, b)
    both_zero = (a == 0) & (b == 0)
    larger = np.where(both_zero, np.where(np.signbit(a) & np.signbit(b), a, np.abs(a)), larger)
    return np.where(np.isnan(a), b, np.where(np.isnan(b), a, larger))


def _approximate(name: str, flush: bool, x: np.ndarray) -> np.ndarray:
    """An .approx instruction: the exact result moved by the ISA's error bound (up on lanes whose input has an even
    bit pattern, down on the others), with .ftz flushing subnormal inputs and results to signed zero."""
    assert x.dtype == np.float32, f"{name}.approx is float32 only"
    tiny = np.finfo(np.float32).tiny
    if flush:
        x = np.where(np.abs(x) < tiny, np.copysign(np.float32(0), x), x)
    wide = x.astype(np.float64)
    exact = {"ex2": np.exp2, "lg2": np.log2, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
             "rcp": lambda v: 1 / v, "sqrt": np.sqrt, "rsqrt": lambda v: 1 / np.sqrt(v)}[name](wide)
    ulps, relative, absolute = APPROXIMATION_ERRORS[name]
    direction = np.where((x.view(np.uint32) & np.uint32(1)) == 0, 1.0, -1.0)
    spacing = np.spacing(np.abs(exact.astype(np.float32))).astype(np.float64)
    moved = exact * (1 + direction * relative) + direction * (absolute + ulps * spacing)
    result = np.where(np.isfinite(exact) & (exact != 0), moved, exact).astype(np.float32)
    if flush:
        result = np.where(np.abs(result) < tiny, np.copysign(np.float32(0), result), result)
    return result


def convert(machine: Machine, parts: list[str], operands: list[str], out: Any) -> None:
    """cvt: rounding modifiers rn (nearest even) and rzi (toward zero, saturating to the integer range)."""
    target, source = parts[-2], parts[-1]
    value = machine.read(operands[1], source)
    if source[0] == "f" and target[0] == "f":
        if "rzi" in parts:
            out(np.trunc(value))
        else:
            out(value.astype(NUMPY_TYPES[target]))
    elif source[0] == "f":
        out(_saturating_int(value.astype(np.float64), target))
    elif target[0] == "f":
        out(value.astype(np.float64).astype(NUMPY_TYPES[target]) if target != "f32" or value.dtype.itemsize < 8
            else value.astype(NUMPY_TYPES[target]))
    else:  # integer to integer: truncate to the target, then widen by the target's signedness
        out(value.astype(NUMPY_TYPES[target]))


def simulate(source: str, buffers: list[np.ndarray], threads: int, contract: bool = CONTRACT) -> None:
    """Run a PTX entry on host byte arrays (one per `.param`), `threads` lanes."""
    Machine(Module(source), buffers, threads, contract).run()


class SimulatedProgram(Program):
    def __init__(self, source: str, block_size: int | None = None) -> None:
        self.module = Module(source)
        self.block_size = block_size or BLOCK_SIZE  # a workgroup kernel's blocks are its local size

    def __call__(self, buffers: list[Any], global_size: int, wait_for: tuple[Event, ...] = ()) -> Event:
        # whole blocks for this launch's size, as the cuda backend launches (a shape class's kernel runs at many sizes)
        threads = max(1, -(-global_size // self.block_size)) * self.block_size
        Machine(self.module, buffers, threads, block_size=self.block_size).run()
        return COMPLETED


class SimulatedCudaDevice(Device):
    """Runs the cuda backend's PTX in this simulator: a test device for the renderer's semantics."""

    def __init__(self, name: str = "ptxsim:0") -> None:
        self.name = name
        # an H100's groups and shared memory, so that workgroup kernels (ir/group_reduce.py) run here too
        self.info = DeviceInfo(max_local_size=1024, local_memory_bytes=48 * 1024, warp_width=32,
                               extra={"simulates": "PTX (tests/ptx_simulator.py)"})
        self.pool = HostMemoryPool(name)
        self.renderer = PTXRenderer()
        self._programs: dict[str, SimulatedProgram] = {}

    def render(self, kernel: KernelIR) -> str:
        return self.renderer.render(kernel)

    def compile(self, kernel: KernelIR) -> Program:
        source = self.render(kernel)
        program = self._programs.get(source)
        if program is None:
            program = self._programs[source] = SimulatedProgram(source, kernel.local_size)
        return program


def probe() -> list[Device]:
    return [SimulatedCudaDevice()]
