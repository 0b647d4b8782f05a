"""ember.io: saving and loading tensors, state dicts and checkpoints (safetensors)."""

from ember.io.checkpoint import load, save
from ember.io.safetensors import (
    SafetensorsError,
    load_safetensors,
    load_safetensors_metadata,
    read_safetensors_header,
    save_safetensors,
)

__all__ = [
    "SafetensorsError",
    "load",
    "load_safetensors",
    "load_safetensors_metadata",
    "read_safetensors_header",
    "save",
    "save_safetensors",
]
