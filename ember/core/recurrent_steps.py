"""Recurrent layers' arithmetic (nn/rnn.py): sigmoid and tanh in one exp2 each, a step's gates activated by one
kernel, and an LSTM or GRU layer's time steps recorded as one autograd step whose forward and backward (through
time) graphs are copied from graph templates, so that a time step costs no Tensor op in Python.

`recurrent_layer` runs every time step of one layer and direction on the input projection of all steps, computed
and stored beforehand (torch's gate orders: LSTM i, f, g, o; GRU r, z, n). Each stored value is one kernel; a step's
kernels are the same kernel at every step, also the one or two that read the step's rows of the projection (forward)
or of the output's gradient (backward): they read a view at the rows' offset (scheduler/input_views.py), where the
pool views at that offset (c: any), else they name the offset and compile per step. Per
time step (torch launches 4):
- LSTM, 7: forward the product by W_hh, the activated gates (adding the step's rows of the projection), the cell
  state with its tanh (one kernel of both, joined) and the hidden state; backward the cell state's gradient with
  the output gate's (one kernel), the gates' gradient before activation and its product by W_hh (the hidden
  state's gradient reaching the step before).
- GRU, 7: forward the product by W_hh (+ b_hh), the reset and update gates with the step's rows of the
  projection's new-gate part (one kernel), the new gate with the hidden state; backward the hidden state's
  gradient, the projection's, the hidden product's and its product by W_hh.
The projection's gradient is the steps' joined, and W_hh's is one matmul of the hidden product's gradients (LSTM:
the gates') by the hidden states the steps started from. Parts joined into one kernel share only cheap values: a
pad evaluates each part over the whole join, so the kernelizer stores an expensive shared value on its own
(kernelize._broadcast_recompute_cuts)."""

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


def fast_tanh(value: Tensor) -> Tensor:
    """tanh by `logistic` (2 sigmoid(2x) - 1), in float32 for a narrower float; not recorded for autograd."""
    work = _widened(value)
    shape, device, dtype = tuple(work.shape), work.device, work.dtype
    return logistic(work, constant(shape, device, dtype, 2.0), constant(shape, device, dtype, -2.0 * LOG2_E),
                    constant(shape, device, dtype, 1.0)).to(value.dtype)


def fast_sigmoid(value: Tensor) -> Tensor:
    """sigmoid by `logistic`, in float32 for a narrower float; not recorded for autograd."""
    work = _widened(value)
    return logistic(work, None, constant(tuple(work.shape), work.device, work.dtype, -LOG2_E), None).to(value.dtype)


def _widened(value: Tensor) -> Tensor:
    """`value`, or float32 of it for float16 and bfloat16 (the gates' arithmetic needs float32's range and bits)."""
    from ember.core import dtype as dtypes

    return value if value.dtype == dtypes.float32 or value.dtype == dtypes.float64 else value.float()


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
    work = _widened(gates)
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


# ---- a layer's steps as one autograd step --------------------------------------------------------------------------


@dataclass
class RecurrentLayerSaved:
    """What the backward of `recurrent_layer` reads besides its sources and output: the values each time step
    stored (`STORED_PER_STEP[mode]` per step, in time order), filled in when the forward graph is made. They are
    computed without history (a tensor with history here would tie the step's whole graph into a reference cycle).
    LSTM: the activated gates (batch, 4, size) and the cell state joined to its tanh (batch, 2, size); GRU: the
    reset and update gates joined to the projection's new-gate rows (batch, 3, size), the new gate joined to the
    hidden state (batch, 2, size), and the hidden product (batch, 3 size)."""

    mode: str
    steps: int
    reverse: bool
    has_bias: bool  # (GRU: b_hh is a source, added to the hidden product)
    stored: tuple[Tensor, ...] = field(default=())

    def at(self, time: int) -> tuple[Tensor, ...]:
        count = STORED_PER_STEP[self.mode]
        return self.stored[time * count:(time + 1) * count]


STORED_PER_STEP = {"LSTM": 2, "GRU": 3}


def recurrent_layer(mode: str, projected: Tensor, weight: Tensor, hidden: Tensor, cell: Tensor | None,
                    bias: Tensor | None, steps: int, reverse: bool) -> Tensor:
    """Every time step of one LSTM or GRU layer and direction: LSTM [steps * batch + batch, size], the hidden states
    of the steps in time order (rows t * batch ...), then the last cell state; GRU [steps * batch, size], the hidden
    states. `projected` [steps * batch, gates * size] is x @ W_ih^T + b_ih of all steps, plus b_hh for the LSTM
    (stored: each step reads its rows); `weight` W_hh [gates * size, size]; `hidden` and `cell` (LSTM) the initial
    states [batch, size]; `bias` b_hh for the GRU (None: none); `reverse` runs the steps from the last to the
    first. Recorded as one step (Composite.RECURRENT_LAYER) whose gradients are those of torch's layer."""
    saved = RecurrentLayerSaved(mode, steps, reverse, bias is not None)
    sources: tuple[Tensor, ...]
    if mode == "LSTM":
        assert cell is not None and bias is None
        sources = (projected, weight, hidden, cell)
    else:
        assert mode == "GRU" and cell is None
        sources = (projected, weight, hidden) if bias is None else (projected, weight, hidden, bias)
    forward = _lstm_forward if mode == "LSTM" else _gru_forward

    def compute(*inputs: Tensor) -> Tensor:
        results = TEMPLATES.instantiate_many((mode, steps, reverse), functools.partial(forward, steps, reverse),
                                             inputs)
        saved.stored = tuple(results[1:])  # type: ignore[arg-type]
        return results[0]  # type: ignore[return-value]

    return projected._recorded(Composite.RECURRENT_LAYER, compute, sources, saved)


def _time_order(steps: int, reverse: bool) -> range:
    return range(steps - 1, -1, -1) if reverse else range(steps)


def _parts(tensor: Tensor, count: int) -> tuple[Tensor, ...]:
    """The `count` parts of a (batch, count, size) tensor along axis 1, each (batch, 1, size)."""
    return tuple(tensor._crop(1, part, part + 1) for part in range(count))


def _lstm_forward(steps: int, reverse: bool, projected: Tensor, weight: Tensor, hidden: Tensor,
                  cell: Tensor) -> tuple[Tensor, ...]:
    """The graph of an LSTM layer's value and what its steps store (RecurrentLayerSaved). The product by W_hh is
    stored alone (a matmul kernel is fast with nothing fused after it); the activation kernel adds the step's rows of
    the projection, read in place. The states are kept (batch, 1, size), the shape a gate's slice has and the
    product reads."""
    batch, size = hidden.shape
    width = LSTM_GATES * size
    weight_rows = weight._reshaped((1, width, size))._broadcast((batch, width, size))
    hidden, cell = hidden._reshaped((batch, 1, size)), cell._reshaped((batch, 1, size))
    outputs: list[Tensor] = [None] * steps  # type: ignore[list-item]
    stored: list[Tensor] = [None] * (2 * steps)  # type: ignore[list-item]
    for time in _time_order(steps, reverse):
        product = (hidden._broadcast((batch, width, size)) * weight_rows).sum(-1).contiguous()
        rows = projected._crop(0, time * batch, (time + 1) * batch)
        activated = blockwise_activation((rows + product)._reshaped((batch, LSTM_GATES, size)), CELL_GATE)
        input_gate, forget_gate, cell_gate, output_gate = _parts(activated, LSTM_GATES)
        cell = forget_gate * cell + input_gate * cell_gate
        # the cell state and its tanh stored by one kernel (batch, 2, size): the hidden state and backward read both
        cells = cat([cell, fast_tanh(cell)], 1).contiguous()
        cell, cell_tanh = _parts(cells, 2)
        outputs[time] = hidden = (output_gate * cell_tanh).contiguous()
        stored[2 * time], stored[2 * time + 1] = activated, cells
    packed = cat([*outputs, cell]).contiguous()
    return (packed._reshaped(((steps + 1) * batch, size)), *stored)


def _gru_forward(steps: int, reverse: bool, projected: Tensor, weight: Tensor, hidden: Tensor,
                 *bias: Tensor) -> tuple[Tensor, ...]:
    """The graph of a GRU layer's value and what its steps store (RecurrentLayerSaved): per step the hidden product
    h W_hh^T + b_hh; the reset and update gates (sigmoid of the projection's rows plus the product) joined to the
    projection's new-gate rows, the one kernel that reads the step's offset; the new gate tanh(n_x + r * n_h) joined
    to the hidden state (1 - z) n + z h."""
    batch, size = hidden.shape
    width = 3 * size
    weight_rows = weight._reshaped((1, width, size))._broadcast((batch, width, size))
    bias_rows = bias[0]._reshaped((1, width))._broadcast((batch, width)) if bias else None
    hidden = hidden._reshaped((batch, 1, size))
    one = constant((batch, 1, size), hidden.device, hidden.dtype, 1.0)
    outputs: list[Tensor] = [None] * steps  # type: ignore[list-item]
    stored: list[Tensor] = [None] * (3 * steps)  # type: ignore[list-item]
    for time in _time_order(steps, reverse):
        product = (hidden._broadcast((batch, width, size)) * weight_rows).sum(-1)
        product = (product if bias_rows is None else product + bias_rows).contiguous()
        hidden_parts = product._reshaped((batch, 3, size))
        rows = projected._crop(0, time * batch, (time + 1) * batch)._reshaped((batch, 3, size))
        reset_update = fast_sigmoid(rows._crop(1, 0, 2) + hidden_parts._crop(1, 0, 2))
        gates = cat([reset_update, rows._crop(1, 2, 3)], 1).contiguous()
        reset, update, input_new = _parts(gates, 3)
        new = fast_tanh(input_new + reset * hidden_parts._crop(1, 2, 3))
        new_hidden = cat([new, (one - update) * new + update * hidden], 1).contiguous()
        outputs[time] = hidden = new_hidden._crop(1, 1, 2)
        stored[3 * time:3 * time + 3] = gates, new_hidden, product
    packed = cat(outputs).contiguous()
    return (packed._reshaped((steps * batch, size)), *stored)


def recurrent_layer_gradients(output: Tensor, saved: RecurrentLayerSaved, sources: tuple[Tensor, ...],
                              grad: Tensor) -> tuple[Tensor, ...]:
    """The gradients of `recurrent_layer`'s sources given its output's: the steps backward, last first, from the
    values the steps stored."""
    if is_grad_enabled():
        raise NotImplementedError(
            f"backward with create_graph=True through an {saved.mode} layer is not supported: its time steps' "
            "gradients are computed from values stored without a graph of their own"
        )
    if saved.mode == "LSTM":
        return _lstm_gradients(output, saved, sources, grad)
    return _gru_gradients(output, saved, sources, grad)


def _starts(output: Tensor, hidden0: Tensor, steps: int, batch: int, reverse: bool) -> Tensor:
    """The hidden state each step started from, in time order [steps * batch, size]: the initial state, or the step
    before's output."""
    total = steps * batch
    if steps == 1:
        return hidden0
    if reverse:
        return cat([output._crop(0, batch, total), hidden0])
    return cat([hidden0, output._crop(0, 0, total - batch)])


def _lstm_gradients(output: Tensor, saved: RecurrentLayerSaved, sources: tuple[Tensor, ...],
                    grad: Tensor) -> tuple[Tensor, ...]:
    """(projected, W_hh, hidden, cell)'s gradients of an LSTM layer."""
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
        activated, cells = saved.at(time)
        input_gate, forget_gate, cell_gate, output_gate = _parts(activated, LSTM_GATES)
        before = cell0._reshaped(state_shape) if position == 0 else saved.at(order[position - 1])[1]._crop(1, 0, 1)
        cell_tanh = cells._crop(1, 1, 2)
        hidden_gradient = grad._crop(0, time * batch, (time + 1) * batch)
        if recurrent is not None:
            hidden_gradient = hidden_gradient + recurrent
        carried = cell_gradient if later_forget is None else cell_gradient * later_forget
        # the cell state's gradient and the output gate's (before activation) stored by one kernel (batch, 2, size):
        # the one kernel of a backward step that names an offset (its rows of the output's gradient)
        stored = cat([carried + hidden_gradient * output_gate * (one - cell_tanh * cell_tanh),
                      hidden_gradient * cell_tanh * output_gate * (one - output_gate)], 1).contiguous()
        cell_gradient, output_gradient = _parts(stored, 2)
        gates = cat([cell_gradient * cell_gate * input_gate * (one - input_gate),
                     cell_gradient * before * forget_gate * (one - forget_gate),
                     cell_gradient * input_gate * (one - cell_gate * cell_gate), output_gradient], 1).contiguous()
        gate_gradients[time] = gates
        recurrent = gates._reshaped((batch, width)).matmul(weight).contiguous()._reshaped(state_shape)
        later_forget = forget_gate
    assert recurrent is not None and later_forget is not None
    projected_gradient = cat(gate_gradients).contiguous()._reshaped((total, width))
    weight_gradient = projected_gradient.transpose(0, 1).matmul(
        _starts(output._crop(0, 0, total), hidden0, steps, batch, reverse))
    return (projected_gradient, weight_gradient, recurrent._reshaped((batch, size)),
            (cell_gradient * later_forget)._reshaped((batch, size)))


def _gru_gradients(output: Tensor, saved: RecurrentLayerSaved, sources: tuple[Tensor, ...],
                   grad: Tensor) -> tuple[Tensor, ...]:
    """(projected, W_hh, hidden[, b_hh])'s gradients of a GRU layer. With dh the hidden state's whole gradient:
    the new gate's (before tanh) dn = dh (1 - z)(1 - n^2), the update gate's dz = dh (h_before - n) z (1 - z), the
    reset gate's dr = dn (h W_hn^T + b_hn) r (1 - r); the projection's gradient is (dr, dz, dn), the hidden
    product's (dr, dz, dn r), and the state before gets dh z plus the hidden product's gradient times W_hh."""
    weight, hidden0 = sources[1], sources[2]
    steps, reverse = saved.steps, saved.reverse
    batch, size = hidden0.shape
    width, total, state_shape = 3 * size, steps * batch, (batch, 1, size)
    one = constant(state_shape, grad.device, grad.dtype, 1.0)
    grad = grad.contiguous()._reshaped((total, 1, size))
    projected_gradients: list[Tensor] = [None] * steps  # type: ignore[list-item]
    product_gradients: list[Tensor] = [None] * steps  # type: ignore[list-item]
    recurrent: Tensor | None = None  # the hidden product's gradient of the step after times W_hh
    carried: Tensor | None = None  # the step after's dh z (its state's gradient that skips the gates)
    order = list(_time_order(steps, reverse))
    for position in range(steps - 1, -1, -1):
        time = order[position]
        gates, new_hidden, product = saved.at(time)
        reset, update, _ = _parts(gates, 3)
        new = new_hidden._crop(1, 0, 1)
        before = hidden0._reshaped(state_shape) if position == 0 else saved.at(order[position - 1])[1]._crop(1, 1, 2)
        # stored: the one kernel of a backward step that names an offset (its rows of the output's gradient)
        hidden_gradient = grad._crop(0, time * batch, (time + 1) * batch)
        if recurrent is not None and carried is not None:
            hidden_gradient = hidden_gradient + recurrent + carried
        hidden_gradient = hidden_gradient.contiguous()
        new_gradient = hidden_gradient * (one - update) * (one - new * new)
        reset_gradient = new_gradient * product._reshaped((batch, 3, size))._crop(1, 2, 3) * reset * (one - reset)
        projected_gradients[time] = stored = cat([
            reset_gradient, hidden_gradient * (before - new) * update * (one - update), new_gradient], 1).contiguous()
        product_gradient = cat([stored._crop(1, 0, 2), stored._crop(1, 2, 3) * reset], 1).contiguous()
        product_gradients[time] = product_gradient
        recurrent = product_gradient._reshaped((batch, width)).matmul(weight).contiguous()._reshaped(state_shape)
        carried = hidden_gradient * update
    assert recurrent is not None and carried is not None
    projected_gradient = cat(projected_gradients).contiguous()._reshaped((total, width))
    product_gradient = cat(product_gradients).contiguous()._reshaped((total, width))
    weight_gradient = product_gradient.transpose(0, 1).matmul(_starts(output, hidden0, steps, batch, reverse))
    gradients = (projected_gradient, weight_gradient, (recurrent + carried)._reshaped((batch, size)))
    return (*gradients, product_gradient.sum(0)) if saved.has_bias else gradients
