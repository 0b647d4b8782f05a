"""ember.io: saving and loading tensors, state dicts and checkpoints (safetensors), reading GGUF files, quantized
blocks."""

from ember.io.checkpoint import load, save
from ember.io.gguf import GGUFError, GGUFHeader, GGUFTensorInfo, load_gguf, load_gguf_metadata, read_gguf_header
from ember.io.quantized import Q4_0, Q4_K, Q5_0, Q5_K, Q6_K, Q8_0, QuantFormat, QuantizedTensor
from ember.io.safetensors import (
    SafetensorsError,
    load_file,
    load_model,
    load_safetensors,
    load_safetensors_metadata,
    read_safetensors_header,
    save_file,
    save_model,
    save_safetensors,
)

__all__ = [
    "GGUFError",
    "GGUFHeader",
    "GGUFTensorInfo",
    "Q4_0",
    "Q4_K",
    "Q5_0",
    "Q5_K",
    "Q6_K",
    "Q8_0",
    "QuantFormat",
    "QuantizedTensor",
    "SafetensorsError",
    "load",
    "load_gguf",
    "load_file",
    "load_gguf_metadata",
    "load_model",
    "load_safetensors",
    "load_safetensors_metadata",
    "read_gguf_header",
    "read_safetensors_header",
    "save",
    "save_file",
    "save_model",
    "save_safetensors",
]
