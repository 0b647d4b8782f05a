"""ember.io: saving and loading tensors and state dicts (safetensors)."""

from ember.io.safetensors import (
    SafetensorsError,
    load_safetensors,
    load_safetensors_metadata,
    read_safetensors_header,
    save_safetensors,
)

__all__ = [
    "SafetensorsError",
    "load_safetensors",
    "load_safetensors_metadata",
    "read_safetensors_header",
    "save_safetensors",
]
