"""The collectives on ember tensors, with torch.distributed's names and semantics: each one changes its tensors in
place. Values are staged through the host (a device buffer read into numpy, MPI, written into a new buffer of the
same device); under ember.jit the exchange is a step of the captured program, so every replay exchanges anew."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember.autograd.grad_mode import no_grad
from ember.core import dtype as dtypes
from ember.core.movement import stack
from ember.core.tensor import Tensor, realize
from ember.distributed import communication
from ember.distributed.process_group import DistributedError, ProcessGroup, check_group
from ember.distributed.reduce_op import ReduceOp
from ember.scheduler.host_call import host_node

HALF_TYPES = (dtypes.float16, dtypes.bfloat16)  # exchanged as float32 (exact) and rounded back once


class Work:
    """What a collective called with async_op=True returns: ember's collectives complete before they return, so
    wait() returns True at once and is_completed() is True."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def all_reduce(tensor: Tensor, op: ReduceOp = ReduceOp.SUM, group: Any = None, async_op: bool = False) -> Work | None:
    """Replace `tensor` on every rank by the combination (op) of its values on all ranks, in place."""
    joined = check_group(group, "all_reduce")
    _check_tensors("all_reduce", "tensor", [tensor])
    staged = _staged(tensor)
    reduction = communication.check_reduction(op, staged.dtype.numpy, "all_reduce")
    result = exchange(lambda values: communication.all_reduce_array(joined, values[0], reduction), [staged],
                      staged.shape, staged.dtype)
    _write([tensor], [result])
    return Work() if async_op else None


def broadcast(tensor: Tensor, src: int, group: Any = None, async_op: bool = False) -> Work | None:
    """Replace `tensor` on every rank by its value on rank `src`, in place."""
    joined = check_group(group, "broadcast")
    _check_tensors("broadcast", "tensor", [tensor])
    source = _check_rank(joined, src, "broadcast", "src")
    result = exchange(lambda values: communication.broadcast_array(joined, values[0], source), [tensor],
                      tensor.shape, tensor.dtype)
    _write([tensor], [result])
    return Work() if async_op else None


def all_gather(tensor_list: list[Tensor], tensor: Tensor, group: Any = None, async_op: bool = False) -> Work | None:
    """Fill tensor_list[r] with `tensor` of rank r, for every rank r (tensor_list holds world size tensors of
    tensor's shape and dtype), in place."""
    joined = check_group(group, "all_gather")
    _check_tensors("all_gather", "tensor", [tensor])
    _check_list(joined, tensor_list, tensor, "all_gather", "tensor_list")
    gathered = exchange(lambda values: communication.all_gather_array(joined, values[0]), [tensor],
                        (joined.size, *tensor.shape), tensor.dtype)
    _write(tensor_list, [gathered[rank] for rank in range(joined.size)])
    return Work() if async_op else None


def reduce_scatter(output: Tensor, input_list: list[Tensor], op: ReduceOp = ReduceOp.SUM, group: Any = None,
                   async_op: bool = False) -> Work | None:
    """Replace `output` on rank r by the combination (op) over all ranks of their input_list[r] (input_list holds
    world size tensors of output's shape and dtype), in place."""
    joined = check_group(group, "reduce_scatter")
    _check_tensors("reduce_scatter", "output", [output])
    _check_list(joined, input_list, output, "reduce_scatter", "input_list")
    with no_grad():
        stacked = stack(list(input_list))
    _scatter_reduced(joined, stacked, output, op, "reduce_scatter")
    return Work() if async_op else None


def all_gather_into_tensor(output_tensor: Tensor, input_tensor: Tensor, group: Any = None,
                           async_op: bool = False) -> Work | None:
    """Fill output_tensor with every rank's input_tensor, concatenated along dim 0 in rank order (or stacked: an
    output of shape (world size, *input's shape)), in place."""
    joined = check_group(group, "all_gather_into_tensor")
    _check_tensors("all_gather_into_tensor", "tensors", [output_tensor, input_tensor])
    _check_whole(joined, output_tensor, input_tensor, "all_gather_into_tensor", "output_tensor", "input_tensor")
    gathered = exchange(lambda values: communication.all_gather_array(joined, values[0]), [input_tensor],
                        (joined.size, *input_tensor.shape), input_tensor.dtype)
    _write([output_tensor], [gathered.reshape(output_tensor.shape)])
    return Work() if async_op else None


def reduce_scatter_tensor(output: Tensor, input: Tensor, op: ReduceOp = ReduceOp.SUM, group: Any = None,
                          async_op: bool = False) -> Work | None:
    """Replace `output` on rank r by the combination (op) over all ranks of the r-th of world size equal pieces of
    their `input` (split along dim 0, or input of shape (world size, *output's shape)), in place."""
    joined = check_group(group, "reduce_scatter_tensor")
    _check_tensors("reduce_scatter_tensor", "tensors", [output, input])
    _check_whole(joined, input, output, "reduce_scatter_tensor", "input", "output")
    _scatter_reduced(joined, input, output, op, "reduce_scatter_tensor")
    return Work() if async_op else None


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None) -> Work | None:
    """Wait until every rank has called barrier (at most the process group's timeout)."""
    communication.barrier(check_group(group, "barrier"))
    return Work() if async_op else None


# ---- staging ------------------------------------------------------------------------------------------------------


def exchange(function: Callable[[list[np.ndarray]], np.ndarray], inputs: Sequence[Tensor], shape: Any,
             dtype: Any) -> Tensor:
    """A new tensor on the first input's device: function(the inputs' values as flat numpy arrays), run on the host
    now and again at every replay of an ember.jit capture that made it (scheduler/host_call.py)."""
    with no_grad():
        contiguous = [tensor.detach().contiguous() for tensor in inputs]
        realize(*contiguous)
        return Tensor._from_node(host_node(function, [tensor.node for tensor in contiguous], tuple(shape), dtype))


def _scatter_reduced(group: ProcessGroup, whole: Tensor, output: Tensor, op: ReduceOp, function: str) -> None:
    """Write into `output` the combination (op) over the ranks of the piece of their `whole` (world size pieces
    along dim 0) that belongs to this rank: an all-to-all of the pieces, then a numpy reduction in rank order."""
    staged = _staged(whole)
    reduction = communication.check_reduction(op, staged.dtype.numpy, function)

    def scatter(values: list[np.ndarray]) -> np.ndarray:
        rows = communication.all_to_all_array(group, values[0].reshape(group.size, -1))
        return communication.reduce_rows(rows, reduction)

    _write([output], [exchange(scatter, [staged], output.shape, staged.dtype)])


def _staged(tensor: Tensor) -> Tensor:
    """The tensor as it is reduced: float16 and bfloat16 as float32 (numpy and MPI have no bfloat16 arithmetic)."""
    return tensor.detach().float() if tensor.dtype in HALF_TYPES else tensor


def _write(targets: Sequence[Tensor], values: Sequence[Tensor]) -> None:
    """Write each value into its target in place (cast to its dtype), now: a copy kernel into the target's memory,
    which also keeps an ember.jit capture's state (and arguments) in their own buffers."""
    with no_grad():
        for target, value in zip(targets, values):
            target.assign(value.clone())
    realize(*targets)


# ---- checks -------------------------------------------------------------------------------------------------------


def _check_tensors(function: str, name: str, tensors: Sequence[Any]) -> None:
    for tensor in tensors:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{function}: {name} must be an ember Tensor, got {type(tensor).__name__}")


def _check_list(group: ProcessGroup, tensors: Any, like: Tensor, function: str, name: str) -> None:
    """A list of world size tensors, each of `like`'s shape and dtype."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{function}: {name} must be a list of tensors, got {type(tensors).__name__}")
    if len(tensors) != group.size:
        raise DistributedError(f"{function}: {name} holds {len(tensors)} tensors, but the world size is "
                               f"{group.size}; give one tensor per rank")
    _check_tensors(function, name, tensors)
    for position, tensor in enumerate(tensors):
        if tensor.shape != like.shape or tensor.dtype != like.dtype:
            raise DistributedError(f"{function}: {name}[{position}] is {tensor.dtype.name} {tuple(tensor.shape)}, "
                                   f"but it must match the tensor: {like.dtype.name} {tuple(like.shape)}")


def _check_whole(group: ProcessGroup, whole: Tensor, piece: Tensor, function: str, whole_name: str,
                 piece_name: str) -> None:
    """`whole` holds world size pieces: piece's shape with dim 0 world size times longer, or a new dim 0 of world
    size; one dtype."""
    stacked = (group.size, *piece.shape)
    concatenated = (piece.shape[0] * group.size, *piece.shape[1:]) if piece.ndim else None
    if whole.dtype != piece.dtype or tuple(whole.shape) not in (stacked, concatenated):
        raise DistributedError(f"{function}: {whole_name} is {whole.dtype.name} {tuple(whole.shape)} and {piece_name} "
                               f"{piece.dtype.name} {tuple(piece.shape)}; {whole_name} must have {piece_name}'s dtype "
                               f"and shape {concatenated} or {stacked} ({group.size} ranks)")


def _check_rank(group: ProcessGroup, rank: Any, function: str, name: str) -> int:
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < group.size:
        raise DistributedError(f"{function}: {name}={rank!r} is not a rank; ranks are 0 .. {group.size - 1}")
    return int(rank)
