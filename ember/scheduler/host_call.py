"""Host steps: a function run on the host over realized nodes' values (a collective of ember.distributed) whose
result is a new realized node; under ember.jit the step is recorded, so a replay runs the function again
(program.HostCall, run by the executor)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ember.context import CONTEXT
from ember.core.dtype import DType
from ember.core.graph import Node
from ember.core.ops import Op
from ember.core.shapes import Shape, prod
from ember.scheduler.buffers import Buffer, buffer_of

HostFunction = Callable[[list[np.ndarray]], np.ndarray]


def host_node(function: HostFunction, inputs: Sequence[Node], shape: Shape, dtype: DType) -> Node:
    """A new realized node of `shape` and `dtype` on the first input's device holding function(the inputs' values).

    The inputs must be realized, each a whole buffer; the function gets their values as flat numpy arrays (in the
    buffers' dtypes) and returns a flat array of prod(shape) values. Inside an ember.jit capture the call is a step
    of the captured program: every replay calls the function again on the values of that replay."""
    if not inputs:
        raise ValueError("host_node: give at least one input (the result is made on its device)")
    buffers = []
    for node in inputs:
        if not node.realized:
            raise ValueError(f"host_node: the input {node} is not realized; realize it first")
        buffer = buffer_of(node)
        if buffer.size != node.size:
            raise ValueError(f"host_node: a node of shape {node.shape} has a buffer of {buffer.size} values; give "
                             "nodes that hold their whole value in one buffer")
        buffers.append(buffer)
    output = Buffer(buffers[0].device, prod(shape), dtype)
    run_host_function(function, buffers, output)
    recorder = CONTEXT.get().recorder
    if recorder is not None:
        recorder.host_call(output, buffers, function)
    node = Node(Op.BUFFER, (), None, tuple(shape), dtype, output.device_name)
    node.buffer = output
    return node


def run_host_function(function: HostFunction, inputs: Sequence[Buffer], output: Buffer) -> None:
    """Read the input buffers, call the function on their values and write what it returns into `output`."""
    result = np.ascontiguousarray(function([buffer.read() for buffer in inputs]))
    if result.size != output.size or result.dtype != output.dtype.numpy:
        raise ValueError(f"host_call: the function returned {result.size} values of {result.dtype} for an output of "
                         f"{output.size} values of {output.dtype.numpy}")
    output.write(result.reshape(-1))
