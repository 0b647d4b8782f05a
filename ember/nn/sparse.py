"""Embedding: a lookup table of learned vectors indexed by integer ids; EmbeddingBag: reductions of bags of them."""

from __future__ import annotations

from typing import Any

import ember as em
from ember.autograd.grad_mode import no_grad
from ember.core.errors import DTypeError, ShapeError
from ember.core.tensor import Tensor
from ember.nn import functional as F
from ember.nn import init
from ember.nn.linear import empty_parameter
from ember.nn.module import Module
from ember.nn.parameter import Parameter


class Embedding(Module):
    """weight[index] for integer indices; weight (num_embeddings, embedding_dim) starts normal(0, 1)."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight: Tensor | None = None,
        _freeze: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(
                    f"Embedding: padding_idx {padding_idx} must be within num_embeddings ({num_embeddings})"
                )
            padding_idx %= num_embeddings
        if sparse:
            raise ValueError(
                "Embedding: sparse=True needs sparse gradient tensors, which ember does not have; the "
                "default dense gradient gives the same values"
            )
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        if _weight is None:
            self.weight = empty_parameter((num_embeddings, embedding_dim), device, dtype)
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ShapeError(
                    f"Embedding: _weight of shape {_weight.shape} does not match ({num_embeddings}, {embedding_dim})"
                )
            self.weight = Parameter(_weight, requires_grad=not _freeze)

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        self._fill_padding_idx_with_zero()

    def _fill_padding_idx_with_zero(self) -> None:
        if self.padding_idx is not None:
            with no_grad():
                rows = em.arange(self.num_embeddings, device=self.weight.device).reshape(-1, 1)
                self.weight.assign(em.where(rows == self.padding_idx, 0.0, self.weight))

    @classmethod
    def from_pretrained(
        cls,
        embeddings: Tensor,
        freeze: bool = True,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
    ) -> Embedding:
        if embeddings.ndim != 2:
            raise ShapeError(f"Embedding.from_pretrained: embeddings must be 2-d, got shape {embeddings.shape}")
        rows, columns = embeddings.shape
        return cls(
            rows,
            columns,
            padding_idx,
            max_norm,
            norm_type,
            scale_grad_by_freq,
            sparse,
            _weight=embeddings,
            _freeze=freeze,
        )

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        if input.dtype.is_float or input.dtype.is_bool:
            raise DTypeError(f"Embedding: indices must be an integer tensor, got {input.dtype.name}")
        if self.max_norm is not None:
            self._renormalize(input)
        output = F.embedding(input, self.weight, self.padding_idx)
        if self.scale_grad_by_freq and output.requires_grad:
            # each looked-up row's gradient is divided by how often its index occurs in this batch
            flat = input.reshape(-1)
            frequency = (flat.reshape(-1, 1) == flat.reshape(1, -1)).sum(1).reshape(*input.shape, 1)
            output.register_hook(lambda gradient: gradient / frequency.cast(gradient.dtype))
        return output

    def _renormalize(self, input: Tensor) -> None:  # noqa: A002
        """torch's max_norm: rows looked up whose norm exceeds max_norm are scaled down to it, in place."""
        with no_grad():
            rows = em.arange(self.num_embeddings, device=input.device).reshape(-1, 1)
            used = (rows == input.reshape(1, -1)).any(1, keepdim=True)
            norms = self.weight.abs().pow(self.norm_type).sum(1, keepdim=True).pow(1.0 / self.norm_type)
            scale = self.max_norm / (norms + 1e-7)
            self.weight.assign(em.where(used & (norms > self.max_norm), self.weight * scale, self.weight))
            self.weight.realize()

    def extra_repr(self) -> str:
        text = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            text += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            text += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            text += f", norm_type={self.norm_type}"
        if self.scale_grad_by_freq:
            text += ", scale_grad_by_freq=True"
        if self.sparse:
            text += ", sparse=True"
        return text


class EmbeddingBag(Module):
    """Sums, means or maxima of bags of embeddings (F.embedding_bag); weight starts normal(0, 1) like Embedding's."""

    def __init__(self, num_embeddings: int, embedding_dim: int, max_norm: float | None = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                 _weight: Tensor | None = None, include_last_offset: bool = False, padding_idx: int | None = None,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"EmbeddingBag: padding_idx {padding_idx} must be within num_embeddings "
                                 f"({num_embeddings})")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.max_norm, self.norm_type, self.scale_grad_by_freq = max_norm, norm_type, scale_grad_by_freq
        self.mode, self.sparse, self.include_last_offset = mode, sparse, include_last_offset
        if _weight is None:
            self.weight = empty_parameter((num_embeddings, embedding_dim), device, dtype)
            init.normal_(self.weight)
            if padding_idx is not None:
                with no_grad():
                    self.weight[padding_idx] = 0
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ShapeError(f"EmbeddingBag: _weight of shape {_weight.shape} does not match "
                                 f"({num_embeddings}, {embedding_dim})")
            self.weight = Parameter(_weight)

    def forward(self, input: Tensor, offsets: Tensor | None = None,  # noqa: A002
                per_sample_weights: Tensor | None = None) -> Tensor:
        return F.embedding_bag(input, self.weight, offsets, self.max_norm, self.norm_type, self.scale_grad_by_freq,
                               self.mode, self.sparse, per_sample_weights, self.include_last_offset, self.padding_idx)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, mode='{self.mode}'" + (
            f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")
