"""RNN, LSTM and GRU against torch (outputs, final states, input and parameter gradients) in the configurations the
layers branch on, and the kernels one time step costs (a structural count: the per-step kernels are pinned)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.utils.rnn as torch_rnn

import ember as em
import ember.nn as enn
import ember.nn.utils.rnn as ember_rnn
from ember.backends.c import VECTOR_OPS, CRenderer
from ember.capabilities import DeviceInfo
from ember.core.ops import REDUCE_OPS
from ember.core.walk import post_order
from ember.ir.opt import build_kernel_ir
from tests.helpers import assert_close, scheduled_launches

# (kind, keyword arguments): one and two layers, both directions, batch first, without bias, both nonlinearities
CONFIGURATIONS = [
    ("LSTM", {"bias": False, "batch_first": True}),
    ("LSTM", {"num_layers": 2, "bidirectional": True}),
    ("GRU", {"num_layers": 2, "bidirectional": True, "bias": False}),
    ("GRU", {"batch_first": True}),
    ("RNN", {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    ("RNN", {"nonlinearity": "relu", "bias": False}),
]
LENGTHS = [5, 2, 4]  # a packed batch: unsorted, of three lengths


def _pair(kind: str, arguments: dict[str, Any], device: str) -> tuple[Any, Any]:
    torch.manual_seed(0)
    torch_module = getattr(torch.nn, kind)(3, 5, **arguments)
    module = getattr(enn, kind)(3, 5, **arguments).to(device)
    module.load_state_dict(torch_module.state_dict())
    return module, torch_module


def _compare_gradients(module: Any, torch_module: Any, inputs: list[Any], torch_inputs: list[Any]) -> None:
    for ember_input, torch_input in zip(inputs, torch_inputs):
        assert_close(ember_input.grad, torch_input.grad, atol=1e-4)
    for (name, torch_parameter), parameter in zip(torch_module.named_parameters(), module.parameters()):
        assert torch_parameter.grad is not None, name
        assert_close(parameter.grad, torch_parameter.grad, atol=1e-4)


@pytest.mark.parametrize(("kind", "arguments"), CONFIGURATIONS, ids=lambda value: str(value))
def test_recurrent_layer_matches_torch(kind: str, arguments: dict[str, Any], device: str) -> None:
    module, torch_module = _pair(kind, arguments, device)
    directions = 2 if arguments.get("bidirectional") else 1
    generator = np.random.default_rng(1)
    shape = (3, 4, 3) if arguments.get("batch_first") else (4, 3, 3)
    array = (generator.normal(size=shape) * 3).astype(np.float32)  # large enough to saturate some gates
    state = generator.normal(size=(arguments.get("num_layers", 1) * directions, 3, 5)).astype(np.float32)
    inputs = [em.tensor(array, device=device, requires_grad=True), em.tensor(state, device=device, requires_grad=True)]
    torch_inputs = [torch.tensor(array, requires_grad=True), torch.tensor(state, requires_grad=True)]
    if kind == "LSTM":
        inputs.append(em.tensor(state * 0.5, device=device, requires_grad=True))
        torch_inputs.append(torch.tensor(state * 0.5, requires_grad=True))
        output, (hidden, cell) = module(inputs[0], (inputs[1], inputs[2]))
        torch_output, (torch_hidden, torch_cell) = torch_module(torch_inputs[0], (torch_inputs[1], torch_inputs[2]))
        finals, torch_finals = [hidden, cell], [torch_hidden, torch_cell]
    else:
        output, hidden = module(inputs[0], inputs[1])
        torch_output, torch_hidden = torch_module(torch_inputs[0], torch_inputs[1])
        finals, torch_finals = [hidden], [torch_hidden]
    assert_close([output, *finals], [torch_output, *torch_finals], atol=1e-5)
    weights = generator.normal(size=tuple(torch_output.shape)).astype(np.float32)
    ((output * em.tensor(weights, device=device)).sum() + sum((final * final).sum() for final in finals)).backward()
    ((torch_output * torch.tensor(weights)).sum() + sum((final * final).sum() for final in torch_finals)).backward()
    _compare_gradients(module, torch_module, inputs, torch_inputs)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_packed_batch_without_bias_matches_torch(kind: str, device: str) -> None:
    module, torch_module = _pair(kind, {"bias": False}, device)
    array = np.random.default_rng(2).normal(size=(len(LENGTHS), 5, 3)).astype(np.float32)
    inputs, torch_inputs = [em.tensor(array, device=device, requires_grad=True)], [torch.tensor(array, requires_grad=True)]
    packed = ember_rnn.pack_padded_sequence(inputs[0], LENGTHS, batch_first=True, enforce_sorted=False)
    torch_packed = torch_rnn.pack_padded_sequence(torch_inputs[0], LENGTHS, batch_first=True, enforce_sorted=False)
    output, state = module(packed)
    torch_output, torch_state = torch_module(torch_packed)
    finals = list(state) if kind == "LSTM" else [state]
    torch_finals = list(torch_state) if kind == "LSTM" else [torch_state]
    assert_close([output.data, *finals], [torch_output.data, *torch_finals], atol=1e-5)
    (output.data.sum() + sum((final * final).sum() for final in finals)).backward()
    (torch_output.data.sum() + sum((final * final).sum() for final in torch_finals)).backward()
    _compare_gradients(module, torch_module, inputs, torch_inputs)


def _kernels(kind: str, steps: int, input_size: int = 3, hidden: int = 5, batch: int = 2) -> tuple[int, int]:
    """Kernels that forward and backward of a one-layer layer over `steps` time steps launch (c device), and how many
    of them are different kernels (to compile)."""
    module = getattr(enn, kind)(input_size, hidden).to("c")
    sequence = em.ones(steps, batch, input_size, device="c", requires_grad=True)
    em.realize(sequence, *module.parameters())
    with em.profile() as record:
        output, _ = module(sequence)
        output.sum().backward()
        em.realize(sequence.grad, *(parameter.grad for parameter in module.parameters()))
    return len(record.kernels), len({kernel.name for kernel in record.kernels})


# Kernels per time step, forward + backward, at a tiny size and at the char models' (benchmarks/programs.py: input 64,
# hidden 128, batch 64), where the kernelizer stores a GRU's reset gate of its own (the new gate's part of the
# activation kernel reads it padded). torch launches a gemm and a fused pointwise kernel per step each way (4);
# ember's kernels have one output each. LSTM (one recorded step for the layer, core/recurrent_steps.py): forward the
# matmul by W_hh, the activated gates (adding the step's rows of the input projection, read in place), the cell state
# with its tanh (one kernel of both) and the hidden state; backward the cell state's gradient with the output gate's
# (one kernel, reading the step's rows of the output's gradient), the gates' gradient and its matmul by W_hh (before:
# 9, the cell's tanh, a copy of the output gradient's rows and the hidden state's gradient kernels of their own). GRU
# (one recorded step too): forward the matmul by W_hh (+ b_hh), the reset and update gates joined to the step's rows
# of the projection's new-gate part, the new gate joined to the hidden state; backward the hidden state's gradient
# (reading the step's rows of the output's gradient), the projection's, the hidden product's and its matmul by W_hh
# (before: 7 tiny, 9 real). RNN: a copy of the step's rows of the input projection, the matmul by W_hh plus that
# copy, the hidden state; backward a copy of the step's share of the output's gradient, the hidden state's gradient
# (the matmul by W_hh fused in) and the gates' before activation. The weight gradients of all steps are one kernel each, whatever the length: W_hh's is one matmul of
# the stacked gates' gradients by the stacked hidden states, not a sum of a matmul per step.
KERNELS_PER_STEP = {"LSTM": (7, 7), "GRU": (7, 7), "RNN": (6, 6)}
REAL_SIZE = (64, 128, 64)


@pytest.mark.parametrize("real", [False, True], ids=["tiny", "real"])
@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_kernels_per_time_step(kind: str, real: bool) -> None:
    sizes = REAL_SIZE if real else (3, 5, 2)
    (short, short_distinct), (long, long_distinct) = _kernels(kind, 3, *sizes), _kernels(kind, 6, *sizes)
    assert long - short == 3 * KERNELS_PER_STEP[kind][real], (short, long)
    # every step runs the same kernels: the ones reading its rows of the input projection (LSTM: the activation;
    # others: a copy) or of the output's gradient read a view of those rows (scheduler/input_views.py; c views at
    # any element, so the tiny size's 40-byte rows too): no kernel to compile for a longer sequence (before: two new
    # kernels per step)
    assert long_distinct == short_distinct, (short_distinct, long_distinct)


def _nodes_per_step(kind: str, input_size: int = 64, hidden: int = 128, batch: int = 64) -> float:
    """Graph nodes that one more time step of a layer's forward records (its lazy graph before anything runs, the
    copies of templates expanded as the scheduler expands them)."""
    from ember.core.graph_templates import expand_in_place


    def nodes(steps: int) -> int:
        module = getattr(enn, kind)(input_size, hidden).to("c")
        sequence = em.ones(steps, batch, input_size, device="c", requires_grad=True)
        em.realize(sequence, *module.parameters())
        output, _ = module(sequence)
        expand_in_place([output.node])  # (the copied graph is one TEMPLATE node until scheduled: count its nodes)
        return len(post_order([output.node], lambda node: node.srcs))

    return (nodes(6) - nodes(3)) / 3


# Nodes one time step's forward records, at the char models' size (a step's Python cost: each node is a Tensor op
# recorded, then walked by the schedule's key, placement and kernelizer, and its gradient by backward). LSTM and GRU
# copy them from the layer's graph template (core/recurrent_steps.py: no Tensor op per step). LSTM: the product by
# W_hh (broadcast, multiply, sum, stored), the gates (slice of the projection, add, reshape, an activation of six ops
# over all four gates, stored), four gate slices, the cell state, its tanh joined to it (stored), their slices, the
# hidden state, and the output's join. GRU: the product (+ b_hh, stored), the reset and update gates (slices, add, a
# sigmoid of five ops) joined to the projection's new-gate rows (stored), their slices, the new gate (tanh of six
# ops) joined to the hidden state (stored), a slice, and the output's join. RNN: the loop's slice, the product, the
# hidden state and its copy. Before: LSTM 69, GRU 77, RNN 79 (per-gate activations with their own constants,
# torch's precise tanh for RNN); LSTM 40 and GRU 46 recorded op by op.
NODES_PER_STEP = {"LSTM": 38, "GRU": 45, "RNN": 19}


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_nodes_per_time_step(kind: str) -> None:
    assert _nodes_per_step(kind) == NODES_PER_STEP[kind]


def _tensor_ops_of_a_training_pass(kind: str, steps: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """Tensor ops (Tensor._apply) that a second forward and backward of a one-layer LSTM or GRU over `steps`
    records."""
    from ember.core.tensor import Tensor

    module = getattr(enn, kind)(8, 16).to("c")
    calls = 0
    apply = Tensor._apply

    def counted(self: Tensor, *arguments: Any, **keywords: Any) -> Any:
        nonlocal calls
        calls += 1
        return apply(self, *arguments, **keywords)

    for counting in (False, True):  # the first pass records the layer's templates
        sequence = em.ones(steps, 4, 8, device="c", requires_grad=True)
        if counting:
            monkeypatch.setattr(Tensor, "_apply", counted)
        output, state = module(sequence)
        finals = state if kind == "LSTM" else (state,)
        (output.sum() + sum(final.sum() for final in finals)).backward()
    monkeypatch.setattr(Tensor, "_apply", apply)
    return calls


# An LSTM or GRU layer's steps are one recorded step whose forward and backward graphs are copied from templates: a
# longer sequence records no more Tensor ops (before: LSTM 82 per time step, forward and backward, each an autograd
# record)
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_time_steps_record_no_tensor_ops(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _tensor_ops_of_a_training_pass(kind, 6, monkeypatch) == _tensor_ops_of_a_training_pass(
        kind, 3, monkeypatch)


def _views_linked_per_step(kind: str, monkeypatch: pytest.MonkeyPatch) -> float:
    """Views that one more time step of a layer's forward links to a storage (core/views.py's link_view: a walk of
    the view's movement steps and a simulation of torch's strides, for in-place writes through a user's view)."""
    import ember.core.views as views

    calls = 0
    link_view = views.link_view

    def counted(*arguments: Any, **keywords: Any) -> Any:
        nonlocal calls
        calls += 1
        return link_view(*arguments, **keywords)

    monkeypatch.setattr(views, "link_view", counted)

    def linked(steps: int) -> int:
        nonlocal calls
        module = getattr(enn, kind)(3, 5).to("c")
        sequence = em.ones(steps, 2, 3, device="c", requires_grad=True)
        calls = 0
        module(sequence)
        return calls

    return (linked(6) - linked(3)) / 3


# A time step's gates, their slices and reshapes are the layer's own intermediates, never a view the user holds, so
# a step links none (the layer's output and final states are new tensors); before: 17 views per 3 steps (LSTM), 20 (GRU).
@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_time_steps_link_no_views(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _views_linked_per_step(kind, monkeypatch) == 0


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_saturated_gates_match_torch(kind: str, device: str) -> None:
    """Inputs that drive the gates far past +-44 (where the gates' exp2 is clamped to stay finite) and NaN in one
    sequence: values and gradients as torch's (sigmoid and tanh saturate to 0, 1, -1; NaN propagates)."""
    torch.manual_seed(0)
    torch_module = getattr(torch.nn, kind)(3, 5)
    module = getattr(enn, kind)(3, 5).to(device)
    module.load_state_dict(torch_module.state_dict())
    array = (np.random.default_rng(5).normal(size=(4, 3, 3)) * 200).astype(np.float32)
    array[2, 2, 1] = np.nan
    sequence, torch_sequence = em.tensor(array, device=device, requires_grad=True), torch.tensor(array, requires_grad=True)
    output, _ = module(sequence)
    torch_output, _ = torch_module(torch_sequence)
    assert_close(output, torch_output, atol=1e-5)
    output[:, :2].sum().backward()
    torch_output[:, :2].sum().backward()
    assert_close(sequence.grad[:, :2], torch_sequence.grad[:, :2], atol=1e-4)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_gate_kernels_are_vectorized(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A time step's kernels over its gates (the activation, the gates' gradient; GRU: the hidden matmul's) lowered
    for the C backend's 8-lane vectors store vectors: the gates are laid out (batch, gate, size), so what tells them
    apart is a condition on the gate axis alone (laid out (batch, gates * size), each lane had a condition of its
    own, and these kernels ran as scalar loops, ~5x slower)."""
    monkeypatch.setenv("EMBER_NOOPT", "0")
    batch, size, gates = 64, 128, 4 if kind == "LSTM" else 3
    layer = getattr(enn, kind)(32, size).to("dummy:0")

    def forward_and_backward() -> None:
        output, _ = layer(em.tensor(np.zeros((2, batch, 32), np.float32), device="dummy:0", requires_grad=True))
        output.sum().backward()

    launches = scheduled_launches(forward_and_backward, monkeypatch)
    gate_kernels = [launch.kernel for launch in launches if launch.kernel.output.shape[-2:] == (gates, size)
                    and not any(step.op in REDUCE_OPS for step in launch.kernel.steps)]
    assert len(gate_kernels) >= 3, [launch.kernel.output.shape for launch in launches]
    capabilities = DeviceInfo(compute_units=2, preferred_vector_width=8, vector_ops=VECTOR_OPS)
    for number, kernel in enumerate(gate_kernels):
        source = CRenderer().render(build_kernel_ir(kernel, f"gates{number}", capabilities))
        assert "*(ember_float32x8_u*)(data0+" in source and "data0[gid] =" not in source, source


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_long_sequence_at_a_real_size_matches_torch(kind: str, device: str) -> None:
    """200 time steps, hidden 256: the per-sequence weight gradients (one matmul of all steps' gates' gradients by
    the stacked hidden states) and the states carried over many steps, against torch."""
    torch.manual_seed(0)
    torch_module = getattr(torch.nn, kind)(8, 256)
    module = getattr(enn, kind)(8, 256).to(device)
    module.load_state_dict(torch_module.state_dict())
    generator = np.random.default_rng(3)
    array = generator.normal(size=(200, 3, 8)).astype(np.float32)
    weights = generator.normal(size=(200, 3, 256)).astype(np.float32)
    sequence, torch_sequence = em.tensor(array, device=device, requires_grad=True), torch.tensor(array, requires_grad=True)
    output, _ = module(sequence)
    torch_output, _ = torch_module(torch_sequence)
    assert_close(output, torch_output, atol=1e-5)
    (output * em.tensor(weights, device=device)).sum().backward()
    (torch_output * torch.tensor(weights)).sum().backward()
    assert_close(sequence.grad, torch_sequence.grad, atol=1e-4, rtol=1e-3)
    for (name, torch_parameter), parameter in zip(torch_module.named_parameters(), module.parameters()):
        assert torch_parameter.grad is not None, name
        assert_close(parameter.grad, torch_parameter.grad, atol=1e-3, rtol=1e-3)


def test_double_backward_through_a_layer_raises() -> None:
    module = enn.LSTM(3, 5).to("c")
    sequence = em.ones(4, 2, 3, device="c", requires_grad=True)
    output, _ = module(sequence)
    with pytest.raises(NotImplementedError, match="create_graph"):
        em.autograd.grad(output.sum(), module.weight_hh_l0, create_graph=True)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_float16_layer_matches_torch_in_float32(kind: str) -> None:
    """A float16 layer computes its gates in float32 (the activations' exp2 needs float32's range) and stores float16:
    values and gradients within float16's rounding of torch's float32 ones."""
    torch.manual_seed(0)
    torch_module = getattr(torch.nn, kind)(4, 8)
    module = getattr(enn, kind)(4, 8).to("c")
    module.load_state_dict(torch_module.state_dict())
    module = module.to(dtype=em.float16)
    array = np.random.default_rng(0).normal(size=(5, 3, 4)).astype(np.float32)
    sequence = em.tensor(array, dtype=em.float16, device="c", requires_grad=True)
    torch_sequence = torch.tensor(array, requires_grad=True)
    output, _ = module(sequence)
    torch_output, _ = torch_module(torch_sequence)
    assert output.dtype == em.float16
    assert_close(output.float(), torch_output, atol=2e-3, rtol=2e-3)
    output.float().sum().backward()
    torch_output.sum().backward()
    assert sequence.grad.dtype == em.float16
    assert_close(sequence.grad.float(), torch_sequence.grad, atol=1e-2, rtol=1e-2)
    assert_close(module.weight_hh_l0.grad.float(), torch_module.weight_hh_l0.grad, atol=3e-2, rtol=1e-2)
