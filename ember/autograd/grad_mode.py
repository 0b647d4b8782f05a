"""Grad modes (no_grad, enable_grad, set_grad_enabled, inference_mode): whether ops record what backward needs.
Each is a field of the calling thread's (task's) context (ember/context.py): a switch in one thread never changes
another's, and a new thread starts with grad enabled, as in torch."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from ember.context import CONTEXT

Function = TypeVar("Function", bound=Callable[..., Any])


def is_grad_enabled() -> bool:
    """Whether ops on tensors that require grad currently record their history (in this thread)."""
    return CONTEXT.get().grad_enabled


def _set_grad(enabled: bool) -> None:
    CONTEXT.set(CONTEXT.get().with_grad(enabled))


class set_grad_enabled:
    """Switch gradient recording on or off: as a call, a context manager (restoring on exit) or a decorator."""

    def __init__(self, mode: bool) -> None:
        self.previous = CONTEXT.get().grad_enabled
        self.mode = bool(mode)
        _set_grad(self.mode)

    def __enter__(self) -> None:
        _set_grad(self.mode)

    def __exit__(self, *exception: object) -> None:
        _set_grad(self.previous)

    def __call__(self, function: Function) -> Function:
        _set_grad(self.previous)  # used as a decorator: the switch applies inside the function only
        mode = self.mode

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with set_grad_enabled(mode):
                return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class _GradModeSwitch:
    """A context manager and decorator that sets grad recording to `mode` and restores the previous mode."""

    mode: bool

    def __new__(cls, function: Callable[..., Any] | None = None) -> Any:
        if function is not None:  # used bare, as `@em.no_grad` (torch allows both forms)
            return cls()(function)
        return super().__new__(cls)

    def __init__(self, function: Callable[..., Any] | None = None) -> None:
        self.previous: list[bool] = []

    def __enter__(self) -> None:
        self.previous.append(CONTEXT.get().grad_enabled)
        _set_grad(self.mode)

    def __exit__(self, *exception: object) -> None:
        _set_grad(self.previous.pop())

    def __call__(self, function: Function) -> Function:
        switch = type(self)

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with switch():
                return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class no_grad(_GradModeSwitch):
    """Ops inside record no history: `with em.no_grad():` or `@em.no_grad()` (optimizer steps, evaluation)."""

    mode = False


class enable_grad(_GradModeSwitch):
    """Turn recording back on inside a no_grad region: `with em.enable_grad():` or `@em.enable_grad()`."""

    mode = True


def is_inference_mode_enabled() -> bool:
    """Whether code runs inside `ember.inference_mode()` (in this thread)."""
    return CONTEXT.get().inference


class inference_mode:
    """torch.inference_mode: no_grad for code that will never call backward: `with em.inference_mode():`,
    `@em.inference_mode()` or `@em.inference_mode`; `inference_mode(False)` changes nothing."""

    def __new__(cls, mode: bool | Callable[..., Any] = True) -> Any:
        if callable(mode) and not isinstance(mode, bool):  # used bare, as `@em.inference_mode`
            return cls()(mode)
        return super().__new__(cls)

    def __init__(self, mode: bool = True) -> None:
        self.mode = bool(mode)
        self.previous: list[tuple[bool, bool]] = []

    def __enter__(self) -> None:
        context = CONTEXT.get()
        self.previous.append((context.grad_enabled, context.inference))
        if self.mode:
            CONTEXT.set(context.replace(grad_enabled=False, inference=True))

    def __exit__(self, *exception: object) -> None:
        grad_enabled, inference = self.previous.pop()
        CONTEXT.set(CONTEXT.get().replace(grad_enabled=grad_enabled, inference=inference))

    def __call__(self, function: Function) -> Function:
        mode = self.mode

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with inference_mode(mode):
                return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
