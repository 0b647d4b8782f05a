"""Vectorization (SLP): groups of stores to consecutive elements become vector stores, and their values vectors.

Lowering with tiles (ir/opt.py) leaves each work item with scalar stores to consecutive elements of the output and
values that differ only along that run: loads at consecutive indices, the same op in every lane, reduces over the
same loops. Packing walks the values of such a group lane by lane from the stores up: lanes that are one node
become a broadcast, loads at consecutive indices one vector load, lanes with one op the op on packed sources, and
anything else a vector built from the scalar lanes. Reduces can also be packed from groups given by lowering (a
reduce split into lanes, see `lower_kernel`); their scalar users then read lanes of the vector result.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable

from ember.core import dtype as dtypes
from ember.core.dtype import DType
from ember.core.ops import Op
from ember.core.walk import compute_bottom_up, evaluate
from ember.ir.ir import Builder, IRNode, IROp, KernelIR, linear_terms, topological_nodes

# the ALU ops a vector can carry, lane by lane, when the renderer supports them (DeviceInfo.vector_ops)
VECTOR_ALU_OPS = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.NEG, Op.MAX, Op.CMPLT, Op.CMPEQ, Op.WHERE, Op.TRUNC,
                            Op.SQRT, Op.EXP2, Op.LOG2, Op.SIN, Op.RECIPROCAL, Op.CAST, Op.BITCAST, Op.AND, Op.OR, Op.SHR,
                            Op.SHL, Op.XOR, Op.NOT})
VECTOR_DTYPES = frozenset({dtypes.float32, dtypes.float64})
# the fewest lanes of a narrower vector that stores what a row's whole vectors leave over (store_groups): the float4
# of every vector ISA; a device of 4-lane vectors (wgpu, cuda) keeps its leftovers scalar
MIN_NARROW_LANES = 4
# integer lanes are packed only as the bits of numbers converted to floats (packed quantized weights): loaded, their
# bits picked by masks and shifts, reinterpreted, converted; as many lanes as the float vector they become (a vector
# of 8 bytes under 8 float32 lanes), and not by arithmetic, whose overflow vectors need not wrap as scalars do ...
INTEGER_LANE_OPS = frozenset({IROp.LOAD, Op.CAST, Op.BITCAST, Op.AND, Op.OR, Op.SHR, Op.SHL})
# ... but for 32-bit unsigned lanes, which wrap modulo 2^32 in C's scalars and vectors alike (and in OpenCL C's and
# WGSL's): a counter-based random number's hash (core/creation.py) runs in vectors of uint32 under its float32 lanes
UNSIGNED_LANE_OPS = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.XOR})
# in a device's vector_ops: its renderer selects between vectors by one scalar condition (a WHERE whose lanes all
# read one condition, as an embedding's one-hot row or a causal mask's position shared by a row's lanes)
SCALAR_CONDITION = "WHERE with a scalar condition"
# packing one group of lanes: yields the groups of source lanes it needs packed, returns the vector (or None)
Packing = Generator[tuple[IRNode, ...], IRNode | None, IRNode | None]


def lanes_for(dtype: DType, vector_bytes: int) -> int:
    return vector_bytes // dtype.itemsize if dtype in VECTOR_DTYPES else 1


def index_key(index: IRNode) -> tuple[tuple[tuple[int, int], ...], int]:
    """An index as (its non-constant terms, its constant): indices with equal terms differ by their constants."""
    terms, constant = linear_terms(index)
    merged: dict[int, int] = {}
    for term, coefficient in terms:
        merged[id(term)] = merged.get(id(term), 0) + coefficient
    return tuple(sorted((key, value) for key, value in merged.items() if value)), constant


def consecutive(indices: Iterable[IRNode]) -> bool:
    keys = [index_key(index) for index in indices]
    return all(terms == keys[0][0] and constant == keys[0][1] + lane for lane, (terms, constant) in enumerate(keys))


class Vectorizer:
    """Rebuilds a kernel's DAG with a new builder, packing the given groups of scalar nodes into vectors."""

    def __init__(self, vector_bytes: int, vector_ops: frozenset) -> None:
        self.builder = Builder()
        self.vector_bytes = vector_bytes
        self.vector_ops = vector_ops
        self.scalars: dict[int, IRNode] = {}  # old node id -> rebuilt scalar node
        self.vectors: dict[tuple[IRNode, ...], IRNode | None] = {}  # lanes -> vector (None: cannot pack)
        self.lane_of: dict[int, tuple[IRNode, int]] = {}  # old reduce id -> (its vector, lane)

    # ---- scalars --------------------------------------------------------------------------------------------

    def scalar(self, root: IRNode) -> IRNode:
        """The rebuilt scalar node; a packed reduce is read as a lane of its vector."""
        def rebuilt(node: IRNode) -> IRNode:
            if id(node) in self.lane_of:
                vector, lane = self.lane_of[id(node)]
                return self.builder.gep(vector, lane)
            return self.builder.rebuild(node, [self.scalars[id(src)] for src in node.srcs])

        return compute_bottom_up(root, lambda node: () if id(node) in self.lane_of else node.srcs, rebuilt,
                                 self.scalars)

    # ---- packing --------------------------------------------------------------------------------------------

    def pack(self, lanes: tuple[IRNode, ...]) -> IRNode | None:
        """A vector whose lane i is lanes[i], or None where bool lanes cannot be packed by ops. Packing a group
        yields the groups of sources it needs packed first (walk.py: no recursion up a long chain of ops)."""
        return evaluate(lanes, None, self._pack, self.vectors)  # (lanes: their own key)

    def _pack(self, lanes: tuple[IRNode, ...]) -> Packing:
        b = self.builder
        first = lanes[0]
        width = len(lanes)
        if first.dtype.is_bool:
            return (yield from self._pack_ops(lanes)) if self._same_op(lanes) else None
        if all(lane is first for lane in lanes):
            return b.vectorize([self.scalar(lane) for lane in lanes])
        if self._integer_ramp(lanes):  # consecutive integers (a random counter's positions): first + (0, 1, 2, ...)
            steps = [b.const(lane, first.dtype) for lane in range(width)]
            return b.vector_alu(Op.ADD, first.dtype, b.vectorize([self.scalar(first)] * width), b.vectorize(steps))
        if not self._packable_width(first, width):
            return b.vectorize([self.scalar(lane) for lane in lanes])
        if first.op is IROp.LOAD and IROp.LOAD in self.vector_ops and self._same_op(lanes) and all(
                lane.srcs[0] is first.srcs[0] and lane.srcs[2:] == first.srcs[2:] for lane in lanes) and consecutive(
                lane.srcs[1] for lane in lanes):
            valid = self.scalar(first.srcs[2]) if len(first.srcs) == 3 else None
            return b.vector_load(self.scalar(first.srcs[0]), self.scalar(first.srcs[1]), valid, width)
        if IROp.SHUFFLE in self.vector_ops and IROp.LOAD in self.vector_ops:
            shuffled = self._shuffled_loads(lanes)
            if shuffled is not None:
                return shuffled
        if first.op is IROp.REDUCE and any(id(lane) in self.lane_of for lane in lanes):
            # reduces packed along their own lanes already (a row's reduce split into vector lanes, `run`), met
            # again across rows by a run of stores: read as lanes of those vectors, not packed again across rows
            # (their loads would be gathered, and the plan refused: x.exp().amax(1) over 4096 x 1000 ran scalar)
            return b.vectorize([self.scalar(lane) for lane in lanes])
        if first.op is IROp.REDUCE and IROp.REDUCE in self.vector_ops and self._same_op(lanes) and all(
                lane.srcs[1:] == first.srcs[1:] for lane in lanes):
            return (yield from self._pack_reduce(lanes))
        if self._index_ramp(lanes):  # consecutive integers as floats: the first one's, plus 0, 1, 2, ... (exact)
            steps = [b.const(float(lane), first.dtype) for lane in range(width)]
            return b.vector_alu(Op.ADD, first.dtype, b.vectorize([self.scalar(first)] * width), b.vectorize(steps))
        if first.op in VECTOR_ALU_OPS and first.op in self.vector_ops and self._same_op(lanes):
            packed = yield from self._pack_ops(lanes)
            if packed is not None:
                return packed
        return b.vectorize([self.scalar(lane) for lane in lanes])

    def _packable_width(self, first: IRNode, width: int) -> bool:
        """Whether lanes like `first` may form a vector of `width` lanes: floats fill one vector; integers ride
        under floats (see INTEGER_LANE_OPS), in at most one vector's bytes."""
        if first.dtype in VECTOR_DTYPES:
            return lanes_for(first.dtype, self.vector_bytes) == width
        lane_ops = INTEGER_LANE_OPS | UNSIGNED_LANE_OPS if first.dtype is dtypes.uint32 else INTEGER_LANE_OPS
        return (first.dtype.kind in "iu" and first.op in lane_ops and first.op in self.vector_ops
                and width * first.dtype.itemsize <= self.vector_bytes)

    def _index_ramp(self, lanes: tuple[IRNode, ...]) -> bool:
        """Whether lanes are casts to float of consecutive integers (a position, as a causal mask compares) whose
        values the float holds exactly (below 2^24 for float32): a vector built without gathering."""
        first = lanes[0]
        exact = 2.0**24 if first.dtype is dtypes.float32 else 2.0**53
        return (first.op is Op.CAST and Op.ADD in self.vector_ops and self._same_op(lanes)
                and first.srcs[0].dtype.kind in "iu" and first.srcs[0].width == 1
                and -exact < first.srcs[0].minimum and first.srcs[0].maximum + len(lanes) < exact
                and consecutive(lane.srcs[0] for lane in lanes))

    def _integer_ramp(self, lanes: tuple[IRNode, ...]) -> bool:
        """Whether lanes are consecutive 32-bit integers (an index plus 0, 1, 2, ...: a random counter's positions,
        as a uint32 lane reads them), so that their vector is one addition, not a vector built lane by lane."""
        first = lanes[0]
        return (first.dtype in (dtypes.int32, dtypes.uint32) and Op.ADD in self.vector_ops
                and len(lanes) * first.dtype.itemsize <= self.vector_bytes
                and all(lane.width == 1 and lane.dtype is first.dtype for lane in lanes) and consecutive(lanes))

    def _shuffled_loads(self, lanes: tuple[IRNode, ...]) -> IRNode | None:
        """Float lanes that are loads of one buffer under one guard, at one index but for a constant, and +0.0
        constants (lanes a padding masked out), spanning one to two vectors of elements: the one or two vector loads
        that cover the span, lanes picked from them (IROp.SHUFFLE), or None. A stride-2 read's elements (a strided
        convolution's phase split, a row's even or odd elements) cost two loads and a permute, not a load and an
        insert per lane. The second load ends at the last element read, so both read only elements between two that
        the lanes read: nothing past the buffer's ends."""
        width = len(lanes)
        loads = [lane for lane in lanes if not lane.is_const]
        if lanes[0].dtype not in VECTOR_DTYPES or len(loads) < 2 or any(
                lane.is_const and (lane.arg != 0 or math.copysign(1.0, lane.arg) < 0) for lane in lanes):
            return None
        if not all(load.op is IROp.LOAD and load.width == 1 for load in loads):
            return None
        runs = list(_memory_runs(loads).values())
        if len(runs) != 1:
            return None
        offsets = {id(load): constant for constant, load in runs[0]}
        low, lowest = min(runs[0], key=lambda entry: entry[0])
        high, highest = max(runs[0], key=lambda entry: entry[0])
        span = high - low
        if not width - 1 <= span <= 2 * width - 1:
            return None
        b = self.builder
        first = loads[0]
        param = self.scalar(first.srcs[0])
        valid = self.scalar(first.srcs[2]) if len(first.srcs) == 3 else None
        sources = [b.vector_load(param, self.scalar(lowest.srcs[1]), valid, width)]
        second_start = span - (width - 1)  # the second vector's first element, from the lowest one's
        if second_start > 0:
            sources.append(b.vector_load(param, b.add(self.scalar(highest.srcs[1]), -(width - 1)), valid, width))
        picks = []
        for lane in lanes:
            if lane.is_const:
                picks.append(-1)
                continue
            offset = offsets[id(lane)] - low
            picks.append(offset if offset < width else width + offset - second_start)
        return b.shuffle(sources, tuple(picks))

    @staticmethod
    def _same_op(lanes: tuple[IRNode, ...]) -> bool:
        first = lanes[0]
        return all(lane.op is first.op and lane.dtype is first.dtype and lane.arg == first.arg
                   and len(lane.srcs) == len(first.srcs) and lane.width == 1 for lane in lanes)

    def _pack_ops(self, lanes: tuple[IRNode, ...]) -> Packing:
        first = lanes[0]
        if first.op not in VECTOR_ALU_OPS or first.op not in self.vector_ops:
            return None
        if first.op in (Op.CMPLT, Op.CMPEQ) and lanes_for(first.srcs[0].dtype, self.vector_bytes) != len(lanes):
            return None  # masks are as wide as the values compared, and a vector's lanes fill one register
        if first.op in (Op.CAST, Op.BITCAST) and not (first.srcs[0].dtype.kind in "iu" and (
                first.dtype in VECTOR_DTYPES or first.dtype.kind in "iu")):
            return None  # only integers to floats (or integers of another sign) are converted lane by lane
        sources = []
        for position in range(len(first.srcs)):
            column = tuple(lane.srcs[position] for lane in lanes)
            if (position == 0 and first.op is Op.WHERE and SCALAR_CONDITION in self.vector_ops
                    and all(condition is column[0] for condition in column)):
                sources.append(self.scalar(column[0]))  # one condition for every lane: kept scalar
                continue
            packed = yield column
            if packed is None:
                return None
            sources.append(packed)
        return self.builder.vector_alu(first.op, first.dtype, *sources, arg=first.arg)

    def _pack_reduce(self, lanes: tuple[IRNode, ...]) -> Packing:
        first = lanes[0]
        value = yield tuple(lane.srcs[0] for lane in lanes)
        assert value is not None  # reduced values are numbers, never bools
        ranges = tuple(self.scalar(loop) for loop in first.srcs[1:])
        vector = self.builder.reduce(first.arg, value, ranges)
        for lane_number, lane in enumerate(lanes):
            self.lane_of.setdefault(id(lane), (vector, lane_number))
        return vector

    def _pack_stored(self, lanes: tuple[IRNode, ...]) -> IRNode:
        """The vector of a group of stored values: a narrower group (store_groups' leftovers) packed as a device
        whose vectors are that narrow would pack it, so every rule on a vector's lanes (comparisons as wide as
        the values compared, integers riding under floats) holds for it as it holds for a whole vector."""
        full_bytes = self.vector_bytes
        narrow = len(lanes) < lanes_for(lanes[0].dtype, full_bytes)
        if narrow:
            self.vector_bytes = full_bytes * len(lanes) // lanes_for(lanes[0].dtype, full_bytes)
        try:
            value = self.pack(lanes)
        finally:
            self.vector_bytes = full_bytes
        assert value is not None
        return value

    # ---- the kernel -----------------------------------------------------------------------------------------

    def run(self, kernel: KernelIR, reduce_groups: list[tuple[IRNode, ...]]) -> KernelIR:
        for group in reduce_groups:
            self.pack(group)
        return KernelIR(kernel.name, kernel.params, kernel.global_size, self.statements(kernel.sink),
                        kernel.index_dtype)

    def statements(self, sink: IRNode) -> IRNode:
        """A SINK of stores and loops, rebuilt with its runs of stores as vector stores."""
        return evaluate(sink, id, self._statements, {})

    def _statements(self, sink: IRNode) -> Generator[IRNode, IRNode, IRNode]:
        """Rebuild one SINK (a generator: it yields the body of each LOOP in it, and is sent that body rebuilt)."""
        statements = []
        for group in store_groups(sink.srcs, self.vector_bytes):
            first = group[0]
            if first.op is IROp.LOOP:
                ranges = tuple(self.scalar(range_) for range_ in first.srcs[1:])
                body = yield first.srcs[0]
                statements.append(self.builder.loop(list(body.srcs), ranges))
            elif len(group) == 1:
                statements.append(self.scalar(first))
            else:
                value = self._pack_stored(tuple(store.srcs[2] for store in group))
                statements.append(self.builder.store(self.scalar(first.srcs[0]), self.scalar(first.srcs[1]), value))
        return self.builder.sink(statements)


def store_groups(stores: Iterable[IRNode], vector_bytes: int) -> list[tuple[IRNode, ...]]:
    """The stores in runs of one vector's width at consecutive indices of one buffer; the rest one by one."""
    stores = list(stores)
    by_run: dict[tuple, dict[int, IRNode]] = {}
    for store in stores:
        if store.op is not IROp.STORE:
            continue
        width = lanes_for(store.srcs[2].dtype, vector_bytes)
        if width > 1 and store.srcs[2].width == 1:
            terms, constant = index_key(store.srcs[1])
            by_run.setdefault((id(store.srcs[0]), terms, store.srcs[2].dtype), {}).setdefault(constant, store)
    grouped: dict[int, tuple[IRNode, ...]] = {}
    for (_, _, dtype), by_constant in by_run.items():
        width = lanes_for(dtype, vector_bytes)
        for start, length in _runs(sorted(by_constant)):
            # a run a whole number of vectors does not divide: the vectors start where they hold the most computed
            # lanes (a padded row [0, x, ..., x, 0]: its interior); the stores left over before and after them go in
            # narrower vectors (halves, quarters, ... of MIN_NARROW_LANES lanes or more), the rest stay scalar
            first = max(range(start, start + length % width + 1), key=lambda offset: (sum(
                not by_constant[offset + lane].srcs[2].is_const
                for lane in range(width * ((length - (offset - start)) // width))), -offset))
            end = first + width * ((start + length - first) // width)
            origins = [(origin, width) for origin in range(first, end, width)]
            origins += _narrow_origins(start, first, width) + _narrow_origins(end, start + length, width)
            for origin, lanes in origins:
                group = tuple(by_constant[origin + lane] for lane in range(lanes))
                for store in group:
                    grouped[id(store)] = group
    result, emitted = [], set()
    for store in stores:
        group = grouped.get(id(store), (store,))
        if id(group[0]) not in emitted:
            emitted.add(id(group[0]))
            result.append(group)
    return result


def _narrow_origins(start: int, end: int, width: int) -> list[tuple[int, int]]:
    """(origin, lanes) of the narrower vectors that cover the stores from `start` to `end` left over by vectors of
    `width` lanes: the widest first, each half the one before at most, none under MIN_NARROW_LANES lanes (the
    stores past the last one stay scalar). A row of 28 values after a vector of 16: 8 and 4 lanes; of 8: one of 8."""
    origins = []
    lanes = width // 2
    while lanes >= MIN_NARROW_LANES:
        if end - start >= lanes:
            origins.append((start, lanes))
            start += lanes
        else:
            lanes //= 2
    return origins


def _runs(constants: list[int]) -> list[tuple[int, int]]:
    """(start, length) of each run of consecutive integers in a sorted list."""
    runs: list[tuple[int, int]] = []
    for constant in constants:
        if runs and runs[-1][0] + runs[-1][1] == constant:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((constant, 1))
    return runs


def vectorize(kernel: KernelIR, vector_bytes: int, vector_ops: frozenset) -> KernelIR:
    """The kernel with runs of consecutive stores, and its lane groups of reduces, packed into vectors."""
    if vector_bytes <= 0 or not vector_ops:
        return kernel
    reduce_groups = [group for group in kernel.lane_groups if lanes_for(group[0].dtype, vector_bytes) == len(group)]
    if not reduce_groups and not _has_store_runs(kernel.sink, vector_bytes):
        return kernel
    return Vectorizer(vector_bytes, vector_ops).run(kernel, reduce_groups)


def _has_store_runs(sink: IRNode, vector_bytes: int) -> bool:
    """Whether some run of stores (in the sink or in the body of a loop in it) can become a vector store."""
    sinks = [sink]
    while sinks:
        for group in store_groups(sinks.pop().srcs, vector_bytes):
            if len(group) > 1:
                return True
            if group[0].op is IROp.LOOP:
                sinks.append(group[0].srcs[0])
    return False


def gathers(kernel: KernelIR, nearby: bool = False) -> bool:
    """Whether the kernel builds vectors from computed scalars where it repeats work (inside a reduce's loop, or
    anywhere in a kernel without reduces): a sign that the vectors run across memory that is not contiguous. With
    `nearby`, vectors built from a few nearby runs of memory do not count (`nearby_loads`: the rule of a second
    choice, for a kernel that no vector plan fits without them)."""
    nodes = topological_nodes(kernel.sink)
    has_reduces, gathered = _gathered_vectors(nodes, nearby)
    if not gathered or has_reduces:
        return bool(gathered)
    # an elementwise kernel whose vectors gather only loaded values (and constants), fewer of them than the vector
    # arithmetic they feed (the phases of a strided convolution's gradient under a batch norm's backward): the
    # gathered loads cost less than the scalar arithmetic the vectors save
    loaded = {id(lane) for node in gathered for lane in node.srcs if not lane.is_const}
    arithmetic = sum(1 for node in nodes if node.width > 1 and node.op in VECTOR_ALU_OPS)
    return not all(lane.op is IROp.LOAD or lane.is_const for node in gathered for lane in node.srcs) or (
        len(loaded) > arithmetic)


def gathers_in_loops(kernel: KernelIR, nearby: bool = False) -> bool:
    """Whether the kernel has reduces and builds a vector from computed scalars inside a reduce's loop: what
    `gathers` answers for a kernel with reduces, and what it answers for any kernel holding this one's nodes (each
    node's place inside or outside a loop is a function of its sources), so a plan's first tile row that gathers
    so shows that the whole tile does (ir/opt.py). `nearby` as for `gathers`."""
    has_reduces, gathered = _gathered_vectors(topological_nodes(kernel.sink), nearby)
    return has_reduces and bool(gathered)


def _gathered_vectors(nodes: tuple[IRNode, ...], nearby: bool) -> tuple[bool, list[IRNode]]:
    """Whether the nodes (sources first) have reduces, and their vectors built from computed scalars where work
    repeats: inside a reduce's loop, or anywhere where there are no reduces (not counting vectors of a few nearby
    runs of memory, with `nearby`)."""
    in_loop: dict[int, bool] = {}
    reduce_ranges = {id(range_) for node in nodes if node.op is IROp.REDUCE for range_ in node.srcs[1:]}
    for node in nodes:  # sources first
        in_loop[id(node)] = id(node) in reduce_ranges or (
            node.op is not IROp.REDUCE and any(in_loop[id(src)] for src in node.srcs))
    gathered = [node for node in nodes if node.op is IROp.VECTORIZE and (in_loop[id(node)] or not reduce_ranges)
                and any(lane is not node.srcs[0] for lane in node.srcs) and not all(lane.is_const for lane in node.srcs)
                and not repeated_loads(node.srcs) and not nearby_loads(node.srcs, nearby)]
    return bool(reduce_ranges), gathered


def repeated_loads(lanes: tuple[IRNode, ...]) -> bool:
    """Whether vector lanes are loads each read by two or more lanes (a pooled window's value spread over its
    positions: [a, a, b, b, ...]): building the vector costs at most half the lanes' scalar loads, not a gather."""
    return all(lane.op is IROp.LOAD for lane in lanes) and 2 * len({id(lane) for lane in lanes}) <= len(lanes)


def nearby_loads(lanes: tuple[IRNode, ...], runs: bool = False) -> bool:
    """Whether vector lanes are loads of one buffer within a span of a few vectors (a stride-2 pooling window's
    elements, a tile of two short rows): the lanes' cache lines are those of a vector load or two, and building the
    vector costs its loads, not a walk across memory. With `runs`, also lanes in a few such runs, up to a quarter as
    many as lanes, of one buffer or several, each lane a constant, a load, or ops of one load and constants (a
    strided convolution's input gradient interleaving its phases between zeros, a row's end and the next row's
    start): they cost their loads and ops, but a narrower vector that reads one run is better where one fits (a
    batch norm's statistics over 28x28 maps: 2-3x faster in 8 lanes than in 16 across two maps)."""
    loads = []
    for lane in lanes:
        if lane.is_const and runs:
            continue
        load = _lane_load(lane) if runs else lane if lane.op is IROp.LOAD else None
        if load is None:
            return False
        loads.append(load)
    spans = [[constant for constant, _ in run] for run in _memory_runs(loads).values()]
    return 0 < len(spans) <= (max(1, len(lanes) // 4) if runs else 1) and all(
        max(constants) - min(constants) < 4 * len(lanes) for constants in spans)


def _memory_runs(loads: list[IRNode]) -> dict[tuple, list[tuple[int, IRNode]]]:
    """Loads by the run of memory they read (one buffer, one guard, one index but for a constant), each with its
    index's constant."""
    runs: dict[tuple, list[tuple[int, IRNode]]] = {}
    for load in loads:
        terms, constant = index_key(load.srcs[1])
        runs.setdefault((id(load.srcs[0]), terms, *map(id, load.srcs[2:])), []).append((constant, load))
    return runs


def _lane_load(lane: IRNode) -> IRNode | None:
    """The load a vector's lane is computed from with constants only (the lane itself, or ops of it and
    constants), or None."""
    while lane.op is not IROp.LOAD:
        sources = [source for source in lane.srcs if not source.is_const]
        if lane.op not in VECTOR_ALU_OPS or len(sources) != 1:
            return None
        lane = sources[0]
    return lane


def vector_width(kernel: KernelIR) -> int:
    """The width of a kernel's widest vector in float32 lanes, as DeviceInfo.preferred_vector_width counts (1: none)."""
    return max((node.width * node.dtype.itemsize // 4 for node in topological_nodes(kernel.sink)
                if node.width > 1 and node.dtype in VECTOR_DTYPES), default=1)

