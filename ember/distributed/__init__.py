"""ember.distributed: data-parallel collectives over MPI (mpi4py), with torch.distributed's names and semantics.

Start the ranks with `mpiexec -n N python script.py` (on several machines: `mpiexec -f hostfile -n N ...`); each
calls init_process_group("mpi") and then the collectives, which change ember tensors of any device in place.
`ember.nn.parallel.DistributedDataParallel` averages a model's gradients with them.
"""

from ember.distributed.collectives import (
    Work, all_gather, all_gather_into_tensor, all_reduce, barrier, broadcast, reduce_scatter, reduce_scatter_tensor,
)
from ember.distributed.communication import CollectiveStatistics, collective_statistics
from ember.distributed.launcher import find_mpiexec
from ember.distributed.objects import all_gather_object, broadcast_object_list
from ember.distributed.process_group import (
    DistributedError, destroy_process_group, get_backend, get_rank, get_world_size, init_process_group,
    is_available, is_initialized,
)
from ember.distributed.reduce_op import ReduceOp

__all__ = [
    "CollectiveStatistics", "DistributedError", "ReduceOp", "Work", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "all_reduce", "barrier", "broadcast", "broadcast_object_list", "collective_statistics",
    "destroy_process_group", "find_mpiexec", "get_backend", "get_rank", "get_world_size", "init_process_group",
    "is_available", "is_initialized", "reduce_scatter", "reduce_scatter_tensor",
]
