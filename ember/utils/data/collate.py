"""Collation: torch's default_collate and default_convert for ember, and their host forms run in worker processes.

`collate` walks a batch of samples the way torch's does (mappings, namedtuples, sequences, then a table of
element types). The main process's table stacks ember tensors with ember.stack and turns numpy arrays and Python
numbers into ember tensors; a worker's table (HOST_COLLATE_FN_MAP) stacks everything into numpy arrays marked as
HostArray, which the main process turns into ember tensors (`from_host`): ember device buffers never cross a
process boundary.
"""

from __future__ import annotations

import collections.abc
import copy
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ember.core.tensor import Tensor

CollateFnMap = dict[Any, Callable[..., Any]]

STRING_OR_OBJECT_DTYPE = re.compile(r"[SaUO]")
COLLATE_ERROR = ("default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}")


class HostArray:
    """A numpy array that a worker produced for a tensor: the main process makes it an ember tensor."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array


def _rebuild(data: Any, convert: Callable[[Any], Any]) -> Any:
    """data's structure (mapping, namedtuple, tuple, sequence) with convert applied to each leaf; tuples become
    lists, as torch's default_convert does."""
    kind = type(data)
    if isinstance(data, collections.abc.Mapping):
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update({key: convert(data[key]) for key in data})
                return clone
            return kind({key: convert(data[key]) for key in data})
        except TypeError:
            return {key: convert(data[key]) for key in data}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return kind(*(convert(item) for item in data))
    if isinstance(data, tuple):
        return [convert(item) for item in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        try:
            if isinstance(data, collections.abc.MutableSequence):
                sequence_clone = copy.copy(data)
                for position, item in enumerate(data):
                    sequence_clone[position] = convert(item)
                return sequence_clone
            return kind([convert(item) for item in data])
        except TypeError:
            return [convert(item) for item in data]
    return data


def _is_numpy_value(data: Any) -> bool:
    """A numpy array or numpy scalar (not a numpy string), which default_convert makes a tensor."""
    kind = type(data)
    return kind.__module__ == "numpy" and kind.__name__ not in ("str_", "string_", "bytes_")


def default_convert(data: Any) -> Any:
    """numpy arrays and scalars in data become ember tensors (torch.utils.data.default_convert); the rest is kept."""
    from ember.core.creation import as_tensor

    if isinstance(data, Tensor):
        return data
    if isinstance(data, HostArray):
        return from_host(data)
    if _is_numpy_value(data):
        if isinstance(data, np.ndarray) and STRING_OR_OBJECT_DTYPE.search(data.dtype.str) is not None:
            return data
        return as_tensor(data)
    return _rebuild(data, default_convert)


def host_convert(data: Any) -> Any:
    """default_convert's worker form: ember tensors and numpy values become HostArray (numpy), the rest is kept."""
    if isinstance(data, Tensor):
        return HostArray(data.numpy())
    if _is_numpy_value(data):
        if isinstance(data, np.ndarray) and STRING_OR_OBJECT_DTYPE.search(data.dtype.str) is not None:
            return data
        return HostArray(np.asarray(data))
    return _rebuild(data, host_convert)


def _same_kind(data: Any, converted: Any) -> Any:
    """converted (a dict or list) as data's own type where that type can be built from it."""
    try:
        return type(data)(converted)
    except TypeError:
        return converted


def to_host(data: Any) -> Any:
    """data with every ember tensor replaced by a HostArray of its values (what a worker sends back)."""
    if isinstance(data, Tensor):
        return HostArray(data.numpy())
    if isinstance(data, (str, bytes, HostArray, np.ndarray)):
        return data
    if isinstance(data, collections.abc.Mapping):
        return _same_kind(data, {key: to_host(value) for key, value in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(to_host(item) for item in data))
    if isinstance(data, (list, tuple)):
        return _same_kind(data, [to_host(item) for item in data])
    return data


def from_host(data: Any) -> Any:
    """data with every HostArray replaced by an ember tensor (the main process's half of a worker's batch)."""
    from ember.core.creation import from_numpy

    if isinstance(data, HostArray):
        return from_numpy(np.ascontiguousarray(data.array))
    if isinstance(data, (str, bytes, np.ndarray, Tensor)):
        return data
    if isinstance(data, collections.abc.Mapping):
        return _same_kind(data, {key: from_host(value) for key, value in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(from_host(item) for item in data))
    if isinstance(data, (list, tuple)):
        return _same_kind(data, [from_host(item) for item in data])
    return data


def collate(batch: Any, *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Collate a batch (a sequence of samples) by the structure of its first sample, as torch's collate: the
    element types of collate_fn_map first (exact type, then isinstance in insertion order), then mappings,
    namedtuples and sequences recursively (tuples collate to lists, as in torch)."""
    elem = batch[0]
    elem_type = type(elem)
    if collate_fn_map is not None:
        if elem_type in collate_fn_map:
            return collate_fn_map[elem_type](batch, collate_fn_map=collate_fn_map)
        for collate_type in collate_fn_map:
            if isinstance(elem, collate_type):
                return collate_fn_map[collate_type](batch, collate_fn_map=collate_fn_map)
    if isinstance(elem, collections.abc.Mapping):
        try:
            if isinstance(elem, collections.abc.MutableMapping):
                clone = copy.copy(elem)
                clone.update({key: collate([sample[key] for sample in batch], collate_fn_map=collate_fn_map)
                              for key in elem})
                return clone
            return elem_type({key: collate([sample[key] for sample in batch], collate_fn_map=collate_fn_map)
                              for key in elem})
        except TypeError:
            return {key: collate([sample[key] for sample in batch], collate_fn_map=collate_fn_map) for key in elem}
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return elem_type(*(collate(samples, collate_fn_map=collate_fn_map) for samples in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        size = len(elem)
        if not all(len(sample) == size for sample in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        transposed = list(zip(*batch))
        if isinstance(elem, tuple):
            return [collate(samples, collate_fn_map=collate_fn_map) for samples in transposed]
        try:
            if isinstance(elem, collections.abc.MutableSequence):
                sequence_clone = copy.copy(elem)
                for position, samples in enumerate(transposed):
                    sequence_clone[position] = collate(samples, collate_fn_map=collate_fn_map)
                return sequence_clone
            return elem_type([collate(samples, collate_fn_map=collate_fn_map) for samples in transposed])
        except TypeError:
            return [collate(samples, collate_fn_map=collate_fn_map) for samples in transposed]
    raise TypeError(COLLATE_ERROR.format(elem_type))


# ---- host collation (numpy), the step a worker runs -------------------------------------------------------------


def _stack_host_arrays(arrays: list[np.ndarray]) -> np.ndarray:
    shapes = {array.shape for array in arrays}
    if len(shapes) > 1:
        raise RuntimeError(f"stack expects each tensor to be equal size, but got shapes {sorted(shapes)} in the "
                           f"batch")
    return np.stack(arrays)


def _host_tensor(batch: Any, *, collate_fn_map: CollateFnMap | None = None) -> HostArray:
    return HostArray(_stack_host_arrays([tensor.numpy() for tensor in batch]))


def _host_numpy_array(batch: Any, *, collate_fn_map: CollateFnMap | None = None) -> HostArray:
    if STRING_OR_OBJECT_DTYPE.search(batch[0].dtype.str) is not None:
        raise TypeError(COLLATE_ERROR.format(batch[0].dtype))
    return HostArray(_stack_host_arrays([np.asarray(array) for array in batch]))


def _host_numpy_scalar(batch: Any, *, collate_fn_map: CollateFnMap | None = None) -> HostArray:
    return HostArray(np.asarray(batch))


def _host_float(batch: Any, *, collate_fn_map: CollateFnMap | None = None) -> HostArray:
    return HostArray(np.asarray(batch, dtype=np.float64))


def _host_int(batch: Any, *, collate_fn_map: CollateFnMap | None = None) -> HostArray:
    """Python ints as int64 (bools, an int subclass, as bool), as torch.tensor makes them."""
    return HostArray(np.asarray(batch, dtype=np.bool_ if all(isinstance(item, bool) for item in batch)
                                else np.int64))


def _keep(batch: Any, *, collate_fn_map: CollateFnMap | None = None) -> Any:
    return batch


HOST_COLLATE_FN_MAP: CollateFnMap = {
    Tensor: _host_tensor,
    np.ndarray: _host_numpy_array,
    (np.bool_, np.number, np.object_): _host_numpy_scalar,
    float: _host_float,
    int: _host_int,
    str: _keep,
    bytes: _keep,
}


def host_collate(batch: Any) -> Any:
    """default_collate with numpy arrays (HostArray) where it makes tensors: what a worker process sends."""
    return collate(batch, collate_fn_map=HOST_COLLATE_FN_MAP)


# ---- the main process's collation (ember tensors) -------------------------------------------------------------


def collate_tensor_fn(batch: Any, *, collate_fn_map: CollateFnMap | None = None) -> Tensor:
    """Stack ember tensors along a new first dimension (ember.stack keeps device, dtype and autograd)."""
    from ember.core.movement import stack

    return stack(list(batch), 0)


def _on_host(host_function: Callable[..., HostArray]) -> Callable[..., Tensor]:
    def collate_function(batch: Any, *, collate_fn_map: CollateFnMap | None = None) -> Tensor:
        return from_host(host_function(batch))

    collate_function.__doc__ = f"{host_function.__name__} made an ember tensor."
    return collate_function


default_collate_fn_map: CollateFnMap = {
    Tensor: collate_tensor_fn,
    np.ndarray: _on_host(_host_numpy_array),
    (np.bool_, np.number, np.object_): _on_host(_host_numpy_scalar),
    float: _on_host(_host_float),
    int: _on_host(_host_int),
    str: _keep,
    bytes: _keep,
}


def default_collate(batch: Any) -> Any:
    """Stack a batch of samples into ember tensors (torch.utils.data.default_collate): ember tensors with
    ember.stack, numpy arrays and numpy scalars keeping their dtype, floats as float64, ints as int64 (bools as
    bool), strings kept as a list; dicts, namedtuples, tuples (to lists) and lists collated element by element."""
    return collate(batch, collate_fn_map=default_collate_fn_map)
