"""Container modules: Sequential, ModuleList, ModuleDict, ParameterList and ParameterDict."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, overload

from ember.nn.module import Module, _format_repr, _indent
from ember.nn.parameter import Parameter


def _index(index: int, length: int, kind: str) -> int:
    index = int(index)
    if not -length <= index < length:
        raise IndexError(f"index {index} is out of range for a {kind} of length {length}")
    return index % length


class Sequential(Module):
    """Modules called in order, each on the previous one's output: Sequential(a, b) or Sequential(OrderedDict)."""

    def __init__(self, *modules: Module | Mapping[str, Module]) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], Mapping):
            for name, module in modules[0].items():
                self.add_module(name, module)
        else:
            for position, child in enumerate(modules):  # Modules (add_module rejects anything else)
                self.add_module(str(position), child)  # type: ignore[arg-type]  # a lone Mapping is handled above

    @overload
    def __getitem__(self, index: int) -> Module: ...

    @overload
    def __getitem__(self, index: slice) -> Sequential: ...

    def __getitem__(self, index: int | slice) -> Module | Sequential:
        items = list(self._modules.items())
        if isinstance(index, slice):
            return Sequential(OrderedDict(items[index]))
        return items[_index(index, len(items), "Sequential")][1]

    def __setitem__(self, index: int, module: Module) -> None:
        name = list(self._modules)[_index(index, len(self._modules), "Sequential")]
        setattr(self, name, module)

    def __delitem__(self, index: int | slice) -> None:
        names = list(self._modules)
        for name in names[index] if isinstance(index, slice) else [names[_index(index, len(names), "Sequential")]]:
            del self._modules[name]
        remaining = list(self._modules.values())
        self._modules.clear()
        for position, module in enumerate(remaining):
            self._modules[str(position)] = module

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> Sequential:
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> Sequential:
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._modules.clear()
        for position, one in enumerate(modules):
            self._modules[str(position)] = one
        return self

    def forward(self, input: Any) -> Any:  # noqa: A002 - torch's name
        for module in self._modules.values():
            input = module(input)
        return input


class ModuleList(Module):
    """A list of modules whose parameters are registered (indexable, iterable; no forward of its own)."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, index: int | slice) -> Any:
        modules = list(self._modules.values())
        if isinstance(index, slice):
            return ModuleList(modules[index])
        return modules[_index(index, len(modules), "ModuleList")]

    def __setitem__(self, index: int, module: Module) -> None:
        self.add_module(str(_index(index, len(self), "ModuleList")), module)

    def __delitem__(self, index: int | slice) -> None:
        modules = list(self._modules.values())
        if isinstance(index, slice):
            del modules[index]
        else:
            del modules[_index(index, len(modules), "ModuleList")]
        self._modules.clear()
        for position, module in enumerate(modules):
            self._modules[str(position)] = module

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        if isinstance(modules, Module) and not isinstance(modules, (ModuleList, Sequential)):
            raise TypeError(
                f"ModuleList.extend should be called with an iterable of modules, got {type(modules).__name__}"
            )
        for module in list(modules):
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._modules.clear()
        for position, one in enumerate(modules):
            self.add_module(str(position), one)

    def __repr__(self) -> str:
        """Runs of identical consecutive modules are collapsed, as torch prints them: `(0-2): 3 x ReLU()`."""
        lines: list[str] = []
        items = list(self._modules.items())
        start = 0
        while start < len(items):
            text = repr(items[start][1])
            end = start
            while end + 1 < len(items) and repr(items[end + 1][1]) == text:
                end += 1
            if end > start:
                lines.append(f"({items[start][0]}-{items[end][0]}): {end - start + 1} x " + _indent(text, 2))
            else:
                lines.append(f"({items[start][0]}): " + _indent(text, 2))
            start = end + 1
        return _format_repr(self._get_name(), "", lines)


class ModuleDict(Module):
    """A dict of modules whose parameters are registered, keeping insertion order."""

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def clear(self) -> None:
        self._modules.clear()

    def pop(self, key: str) -> Module:
        return self._modules.pop(key)

    def keys(self) -> Iterable[str]:
        return self._modules.keys()

    def items(self) -> Iterable[tuple[str, Module]]:
        return self._modules.items()

    def values(self) -> Iterable[Module]:
        return self._modules.values()

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        pairs = modules.items() if isinstance(modules, Mapping) else modules
        for pair in pairs:
            key, module = pair
            self[key] = module


class ParameterList(Module):
    """A list of parameters registered under the names "0", "1", ..."""

    def __init__(self, values: Iterable[Any] | None = None) -> None:
        super().__init__()
        self._size = 0
        for value in values or ():
            self.append(value)

    def __getitem__(self, index: int) -> Parameter:
        return getattr(self, str(_index(index, self._size, "ParameterList")))

    def __setitem__(self, index: int, value: Any) -> None:
        setattr(self, str(_index(index, self._size, "ParameterList")), _as_parameter(value))

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Parameter]:
        return (self[position] for position in range(self._size))

    def append(self, value: Any) -> ParameterList:
        self._size += 1
        self.register_parameter(str(self._size - 1), _as_parameter(value))
        return self

    def extend(self, values: Iterable[Any]) -> ParameterList:
        for value in values:
            self.append(value)
        return self

    def extra_repr(self) -> str:
        return "\n".join(
            f"({position}): Parameter containing: [{parameter.dtype.name} of size {parameter.shape}]"
            for position, parameter in enumerate(self)
        )


class ParameterDict(Module):
    """A dict of parameters registered under their keys."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        for key, value in (values or {}).items():
            self[key] = value

    def __getitem__(self, key: str) -> Parameter:
        return self._parameters[key]  # type: ignore[return-value]

    def __setitem__(self, key: str, value: Any) -> None:
        self.register_parameter(key, _as_parameter(value))

    def __delitem__(self, key: str) -> None:
        del self._parameters[key]

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[str]:
        return iter(self._parameters)

    def __contains__(self, key: str) -> bool:
        return key in self._parameters

    def keys(self) -> Iterable[str]:
        return self._parameters.keys()

    def items(self) -> Iterable[tuple[str, Parameter]]:
        return self._parameters.items()  # type: ignore[return-value]

    def values(self) -> Iterable[Parameter]:
        return self._parameters.values()  # type: ignore[return-value]


def _as_parameter(value: Any) -> Parameter:
    return value if isinstance(value, Parameter) else Parameter(value)
