"""Graphviz pictures of lazy graphs: every op a node, each kernel the scheduler would run a box around its ops.

`ember.viz.to_dot(y)` returns DOT text (render it with `dot -Tsvg graph.dot -o graph.svg`, or paste it into any
Graphviz viewer); `ember.viz.save(path, y)` writes it. With EMBER_VIZ set to a folder, every realize writes its
graph there as realize-<n>.dot before it runs.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.walk import post_order

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

_realize_counter = itertools.count()
LEAF_OPS = (Op.BUFFER, Op.CONST, Op.ARANGE)


def _label(node: Node) -> str:
    shape = "x".join(str(size) for size in node.shape) or "scalar"
    argument = ""
    if node.arg is not None and node.op is not Op.BUFFER:
        text = node.arg.name if hasattr(node.arg, "name") else repr(node.arg)  # a dtype by its name
        argument = f" {text}" if len(text) <= 40 else " ..."
    realized = " (realized)" if node.realized else ""
    return f"{node.op.name}{argument}{realized}\\n{shape} {node.dtype.name}\\n{node.device}"


def _escape(text: str) -> str:
    return text.replace('"', '\\"')


def graph_dot(roots: list[Node], title: str = "ember graph") -> str:
    """DOT text for the graph under `roots`: kernels as clusters, realized buffers as boxes, copies dashed."""
    from ember.core.graph_templates import expand_graph
    from ember.scheduler.kernelize import kernel_groups
    from ember.scheduler.placement import place_graph
    from ember.scheduler.schedule import kernel_buffer_limit

    # each node's device and the copies to it, as the realize will have them, templates' copies expanded (a copy
    # of the graph drawn: the user's stays as it is)
    roots = expand_graph(place_graph(roots), roots).roots
    place_graph(roots)
    groups = kernel_groups([root for root in roots if not root.realized], kernel_buffer_limit)
    # every node reachable from the roots, realized leaves included
    every = post_order(roots, lambda node: () if node.realized else node.srcs)
    names = {id(node): f"n{number}" for number, node in enumerate(every)}
    lines = [f'digraph "{_escape(title)}" {{', "  rankdir=BT;", '  node [fontname="monospace", fontsize=10];']
    placed: set[int] = set()
    for index, (output, interior) in enumerate(groups):
        kind = "copy" if output.op is Op.COPY else "kernel"
        lines.append(f"  subgraph cluster_{index} {{")
        lines.append(f'    label="{kind} {index}"; style={"dashed" if kind == "copy" else "rounded"}; color=gray40;')
        for node in (*interior, output):
            if id(node) in names and id(node) not in placed:
                placed.add(id(node))
                style = ', style=bold' if node is output else ""
                lines.append(f'    {names[id(node)]} [label="{_escape(_label(node))}"{style}];')
        lines.append("  }")
    root_ids = {id(root) for root in roots}
    for node in every:
        if id(node) not in placed:
            shape = "box" if node.realized or node.op in LEAF_OPS else "ellipse"
            peripheries = ", peripheries=2" if id(node) in root_ids else ""
            lines.append(f'  {names[id(node)]} [label="{_escape(_label(node))}", shape={shape}{peripheries}];')
    for node in every:
        if node.realized:
            continue
        for source in node.srcs:
            lines.append(f"  {names[id(source)]} -> {names[id(node)]};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_dot(*tensors: Tensor, title: str = "ember graph") -> str:
    """DOT text of what realizing `tensors` would compute, each kernel a cluster."""
    return graph_dot([tensor.node for tensor in tensors], title)


def save(path: str | os.PathLike, *tensors: Tensor, title: str = "ember graph") -> Path:
    """Write `to_dot(*tensors)` to `path` and return the path."""
    target = Path(path)
    target.write_text(to_dot(*tensors, title=title))
    return target


def write_realize(nodes: list[Node], folder: str) -> Path:
    """EMBER_VIZ: the graph of one realize as <folder>/realize-<n>.dot."""
    number = next(_realize_counter)
    target = Path(folder, f"realize-{os.getpid()}-{number}.dot")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(graph_dot(nodes, title=f"realize {number}"))
    return target
