"""Collectives of picklable Python objects (torch's all_gather_object and broadcast_object_list): the pickled bytes
go through the byte collectives, their lengths first. Unpickling runs code the other ranks chose, as in torch: use
them between ranks of one job only."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from ember.distributed import communication
from ember.distributed.process_group import DistributedError, check_group


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """Fill object_list[r] with rank r's `obj` for every rank r (object_list holds world size items)."""
    joined = check_group(group, "all_gather_object")
    if not isinstance(object_list, list) or len(object_list) != joined.size:
        raise DistributedError(f"all_gather_object: object_list must be a list of {joined.size} items (the world "
                               f"size), got {type(object_list).__name__} of {len(object_list)}")
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    lengths = communication.all_gather_array(joined, np.array([data.size], np.int64))[:, 0]
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[:data.size] = data
    rows = communication.all_gather_array(joined, padded)
    for rank in range(joined.size):
        object_list[rank] = pickle.loads(rows[rank, :int(lengths[rank])].tobytes())  # noqa: S301 - torch's semantics


def broadcast_object_list(object_list: list[Any], src: int = 0, group: Any = None) -> None:
    """Replace the items of object_list on every rank by those of rank `src` (every rank passes a list of the same
    length)."""
    joined = check_group(group, "broadcast_object_list")
    if not isinstance(object_list, list):
        raise DistributedError(f"broadcast_object_list: object_list must be a list, got {type(object_list).__name__}")
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < joined.size:
        raise DistributedError(f"broadcast_object_list: src={src!r} is not a rank; ranks are 0 .. {joined.size - 1}")
    data = np.frombuffer(pickle.dumps(list(object_list)) if joined.rank == src else b"", np.uint8)
    length = communication.broadcast_array(joined, np.array([data.size], np.int64), src)[0]
    received = communication.broadcast_array(joined, data if joined.rank == src else np.zeros(int(length), np.uint8),
                                             src)
    items = pickle.loads(received.tobytes())  # noqa: S301 - torch's semantics
    if len(items) != len(object_list):
        raise DistributedError(f"broadcast_object_list: rank {src} sent {len(items)} objects, but this rank's list "
                               f"holds {len(object_list)}; give lists of one length on every rank")
    object_list[:] = items
