"""Table-driven gradient checks: run a function in ember and in PyTorch, compare outputs and input gradients."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import ember as em
from tests.helpers import assert_close, random_array


@dataclass(frozen=True)
class Case:
    """One gradient check: `function` runs on ember tensors and, unless `torch_function` is given, on torch tensors.

    `shapes` are the float inputs (all differentiated); `low`/`high` bound their random values; `data` gives explicit
    values instead (for ties and zeros); `second_order` also checks the gradient of the gradient.
    """

    name: str
    function: Callable[..., Any]
    shapes: Sequence[tuple[int, ...]]
    torch_function: Callable[..., Any] | None = None
    low: float = -2.0
    high: float = 2.0
    data: Sequence[Any] | None = None
    dtype: Any = np.float32
    atol: float = 1e-4
    rtol: float = 1e-3
    second_order: bool = False
    marks: Sequence[Any] = field(default_factory=tuple)

    def __str__(self) -> str:
        return self.name


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _upstream(outputs: tuple[Any, ...], device: str, seed: int) -> tuple[list[em.Tensor], list[torch.Tensor]]:
    """A random gradient for each output (so that outputs with a constant sum, like softmax, still test something)."""
    ember_grads, torch_grads = [], []
    for position, output in enumerate(outputs):
        array = random_array(tuple(output.shape), np.dtype(str(output.dtype).replace("torch.", "")),
                             seed=1000 + seed + position)
        ember_grads.append(em.tensor(array, device=device))
        torch_grads.append(torch.tensor(array))
    return ember_grads, torch_grads


def check_gradients(case: Case, device: str) -> None:
    """Compare case.function's outputs and gradients (and second-order gradients if asked) with PyTorch's."""
    arrays = [np.asarray(value, dtype=case.dtype) for value in case.data] if case.data is not None else [
        random_array(shape, case.dtype, case.low, case.high, seed=seed) for seed, shape in enumerate(case.shapes)
    ]
    inputs = [em.tensor(array, device=device, requires_grad=True) for array in arrays]
    torch_inputs = [torch.tensor(array, requires_grad=True) for array in arrays]
    torch_function = case.torch_function or case.function

    outputs = _as_tuple(case.function(*inputs))
    torch_outputs = _as_tuple(torch_function(*torch_inputs))
    upstream, torch_upstream = _upstream(torch_outputs, device, seed=len(arrays))
    em.realize(*outputs)  # as in training: the forward pass is computed first, backward reuses its results
    create_graph = case.second_order
    grads = em.grad(outputs, inputs, upstream, create_graph=create_graph, allow_unused=True)
    torch_grads = torch.autograd.grad(torch_outputs, torch_inputs, torch_upstream, create_graph=create_graph,
                                      allow_unused=True)
    assert_close(list(outputs), list(torch_outputs), atol=case.atol, rtol=case.rtol)
    for position, (grad, torch_grad) in enumerate(zip(grads, torch_grads)):
        if torch_grad is None:
            assert grad is None or not np.any(grad.numpy()), f"input {position}: torch gives no gradient"
            continue
        assert grad is not None, f"input {position}: ember gives no gradient, torch does"
        assert_close(grad, torch_grad, atol=case.atol, rtol=case.rtol)
    if not case.second_order:
        return
    # differentiate <grads, v> again: a Hessian-vector product for each input
    used = [(grad, torch_grad) for grad, torch_grad in zip(grads, torch_grads) if torch_grad is not None]
    vectors, torch_vectors = _upstream(tuple(torch_grad for _, torch_grad in used), device, seed=50)
    total = sum(((grad * vector).sum() for (grad, _), vector in zip(used, vectors)), start=em.zeros((), device=device))
    torch_total = sum((torch_grad * vector).sum() for (_, torch_grad), vector in zip(used, torch_vectors))
    assert torch_total.requires_grad, "second_order case whose gradient is constant"
    second = em.grad(total, inputs, allow_unused=True, materialize_grads=True)
    torch_second = torch.autograd.grad(torch_total, torch_inputs, allow_unused=True, materialize_grads=True)
    for grad, torch_grad in zip(second, torch_second):
        assert_close(grad, torch_grad, atol=case.atol * 10, rtol=case.rtol * 10)
