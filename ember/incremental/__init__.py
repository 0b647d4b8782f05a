"""Incremental recomputation (internal, not exported yet): dirty regions and their propagation through a lazy graph."""
