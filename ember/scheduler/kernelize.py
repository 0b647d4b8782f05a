"""The kernelizer: which nodes of a lazy graph are stored (kernel boundaries), and each kernel's steps.

Fusion rule (DESIGN.md principle 4): elementwise and movement ops always fuse; a reduce fuses into the kernel that
consumes it when every output element of that kernel uses a different reduce result (no EXPAND on the way) and it is
not inside another reduce, or when it reduces the last axis and is read back along it by a kernel whose work items
walk whole rows (row fusion, ir/kernel.py: softmax is one kernel); otherwise the reduce is stored by a kernel of its
own. CONTIGUOUS and COPY always mark a boundary; a fused attention's output (`fused_attention`) keeps all its
reduces in its kernel. Elementwise work with several consumer kernels is recomputed by each, unless it is expensive
(SHARED_WORK_LIMIT distinct ops per element or more): then it is stored once, so a recurrence (an RNN's cell state
over time steps) costs linear work, not quadratic. Elementwise work that a kernel reads under a broadcast (a
softmax's output in the matmul of its gradient, a normalized activation in the next matmul) is evaluated once per
use, not once per element: it is stored when it costs EXPENSIVE_WORK weighted ops per element or more and the
repeated evaluations add up to BROADCAST_WORK_LIMIT weighted ops (so a small value broadcast a little stays fused);
a stored value is never larger than what it is computed from (a quantized weight is dequantized inside its matmul,
but the scales of its blocks are stored). A large reduce whose result its kernel pads (PADDED_REDUCE_WORK) is
stored, so that no mask guards its loop's loads; so is a large sum of products followed by an epilogue on a device
that packs matmuls (PACKED_EPILOGUE_WORK), which the packed form does not fuse. A kernel never reads more buffers
than its device binds (DeviceInfo.max_kernel_buffers): intermediates are stored until it fits.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import cast

from ember.core import dtype as dtypes
from ember.core.graph import Node
from ember.core.ops import ELEMENTWISE_OPS, FUSED_ATTENTION, MOVEMENT_OPS, REDUCE_OPS, Op
from ember.core.graph_templates import expand_in_place
from ember.core.shapes import prod
from ember.core.walk import post_order
from ember.ir.kernel import NO_ROW, REDUCED, ROW_SPANNING_OPS, SPAN, Kernel, KernelStep, row_state_below
from ember.scheduler import input_views, shape_classes
from ember.scheduler.devices import get_device
from ember.scheduler.program import Copy, Launch

INLINE_LEAVES = (Op.CONST, Op.ARANGE)
SHARED_WORK_LIMIT = 256  # elementwise ops per element above which a node read by several kernels is stored
SHARED_READ_LIMIT = 8  # buffers (of its size) read per element from which a node read by several kernels is stored
EXPENSIVE_WORK = 4  # weighted ops per element from which a value read under a broadcast may be stored
BROADCAST_WORK_LIMIT = 1 << 18  # weighted ops of repeated evaluation from which it is stored
# a concatenation (padded parts joined by ADD, or OR for bools: core/movement.py's cat; a split's gradient) read under
# a broadcast counts this much per element: each read of it is a masked load of every part, which keeps its reader
# from packed panels and vectors (nanoGPT's q, k and v gradients joined into the input projection's: its three
# matmuls were register tiles of 18 masked loads, 6.7 ms of a 60 ms step; stored once, they are plain matmuls)
JOINED_PARTS_WORK = EXPENSIVE_WORK
TRANSCENDENTAL_OPS = frozenset({Op.RECIPROCAL, Op.SQRT, Op.EXP2, Op.LOG2, Op.SIN, Op.DIV, Op.IDIV, Op.MOD})
TRANSCENDENTAL_WEIGHT = 8  # these become polynomial approximations or divisions: several ops each
MAX_KERNEL_OPS = 1024  # ops (elementwise, movement, reduce) above which a kernel is split by storing intermediates
# an int32 reduce of at most this many elements per output, read once by an outer reduce, is computed in a loop
# inside that reduce's loop (a quantized product's sum per block of 16 or 32 bytes); a longer one (a stage of a
# staged int32 maximum or sum: chunks of 4,096) is stored: nested, a maximum of 3*10^6 int32 values was one serial
# loop of every element on one work item (and past wgpu's loop limit)
MAX_NESTED_EXTENT = 256
# a reduce whose result a kernel pads (a PAD on the way from the kernel's output: a concatenation of matmul results,
# an RNN's state gradients joined with the initial state's zeros) is stored by a kernel of its own when it reads at
# least PADDED_REDUCE_WORK elements, PADDED_REDUCE_DEPTH or more per result: fused, the pad's mask guarded every
# load of its loop and kept it from packed panels (char_lstm's 2048 x 512 @ 512 x 128 padded to 2112 rows: 2.3 ms),
# while stored, the pad is a copy of a result a tenth the size of what the reduce read or less
PADDED_REDUCE_WORK = 1 << 20
PADDED_REDUCE_DEPTH = 16
# a float32 sum of products (a matmul, a convolution) of at least PACKED_EPILOGUE_WORK multiply-adds and
# PACKED_EPILOGUE_DEPTH a result, followed in its kernel by elementwise work (a bias, an activation), is stored by a
# kernel of its own on a device that packs matmuls (DeviceInfo.packed_matmul): a packed matmul has no epilogue, and
# fused, the product was a tiled kernel instead (a convolution of 128 filters over 28 x 28 pixels at batch 8 with its
# bias and ReLU: 91 ms, against 6.4 ms stored and packed, the epilogue 0.1 ms); the epilogue then fuses into the
# kernel reading the result. Smaller products stay fused: an RNN step's 64 x 128 x 384 would add a launch a step
PACKED_EPILOGUE_WORK = 1 << 24
PACKED_EPILOGUE_DEPTH = 8


ScheduleItem = Launch[Node] | Copy[Node]  # kernelize's steps over nodes (program.py: the one kind of each)


BufferLimit = Callable[[str], int]  # device name -> the most buffers one kernel may bind there, its output included


def unlimited_buffers(device: str) -> int:
    return 2**31 - 1


def op_work(op: Op) -> int:
    """The kernelizer's cost of one op per element: weighted elementwise ops (TRANSCENDENTAL_WEIGHT for those
    that become polynomials or divisions, 1 for the others; 0 for movement, reduces and sources)."""
    return TRANSCENDENTAL_WEIGHT if op in TRANSCENDENTAL_OPS else int(op in ELEMENTWISE_OPS)


def find_boundaries(roots: list[Node], buffer_limit: BufferLimit = unlimited_buffers) -> list[Node]:
    """Every node to store, dependencies first (the roots included). Copies of graph templates still collapsed
    (TEMPLATE nodes: a caller other than the schedule cache, which expands a copy of the graph) are expanded in
    place first."""
    expand_in_place(roots)
    boundaries: dict[int, Node] = {}
    walks = KernelWalks(boundaries)
    pending = [root for root in roots if not root.realized] + _deep_cuts(roots)
    while pending:
        _discover(pending, boundaries)
        # A boundary found late (e.g. the source of a COPY) changes the kernels walked before it was known:
        # walk every kernel again with the final set (KernelWalks: those a new boundary changed); that pass gives
        # the dependencies (and rarely more nodes).
        depends_on = {id(root): walks.dependencies(root) for root in boundaries.values()}
        pending = [node for found in depends_on.values() for node in found if id(node) not in boundaries]
        if not pending:
            pending = _expensive_shared_nodes(list(boundaries.values()), walks)
        if not pending:
            pending = _broadcast_recompute_cuts(list(boundaries.values()), walks)
        if not pending:
            pending = _oversized_kernel_cuts(list(boundaries.values()), walks)
        if not pending:
            pending = _buffer_limit_cuts(list(boundaries.values()), walks, buffer_limit)
    return post_order([root for root in roots if not root.realized], lambda node: depends_on[id(node)])


class KernelWalks:
    """Each kernel's interior (`_interior`) and stored dependencies (`_kernel_dependencies`) while find_boundaries
    runs its passes, kept until a node of the kernel's interior becomes a boundary: boundaries only grow, and a
    walk stops at them, so a boundary outside a kernel's interior never changes its walks (each pass walked every
    kernel again: char_lstm's cold schedule spent 0.5 s of its 1.2 s kernelizing in these walks). Also which
    kernels `_broadcast_recompute_cuts` found nothing to cut in since their interior was walked (it decides per
    kernel, from its interior alone)."""

    def __init__(self, boundaries: dict[int, Node]) -> None:
        self.boundaries = boundaries
        self._applied = 0  # boundaries (in insertion order) whose kernels' walks were forgotten
        self._interiors: dict[int, list[Node]] = {}
        self._dependencies: dict[int, list[Node]] = {}
        self._kernels_of: dict[int, list[int]] = {}  # node -> the kernels whose kept interior holds it
        self.uncut: set[int] = set()  # kernels _broadcast_recompute_cuts chose nothing in (interior unchanged)

    def interior(self, root: Node) -> list[Node]:
        self._forget_changed()
        interior = self._interiors.get(id(root))
        if interior is None:
            interior = self._interiors[id(root)] = _interior(root, self.boundaries)
            for node in interior:
                self._kernels_of.setdefault(id(node), []).append(id(root))
        return interior

    def dependencies(self, root: Node) -> list[Node]:
        if root.op is Op.COPY:  # (its source: no walk)
            return _kernel_dependencies(root, self.boundaries)
        self.interior(root)  # (kept with the nodes whose storing changes the walk)
        found = self._dependencies.get(id(root))
        if found is None:
            found = self._dependencies[id(root)] = _kernel_dependencies(root, self.boundaries)
        return found

    def _forget_changed(self) -> None:
        if len(self.boundaries) == self._applied:
            return
        added = list(itertools.islice(self.boundaries.values(), self._applied, None))
        self._applied = len(self.boundaries)
        for node in added:
            for kernel in self._kernels_of.pop(id(node), ()):
                self._interiors.pop(kernel, None)
                self._dependencies.pop(kernel, None)
                self.uncut.discard(kernel)


def _discover(pending: list[Node], boundaries: dict[int, Node]) -> None:
    """Add the pending kernel roots and every node they need stored, transitively. Each round adds all the nodes
    found before walking their kernels, so a walk stops at every boundary known (walking a chain cut into many
    kernels top-down one cut at a time would walk the whole chain below each cut: quadratic)."""
    while pending:
        added = {id(node): node for node in pending if id(node) not in boundaries}
        boundaries.update(added)
        pending = [node for kernel_root in added.values() for node in _kernel_dependencies(kernel_root, boundaries)
                   if id(node) not in boundaries]


def _kernel_dependencies(kernel_root: Node, boundaries: dict[int, Node]) -> list[Node]:
    """The stored nodes the kernel (or copy) computing kernel_root reads."""
    if kernel_root.op is Op.COPY:
        source = kernel_root.srcs[0]
        return [] if source.realized else [source]
    found: list[Node] = []
    _walk(kernel_root, boundaries, found)
    return found


def _interior(kernel_root: Node, boundaries: dict[int, Node]) -> list[Node]:
    """The nodes a kernel computes (not stored elsewhere, not inlined constants), each after its sources."""

    def computed_sources(node: Node) -> list[Node]:
        return [source for source in node.srcs
                if not (source.realized or source.op in INLINE_LEAVES or id(source) in boundaries)]

    return post_order(computed_sources(kernel_root), computed_sources)


def _expensive_shared_nodes(kernel_roots: list[Node], walks: KernelWalks) -> list[Node]:
    """Elementwise nodes that several kernels would recompute and that cost SHARED_WORK_LIMIT ops per element or
    more, counting from the last stored node below. A floating value costs the distinct elementwise ops it needs
    (a value used twice below it, such as an erfc's t in its Horner steps, is computed once: counted as a tree, a
    40-op GELU counted in the thousands and was cut into three stored pieces, each recomputing most of it). Integer
    bit mixing (a random number's hash of the element index) is counted as a tree, which stores it after a few
    rounds: a kernel that hashes the index itself is not vectorized. A value whose chain reads SHARED_READ_LIMIT
    buffers of its size or more is chosen too: each kernel recomputing it reads them all (a residual stream with
    dropout: the branches' outputs and random bits), storing it costs one write and one read a kernel. Each one
    chosen counts as stored for the nodes above it, so a long recurrence is stored every few steps rather than at
    every node."""
    kernels_using: dict[int, int] = {}
    in_order: list[Node] = []
    for root in kernel_roots:
        if root.op is Op.COPY:
            continue
        for node in walks.interior(root):
            if id(node) not in kernels_using:
                kernels_using[id(node)] = 0
                in_order.append(node)
            kernels_using[id(node)] += 1
    needs: dict[int, int] = {}  # node -> bit set of the elementwise ops its value needs since the last stored node
    tree_cost: dict[int, int] = {}  # node -> those ops counted once per use (a tree)
    reads: dict[int, int] = {}  # node -> bit set of the buffers of its size (or larger) that its value reads
    buffer_bit: dict[int, int] = {}
    chosen: list[Node] = []
    ordered = post_order(in_order, lambda node: [source for source in node.srcs if id(source) in kernels_using])
    for position, node in enumerate(ordered):
        below = read = 0
        for source in node.srcs:
            below |= needs.get(id(source), 0)
            if id(source) in kernels_using:
                read |= reads[id(source)]
            elif source.op not in INLINE_LEAVES and source.size >= node.size:
                read |= 1 << buffer_bit.setdefault(id(source), len(buffer_bit))
        elementwise = node.op in ELEMENTWISE_OPS
        tree = min(sum(tree_cost.get(id(source), 0) for source in node.srcs) + elementwise, SHARED_WORK_LIMIT)
        if elementwise:
            below |= 1 << position
            work = below.bit_count() if node.dtype.is_float or node.dtype.is_bool else tree
            if kernels_using[id(node)] > 1 and (work >= SHARED_WORK_LIMIT or read.bit_count() >= SHARED_READ_LIMIT):
                chosen.append(node)
                below, tree, read = 0, 0, 1 << buffer_bit.setdefault(id(node), len(buffer_bit))
        needs[id(node)] = below
        tree_cost[id(node)] = tree
        reads[id(node)] = read
    return chosen


def _broadcast_recompute_cuts(kernel_roots: list[Node], walks: KernelWalks) -> list[Node]:
    """Elementwise nodes that a kernel evaluates many times per element (read under an EXPAND, e.g. as a matmul
    operand) and that are expensive to evaluate: storing one costs a write and a read per use, recomputing it costs
    its whole chain per use. The span of a node is the largest iteration domain above it in the kernel (a reduce's
    source, an expanded shape); a node is chosen when it reads memory and is no larger than the largest buffer its
    chain reads (index arithmetic stays recomputed like a constant, and a decompression, such as a quantized
    weight's dequantization, is never stored: it is read in its compact form), its span is at least twice its size,
    its chain costs EXPENSIVE_WORK weighted ops or more, and the repeated evaluations cost BROADCAST_WORK_LIMIT or
    more. A concatenation costs JOINED_PARTS_WORK and may be as large as all the buffers it reads together (it is
    their values side by side). Only the highest such node of a chain is chosen in a pass (it covers the nodes
    below)."""
    chosen: list[Node] = []
    for root in kernel_roots:
        if root.op is Op.COPY or id(root) in walks.uncut or fused_attention(root):
            continue
        cuts = _broadcast_cuts_of(root, walks.interior(root))
        if cuts:
            chosen += cuts
        else:
            walks.uncut.add(id(root))
    return chosen


def _broadcast_cuts_of(root: Node, interior: list[Node]) -> list[Node]:
    """_broadcast_recompute_cuts for one kernel, whose interior (sources first) is `interior`."""
    chosen: list[Node] = []
    if not interior:
        return chosen
    computed = {id(node) for node in interior}
    cost: dict[int, int] = {}
    largest_read: dict[int, int] = {}  # bytes of the largest buffer a node's chain loads (0: index arithmetic)
    total_read: dict[int, int] = {}  # bytes of the buffers a node's chain loads (a buffer read twice, twice)
    joins: set[int] = set()  # the concatenations: ADDs (ORs of bools) of PADs and of such joins
    for node in interior:
        below = sum(cost.get(id(source), 0) for source in node.srcs)
        joined = node.op is (Op.OR if node.dtype.is_bool else Op.ADD) and all(
            source.op is Op.PAD or id(source) in joins for source in node.srcs)
        if joined:
            joins.add(id(node))
        cost[id(node)] = min((JOINED_PARTS_WORK if joined else op_work(node.op)) + below, BROADCAST_WORK_LIMIT)
        reads = [largest_read[id(source)] if id(source) in computed else
                 0 if source.op in INLINE_LEAVES else source.size * source.dtype.itemsize for source in node.srcs]
        total_read[id(node)] = sum(total_read[id(source)] if id(source) in computed else read
                                   for source, read in zip(node.srcs, reads))
        # (a join may be stored as large as its parts together: it is their values side by side)
        largest_read[id(node)] = total_read[id(node)] if joined else max(reads, default=0)
    span: dict[int, int] = {}
    covered: set[int] = set()
    for node in (root, *reversed(interior)):  # consumers before their sources
        node_span = max(node.size, span.get(id(node), 0))
        if id(node) in covered:
            covered.update(id(source) for source in node.srcs)
            continue
        if (node is not root and node.op in ELEMENTWISE_OPS
                and 0 < node.size * node.dtype.itemsize <= largest_read[id(node)]
                and node_span >= 2 * node.size and cost[id(node)] >= EXPENSIVE_WORK
                and (node_span - node.size) * cost[id(node)] >= BROADCAST_WORK_LIMIT):
            chosen.append(node)
            covered.update(id(source) for source in node.srcs)
            continue
        for source in node.srcs:
            if id(source) in computed:
                # a row's value read along the row is evaluated once per row (row fusion): not a broadcast
                source_span = source.size if _reads_a_row_value(node, source, computed) else node_span
                span[id(source)] = max(span.get(id(source), 0), source_span)
    return chosen


def _reads_a_row_value(node: Node, source: Node, computed: set[int]) -> bool:
    """Whether `node` is an EXPAND of the last axis over a value that the kernel computes from a reduce fused by
    rows (through elementwise ops): a kernel reaches a fused reduce through an EXPAND only by row fusion."""
    if node.op is not Op.EXPAND or row_state_below(node.op, node.arg, node.shape, source.shape, SPAN,
                                                   node.shape[-1] if node.shape else 0) != REDUCED:
        return False
    stack, seen = [source], set()
    while stack:
        current = stack.pop()
        if current.op in REDUCE_OPS:
            return True
        if id(current) not in seen:  # (shared values are walked once: a chain of them could branch exponentially)
            seen.add(id(current))
            stack.extend(below for below in current.srcs if id(below) in computed and below.op in ROW_VALUE_OPS)
    return False


ROW_VALUE_OPS = ELEMENTWISE_OPS | REDUCE_OPS  # what lies between a row-fused reduce and the EXPAND reading it


def _deep_cuts(roots: list[Node]) -> list[Node]:
    """Elementwise nodes to store so that no chain of ops between stored nodes is MAX_KERNEL_OPS long, chosen in
    one pass over the whole graph before any kernel is walked: a kernel's walk then never runs down a long chain
    (walking each of n kernels down a chain below it is quadratic). Counted by depth, so only deep graphs are cut;
    a node is stored only where it has no more elements than a root or the largest buffer below it (never a
    broadcast)."""
    depth: dict[int, int] = {}
    largest_below: dict[int, int] = {}
    largest_root = max((root.size for root in roots), default=0)
    chosen: list[Node] = []

    def computed_sources(node: Node) -> list[Node]:
        return [source for source in node.srcs if not (source.realized or source.op in INLINE_LEAVES)]

    for node in post_order([root for root in roots if not root.realized], computed_sources):
        sources = computed_sources(node)
        largest = max((largest_below[id(source)] for source in sources), default=0)
        largest_below[id(node)] = max([largest, *(source.size for source in node.srcs if source.realized)])
        if node.op in (Op.COPY, Op.CONTIGUOUS):  # always stored
            depth[id(node)] = 0
            continue
        depth[id(node)] = 1 + max((depth[id(source)] for source in sources), default=0)
        if depth[id(node)] >= MAX_KERNEL_OPS and node.op in ELEMENTWISE_OPS and node.size <= max(
                largest_below[id(node)], largest_root):
            chosen.append(node)
            depth[id(node)] = 0
    return chosen


def _oversized_kernel_cuts(kernel_roots: list[Node], walks: KernelWalks) -> list[Node]:
    """Nodes to store so that no kernel computes MAX_KERNEL_OPS ops or more (compilers take superlinear time on
    huge kernels). In a kernel that is too large, a node is stored once the ops below it since the last stored
    node reach the limit (counted as a tree: shared work counts once per use, so the pieces only get smaller),
    unless it has more elements than every buffer the kernel reads or writes (no broadcast is ever stored)."""
    chosen: list[Node] = []
    for root in kernel_roots:
        if root.op is Op.COPY:
            continue
        interior = walks.interior(root)
        if len(interior) + 1 < MAX_KERNEL_OPS:
            continue
        computed = {id(node) for node in interior}
        largest = max((source.size for node in (*interior, root) for source in node.srcs
                       if id(source) not in computed and source.op not in INLINE_LEAVES), default=root.size)
        largest = max(largest, root.size)
        cost: dict[int, int] = {}
        for node in interior:  # sources first
            work = 1 + sum(cost.get(id(source), 0) for source in node.srcs)
            if work >= MAX_KERNEL_OPS and node.size <= largest:
                chosen.append(node)
                work = 0
            cost[id(node)] = min(work, MAX_KERNEL_OPS)
    return chosen


def _buffer_limit_cuts(kernel_roots: list[Node], walks: KernelWalks, buffer_limit: BufferLimit) -> list[Node]:
    """Nodes to store so that no kernel reads more buffers than its device binds (WebGPU: a few dozen).

    Sources first, each node's set of buffers read is the union of its sources'; where it would pass the limit (the
    output takes one binding), the source reading the most buffers is stored instead, so it counts as one."""
    chosen: list[Node] = []
    for root in kernel_roots:
        if root.op is Op.COPY:
            continue
        budget = buffer_limit(cast(str, root.device)) - 1  # placed by the schedule's walk
        interior = walks.interior(root)
        computed = {id(node) for node in interior}
        reads: dict[int, frozenset[int]] = {}

        def reads_of(source: Node) -> frozenset[int]:
            if id(source) in computed:
                return reads[id(source)]
            return frozenset() if source.op in INLINE_LEAVES and not source.realized else frozenset({id(source)})

        for node in (*interior, root):
            combined = frozenset().union(*(reads_of(source) for source in node.srcs))
            while len(combined) > budget:
                splittable = [source for source in node.srcs if id(source) in computed and len(reads[id(source)]) > 1]
                if not splittable:
                    break  # one op reading more buffers than the limit directly: the backend says so at compile time
                largest = max(splittable, key=lambda source: len(reads[id(source)]))
                chosen.append(largest)
                computed.discard(id(largest))
                combined = frozenset().union(*(reads_of(source) for source in node.srcs))
            reads[id(node)] = combined
    return chosen


def _walk(kernel_root: Node, boundaries: dict[int, Node], found: list[Node]) -> None:
    """Find the nodes below kernel_root that must be stored by other kernels.

    A walk state is (node, inside a reduce, reached without an EXPAND, row, row length, reached through a PAD: a
    large reduce reached so is stored, PADDED_REDUCE_WORK; reached through an elementwise op outside any reduce, an
    epilogue: a large sum of products reached so is stored on a device that packs, PACKED_EPILOGUE_WORK). `row`
    follows the row fusion of ir/kernel.py: SPAN where one work item evaluates the node along a whole last axis (the
    kernel's output when lowering loops over its rows, the source of a fused reduce of the last axis), REDUCED where
    the node is read through an EXPAND of that axis from a SPAN (one value per row): a reduce of the last axis
    reached REDUCED is computed once per row by the work item that needs it (softmax's max and sum, layer_norm's
    mean and variance), so it is fused, and its source is a SPAN again. An int32 reduce reached inside another
    reduce without an EXPAND (each of its values read once: a quantized product's integer sum per block, which the
    outer reduce scales and sums) is fused too when it is short (MAX_NESTED_EXTENT), computed in a loop inside the
    outer reduce's loop; float reduces inside reduces are stored by a kernel of their own, except in a fused
    attention (`fused_attention`), which computes all its reduces in its one kernel."""
    seen: set[tuple[int, bool, bool, int, int, bool, bool]] = set()
    fused = fused_attention(kernel_root)  # (its reduces are all computed in the one kernel)
    padded = kernel_root.op is Op.PAD
    epilogue = kernel_root.op in ELEMENTWISE_OPS
    stack = [(source, kernel_root.op in REDUCE_OPS, True, *_row_of_sources(kernel_root), padded, epilogue)
             for source in kernel_root.srcs]
    while stack:
        node, inside_reduce, injective, row, row_length, padded, epilogue = stack.pop()
        key = (id(node), inside_reduce, injective, row, row_length, padded, epilogue)
        if key in seen:
            continue
        seen.add(key)
        if node.realized or node.op in INLINE_LEAVES:
            continue
        if id(node) in boundaries:
            found.append(node)
            continue
        row = row_state_below(node.op, node.arg, node.shape, node.srcs[0].shape if node.srcs else (), row,
                              row_length)
        if node.op in REDUCE_OPS and row == SPAN:  # a last-axis reduce read once per row: fused
            stack.extend((source, True, injective, SPAN, row_length, False, False) for source in node.srcs)
            continue
        if padded and node.op in REDUCE_OPS and not inside_reduce and not fused and _heavy_reduce(node):
            found.append(node)  # (PADDED_REDUCE_WORK)
            continue
        if epilogue and node.op in REDUCE_OPS and not inside_reduce and not fused and _packed_product(node):
            found.append(node)  # (PACKED_EPILOGUE_WORK)
            continue
        # (see the docstring; int32 only: the sort network's int64 records nest reduces the linearizer cannot)
        nested = inside_reduce and not (injective and node.dtype is dtypes.int32 and node.op in REDUCE_OPS
                                        and _reduced_extent(node) <= MAX_NESTED_EXTENT)
        if node.op in (Op.CONTIGUOUS, Op.COPY) or (node.op in REDUCE_OPS and (nested or not injective)
                                                   and not fused):
            found.append(node)
            continue
        if node.op in REDUCE_OPS:
            inside_reduce = True
            row, row_length = _row_of_sources(node)
        elif node.op is Op.EXPAND:
            injective = False
        padded = padded or node.op is Op.PAD
        epilogue = (epilogue or node.op in ELEMENTWISE_OPS) and not inside_reduce
        stack.extend((source, inside_reduce, injective, row, row_length, padded, epilogue) for source in node.srcs)


def fused_attention(node: Node) -> bool:
    """Whether a kernel root is a fused attention's output (core/functional.py: a CONTIGUOUS marked FUSED_ATTENTION):
    its nested reduces stay in its kernel, lowered as one flash attention kernel (ir/flash_attention.py), and no
    cut for broadcast recomputation splits it (its scores, read under the values' broadcast, are the point)."""
    return node.op is Op.CONTIGUOUS and node.arg == FUSED_ATTENTION


def _reduced_extent(node: Node) -> int:
    """The elements a reduce node combines into each of its outputs."""
    source_shape = node.srcs[0].shape
    return prod([source_shape[axis] for axis in node.arg])


def _heavy_reduce(node: Node) -> bool:
    """Whether a reduce reads enough, and enough per result, to be stored rather than padded (PADDED_REDUCE_WORK)."""
    return prod(node.srcs[0].shape) >= PADDED_REDUCE_WORK and _reduced_extent(node) >= PADDED_REDUCE_DEPTH


def _packed_product(node: Node) -> bool:
    """Whether a reduce is a float32 sum of products of float32 values (a matmul's, a convolution's; not of half
    values converted, which the packed form does not take) of PACKED_EPILOGUE_WORK or more, at least
    PACKED_EPILOGUE_DEPTH a result, on a device that packs matmuls (DeviceInfo.packed_matmul)."""
    if node.op is not Op.SUM or node.dtype is not dtypes.float32 or node.srcs[0].op is not Op.MUL \
            or prod(node.srcs[0].shape) < PACKED_EPILOGUE_WORK or _reduced_extent(node) < PACKED_EPILOGUE_DEPTH:
        return False
    for factor in node.srcs[0].srcs:
        while factor.op in MOVEMENT_OPS and not factor.realized:
            factor = factor.srcs[0]
        if factor.op is Op.CAST or factor.dtype is not dtypes.float32:
            return False
    return node.device is not None and get_device(node.device).info.packed_matmul


def _row_of_sources(node: Node) -> tuple[int, int]:
    """The row state (and row length) of the sources of a kernel's root or of a reduce it fuses: a reduce of its
    source's last axis, or an elementwise root (whose rows lowering loops over when it fuses a reduce by rows),
    evaluates its sources along whole rows."""
    if node.op in REDUCE_OPS:
        source_shape = node.srcs[0].shape
        if node.arg == (len(source_shape) - 1,) and source_shape[-1] > 1:
            return SPAN, source_shape[-1]
        return NO_ROW, 0
    if node.op in ROW_SPANNING_OPS and node.shape and node.shape[-1] > 1:
        return SPAN, node.shape[-1]
    return NO_ROW, 0


def build_kernel(root: Node, boundaries: set[int]) -> Launch[Node]:
    """The steps of the kernel that computes `root`; stored nodes below it become BUFFER parameters."""
    steps: list[KernelStep] = []
    position_of: dict[int, int] = {}
    inputs: list[Node] = []
    input_position: dict[int, int] = {}

    def leaf_step(node: Node) -> KernelStep:
        if id(node) not in input_position:
            inputs.append(node)
            input_position[id(node)] = len(inputs)
        return KernelStep(Op.BUFFER, (), input_position[id(node)], node.shape, node.dtype)

    def is_leaf(node: Node) -> bool:
        # a stored node is read from its buffer; constants are recomputed even when also stored (no dependency)
        return node is not root and (node.realized or (id(node) in boundaries and node.op not in INLINE_LEAVES))

    for node in post_order([root], lambda node: () if is_leaf(node) else reversed(node.srcs)):
        if is_leaf(node):
            step = leaf_step(node)
        elif node.op is Op.CONTIGUOUS:  # only ever a kernel root (elsewhere it is a boundary): its source's value
            step = steps[position_of[id(node.srcs[0])]]
        else:
            arg = node.arg.hex() if node.op is Op.CONST and isinstance(node.arg, float) else node.arg
            step = KernelStep(node.op, tuple(position_of[id(s)] for s in node.srcs), arg, node.shape, node.dtype)
        position_of[id(node)] = len(steps)
        steps.append(step)
    kernel = Kernel(tuple(steps), tuple(node.size for node in inputs))
    return Launch(root, tuple(inputs), input_views.rebased(kernel, _view_alignment(root)))


def _view_alignment(root: Node) -> int:
    """The input view alignment of the pool a kernel computing `root` runs on (input_views.rebased); 0 (no input
    views) for a pool that makes no views, an unplaced node, and inside shape_classes.by_class(), whose classes read
    offsets at launch already (the incremental runner replays a class kernel at other positions)."""
    if root.device is None or shape_classes.FORCED.get():
        return 0
    pool = get_device(root.device).pool
    if not pool.view_alignment:  # (a pool that makes no views)
        return 0
    return pool.input_view_alignment or pool.view_alignment


def kernel_groups(roots: list[Node], buffer_limit: BufferLimit = unlimited_buffers) -> list[tuple[Node, list[Node]]]:
    """Each stored node (kernel output or copy) with the nodes its kernel computes, dependencies first: what
    `kernelize` fuses, for pictures and debug output."""
    ordered = find_boundaries(roots, buffer_limit)
    boundaries = {id(node): node for node in ordered}
    return [(node, [] if node.op is Op.COPY else _interior(node, boundaries)) for node in ordered]


def kernelize(roots: list[Node], buffer_limit: BufferLimit = unlimited_buffers) -> list[ScheduleItem]:
    """The steps that realize `roots`: kernel launches and copies over nodes (program.py's Launch and Copy), in
    dependency order."""
    ordered = find_boundaries(roots, buffer_limit)
    boundary_ids = {id(node) for node in ordered}
    schedule: list[ScheduleItem] = []
    for node in ordered:
        if node.op is Op.COPY:
            schedule.append(Copy(node, node.srcs[0]))
        else:
            schedule.append(build_kernel(node, boundary_ids))
    return schedule
