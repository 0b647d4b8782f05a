"""torch.nn.functional for ember: free functions with torch's signatures, each mapping to one Tensor method."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ember.core.convolution import IntOrInts
from ember.core.grid_sampling import affine_grid, grid_sample  # noqa: F401 - part of nn.functional
from ember.core.tensor import Tensor
from ember.nn.bags_and_unpooling import embedding_bag, max_unpool1d, max_unpool2d, max_unpool3d  # noqa: F401
from ember.nn.composed_functional import (  # noqa: F401 - part of nn.functional
    dropout3d,
    gumbel_softmax,
    interpolate,
    local_response_norm,
    lp_pool1d,
    lp_pool2d,
    lp_pool3d,
    max_pool1d_with_indices,
    max_pool2d_with_indices,
    max_pool3d_with_indices,
    triplet_margin_with_distance_loss,
    upsample,
    upsample_bilinear,
    upsample_nearest,
)

# ---- linear and convolution -----------------------------------------------------------------------------------


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:  # noqa: A002 - torch's names
    return input.linear(weight, bias)


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x1^T W x2 + b for weight [out, in1, in2]."""
    from ember.core.linalg import einsum

    result = einsum("...i,oij,...j->...o", input1, weight, input2)
    return result + bias if bias is not None else result


def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrInts = 1,  # noqa: A002
           padding: IntOrInts | str = 0, dilation: IntOrInts = 1, groups: int = 1) -> Tensor:
    return input.conv1d(weight, bias, stride, padding, dilation, groups)


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrInts = 1,  # noqa: A002
           padding: IntOrInts | str = 0, dilation: IntOrInts = 1, groups: int = 1) -> Tensor:
    return input.conv2d(weight, bias, stride, padding, dilation, groups)


def conv3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrInts = 1,  # noqa: A002
           padding: IntOrInts | str = 0, dilation: IntOrInts = 1, groups: int = 1) -> Tensor:
    return input.conv3d(weight, bias, stride, padding, dilation, groups)


def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrInts = 1,  # noqa: A002
                     padding: IntOrInts = 0, output_padding: IntOrInts = 0, groups: int = 1,
                     dilation: IntOrInts = 1) -> Tensor:
    return input.conv_transpose1d(weight, bias, stride, padding, output_padding, groups, dilation)


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrInts = 1,  # noqa: A002
                     padding: IntOrInts = 0, output_padding: IntOrInts = 0, groups: int = 1,
                     dilation: IntOrInts = 1) -> Tensor:
    return input.conv_transpose2d(weight, bias, stride, padding, output_padding, groups, dilation)


def conv_transpose3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrInts = 1,  # noqa: A002
                     padding: IntOrInts = 0, output_padding: IntOrInts = 0, groups: int = 1,
                     dilation: IntOrInts = 1) -> Tensor:
    return input.conv_transpose3d(weight, bias, stride, padding, output_padding, groups, dilation)


def unfold(input: Tensor, kernel_size: IntOrInts, dilation: IntOrInts = 1, padding: IntOrInts = 0,  # noqa: A002
           stride: IntOrInts = 1) -> Tensor:
    """im2col: the sliding blocks of [N, C, H, W] as columns [N, C * kh * kw, L] (a view)."""
    from ember.core.folding import im2col

    return im2col(input, kernel_size, dilation, padding, stride)


def fold(input: Tensor, output_size: IntOrInts, kernel_size: IntOrInts, dilation: IntOrInts = 1,  # noqa: A002
         padding: IntOrInts = 0, stride: IntOrInts = 1) -> Tensor:
    """col2im: columns [N, C * kh * kw, L] summed into [N, C, *output_size] (overlaps add up)."""
    from ember.core.folding import col2im

    return col2im(input, output_size, kernel_size, dilation, padding, stride)


# ---- pooling ------------------------------------------------------------------------------------------------


def max_pool1d(input: Tensor, kernel_size: IntOrInts, stride: IntOrInts | None = None,  # noqa: A002
               padding: IntOrInts = 0, dilation: IntOrInts = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Any:
    return input.max_pool1d(kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(input: Tensor, kernel_size: IntOrInts, stride: IntOrInts | None = None,  # noqa: A002
               padding: IntOrInts = 0, dilation: IntOrInts = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Any:
    return input.max_pool2d(kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def avg_pool1d(input: Tensor, kernel_size: IntOrInts, stride: IntOrInts | None = None,  # noqa: A002
               padding: IntOrInts = 0, ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    return input.avg_pool1d(kernel_size, stride, padding, ceil_mode, count_include_pad)


def avg_pool2d(input: Tensor, kernel_size: IntOrInts, stride: IntOrInts | None = None,  # noqa: A002
               padding: IntOrInts = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Tensor:
    return input.avg_pool2d(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def adaptive_avg_pool1d(input: Tensor, output_size: IntOrInts) -> Tensor:  # noqa: A002
    return input.adaptive_avg_pool1d(output_size)


def adaptive_avg_pool2d(input: Tensor, output_size: IntOrInts) -> Tensor:  # noqa: A002
    return input.adaptive_avg_pool2d(output_size)


def max_pool3d(input: Tensor, kernel_size: IntOrInts, stride: IntOrInts | None = None,  # noqa: A002
               padding: IntOrInts = 0, dilation: IntOrInts = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Any:
    return input.max_pool3d(kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def avg_pool3d(input: Tensor, kernel_size: IntOrInts, stride: IntOrInts | None = None,  # noqa: A002
               padding: IntOrInts = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Tensor:
    return input.avg_pool3d(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def adaptive_avg_pool3d(input: Tensor, output_size: IntOrInts) -> Tensor:  # noqa: A002
    return input.adaptive_avg_pool3d(output_size)


def adaptive_max_pool1d(input: Tensor, output_size: IntOrInts, return_indices: bool = False) -> Any:  # noqa: A002
    return input.adaptive_max_pool1d(output_size, return_indices)


def adaptive_max_pool2d(input: Tensor, output_size: IntOrInts, return_indices: bool = False) -> Any:  # noqa: A002
    return input.adaptive_max_pool2d(output_size, return_indices)


def adaptive_max_pool3d(input: Tensor, output_size: IntOrInts, return_indices: bool = False) -> Any:  # noqa: A002
    return input.adaptive_max_pool3d(output_size, return_indices)


def adaptive_max_pool1d_with_indices(input: Tensor, output_size: IntOrInts,  # noqa: A002
                                     return_indices: bool = True) -> tuple[Tensor, Tensor]:
    return input.adaptive_max_pool1d(output_size, True)


def adaptive_max_pool2d_with_indices(input: Tensor, output_size: IntOrInts,  # noqa: A002
                                     return_indices: bool = True) -> tuple[Tensor, Tensor]:
    return input.adaptive_max_pool2d(output_size, True)


def adaptive_max_pool3d_with_indices(input: Tensor, output_size: IntOrInts,  # noqa: A002
                                     return_indices: bool = True) -> tuple[Tensor, Tensor]:
    return input.adaptive_max_pool3d(output_size, True)


def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:  # noqa: A002
    return input.pixel_shuffle(upscale_factor)


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:  # noqa: A002
    return input.pixel_unshuffle(downscale_factor)


def channel_shuffle(input: Tensor, groups: int) -> Tensor:  # noqa: A002
    return input.channel_shuffle(groups)


# ---- activations --------------------------------------------------------------------------------------------


def relu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    return input.assign(input.relu()) if inplace else input.relu()


def relu6(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    return input.assign(input.relu6()) if inplace else input.relu6()


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:  # noqa: A002
    result = input.leaky_relu(negative_slope)
    return input.assign(result) if inplace else result


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:  # noqa: A002
    return input.assign(input.elu(alpha)) if inplace else input.elu(alpha)


def selu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    return input.assign(input.selu()) if inplace else input.selu()


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:  # noqa: A002
    return input.assign(input.celu(alpha)) if inplace else input.celu(alpha)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:  # noqa: A002
    return input.gelu(approximate)


def silu(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    return input.assign(input.silu()) if inplace else input.silu()


def mish(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    return input.assign(input.mish()) if inplace else input.mish()


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:  # noqa: A002
    result = input.hardtanh(min_val, max_val)
    return input.assign(result) if inplace else result


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    return input.assign(input.hardsigmoid()) if inplace else input.hardsigmoid()


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:  # noqa: A002
    return input.assign(input.hardswish()) if inplace else input.hardswish()


def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:  # noqa: A002
    result = input.threshold(threshold, value)
    return input.assign(result) if inplace else result


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:  # noqa: A002
    return input.hardshrink(lambd)


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:  # noqa: A002
    return input.softshrink(lambd)


def tanhshrink(input: Tensor) -> Tensor:  # noqa: A002
    return input.tanhshrink()


def glu(input: Tensor, dim: int = -1) -> Tensor:  # noqa: A002
    return input.glu(dim)


def prelu(input: Tensor, weight: Tensor) -> Tensor:  # noqa: A002
    return input.prelu(weight)


def rrelu(input: Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False,  # noqa: A002
          inplace: bool = False) -> Tensor:
    result = input.rrelu(lower, upper, training)
    return input.assign(result) if inplace else result


def sigmoid(input: Tensor) -> Tensor:  # noqa: A002
    return input.sigmoid()


def tanh(input: Tensor) -> Tensor:  # noqa: A002
    return input.tanh()


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:  # noqa: A002
    return input.softplus(beta, threshold)


def softsign(input: Tensor) -> Tensor:  # noqa: A002
    return input.softsign()


def logsigmoid(input: Tensor) -> Tensor:  # noqa: A002
    return input.logsigmoid()


def softmax(input: Tensor, dim: int, dtype: Any = None) -> Tensor:  # noqa: A002
    return input.softmax(dim, dtype)


def log_softmax(input: Tensor, dim: int, dtype: Any = None) -> Tensor:  # noqa: A002
    return input.log_softmax(dim, dtype)


def softmin(input: Tensor, dim: int, dtype: Any = None) -> Tensor:  # noqa: A002
    return input.softmin(dim, dtype)


# ---- normalization, dropout, embedding ----------------------------------------------------------------------


def layer_norm(input: Tensor, normalized_shape: int | Sequence[int], weight: Tensor | None = None,  # noqa: A002
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    return input.layer_norm(normalized_shape, weight, bias, eps)


def rms_norm(input: Tensor, normalized_shape: int | Sequence[int], weight: Tensor | None = None,  # noqa: A002
             eps: float | None = None) -> Tensor:
    return input.rms_norm(normalized_shape, weight, eps)


def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,  # noqa: A002
               eps: float = 1e-5) -> Tensor:
    return input.group_norm(num_groups, weight, bias, eps)


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,  # noqa: A002
               weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    return input.batch_norm(running_mean, running_var, weight, bias, training, momentum, eps)


def instance_norm(input: Tensor, running_mean: Tensor | None = None, running_var: Tensor | None = None,  # noqa: A002
                  weight: Tensor | None = None, bias: Tensor | None = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    return input.instance_norm(running_mean, running_var, weight, bias, use_input_stats, momentum, eps)


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:  # noqa: A002
    return input.normalize(p, dim, eps)


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:  # noqa: A002
    result = input.dropout(p, training)
    return input.assign(result) if inplace else result


def dropout1d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:  # noqa: A002
    """Zero whole channels of [N, C, L] (or [C, L]) with probability p."""
    result = input.feature_dropout(p, training, 1, "dropout1d")
    return input.assign(result) if inplace else result


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:  # noqa: A002
    """Zero whole channels of [N, C, H, W] (or [C, H, W]) with probability p."""
    result = input.feature_dropout(p, training, 2, "dropout2d")
    return input.assign(result) if inplace else result


def alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:  # noqa: A002
    result = input.alpha_dropout(p, training)
    return input.assign(result) if inplace else result


def feature_alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False,  # noqa: A002
                          inplace: bool = False) -> Tensor:
    result = input.alpha_dropout(p, training, feature=True)
    return input.assign(result) if inplace else result


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None,  # noqa: A002
              max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
              sparse: bool = False) -> Tensor:
    return input.embedding(weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    return tensor.one_hot(num_classes)


def pad(input: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Tensor:  # noqa: A002
    return input.pad(pad, mode, value)


# ---- attention ----------------------------------------------------------------------------------------------


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    return query.scaled_dot_product_attention(key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


# ---- losses -------------------------------------------------------------------------------------------------


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: Any = None,  # noqa: A002
                  ignore_index: int = -100, reduce: Any = None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    _no_legacy_reduction(size_average, reduce, "cross_entropy")
    return input.cross_entropy(target, weight, ignore_index, reduction, label_smoothing)


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average: Any = None,  # noqa: A002
             ignore_index: int = -100, reduce: Any = None, reduction: str = "mean") -> Tensor:
    _no_legacy_reduction(size_average, reduce, "nll_loss")
    return input.nll_loss(target, weight, ignore_index, reduction)


def mse_loss(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None,  # noqa: A002
             reduction: str = "mean") -> Tensor:
    _no_legacy_reduction(size_average, reduce, "mse_loss")
    return input.mse_loss(target, reduction)


def l1_loss(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None,  # noqa: A002
            reduction: str = "mean") -> Tensor:
    _no_legacy_reduction(size_average, reduce, "l1_loss")
    return input.l1_loss(target, reduction)


def smooth_l1_loss(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None,  # noqa: A002
                   reduction: str = "mean", beta: float = 1.0) -> Tensor:
    _no_legacy_reduction(size_average, reduce, "smooth_l1_loss")
    return input.smooth_l1_loss(target, reduction, beta)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0) -> Tensor:  # noqa: A002
    return input.huber_loss(target, reduction, delta)


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,  # noqa: A002
                         size_average: Any = None, reduce: Any = None, reduction: str = "mean") -> Tensor:
    _no_legacy_reduction(size_average, reduce, "binary_cross_entropy")
    return input.binary_cross_entropy(target, weight, reduction)


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,  # noqa: A002
                                     size_average: Any = None, reduce: Any = None, reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
    _no_legacy_reduction(size_average, reduce, "binary_cross_entropy_with_logits")
    return input.binary_cross_entropy_with_logits(target, weight, reduction, pos_weight)


def kl_div(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None,  # noqa: A002
           reduction: str = "mean", log_target: bool = False) -> Tensor:
    _no_legacy_reduction(size_average, reduce, "kl_div")
    return input.kl_div(target, reduction, log_target)


def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                        size_average: Any = None, reduce: Any = None, reduction: str = "mean") -> Tensor:
    _no_legacy_reduction(size_average, reduce, "margin_ranking_loss")
    return input1.margin_ranking_loss(input2, target, margin, reduction)


def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0, size_average: Any = None,  # noqa: A002
                         reduce: Any = None, reduction: str = "mean") -> Tensor:
    _no_legacy_reduction(size_average, reduce, "hinge_embedding_loss")
    return input.hinge_embedding_loss(target, margin, reduction)


def soft_margin_loss(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None,  # noqa: A002
                     reduction: str = "mean") -> Tensor:
    _no_legacy_reduction(size_average, reduce, "soft_margin_loss")
    return input.soft_margin_loss(target, reduction)


def multilabel_soft_margin_loss(input: Tensor, target: Tensor, weight: Tensor | None = None,  # noqa: A002
                                size_average: Any = None, reduce: Any = None, reduction: str = "mean") -> Tensor:
    _no_legacy_reduction(size_average, reduce, "multilabel_soft_margin_loss")
    return input.multilabel_soft_margin_loss(target, weight, reduction)


def multi_margin_loss(input: Tensor, target: Tensor, p: int = 1, margin: float = 1.0,  # noqa: A002
                      weight: Tensor | None = None, size_average: Any = None, reduce: Any = None,
                      reduction: str = "mean") -> Tensor:
    _no_legacy_reduction(size_average, reduce, "multi_margin_loss")
    return input.multi_margin_loss(target, p, margin, weight, reduction)


def multilabel_margin_loss(input: Tensor, target: Tensor, size_average: Any = None, reduce: Any = None,  # noqa: A002
                           reduction: str = "mean") -> Tensor:
    _no_legacy_reduction(size_average, reduce, "multilabel_margin_loss")
    return input.multilabel_margin_loss(target, reduction)


def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                          size_average: Any = None, reduce: Any = None, reduction: str = "mean") -> Tensor:
    _no_legacy_reduction(size_average, reduce, "cosine_embedding_loss")
    return input1.cosine_embedding_loss(input2, target, margin, reduction)


def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0, p: float = 2,
                        eps: float = 1e-6, swap: bool = False, size_average: Any = None, reduce: Any = None,
                        reduction: str = "mean") -> Tensor:
    _no_legacy_reduction(size_average, reduce, "triplet_margin_loss")
    return anchor.triplet_margin_loss(positive, negative, margin, p, eps, swap, reduction)


def poisson_nll_loss(input: Tensor, target: Tensor, log_input: bool = True, full: bool = False,  # noqa: A002
                     size_average: Any = None, eps: float = 1e-8, reduce: Any = None,
                     reduction: str = "mean") -> Tensor:
    _no_legacy_reduction(size_average, reduce, "poisson_nll_loss")
    return input.poisson_nll_loss(target, log_input, full, eps, reduction)


def gaussian_nll_loss(input: Tensor, target: Tensor, var: Any, full: bool = False, eps: float = 1e-6,  # noqa: A002
                      reduction: str = "mean") -> Tensor:
    return input.gaussian_nll_loss(target, var, full, eps, reduction)


# ---- distances ----------------------------------------------------------------------------------------------


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    return x1.cosine_similarity(x2, dim, eps)


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
    return x1.pairwise_distance(x2, p, eps, keepdim)


def pdist(input: Tensor, p: float = 2.0) -> Tensor:  # noqa: A002
    return input.pdist(p)


def _no_legacy_reduction(size_average: Any, reduce: Any, op: str) -> None:
    if size_average is not None or reduce is not None:
        raise ValueError(f"{op}: size_average and reduce are deprecated in torch and not supported; use reduction=")


# ---- in-place forms: torch's F.NAME_ for each F.NAME here (relu_, elu_, threshold_, ...), by one rule -----------


def _in_place_form(name: str, function: Any) -> Any:
    def in_place(input: Tensor, *args: Any, **kwargs: Any) -> Tensor:  # noqa: A002
        return input._assign_in_place(function(input, *args, **kwargs), name)

    in_place.__name__ = in_place.__qualname__ = name
    in_place.__doc__ = f"In place: input becomes {function.__name__}(input, ...)."
    return in_place


def _add_in_place_forms() -> None:
    from ember.torch_names import FUNCTIONAL_FUNCTIONS

    names = globals()
    for name in FUNCTIONAL_FUNCTIONS:
        if name.endswith("_") and name not in names and callable(names.get(name[:-1])):
            names[name] = _in_place_form(name, names[name[:-1]])


_add_in_place_forms()
