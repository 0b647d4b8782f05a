"""Module: the base class of layers, holding parameters, buffers and submodules, with PyTorch's state_dict keys."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, Self

from ember.autograd.grad_mode import no_grad
from ember.core.creation import tensor
from ember.core.tensor import Tensor
from ember.core.views import set_value, unlink
from ember.nn.parameter import Parameter


class IncompatibleKeys(NamedTuple):
    """What load_state_dict(strict=False) could not match, like torch's _IncompatibleKeys."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class RemovableHandle:
    """Returned by register_*_hook; `handle.remove()` unregisters the hook."""

    _next_id = itertools.count()

    def __init__(self, hooks: dict[int, Callable[..., Any]]) -> None:
        self.hooks = hooks
        self.id = next(RemovableHandle._next_id)

    def remove(self) -> None:
        self.hooks.pop(self.id, None)


class Module:
    """Base class of every layer: assign Parameters, buffers and Modules as attributes and write `forward`."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_forward_hooks", OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self._forward_pre_hooks and not self._forward_hooks:  # (the common case: no tuples of no hooks)
            return self.forward(*args, **kwargs)
        for hook in tuple(self._forward_pre_hooks.values()):
            result = hook(self, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
        output = self.forward(*args, **kwargs)
        for hook in tuple(self._forward_hooks.values()):
            result = hook(self, args, output)
            if result is not None:
                output = result
        return output

    # ---- attributes: parameters, buffers and submodules are kept in their own dicts --------------------------

    def __getattr__(self, name: str) -> Any:
        # only called when normal lookup fails
        for store in ("_parameters", "_buffers", "_modules"):
            values = self.__dict__.get(store)
            if values is not None and name in values:
                return values[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name: str, value: Any) -> None:
        parameters = self.__dict__.get("_parameters")
        if parameters is None:
            raise AttributeError(f"cannot assign '{name}' before Module.__init__() is called (call super().__init__())")
        if isinstance(value, Parameter):
            self._discard(name)
            parameters[name] = value
        elif name in parameters:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                    "(ember.nn.Parameter or None expected)"
                )
            parameters[name] = None
        elif isinstance(value, Module):
            self._discard(name)
            self._modules[name] = value
        elif name in self._modules:
            if value is not None:
                raise TypeError(
                    f"cannot assign '{type(value).__name__}' as child module '{name}' (Module or None expected)"
                )
            self._modules[name] = None
        elif name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' (Tensor or None expected)")
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        for store in (self._parameters, self._buffers, self._modules):
            if name in store:
                del store[name]
                self._non_persistent_buffers.discard(name)
                return
        object.__delattr__(self, name)

    def _discard(self, name: str) -> None:
        """Forget `name` in every store and as a plain attribute before it is registered anew."""
        self.__dict__.pop(name, None)
        for store in (self._parameters, self._buffers, self._modules):
            store.pop(name, None)
        self._non_persistent_buffers.discard(name)

    def __dir__(self) -> list[str]:
        names = set(super().__dir__())
        names.update(self._parameters, self._buffers, self._modules)
        return sorted(name for name in names if not name[0].isdigit())

    @staticmethod
    def _check_name(name: Any, kind: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string, got {type(name).__name__}")
        if name == "" or "." in name:
            raise KeyError(f'{kind} name cannot be empty or contain ".", got "{name}"')

    def register_parameter(self, name: str, parameter: Parameter | None) -> None:
        """Add a parameter (or None, a declared but absent parameter such as a disabled bias)."""
        self._check_name(name, "parameter")
        if parameter is not None and not isinstance(parameter, Parameter):
            raise TypeError(
                f"cannot assign '{type(parameter).__name__}' object to parameter '{name}' "
                "(ember.nn.Parameter or None required)"
            )
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        self._discard(name)
        self._parameters[name] = parameter

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Add state that is not trained (running statistics); non-persistent buffers stay out of state_dict."""
        self._check_name(name, "buffer")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(
                f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' (Tensor or None required)"
            )
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        self._discard(name)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent_buffers.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        self._check_name(name, "module")
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        self._discard(name)
        self._modules[name] = module

    register_module = add_module

    def get_submodule(self, target: str) -> Module:
        module = self
        for part in target.split(".") if target else ():
            child = module._modules.get(part)
            if child is None:
                raise AttributeError(f"{type(module).__name__} has no submodule `{part}` (looking up '{target}')")
            module = child
        return module

    def get_parameter(self, target: str) -> Parameter:
        module_path, _, name = target.rpartition(".")
        module = self.get_submodule(module_path)
        parameter = module._parameters.get(name)
        if parameter is None:
            raise AttributeError(f"{type(module).__name__} has no parameter `{name}` (looking up '{target}')")
        return parameter

    def get_buffer(self, target: str) -> Tensor:
        module_path, _, name = target.rpartition(".")
        module = self.get_submodule(module_path)
        buffer = module._buffers.get(name)
        if buffer is None:
            raise AttributeError(f"{type(module).__name__} has no buffer `{name}` (looking up '{target}')")
        return buffer

    # ---- iteration ----------------------------------------------------------------------------------------------

    def _named_members(
        self, get_members: Callable[[Module], Any], prefix: str, recurse: bool, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Any]]:
        seen: set[int] = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for name, value in get_members(module):
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                if remove_duplicate:
                    seen.add(id(value))
                yield (module_prefix + "." + name if module_prefix else name), value

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Parameter]]:
        return self._named_members(lambda module: module._parameters.items(), prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, parameter in self.named_parameters(recurse=recurse):
            yield parameter

    def named_buffers(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Tensor]]:
        return self._named_members(lambda module: module._buffers.items(), prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, buffer in self.named_buffers(recurse=recurse):
            yield buffer

    def named_children(self) -> Iterator[tuple[str, Module]]:
        seen: set[int] = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self) -> Iterator[Module]:
        for _, module in self.named_children():
            yield module

    def named_modules(
        self, memo: set[int] | None = None, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Module]]:
        if memo is None:
            memo = set()
        if remove_duplicate and id(self) in memo:
            return
        if remove_duplicate:
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            yield from module.named_modules(memo, prefix + "." + name if prefix else name, remove_duplicate)

    def modules(self) -> Iterator[Module]:
        for _, module in self.named_modules():
            yield module

    # ---- modes and gradients ----------------------------------------------------------------------------------

    def train(self, mode: bool = True) -> Self:
        if not isinstance(mode, bool):
            raise ValueError(f"training mode is expected to be a bool, got {type(mode).__name__}")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> Self:
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Self:
        for parameter in self.parameters():
            parameter.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients of every parameter (set them to None, or to zeros with set_to_none=False)."""
        for parameter in self.parameters():
            if parameter.grad is None:
                continue
            if set_to_none:
                parameter.grad = None
            else:
                parameter.grad = Tensor._full(parameter.shape, 0, parameter.dtype, parameter.device)

    def apply(self, function: Callable[[Module], Any]) -> Self:
        """Call function on every submodule (children first) and on self, like torch's Module.apply."""
        for module in self.children():
            module.apply(function)
        function(self)
        return self

    # ---- devices and dtypes -----------------------------------------------------------------------------------

    def to(self, *args: Any, **kwargs: Any) -> Self:
        """Move and/or cast parameters and buffers in place: `to(device)`, `to(dtype)` or `to(device, dtype)`.

        Only floating-point parameters and buffers change dtype, as in torch. The Parameter objects stay the same,
        so an optimizer made before the move keeps working.
        """
        from ember.core.creation import parse_to_arguments

        device, dtype = parse_to_arguments(args, kwargs)
        if dtype is not None and not dtype.is_float:
            raise TypeError(f"Module.to only accepts floating point dtypes, got {dtype}")

        def convert(tensor: Tensor) -> Tensor:
            result = tensor._detached_copy()  # (the tensor's node is set to the result: no alias)
            if dtype is not None and tensor.dtype.is_float:
                result = result.cast(dtype)
            if device is not None:
                result = result.to(device)
            return result

        return self._replace_tensors(convert)

    def _replace_tensors(self, convert: Callable[[Tensor], Tensor]) -> Self:
        """Give every parameter, gradient and buffer the value convert(value), realized in one schedule."""
        changed: list[Tensor] = []
        for module in self.modules():
            for parameter in module._parameters.values():
                if parameter is None:
                    continue
                unlink(parameter)  # as torch's param.data = ...: views taken before keep the old values
                parameter.node = convert(parameter).node
                changed.append(parameter)
                if parameter.grad is not None:
                    parameter.grad = convert(parameter.grad)
                    changed.append(parameter.grad)
            for name, buffer in module._buffers.items():
                if buffer is not None:
                    unlink(buffer)
                    buffer.node = convert(buffer).node
                    changed.append(buffer)
        _realize([tensor for tensor in changed if not tensor.node.realized])
        return self

    def cpu(self) -> Self:
        """Move parameters and buffers to ember's CPU device (the c backend), in place."""
        from ember.scheduler.devices import backend_device

        return self.to(backend_device("c", None, "Module.cpu()"))

    def cuda(self, device: Any = None) -> Self:
        """Move parameters and buffers to a cuda device (the first, or `device`: an index or 'cuda:N'), in place."""
        from ember.scheduler.devices import backend_device

        return self.to(backend_device("cuda", device, "Module.cuda()"))

    def float(self) -> Self:
        return self.to("float32")

    def double(self) -> Self:
        return self.to("float64")

    def half(self) -> Self:
        return self.to("float16")

    def bfloat16(self) -> Self:
        return self.to("bfloat16")

    # ---- state dicts ------------------------------------------------------------------------------------------

    def state_dict(
        self, destination: dict[str, Tensor] | None = None, prefix: str = "", keep_vars: bool = False
    ) -> OrderedDict[str, Tensor]:
        """Parameters and persistent buffers by dotted name, with the same keys and shapes as torch's layers."""
        result: OrderedDict[str, Tensor] = OrderedDict() if destination is None else destination  # type: ignore[assignment]
        for name, parameter in self._parameters.items():
            if parameter is not None:
                result[prefix + name] = parameter if keep_vars else parameter.detach()
        for name, buffer in self._buffers.items():
            if buffer is not None and name not in self._non_persistent_buffers:
                result[prefix + name] = buffer if keep_vars else buffer.detach()
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(result, prefix + name + ".", keep_vars)
        return result

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> IncompatibleKeys:
        """Copy values (ember tensors, numpy arrays or torch tensors) into parameters and buffers by name.

        strict=True raises when keys are missing or unexpected; shape mismatches always raise. Values keep the
        module's dtype and device (assign=True takes the checkpoint's dtype and device instead, as torch's assign
        does).
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"expected a mapping of names to tensors for state_dict, got {type(state_dict).__name__}")
        expected: dict[str, tuple[Module, str, bool]] = {}
        for module_prefix, module in self.named_modules(remove_duplicate=False):
            dotted = module_prefix + "." if module_prefix else ""
            for name, parameter in module._parameters.items():
                if parameter is not None:
                    expected[dotted + name] = (module, name, True)
            for name, buffer in module._buffers.items():
                if buffer is not None and name not in module._non_persistent_buffers:
                    expected[dotted + name] = (module, name, False)
        missing = [key for key in expected if key not in state_dict]
        unexpected = [key for key in state_dict if key not in expected]
        errors: list[str] = []
        updates: list[tuple[Tensor, Tensor]] = []
        for key, (module, name, _) in expected.items():
            if key not in state_dict:
                continue
            target = module._parameters[name] if name in module._parameters else module._buffers[name]
            # assign=True keeps the checkpoint tensor as it is (dtype and device: memory-mapped weights stay on disk)
            value = _as_ember_tensor(state_dict[key], None if assign else target.device)
            if tuple(value.shape) != tuple(target.shape):
                errors.append(
                    f"size mismatch for {key}: copying a param with shape {tuple(value.shape)} from "
                    f"checkpoint, the shape in current model is {tuple(target.shape)}."
                )
                continue
            updates.append((target, value))
        if strict:
            if unexpected:
                errors.insert(
                    0, "Unexpected key(s) in state_dict: " + ", ".join(f'"{key}"' for key in unexpected) + ". "
                )
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: " + ", ".join(f'"{key}"' for key in missing) + ". ")
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t" + "\n\t".join(errors))
        with no_grad():
            for target, value in updates:
                if assign:
                    unlink(target)
                    target.node = value.node
                else:  # copied in place, as torch's copy_: views of the parameter see the new values
                    set_value(target, value.cast(target.dtype).node)
        _realize([target for target, _ in updates if not target.node.realized])
        return IncompatibleKeys(missing, unexpected)

    # ---- hooks --------------------------------------------------------------------------------------------------

    def register_forward_hook(self, hook: Callable[[Module, tuple[Any, ...], Any], Any]) -> RemovableHandle:
        """hook(module, args, output) runs after forward; a non-None result replaces the output."""
        handle = RemovableHandle(self._forward_hooks)
        self._forward_hooks[handle.id] = hook
        return handle

    def register_forward_pre_hook(self, hook: Callable[[Module, tuple[Any, ...]], Any]) -> RemovableHandle:
        """hook(module, args) runs before forward; a non-None result replaces the arguments."""
        handle = RemovableHandle(self._forward_pre_hooks)
        self._forward_pre_hooks[handle.id] = hook
        return handle

    # ---- printing -------------------------------------------------------------------------------------------------

    def extra_repr(self) -> str:
        """The text inside the parentheses of this module's repr line; layers override it."""
        return ""

    def _get_name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        extra = self.extra_repr()
        child_lines = [f"({name}): " + _indent(repr(module), 2) for name, module in self._modules.items()]
        return _format_repr(self._get_name(), extra, child_lines)


def _format_repr(name: str, extra: str, child_lines: list[str]) -> str:
    """torch's layout: `Name(extra)` on one line, or children indented by two spaces, one per line."""
    lines = extra.split("\n") if extra else []
    lines += child_lines
    if not child_lines and len(lines) <= 1:
        return f"{name}({extra})"
    return name + "(\n  " + "\n  ".join(lines) + "\n)"


def _indent(text: str, spaces: int) -> str:
    first, *rest = text.split("\n")
    return "\n".join([first] + [" " * spaces + line for line in rest])


def _as_ember_tensor(value: Any, device: str | None) -> Tensor:
    """A state-dict value (ember Tensor, numpy array, torch tensor, number) as an ember tensor on `device` (an ember
    tensor stays where it is when device is None; other values go to the default device)."""
    if isinstance(value, Tensor):
        return value._detached_copy() if device is None else value._detached_copy().to(device)
    return tensor(value, device=device)


def _realize(tensors: list[Tensor]) -> None:
    if tensors:
        from ember.core.tensor import realize

        realize(*tensors)
