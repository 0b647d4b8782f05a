"""Products of quantized weights with a few rows of input in integers: the input quantized to int8 per block of 32
(a scale per block, as ggml's q8_0), the weight's unsigned quants times those int8 values summed in int32 per group
of 16 or 32 elements, and each group's float factors applied once to its integer sum.

For a group g of the weight's row (value = factor * (u - offset) - minimum, `IntegerForm`) and the input's block
(x ~ dx * q, |q| <= 127):

    sum over g of value * x ~ factor * dx * (sum u * q - offset * sum q) - minimum * dx * sum q

`sum u * q` is a sum of unsigned bytes times signed bytes in int32, which the C backend's compiler turns into the
device's byte dot-product instructions (x86 VNNI's vpdpbusd); `sum q` is computed once per input block. The input's
rounding to 8 bits is the only difference from the float product (a relative error near 1/254 of the input block's
largest value per element, as llama.cpp's CPU kernels make).
"""

from __future__ import annotations

from ember.core import dtype as dtypes
from ember.core.tensor import Tensor
from ember.io.quantized import QuantizedTensor

INPUT_BLOCK = 32  # input elements sharing one int8 scale
# independent float sums over a row's blocks (where the blocks divide by it; else 1): two halve the chain of
# dependent additions; four made a gated MLP's kernel (two products) hold 8 float accumulators, which the c backend
# builds as a scalar tile at -O1, unvectorized (4.7x slower)
SUM_CHAINS = 2
ROUNDING = 12582912.0  # 1.5 * 2^23: a float32 plus it rounds to an integer (ulp 1), half to even
INTEGER_ROWS = 8  # input rows up to which a product with a device's integer dot products runs in integers
# the formats whose integer products run faster than their float ones, used by default. Measured on c (gcc 12,
# AVX512-VNNI, one thread, CPU time) with Gemma-3-270M's weights: Q8_0 (bytes loaded as they are) 3.5x faster
# (the 262144 x 640 output layer: 6.9 ms instead of 23.9 ms), Q5_0 1.4x (its FFN gates and ups: 3.4 ms instead of
# 4.8 ms for 18 layers of each). Slower in integers, their bits picked per element in scalar C that gcc's
# vectorizer handles worse than ember's float kernels on vectors: Q4_K 0.54x, Q6_K 0.73x, Q4_0 0.19x; Q5_K 1.07x
# (random blocks) is not worth the input's rounding. `matmul(integer=True)` runs any format in integers. Q5_0X4 (Q5_0's
# blocks interleaved, `QuantizedTensor.interleaved`: every bit picked by a shift per run of 16 bytes) 1.3x faster
# than Q5_0's (a 2048 x 640 product: 120 us instead of 155; in floats 115 us instead of 259).
# Q6_KW (Q6_K widened to a byte a value, `QuantizedTensor.widened`): no bits picked, 1.7x faster than Q6_K in floats.
INTEGER_FORMATS = frozenset({"Q8_0", "Q5_0", "Q5_0X4", "Q6_KW"})


def quantize_input(input: Tensor) -> tuple[Tensor, Tensor]:
    """(..., n) float -> int8 values q (..., n / 32, 32) and float32 scales d (..., n / 32, 1) with x ~ d * q: d is
    the block's largest magnitude / 127 and q = round(x / d); a block of zeros has d = 0, q = 0, and a block
    holding a NaN or an infinity has a NaN or infinite d (so the products it enters are not finite) and q = 0."""
    if input.shape[-1] % INPUT_BLOCK:
        raise ValueError(f"quantize_input: the last axis of {tuple(input.shape)} is not a multiple of {INPUT_BLOCK}")
    blocks = input.cast(dtypes.float32).reshape(*input.shape[:-1], input.shape[-1] // INPUT_BLOCK, INPUT_BLOCK)
    largest = blocks.abs().amax(-1, keepdim=True)
    usable = (largest > 0) & largest.isfinite()
    inverse = (127.0 / largest.where(usable, 1.0)).where(usable, 0.0)
    # round half to even by adding and taking away 1.5 * 2^23 (exact for |x| <= 2^22: here |x| <= 127), stored
    # (left lazy, the cheap rounding fused into each product's kernel and ran once per weight row)
    quants = ((blocks * inverse + ROUNDING) - ROUNDING).where(usable, 0.0).cast(dtypes.int8).contiguous()
    return quants, largest * (1.0 / 127.0)  # (a product: the kernels reading it recompute it, a division is slow)


def integer_matmul(weight: QuantizedTensor, input: Tensor) -> Tensor:
    """input @ weight.T for a 2-d quantized weight (out, in) and float input (..., in), with the input quantized to
    int8 per block of 32 and the products summed in int32 per group of the weight's format (see the module)."""
    out_features, in_features = weight.shape
    quant_format = weight.format
    layout = quant_format.layout
    blocks_per_row = in_features // quant_format.block_elements
    form = quant_format.integer_form(weight.blocks(), weight.scales)
    leading = tuple(input.shape[:-1])
    quants, scales = quantize_input(input)
    # the input's blocks of 32 laid out as the weight's blocks (the layout's row-major order is the elements'),
    # with its scales over the layout's trailing axes that span 32 elements; sums over a group's layout axes (their
    # last runs over consecutive bytes: the compiler's vectorizer reads it as byte vectors)
    spanned, axes_of_block = 1, 0
    while spanned < INPUT_BLOCK:
        axes_of_block += 1
        spanned *= layout[-axes_of_block]
    if spanned != INPUT_BLOCK or axes_of_block < form.group_axes:
        raise ValueError(f"integer_matmul: the {quant_format.name} layout {layout} has no trailing axes of "
                         f"{INPUT_BLOCK} elements holding its groups")
    outer = layout[: len(layout) - form.group_axes]
    input_scale = scales.reshape(*leading, 1, blocks_per_row, *layout[: len(layout) - axes_of_block],
                                 *([1] * (axes_of_block - form.group_axes)))
    integers = quants.reshape(*leading, 1, blocks_per_row, *layout).cast(dtypes.int32)
    input_sums = _group_sums(integers, form.group_axes)
    products = _group_sums(form.quants.cast(dtypes.int32) * integers, form.group_axes)
    if form.offset:
        products = products - input_sums * form.offset
    factor = form.factor.reshape(out_features, blocks_per_row, *outer)
    terms = factor * input_scale * products.cast(dtypes.float32)
    if form.minimum is not None:
        minimum = form.minimum.reshape(out_features, blocks_per_row, *outer)
        terms = terms - minimum * input_scale * input_sums.cast(dtypes.float32)
    # the sum over the blocks in SUM_CHAINS interleaved sums (blocks c, c + chains, ...) added at the end: a single
    # chain of float additions waits on each addition's latency (a product of cache-resident blocks: 26 -> 19 us)
    chains = SUM_CHAINS if blocks_per_row % SUM_CHAINS == 0 else 1
    shape = tuple(terms.shape)
    chained = terms.reshape(*shape[: -1 - len(outer)], blocks_per_row // chains, chains, *outer)
    partial = chained.sum((-2 - len(outer), *range(-len(outer), 0)))
    return sum((partial[..., chain] for chain in range(1, chains)), partial[..., 0])


def _group_sums(values: Tensor, group_axes: int) -> Tensor:
    """int32 sums over the last `group_axes` axes: a sum over the last (consecutive bytes), then the slices of the
    others added one by one, so that each sum is a loop over bytes with constant shifts (Q5_0's two halves of 16:
    a loop over both axes was unrolled by gcc into scalar code, a loop per half became byte dot products)."""
    sums = values.sum(-1, dtype=dtypes.int32)
    for _ in range(group_axes - 1):
        sums = sum((sums[..., index] for index in range(1, sums.shape[-1])), sums[..., 0])
    return sums


def integer_dot_products(device: str) -> bool:
    """Whether a device multiplies bytes into int32 sums faster than it converts them to floats
    (DeviceInfo.integer_dot_products)."""
    from ember.scheduler.devices import get_device

    return get_device(device).info.integer_dot_products
