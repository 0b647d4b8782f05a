"""Sharding: tensors split across devices (tensor.py, ShardedTensor and `ember.shard`) and the automatic split of
large outputs across the compute devices (automatic.py builds it, decision.py decides it from calibration.py's
measured speeds and the pools' free bytes, slicing.py gives each device only its part of the work)."""
