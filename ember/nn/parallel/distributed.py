"""DistributedDataParallel: a module replicated on every rank whose gradients are averaged over the ranks right
after backward (in buckets, one collective each), so that every rank's optimizer takes the same step."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ember.autograd.grad_mode import is_grad_enabled
from ember.core.tensor import Tensor
from ember.core.walk import post_order
from ember.distributed.coalesced import broadcast_coalesced
from ember.distributed.process_group import DistributedError, check_group
from ember.nn.module import Module
from ember.nn.parallel.gradient_buckets import GradientBuckets

DEFAULT_BUCKET_MEGABYTES = 25.0  # torch's bucket_cap_mb


class DistributedDataParallel(Module):
    """Data-parallel training over the ranks of ember.distributed, with torch's name and semantics.

    At wrap time every parameter and buffer is broadcast from rank 0, so every rank starts from the same model.
    Each rank runs the forward (`module`'s) and backward on its own part of the batch; as backward completes the
    gradients, they are averaged over the ranks in buckets (several parameters flattened into one all_reduce), so
    that after backward every rank holds the gradient of the whole batch (for a loss that is a mean over the
    batch) and any optimizer takes the same step everywhere. Under ember.jit the averaging is a step of the
    captured program. With broadcast_buffers (the default) the buffers (batch norm statistics) are broadcast from
    rank 0 before each forward. `no_sync()` skips the averaging (gradient accumulation); find_unused_parameters
    lets parameters that take no part in the loss count as zero gradients. state_dict keys start with "module."
    as in torch; save on rank 0 and load on every rank (ember.save, ember.load).

    device_ids, output_device and dim have no effect: ember places tensors itself; process_group must be None."""

    def __init__(self, module: Module, device_ids: Any = None, output_device: Any = None, dim: int = 0,
                 broadcast_buffers: bool = True, process_group: Any = None, bucket_cap_mb: float | None = None,
                 find_unused_parameters: bool = False, check_reduction: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False, init_sync: bool = True) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel: module must be an ember.nn.Module, got {type(module).__name__}")
        group = check_group(process_group, "DistributedDataParallel")
        names = {id(parameter): name for name, parameter in module.named_parameters()}
        parameters = [parameter for parameter in module.parameters() if parameter.requires_grad]
        if not parameters:
            raise DistributedError("DistributedDataParallel is not needed when a module doesn't have any parameter "
                                   "that requires a gradient")
        megabytes = DEFAULT_BUCKET_MEGABYTES if bucket_cap_mb is None else float(bucket_cap_mb)
        if megabytes <= 0:
            raise DistributedError(f"DistributedDataParallel: bucket_cap_mb must be positive, got {bucket_cap_mb}")
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.world_size = group.size
        self.reducer = GradientBuckets(parameters, names, int(megabytes * 1024 * 1024))
        if init_sync and group.size > 1:
            _broadcast_from_first_rank([*module.parameters(), *module.buffers()])
        # (on one rank the average is the gradient itself: nothing to do after backward)
        self._handles = [parameter.register_post_accumulate_grad_hook(self.reducer.ready) for parameter in parameters
                         if group.size > 1]

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """The wrapped module's forward, after the checks of the last iteration and the buffers' broadcast."""
        self.reducer.check_finished()
        if self.broadcast_buffers and self.world_size > 1:
            buffers = list(self.module.buffers())
            if buffers:
                _broadcast_from_first_rank(buffers)
        output = self.module(*inputs, **kwargs)
        if self.find_unused_parameters and is_grad_enabled() and self.reducer.enabled:
            self._mark_unused(output)
        return output

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside, backward accumulates gradients locally without averaging them; the first backward after it
        averages what was accumulated (torch's way to accumulate gradients over several batches)."""
        previous = self.reducer.enabled
        self.reducer.enabled = False
        try:
            yield
        finally:
            self.reducer.enabled = previous

    def _mark_unused(self, output: Any) -> None:
        """Mark ready the parameters the output does not depend on: they take part with zero gradients."""
        roots = [leaf for leaf in _tensors(output) if leaf.requires_grad]
        reached = {id(tensor) for tensor in post_order(
            roots, lambda tensor: tensor._context[2] if tensor._context is not None else ())}
        for bucket in self.reducer.buckets:
            for parameter in bucket:
                if id(parameter) not in reached:
                    self.reducer.ready(parameter)


def _broadcast_from_first_rank(tensors: list[Tensor]) -> None:
    """Broadcast tensors from rank 0, one collective per dtype and device."""
    groups: dict[tuple[object, str], list[Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.dtype, str(tensor.device)), []).append(tensor)
    for members in groups.values():
        broadcast_coalesced(members, 0)


def _tensors(value: Any) -> list[Tensor]:
    """The tensors in a forward's output (a tensor, or nested tuples, lists and dicts of them)."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in _tensors(item)]
    if isinstance(value, dict):
        return [tensor for item in value.values() for tensor in _tensors(item)]
    return []
