"""How much of PyTorch's API ember has: names of torch.*, torch.Tensor, torch.nn.functional and the helper modules
(torch.nn.utils with rnn/parametrize/parametrizations, torch.utils.data, torch.nn.init, torch.optim.lr_scheduler)
present and missing.

The truth is the committed list of PyTorch's public names (`ember/torch_names.py`); `python -m ember parity`
prints the counts and the missing names, grouped, so the gap stays visible. `FIRST_HOUR` holds the names a
PyTorch user reaches for in the first hour; each must exist in every place torch has it (`ember.NAME` where torch
has `torch.NAME`, `Tensor.NAME` where torch has the method or attribute, `ember.nn.functional.NAME` likewise).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from ember.torch_names import (
    FUNCTIONAL_FUNCTIONS,
    LR_SCHEDULER_CLASSES,
    NN_INIT_FUNCTIONS,
    NN_UTILS_FUNCTIONS,
    NN_UTILS_PARAMETRIZATIONS_NAMES,
    NN_UTILS_PARAMETRIZE_NAMES,
    NN_UTILS_RNN_NAMES,
    TENSOR_ATTRIBUTES,
    TENSOR_METHODS,
    TORCH_FUNCTIONS,
    TORCH_VERSION,
    UTILS_DATA_NAMES,
)

# torch's helper modules: (title, ember's module that should hold torch's names, those names)
HELPER_MODULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("torch.nn.utils functions", "ember.nn.utils", NN_UTILS_FUNCTIONS),
    ("torch.nn.utils.rnn names", "ember.nn.utils.rnn", NN_UTILS_RNN_NAMES),
    ("torch.nn.utils.parametrize names", "ember.nn.utils.parametrize", NN_UTILS_PARAMETRIZE_NAMES),
    ("torch.nn.utils.parametrizations names", "ember.nn.utils.parametrizations", NN_UTILS_PARAMETRIZATIONS_NAMES),
    ("torch.utils.data names", "ember.utils.data", UTILS_DATA_NAMES),
    ("torch.nn.init functions", "ember.nn.init", NN_INIT_FUNCTIONS),
    ("torch.optim.lr_scheduler classes", "ember.optim.lr_scheduler", LR_SCHEDULER_CLASSES),
)

FIRST_HOUR: tuple[str, ...] = tuple("""
tensor as_tensor from_numpy zeros ones full empty zeros_like ones_like full_like empty_like rand randn randint
randperm rand_like randn_like arange linspace eye manual_seed no_grad enable_grad save load
shape ndim dim size numel item tolist numpy to cpu cuda float double long int bool half type_as is_floating_point
detach clone contiguous requires_grad requires_grad_ grad backward is_leaf zero_ fill_ copy_ new_zeros new_ones
new_full new_tensor new_empty stride is_contiguous nelement element_size
reshape view view_as flatten unflatten squeeze unsqueeze permute transpose t T mT expand expand_as repeat
repeat_interleave cat concat stack split chunk unbind narrow select flip roll movedim gather scatter scatter_add
index_select masked_fill masked_select where nonzero tril triu ravel take_along_dim
add sub mul div pow sqrt rsqrt exp exp2 log log2 log10 log1p expm1 abs neg sign sin cos tan tanh sigmoid relu
clamp clip clamp_min clamp_max floor ceil round trunc frac remainder fmod maximum minimum lerp square reciprocal
erf isnan isinf isfinite nan_to_num eq ne lt le gt ge logical_and logical_or logical_not
acos asin atan acosh asinh atanh sinh cosh atan2 copysign logaddexp logaddexp2 hypot isclose allclose
sum mean prod max min amax amin argmax argmin std var std_mean var_mean norm logsumexp cumsum cumprod any all
count_nonzero aminmax
matmul mm bmm mv dot outer einsum diag diagonal diag_embed trace kron tensordot cross cdist
topk sort argsort kthvalue median mode msort unique searchsorted bucketize histc
softmax log_softmax dropout linear conv1d conv2d conv_transpose1d conv_transpose2d conv_transpose3d fold unfold
max_pool2d avg_pool2d pad layer_norm one_hot cross_entropy nll_loss mse_loss l1_loss binary_cross_entropy gelu
silu scaled_dot_product_attention normalize
bernoulli multinomial normal uniform_ normal_
is_tensor get_default_dtype set_default_dtype finfo iinfo set_printoptions inference_mode seed data hstack vstack
atleast_2d addcmul addmm baddbmm relu_ exp_ sigmoid_ clamp_ interpolate cosine_similarity pairwise_distance
""".split())

# names that only make sense for another backend, storage format or tool (counted, listed apart)
SPECIALIZED = re.compile(
    r"^(cudnn|miopen|mkldnn|fbgemm|quantize|quantized|q_|dequantize|sparse|to_sparse|is_sparse|ccol|crow|col_indices"
    r"|row_indices|nested|to_mkldnn|is_mkldnn|xla|mps|vulkan|ipu|xpu|hip|mtia|maia|cuda|is_cuda|is_meta|autocast"
    r"|.*_copy$|.*_backward|.*_scatter$|native_|batch_norm_|_)"
)


def _apis() -> list[tuple[str, str, tuple[str, ...], Any]]:
    """(title, prefix, torch's names, the ember object that should have them) for each public API."""
    import ember
    import ember.nn.functional

    return [
        ("torch functions", "torch.", TORCH_FUNCTIONS, ember),
        ("torch.Tensor methods and attributes", "Tensor.", tuple(sorted(TENSOR_METHODS + TENSOR_ATTRIBUTES)),
         ember.Tensor),
        ("torch.nn.functional functions", "nn.functional.", FUNCTIONAL_FUNCTIONS, ember.nn.functional),
    ]


def _module_or_none(path: str) -> Any:
    """The ember module at `path`, or None where ember does not have it (every name of it is then missing)."""
    try:
        return importlib.import_module(path)
    except ImportError:
        return None


def places(name: str) -> list[str]:
    """Where torch has `name`: 'torch.', 'Tensor.' and/or 'nn.functional.'."""
    found = []
    if name in TORCH_FUNCTIONS:
        found.append("torch.")
    if name in TENSOR_METHODS or name in TENSOR_ATTRIBUTES:
        found.append("Tensor.")
    if name in FUNCTIONAL_FUNCTIONS:
        found.append("nn.functional.")
    return found


def missing_first_hour() -> list[str]:
    """The first-hour names ember lacks, as 'torch.NAME', 'Tensor.NAME' or 'nn.functional.NAME'."""
    owners = {prefix: owner for _, prefix, _, owner in _apis()}
    missing = []
    for name in FIRST_HOUR:
        for prefix in places(name) or ["torch."]:
            if not hasattr(owners[prefix], name):
                missing.append(prefix + name)
    return missing


def report() -> dict[str, Any]:
    """For each API: how many of torch's names ember has, and the missing ones in groups."""
    result: dict[str, Any] = {"torch_version": TORCH_VERSION, "first_hour": {
        "count": len(FIRST_HOUR), "missing": missing_first_hour()}}
    for title, prefix, names, owner in _apis():
        missing = [name for name in names if not hasattr(owner, name)]
        groups = {
            "in-place variants": [name for name in missing if name.endswith("_") and not SPECIALIZED.match(name)],
            "other backends, formats and internals": [name for name in missing if SPECIALIZED.match(name)],
        }
        grouped = {name for group in groups.values() for name in group}
        groups = {"ops": [name for name in missing if name not in grouped], **groups}
        result[title] = {"prefix": prefix, "count": len(names), "present": len(names) - len(missing),
                         "missing": groups}
    for title, path, names in HELPER_MODULES:
        module = _module_or_none(path)
        missing = [name for name in names if module is None or not hasattr(module, name)]
        result[title] = {"prefix": path.removeprefix("ember.") + ".", "count": len(names),
                         "present": len(names) - len(missing), "missing": {"names": missing},
                         **({} if module is not None else {"module_missing": path})}
    return result


def format_report(found: dict[str, Any], width: int = 116) -> str:
    """The report as text: counts, then the missing names of each group wrapped to `width` columns."""
    import textwrap

    first = found["first_hour"]
    lines = [f"ember's coverage of PyTorch {found['torch_version']}'s public API",
             f"first-hour names: {first['count'] - len(first['missing'])} of {first['count']} present"]
    if first["missing"]:
        lines.append(textwrap.fill("  missing: " + ", ".join(first["missing"]), width, subsequent_indent="    "))
    for title, entry in found.items():
        if title in ("torch_version", "first_hour"):
            continue
        share = 100.0 * entry["present"] / entry["count"] if entry["count"] else 100.0
        absent = f" ({entry['module_missing']} does not exist)" if "module_missing" in entry else ""
        lines.append(f"{title}: {entry['present']} of {entry['count']} present ({share:.0f}%){absent}")
        for group, names in entry["missing"].items():
            if names:
                lines.append(textwrap.fill(f"  missing {group} ({len(names)}): " + ", ".join(names), width,
                                           subsequent_indent="    "))
    return "\n".join(lines)
