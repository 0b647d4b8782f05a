"""DistributedDataParallel's buckets: the parameters grouped (by dtype and device, up to a size) so that each
group's gradients are averaged over the ranks by one collective, as soon as backward has given all of them."""

from __future__ import annotations

from collections.abc import Sequence

from ember.autograd.grad_mode import no_grad
from ember.core.tensor import Tensor
from ember.distributed.coalesced import all_reduce_coalesced
from ember.distributed.process_group import DistributedError
from ember.distributed.reduce_op import ReduceOp


class GradientBuckets:
    """The parameters in buckets of at most `bucket_bytes` (one parameter larger than that gets a bucket of its
    own), filled in reverse registration order (the order backward usually completes gradients in). `ready(p)` is
    each parameter's post-accumulate-grad hook: when a bucket's last gradient arrives, the bucket's gradients are
    averaged over the ranks (one all_reduce of their flattened values) and each .grad becomes its averaged value."""

    def __init__(self, parameters: Sequence[Tensor], names: dict[int, str], bucket_bytes: int) -> None:
        self.names = names
        self.buckets: list[list[Tensor]] = []
        open_buckets: dict[tuple[object, str], list[Tensor]] = {}
        sizes: dict[tuple[object, str], int] = {}
        for parameter in reversed(list(parameters)):
            key = (parameter.dtype, str(parameter.device))
            nbytes = parameter.numel() * parameter.dtype.itemsize
            bucket = open_buckets.get(key)
            if bucket is not None and sizes[key] + nbytes > bucket_bytes:
                bucket = None
            if bucket is None:
                bucket = open_buckets[key] = []
                sizes[key] = 0
                self.buckets.append(bucket)
            bucket.append(parameter)
            sizes[key] += nbytes
        self.bucket_of = {id(parameter): index for index, bucket in enumerate(self.buckets) for parameter in bucket}
        self.arrived: list[set[int]] = [set() for _ in self.buckets]
        self.enabled = True  # False inside DistributedDataParallel.no_sync()
        self.reductions = 0  # collectives run so far (one per bucket and backward)

    def ready(self, parameter: Tensor) -> None:
        """Backward has accumulated this parameter's gradient (or it took no part in the forward): once its bucket
        is complete, average the bucket's gradients over the ranks."""
        if not self.enabled:
            return
        index = self.bucket_of[id(parameter)]
        arrived = self.arrived[index]
        if id(parameter) in arrived:
            raise DistributedError(f"DistributedDataParallel: the parameter {self._name(parameter)} was marked ready "
                                   "twice in one iteration (it took no part in the forward, so find_unused_parameters "
                                   "marked it, yet backward reached it)")
        arrived.add(id(parameter))
        if len(arrived) == len(self.buckets[index]):
            arrived.clear()
            self._reduce(self.buckets[index])

    def check_finished(self) -> None:
        """Raise when the last backward left a bucket partly reduced (some of its parameters got no gradient)."""
        missing = [self._name(parameter) for index, arrived in enumerate(self.arrived) if arrived
                   for parameter in self.buckets[index] if id(parameter) not in arrived]
        if missing:
            for arrived in self.arrived:
                arrived.clear()
            raise DistributedError(
                "DistributedDataParallel: Expected to have finished reduction in the prior iteration before starting "
                f"a new one: the parameters {', '.join(missing)} received no gradient in the last backward, so their "
                "buckets were never averaged over the ranks. Pass find_unused_parameters=True to "
                "DistributedDataParallel when some parameters take no part in the loss")

    def _reduce(self, bucket: list[Tensor]) -> None:
        with no_grad():
            gradients = [parameter.grad if parameter.grad is not None
                         else Tensor._full(parameter.shape, 0, parameter.dtype, str(parameter.device))
                         for parameter in bucket]
            averaged = all_reduce_coalesced(gradients, ReduceOp.AVG)
        for parameter, gradient in zip(bucket, averaged):
            parameter.grad = gradient
        self.reductions += 1

    def _name(self, parameter: Tensor) -> str:
        return self.names.get(id(parameter), f"of shape {tuple(parameter.shape)}")
