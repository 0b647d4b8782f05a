"""torch's small value types: Size (a tensor's shape, a tuple) and device (a device name, a str)."""

from __future__ import annotations

import operator
from typing import Any, SupportsIndex, overload

from ember.core.errors import DeviceError

_new_tuple = tuple.__new__


class Size(tuple[int, ...]):
    """torch.Size: a shape that is a tuple of ints (equal to and hashing like the tuple), with numel(); slicing it,
    adding to it and repeating it give a Size. Tensor.shape and Tensor.size() return one. repr is torch's form,
    ember.Size([2, 3]); str and f-strings give the tuple's text, (2, 3), as ember's error messages name shapes."""

    __slots__ = ()

    def __new__(cls, sizes: Any = ()) -> Size:
        values = tuple(sizes)
        for position, value in enumerate(values):
            if not isinstance(value, int) or isinstance(value, bool):
                try:  # an int-like (a numpy integer, a 0-d integer tensor) counts, as in torch
                    values = (*values[:position], operator.index(value), *values[position + 1:])
                except TypeError:
                    raise TypeError(f"ember.Size() takes an iterable of 'int' (item {position} is "
                                    f"'{type(value).__name__}')") from None
        return super().__new__(cls, values)

    def numel(self) -> int:
        """The number of elements a tensor of this shape holds (1 for the 0-d shape)."""
        count = 1
        for extent in self:
            count *= extent
        return count

    @overload
    def __getitem__(self, index: SupportsIndex) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Size: ...

    # (a slice or a repeat of a Size, or the sum of two, holds ints already: made without Size()'s checks, which
    # the per-op path paid at every shape computation)
    def __getitem__(self, index: SupportsIndex | slice) -> int | Size:
        if isinstance(index, slice):
            return _new_tuple(Size, tuple.__getitem__(self, index))
        return tuple.__getitem__(self, index)

    def __add__(self, other: tuple[Any, ...]) -> Size:  # type: ignore[override]
        if type(other) is Size:
            return _new_tuple(Size, tuple.__add__(self, other))
        return Size(tuple.__add__(self, other))

    def __radd__(self, other: tuple[Any, ...]) -> Size:
        return Size(tuple.__add__(other, self))

    def __mul__(self, times: SupportsIndex) -> Size:
        return _new_tuple(Size, tuple.__mul__(self, times))

    __rmul__ = __mul__

    def __repr__(self) -> str:
        return f"ember.Size([{', '.join(str(extent) for extent in self)}])"

    def __str__(self) -> str:
        """The tuple's text, (2, 3): how ember's error messages and print name shapes (repr is torch's form)."""
        return tuple.__repr__(self)

    def __format__(self, format_spec: str) -> str:
        return format(tuple.__repr__(self), format_spec)

    def __reduce__(self) -> tuple[Any, ...]:
        return Size, (tuple(self),)


class device(str):  # noqa: N801 - torch's name
    """torch.device: a device name ('cuda', 'cuda:1', 'cpu', 'opencl:0'), so it goes wherever ember takes a
    device, equal to and hashing like its name; `.type` is the backend and `.index` the number (None if not given).
    'cpu' is ember's c device (a tensor's .device names where it is: device(type='c', index=0))."""

    def __new__(cls, type_or_name: Any, index: int | None = None) -> device:
        text = str(type_or_name)
        if index is not None:
            if ":" in text:
                raise DeviceError(f"device: type {text!r} already names an index; give ember.device('cuda', 1) or "
                                  f"ember.device('cuda:1')")
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise DeviceError(f"device: the index must be a non-negative int, got {index!r}")
            text = f"{text}:{index}"
        kind, colon, number = text.partition(":")
        if not kind.isidentifier() or (colon and not number.isdigit()):
            raise DeviceError(f"Invalid device string: {text!r} (expected a backend name with an optional ':index', "
                              f"e.g. 'cuda', 'cuda:1', 'cpu', 'opencl:0')")
        return super().__new__(cls, text)

    @property
    def type(self) -> str:
        return self.partition(":")[0]

    @property  # torch.device.index, the device number (str.index is not used on a device name)
    def index(self) -> int | None:  # type: ignore[override]
        number = self.partition(":")[2]
        return int(number) if number.isdigit() else None

    def __repr__(self) -> str:
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"

    def __str__(self) -> str:
        return str.__str__(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return str.__new__, (device, str.__str__(self))


_device_objects: dict[str, device] = {}


def device_object(name: str) -> device:
    """The device object for a canonical device name (made once per name: Tensor.device is read on the per-op path)."""
    found = _device_objects.get(name)
    if found is None:
        found = _device_objects[name] = str.__new__(device, name)
    return found
