"""nn-functional Tensor methods: softmax, normalization, dropout, embedding, linear and attention, from primitives."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from ember.context import CONTEXT
from ember.core import dtype as dtypes
from ember.core import runtime
from ember.core.advanced_indexing import SORTED_WRITE_PAIRS, picked_sum, take_last
from ember.core.checks import check_index
from ember.core.dtype import to_dtype
from ember.core.elementwise import where
from ember.core.errors import ArgumentError, DTypeError, ShapeError
from ember.core.graph_templates import TEMPLATES, traced_call
from ember.core.half_precision import HALF_TYPES, computed_in_float32, rounded, widened
from ember.core.linalg import check_same_dtype, product
from ember.core.ops import EXPANDED_OPS, FUSED_ATTENTION, REDUCE_OPS, Composite, Op
from ember.core.shapes import broadcast_shapes, normalize_dim
from ember.core.staged_reduce import reduce_axes
from ember.core.tensor_base import TensorBase
from ember.core.unary_math import exp_of_shifted

if TYPE_CHECKING:
    from ember.core.tensor import Tensor


def _require_float(tensor: Tensor, op: str, what: str = "input") -> None:
    if not tensor.dtype.is_float:
        raise DTypeError(f"{op}: expected a floating point {what}, got {tensor.dtype.name}; cast it with .float()")


def _normalized_shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, int) else tuple(int(size) for size in shape)


def _check_normalized_shape(tensor: Tensor, normalized: tuple[int, ...], op: str) -> None:
    if not normalized or tensor.shape[tensor.ndim - len(normalized):] != normalized or len(normalized) > tensor.ndim:
        expected = "[*, " + ", ".join(str(size) for size in normalized) + "]"
        raise ShapeError(
            f"{op}: given normalized_shape={list(normalized)}, expected input with shape {expected}, but got input of "
            f"shape {list(tensor.shape)}"
        )


def _check_affine(parameter: Tensor | None, normalized: tuple[int, ...], op: str, name: str) -> None:
    if parameter is not None and parameter.shape != normalized:
        raise ShapeError(
            f"{op}: expected {name} of shape {list(normalized)} (the normalized_shape), got {list(parameter.shape)}"
        )


class NormalizationSaved(NamedTuple):
    """What a normalization's backward rule reads: the reduced axes, the shape (of the input's rank) weight and bias
    broadcast as, their own shape, eps, the mean and 1 / sqrt(variance + eps) (kept dims), which of weight and bias
    are sources."""

    axes: tuple[int, ...]
    affine_shape: tuple[int, ...]
    parameter_shape: tuple[int, ...]
    eps: float
    mean: Tensor
    inverse_std: Tensor
    has_weight: bool
    has_bias: bool


def normalize_with_statistics(tensor: Tensor, axes: tuple[int, ...], affine_shape: tuple[int, ...],
                              weight: Tensor | None, bias: Tensor | None, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(tensor - mean) / sqrt(variance + eps) over axes, times weight plus bias (reshaped to affine_shape), with the
    mean and biased variance (kept dims, detached): the statistics in two passes as torch, the whole recorded as
    one step whose backward is torch's formula from the saved mean and 1 / std (autograd/rules.py). A float16 or
    bfloat16 tensor is normalized in float32 (with its weight and bias of its dtype), the results rounded once."""
    from ember.core.ops import Composite

    if tensor.dtype in HALF_TYPES:
        half = tensor.dtype
        return rounded(normalize_with_statistics(tensor.cast(dtypes.float32), axes, affine_shape,
                                                 widened(weight, half), widened(bias, half), eps), half)

    statistics = TEMPLATES.instantiate_many(("batch_statistics", axes, eps),
                                            lambda source: batch_statistics(source, axes, eps),
                                            (tensor._detached_copy(),))  # (a copy of its graph from the second call)
    mean, variance, inverse_std = cast("tuple[Tensor, Tensor, Tensor]", statistics)
    present = tuple(parameter for parameter in (weight, bias) if parameter is not None)
    parameter_shape = present[0].shape if present else ()
    saved = NormalizationSaved(axes, affine_shape, parameter_shape, eps, mean, inverse_std, weight is not None,
                               bias is not None)

    compute = functools.partial(_normalized, affine_shape=affine_shape, has_weight=weight is not None,
                                has_bias=bias is not None)
    if tensor.numel() == 0:  # nothing to differentiate (the rule divides by the count)
        return compute(tensor, *present, mean, inverse_std), mean, variance
    return tensor._recorded(Composite.NORMALIZE, compute, (tensor, *present), saved, (mean, inverse_std)), mean, \
        variance


def _normalized(x: Tensor, *rest: Tensor, affine_shape: tuple[int, ...], has_weight: bool, has_bias: bool) -> Tensor:
    """(x - mean) * inverse_std * weight + bias, with the weight and bias that are present (in that order), then the
    statistics: `rest` is (weight?, bias?, mean, inverse_std). A normalization's value (its graph is copied from a
    template: Tensor._recorded's held tensors)."""
    *parameters, mean, inverse_std = rest
    normalized = (x - mean) * inverse_std
    if has_weight:
        normalized = normalized * parameters[0]._reshaped(affine_shape)
    return normalized + parameters[-1]._reshaped(affine_shape) if has_bias else normalized


def batch_statistics(tensor: Tensor, axes: tuple[int, ...], eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(mean, biased variance, 1 / sqrt(variance + eps)) over axes, kept as size-1 dims, in two passes as torch:
    the mean first, then the mean of (x - mean)^2."""
    mean = _staged_mean(tensor, axes)
    centered = tensor - mean
    variance = _staged_mean(centered * centered, axes)
    return mean, variance, (variance + eps).rsqrt()


NORMALIZATION_STAGE_THRESHOLD = 256  # statistics over more elements are summed in stages (pairwise-like rounding)
NORMALIZATION_LATER_CHUNK = 64  # partials a later stage of the statistics sums (each stage is a kernel): chunks of
# 64 values, then of 64 partials (a batch norm over 64 x 8 x 8 in 2 kernels, not 3; 256 partials at once rounded the
# sum-loss batch norm's input gradient over 64 x 28 x 28 past 4x torch's error, test_numeric_parity.py)


def normalization_total(tensor: Tensor, axes: tuple[int, ...]) -> Tensor:
    """The sum over axes (kept) in the normalizations' stages (NORMALIZATION_STAGE_THRESHOLD and _LATER_CHUNK)."""
    if not axes:
        return tensor
    return reduce_axes(tensor, Op.SUM, axes, NORMALIZATION_STAGE_THRESHOLD, NORMALIZATION_LATER_CHUNK)


def _staged_mean(tensor: Tensor, axes: tuple[int, ...]) -> Tensor:
    """The mean over axes (kept), summed in stages past NORMALIZATION_STAGE_THRESHOLD elements: one sequential
    float32 sum over a group or an instance of a CNN (even 28x28 values) rounds several times worse than torch's."""
    count = math.prod(tensor.shape[axis] for axis in axes)
    total = normalization_total(tensor, axes)
    return total * (1.0 / count) if count else total * math.nan


def _layer_norm(x: Tensor, *parameters: Tensor, axes: tuple[int, ...], eps: float, has_weight: bool,
                has_bias: bool) -> Tensor:
    """layer_norm's value (biased variance), with the weight and bias that are present (in that order): the graph
    layer_norm is traced as."""
    centered = x - x.mean(axes, keepdim=True)
    variance = (centered * centered).mean(axes, keepdim=True)
    result = centered * (variance + eps).rsqrt()
    if has_weight:
        result = result * parameters[0]
    return result + parameters[-1] if has_bias else result


def _rms_norm(x: Tensor, *weight: Tensor, axes: tuple[int, ...], eps: float) -> Tensor:
    """rms_norm's value, times the weight where there is one: the graph rms_norm is traced as."""
    result = x * ((x * x).mean(axes, keepdim=True) + eps).rsqrt()
    return result * weight[0] if weight else result


def _linear(inputs: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """inputs @ weight^T + bias (shapes and dtypes checked by linear): the graph linear is traced as."""
    return product(inputs, weight._swapped_last() if weight.ndim == 2 else weight) + bias


def _softmax_source(tensor: Tensor, dtype: Any, op: str) -> Tensor:
    source = tensor.cast(to_dtype(dtype)) if dtype is not None else tensor
    _require_float(source, op)
    return source


def _softmax(source: Tensor, axis: int) -> Tensor:
    """exp(x - max) / sum over axis (recorded as one step: autograd/rules.py has its backward)."""
    exponentials = exp_of_shifted(source - source.amax(axis, keepdim=True))
    return exponentials / exponentials.sum(axis, keepdim=True)


def _log_softmax(source: Tensor, axis: int) -> Tensor:
    """(x - max) - log(sum(exp(x - max))) over axis (recorded as one step)."""
    shifted = source - source.amax(axis, keepdim=True)
    return shifted - exp_of_shifted(shifted).sum(axis, keepdim=True).log()


class FunctionalOps(TensorBase):
    """Mixin: the nn.functional operations, as methods (torch's method names where torch has them)."""

    __slots__ = ()

    # ---- softmax family ----------------------------------------------------------------------------------------

    def softmax(self, dim: int, dtype: Any = None) -> Tensor:
        """exp(x - max) / sum; over the last axis one kernel (the max and the sum fused by rows), else three."""
        source = _softmax_source(cast("Tensor", self), dtype, "softmax")
        axis = normalize_dim(dim, self.ndim, "softmax")
        if source.numel() == 0:
            return source
        return source._recorded(Composite.SOFTMAX, functools.partial(_softmax, axis=axis), (source,), axis)

    def log_softmax(self, dim: int, dtype: Any = None) -> Tensor:
        source = _softmax_source(cast("Tensor", self), dtype, "log_softmax")
        axis = normalize_dim(dim, self.ndim, "log_softmax")
        if source.numel() == 0:
            return source
        return source._recorded(Composite.LOG_SOFTMAX, functools.partial(_log_softmax, axis=axis), (source,), axis)

    def softmin(self, dim: int, dtype: Any = None) -> Tensor:
        return (-_softmax_source(cast("Tensor", self), dtype, "softmin")).softmax(dim)

    # ---- normalization ----------------------------------------------------------------------------------------

    @computed_in_float32
    def layer_norm(
        self,
        normalized_shape: int | Sequence[int],
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        eps: float = 1e-5,
    ) -> Tensor:
        """torch.nn.functional.layer_norm: normalize over the last dims (biased variance), then scale and shift."""
        _require_float(cast("Tensor", self), "layer_norm")
        normalized = _normalized_shape(normalized_shape)
        _check_normalized_shape(cast("Tensor", self), normalized, "layer_norm")
        _check_affine(weight, normalized, "layer_norm", "weight")
        _check_affine(bias, normalized, "layer_norm", "bias")
        axes = tuple(range(self.ndim - len(normalized), self.ndim))
        compute = functools.partial(_layer_norm, axes=axes, eps=eps, has_weight=weight is not None,
                                    has_bias=bias is not None)
        return traced_call(compute, tuple(value for value in (cast("Tensor", self), weight, bias) if value is not None))

    @computed_in_float32
    def rms_norm(
        self,
        normalized_shape: int | Sequence[int],
        weight: Tensor | None = None,
        eps: float | None = None,
    ) -> Tensor:
        """torch.nn.functional.rms_norm: x / sqrt(mean(x^2) + eps) over the last dims; eps defaults to finfo.eps."""
        _require_float(cast("Tensor", self), "rms_norm")
        normalized = _normalized_shape(normalized_shape)
        _check_normalized_shape(cast("Tensor", self), normalized, "rms_norm")
        _check_affine(weight, normalized, "rms_norm", "weight")
        if eps is None:
            eps = _machine_epsilon(cast("Tensor", self))
        axes = tuple(range(self.ndim - len(normalized), self.ndim))
        compute = functools.partial(_rms_norm, axes=axes, eps=eps)
        return traced_call(compute, (cast("Tensor", self),) if weight is None else (cast("Tensor", self), weight))

    def group_norm(
        self, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
    ) -> Tensor:
        """torch.nn.functional.group_norm: normalize each group of channels of [N, C, *] over its channels and space."""
        _require_float(cast("Tensor", self), "group_norm")
        if self.ndim < 2:
            raise ShapeError(f"group_norm: expected an input of shape [N, C, *], got {list(self.shape)}")
        channels = self.shape[1]
        if num_groups <= 0 or channels % num_groups != 0:
            raise ShapeError(
                f"group_norm: expected the number of channels ({channels}) of input of shape {list(self.shape)} to be "
                f"divisible by num_groups ({num_groups})"
            )
        for name, parameter in (("weight", weight), ("bias", bias)):
            if parameter is not None and parameter.shape != (channels,):
                raise ShapeError(f"group_norm: expected {name} of shape [{channels}], got {list(parameter.shape)}")
        batch, size = self.shape[0], channels // num_groups
        grouped = self.reshape(batch, num_groups, size, math.prod(self.shape[2:]))
        affine_shape = (1, num_groups, size, 1)  # weight and bias vary along the channels of a group
        return normalize_with_statistics(grouped, (2, 3), affine_shape, weight, bias, eps)[0].reshape(self.shape)

    def instance_norm(
        self, running_mean: Tensor | None = None, running_var: Tensor | None = None,
        weight: Tensor | None = None, bias: Tensor | None = None, use_input_stats: bool = True,
        momentum: float = 0.1, eps: float = 1e-5,
    ) -> Tensor:
        """torch.nn.functional.instance_norm: normalize each channel of each sample of [N, C, *] over its spatial
        dims; given running stats, update them in place with the batch's mean (or use them: use_input_stats=False)."""
        _require_float(cast("Tensor", self), "instance_norm")
        if self.ndim < 3:
            raise ShapeError(f"instance_norm: expected an input of shape [N, C, *] with at least one spatial dim, got "
                             f"{list(self.shape)}")
        channels = self.shape[1]
        for name, parameter in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                                ("running_var", running_var)):
            if parameter is not None and parameter.shape != (channels,):
                raise ShapeError(f"instance_norm: expected {name} of shape [{channels}], got {list(parameter.shape)}")
        spatial = tuple(range(2, self.ndim))
        affine_shape = (channels,) + (1,) * (self.ndim - 2)
        if use_input_stats:
            result, mean, variance = normalize_with_statistics(cast("Tensor", self), spatial,
                                                               (1, channels) + (1,) * len(spatial), weight, bias, eps)
            weight = bias = None  # applied already
            if running_mean is not None or running_var is not None:
                _update_instance_stats(cast("Tensor", self), mean, variance, running_mean, running_var, momentum)
        else:
            if running_mean is None or running_var is None:
                raise ArgumentError("instance_norm: expected running_mean and running_var when use_input_stats=False")
            result = (self - running_mean._reshaped(affine_shape)) * (running_var._reshaped(affine_shape) + eps).rsqrt()
        if weight is not None:
            result = result * weight._reshaped(affine_shape)
        return result + bias._reshaped(affine_shape) if bias is not None else result

    def glu(self, dim: int = -1) -> Tensor:
        """The first half of `dim` times the sigmoid of the second half (gated linear unit)."""
        if self.ndim == 0:
            raise ShapeError("glu does not support scalars because halving size must be even")
        size = self.shape[normalize_dim(dim, self.ndim, "glu")]
        if size % 2:
            raise ShapeError(f"glu: halving dimension must be even, but dimension {dim} of shape {self.shape} has "
                             f"size {size}")
        first, second = self.chunk(2, dim)
        return first * second.sigmoid()

    def batch_norm(
        self,
        running_mean: Tensor | None,
        running_var: Tensor | None,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        training: bool = False,
        momentum: float = 0.1,
        eps: float = 1e-5,
    ) -> Tensor:
        """torch.nn.functional.batch_norm over [N, C, *]; in training the running statistics are updated in place."""
        _require_float(cast("Tensor", self), "batch_norm")
        if self.ndim < 2:
            raise ShapeError(f"batch_norm: expected an input of shape [N, C, *], got {list(self.shape)}")
        channels = self.shape[1]
        for name, parameter in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                                ("bias", bias)):
            if parameter is not None and parameter.shape != (channels,):
                raise ShapeError(
                    f"batch_norm: expected {name} of shape [{channels}] for input of shape {list(self.shape)}, got "
                    f"{list(parameter.shape)}"
                )
        affine_shape = (channels,) + (1,) * (self.ndim - 2)
        if training:
            count = self.numel() // channels if channels else 0
            if count <= 1:
                raise ShapeError(
                    f"batch_norm: expected more than 1 value per channel when training, got input of shape "
                    f"{list(self.shape)}"
                )
            result, mean, variance = self._batch_norm_training(weight, bias, eps)
            if running_mean is not None:
                running_mean.assign((1 - momentum) * running_mean + momentum * mean)
            if running_var is not None:
                running_var.assign((1 - momentum) * running_var + momentum * variance * (count / (count - 1)))
            return result
        if running_mean is None or running_var is None:
            raise ArgumentError("batch_norm: running_mean and running_var are required when training=False")
        result = (self - running_mean._reshaped(affine_shape)) * (running_var._reshaped(affine_shape) + eps).rsqrt()
        if weight is not None:
            result = result * weight._reshaped(affine_shape)
        return result + bias._reshaped(affine_shape) if bias is not None else result

    def _batch_norm_training(self, weight: Tensor | None, bias: Tensor | None,
                             eps: float) -> tuple[Tensor, Tensor, Tensor]:
        """Batch normalization of [N, C, *] with the batch's statistics: (result, mean [C], biased variance [C]),
        the statistics detached (normalize_with_statistics)."""
        channels = self.shape[1]
        axes = (0,) + tuple(range(2, self.ndim))
        affine_shape = (1, channels) + (1,) * (self.ndim - 2)
        result, mean, variance = normalize_with_statistics(cast("Tensor", self), axes, affine_shape, weight, bias, eps)
        return result, mean._reshaped((channels,)), variance._reshaped((channels,))  # (internal: no views)

    def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
        """torch.nn.functional.normalize: x / max(||x||_p, eps) along dim."""
        _require_float(cast("Tensor", self), "normalize")
        axis = normalize_dim(dim, self.ndim, "normalize")
        if p == math.inf:
            norm = self.abs().amax(axis, keepdim=True)
        elif p == 1:
            norm = self.abs().sum(axis, keepdim=True)
        elif p == 2:
            norm = (self * self).sum(axis, keepdim=True).sqrt()
        else:
            norm = (self.abs() ** p).sum(axis, keepdim=True) ** (1.0 / p)
        return self / norm.clamp_min(eps)

    # ---- dropout ----------------------------------------------------------------------------------------------

    def dropout(self, p: float = 0.5, training: bool = True) -> Tensor:
        """Zero each element with probability p (drawn with ember.rand) and scale the rest by 1 / (1 - p): the input
        times a mask of 0 and 1 / (1 - p), as torch computes it (a dropped NaN or inf gives NaN there too)."""
        if not 0.0 <= p <= 1.0:
            raise ArgumentError(f"dropout probability has to be between 0 and 1, but got {p}")
        if not training or p == 0.0:
            return cast("Tensor", self)
        _require_float(cast("Tensor", self), "dropout")
        if p == 1.0:
            return self * self._full(self.shape, 0, self.dtype, self.device)
        from ember.core.creation import dropout_mask

        return self * dropout_mask(self.shape, self.dtype, p, self.device)

    def feature_dropout(self, p: float, training: bool, spatial: int, op: str = "feature_dropout") -> Tensor:
        """Channel dropout (dropout1d/2d/3d): one draw per channel of [N, C, *spatial] or [C, *spatial]."""
        if not 0.0 <= p <= 1.0:
            raise ArgumentError(f"dropout probability has to be between 0 and 1, but got {p}")
        if self.ndim not in (spatial + 1, spatial + 2):
            raise ShapeError(
                f"{op}: expected {spatial + 1}-d (unbatched) or {spatial + 2}-d (batched) input, got shape "
                f"{list(self.shape)}"
            )
        if not training or p == 0.0:
            return cast("Tensor", self)
        _require_float(cast("Tensor", self), op)
        if p == 1.0:
            return self * self._full(self.shape, 0, self.dtype, self.device)
        from ember.core.creation import dropout_mask

        channels = self.shape[: self.ndim - spatial] + (1,) * spatial
        return self * dropout_mask(channels, self.dtype, p, self.device)  # (a mask per channel, as torch's)

    def alpha_dropout(self, p: float = 0.5, training: bool = False, feature: bool = False) -> Tensor:
        """SELU's dropout: dropped elements (or channels, `feature`) become SELU's negative saturation, and an affine
        map keeps the mean and variance (torch.alpha_dropout / feature_alpha_dropout)."""
        if not 0.0 <= p <= 1.0:
            raise ArgumentError(f"dropout probability has to be between 0 and 1, but got {p}")
        if not training or p == 0.0:
            return cast("Tensor", self)
        _require_float(cast("Tensor", self), "alpha_dropout")
        if p == 1.0:
            return self * self._full(self.shape, 0, self.dtype, self.device)
        if feature and self.ndim < 2:
            raise ShapeError(f"feature_alpha_dropout: expected an input with at least 2 dims, got {list(self.shape)}")
        from ember.core.creation import rand

        alpha = 1.7580993408473766  # SELU's scale * alpha: -alpha is its limit at -inf
        scale = 1.0 / math.sqrt((alpha * alpha * p + 1) * (1 - p))
        noise_shape = self.shape[:2] + (1,) * (self.ndim - 2) if feature else self.shape
        keep = (rand(noise_shape, device=self.device) >= p).cast(self.dtype)
        return self * (keep * scale) + ((keep - 1) * (alpha * scale) + alpha * scale * p)

    # ---- embedding and linear ---------------------------------------------------------------------------------

    def embedding(self, weight: Tensor, padding_idx: int | None = None, max_norm: float | None = None,
                  norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
        """Rows of weight [V, D] picked by the integer indices in self: a one-hot select and sum (one kernel); an
        index outside [0, V) raises IndexOutOfRangeError."""
        if max_norm is not None or scale_grad_by_freq or sparse:
            raise NotImplementedError("embedding: max_norm, scale_grad_by_freq and sparse are not supported")
        if not self.dtype.is_int:
            raise DTypeError(f"embedding: expected integer indices (int64 or int32), got {self.dtype.name}")
        if weight.ndim != 2:
            raise ShapeError(f"embedding: weight must be 2-d [num_embeddings, embedding_dim], got {list(weight.shape)}")
        if weight.dtype.is_bool:  # (picked as uint8: a cast between the select and its sum would hide the pick)
            return self.embedding(weight.cast(dtypes.uint8), padding_idx) != 0
        count = weight.shape[0]
        if padding_idx is not None:
            if not -count <= padding_idx < count:
                raise ArgumentError(f"embedding: padding_idx {padding_idx} must be within num_embeddings ({count})")
            padding_idx %= count
            rows = self._arange_primitive(count, dtypes.int64, self.device)._reshaped((count, 1))
            weight = where(rows == padding_idx, weight._detached_copy(), weight)  # the padding row gets no gradient
        positions = self._arange_primitive(count, dtypes.int64, self.device)
        index = check_index(cast("Tensor", self), count, "embedding", 0, negatives=False)
        if weight._requires_grad and CONTEXT.get().grad_enabled and index.numel() * count >= SORTED_WRITE_PAIRS:
            # a gather of the columns (take_last records it), whose gradient sums rows by sorting the ids instead
            # of comparing every id with every row: O(N D V) for the picked sum's chain rule (2048 ids of 50,257 x
            # 256: 7 s a backward)
            flat = index._reshaped((index.numel(),))
            columns = take_last(weight.transpose(0, 1), flat)  # [D, N]
            return columns.transpose(0, 1)._reshaped(index.shape + (weight.shape[1],))
        matches = index._reshaped(index.shape + (1,)) == positions
        chosen = matches._reshaped(matches.shape + (1,))  # [..., V, 1]
        return picked_sum(where(chosen, weight, 0), -2)

    def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """torch.nn.functional.linear: self @ weight.T + bias (one kernel)."""
        if weight.ndim not in (1, 2):
            raise ShapeError(f"linear: weight must be 1-d or 2-d [out_features, in_features], got {list(weight.shape)}")
        if self.ndim == 0 or self.shape[-1] != weight.shape[-1]:
            raise ShapeError(
                f"linear: input of shape {list(self.shape)} and weight of shape {list(weight.shape)} cannot be "
                f"multiplied: the input's last dim must equal in_features ({weight.shape[-1]})"
            )
        if bias is None:
            return self.matmul(weight._swapped_last() if weight.ndim == 2 else weight)
        output_shape = self.shape[:-1] + weight.shape[:-1]
        if bias.shape != output_shape[len(output_shape) - bias.ndim:]:  # (the message is formatted only when needed)
            broadcast_shapes(output_shape, bias.shape, op=f"linear (output {output_shape} + bias {bias.shape})")
        if bias.dtype != self.dtype:  # (promoted by the add, as torch)
            return self.matmul(weight._swapped_last() if weight.ndim == 2 else weight) + bias
        check_same_dtype("linear", cast("Tensor", self), weight)
        return traced_call(_linear, (cast("Tensor", self), weight, bias))

    # ---- attention ----------------------------------------------------------------------------------------------

    def scaled_dot_product_attention(
        self,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Tensor:
        """softmax(self @ key^T * scale + mask) @ value; rows with every key masked give zeros (as torch)."""
        query = cast("Tensor", self)
        if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
            raise ShapeError(
                f"scaled_dot_product_attention: query, key and value need at least 2 dims [..., L, E], got "
                f"{list(query.shape)}, {list(key.shape)} and {list(value.shape)}"
            )
        if not query.dtype == key.dtype == value.dtype:
            raise DTypeError(
                f"scaled_dot_product_attention: expected query, key and value to have the same dtype, but got "
                f"{query.dtype.name}, {key.dtype.name} and {value.dtype.name}"
            )
        _require_float(query, "scaled_dot_product_attention", "query")
        if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
            raise ShapeError(
                f"scaled_dot_product_attention: query {list(query.shape)}, key {list(key.shape)} and value "
                f"{list(value.shape)} do not fit: need query [..., L, E], key [..., S, E], value [..., S, Ev]"
            )
        if enable_gqa and query.ndim >= 3 and key.shape[-3] != query.shape[-3]:
            heads, key_heads = query.shape[-3], key.shape[-3]
            if key_heads == 0 or heads % key_heads or heads % value.shape[-3]:
                raise ShapeError(
                    f"scaled_dot_product_attention: with enable_gqa the query heads ({heads}) must be a multiple of "
                    f"the key and value heads ({key_heads}, {value.shape[-3]})"
                )
            key = key.repeat_interleave(heads // key_heads, dim=-3)
            value = value.repeat_interleave(heads // value.shape[-3], dim=-3)
        if is_causal and attn_mask is not None:
            raise ArgumentError(
                "scaled_dot_product_attention: explicit attn_mask should not be set when is_causal=True"
            )
        length, source_length = query.shape[-2], key.shape[-2]
        scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
        if attn_mask is not None and not (attn_mask.dtype.is_bool or attn_mask.dtype.is_float):
            raise DTypeError(
                f"scaled_dot_product_attention: expected attn_mask dtype to be bool or float, got "
                f"{attn_mask.dtype.name}"
            )
        fused = _fused_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)
        if fused is not None:
            return fused
        scores = query.matmul(key.mT) * scale
        if is_causal:
            attn_mask = _causal_mask(query, length, source_length)
        if attn_mask is not None:
            try:
                broadcast_shapes(scores.shape, attn_mask.shape)
            except ShapeError:
                raise ShapeError(
                    f"scaled_dot_product_attention: attn_mask of shape {list(attn_mask.shape)} does not broadcast to "
                    f"the attention scores of shape {list(scores.shape)} [..., L, S]"
                ) from None
            if attn_mask.dtype.is_bool:
                scores = where(attn_mask, scores, -math.inf)
            else:  # (a float mask: its dtype was checked above)
                scores = scores + attn_mask.cast(scores.dtype)
        if source_length == 0:
            return scores.matmul(value)  # no keys: zeros, like torch
        mask = attn_mask if attn_mask is not None and attn_mask.dtype.is_bool else None

        def masked_softmax(scores: Tensor) -> Tensor:
            maximum = scores.amax(-1, keepdim=True)
            maximum = where(maximum == -math.inf, 0.0, maximum)  # a fully masked row: exp(-inf) = 0 everywhere
            exponentials = exp_of_shifted(scores - maximum)
            if mask is not None:
                exponentials = where(mask, exponentials, 0.0)  # exactly 0 where masked, not by exp's underflow
            total = exponentials.sum(-1, keepdim=True)
            return where(total == 0, 0.0, exponentials / total)

        def stored_softmax(scores: Tensor) -> Tensor:
            # the weights are stored (a kernel boundary) for the backward: its sum of grad * weights over each row
            # reads them, where recomputing them from the scores there costs an exp per element in a scalar loop
            # (the dropout's mask applied above them kept the broadcast rule from storing them: 5x the kernel's time)
            return masked_softmax(scores)._apply(Op.CONTIGUOUS)

        # one step for autograd with softmax's backward from the weights (a masked or empty row's are zeros)
        recorded = CONTEXT.get().grad_enabled and scores._requires_grad
        weights = scores._recorded(Composite.SOFTMAX, stored_softmax if recorded else masked_softmax, (scores,),
                                   scores.ndim - 1)
        if dropout_p > 0.0:
            weights = weights.dropout(dropout_p, training=True)
        if not is_causal:
            return weights.matmul(value)
        # weights @ value with the causal mask selecting each product: a later key's value contributes an exact 0
        # (0 * value would be NaN for an infinite value), so incremental recomputation (ember/incremental) can prove
        # an appended key leaves earlier rows unchanged. Only for the causal mask: propagation narrows by a mask made
        # of indices, never by one made of data, so another mask gains nothing from it. It costs speed: the select
        # keeps the product's kernel from vectorizing (a tile's lanes share one row's condition; vectorize.py does
        # not pack that yet).
        assert mask is not None
        products = weights.unsqueeze(-2) * value.mT.unsqueeze(-3)  # [..., L, Ev, S]
        products = where(mask.unsqueeze(-2) if mask.ndim else mask, products, 0.0)
        return products.sum(-1, dtype=query.dtype)


def _fused_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, dropout_p: float,
                     is_causal: bool, scale: float) -> Tensor | None:
    """Attention as one fused graph (ir/flash_attention.py's form: the kernelizer keeps its nested reduces in one
    kernel, lowered as a flash attention) where the runtime says the device has tiles for it; None for the
    composite: a graph recording gradients (the composite's backward reads the stored weights), dropout, or a device
    without local memory and warps (CPUs)."""
    inputs = [query, key, value] + ([mask] if mask is not None else [])
    if dropout_p > 0.0 or (CONTEXT.get().grad_enabled and any(tensor._requires_grad for tensor in inputs)):
        return None
    length, source_length, head, value_head = query.shape[-2], key.shape[-2], query.shape[-1], value.shape[-1]
    try:  # (shapes that do not fit: the composite raises the error that says how)
        batch = broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
        if mask is not None:
            batch = broadcast_shapes((*batch, length, source_length), mask.shape)[:-2]
    except ShapeError:
        return None
    batches = math.prod(batch)
    if batches == 0 or not runtime.RUNTIME.fused_attention(query.node, batches, length, source_length, head,
                                                           value_head):
        return None
    computed = dtypes.float32  # (half inputs: computed in float32, the output rounded once)
    query, key, value = (_stored_if_reduced(tensor).cast(computed).expand(*batch, *tensor.shape[-2:])
                         for tensor in (query, key, value))
    mask = None if mask is None else _stored_if_reduced(mask)
    if is_causal:
        mask = _causal_mask(query, length, source_length)
    rank = len(batch) + 2
    scores = (query.unsqueeze(-2) * key.unsqueeze(-3))._apply(Op.SUM, arg=(rank,)).reshape(
        *batch, length, source_length) * scale
    if mask is not None:
        scores = where(mask, scores, -math.inf) if mask.dtype.is_bool else scores + mask.cast(computed)
    maximum = scores._apply(Op.REDUCE_MAX, arg=(rank - 1,))
    maximum = where(maximum == -math.inf, 0.0, maximum)  # a fully masked row: exp(-inf) = 0 everywhere
    weights = exp_of_shifted(scores - maximum)
    if mask is not None and mask.dtype.is_bool:
        weights = where(mask, weights, 0.0)  # exactly 0 where masked
    total = weights._apply(Op.SUM, arg=(rank - 1,))
    products = weights.unsqueeze(-1) * value.unsqueeze(-3)  # [..., L, S, Ev]
    if is_causal:  # as the composite: each product selected by the mask, so a later key adds an exact 0 (not 0 *
        # value, NaN for an infinite value) and ember/incremental narrows an appended key to the rows that read it
        assert mask is not None
        products = where(mask.unsqueeze(-1), products, 0.0)
    numerator = products._apply(Op.SUM, arg=(rank - 1,)).reshape(*batch, length, value_head)
    output = where(total == 0, 0.0, numerator / total)._apply(Op.CONTIGUOUS, arg=FUSED_ATTENTION)
    return output if output.dtype == inputs[0].dtype else output.cast(inputs[0].dtype)


def _causal_mask(query: Tensor, length: int, source_length: int) -> Tensor:
    """torch's is_causal mask [length, source_length] (key j visible to query i where j <= i) on the query's device:
    row >= column as one comparison of float32 indices (exact below 2**24), column < row + 1, since kernels pack float
    comparisons into vectors, not integer ones."""
    index_dtype = dtypes.float32 if max(length, source_length) < 2**24 else dtypes.int64
    rows = query._arange_primitive(length, index_dtype, query.device).reshape(length, 1)
    columns = query._arange_primitive(source_length, index_dtype, query.device).reshape(1, source_length)
    return columns < rows + 1


def _stored_if_reduced(tensor: Tensor) -> Tensor:
    """The tensor, with the value under its views stored by a kernel of its own where its lazy graph holds a reduce
    (a projection `x @ w`, a norm, a graph template's copy, which may hold one): the kernelizer keeps every reduce of
    a fused attention's graph in its one kernel, and the flash kernel expects exactly its own four. Elementwise work
    below the views is stored with the value; the views (a head split's reshape and transpose, grouped heads'
    repeat) stay fused, so the value stored is the one the composite's kernels store (a projection's rows, which
    ember/incremental recomputes one token's row of, not a block of rows of every head)."""
    from ember.core.tensor import Tensor as TensorClass  # (core's Tensor: this module is one of its mixins)

    views, value = [], tensor.node
    while value.op in _VALUE_VIEWS and not value.realized:
        views.append(value)
        value = value.srcs[0]
    pending, seen = [value], set()
    while pending:
        node = pending.pop()
        if node.realized or id(node) in seen:
            continue
        seen.add(id(node))
        if node.op in REDUCE_OPS or node.op in EXPANDED_OPS:  # (a template's copy, such as a linear, may hold one)
            stored = TensorClass._from_node(value)._apply(Op.CONTIGUOUS)
            for view in reversed(views):
                stored = stored._apply(view.op, arg=view.arg)
            return stored
        if node.op is not Op.CONTIGUOUS:  # (a stored boundary: what is below it is another kernel's)
            pending.extend(node.srcs)
    return tensor


_VALUE_VIEWS = frozenset({Op.RESHAPE, Op.EXPAND, Op.PERMUTE, Op.SHRINK, Op.FLIP})  # views that add no values


def _update_instance_stats(tensor: Tensor, mean: Tensor, variance: Tensor, running_mean: Tensor | None,
                           running_var: Tensor | None, momentum: float) -> None:
    """torch's running stats of instance_norm: the momentum update with the batch average of each sample's mean
    and unbiased variance."""
    count = math.prod(tensor.shape[2:])
    if running_mean is not None:
        batch_mean = mean._detached_copy().reshape(mean.shape[:2]).mean(0)
        running_mean.assign((1 - momentum) * running_mean + momentum * batch_mean)
    if running_var is not None:
        unbiased = variance._detached_copy().reshape(variance.shape[:2]) * (count / max(count - 1, 1))
        running_var.assign((1 - momentum) * running_var + momentum * unbiased.mean(0))


def _machine_epsilon(tensor: Tensor) -> float:
    """torch.finfo(dtype).eps of a float dtype."""
    return {
        dtypes.float16: 2.0**-10, dtypes.bfloat16: 2.0**-7, dtypes.float32: 2.0**-23, dtypes.float64: 2.0**-52,
    }[tensor.dtype]
