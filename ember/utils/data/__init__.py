"""ember.utils.data: datasets, samplers and the DataLoader, with torch.utils.data's names and semantics.

Batches are ember tensors. Worker processes (num_workers > 0, spawned) fetch and collate into numpy arrays and the
main process makes them ember tensors, since ember device buffers cannot cross processes. Random orders come from
an ember.Generator, which draws the same permutations as torch's CPU generator for the same seed.
"""

from ember.core.generator import Generator
from ember.utils.data.collate import collate, default_collate, default_convert
from ember.utils.data.dataloader import DataLoader
from ember.utils.data.dataset import (
    ChainDataset, ConcatDataset, Dataset, IterableDataset, Subset, TensorDataset, random_split,
)
from ember.utils.data.distributed import DistributedSampler
from ember.utils.data.sampler import (
    BatchSampler, RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler, WeightedRandomSampler,
)
from ember.utils.data.worker import WorkerInfo, get_worker_info

__all__ = [
    "BatchSampler", "ChainDataset", "ConcatDataset", "DataLoader", "Dataset", "DistributedSampler", "Generator",
    "IterableDataset", "RandomSampler", "Sampler", "SequentialSampler", "Subset", "SubsetRandomSampler",
    "TensorDataset", "WeightedRandomSampler", "WorkerInfo", "collate", "default_collate", "default_convert",
    "get_worker_info", "random_split",
]
