"""ember.nn.parallel: DistributedDataParallel, data-parallel training over the ranks of ember.distributed."""

from ember.nn.parallel.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
