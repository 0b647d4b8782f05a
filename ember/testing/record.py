"""record_reference: run a PyTorch module on inputs with forward hooks and save the inputs, the outputs and every
layer's output as reference pairs (ember.testing.pairs' layout) for `check_against` and `python -m ember check`."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ember.testing.pairs import CheckError, as_array, first_tensor, flatten_result, save_pairs


def _as_torch(value: Any) -> Any:
    import torch

    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    return value


def _calls(inputs: Any) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """(positional, keyword) inputs per pair: a list holds one entry per pair; an entry is a tensor or array (one
    positional input), a tuple (positional inputs) or a dict (keyword inputs)."""
    entries = inputs if isinstance(inputs, list) else [inputs]
    if not entries:
        raise CheckError("record_reference: the list of inputs is empty")
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    for entry in entries:
        if isinstance(entry, tuple):
            calls.append((tuple(_as_torch(value) for value in entry), {}))
        elif isinstance(entry, Mapping):
            calls.append(((), {str(name): _as_torch(value) for name, value in entry.items()}))
        else:
            calls.append(((_as_torch(entry),), {}))
    return calls


def record_reference(torch_module: Any, inputs: Any, path: str | os.PathLike[str] | None = None, *,
                     outputs: Callable[[Any], Any] | None = None, layers: bool = True) -> dict[str, np.ndarray]:
    """Run `torch_module` on `inputs` and save references that `ember.testing.check_against` and `python -m ember
    check` compare an ember model with; returns the flat dict that was saved.

    inputs: one call's inputs, or a list with one entry per call (a pair). An entry is a tensor or numpy array (the
    only positional input), a tuple (positional inputs) or a dict (keyword inputs, e.g. a tokenizer's
    input_ids/attention_mask for a Hugging Face model).
    outputs: applied to the module's result before saving, to pick what the ember model returns, e.g.
    `lambda result: result.last_hidden_state` for a Hugging Face model whose ember port returns that tensor alone.
    layers: with True, a forward hook on every submodule of `named_modules()` records its output (the first tensor
    of a tuple or dict output) as `layer.<module name>` (`layer.<name>@<n>` for its n-th later call); the check
    runs the ember model with the same hooks and names the first layer, in execution order, that diverges. Ember's
    module names must then follow torch's (as ember's BertModel follows Hugging Face's).
    path: where to write them, as numpy .npz if the name ends in .npz, else as safetensors; None writes nothing.

    The module runs as it is (call `.eval()` first so that dropout is off), without gradients. Keys: pair<k>/input.<i>,
    pair<k>/input.<name>, pair<k>/output.<i or name>, pair<k>/layer.<module name> (see ember.testing.pairs).
    """
    import torch

    if not callable(torch_module):
        raise CheckError(f"record_reference: expected a torch.nn.Module or a callable, got "
                         f"{type(torch_module).__name__}")
    saved: dict[str, np.ndarray] = {}
    calls = _calls(inputs)
    recorded: dict[str, Any] = {}
    counts: dict[str, int] = {}
    handles = []

    def hook_for(name: str) -> Callable[..., None]:
        def hook(module: Any, arguments: Any, output: Any) -> None:
            value = first_tensor(output)
            if value is None:
                return
            count = counts.get(name, 0)
            counts[name] = count + 1
            recorded[name if count == 0 else f"{name}@{count}"] = as_array(value, f"layer {name}").copy()

        return hook

    if layers and isinstance(torch_module, torch.nn.Module):
        handles = [module.register_forward_hook(hook_for(name)) for name, module in torch_module.named_modules()
                   if name]
    try:
        for index, (positional, keyword) in enumerate(calls):
            prefix = f"pair{index}/"
            recorded.clear()
            counts.clear()
            with torch.no_grad():
                result = torch_module(*positional, **keyword)
            if outputs is not None:
                result = outputs(result)
            for position, value in enumerate(positional):
                saved[f"{prefix}input.{position}"] = as_array(value, f"input {position}")
            for name, value in keyword.items():
                saved[f"{prefix}input.{name}"] = as_array(value, f"input {name}")
            named = flatten_result(result)
            if not named:
                raise CheckError("record_reference: the module returned no tensor (pass outputs= to pick one)")
            for name, value in named.items():
                saved[f"{prefix}output.{name}"] = as_array(value, f"output {name}")
            for name, value in recorded.items():
                saved[f"{prefix}layer.{name}"] = value
    finally:
        for handle in handles:
            handle.remove()
    saved = {key: np.ascontiguousarray(value) for key, value in saved.items()}
    if path is not None:
        save_pairs(saved, path)
    return saved
