"""The primitive op set: the only ops the graph, kernelizer, IR, backward rules and backends know (and Composite,
the compositions autograd records as one step with their own rule). One graph op is not primitive: TEMPLATE, a copy
of a graph template kept as one node until the scheduler expands it (core/graph_templates.py)."""

from __future__ import annotations

from enum import Enum, auto

from ember.core.dtype import DType, min_value


class Op(Enum):
    """Primitive ops. Every Tensor method is a composition of these."""

    __hash__ = object.__hash__  # members are singletons compared by identity; Enum's name hash is 4x slower

    # sources
    BUFFER = auto()  # a realized buffer; arg: the Buffer
    CONST = auto()  # a scalar broadcast to the node's shape; arg: the Python value
    ARANGE = auto()  # 0, 1, ..., n-1 along the only axis of a 1-d node
    COPY = auto()  # the source moved to another device; arg: the target device name
    CONTIGUOUS = auto()  # the source, stored to its own buffer (a forced kernel boundary); arg: None, or
    # FUSED_ATTENTION on a fused attention's output (core/functional.py), whose reduces the kernelizer keeps in one
    # kernel (ir/flash_attention.py)
    # unary
    NEG = auto()
    RECIPROCAL = auto()
    SQRT = auto()
    EXP2 = auto()
    LOG2 = auto()
    SIN = auto()
    TRUNC = auto()  # round toward zero (floats only)
    NOT = auto()  # logical not for bool, bitwise not for integers
    CAST = auto()  # arg: the target DType (value conversion, C semantics; float->int truncates)
    BITCAST = auto()  # arg: the target DType of the same size (bits reinterpreted)
    # binary (both sources have the same shape and dtype, except SHL/SHR where they match too)
    ADD = auto()
    SUB = auto()
    MUL = auto()
    DIV = auto()  # true division (floats only)
    IDIV = auto()  # integer division rounding toward zero; x // 0 gives 0 (no trap)
    MOD = auto()  # integer remainder with the sign of the dividend (C's %); x % 0 gives 0
    MAX = auto()  # NaN-propagating maximum
    CMPLT = auto()  # result bool
    CMPEQ = auto()  # result bool
    AND = auto()
    OR = auto()
    XOR = auto()
    SHL = auto()
    SHR = auto()  # arithmetic for signed, logical for unsigned
    # ternary
    WHERE = auto()  # (condition: bool, if_true, if_false): a select, the branch not taken never leaks
    # reductions over arg: tuple of axes; the output keeps the reduced axes with size 1
    SUM = auto()
    PROD = auto()
    REDUCE_MAX = auto()
    # movement
    RESHAPE = auto()  # arg: new shape
    EXPAND = auto()  # arg: new shape (only size-1 axes grow)
    PERMUTE = auto()  # arg: axis order
    PAD = auto()  # arg: (((before, after), ...), fill value); negative amounts are not allowed here (use SHRINK)
    SHRINK = auto()  # arg: ((start, end), ...)
    FLIP = auto()  # arg: tuple of axes to reverse
    # a copy of a graph template (core/graph_templates.py): sources: the template's inputs; arg: TemplateResult (the
    # template and the position of this result). Not a primitive: the scheduler expands it into the template's
    # primitive nodes before kernelizing, so the kernelizer, IR and backends never see one
    TEMPLATE = auto()

    __hash__ = object.__hash__  # members are singletons: identity hashing is exact and much faster than Enum's


class Composite(Enum):
    """Compositions recorded for autograd as one step with their own backward rule (torch's formula): the chain
    rule through their primitives gives other values than torch at special points (0, inf, NaN, clamped ranges).
    Only autograd knows them; the graph, kernelizer and backends see the primitives the composition is made of."""

    EXP = auto()  # sources: (x,); d/dx = exp(x), also where the composition clamps (exp'(+inf) = inf)
    POW = auto()  # sources: (base, exponent) of one shape and dtype
    POW_SCALAR = auto()  # sources: (base,); arg: the Python number exponent (x ** 0 has a zero gradient)
    COPYSIGN = auto()  # sources: (magnitude, sign) of one shape; the sign is read from its bits, yet (as in torch) it
    # is used: its gradient is zeros, not "unused"
    NORMALIZE = auto()  # sources: (x, weight?, bias?); arg: NormalizationSaved (statistics, which are present)
    CONVOLUTION = auto()  # sources: (x [N, C, *S], weight); arg: ConvolutionGeometry; the backward is convolutions
    # again (core/convolution_forms.py), not the adjoints of the overlapping window views
    TRANSPOSED_CONVOLUTION = auto()  # sources: (x [N, Cin, *I], weight [Cin, Cout / G, *K]); arg: the
    # ConvolutionGeometry of the convolution whose input gradient it is; the backward is that convolution again
    MAX_POOL = auto()  # sources: (x [N, C, *S],); arg: PoolGeometry; the gradient goes to each window's first maximum
    TANH = auto()  # sources: (x,); d/dx = 1 - tanh(x)^2 from the output, as torch's tanh_backward (one small step
    # instead of the chain rule through expm1's branches: a recurrent layer differentiates it at every time step)
    SIGMOID = auto()  # sources: (x,); d/dx = s (1 - s) from the output s, as torch's sigmoid_backward
    GATES = auto()  # sources: (x,); arg: a tensor of x's shape, 1 where the output is tanh of x and 0 where it is
    # sigmoid (a recurrent cell's gates: nn/rnn.py); d/dx = (y + arg)(1 - y) from the output y: s (1 - s) or 1 - t^2
    RELU = auto()  # sources: (x,); 0 where x <= 0 (where the output is <= 0), else the gradient (a NaN input
    # passes it), as torch's threshold_backward: one select instead of the chain rule through relu's two selects;
    # read from x, as the chain rule did (reading the output stores it: a slower partition of conv nets' backward)
    SOFTMAX = auto()  # sources: (x,); arg: the axis; y (g - sum(g y)) from the output y, as torch's softmax backward
    # (also scaled_dot_product_attention's masked softmax, whose masked and fully masked rows' weights are 0)
    # (the chain rule through exp(x - max) / sum adds the max's gradient and recomputes exp in several kernels)
    LOG_SOFTMAX = auto()  # sources: (x,); arg: the axis; g - exp(y) sum(g) from the output y, as torch's
    GELU = auto()  # sources: (x,); d/dx = Phi(x) + x phi(x), as torch's gelu_backward (approximate='none'); the
    # chain rule through erfc's polynomial and branches took a dozen kernels
    DEFERRED_LINEAR = auto()  # sources: (weight [O, I], bias [O]?); arg: a callable giving (rows [N, I], scale
    # [N, O] or None), known only once a recurrence has run; the value is the bias part of linear(rows, weight, bias)
    # (the bias expanded to [N, O], or zeros), the steps computing the matmul part with the weight detached; backward
    # gives the weight (grad * scale)^T @ rows and the bias (grad * scale).sum(0): a recurrent layer's weight
    # gradient as one matmul over all its steps (nn/rnn.py); double backward raises

    TRACED = auto()  # sources: a pure function's tensor inputs; arg: graph_templates.TracedFunction (the function, by
    # its signature); the value is the function's graph copied from a template, backward the chain rule through its
    # primitives, run once per signature on stand-ins and copied from a template after (matmul, linear: one step for
    # autograd and a copy instead of a dozen recorded ops)
    RECURRENT_LAYER = auto()  # sources: (projected [T * N, G * H], W_hh [G * H, H], h0 [N, H], then LSTM c0 [N, H],
    # GRU b_hh [3 H] if it has one); arg: RecurrentLayerSaved (core/recurrent_steps.py: what the steps stored); the
    # value is every step of an LSTM or GRU layer (the hidden states, then LSTM's last cell state); backward runs the
    # steps back in time from the stored values (torch's gradients) in a graph copied from a template: no per-step
    # history; double backward raises

    GATHER = auto()  # sources: (values [..., N],); arg: a 1-d int64 index [M] (long: core/advanced_indexing.take_last);
    # the gradient is the sorted scatter-sum of core/sorted_writes.py, not the chain rule's compare of every index
    # with every position (the backward of x[idx] for 10^5 of 10^6 took 28 s)

    __hash__ = object.__hash__


FUSED_ATTENTION = "fused attention"  # CONTIGUOUS's arg on a fused attention's output (see Op.CONTIGUOUS)
SOURCE_OPS = frozenset({Op.BUFFER, Op.CONST, Op.ARANGE, Op.COPY, Op.CONTIGUOUS})
UNARY_OPS = frozenset({Op.NEG, Op.RECIPROCAL, Op.SQRT, Op.EXP2, Op.LOG2, Op.SIN, Op.TRUNC, Op.NOT, Op.CAST, Op.BITCAST})
BINARY_OPS = frozenset(
    {Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.IDIV, Op.MOD, Op.MAX, Op.CMPLT, Op.CMPEQ, Op.AND, Op.OR, Op.XOR, Op.SHL, Op.SHR}
)
TERNARY_OPS = frozenset({Op.WHERE})
ELEMENTWISE_OPS = UNARY_OPS | BINARY_OPS | TERNARY_OPS
REDUCE_OPS = frozenset({Op.SUM, Op.PROD, Op.REDUCE_MAX})
MOVEMENT_OPS = frozenset({Op.RESHAPE, Op.EXPAND, Op.PERMUTE, Op.PAD, Op.SHRINK, Op.FLIP})
COMPARISON_OPS = frozenset({Op.CMPLT, Op.CMPEQ})
FLOAT_ONLY_OPS = frozenset({Op.RECIPROCAL, Op.SQRT, Op.EXP2, Op.LOG2, Op.SIN, Op.TRUNC, Op.DIV})
INT_ONLY_OPS = frozenset({Op.IDIV, Op.MOD, Op.SHL, Op.SHR})
BITWISE_OPS = frozenset({Op.AND, Op.OR, Op.XOR})

# each reduce as the binary op that combines two partial results (lowering's lane split, renderers' accumulator
# updates, sharded reductions)
REDUCE_COMBINE = {Op.SUM: Op.ADD, Op.PROD: Op.MUL, Op.REDUCE_MAX: Op.MAX}


def reduce_identity(op: Op, dtype: DType) -> float | int | bool:
    """The value a reduce starts from (its result over no elements): 0 for SUM, 1 for PROD, the dtype's smallest
    value for REDUCE_MAX (-inf for floats)."""
    if op is Op.SUM:
        return 0
    if op is Op.PROD:
        return 1
    if op is Op.REDUCE_MAX:
        return min_value(dtype)
    raise ValueError(f"reduce_identity: {op} is not a reduce; the reduces are {sorted(o.name for o in REDUCE_OPS)}")


EXPANDED_OPS = frozenset({Op.TEMPLATE})  # stand for a graph of primitives the scheduler expands before kernelizing
assert SOURCE_OPS | ELEMENTWISE_OPS | REDUCE_OPS | MOVEMENT_OPS | EXPANDED_OPS == frozenset(Op), "every op has a category"
