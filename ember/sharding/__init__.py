"""Sharding: tensors split across devices (tensor.py, ShardedTensor and `ember.shard`) and the automatic split of
large outputs across every compute device (automatic.py)."""
