"""torch's module-level forms of Tensor methods (`ember.exp(x)` is `x.exp()`), made by one rule, not lists of names.

The rule: `ember.NAME` exists for every Tensor method whose name is a torch function (`torch_names.TORCH_FUNCTIONS`,
the committed list of PyTorch's `torch.*` names), unless ember defines `NAME` itself (`ember.where`, `ember.cat`, the
creation functions, the dtypes) or torch's function takes other arguments than ember's method (`NOT_FUNCTION_FORMS`).
So a method added to Tensor later is reachable as `ember.NAME` without touching this file.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ember.core.elementwise import ElementwiseOps
from ember.torch_names import TORCH_FUNCTIONS

# Tensor methods named like a torch function that has other arguments: ember's method follows
# torch.nn.functional.NAME, while torch.NAME is the lower-level ATen operator
NOT_FUNCTION_FORMS: dict[str, str] = {
    "batch_norm": "torch.batch_norm(input, weight, bias, running_mean, running_var, ...) orders its arguments "
                  "differently; use ember.nn.functional.batch_norm",
    "binary_cross_entropy_with_logits": "torch's takes reduction as an integer enum; use "
                                        "ember.nn.functional.binary_cross_entropy_with_logits",
    "embedding": "torch.embedding(weight, indices) takes the weight first; use ember.nn.functional.embedding",
    "feature_dropout": "torch.feature_dropout(input, p, train) has no spatial argument; use "
                       "ember.nn.functional.dropout1d/dropout2d",
    "kl_div": "torch's takes reduction as an integer enum; use ember.nn.functional.kl_div",
    "margin_ranking_loss": "torch's takes reduction as an integer enum; use ember.nn.functional.margin_ranking_loss",
    "hinge_embedding_loss": "torch's takes reduction as an integer enum; use "
                            "ember.nn.functional.hinge_embedding_loss",
    "cosine_embedding_loss": "torch's takes reduction as an integer enum; use "
                             "ember.nn.functional.cosine_embedding_loss",
    "triplet_margin_loss": "torch's takes reduction as an integer enum; use ember.nn.functional.triplet_margin_loss",
    "poisson_nll_loss": "torch's takes reduction as an integer enum; use ember.nn.functional.poisson_nll_loss",
    "instance_norm": "torch.instance_norm(input, weight, bias, running_mean, running_var, use_input_stats, ...) "
                     "orders its arguments differently; use ember.nn.functional.instance_norm",
}


def _reverse_add(tensor: Any, number: Any, alpha: Any = 1) -> Any:
    return (tensor if alpha == 1 else tensor * alpha).__radd__(number)


def _reverse_sub(tensor: Any, number: Any, alpha: Any = 1) -> Any:
    return (tensor if alpha == 1 else tensor * alpha).__rsub__(number)


# torch.add(2, x) and friends: torch takes a Python number as the first operand of these (a "wrapped number", with
# the dtype rules of a scalar), which is what ember's reflected operators do
NUMBER_FIRST: dict[str, Callable[..., Any]] = {
    "add": _reverse_add,
    "sub": _reverse_sub,
    "subtract": _reverse_sub,
    "mul": lambda tensor, number: tensor.__rmul__(number),
    "multiply": lambda tensor, number: tensor.__rmul__(number),
    "div": lambda tensor, number, rounding_mode=None: tensor.div(number, rounding_mode, reverse=True),
    "divide": lambda tensor, number, rounding_mode=None: tensor.div(number, rounding_mode, reverse=True),
    "true_divide": lambda tensor, number: tensor.div(number, reverse=True),
    "floor_divide": lambda tensor, number: tensor.floor_divide(number, reverse=True),
    "remainder": lambda tensor, number: tensor.remainder(number, reverse=True),
    "pow": lambda tensor, number: tensor.pow(number, reverse=True),
}


def function_form(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """`NAME(input, *args, **kwargs)` calling `input.NAME(*args, **kwargs)`; input must be a tensor (as in torch)."""
    number_first = NUMBER_FIRST.get(name)

    def function(*args: Any, **kwargs: Any) -> Any:
        if args:
            first, rest = args[0], args[1:]
        elif "input" in kwargs:
            first, rest = kwargs.pop("input"), ()
        else:
            raise TypeError(f"{name}() missing required argument 'input' (a Tensor)")
        if not isinstance(first, ElementwiseOps):
            if number_first is not None and isinstance(first, (int, float, bool)) and rest and isinstance(
                rest[0], ElementwiseOps
            ):
                return number_first(rest[0], first, *rest[1:], **kwargs)
            raise TypeError(f"{name}(): argument 'input' (position 1) must be Tensor, not {type(first).__name__}")
        return getattr(first, name)(*rest, **kwargs)

    function.__name__ = function.__qualname__ = name
    function.__module__ = "ember"
    function.__doc__ = f"ember.{name}(input, ...) is input.{name}(...)." + (
        f"\n\n{method.__doc__}" if method.__doc__ else ""
    )
    return function


def function_forms(tensor_class: type, namespace: Mapping[str, Any]) -> dict[str, Callable[..., Any]]:
    """The function forms the rule gives: names of torch functions that are plain methods of tensor_class and are
    not already defined in namespace (the ember package's globals)."""
    forms = {}
    for name in TORCH_FUNCTIONS:
        if name in namespace or name in NOT_FUNCTION_FORMS:
            continue
        method = inspect.getattr_static(tensor_class, name, None)
        if inspect.isfunction(method):
            forms[name] = function_form(name, method)
    return forms
