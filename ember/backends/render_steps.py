"""The step skeleton every renderer shares: a kernel's linearized instructions handed, in order, to the renderer's
one method per IR `Step`, with the names of the values rendered so far kept in one place (`KernelBody`).

A renderer derives from `StepRenderer` and defines the methods named in `STEP_METHODS` (`value`, `open_loop`,
`close_loop`, `define_accumulator`, `update_accumulator`, `store`, `define_local`), each taking the kernel's body
and the instruction's node. A new `Step` is one entry in `STEP_METHODS` and one method in each renderer; a renderer
without it fails at its first kernel with an error naming the step, the method and the renderer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from ember.core.errors import CompileError
from ember.ir.ir import IRNode, IROp, KernelIR
from ember.ir.linearize import Step, linearize

STEP_METHODS: dict[Step, str] = {
    Step.VALUE: "value",  # compute a node (an ALU op, LOAD, VECTORIZE, GEP) and name it
    Step.DEFINE_ACC: "define_accumulator",  # a REDUCE's accumulator, set to the reduce's identity
    Step.LOOP: "open_loop",  # open the loop of a RANGE node (its counter is named after the node)
    Step.UPDATE_ACC: "update_accumulator",  # combine a REDUCE's value into its accumulator
    Step.END_LOOP: "close_loop",  # close the loop of a RANGE node
    Step.STORE: "store",  # a STORE node
    Step.DEFINE_LOCAL: "define_local",  # a scratch array of the work item (refuse_scratch_arrays where there is none)
    Step.GROUP_REDUCE: "group_reduce",  # a value combined over the work items of a group (workgroup kernels only)
    Step.DEFINE_SHARED: "define_shared",  # an array in the group's local memory (workgroup kernels only)
    Step.BARRIER: "barrier",  # the group's work items wait for each other (workgroup kernels only)
}
# steps only kernels for some devices contain: a renderer without the method fails on such a kernel only
OPTIONAL_STEPS = frozenset({Step.GROUP_REDUCE, Step.DEFINE_SHARED, Step.BARRIER})
assert set(STEP_METHODS) == set(Step), f"STEP_METHODS lacks {set(Step) - set(STEP_METHODS)}"


class KernelBody:
    """What one kernel's rendering keeps between steps: the name of each node rendered so far (by node id), a
    counter for fresh names, and the body's lines at an indentation depth. One per `render` call, so a renderer
    object can render several kernels at once (the c backend builds in a background thread)."""

    def __init__(self, kernel: KernelIR, constant: Callable[[IRNode], str], global_id: str = "gid",
                 depth: int = 0) -> None:
        self.kernel = kernel
        self.constant = constant  # a CONST node as an operand (a literal, or a register holding it)
        self.global_id = global_id  # the work item's index as an operand
        self.local_id = "ember_lid"  # a workgroup kernel's: the work item's index in its group, and the group's index
        self.group_id = "ember_group"
        self.names: dict[int, str] = {}
        self.counter = 0
        self.lines: list[str] = []
        self.declarations: list[str] = []  # lines a renderer puts before the body (a workgroup kernel's arrays)
        self.depth = depth

    def operand(self, node: IRNode) -> str:
        """A node as an operand: the name a step gave it, a constant, a buffer, or the work item's index."""
        name = self.names.get(id(node))
        if name is not None:  # (first: most operands are values named by a step)
            return name
        while node.op is IROp.AFTER:  # a buffer once statements ran: the buffer's name
            node = node.srcs[0]
        if node.op is IROp.CONST:
            return self.constant(node)
        if node.op is IROp.GLOBAL_ID:
            return self.global_id
        if node.op is IROp.LOCAL_ID:
            return self.local_id
        if node.op is IROp.GROUP_ID:
            return self.group_id
        if node.op is IROp.PARAM:
            return f"data{node.arg[0]}"
        return self.names[id(node)]

    def number(self) -> int:
        """A number not handed out before in this kernel (fresh names, a store's temporaries)."""
        number = self.counter
        self.counter += 1
        return number

    def name_of(self, node: IRNode, prefix: str) -> str:
        """A fresh name for a node's value: the prefix and the next number."""
        name = self.names[id(node)] = f"{prefix}{self.counter}"
        self.counter += 1
        return name

    def line(self, text: str) -> None:
        """A line of the body at the current depth (two spaces a level)."""
        self.lines.append("  " * self.depth + text)


def shared_array(buffer: IRNode) -> IRNode | None:
    """The DEFINE_SHARED a load or store addresses (through AFTER), or None for a buffer parameter."""
    while buffer.op is IROp.AFTER:
        buffer = buffer.srcs[0]
    return buffer if buffer.op is IROp.DEFINE_SHARED else None


Body = TypeVar("Body", bound=KernelBody)
StepMethod = Callable[[Body, IRNode], None]


class StepRenderer(Generic[Body]):
    """The base of every renderer: `render_steps` walks the kernel's linearized instructions and calls, for each,
    the renderer's method for its step (STEP_METHODS) with the body and the node. `language` names the renderer in
    messages."""

    language = "unnamed"
    renders_matrix_units = False  # whether the renderer renders IROp.MMA (a warp's matrix multiply step)

    def render_steps(self, body: Body) -> None:
        """Every instruction of the body's kernel, in order, handed to this renderer's method for its step."""
        methods = self.step_methods()
        for kind, node in linearize(body.kernel.sink):
            if node.op is IROp.MMA and not self.renders_matrix_units:
                raise CompileError(f"kernel {body.kernel.name} multiplies on matrix units (tensor cores' mma), which "
                                   f"the {self.language} renderer does not render (such kernels are made only for "
                                   "devices whose DeviceInfo lists matrix_dtypes)")
            methods[kind](body, node)

    def step_methods(self) -> dict[Step, StepMethod[Body]]:
        """This renderer's method for each step; a NotImplementedError naming the step, the method and the renderer
        where one is missing (a gap in the renderer, not a kernel its device cannot build)."""
        methods: dict[Step, StepMethod[Body]] = {}
        for step, name in STEP_METHODS.items():
            method = getattr(self, name, None)
            if method is None and step in OPTIONAL_STEPS:
                method = self.refuse_workgroups
            if method is None:
                raise NotImplementedError(
                    f"the {self.language} renderer ({type(self).__name__}) has no method {name}(body, node) for the "
                    f"IR step {step.name} ('{step.value}'): every renderer implements each step of "
                    f"ember.backends.render_steps.STEP_METHODS")
            methods[step] = method
        return methods

    def refuse_workgroups(self, body: Body, node: IRNode) -> None:
        """A workgroup step (GROUP_REDUCE, DEFINE_SHARED, BARRIER) in a renderer that has none: a CompileError naming
        the kernel."""
        what = ("reduces across a workgroup" if node.op is IROp.GROUP_REDUCE
                else "shares tiles in a workgroup's local memory")
        raise CompileError(f"kernel {body.kernel.name} {what}, which the {self.language} renderer does not render "
                           "(such kernels are made only for devices whose DeviceInfo has local memory and warps)")

    def refuse_scratch_arrays(self, body: Body, node: IRNode) -> None:
        """The `define_local` of a renderer that has no scratch arrays: a CompileError naming the kernel."""
        raise CompileError(f"kernel {body.kernel.name} uses a scratch array, which the {self.language} renderer does "
                           "not render (only kernels for devices with vector_ops are staged)")
