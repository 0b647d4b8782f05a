"""Decoder-only language models from GGUF files, one implementation for the llama family: Llama, Qwen2, Qwen3 and
Gemma-3. What differs between them is data (`DecoderConfig`, read from the file's metadata, and which tensors the
file has): the rotary embedding's pairing (adjacent pairs as llama.cpp's Llama, or halves), q/k/v biases (Qwen2),
q/k norms (Qwen3, Gemma-3), the norms after attention and MLP (Gemma-3), the MLP's gate (SiLU or tanh-GELU), the
embedding scale, sliding-window layers and soft-capping (Gemma-3), llama-3's RoPE frequency factors, and a tied or
separate output projection. A prompt is run in one pass (causal mask) that fills a fixed-size key/value cache on
the device; then one token per step against that cache.

A step writes its key and value into the whole cache (in place) but attends only over the cache's first `attended`
slots: the filled ones rounded up to a multiple of ATTENDED_GRANULE (`attended_slots`), so a step early in a long
cache does the attention work of a few hundred slots, not of the cache's length (and Gemma-3's sliding-window
layers read at most window - 1 + ATTENDED_GRANULE slots of those, `window_start`). Within one such bucket every step
has the same graph structure (the position is a device tensor and the attended slots beyond it are masked), so its
kernels are compiled once per bucket and its schedule (or `ember.jit` capture) reused for every token of the
bucket; prompts are padded to a few sizes (generate.py), so their pass is compiled once per size.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import ember as em
from ember import nn
from ember.core.runtime import RUNTIME
from ember.core.tensor import Tensor, realize
from ember.io import read_gguf_header
from ember.io.gguf import GGUFHeader, load_gguf_tensor
from ember.io.quantized import QuantizedTensor
from ember.io.in_place import mapped_in_place, region_view, region_written
from ember.nn import functional as F
from ember.nn.quantized import QuantizedEmbedding, QuantizedLinear


ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
ATTENDED_GRANULE = 128  # a decode step attends over the filled slots rounded up to a multiple of this


def attended_slots(position: int, length: int) -> int:
    """How many slots of a cache of `length` a decode step at `position` attends over: the filled ones (up to and
    including `position`) rounded up to a multiple of ATTENDED_GRANULE, at most `length`. Each distinct count
    compiles (and `ember.jit` captures) the step once, so the granule trades steps' wasted slots against those."""
    return min(length, -(-(position + 1) // ATTENDED_GRANULE) * ATTENDED_GRANULE)


def write_window(attended: int) -> tuple[int, int]:
    """The slots [start, attended) a decode step attending over `attended` slots writes its own slot in: the last
    granule of them (it holds the position: `attended_slots`), the same for every step of the bucket."""
    return (attended - 1) // ATTENDED_GRANULE * ATTENDED_GRANULE, attended


def window_start(attended: int, window: int) -> int:
    """The first slot the sliding-window layers of a step that attends over `attended` slots (`attended_slots` of
    its position) read: the start of the window of the earliest position with that count, so the window of every
    position with it lies inside [window_start, attended), at most window - 1 + ATTENDED_GRANULE slots."""
    earliest = (attended - 1) // ATTENDED_GRANULE * ATTENDED_GRANULE
    return max(0, earliest - window + 1)


@dataclass(frozen=True)
class DecoderConfig:
    """A decoder's hyper-parameters, from a GGUF file's `<architecture>.*` metadata (`from_gguf`)."""

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
    sliding_window: int | None = 512  # None: every layer attends to every earlier position
    sliding_window_pattern: int = 6  # every 6th layer attends globally (llama.cpp's and transformers' Gemma-3)
    query_pre_attn_scalar: float = 256.0
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    architecture: str = "gemma3"
    rope_pairs_adjacent: bool = False  # llama.cpp's Llama rotates (2i, 2i+1); the others rotate (i, i + dim/2)
    gate_activation: str = "gelu_tanh"  # of the MLP's gate: "gelu_tanh" (Gemma) or "silu" (Llama, Qwen)
    embedding_scale: float | None = None  # Gemma multiplies the embeddings by sqrt(hidden_size)

    @classmethod
    def from_gguf(cls, header: GGUFHeader) -> DecoderConfig:
        metadata = header.metadata
        architecture = metadata.get("general.architecture")
        if architecture not in ARCHITECTURES:
            raise ValueError(f"{header.path}: general.architecture is {architecture!r}; ember's decoder reads "
                             f"{', '.join(ARCHITECTURES)}")

        def value(key: str, default: Any = None) -> Any:
            found = metadata.get(f"{architecture}.{key}", default)
            if found is None:
                raise ValueError(f"{header.path}: the metadata has no {architecture}.{key}")
            return found

        heads = value("attention.head_count")
        hidden_size = value("embedding_length")
        head_dim = value("attention.key_length", hidden_size // heads)
        rotated = metadata.get(f"{architecture}.rope.dimension_count", head_dim)
        if rotated != head_dim:
            raise ValueError(f"{header.path}: the rotary embedding turns {rotated} of each head's {head_dim} "
                             f"dimensions; ember's decoder rotates whole heads only")
        scaling = metadata.get(f"{architecture}.rope.scaling.type", "none")
        if scaling not in ("none", None):
            raise ValueError(f"{header.path}: RoPE scaling {scaling!r} is not supported (llama-3's frequency "
                             f"factors, the rope_freqs tensor, are)")
        gemma = architecture == "gemma3"
        return cls(
            vocab_size=header.tensors["token_embd.weight"].shape[0],
            hidden_size=hidden_size,
            layers=value("block_count"),
            intermediate_size=value("feed_forward_length"),
            heads=heads,
            kv_heads=value("attention.head_count_kv", heads),
            head_dim=head_dim,
            rms_norm_eps=value("attention.layer_norm_rms_epsilon"),
            rope_global_base=value("rope.freq_base", 10000.0),
            sliding_window=value("attention.sliding_window", 512) if gemma else None,
            query_pre_attn_scalar=float(head_dim),
            attn_logit_softcapping=metadata.get(f"{architecture}.attn_logit_softcapping"),
            final_logit_softcapping=metadata.get(f"{architecture}.final_logit_softcapping"),
            architecture=architecture,
            rope_pairs_adjacent=architecture == "llama",
            gate_activation="gelu_tanh" if gemma else "silu",
            embedding_scale=math.sqrt(hidden_size) if gemma else None,
        )

    def is_sliding(self, layer: int) -> bool:
        return self.sliding_window is not None and (layer + 1) % self.sliding_window_pattern != 0


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight (GGUF stores Gemma's (1 + weight) already added)."""

    def __init__(self, weight: Tensor, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", weight)

    def forward(self, x: Tensor) -> Tensor:
        return x * (x.square().mean(-1, keepdim=True) + self.eps).rsqrt() * self.weight


def rotation(positions: Tensor, head_dim: int, base: float,
             factors: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """cos and sin (tokens, 1, head_dim // 2) of the rotary embedding's angles at positions (tokens,); `factors`
    (head_dim // 2,), llama-3's rope_freqs, divide the frequencies. Both are stored (`contiguous`), computed once
    per forward: fused into the q and k rotations instead, each layer's kernels computed an exp and two sines per
    element of every head (a Gemma-3 decode step: 36 such kernels, ~0.4 ms)."""
    exponents = em.arange(0, head_dim, 2, dtype=em.float32, device=positions.device) / head_dim
    inverse_frequency = (exponents * -math.log(base)).exp()
    if factors is not None:
        inverse_frequency = inverse_frequency / factors.to(positions.device).cast(em.float32)
    angles = positions.cast(em.float32).reshape(-1, 1, 1) * inverse_frequency
    return angles.cos().contiguous(), angles.sin().contiguous()


def rotate(x: Tensor, cos: Tensor, sin: Tensor, pairs_adjacent: bool = False) -> Tensor:
    """Rotary position embedding of x (tokens, heads, head_dim) given `rotation`'s cos and sin: dimension i turns
    with i + head_dim/2 (rotate-half form), or with pairs_adjacent 2i with 2i+1 (llama.cpp's Llama, whose GGUF
    files hold the q and k rows in that order)."""
    if pairs_adjacent:
        tokens, heads, dim = x.shape
        pairs = x.reshape(tokens, heads, dim // 2, 2)
        first, second = pairs[..., 0], pairs[..., 1]
        return em.stack([first * cos - second * sin, second * cos + first * sin], dim=-1).reshape(tokens, heads, dim)
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return em.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


@dataclass
class StepInputs:
    """What every layer of one forward shares, built once per forward: the positions (tokens,), the rotations per
    RoPE base, which slots each token sees for sliding (True) and global (False) layers, and in a decode step the
    slot being written (1, length, 1). A prompt's pass attends over its own tokens; a decode step over the cache's
    slots [first[sliding], attended) (`visible[sliding]`, of shape (1, attended - first[sliding])): global layers
    from slot 0, sliding-window layers from `window_start`."""

    positions: Tensor
    rotations: dict[float, tuple[Tensor, Tensor]]
    visible: dict[bool, Tensor]
    here: Tensor | None
    length: int
    attended: int
    first: dict[bool, int]
    # where a decode step's slot is in the slots it writes through views of the caches, `write_window(attended)`
    # (`KVCache.windows`: the bucket's last granule): (end - start, 1, 1)
    window_here: Tensor | None = None

    @classmethod
    def build(cls, config: DecoderConfig, positions: Tensor, length: int, prefill: bool,
              factors: Tensor | None = None, attended: int | None = None) -> StepInputs:
        """With prefill, positions are a prompt's (0..tokens-1); else one step's, which attends over `attended`
        slots of the cache: `attended_slots` of its position, or when None all `length` (every layer from slot 0)."""
        tokens = positions.shape[0]
        window = config.sliding_window
        first = {False: 0, True: 0}
        if prefill or attended is None:
            attended = tokens if prefill else length
        elif not 0 < attended <= length or (attended % ATTENDED_GRANULE and attended != length):
            raise ValueError(f"StepInputs.build: a step attends over a multiple of {ATTENDED_GRANULE} slots or all "
                             f"{length} (attended_slots), got {attended}")
        elif window is not None:
            first[True] = window_start(attended, window)
        query_positions = positions.reshape(tokens, 1)
        slots = em.arange(attended, device=positions.device)
        visible = slots <= query_positions
        if window is None:
            local = visible
        else:
            local_slots = em.arange(first[True], attended, device=positions.device) if first[True] else slots
            local = (local_slots <= query_positions) & (local_slots > query_positions - window)
        bases = {config.rope_global_base} if window is None else {config.rope_local_base, config.rope_global_base}
        rotations = {base: rotation(positions, config.head_dim, base, factors) for base in bases}
        if prefill:
            return cls(positions, rotations, {False: visible, True: local}, None, length, attended, first)
        here = (em.arange(length, device=positions.device) == positions).reshape(length, 1, 1)
        start, end = write_window(attended)
        window_here = (em.arange(start, end, device=positions.device) == positions).reshape(-1, 1, 1)
        return cls(positions, rotations, {False: visible, True: local}, here, length, attended, first,
                   window_here)


class DecoderBlock(nn.Module):
    """One decoder layer: normed attention over the cache, a normed gated MLP, each added to the residual stream.
    The parts a file lacks are absent: q/k/v biases, q/k norms, the norms after attention and after the MLP."""

    def __init__(self, config: DecoderConfig, weights: dict[str, Any], layer: int) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.config, self.layer = config, layer
        self.sliding = config.is_sliding(layer)
        self.base = config.rope_local_base if self.sliding else config.rope_global_base
        self.attn_norm = RMSNorm(weights["attn_norm.weight"], eps)
        self.query, self.key, self.value = (QuantizedLinear(weights[f"{name}.weight"])
                                            for name in ("attn_q", "attn_k", "attn_v"))
        for name in ("attn_q", "attn_k", "attn_v"):  # Qwen2's biases
            self.register_buffer(f"{name}_bias", weights.get(f"{name}.bias"))
        self.query_norm = RMSNorm(weights["attn_q_norm.weight"], eps) if "attn_q_norm.weight" in weights else None
        self.key_norm = RMSNorm(weights["attn_k_norm.weight"], eps) if "attn_k_norm.weight" in weights else None
        self.output = QuantizedLinear(weights["attn_output.weight"])
        self.post_attention_norm = (RMSNorm(weights["post_attention_norm.weight"], eps)
                                    if "post_attention_norm.weight" in weights else None)
        self.ffn_norm = RMSNorm(weights["ffn_norm.weight"], eps)
        self.gate, self.up, self.down = (QuantizedLinear(weights[f"{name}.weight"])
                                         for name in ("ffn_gate", "ffn_up", "ffn_down"))
        self.post_ffn_norm = (RMSNorm(weights["post_ffw_norm.weight"], eps)
                              if "post_ffw_norm.weight" in weights else None)

    def _projection(self, name: str, normed: Tensor, heads: int) -> Tensor:
        """q, k or v (tokens, heads, head_dim) of the normed stream, with its bias when the file has one."""
        projected = getattr(self, {"attn_q": "query", "attn_k": "key", "attn_v": "value"}[name])(normed)
        bias = self._buffers.get(f"{name}_bias")
        if bias is not None:
            projected = projected + bias.cast(projected.dtype)
        return projected.reshape(normed.shape[0], heads, self.config.head_dim)

    def _write_window(self, window: tuple[Tensor, Tensor], here: Tensor | None, key: Tensor, value: Tensor,
                      keys: Tensor, values: Tensor, query: Tensor) -> bool:
        """Write the step's key and value through the caches' window views (`KVCache.windows`), with the query:
        whether both went into the caches' memory (else the caller writes through the whole caches)."""
        assert here is not None
        key_window, value_window = window
        key_window.assign(em.where(here, key, key_window))
        value_window.assign(em.where(here, value, value_window))
        realize(query, key_window, value_window)
        return region_written(keys, key_window) & region_written(values, value_window)

    def forward(self, hidden: Tensor, inputs: StepInputs, keys: Tensor | None, values: Tensor | None,
                window: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """hidden (tokens, hidden_size) of the tokens at `inputs.positions`. With a cache (keys/values of shape
        (length, kv_heads, head_dim)), one token is written in place at its position (through `window`, the
        caches' views of the step's window `write_window(inputs.attended)` from KVCache.windows, where there is
        one: a kernel over its slots, not over the cache's length) and attends to the slots up to it, reading only
        the cache's slots [inputs.first[sliding], inputs.attended) (views of the cache: no copy: the slots after the
        filled ones' bucket, and before a sliding layer's window, are never read); without one (a prompt from
        position 0), the tokens attend causally to each other and become the first slots of a new cache. Returns
        the new hidden states and the caches. The residual stream and the inputs of
        the matrix products are stored (`contiguous`): recomputed instead, the stream's chain of norms and sums
        would be repeated for every weight element of the products that read it."""
        config = self.config
        tokens = hidden.shape[0]
        normed = self.attn_norm(hidden).contiguous()
        query = self._projection("attn_q", normed, config.heads)
        key = self._projection("attn_k", normed, config.kv_heads)
        value = self._projection("attn_v", normed, config.kv_heads)
        if self.query_norm is not None and self.key_norm is not None:
            query, key = self.query_norm(query), self.key_norm(key)
        cos, sin = inputs.rotations[self.base]
        adjacent = config.rope_pairs_adjacent
        query, key = rotate(query, cos, sin, adjacent).contiguous(), rotate(key, cos, sin, adjacent)
        key, value = key.contiguous(), value.contiguous()  # (tokens, kv_heads, dim), as the caches lay slots out
        if keys is None or values is None or inputs.here is None:
            attended_keys, attended_values = key, value
            keys = F.pad(key, (0, 0, 0, 0, 0, inputs.length - tokens))
            values = F.pad(value, (0, 0, 0, 0, 0, inputs.length - tokens))
        else:
            # the new slot written in place: `where` reads the old slots only at its own index, so its kernel
            # computes into the cache's memory (nothing is allocated or copied), over the window's slots where the
            # cache gives views of them, else over every slot of the cache
            if window is None or not self._write_window(window, inputs.window_here, key, value, keys, values, query):
                keys.assign(em.where(inputs.here, key, keys))
                values.assign(em.where(inputs.here, value, values))
                # written before the attention reads them: fused into its products instead, the select would be
                # recomputed for every element they read and keep them from running on vectors
                realize(query, keys, values)
            attended_keys, attended_values = keys, values
            first = inputs.first[self.sliding]
            if first > 0 or inputs.attended < inputs.length:
                attended_keys = attended_keys[first:inputs.attended]
                attended_values = attended_values[first:inputs.attended]
        attended_keys, attended_values = attended_keys.permute(1, 0, 2), attended_values.permute(1, 0, 2)
        visible = inputs.visible[self.sliding]
        group = config.heads // config.kv_heads
        grouped_query = query.reshape(tokens, config.kv_heads, group, config.head_dim).permute(1, 2, 0, 3)
        scores = grouped_query @ attended_keys.unsqueeze(1).transpose(2, 3)  # (kv_heads, group, tokens, slots)
        scores = scores * config.query_pre_attn_scalar**-0.5
        if config.attn_logit_softcapping is not None:
            cap = config.attn_logit_softcapping
            scores = (scores / cap).tanh() * cap
        scores = em.where(visible.reshape(1, 1, tokens, -1), scores, -math.inf)
        # the probabilities are stored: fused into the product, each exp would be computed once per value element
        probabilities = scores.softmax(-1).contiguous()
        attended = probabilities @ attended_values.unsqueeze(1)  # (kv_heads, group, tokens, head_dim)
        attended = attended.permute(2, 0, 1, 3).reshape(tokens, config.heads * config.head_dim)
        attention = self.output(attended)
        if self.post_attention_norm is not None:
            attention = self.post_attention_norm(attention)
        hidden = (hidden + attention).contiguous()
        normed = self.ffn_norm(hidden).contiguous()
        gate = self.gate(normed)
        gate = gate.gelu(approximate="tanh") if config.gate_activation == "gelu_tanh" else F.silu(gate)
        mlp = self.down((gate * self.up(normed)).contiguous())
        if self.post_ffn_norm is not None:
            mlp = self.post_ffn_norm(mlp)
        return (hidden + mlp).contiguous(), keys, values


class KVCache:
    """Keys and values of every layer, (length, kv_heads, head_dim) tensors on the device (a slot's heads side by
    side, so a run of slots is one run of memory), written at each step. A new cache is empty; `Decoder.prefill`
    fills it from a prompt."""

    def __init__(self, config: DecoderConfig, length: int, device: str) -> None:
        self.length, self.device = length, device
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self._windows: dict[tuple[int, int], list[tuple[Tensor, Tensor]] | None] = {}

    def windows(self, start: int, end: int) -> list[tuple[Tensor, Tensor]] | None:
        """Per layer, views of its keys and values at slots [start, end) (`region_view`: their memory, no copy),
        made once and kept for every step writing there (a bucket's steps: `write_window`), so that a step
        writes its slot by a kernel over the window, not over the cache's length (at 2,048 slots that select read
        and wrote 4 MB a layer per step and halved Gemma-3-270M's decode). None where the device makes no views
        (or not at that offset): the steps then select over the whole cache."""
        if (start, end) not in self._windows:
            unrealized = [tensor for tensor in (*self.keys, *self.values) if not tensor.node.realized]
            if unrealized:
                realize(*unrealized)
            views: list[tuple[Tensor, Tensor]] | None = []
            for keys, values in zip(self.keys, self.values):
                shape = (end - start, *keys.shape[1:])
                key_view = region_view(keys, start * keys.shape[1] * keys.shape[2], shape)
                value_view = region_view(values, start * values.shape[1] * values.shape[2], shape)
                if key_view is None or value_view is None or views is None:
                    views = None
                    continue
                views.append((key_view, value_view))
            self._windows[start, end] = views
        return self._windows[start, end]


class Decoder(nn.Module):
    """A decoder-only language model (Llama, Qwen2, Qwen3, Gemma-3) for causal language modelling, with its weights
    kept as the GGUF file's quantized blocks (the default) or as float32 (`from_gguf`'s float32_weights)."""

    def __init__(self, config: DecoderConfig, weights: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        self.embedding = QuantizedEmbedding(weights["token_embd.weight"])
        self.blocks = nn.ModuleList([
            DecoderBlock(config, {name.split(".", 2)[2]: _plain_vector(tensor) for name, tensor in weights.items()
                                  if name.startswith(f"blk.{layer}.")}, layer)
            for layer in range(config.layers)
        ])
        self.norm = RMSNorm(weights["output_norm.weight"], config.rms_norm_eps)
        # a separate output projection, or (None) the embedding table read as one (tied, as Gemma's)
        self.output = QuantizedLinear(weights["output.weight"]) if "output.weight" in weights else None
        self.register_buffer("rope_factors", _plain_vector(weights["rope_freqs.weight"])
                             if "rope_freqs.weight" in weights else None)
        self.float32_weights = False
        # em.jit(self._decode) by cache length, attended slots (`attended_slots`) and device
        self._jitted_steps: dict[tuple[int, int, str], Any] = {}
        # per device, the buffers a jitted step reads its token's embedding and position from (`step`)
        self._staged_inputs: dict[str, tuple[Tensor, Tensor]] = {}
        # per shape, dtype and device of logits, their argmax jitted (`greedy_token`)
        self._jitted_argmax: dict[tuple[tuple[int, ...], Any, str], Any] = {}

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str], float32_weights: bool = False) -> Decoder:
        """A model over a GGUF file's memory-mapped tensors: nothing is read or allocated before the first step.
        By default the weights stay the file's quantized blocks (about the file's size in memory, mapped in place
        on a host device; each product unpacks its blocks inside its kernel, `QuantizedTensor.matmul`). With
        float32_weights the weight matrices are dequantized once on the device (`on_device`): ~1.1 GB for
        Gemma-3-270M instead of ~0.25, each step reading plain floats; the tokens agree (the products differ
        only in rounding). The architecture is the file's (`DecoderConfig.from_gguf` names the ones ember reads)."""
        header = read_gguf_header(path, skip_keys=("tokenizer.",))  # the vocabulary is the tokenizer's business
        config = DecoderConfig.from_gguf(header)
        cls._check_architecture(header, config)
        model = cls(config, {name: load_gguf_tensor(header, name) for name in header.tensors}).eval()
        model.float32_weights = float32_weights
        return model

    def on_device(self, device: str) -> None:
        """Move the weights to `device` once (the embedding table's rows are still mapped from the file), and
        dequantize them there once when the model keeps float32 weights, or decode the blocks' scales once when
        it keeps the blocks. A device whose memory is the host's uses the file's pages where they lie
        (`mapped_in_place`): the weights are read from the file as kernels first touch them, never copied."""
        for module in self.modules():
            for name, buffer in list(module._buffers.items()):
                if buffer is not None and buffer.device != device and buffer.device.startswith("disk"):
                    placed = mapped_in_place(buffer, device)
                    if placed is not None:
                        module._buffers[name] = placed
        if any(buffer.device != device for buffer in self.buffers()):
            self.to(device)
        for module in self.modules():
            if isinstance(module, QuantizedLinear):
                if self.float32_weights:
                    module.store_float32()
                elif module.format is not None and module.scales is None:
                    module.decode_scales()

    @classmethod
    def _check_architecture(cls, header: GGUFHeader, config: DecoderConfig) -> None:
        """Any architecture of ARCHITECTURES; a subclass for one of them narrows this."""

    def _logits(self, hidden: Tensor) -> Tensor:
        projection = self.output if self.output is not None else self.embedding.linear
        logits = projection(self.norm(hidden).contiguous()).reshape(self.config.vocab_size)
        if self.config.final_logit_softcapping is not None:
            cap = self.config.final_logit_softcapping
            logits = (logits / cap).tanh() * cap
        return logits

    def _embed(self, tokens: Sequence[int], device: str) -> Tensor:
        return self._scaled(self.embedding(tokens).to(device))

    def _scaled(self, embedded: Tensor) -> Tensor:
        """Embeddings times the architecture's embedding scale (Gemma's sqrt(hidden_size)), stored."""
        scale = self.config.embedding_scale
        return (embedded if scale is None else embedded * scale).contiguous()

    def _inputs(self, positions: Tensor, length: int, prefill: bool, attended: int | None = None) -> StepInputs:
        return StepInputs.build(self.config, positions, length, prefill, self.rope_factors, attended)

    def prefill(self, tokens: Sequence[int], last: Tensor, cache: KVCache) -> Tensor:
        """Run a prompt (positions 0.., padded by the caller to a size whose kernels are reused) in one pass: fills the
        empty cache and returns the logits (vocab_size,) after the token at index `last` (a 1-element device tensor,
        so prompts of every length up to len(tokens) share the kernels). Causal masking keeps the padding unseen;
        its slots in the cache lie after the prompt and are masked until the steps overwrite them."""
        if cache.keys:
            raise ValueError(f"{type(self).__name__}.prefill: the cache is not empty (prefill starts a sequence at "
                             f"position 0)")
        if len(tokens) > cache.length:
            raise ValueError(f"{type(self).__name__}.prefill: {len(tokens)} tokens do not fit a cache of length "
                             f"{cache.length}")
        hidden = self._embed(tokens, cache.device)
        positions = em.arange(len(tokens), device=cache.device)
        inputs = self._inputs(positions, cache.length, prefill=True)
        for block in self.blocks:
            hidden, keys, values = block(hidden, inputs, None, None)
            cache.keys.append(keys)
            cache.values.append(values)
        chosen = (positions == last).reshape(len(tokens), 1)
        return self._logits(em.where(chosen, hidden, 0.0).sum(0, keepdim=True))

    def step(self, token: int, position: int, cache: KVCache, jit: bool = False) -> Tensor:
        """The logits (vocab_size,) after the token at `position`; writes the token's keys and values into the
        (prefilled) cache in place and attends over the cache's first `attended_slots(position, cache.length)`
        slots (the filled ones rounded up to ATTENDED_GRANULE), so the step's kernels are those of its bucket.

        With jit the step runs under `ember.jit`, one capture per cache length, attended slots and device kept by
        the model: its first two calls run eagerly, later ones replay the recorded kernels (no graph is built); the
        logits then live in the capture's buffers and are overwritten by the next step."""
        if len(cache.keys) != self.config.layers:
            raise ValueError(f"{type(self).__name__}.step: the cache is empty; start with prefill")
        if not isinstance(position, int) or not 0 <= position < cache.length:
            raise ValueError(f"{type(self).__name__}.step: position must be an int in [0, {cache.length}) (the "
                             f"cache's slots), got {position!r}")
        attended = attended_slots(position, cache.length)
        if not jit:
            hidden = self._embed([token], cache.device)
            position_tensor = em.tensor([position], dtype=em.int64, device=cache.device)
            return self._decode(hidden, position_tensor, cache.keys, cache.values, attended,
                                cache.windows(*write_window(attended)))
        staged = self._staged_inputs.get(cache.device)
        source = self.embedding.rows_source
        if staged is None:
            # the token's row of a mapped quantized table as its bytes (unpacked inside the replay), else its floats
            row = (em.zeros(1, source.row_bytes, dtype=em.uint8, device=cache.device) if source is not None else
                   em.zeros(1, self.config.hidden_size, device=cache.device))
            staged = (row.contiguous().realize(), em.zeros(1, dtype=em.int64, device=cache.device).contiguous().realize())
            self._staged_inputs[cache.device] = staged
        # outside the replay, into the buffers every replay reads: with the caches, the same inputs at each step, so
        # the replay runs every launch bound (ember.jit)
        staged_row, staged_position = staged
        if source is not None:
            RUNTIME.write(staged_row.node, self.embedding.row_bytes(token))
        else:
            realize(staged_row.assign(self._embed([token], cache.device)))
        RUNTIME.write(staged_position.node, np.array([position], dtype=np.int64))
        decode = self._jitted_steps.get((cache.length, attended, cache.device))
        if decode is None:
            decode = em.jit(_DecodeStep(self, unpack_row=source is not None), recapture=False)
            self._jitted_steps[cache.length, attended, cache.device] = decode
        return decode(staged_row, staged_position, cache.keys, cache.values, attended,
                      cache.windows(*write_window(attended)))

    def greedy_token(self, logits: Tensor) -> int:
        """The argmax of logits (vocab_size,) (the greedy choice), jitted: its replays (a step's logits are in the
        same buffer at every step: one joined call on c) instead of building and scheduling the argmax's graph for
        each token (~0.4 ms of Python a token). The model holds one capture per shape, dtype and device of logits."""
        key = (tuple(logits.shape), logits.dtype, logits.device)
        jitted = self._jitted_argmax.get(key)
        if jitted is None:
            jitted = self._jitted_argmax[key] = em.jit(_argmax, recapture=False)
        return int(jitted(logits).item())

    def _embed_row(self, row: Tensor) -> Tensor:
        """The embedding (1, hidden_size) of a token from its row's bytes in the quantized table (1, row_bytes)."""
        source = self.embedding.rows_source
        assert source is not None
        return self._scaled(QuantizedTensor(row, source.quant_format, (1, source.row_elements)).dequantize())

    def _decode(self, hidden: Tensor, position: Tensor, keys: list[Tensor], values: list[Tensor],
                attended: int, windows: list[tuple[Tensor, Tensor]] | None = None) -> Tensor:
        """One decode step from the token's embedding (1, hidden_size), attending over the caches' first `attended`
        slots; the caches are changed in place (through `windows`, per layer views of the step's window
        `write_window(attended)` of the keys and values, where given)."""
        inputs = self._inputs(position, keys[0].shape[0], prefill=False, attended=attended)
        for layer, (block, layer_keys, layer_values) in enumerate(zip(self.blocks, keys, values)):
            window = None if windows is None else windows[layer]
            hidden, _, _ = block(hidden, inputs, layer_keys, layer_values, window)
        return self._logits(hidden)


class _DecodeStep:
    """`Decoder._decode` of a model held weakly, what the model's jitted steps run: with the bound method, model,
    steps and captures formed a cycle, so a dropped model's captures (and the jit memory they share with every
    other capture) lived until the next garbage collection."""

    __name__ = "Decoder._decode"

    def __init__(self, model: Decoder, unpack_row: bool = False) -> None:
        self.model, self.unpack_row = weakref.ref(model), unpack_row

    def __call__(self, embedded: Tensor, *args: Any) -> Tensor:
        """With unpack_row, `embedded` is the token's row of bytes in the quantized table (`Decoder._embed_row`)."""
        model = self.model()
        assert model is not None, "a decode step of a model that is gone"
        return model._decode(model._embed_row(embedded) if self.unpack_row else embedded, *args)


def _argmax(logits: Tensor) -> Tensor:
    return logits.argmax()


def _plain_vector(tensor: Any) -> Any:
    """A GGUF tensor as the layers take it: a 1-d one (a norm's weight, a bias, RoPE factors) as plain floats."""
    if isinstance(tensor, QuantizedTensor) and len(tensor.shape) == 1:
        return tensor.dequantize()
    return tensor
