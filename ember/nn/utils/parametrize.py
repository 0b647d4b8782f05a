"""Parametrizations (torch.nn.utils.parametrize): a module's tensor computed from `original` tensors on each access.

register_parametrization moves the parameter or buffer `name` into module.parametrizations[name] (a
ParametrizationList holding `original`, or original0, original1, ... when right_inverse returns several tensors)
and swaps the module's class for a subclass with a property `name` that runs the parametrizations, as torch does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ember as em
from ember.core.tensor import Tensor
from ember.nn.containers import ModuleDict, ModuleList
from ember.nn.module import Module
from ember.nn.parameter import Parameter

_cache_depth = 0
_cache: dict[tuple[int, str], Tensor] = {}


@contextmanager
def cached() -> Iterator[None]:
    """Inside this context, each parametrized tensor is computed once on first access and then reused."""
    global _cache_depth
    _cache_depth += 1
    try:
        yield
    finally:
        _cache_depth -= 1
        if not _cache_depth:
            _cache.clear()


def _register_parameter_or_buffer(module: Module, name: str, tensor: Tensor) -> None:
    if isinstance(tensor, Parameter):
        module.register_parameter(name, tensor)
    else:
        module.register_buffer(name, tensor)


def _set_values(target: Tensor, value: Tensor) -> None:
    """target takes value's values (and shape) in place, keeping its identity (torch's Tensor.set_)."""
    target.data = value.detach()


class ParametrizationList(ModuleList):
    """The parametrizations of one tensor, applied in order to `original` (or to original0, original1, ...)."""

    def __init__(self, modules: list[Module], original: Tensor, unsafe: bool = False) -> None:
        if not modules:
            raise ValueError("ParametrizationList requires one or more modules.")
        super().__init__(modules)
        self.unsafe = unsafe
        original_shape, original_dtype = tuple(original.shape), original.dtype
        with em.no_grad():
            new = original
            for module in reversed(list(self)):
                if hasattr(module, "right_inverse"):
                    new = module.right_inverse(new)
        self.is_tensor = isinstance(new, Tensor)
        self.ntensors = 1 if self.is_tensor else len(new)
        if self.is_tensor:
            if not unsafe and (new.dtype != original_dtype or tuple(new.shape) != original_shape):
                raise ValueError(
                    "When `right_inverse` outputs one tensor, it may not change the dtype or shape.\n"
                    f"original.dtype: {original_dtype}\nright_inverse(original).dtype: {new.dtype}\n"
                    f"original.shape: {original_shape}\nright_inverse(original).shape: {tuple(new.shape)}"
                )
            if new is not original:
                _set_values(original, new)
            _register_parameter_or_buffer(self, "original", original)
        else:
            for index, part in enumerate(new):
                if not isinstance(part, Tensor):
                    raise ValueError(
                        f"'right_inverse' must return a Tensor or a Sequence of tensors (list, tuple...). "
                        f"Got element {index} of the sequence with type {type(part).__name__}."
                    )
                if isinstance(original, Parameter):
                    part = Parameter(part.detach(), original.requires_grad)
                _register_parameter_or_buffer(self, f"original{index}", part)
        if not unsafe:
            value = self()
            if not isinstance(value, Tensor):
                raise ValueError(f"A parametrization must return a tensor. Got {type(value).__name__}.")
            if value.dtype != original_dtype or tuple(value.shape) != original_shape:
                raise ValueError(
                    "Registering a parametrization may not change the shape or dtype of the tensor, unless "
                    f"`unsafe` flag is enabled.\nunparametrized dtype: {original_dtype}\nparametrized dtype: "
                    f"{value.dtype}\nunparametrized shape: {original_shape}\nparametrized shape: {tuple(value.shape)}"
                )

    def right_inverse(self, value: Tensor) -> None:
        """Set the originals so that the parametrized tensor becomes `value` (module.name = value)."""
        with em.no_grad():
            for module in reversed(list(self)):
                if hasattr(module, "right_inverse"):
                    value = module.right_inverse(value)
                else:
                    raise RuntimeError(f"parametrization {type(module).__name__} does not implement right_inverse.")
            if self.is_tensor:
                if not isinstance(value, Tensor):
                    raise ValueError(f"`right_inverse` should return a tensor. Got {type(value).__name__}")
                if value.dtype != self.original.dtype or tuple(value.shape) != tuple(self.original.shape):
                    raise ValueError(
                        f"The tensor returned by `right_inverse` has dtype {value.dtype} and shape "
                        f"{tuple(value.shape)} while `original` has dtype {self.original.dtype} and shape "
                        f"{tuple(self.original.shape)}"
                    )
                _set_values(self.original, value)
            else:
                if len(value) != self.ntensors:
                    raise ValueError(
                        f"'right_inverse' must return a sequence of tensors of length {self.ntensors}. "
                        f"Got a sequence of length {len(value)}."
                    )
                for index, part in enumerate(value):
                    _set_values(getattr(self, f"original{index}"), part)

    def forward(self) -> Tensor:
        modules = list(self)
        if self.is_tensor:
            value = modules[0](self.original)
        else:
            value = modules[0](*(getattr(self, f"original{index}") for index in range(self.ntensors)))
        for module in modules[1:]:
            value = module(value)
        return value


def _parametrized_get(module: Module, name: str) -> Tensor:
    parametrization = module.parametrizations[name]
    if not _cache_depth:
        return parametrization()
    key = (id(module), name)
    if key not in _cache:
        _cache[key] = parametrization()
    return _cache[key]


def _inject_new_class(module: Module) -> None:
    """Give `module` a class of its own (Parametrized<Class>) to hold the parametrized properties."""
    original_class = module.__class__

    def __setattr__(self: Module, name: str, value: Any) -> None:  # noqa: N807
        if is_parametrized(self, name):
            self.parametrizations[name].right_inverse(value)
        else:
            original_class.__setattr__(self, name, value)

    module.__class__ = type(f"Parametrized{original_class.__name__}", (original_class,), {"__setattr__": __setattr__})


def _inject_property(module: Module, name: str) -> None:
    setattr(module.__class__, name, property(lambda self: _parametrized_get(self, name)))


def is_parametrized(module: Module, tensor_name: str | None = None) -> bool:
    """Whether `module` has a parametrization (on tensor_name, when given)."""
    parametrizations = module.__dict__.get("_modules", {}).get("parametrizations")
    if parametrizations is None or not isinstance(parametrizations, ModuleDict):
        return False
    return len(parametrizations) > 0 if tensor_name is None else tensor_name in parametrizations


def type_before_parametrizations(module: Module) -> type:
    """The class of `module` before any parametrization was registered."""
    return module.__class__.__bases__[0] if is_parametrized(module) else module.__class__


def register_parametrization(
    module: Module, tensor_name: str, parametrization: Module, *, unsafe: bool = False
) -> Module:
    """Make module.tensor_name computed as parametrization(original) on every access (torch's semantics)."""
    parametrization.train(module.training)
    if is_parametrized(module, tensor_name):
        if not unsafe:
            current = getattr(module, tensor_name)
            value = parametrization(current)
            if not isinstance(value, Tensor):
                raise ValueError(f"A parametrization must return a tensor. Got {type(value).__name__}.")
            if value.dtype != current.dtype or tuple(value.shape) != tuple(current.shape):
                raise ValueError(
                    "Registering a parametrization may not change the shape or dtype of the tensor, unless `unsafe` "
                    f"flag is enabled.\nunparametrized dtype: {current.dtype}\nparametrized dtype: {value.dtype}\n"
                    f"unparametrized shape: {tuple(current.shape)}\nparametrized shape: {tuple(value.shape)}"
                )
        module.parametrizations[tensor_name].append(parametrization)
        module.parametrizations[tensor_name].unsafe |= unsafe
    elif tensor_name in module._buffers or tensor_name in module._parameters:
        original = getattr(module, tensor_name)
        parametrizations = ParametrizationList([parametrization], original, unsafe=unsafe)
        delattr(module, tensor_name)
        if not is_parametrized(module):
            _inject_new_class(module)
            module.parametrizations = ModuleDict()
        _inject_property(module, tensor_name)
        module.parametrizations[tensor_name] = parametrizations
    else:
        raise ValueError(
            f"Module '{module}' does not have a parameter, a buffer, or a parametrized element with name "
            f"'{tensor_name}'"
        )
    return module


def remove_parametrizations(module: Module, tensor_name: str, leave_parametrized: bool = True) -> Module:
    """Undo register_parametrization: tensor_name becomes a parameter (or buffer) again, holding the parametrized
    value (leave_parametrized=True) or the original."""
    if not is_parametrized(module, tensor_name):
        raise ValueError(f"Module {module} does not have a parametrization on {tensor_name}")
    parametrizations = module.parametrizations[tensor_name]
    if parametrizations.is_tensor:
        original = parametrizations.original
        if leave_parametrized:
            with em.no_grad():
                value = getattr(module, tensor_name)
            _set_values(original, value)
    else:
        if not leave_parametrized:
            raise ValueError(
                "Cannot leave unparametrized (`leave_parametrized=False`) a tensor that is parametrized in terms of "
                "a sequence of tensors."
            )
        with em.no_grad():
            value = getattr(module, tensor_name)
        if isinstance(parametrizations.original0, Parameter):
            original = Parameter(value.detach(), value.requires_grad or parametrizations.original0.requires_grad)
        else:
            original = value.detach()
    delattr(module.__class__, tensor_name)
    del module.parametrizations[tensor_name]
    _register_parameter_or_buffer(module, tensor_name, original)
    if not is_parametrized(module):
        delattr(module, "parametrizations")
        module.__class__ = module.__class__.__bases__[0]
    return module
