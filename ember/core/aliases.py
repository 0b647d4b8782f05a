"""numpy's argument names as aliases of torch's: `axis=` for `dim=` and `keepdims=` for `keepdim=`, in one place.

PyTorch's argument parser accepts `x.sum(axis=0, keepdims=True)` for every op with a `dim`/`keepdim` parameter.
ember does the same with one decorator, `numpy_argument_names`, applied to each concrete tensor class (Tensor, the
reference tensor, ShardedTensor): it wraps every method with a `dim` or `keepdim` parameter, inherited ones
included, so a method added to any mixin later gets the aliases without doing anything. Module-level functions
with a `dim` parameter (`ember.cat`, `ember.stack`) use the same decorator directly.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

ALIASES: dict[str, str] = {"axis": "dim", "keepdims": "keepdim"}  # numpy's name -> torch's name
Target = TypeVar("Target")


def _parameter_names(function: Callable[..., Any]) -> tuple[list[str], int] | None:
    """(names of the parameters, how many can be given by position), or None when they cannot be read."""
    code = getattr(function, "__code__", None)
    if code is not None and not hasattr(function, "__wrapped__"):
        count = code.co_argcount + code.co_kwonlyargcount
        return list(code.co_varnames[:count]), code.co_argcount
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [parameter.name for parameter in signature.parameters.values()]
    return names, sum(1 for parameter in signature.parameters.values() if parameter.kind in positional)


def _with_aliases(function: Callable[..., Any]) -> Callable[..., Any]:
    """function accepting axis= and keepdims= for its dim and keepdim parameters (itself if it has neither)."""
    if getattr(function, "_numpy_argument_names", False):
        return function
    found = _parameter_names(function)
    if found is None:
        return function
    names, positional_count = found
    # alias -> (torch's name, the position it can be given at, or None when it is keyword-only)
    aliases = {
        alias: (name, names.index(name) if names.index(name) < positional_count else None)
        for alias, name in ALIASES.items() if name in names and alias not in names
    }
    if not aliases:
        return function
    label = function.__name__

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs and not aliases.keys().isdisjoint(kwargs):
            for alias, (name, position) in aliases.items():
                if alias not in kwargs:
                    continue
                if name in kwargs or (position is not None and len(args) > position):
                    raise TypeError(
                        f"{label}(): got both {name} and {alias} ({alias} is numpy's name for {name}); give one"
                    )
                kwargs[name] = kwargs.pop(alias)
        return function(*args, **kwargs)

    wrapper._numpy_argument_names = True  # type: ignore[attr-defined]
    return wrapper


def numpy_argument_names(target: Target) -> Target:
    """Decorate a function, or every public method of a class (inherited ones too), to accept axis= and keepdims=."""
    if not inspect.isclass(target):
        return _with_aliases(target)  # type: ignore[arg-type, return-value]
    for name in dir(target):
        if name.startswith("_"):  # private helpers and operators take no user keywords
            continue
        raw = inspect.getattr_static(target, name)
        if isinstance(raw, (staticmethod, classmethod, property)) or not inspect.isfunction(raw):
            continue
        wrapped = _with_aliases(raw)
        if wrapped is not raw:
            setattr(target, name, wrapped)
    return target
