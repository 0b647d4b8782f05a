"""MultiheadAttention with torch's parameters (in_proj_weight, out_proj, bias_k/v), masks and need_weights."""

from __future__ import annotations

import math
from typing import Any

import ember as em
from ember.core.errors import DTypeError, ShapeError
from ember.core.tensor import Tensor
from ember.nn import functional as F
from ember.nn import init
from ember.nn.linear import Linear, empty_parameter
from ember.nn.module import Module
from ember.nn.parameter import Parameter


class NonDynamicallyQuantizableLinear(Linear):
    """torch's name for MultiheadAttention.out_proj (a plain Linear); kept so reprs and state dicts match."""


def _float_mask(mask: Tensor | None, name: str, dtype: Any) -> Tensor | None:
    """A bool mask (True = not allowed) as an additive float mask with -inf; float masks are used as they are."""
    if mask is None:
        return None
    if mask.dtype.is_bool:
        return em.where(mask, float("-inf"), 0.0).cast(dtype)
    if not mask.dtype.is_float:
        raise DTypeError(
            f"MultiheadAttention: only bool and floating types of {name} are supported, got {mask.dtype.name}"
        )
    return mask.cast(dtype)


class MultiheadAttention(Module):
    """Attention over num_heads heads: softmax(q k^T / sqrt(head_dim) + mask) v, projected in and out."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got {embed_dim} and {num_heads}")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.head_dim = embed_dim // num_heads
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = empty_parameter((embed_dim, embed_dim), device, dtype)
            self.k_proj_weight = empty_parameter((embed_dim, self.kdim), device, dtype)
            self.v_proj_weight = empty_parameter((embed_dim, self.vdim), device, dtype)
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = empty_parameter((3 * embed_dim, embed_dim), device, dtype)
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = empty_parameter((3 * embed_dim,), device, dtype)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype)
        if add_bias_kv:
            self.bias_k: Parameter | None = empty_parameter((1, 1, embed_dim), device, dtype)
            self.bias_v: Parameter | None = empty_parameter((1, 1, embed_dim), device, dtype)
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            init.xavier_normal_(self.bias_v)

    def _projection_weights(self) -> tuple[Tensor, Tensor, Tensor]:
        if self._qkv_same_embed_dim:
            size = self.embed_dim
            weight = self.in_proj_weight
            return weight[:size], weight[size : 2 * size], weight[2 * size :]
        return self.q_proj_weight, self.k_proj_weight, self.v_proj_weight

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Inputs (L, N, E) (or (N, L, E) with batch_first, or unbatched (L, E)); returns (output, weights).

        weights are (N, L, S) averaged over heads, or (N, num_heads, L, S) with average_attn_weights=False,
        or None with need_weights=False. Bool masks mark positions that may NOT be attended; float masks are added.
        """
        if is_causal and attn_mask is None:
            raise ValueError(
                "MultiheadAttention: is_causal is a hint that attn_mask is the causal mask; pass attn_mask "
                "too (e.g. nn.Transformer.generate_square_subsequent_mask(L))"
            )
        batched = query.ndim == 3
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ShapeError(
                f"MultiheadAttention: query, key and value must all be 3-d (batched) or 2-d (unbatched), "
                f"got shapes {query.shape}, {key.shape}, {value.shape}"
            )
        if not batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        output, weights = self._attend(
            query, key, value, key_padding_mask, need_weights, attn_mask, average_attn_weights
        )
        if not batched:
            return output.squeeze(1), (weights.squeeze(0) if weights is not None else None)
        if self.batch_first:
            output = output.transpose(0, 1)
        return output, weights

    def _attend(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None,
        need_weights: bool,
        attn_mask: Tensor | None,
        average_attn_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """The sequence-first computation: query (L, N, E), key (S, N, kdim), value (S, N, vdim)."""
        target_length, batch, embed_dim = query.shape
        heads, head_dim = self.num_heads, self.head_dim
        if embed_dim != self.embed_dim:
            raise ShapeError(f"MultiheadAttention: query of shape {query.shape} should have embed_dim {self.embed_dim}")
        if key.shape[:2] != value.shape[:2] or key.shape[1] != batch:
            raise ShapeError(
                f"MultiheadAttention: key {key.shape} and value {value.shape} must have the same sequence "
                f"length and batch size as each other, and the batch size of query {query.shape}"
            )
        if key.shape[2] != self.kdim or value.shape[2] != self.vdim:
            raise ShapeError(
                f"MultiheadAttention: key and value must have {self.kdim} and {self.vdim} features, got "
                f"shapes {key.shape} and {value.shape}"
            )
        weight_q, weight_k, weight_v = self._projection_weights()
        bias_q = bias_k = bias_v = None
        if self.in_proj_bias is not None:
            bias_q, bias_k, bias_v = self.in_proj_bias.chunk(3)
        q = F.linear(query, weight_q, bias_q)
        k = F.linear(key, weight_k, bias_k)
        v = F.linear(value, weight_v, bias_v)

        attn_mask = _float_mask(attn_mask, "attn_mask", q.dtype)
        key_padding_mask = _float_mask(key_padding_mask, "key_padding_mask", q.dtype)
        if attn_mask is not None:
            if attn_mask.ndim == 2:
                if attn_mask.shape != (target_length, key.shape[0]):
                    raise ShapeError(
                        f"MultiheadAttention: the 2-d attn_mask should be ({target_length}, {key.shape[0]}), "
                        f"got {attn_mask.shape}"
                    )
                attn_mask = attn_mask.unsqueeze(0)
            elif attn_mask.ndim == 3:
                if attn_mask.shape != (batch * heads, target_length, key.shape[0]):
                    raise ShapeError(
                        f"MultiheadAttention: the 3-d attn_mask should be "
                        f"({batch * heads}, {target_length}, {key.shape[0]}), got {attn_mask.shape}"
                    )
            else:
                raise ShapeError(f"MultiheadAttention: attn_mask must be 2-d or 3-d, got shape {attn_mask.shape}")
        if self.bias_k is not None and self.bias_v is not None:  # set together (add_bias_kv), as in torch
            k = em.cat([k, self.bias_k.expand(1, batch, embed_dim)])
            v = em.cat([v, self.bias_v.expand(1, batch, embed_dim)])
            attn_mask = F.pad(attn_mask, (0, 1)) if attn_mask is not None else None
            key_padding_mask = F.pad(key_padding_mask, (0, 1)) if key_padding_mask is not None else None

        # (L, N, E) -> (N * heads, L, head_dim)
        q = q.reshape(target_length, batch * heads, head_dim).transpose(0, 1)
        k = k.reshape(k.shape[0], batch * heads, head_dim).transpose(0, 1)
        v = v.reshape(v.shape[0], batch * heads, head_dim).transpose(0, 1)
        if self.add_zero_attn:
            k = em.cat([k, em.zeros(batch * heads, 1, head_dim, dtype=k.dtype, device=k.device)], dim=1)
            v = em.cat([v, em.zeros(batch * heads, 1, head_dim, dtype=v.dtype, device=v.device)], dim=1)
            attn_mask = F.pad(attn_mask, (0, 1)) if attn_mask is not None else None
            key_padding_mask = F.pad(key_padding_mask, (0, 1)) if key_padding_mask is not None else None
        source_length = k.shape[1]
        if key_padding_mask is not None:
            if key_padding_mask.shape != (batch, source_length):
                raise ShapeError(
                    f"MultiheadAttention: key_padding_mask should be ({batch}, {source_length}), "
                    f"got {key_padding_mask.shape}"
                )
            padding = key_padding_mask.reshape(batch, 1, 1, source_length).expand(batch, heads, 1, source_length)
            padding = padding.reshape(batch * heads, 1, source_length)
            attn_mask = padding if attn_mask is None else attn_mask + padding

        scores = (q * math.sqrt(1.0 / head_dim)) @ k.transpose(-2, -1)
        if attn_mask is not None:
            scores = scores + attn_mask
        weights = scores.softmax(-1)
        if self.dropout > 0.0 and self.training:
            weights = F.dropout(weights, self.dropout, True)  # the returned weights are the dropped ones, as torch's
        output = (weights @ v).transpose(0, 1).reshape(target_length * batch, embed_dim)
        output = F.linear(output, self.out_proj.weight, self.out_proj.bias).reshape(target_length, batch, embed_dim)
        if not need_weights:
            return output, None
        weights = weights.reshape(batch, heads, target_length, source_length)
        if average_attn_weights:
            weights = weights.mean(1)
        return output, weights
