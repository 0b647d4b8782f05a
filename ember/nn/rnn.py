"""Recurrent layers RNN, LSTM, GRU and their cells, with torch's gate layout and parameter names."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import ember as em
from ember.collection_pause import collection_paused
from ember.core.errors import ShapeError
from ember.core.ops import Composite
from ember.core.recurrent_steps import (
    blockwise_activation,
    constant,
    fast_sigmoid,
    fast_tanh,
    gate_constants,
    gate_mask,
    recurrent_layer,
)
from ember.core.tensor import Tensor
from ember.core.views import intermediates
from ember.nn import functional as F
from ember.nn import init
from ember.nn.linear import empty_parameter
from ember.nn.module import Module

GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _store_gradient(tensor: Tensor) -> Tensor:
    """`tensor`, whose gradient (in backward) is stored in a buffer of its own: the end of one step's backward."""
    if tensor.requires_grad:
        tensor.register_hook(lambda gradient: gradient.contiguous())
    return tensor


def _boundary(tensor: Tensor) -> Tensor:
    """Store `tensor` (and its gradient, in backward) in a buffer of its own.

    A recurrence otherwise fuses every earlier time step into each kernel, in forward and in backward; with a
    boundary per step, kernels stay small and every step reuses the same compiled kernels.
    """
    return _store_gradient(tensor.contiguous())


def _recorded_as(kind: Composite, source: Tensor, value: Tensor) -> Tensor:
    """`value`, which holds sigmoid or tanh of `source` computed (and stored) already, recorded for autograd as that
    function's step (torch's formula from the output): backward reads the stored values instead of evaluating the
    function again, and the function's values never need a kernel of their own."""
    return source._recorded(kind, lambda _source: value, (source,))


def _gate(tensor: Tensor, kind: Composite) -> Tensor:
    """sigmoid or tanh of a gate (core/recurrent_steps.py: one exp2 each), recorded with torch's backward from the
    output."""
    with em.no_grad():
        value = fast_tanh(tensor) if kind is Composite.TANH else fast_sigmoid(tensor)
    return _recorded_as(kind, tensor, value)


def _sigmoid(tensor: Tensor) -> Tensor:
    return _gate(tensor, Composite.SIGMOID)


def _tanh(tensor: Tensor) -> Tensor:
    return _gate(tensor, Composite.TANH)


def _deferred_linear(weight: Tensor, bias: Tensor | None, saved: Any, count: int, bias_columns: int) -> Tensor:
    """The bias part ([count, out]: the bias expanded, its columns from `bias_columns` on zero; zeros without bias)
    of linear(rows, weight, bias) whose matmul part (and the rest of the bias) the time steps compute with `weight`
    detached: recorded so that backward gives the weight (grad * scale)^T @ rows and the bias (grad * scale).sum(0),
    one matmul and one reduce for all steps. `saved()`, called in backward (after the steps ran), gives (rows, scale
    or None): a GRU's new gate reads its hidden matmul scaled by the reset gate (which scales that gradient)."""
    out = weight.shape[0]

    def value(*_sources: Tensor) -> Tensor:
        if bias is None:
            return em.zeros(count, out, dtype=weight.dtype, device=weight.device)
        kept = bias.detach()
        if bias_columns < out:
            kept = em.cat([kept[:bias_columns], em.zeros_like(kept[bias_columns:])])
        return kept.reshape(1, out).expand(count, out)

    sources = (weight,) if bias is None else (weight, bias)
    return weight._recorded(Composite.DEFERRED_LINEAR, value, sources, saved)


@dataclass
class _Layer:
    """What one layer and direction's backward of W_hh reads, filled in as its time steps run (see `saved`)."""

    mode: str
    width: int  # of the hidden state
    # Every tensor is kept without its history: the projection's own history holds `saved` (this object's
    # method), so a tensor with history here would close a reference cycle around the whole step's graph, which
    # then (device buffers included) would wait for Python's cycle collector instead of going when backward ends.
    projected: Tensor | None = None  # the input projection plus b_hh's joined part, all steps' rows
    starts: list[Tensor] = field(default_factory=list)  # by time step: the hidden state it started from
    hidden_parts: list[Tensor] = field(default_factory=list)  # by time step (GRU): its stored hidden matmul
    # where every step moves the whole batch: those states, from the layer's stored output and the initial state
    # (a join of two buffers; of one buffer per step, the join kernel would test every step's rows at each element)
    start_rows: Tensor | None = None

    def saved(self) -> tuple[Tensor, Tensor | None]:
        """The hidden states the steps started from, stacked in the order of the steps' rows and stored (one matmul
        reads them: a join of many buffers would slow it), and for a GRU the scale of the projection's gradient
        that gives the hidden matmul's (1 for the reset and update gates, the reset gate for the new gate), shaped
        (rows, gate, size)."""
        assert self.projected is not None
        if self.start_rows is not None:
            rows = self.start_rows.contiguous()
        elif not self.starts:
            return em.zeros(0, self.width, dtype=self.projected.dtype, device=self.projected.device), None
        else:
            rows = em.cat(self.starts).contiguous()
        if self.mode != "GRU":
            return rows, None
        size = self.projected.shape[-1] // 3
        hidden_reset = em.cat([part[:, :size] for part in self.hidden_parts])
        reset = _sigmoid(self.projected[:, :size] + hidden_reset).reshape(rows.shape[0], 1, size)
        # (rows, gate, size) as the steps' gates: the scale tells the gates apart on the gate axis alone
        return rows, em.cat([em.ones(rows.shape[0], 2, size, dtype=reset.dtype, device=reset.device), reset], 1)


def _activated_gates(gates: Tensor, tanh_gate: int) -> Tensor:
    """`blockwise_activation` of `gates`, recorded for autograd as one step (Composite.GATES: the gradient from the
    stored output, (y + 1)(1 - y) on the tanh gate and y (1 - y) on the others)."""
    offset = gate_constants(tuple(gates.shape), gates.device, gates.dtype, tanh_gate)[2]
    return gates._recorded(Composite.GATES, lambda source: blockwise_activation(source, tanh_gate), (gates,), offset)


class _HiddenProduct:
    """linear(hidden, weight, bias) at every time step of a layer: the weight laid out [1, out, in] and broadcast to
    the step's rows once per batch size, so that a step records the product's reshape, broadcast, multiply and sum
    (linear's transposes and layouts of the weight are the same graph at every step: the same kernel either way)."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        self.weight, self.bias = weight, bias
        self._broadcast_weight: dict[int, Tensor] = {}  # by the step's rows

    def __call__(self, hidden: Tensor) -> Tensor:
        rows, (out, inner) = hidden.shape[0], self.weight.shape
        right = self._broadcast_weight.get(rows)
        if right is None:
            right = self._broadcast_weight[rows] = self.weight._reshaped((1, out, inner))._broadcast((rows, out, inner))
        product = (hidden._reshaped((rows, 1, inner))._broadcast((rows, out, inner)) * right).sum(-1)
        return product if self.bias is None else product + self.bias


@intermediates
def _cell_step(
    mode: str,
    input_part: Tensor,
    hidden: Tensor,
    cell: Tensor | None,
    weight_hh: Tensor | _HiddenProduct,
    bias_hh: Tensor | None,
    weight_hr: Tensor | None,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """One time step: input_part is x @ W_ih^T + b_ih already (in a layer, also b_hh: GRU its reset and update
    parts, the hidden matmul adding the new gate's part) -> (hidden, cell or None, the hidden matmul). Gate order as
    torch: LSTM i,f,g,o; GRU r,z,n.

    Each stored value is one kernel. Forward: the hidden matmul (RNN: plus the input part), then LSTM the activated
    gates (adding the input part: the gates before activation are never stored, only their gradient), the cell
    state, its tanh, the hidden state; GRU the activated gates, the hidden state; RNN the hidden state. Backward: the gradients of the hidden state (with
    the matmul by W_hh), of the cell state (LSTM), and of the gates before activation (GRU: of the hidden matmul).
    Backward reads the stored activations: recomputed there, each gate's part of the gates' gradient would be
    evaluated over all the (padded) parts, which the kernelizer stores part by part (a kernel each) at real sizes.
    """
    if isinstance(weight_hh, _HiddenProduct):  # (a layer's steps: weight_hh detached, bias_hh inside)
        size = weight_hh.weight.shape[0] // GATES[mode]
        # the matmul is fused with the sum of the input part only (LSTM, RNN): a matmul kernel is fast with that, and
        # many times slower with the gates' activations fused in after it
        hidden_part = weight_hh(hidden)
    else:
        size = weight_hh.shape[0] // GATES[mode]
        hidden_part = F.linear(hidden, weight_hh, bias_hh)
    if mode == "LSTM":
        # the gates before activation are not stored (the activation kernel adds the input part, read where the
        # projection holds it): only their gradient is. They are laid out (batch, gate, size): what tells the gates
        # apart (the activation, the pads joining the gates' gradients in backward) is a condition on the gate axis
        # alone, the same for every lane of a vector
        batch = hidden.shape[0]
        gates = _store_gradient((input_part + hidden_part.contiguous())._reshaped((batch, 4, size)))
        activated = _activated_gates(gates, 2)
        input_gate, forget_gate, cell_gate, output_gate = (
            activated._crop(1, gate, gate + 1)._reshaped((batch, size)) for gate in range(4))
        new_cell = _boundary(forget_gate * cell + input_gate * cell_gate)
        # tanh of the cell state is stored (backward reads it in two kernels: recomputed under the pad that joins
        # the output gate's gradient to the others', the kernelizer would store it there)
        with em.no_grad():
            cell_tanh = _tanh(new_cell).contiguous()
        new_hidden = output_gate * _recorded_as(Composite.TANH, new_cell, cell_tanh)
        if weight_hr is not None:
            new_hidden = F.linear(new_hidden, weight_hr)
        return _boundary(new_hidden), new_cell, hidden_part
    if mode == "GRU":
        # laid out (batch, gate, size) as the LSTM's gates; the hidden matmul is stored with its gradient (that in
        # that layout, the matmul's output in its own: a matmul's tiles are planned on its output's last two axes)
        batch = hidden.shape[0]
        hidden_gates = _store_gradient(hidden_part.contiguous()._reshaped((batch, 3, size)))
        input_gates = input_part._reshaped((batch, 3, size))
        input_new, hidden_new = input_gates._crop(1, 2, 3), hidden_gates._crop(1, 2, 3)
        reset_update_part = input_gates._crop(1, 0, 2) + hidden_gates._crop(1, 0, 2)
        with em.no_grad():
            # the reset gate scales the new gate's part: computed again inside the activation kernel, read there
            # under a broadcast along the gate axis (joined to ones by a pad, the kernelizer would store it)
            reset = _sigmoid(reset_update_part._crop(1, 0, 1))._broadcast((batch, 3, size))
            gates_shape, device = tuple(hidden_gates.shape), hidden_gates.device
            scale = em.where(gate_mask(gates_shape, device, 2), reset,
                             constant(gates_shape, device, hidden_gates.dtype, 1.0))
            activated = blockwise_activation(input_gates + scale * hidden_gates, 2)
        reset_update = _recorded_as(Composite.SIGMOID, reset_update_part, activated._crop(1, 0, 2))
        new = _recorded_as(Composite.TANH, input_new + reset_update._crop(1, 0, 1) * hidden_new,
                           activated._crop(1, 2, 3))._reshaped((batch, size))
        update = reset_update._crop(1, 1, 2)._reshaped((batch, size))
        one = constant(tuple(update.shape), update.device, update.dtype, 1.0)
        return _boundary((one - update) * new + update * hidden), None, hidden_gates._reshaped((batch, 3 * size))
    total = _boundary(input_part + hidden_part)
    if mode == "RNN_RELU":
        return _boundary(total.relu()), None, hidden_part
    with em.no_grad():
        activated = _tanh(total).contiguous()
    return _store_gradient(_recorded_as(Composite.TANH, total, activated)), None, hidden_part


class RNNBase(Module):
    """Shared by RNN, LSTM and GRU: parameters weight_ih_l{k}[_reverse], weight_hh_l{k}, bias_ih_l{k}, bias_hh_l{k}."""

    def __init__(
        self,
        mode: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if not 0 <= dropout <= 1:
            raise ValueError(f"{name}: dropout should be a number in [0, 1], got {dropout}")
        if hidden_size <= 0 or num_layers <= 0:
            raise ValueError(f"{name}: hidden_size and num_layers must be positive, got {hidden_size} and {num_layers}")
        if proj_size < 0 or (proj_size and mode != "LSTM"):
            raise ValueError(f"{name}: proj_size must be >= 0 and is only supported by LSTM, got {proj_size}")
        if proj_size >= hidden_size:
            raise ValueError(f"{name}: proj_size ({proj_size}) has to be smaller than hidden_size ({hidden_size})")
        self.mode, self.input_size, self.hidden_size, self.num_layers = mode, input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.proj_size = bidirectional, proj_size
        directions = 2 if bidirectional else 1
        output_size = proj_size if proj_size > 0 else hidden_size
        gate_size = GATES[mode] * hidden_size
        self._flat_weights_names: list[str] = []
        for layer in range(num_layers):
            for direction in range(directions):
                layer_input = input_size if layer == 0 else output_size * directions
                suffix = f"_l{layer}" + ("_reverse" if direction == 1 else "")
                shapes: list[tuple[str, tuple[int, ...]]] = [
                    ("weight_ih", (gate_size, layer_input)), ("weight_hh", (gate_size, output_size))]
                if bias:
                    shapes += [("bias_ih", (gate_size,)), ("bias_hh", (gate_size,))]
                if proj_size > 0:
                    shapes.append(("weight_hr", (proj_size, hidden_size)))
                for prefix, shape in shapes:
                    setattr(self, prefix + suffix, empty_parameter(shape, device, dtype))
                    self._flat_weights_names.append(prefix + suffix)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size)
        for parameter in self.parameters():
            init.uniform_(parameter, -bound, bound)

    def _layer_parameters(
        self, layer: int, direction: int
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None]:
        suffix = f"_l{layer}" + ("_reverse" if direction == 1 else "")
        return (
            getattr(self, "weight_ih" + suffix),
            getattr(self, "weight_hh" + suffix),
            getattr(self, "bias_ih" + suffix) if self.bias else None,
            getattr(self, "bias_hh" + suffix) if self.bias else None,
            getattr(self, "weight_hr" + suffix) if self.proj_size > 0 else None,
        )

    def _initial_state(self, hx: Any, batch: int, input: Tensor, batched: bool) -> tuple[Tensor, Tensor | None]:  # noqa: A002
        directions = 2 if self.bidirectional else 1
        output_size = self.proj_size if self.proj_size > 0 else self.hidden_size
        name = type(self).__name__
        if hx is None:
            hidden = em.zeros(self.num_layers * directions, batch, output_size, dtype=input.dtype, device=input.device)
            cell = (
                em.zeros(self.num_layers * directions, batch, self.hidden_size, dtype=input.dtype, device=input.device)
                if self.mode == "LSTM"
                else None
            )
            return hidden, cell
        if self.mode == "LSTM":
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError(f"{name}: hx must be a tuple (h_0, c_0)")
            hidden, cell = hx
        else:
            hidden, cell = hx, None
        if not batched:
            hidden = hidden.unsqueeze(1)
            cell = cell.unsqueeze(1) if cell is not None else None
        expected = (self.num_layers * directions, batch, output_size)
        if tuple(hidden.shape) != expected:
            raise ShapeError(f"{name}: expected hidden state of shape {expected}, got {hidden.shape}")
        if cell is not None and tuple(cell.shape) != (self.num_layers * directions, batch, self.hidden_size):
            raise ShapeError(
                f"{name}: expected cell state of shape "
                f"{(self.num_layers * directions, batch, self.hidden_size)}, got {cell.shape}"
            )
        return hidden, cell

    def forward(self, input: Any, hx: Any = None) -> tuple[Any, Any]:  # noqa: A002
        """input (L, N, input_size) (N first with batch_first, or unbatched (L, input_size)) -> (output, h_n[, c_n]).

        A PackedSequence input gives a PackedSequence output, and h_n holds each sequence's state at its own length.
        """
        from ember.nn.utils.rnn import PackedSequence

        if isinstance(input, PackedSequence):
            return self._forward_packed(input, hx)
        name = type(self).__name__
        if input.ndim not in (2, 3):
            raise ShapeError(f"{name}: expected a 2-d (unbatched) or 3-d (batched) input, got shape {input.shape}")
        batched = input.ndim == 3
        sequence = input if batched else input.unsqueeze(1)
        if batched and self.batch_first:
            sequence = sequence.transpose(0, 1)
        if sequence.shape[2] != self.input_size:
            raise ShapeError(f"{name}: input of shape {input.shape} should have {self.input_size} features")
        length, batch = sequence.shape[0], sequence.shape[1]
        hidden0, cell0 = self._initial_state(hx, batch, input, batched)
        with collection_paused():  # (every time step's graph: many objects without cycles, see _recurrence)
            rows, hidden_n, cell_n = self._recurrence(sequence.reshape(length * batch, self.input_size),
                                                      [batch] * length, hidden0, cell0)
        output = rows.reshape(length, batch, rows.shape[-1])
        if batched and self.batch_first:
            output = output.transpose(0, 1)
        if not batched:
            output = output.squeeze(1)
            hidden_n = hidden_n.squeeze(1)
            cell_n = cell_n.squeeze(1) if cell_n is not None else None
        return output, ((hidden_n, cell_n) if self.mode == "LSTM" else hidden_n)

    def _forward_packed(self, packed: Any, hx: Any) -> tuple[Any, Any]:
        """The recurrence over a PackedSequence: at step t only the first batch_sizes[t] (longest) sequences move."""
        data, batch_sizes_tensor, sorted_indices, unsorted_indices = packed
        name = type(self).__name__
        if data.ndim != 2 or data.shape[1] != self.input_size:
            raise ShapeError(f"{name}: packed data of shape {data.shape} should be (rows, {self.input_size})")
        batch_sizes = [int(size) for size in batch_sizes_tensor.tolist()]
        if hx is not None and sorted_indices is not None:  # hx is in the batch's order; the recurrence runs sorted
            hx = tuple(part.index_select(1, sorted_indices) for part in hx) if self.mode == "LSTM" else (
                hx.index_select(1, sorted_indices))
        hidden0, cell0 = self._initial_state(hx, batch_sizes[0], data, True)
        with collection_paused():
            rows, hidden_n, cell_n = self._recurrence(data, batch_sizes, hidden0, cell0)
        if unsorted_indices is not None:  # back to the batch's order
            hidden_n = hidden_n.index_select(1, unsorted_indices)
            cell_n = cell_n.index_select(1, unsorted_indices) if cell_n is not None else None
        output = type(packed)(rows, batch_sizes_tensor, sorted_indices, unsorted_indices)
        return output, ((hidden_n, cell_n) if self.mode == "LSTM" else hidden_n)

    @intermediates
    def _recurrence(
        self, rows: Tensor, batch_sizes: list[int], hidden0: Tensor, cell0: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Every layer and direction over `rows` (time steps one after another; at step t the first batch_sizes[t]
        sequences, longest first: a padded batch has batch_sizes N at every step) -> (output rows, h_n, c_n).

        The input projection of all steps is one matmul per layer and direction, stored with its gradient; each
        step's output is stored, and the outputs of all steps are joined by one stored kernel. A step's rows of the
        projection are copied out first: a kernel names the offsets it reads, so that copy is the only kernel of a
        step that differs from the other steps' (a slice read by the step's matmul would make that a new kernel to
        compile at every step: the cold first step of a long sequence would compile a matmul per step).

        The steps multiply by W_hh detached; W_hh and b_hh get their gradients from `_deferred_linear`, once for all
        steps: one matmul of the projection's gradient (to which b_hh is added: it is
        the gates' gradient of every step, stacked; GRU: the new gate's part scaled by the reset gate) by the hidden
        states the steps started from, stacked. (b_hh is not folded into the projection's bias b_ih + b_hh, which
        would sum its gradient once: autograd would give both biases one gradient tensor, and clip_grad_norm_'s
        in-place scaling of each parameter's .grad would then scale it twice.)"""
        directions = 2 if self.bidirectional else 1
        output_size = self.proj_size if self.proj_size > 0 else self.hidden_size
        offsets = [0, *itertools.accumulate(batch_sizes)][:-1]  # each step's first row
        total_rows = sum(batch_sizes)
        final_hidden: list[Tensor] = []
        final_cell: list[Tensor] = []
        layer_input = rows
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                weight_ih, weight_hh, bias_ih, bias_hh, weight_hr = self._layer_parameters(layer, direction)
                state = layer * directions + direction
                if self.mode in ("LSTM", "GRU") and weight_hr is None and batch_sizes and all(
                        size == batch_sizes[0] for size in batch_sizes):
                    # every sequence moves at every step: the layer's steps are one recorded step
                    projected = F.linear(layer_input, weight_ih, bias_ih)
                    if bias_hh is not None and self.mode == "LSTM":
                        projected = projected + bias_hh
                    batch = batch_sizes[0]
                    packed = recurrent_layer(
                        self.mode, projected.contiguous(), weight_hh, hidden0[state],
                        None if cell0 is None else cell0[state], bias_hh if self.mode == "GRU" else None,
                        len(batch_sizes), direction == 1)
                    last = 0 if direction == 1 else total_rows - batch
                    outputs.append(packed._crop(0, 0, total_rows))
                    final_hidden.append(packed._crop(0, last, last + batch))
                    if cell0 is not None:
                        final_cell.append(packed._crop(0, total_rows, total_rows + batch))
                    continue
                saved = _Layer(self.mode, output_size, None, [None] * len(batch_sizes),  # type: ignore[list-item]
                               [None] * len(batch_sizes))  # type: ignore[list-item]
                # b_hh joins the projection (GRU: its reset and update parts); the projection's gradient is the
                # gates' (GRU: the hidden matmul's, but for the new gate's part scaled by the reset gate)
                joined = weight_hh.shape[0] * 2 // 3 if self.mode == "GRU" else weight_hh.shape[0]
                projected = _boundary(F.linear(layer_input, weight_ih, bias_ih)
                                      + _deferred_linear(weight_hh, bias_hh, saved.saved, total_rows, joined))
                saved.projected = projected._detached_copy()
                step_bias = None  # GRU: the new gate's b_hh, added by the hidden matmul
                if self.mode == "GRU" and bias_hh is not None:
                    step_bias = em.cat([em.zeros_like(bias_hh[:joined]), bias_hh[joined:]]).detach()
                hidden = hidden0[state]
                cell = cell0[state] if cell0 is not None else None
                steps: list[Tensor] = [None] * len(batch_sizes)  # type: ignore[list-item]
                order = range(len(batch_sizes) - 1, -1, -1) if direction == 1 else range(len(batch_sizes))
                product = _HiddenProduct(weight_hh.detach(), step_bias)
                for time in order:
                    size, start = batch_sizes[time], offsets[time]
                    moving = size == hidden.shape[0]
                    step_start = hidden if moving else hidden[:size]
                    saved.starts[time] = step_start._detached_copy()
                    # LSTM: the activation kernel reads the step's rows of the projection (the one kernel of a step
                    # that names its offset); the others copy them out first
                    step_rows = projected._crop(0, start, start + size)
                    new_hidden, new_cell, hidden_part = _cell_step(
                        self.mode, step_rows if self.mode == "LSTM" else step_rows.contiguous(), step_start,
                        cell if moving or cell is None else cell[:size], product, None, weight_hr,
                    )
                    saved.hidden_parts[time] = None if hidden_part is None else hidden_part._detached_copy()
                    # the step's share of the output's gradient copied out: like the input rows, the one kernel that
                    # names the step's offset, so the matmul by W_hh that adds it is the same kernel at every step
                    steps[time] = _store_gradient(new_hidden * constant(
                        tuple(new_hidden.shape), new_hidden.device, new_hidden.dtype, 1.0))
                    hidden = new_hidden if moving else em.cat([new_hidden, hidden[size:]])
                    if cell is not None and new_cell is not None:
                        cell = new_cell if moving else em.cat([new_cell, cell[size:]])
                outputs.append(_boundary(em.cat(steps)) if steps else em.zeros(
                    0, output_size, dtype=rows.dtype, device=rows.device))
                if len(steps) > 1 and all(size == batch_sizes[0] for size in batch_sizes):
                    initial, stored = hidden0[state]._detached_copy(), outputs[-1]._detached_copy()
                    # a step starts where the one before it (in the direction's order) ended
                    but_last, but_first = stored._crop(0, 0, total_rows - batch_sizes[0]), stored._crop(
                        0, batch_sizes[0], total_rows)
                    saved.start_rows = em.cat([initial, but_last] if direction == 0 else [but_first, initial])
                    saved.starts = []
                final_hidden.append(hidden)
                if cell is not None:
                    final_cell.append(cell)
            layer_input = outputs[0] if directions == 1 else em.cat(outputs, dim=-1)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, self.dropout, True)
        return layer_input, em.stack(final_hidden), em.stack(final_cell) if final_cell else None

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            text += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        if self.bias is not True:
            text += f", bias={self.bias}"
        if self.batch_first is not False:
            text += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            text += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            text += f", bidirectional={self.bidirectional}"
        return text


class RNN(RNNBase):
    """Elman RNN: h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh) (or relu with nonlinearity='relu')."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: unknown nonlinearity {nonlinearity!r}; valid: 'tanh', 'relu'")
        super().__init__(
            "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU",
            input_size,
            hidden_size,
            num_layers,
            bias,
            batch_first,
            dropout,
            bidirectional,
            0,
            device,
            dtype,
        )
        self.nonlinearity = nonlinearity

    def extra_repr(self) -> str:
        text = super().extra_repr()
        return text + (f", nonlinearity={self.nonlinearity}" if self.nonlinearity != "tanh" else "")


class LSTM(RNNBase):
    """Long short-term memory; returns (output, (h_n, c_n)). Gates i, f, g, o stacked in that order as torch's."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(
            "LSTM",
            input_size,
            hidden_size,
            num_layers,
            bias,
            batch_first,
            dropout,
            bidirectional,
            proj_size,
            device,
            dtype,
        )


class GRU(RNNBase):
    """Gated recurrent unit; returns (output, h_n). Gates r, z, n stacked in that order as torch's."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(
            "GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, 0, device, dtype
        )


class RNNCellBase(Module):
    """One step of a recurrent layer: parameters weight_ih, weight_hh, bias_ih, bias_hh."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, bias: bool, device: Any, dtype: Any) -> None:
        super().__init__()
        self.mode, self.input_size, self.hidden_size, self.bias = mode, input_size, hidden_size, bias
        gate_size = GATES[mode] * hidden_size
        self.weight_ih = empty_parameter((gate_size, input_size), device, dtype)
        self.weight_hh = empty_parameter((gate_size, hidden_size), device, dtype)
        if bias:
            self.bias_ih = empty_parameter((gate_size,), device, dtype)
            self.bias_hh = empty_parameter((gate_size,), device, dtype)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        bound = 1.0 / math.sqrt(hidden_size)
        for parameter in self.parameters():
            init.uniform_(parameter, -bound, bound)

    def _step(self, input: Tensor, hx: Any) -> Any:  # noqa: A002
        name = type(self).__name__
        if input.ndim not in (1, 2) or input.shape[-1] != self.input_size:
            raise ShapeError(
                f"{name}: expected input of shape (N, {self.input_size}) or ({self.input_size},), got {input.shape}"
            )
        batched = input.ndim == 2
        x = input if batched else input.unsqueeze(0)
        zeros = em.zeros(x.shape[0], self.hidden_size, dtype=x.dtype, device=x.device)
        if self.mode == "LSTM":
            hidden, cell = hx if hx is not None else (zeros, zeros)
            if not batched and hx is not None:
                hidden, cell = hidden.unsqueeze(0), cell.unsqueeze(0)
        else:
            hidden = hx if hx is not None else zeros
            if not batched and hx is not None:
                hidden = hidden.unsqueeze(0)
            cell = None
        projected = F.linear(x, self.weight_ih, self.bias_ih)
        new_hidden, new_cell, _ = _cell_step(self.mode, projected, hidden, cell, self.weight_hh, self.bias_hh, None)
        if not batched:
            new_hidden = new_hidden.squeeze(0)
            new_cell = new_cell.squeeze(0) if new_cell is not None else None
        return (new_hidden, new_cell) if self.mode == "LSTM" else new_hidden

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            text += f", bias={self.bias}"
        nonlinearity = getattr(self, "nonlinearity", "tanh")
        if nonlinearity != "tanh":
            text += f", nonlinearity={nonlinearity}"
        return text


class RNNCell(RNNCellBase):
    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        nonlinearity: str = "tanh",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNNCell: unknown nonlinearity {nonlinearity!r}; valid: 'tanh', 'relu'")
        super().__init__(
            "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size, hidden_size, bias, device, dtype
        )
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:  # noqa: A002
        return self._step(input, hx)


class LSTMCell(RNNCellBase):
    def __init__(
        self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__("LSTM", input_size, hidden_size, bias, device, dtype)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:  # noqa: A002
        return self._step(input, hx)


class GRUCell(RNNCellBase):
    def __init__(
        self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__("GRU", input_size, hidden_size, bias, device, dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:  # noqa: A002
        return self._step(input, hx)
