"""Recurrent layers' arithmetic (nn/rnn.py): sigmoid and tanh in one exp2 each, a step's gates activated by one
kernel, and an LSTM layer's time steps recorded as one autograd step whose forward and backward (through time)
graphs are copied from graph templates, so that a time step costs no Tensor op in Python.

`lstm_layer` runs every time step of one LSTM layer and direction (torch's gate order i, f, g, o) on the input
projection of all steps, computed and stored beforehand. Its kernels per time step (7; torch launches 4): forward
the product by W_hh, the activated gates (adding the step's rows of the projection), the cell state with its tanh
(one kernel of both, joined) and the hidden state; backward the cell state's gradient with the output gate's (one
kernel, reading the step's rows of the output's gradient), the gates' gradient before activation and its product
by W_hh (the hidden state's gradient reaching the step before). Two of them name the step's offset (a kernel to
compile per step); the others are the same kernel at every step. The projection's gradient is the gates' gradients
of all steps joined, and W_hh's is one matmul of those by the hidden states the steps started from. A value that
two parts of a joined kernel share is cheap (a pad evaluates each part over the whole join: the kernelizer stores
an expensive one on its own, kernelize._broadcast_recompute_cuts)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ember.autograd.grad_mode import is_grad_enabled, no_grad
from ember.core.creation import arange
from ember.core.elementwise import where
from ember.core.graph_templates import TEMPLATES
from ember.core.movement import cat
from ember.core.ops import Composite

if TYPE_CHECKING:
    from ember.core.tensor import Tensor

LOG2_E = 1.4426950408889634
# below -44 sigmoid's exp2 exponent (44 log2 e ~ 63.5; tanh's doubled: 127) stays finite in float32 (a libm-style
# exp2 expansion may give garbage past its range); sigmoid(-44) ~ 8e-20 and tanh(-44) = -1 in float32
LOWEST_INPUT = -44.0
LSTM_GATES = 4
CELL_GATE = 2  # the gate whose activation is tanh (LSTM: g)


def logistic(work: Tensor, multiplier: Tensor | None, exponent_scale: Tensor, offset: Tensor | None) -> Tensor:
    """multiplier * sigmoid(multiplier * x) - offset, as multiplier / (1 + 2^(x * exponent_scale)) - offset, with
    exponent_scale = -multiplier log2(e) and offset = multiplier - 1 (tensors of x's shape; no multiplier and no
    offset: 1 and 0): sigmoid where the multiplier is 1, tanh (2 sigmoid(2x) - 1) where it is 2. Six ops per element
    (x clamped from below: the power stays finite); the error is absolute (a float32 rounding near 0 or 0.5), where
    ember's precise sigmoid and tanh (core/unary_math.py: range reduction, tanh's expm1 and log) cost ~200 and ~4000
    ops by the kernelizer's count."""
    shape, device, dtype = tuple(work.shape), work.device, work.dtype
    power = work.maximum(constant(shape, device, dtype, LOWEST_INPUT)).mul(exponent_scale).exp2()
    denominator = power + constant(shape, device, dtype, 1.0)
    share = denominator.reciprocal() if multiplier is None else multiplier / denominator
    return share if offset is None else share - offset


def fast_tanh(work: Tensor) -> Tensor:
    """tanh by `logistic` (2 sigmoid(2x) - 1), not recorded for autograd."""
    shape, device, dtype = tuple(work.shape), work.device, work.dtype
    return logistic(work, constant(shape, device, dtype, 2.0), constant(shape, device, dtype, -2.0 * LOG2_E),
                    constant(shape, device, dtype, 1.0))


@functools.lru_cache(maxsize=256)
def constant(shape: tuple[int, ...], device: str, dtype: Any, value: float) -> Tensor:
    """A lazy constant, one tensor for every time step of every batch: a step records no constant nodes of its own."""
    from ember.core.tensor import Tensor

    return Tensor._full(shape, value, dtype, device)


def blockwise_activation(gates: Tensor, tanh_gate: int) -> Tensor:
    """tanh of gate `tanh_gate` of `gates` (batch, gates, size), sigmoid of the others, stored by one kernel: one
    exp2 per element, tanh x = 2 sigmoid(2x) - 1 (`logistic`: each function of its own on every gate would cost
    both, and joining slices would pad each function's values, which the kernelizer may store). Which function is a
    condition on the gate axis alone: the same for every lane of a vector. Not recorded for autograd."""
    from ember.core import dtype as dtypes

    float_kind = gates.dtype == dtypes.float32 or gates.dtype == dtypes.float64
    work = gates if float_kind else gates.float()
    multiplier, exponent_scale, offset = gate_constants(tuple(gates.shape), gates.device, work.dtype, tanh_gate)
    return logistic(work, multiplier, exponent_scale, offset).to(gates.dtype).contiguous()


@functools.lru_cache(maxsize=64)
def gate_mask(shape: tuple[int, ...], device: str, gate: int) -> Tensor:
    """Whether each element of a (batch, gates, size) tensor of `shape` is in gate `gate`, as a lazy tensor: the
    same graph at every time step of every batch, so it is built once (a constant the kernels compute inline)."""
    with no_grad():
        return (arange(shape[1], device=device) == gate).reshape(1, shape[1], 1).expand(shape)._detached_copy()


@functools.lru_cache(maxsize=64)
def gate_constants(shape: tuple[int, ...], device: str, dtype: Any, gate: int) -> tuple[Tensor, Tensor, Tensor]:
    """`logistic`'s multiplier (2 on gate `gate` of a (batch, gates, size) tensor of `shape`, 1 on the others), its
    exponent scale and its offset, as lazy tensors of that shape built once (see `gate_mask`)."""
    with no_grad():
        multiplier = where(gate_mask(shape, device, gate), 2.0, 1.0).to(dtype)
        constants = (multiplier, multiplier * -LOG2_E, multiplier - 1.0)
        return tuple(constant._detached_copy() for constant in constants)  # type: ignore[return-value]


# ---- an LSTM layer as one autograd step ---------------------------------------------------------------------------


@dataclass
class LSTMLayerSaved:
    """What the backward of `lstm_layer` reads besides its sources and output: the steps' activated gates (batch,
    4, size) and cell states joined to their tanh (batch, 2, size), by time step, filled in when the forward graph
    is made. They are computed without
    history (a tensor with history here would tie the step's whole graph into a reference cycle)."""

    steps: int
    reverse: bool
    activations: tuple[Tensor, ...] = field(default=())
    cells: tuple[Tensor, ...] = field(default=())


def lstm_layer(projected: Tensor, weight: Tensor, hidden: Tensor, cell: Tensor, steps: int, reverse: bool) -> Tensor:
    """Every time step of one LSTM layer and direction -> [steps * batch + batch, size]: the hidden states of the
    steps in time order (rows t * batch ...), then the last cell state. `projected` [steps * batch, 4 size] is
    x @ W_ih^T + b_ih + b_hh of all steps (stored: each step reads its rows), `weight` W_hh [4 size, size],
    `hidden` and `cell` the initial states [batch, size]; `reverse` runs the steps from the last to the first.
    Recorded as one step (Composite.LSTM_LAYER) whose gradients are those of torch's LSTM."""
    saved = LSTMLayerSaved(steps, reverse)

    def compute(*sources: Tensor) -> Tensor:
        results = TEMPLATES.instantiate_many(("lstm layer", steps, reverse),
                                             functools.partial(_forward, steps, reverse), sources)
        saved.activations = tuple(results[1:1 + steps])  # type: ignore[arg-type]
        saved.cells = tuple(results[1 + steps:])  # type: ignore[arg-type]
        return results[0]  # type: ignore[return-value]

    return projected._recorded(Composite.LSTM_LAYER, compute, (projected, weight, hidden, cell), saved)


def _time_order(steps: int, reverse: bool) -> range:
    return range(steps - 1, -1, -1) if reverse else range(steps)


def _forward(steps: int, reverse: bool, projected: Tensor, weight: Tensor, hidden: Tensor,
             cell: Tensor) -> tuple[Tensor, ...]:
    """The graph of `lstm_layer`'s value: (the packed output, the activated gates by time step, the cell states by
    time step); each stored value one kernel. The product by W_hh is stored alone (a matmul kernel is fast with
    nothing fused after it); the activation kernel adds the step's rows of the projection, read in place (the one
    kernel of a step that names an offset: the others are the same kernel at every step). The states are kept
    (batch, 1, size), the shape a gate's slice has and the product reads."""
    batch, size = hidden.shape
    width = LSTM_GATES * size
    weight_rows = weight._reshaped((1, width, size))._broadcast((batch, width, size))
    hidden, cell = hidden._reshaped((batch, 1, size)), cell._reshaped((batch, 1, size))
    outputs: list[Tensor] = [None] * steps  # type: ignore[list-item]
    activations: list[Tensor] = [None] * steps  # type: ignore[list-item]
    cells: list[Tensor] = [None] * steps  # type: ignore[list-item]
    for time in _time_order(steps, reverse):
        product = (hidden._broadcast((batch, width, size)) * weight_rows).sum(-1).contiguous()
        rows = projected._crop(0, time * batch, (time + 1) * batch)
        activated = blockwise_activation((rows + product)._reshaped((batch, LSTM_GATES, size)), CELL_GATE)
        input_gate, forget_gate, cell_gate, output_gate = _gates(activated)
        cell = forget_gate * cell + input_gate * cell_gate
        # the cell state and its tanh stored by one kernel (batch, 2, size): the hidden state and backward read both
        cells[time] = cat([cell, fast_tanh(cell)], 1).contiguous()
        cell, cell_tanh = cells[time]._crop(1, 0, 1), cells[time]._crop(1, 1, 2)
        outputs[time] = hidden = (output_gate * cell_tanh).contiguous()
        activations[time] = activated
    packed = cat([*outputs, cell]).contiguous()
    return (packed._reshaped(((steps + 1) * batch, size)), *activations, *cells)


def _gates(activated: Tensor) -> tuple[Tensor, ...]:
    """The four gates of (batch, 4, size) activated gates, each (batch, 1, size)."""
    return tuple(activated._crop(1, gate, gate + 1) for gate in range(LSTM_GATES))


def lstm_layer_gradients(output: Tensor, saved: LSTMLayerSaved, sources: tuple[Tensor, ...],
                         grad: Tensor) -> tuple[Tensor, ...]:
    """The gradients of `lstm_layer`'s sources (projected, W_hh, hidden, cell) given its output's: the steps
    backward, last first, each from the stored gates, cell states and their tanh."""
    if is_grad_enabled():
        raise NotImplementedError(
            "backward with create_graph=True through an LSTM layer is not supported: its time steps' gradients are "
            "computed from values stored without a graph of their own"
        )
    _, weight, hidden0, cell0 = sources  # (the projection's values are not read)
    steps, reverse = saved.steps, saved.reverse
    batch, size = hidden0.shape
    width, total, state_shape = LSTM_GATES * size, steps * batch, (batch, 1, size)
    one = constant(state_shape, grad.device, grad.dtype, 1.0)
    grad = grad.contiguous()._reshaped(((steps + 1) * batch, 1, size))
    gate_gradients: list[Tensor] = [None] * steps  # type: ignore[list-item]
    recurrent: Tensor | None = None  # the hidden state's gradient from the step after (through its product by W_hh)
    cell_gradient = grad._crop(0, total, total + batch)  # the last cell state's
    later_forget: Tensor | None = None  # the forget gate of the step after
    order = list(_time_order(steps, reverse))
    for position in range(steps - 1, -1, -1):
        time = order[position]
        input_gate, forget_gate, cell_gate, output_gate = _gates(saved.activations[time])
        before = cell0._reshaped(state_shape) if position == 0 else saved.cells[order[position - 1]]._crop(1, 0, 1)
        cell_tanh = saved.cells[time]._crop(1, 1, 2)
        hidden_gradient = grad._crop(0, time * batch, (time + 1) * batch)
        if recurrent is not None:
            hidden_gradient = hidden_gradient + recurrent
        carried = cell_gradient if later_forget is None else cell_gradient * later_forget
        # the cell state's gradient and the output gate's (before activation) stored by one kernel (batch, 2, size):
        # the one kernel of a backward step that names an offset (its rows of the output's gradient)
        stored = cat([carried + hidden_gradient * output_gate * (one - cell_tanh * cell_tanh),
                      hidden_gradient * cell_tanh * output_gate * (one - output_gate)], 1).contiguous()
        cell_gradient, output_gradient = stored._crop(1, 0, 1), stored._crop(1, 1, 2)
        gates = cat([cell_gradient * cell_gate * input_gate * (one - input_gate),
                     cell_gradient * before * forget_gate * (one - forget_gate),
                     cell_gradient * input_gate * (one - cell_gate * cell_gate), output_gradient], 1).contiguous()
        gate_gradients[time] = gates
        recurrent = gates._reshaped((batch, width)).matmul(weight).contiguous()._reshaped(state_shape)
        later_forget = forget_gate
    assert recurrent is not None and later_forget is not None
    projected_gradient = cat(gate_gradients).contiguous()._reshaped((total, width))
    states = output._crop(0, 0, total)
    # the hidden state each step started from, in time order: the initial state, or the step before's output
    if steps == 1:
        starts = hidden0
    elif reverse:
        starts = cat([states._crop(0, batch, total), hidden0])
    else:
        starts = cat([hidden0, states._crop(0, 0, total - batch)])
    weight_gradient = projected_gradient.transpose(0, 1).matmul(starts)
    return (projected_gradient, weight_gradient, recurrent._reshaped((batch, size)),
            (cell_gradient * later_forget)._reshaped((batch, size)))
