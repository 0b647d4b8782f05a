"""The collectives on host (numpy) arrays over MPI: non-blocking MPI calls waited for with the group's timeout, the
reductions MPI has no exact form for done in numpy, and the time and bytes spent in them (`collective_statistics`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.distributed.process_group import DistributedError, ProcessGroup, mpi
from ember.distributed.reduce_op import ReduceOp

# reductions of bool values, done on their bytes (0 or 1)
BOOLEAN_REDUCTIONS = {ReduceOp.SUM: ReduceOp.MAX, ReduceOp.MAX: ReduceOp.MAX, ReduceOp.BOR: ReduceOp.MAX,
                      ReduceOp.MIN: ReduceOp.MIN, ReduceOp.PRODUCT: ReduceOp.MIN, ReduceOp.BAND: ReduceOp.MIN,
                      ReduceOp.BXOR: ReduceOp.BXOR}
NUMPY_REDUCTIONS = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply,
                    ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and,
                    ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor}
LONGEST_PAUSE = 1e-3  # seconds between two checks of a collective that has not finished


@dataclass
class CollectiveStatistics:
    """What this process's collectives cost so far: how many, the seconds spent waiting in them (wall time, the
    host staging not included) and the bytes this rank sent into them."""

    calls: int = 0
    seconds: float = 0.0
    bytes: int = 0


STATISTICS = CollectiveStatistics()


def collective_statistics(reset: bool = False) -> CollectiveStatistics:
    """A copy of the statistics of this process's collectives; with reset=True they start again from zero."""
    global STATISTICS
    copy = CollectiveStatistics(STATISTICS.calls, STATISTICS.seconds, STATISTICS.bytes)
    if reset:
        STATISTICS = CollectiveStatistics()
    return copy


def check_reduction(op: Any, dtype: np.dtype, function: str) -> ReduceOp:
    """The ReduceOp `op` names, checked against the values' dtype (a clear error for a pair with no meaning)."""
    if not isinstance(op, ReduceOp):
        raise DistributedError(f"{function}: op must be an ember.distributed.ReduceOp (SUM, AVG, PRODUCT, MIN, MAX, "
                               f"BAND, BOR, BXOR), got {op!r}")
    if op is ReduceOp.AVG and dtype.kind != "f":
        raise DistributedError(f"{function}: ReduceOp.AVG needs floating point values, got {dtype}; use "
                               "ReduceOp.SUM and divide by the world size")
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and dtype.kind == "f":
        raise DistributedError(f"{function}: ReduceOp.{op.name} takes integer or bool values, got {dtype}")
    return op


def all_reduce_array(group: ProcessGroup, values: np.ndarray, op: ReduceOp) -> np.ndarray:
    """Every rank's `values` (same size and dtype everywhere) combined by `op`, the same on every rank.

    Sums and products of floats and every integer reduction run in MPI; MIN and MAX of floats (which must pass NaN
    on) and bools gather every rank's values and reduce them in numpy in rank order."""
    if values.dtype == np.bool_:
        combined = all_reduce_array(group, values.view(np.uint8), BOOLEAN_REDUCTIONS[op])
        return combined.view(np.bool_)
    if values.dtype.kind == "f" and op in (ReduceOp.MIN, ReduceOp.MAX):
        return reduce_rows(all_gather_array(group, values), op)
    MPI = mpi()
    native = {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.PRODUCT: MPI.PROD, ReduceOp.MIN: MPI.MIN,
              ReduceOp.MAX: MPI.MAX, ReduceOp.BAND: MPI.BAND, ReduceOp.BOR: MPI.BOR, ReduceOp.BXOR: MPI.BXOR}[op]
    values = np.ascontiguousarray(values)
    result = np.empty_like(values)
    _run(group, "all_reduce", values.nbytes,
         lambda: group.communicator.Iallreduce(values, result, op=native))
    if op is ReduceOp.AVG:
        result = (result / group.size).astype(values.dtype)
    return result


def reduce_rows(rows: np.ndarray, op: ReduceOp) -> np.ndarray:
    """The rows of a (ranks, n) array combined by op in rank order (AVG: their sum over the number of rows)."""
    result = NUMPY_REDUCTIONS[op].reduce(rows, axis=0)
    if op is ReduceOp.AVG:
        result = result / rows.shape[0]
    return np.asarray(result).astype(rows.dtype)


def broadcast_array(group: ProcessGroup, values: np.ndarray, source: int) -> np.ndarray:
    """Rank `source`'s values, on every rank (each rank passes an array of the same size and dtype)."""
    data = np.array(values, copy=True, order="C")
    _run(group, "broadcast", data.nbytes if group.rank == source else 0,
         lambda: group.communicator.Ibcast(_bytes(data), root=source))
    return data


def all_gather_array(group: ProcessGroup, values: np.ndarray) -> np.ndarray:
    """Every rank's values as the rows of a (world size, n) array, in rank order."""
    values = np.ascontiguousarray(values)
    gathered = np.empty((group.size, values.size), values.dtype)
    _run(group, "all_gather", values.nbytes,
         lambda: group.communicator.Iallgather(_bytes(values), _bytes(gathered)))
    return gathered


def all_to_all_array(group: ProcessGroup, values: np.ndarray) -> np.ndarray:
    """Row r of this rank's (world size, n) array goes to rank r: returns the rows every rank sent to this one, in
    rank order, as a (world size, n) array."""
    values = np.ascontiguousarray(values)
    received = np.empty_like(values)
    _run(group, "all_to_all", values.nbytes,
         lambda: group.communicator.Ialltoall(_bytes(values), _bytes(received)))
    return received


def barrier(group: ProcessGroup) -> None:
    """Wait until every rank has reached this barrier (or the timeout)."""
    _run(group, "barrier", 0, lambda: group.communicator.Ibarrier())


def _bytes(array: np.ndarray) -> list[Any]:
    """An MPI buffer of the array's raw bytes (any dtype: bfloat16's uint16, bool)."""
    return [array.reshape(-1).view(np.uint8), mpi().BYTE]


def _run(group: ProcessGroup, name: str, nbytes: int, start: Any) -> None:
    """Start a non-blocking collective and wait for it, at most the group's timeout; count its time and bytes."""
    began = time.perf_counter()
    request = start()
    deadline = began + group.timeout
    pause = 0.0
    while not request.Test():
        now = time.perf_counter()
        if now > deadline:
            raise DistributedError(
                f"ember.distributed.{name}: rank {group.rank} of {group.size} waited {group.timeout:g} s for the "
                "other ranks to join the collective; a rank has stopped, hangs, or called a different collective "
                "(every rank must call the same collectives in the same order). Give init_process_group a longer "
                "timeout= if the others are only slow")
        time.sleep(pause)
        pause = min(pause * 2 or 1e-5, LONGEST_PAUSE)
    STATISTICS.calls += 1
    STATISTICS.seconds += time.perf_counter() - began
    STATISTICS.bytes += nbytes
