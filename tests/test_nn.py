"""ember.nn layers against torch.nn: same state_dict keys and shapes, and after loading torch's state_dict the same
outputs, buffers (running statistics) and gradients; plus the Module API, containers, init and reprs."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
import ember.nn as enn
from tests.helpers import assert_close

torch_nn = torch.nn


@dataclass
class Layer:
    """A layer built the same way from torch.nn and ember.nn, and how to feed it."""

    name: str
    make: Callable[[Any], Any]  # make(nn) -> module, for nn in (torch.nn, ember.nn)
    inputs: list[Any]  # shapes of float inputs, or numpy arrays used as they are
    call: Callable[..., Any] = field(default=lambda module, *inputs: module(*inputs))
    train: bool = False
    grad: bool = True
    atol: float = 1e-4


def ints(shape: tuple[int, ...], high: int, seed: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, high, size=shape).astype(np.int64)


CAUSAL = np.triu(np.ones((4, 4), dtype=bool), k=1)
PADDING = np.array([[False, False, False, True, True], [False] * 5])

LAYERS = [
    Layer("linear", lambda nn: nn.Linear(5, 3), [(4, 5)]),
    Layer("linear_3d_no_bias", lambda nn: nn.Linear(5, 3, bias=False), [(2, 4, 5)]),
    Layer("bilinear", lambda nn: nn.Bilinear(3, 4, 2), [(5, 3), (5, 4)]),
    Layer("conv1d_stride_groups", lambda nn: nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2), [(2, 4, 9)]),
    Layer("conv2d", lambda nn: nn.Conv2d(3, 4, 3, padding=1), [(2, 3, 6, 6)]),
    Layer(
        "conv2d_reflect_dilation",
        lambda nn: nn.Conv2d(2, 3, (3, 2), dilation=(1, 2), padding=(1, 2), padding_mode="reflect", bias=False),
        [(1, 2, 5, 7)],
    ),
    Layer(
        "conv2d_same_circular", lambda nn: nn.Conv2d(2, 2, 4, padding="same", padding_mode="circular"), [(1, 2, 5, 5)]
    ),
    Layer("conv1d_valid_replicate", lambda nn: nn.Conv1d(2, 2, 3, padding=2, padding_mode="replicate"), [(2, 6)]),
    Layer("batchnorm1d_train", lambda nn: nn.BatchNorm1d(3), [(4, 3)], train=True),
    Layer("batchnorm1d_3d_eval", lambda nn: nn.BatchNorm1d(3, affine=False), [(2, 3, 4)]),
    Layer("batchnorm2d_cumulative", lambda nn: nn.BatchNorm2d(3, momentum=None), [(2, 3, 4, 4)], train=True),
    Layer("batchnorm2d_no_stats", lambda nn: nn.BatchNorm2d(2, track_running_stats=False), [(2, 2, 3, 3)]),
    Layer("layernorm", lambda nn: nn.LayerNorm((3, 4)), [(2, 3, 4)]),
    Layer("layernorm_no_bias", lambda nn: nn.LayerNorm(4, bias=False, eps=1e-3), [(3, 4)]),
    Layer("rmsnorm", lambda nn: nn.RMSNorm(4), [(2, 3, 4)]),
    Layer("groupnorm", lambda nn: nn.GroupNorm(2, 4), [(2, 4, 3, 3)]),
    Layer("embedding", lambda nn: nn.Embedding(7, 3, padding_idx=2), [ints((2, 5), 7)]),
    Layer("dropout_eval", lambda nn: nn.Sequential(nn.Dropout(0.5), nn.Dropout1d(0.3), nn.Linear(4, 2)), [(3, 2, 4)]),
    Layer("pooling", lambda nn: nn.Sequential(nn.MaxPool2d(2), nn.AvgPool2d(3, 2, 1)), [(1, 2, 7, 7)]),
    Layer(
        "adaptive_pooling",
        lambda nn: nn.Sequential(nn.AdaptiveAvgPool2d((2, 3)), nn.Flatten(), nn.Unflatten(1, (3, 4))),
        [(1, 2, 5, 7)],
    ),
    Layer(
        "pooling_1d",
        lambda nn: nn.Sequential(nn.MaxPool1d(3, 2), nn.AvgPool1d(2), nn.AdaptiveAvgPool1d(2)),
        [(2, 3, 11)],
    ),
    Layer(
        "activations",
        lambda nn: nn.Sequential(
            nn.ReLU(),
            nn.GELU("tanh"),
            nn.SiLU(),
            nn.ELU(0.5),
            nn.LeakyReLU(0.2),
            nn.Softplus(2.0),
            nn.Hardswish(),
            nn.Mish(),
            nn.Linear(5, 5),
            nn.Tanh(),
            nn.GELU(),
            nn.CELU(),
            nn.SELU(),
            nn.Hardtanh(-0.5, 0.5),
            nn.Sigmoid(),
            nn.Softsign(),
            nn.LogSigmoid(),
            nn.Hardsigmoid(),
            nn.ReLU6(),
            nn.Tanhshrink(),
            nn.Softshrink(0.3),
            nn.Threshold(0.1, -1.0),
            nn.Softmax(1),
            nn.LogSoftmax(-1),
            nn.Softmin(0),
            nn.Identity(7),
        ),
        [(3, 5)],
    ),
    Layer("prelu_glu", lambda nn: nn.Sequential(nn.PReLU(4), nn.GLU(1), nn.PReLU()), [(2, 4, 3)]),
    Layer("mha", lambda nn: nn.MultiheadAttention(8, 2), [(5, 2, 8), (6, 2, 8), (6, 2, 8)]),
    Layer(
        "mha_kv_dims_bias_kv_zero_attn",
        lambda nn: nn.MultiheadAttention(8, 2, batch_first=True, kdim=3, vdim=5, add_bias_kv=True, add_zero_attn=True),
        [(2, 5, 8), (2, 6, 3), (2, 6, 5)],
    ),
    Layer(
        "mha_masks_per_head",
        lambda nn: nn.MultiheadAttention(4, 2, batch_first=True, bias=False),
        [(2, 4, 4), (2, 5, 4), (2, 5, 4), np.random.default_rng(3).normal(size=(4, 5)).astype(np.float32), PADDING],
        call=lambda m, q, k, v, mask, padding: m(
            q, k, v, attn_mask=mask, key_padding_mask=padding, average_attn_weights=False
        ),
    ),
    Layer(
        "mha_causal_unbatched_self",
        lambda nn: nn.MultiheadAttention(6, 3),
        [(4, 6), CAUSAL],
        call=lambda m, x, mask: m(x, x, x, attn_mask=mask, need_weights=False, is_causal=True),
    ),
    Layer("encoder_layer", lambda nn: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0), [(5, 2, 8)]),
    Layer(
        "encoder_norm_first_gelu",
        lambda nn: nn.TransformerEncoderLayer(
            8, 2, 16, dropout=0.0, norm_first=True, batch_first=True, activation="gelu"
        ),
        [(2, 5, 8), PADDING],
        call=lambda m, x, padding: m(x, src_key_padding_mask=padding),
    ),
    Layer(
        "encoder_stack",
        lambda nn: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0), 2, norm=nn.LayerNorm(4), enable_nested_tensor=False
        ),
        [(3, 2, 4)],
        grad=False,
    ),
    Layer("lstm_bidirectional_2_layers", lambda nn: nn.LSTM(3, 4, 2, bidirectional=True), [(2, 2, 3)]),
    Layer(
        "lstm_proj_batch_first_state",
        lambda nn: nn.LSTM(3, 4, batch_first=True, proj_size=2),
        [(2, 3, 3), (1, 2, 2), (1, 2, 4)],
        call=lambda m, x, h, c: m(x, (h, c)),
    ),
    Layer("gru_2_layers", lambda nn: nn.GRU(3, 4, 2, batch_first=True), [(2, 3, 3)]),
    Layer("rnn_relu_unbatched", lambda nn: nn.RNN(3, 4, nonlinearity="relu"), [(3, 3), (1, 4)]),
    Layer(
        "cells",
        lambda nn: nn.ModuleList([nn.LSTMCell(3, 4), nn.GRUCell(3, 4), nn.RNNCell(3, 4)]),
        [(2, 3)],
        call=lambda m, x: (m[0](x), m[1](x), m[2](x)),
    ),
    Layer(
        "losses",
        lambda nn: nn.ModuleList(
            [
                nn.MSELoss(),
                nn.L1Loss(reduction="sum"),
                nn.HuberLoss(delta=0.5),
                nn.SmoothL1Loss(beta=0.5),
                nn.BCEWithLogitsLoss(),
                nn.KLDivLoss("batchmean"),
            ]
        ),
        [(3, 4), np.random.default_rng(1).uniform(0.1, 0.9, (3, 4)).astype(np.float32)],
        call=lambda m, x, y: tuple(loss(x, y) for loss in m),
    ),
    Layer(
        "classification_losses",
        lambda nn: nn.ModuleList(
            [
                nn.CrossEntropyLoss(label_smoothing=0.1),
                nn.NLLLoss(ignore_index=1),
                nn.CrossEntropyLoss(reduction="none"),
            ]
        ),
        [(5, 4), ints((5,), 4)],
        call=lambda m, x, y: (m[0](x, y), m[1](x.log_softmax(1), y), m[2](x, y)),
    ),
]


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [item for part in value for item in _flatten(part)]
    return [] if value is None else [value]


def _arrays(layer: Layer) -> list[np.ndarray]:
    generator = np.random.default_rng(7)
    return [
        item if isinstance(item, np.ndarray) else generator.normal(size=item).astype(np.float32)
        for item in layer.inputs
    ]


@pytest.mark.parametrize("layer", LAYERS, ids=[layer.name for layer in LAYERS])
def test_layer_matches_torch(layer: Layer, device: str) -> None:
    torch.manual_seed(0)
    torch_module, ember_module = layer.make(torch_nn), layer.make(enn).to(device)
    torch_state, ember_state = torch_module.state_dict(), ember_module.state_dict()
    assert list(ember_state) == list(torch_state)
    for key, value in torch_state.items():
        assert tuple(ember_state[key].shape) == tuple(value.shape), key
    ember_module.load_state_dict(torch_state)
    torch_module.train(layer.train), ember_module.train(layer.train)

    arrays = _arrays(layer)
    differentiable = [layer.grad and array.dtype == np.float32 for array in arrays]
    torch_inputs = [torch.tensor(array, requires_grad=wants) for array, wants in zip(arrays, differentiable)]
    ember_inputs = [
        em.tensor(array, device=device, requires_grad=wants) for array, wants in zip(arrays, differentiable)
    ]
    torch_outputs = _flatten(layer.call(torch_module, *torch_inputs))
    ember_outputs = _flatten(layer.call(ember_module, *ember_inputs))
    assert_close(ember_outputs, torch_outputs, atol=layer.atol, rtol=1e-3)
    for name, buffer in torch_module.named_buffers():  # running statistics after a training-mode forward
        assert_close(ember_module.get_buffer(name), buffer, atol=1e-5)
    if not layer.grad:
        return
    generator = np.random.default_rng(11)
    weights = [generator.normal(size=tuple(output.shape)).astype(np.float32) for output in torch_outputs]
    sum(((output * torch.tensor(weight)).sum() for output, weight in zip(torch_outputs, weights))).backward()
    sum(
        ((output * em.tensor(weight, device=device)).sum() for output, weight in zip(ember_outputs, weights))
    ).backward()
    for (name, torch_parameter), ember_parameter in zip(torch_module.named_parameters(), ember_module.parameters()):
        assert torch_parameter.grad is not None, name
        assert_close(ember_parameter.grad, torch_parameter.grad, atol=1e-3, rtol=1e-3)
    for ember_input, torch_input in zip(ember_inputs, torch_inputs):
        if torch_input.requires_grad:
            assert_close(ember_input.grad, torch_input.grad, atol=1e-3, rtol=1e-3)


def test_batchnorm_running_statistics_over_steps_and_eval(device: str) -> None:
    torch_module, ember_module = torch_nn.BatchNorm2d(3, momentum=0.3), enn.BatchNorm2d(3, momentum=0.3).to(device)
    generator = np.random.default_rng(0)
    for _ in range(3):
        batch = generator.normal(2.0, 3.0, size=(4, 3, 2, 2)).astype(np.float32)
        assert_close(ember_module(em.tensor(batch, device=device)), torch_module(torch.tensor(batch)), atol=1e-4)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert_close(getattr(ember_module, name), getattr(torch_module, name), atol=1e-4)
    ember_module.eval(), torch_module.eval()
    batch = generator.normal(size=(2, 3, 2, 2)).astype(np.float32)
    assert_close(ember_module(em.tensor(batch, device=device)), torch_module(torch.tensor(batch)), atol=1e-4)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        enn.BatchNorm1d(3).to(device)(em.ones(1, 3, device=device))
    with pytest.raises(em.ShapeError, match="4-d input"):
        enn.BatchNorm2d(3)(em.ones(2, 3))
    with pytest.raises(em.ShapeError, match="expected 3"):
        enn.BatchNorm1d(3)(em.ones(2, 4))


def test_dropout_in_training_and_eval(device: str) -> None:
    layer = enn.Dropout(0.25)
    values = em.ones(200, 50, device=device)
    dropped = layer(values).numpy()
    kept = dropped != 0
    assert 0.70 < kept.mean() < 0.80
    np.testing.assert_allclose(dropped[kept], 1 / 0.75, rtol=1e-6)
    channels = enn.Dropout2d(0.5)(em.ones(4, 30, 3, 3, device=device)).numpy()
    assert all(len(np.unique(channel)) == 1 for channel in channels.reshape(120, 9))  # whole channels
    layer.eval()
    assert_close(layer(values), torch.ones(200, 50))
    with pytest.raises(ValueError, match="between 0 and 1"):
        enn.Dropout(1.5)


# ---- the Module API --------------------------------------------------------------------------------------------


class Block(enn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = enn.Linear(3, 4)
        self.norm = enn.BatchNorm1d(4)
        self.register_buffer("scale", em.ones(4))
        self.register_buffer("cache", em.zeros(2), persistent=False)
        self.scalar = enn.Parameter(em.tensor(0.5))
        self.shared = self.linear  # registered twice: listed once

    def forward(self, x: em.Tensor) -> em.Tensor:
        return self.norm(self.linear(x)) * self.scale * self.scalar


def test_module_registration_iteration_and_state_dict() -> None:
    model = enn.Sequential(Block(), enn.ReLU(), enn.Linear(4, 2))
    names = [name for name, _ in model.named_parameters()]
    assert names == [
        "0.scalar",
        "0.linear.weight",
        "0.linear.bias",
        "0.norm.weight",
        "0.norm.bias",
        "2.weight",
        "2.bias",
    ]
    assert [name for name, _ in model.named_buffers()] == [
        "0.scale",
        "0.cache",
        "0.norm.running_mean",
        "0.norm.running_var",
        "0.norm.num_batches_tracked",
    ]
    assert list(model.state_dict()) == [
        "0.scalar",
        "0.scale",
        "0.linear.weight",
        "0.linear.bias",
        "0.norm.weight",
        "0.norm.bias",
        "0.norm.running_mean",
        "0.norm.running_var",
        "0.norm.num_batches_tracked",
        "0.shared.weight",
        "0.shared.bias",
        "2.weight",
        "2.bias",
    ]  # as torch: a module registered twice appears under both names
    assert [name for name, _ in model.named_modules()] == ["", "0", "0.linear", "0.norm", "1", "2"]
    assert [type(child).__name__ for child in model.children()] == ["Block", "ReLU", "Linear"]
    assert model.get_submodule("0.norm") is model[0].norm
    assert model.get_parameter("0.linear.weight") is model[0].linear.weight
    assert len(list(model.parameters(recurse=False))) == 0
    model.eval()
    assert not any(module.training for module in model.modules())
    model.train()
    assert all(module.training for module in model.modules())
    model.requires_grad_(False)
    assert not any(parameter.requires_grad for parameter in model.parameters())
    visited = []
    model.apply(lambda module: visited.append(type(module).__name__))
    assert visited == ["Linear", "BatchNorm1d", "Block", "ReLU", "Linear", "Sequential"]
    assert "linear" in dir(model[0]) and "scale" in dir(model[0])
    del model[0].scale
    assert "0.scale" not in model.state_dict()


def test_module_assignment_errors() -> None:
    block = Block()
    with pytest.raises(TypeError, match="cannot assign 'Tensor' as parameter 'scalar'"):
        block.scalar = em.ones(1)
    with pytest.raises(TypeError, match="as child module 'linear'"):
        block.linear = em.ones(1)
    with pytest.raises(TypeError, match="as buffer 'scale'"):
        block.scale = 3
    with pytest.raises(KeyError, match="attribute 'linear' already exists"):
        block.register_buffer("linear", em.ones(1))
    with pytest.raises(KeyError, match="cannot be empty or contain"):
        block.register_parameter("a.b", None)
    with pytest.raises(AttributeError, match="has no attribute 'missing'"):
        block.missing  # noqa: B018
    with pytest.raises(AttributeError, match="call super"):

        class Forgetful(enn.Module):
            def __init__(self) -> None:
                self.weight = enn.Parameter(em.ones(1))

        Forgetful()
    with pytest.raises(NotImplementedError, match='missing the required "forward"'):
        enn.Module()(1)
    block.scalar = None  # None keeps the name declared, as torch
    assert "scalar" not in block.state_dict()


def test_load_state_dict_strict_and_errors() -> None:
    torch_model = torch_nn.Sequential(torch_nn.Linear(3, 4), torch_nn.BatchNorm1d(4))
    model = enn.Sequential(enn.Linear(3, 4), enn.BatchNorm1d(4))
    state = dict(torch_model.state_dict())
    result = model.load_state_dict(state)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert_close(model[0].weight, torch_model[0].weight)
    assert model[1].num_batches_tracked.dtype == em.int64
    partial = {key: value for key, value in state.items() if key != "1.bias"}
    partial["extra"] = torch.ones(1)
    with pytest.raises(
        RuntimeError,
        match=r'Missing key\(s\) in state_dict: "1.bias"[\s\S]*Unexpected key\(s\) in '
        r'state_dict: "extra"',
    ):
        model.load_state_dict(partial)
    missing, unexpected = model.load_state_dict(partial, strict=False)
    assert (missing, unexpected) == (["1.bias"], ["extra"])
    wrong = dict(state, **{"0.weight": torch.ones(4, 5)})
    with pytest.raises(
        RuntimeError,
        match=r"size mismatch for 0.weight: copying a param with shape \(4, 5\) from "
        r"checkpoint, the shape in current model is \(4, 3\)",
    ):
        model.load_state_dict(wrong, strict=False)
    model.load_state_dict({key: value.numpy() for key, value in state.items()})  # numpy arrays load too
    float64 = {key: value.double() for key, value in state.items()}
    model.load_state_dict(float64)
    assert model[0].weight.dtype == em.float32  # the module keeps its dtype
    model.load_state_dict(float64, assign=True)
    assert model[0].weight.dtype == em.float64
    with pytest.raises(TypeError, match="mapping"):
        model.load_state_dict([1, 2])


def test_skip_init_and_assign_keep_checkpoint_tensors_where_they_are(tmp_path: Any) -> None:
    """Layers made inside skip_init run no kernels; assign=True keeps a memory-mapped checkpoint on disk (torch's
    assign keeps the checkpoint tensor's device too), so a model loads without computing or copying anything."""
    from ember.io import load_safetensors, save_safetensors

    source = enn.Linear(3, 2)
    save_safetensors(source.state_dict(), tmp_path / "linear.safetensors")
    with em.profile() as record:
        with enn.init.skip_init():
            model = enn.Linear(3, 2)
        model.load_state_dict(load_safetensors(tmp_path / "linear.safetensors"), assign=True)
    assert not record.kernels and not record.copies and model.weight.device == "disk:0"
    inputs = em.randn(4, 3)
    np.testing.assert_allclose(model(inputs).numpy(), source(inputs).numpy(), rtol=1e-6)
    initialized = enn.Linear(3, 2)  # outside the block, init writes again
    assert initialized.weight.node.realized and initialized.weight.abs().sum().item() > 0


def test_module_to_device_dtype_keeps_parameter_objects(device: str) -> None:
    model = enn.Sequential(enn.Linear(3, 2), enn.BatchNorm1d(2))
    weight = model[0].weight
    model.to(device)
    assert model[0].weight is weight and weight.device == device and model[1].running_mean.device == device
    model.double()
    assert weight.dtype == em.float64 and model[1].num_batches_tracked.dtype == em.int64
    assert model(em.ones(4, 3, dtype=em.float64, device=device)).dtype == em.float64
    with pytest.raises(TypeError, match="floating point"):
        model.to(em.int32)


def test_zero_grad_hooks_and_deepcopy(device: str) -> None:
    model = enn.Linear(3, 2).to(device)
    calls = []
    handle = model.register_forward_hook(lambda module, args, output: output * 2)
    pre = model.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape))
    x = em.ones(1, 3, device=device)
    doubled = model(x)
    handle.remove(), pre.remove()
    assert_close(doubled, torch.tensor(model(x).numpy() * 2))
    assert calls == [(1, 3)]
    model(x).sum().backward()
    assert model.weight.grad is not None
    copied = copy.deepcopy(model)
    assert copied.weight is not model.weight and isinstance(copied.weight, enn.Parameter)
    assert_close(copied.weight.grad, torch.tensor(model.weight.grad.numpy()))
    model.zero_grad(set_to_none=False)
    assert_close(model.weight.grad, torch.zeros(2, 3))
    model.zero_grad()
    assert model.weight.grad is None and copied.weight.grad is not None


def test_containers() -> None:
    layers = [enn.Linear(2, 2), enn.ReLU(), enn.Linear(2, 1)]
    sequential = enn.Sequential(*layers)
    assert sequential[-1] is layers[2] and len(sequential) == 3
    assert isinstance(sequential[1:], enn.Sequential) and list(sequential[1:]) == layers[1:]
    del sequential[1]
    assert list(sequential) == [layers[0], layers[2]] and list(sequential.state_dict())[-1] == "1.bias"
    sequential.append(enn.Tanh()).insert(0, enn.Identity())
    assert [type(module).__name__ for module in sequential] == ["Identity", "Linear", "Linear", "Tanh"]
    named = enn.Sequential(dict(first=enn.Linear(2, 3), act=enn.ReLU()))
    assert list(named.state_dict()) == ["first.weight", "first.bias"]
    with pytest.raises(IndexError, match="out of range"):
        sequential[7]  # noqa: B018
    module_list = enn.ModuleList([enn.ReLU()])
    module_list += [enn.Linear(1, 1)]
    module_list.insert(0, enn.Tanh())
    assert [type(module).__name__ for module in module_list] == ["Tanh", "ReLU", "Linear"]
    assert list(module_list.state_dict()) == ["2.weight", "2.bias"]
    dictionary = enn.ModuleDict({"b": enn.Linear(1, 2)})
    dictionary["a"] = enn.ReLU()
    assert list(dictionary) == ["b", "a"] and "a" in dictionary and len(dictionary) == 2
    assert type(dictionary.pop("a")).__name__ == "ReLU"
    parameters = enn.ParameterList([em.ones(2), enn.Parameter(em.zeros(3))])
    assert [tuple(parameter.shape) for parameter in parameters] == [(2,), (3,)]
    assert list(enn.ParameterDict({"x": em.ones(1)}).state_dict()) == ["x"]


def test_reprs_match_torch() -> None:
    if not torch.__version__.startswith("2.13"):  # (torch 2.11's BatchNorm2d repr has no `bias=True`)
        pytest.skip(f"reprs follow torch 2.13's, the version the test extra pins; this is torch {torch.__version__}")

    def build(nn: Any) -> Any:
        return nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1, bias=False),
            nn.BatchNorm2d(4),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv1d(2, 4, 3, stride=2, groups=2, padding_mode="reflect", padding=1),
            nn.Dropout(0.2),
            nn.Flatten(),
            nn.Linear(4, 2),
            nn.LayerNorm(2),
            nn.GroupNorm(1, 2),
            nn.Embedding(10, 3, padding_idx=0),
            nn.LeakyReLU(),
            nn.GELU(),
            nn.Softmax(dim=1),
            nn.LSTM(3, 4, 2, batch_first=True),
            nn.GRU(2, 3),
            nn.ModuleList([nn.Tanh(), nn.Tanh(), nn.Sigmoid()]),
            nn.ModuleDict({"a": nn.Identity()}),
            nn.TransformerEncoderLayer(8, 2, 16),
            nn.RMSNorm(4),
            nn.CrossEntropyLoss(),
            nn.Unflatten(1, (2, 3)),
        )

    assert repr(build(enn)) == repr(build(torch_nn))


# ---- initialization --------------------------------------------------------------------------------------------


def test_default_initialization_matches_torch_distribution() -> None:
    linear = enn.Linear(400, 300)
    weight, bias = linear.weight.numpy(), linear.bias.numpy()
    bound = 1 / np.sqrt(400)  # kaiming_uniform(a=sqrt(5)) on fan_in 400
    assert np.abs(weight).max() <= bound and np.abs(weight).max() > 0.99 * bound
    assert abs(weight.std() - bound / np.sqrt(3)) < 0.01 * bound and abs(weight.mean()) < 0.01 * bound
    assert np.abs(bias).max() <= bound
    conv = enn.Conv2d(8, 16, 3, groups=2)
    fan_in = 4 * 9
    assert np.abs(conv.weight.numpy()).max() <= 1 / np.sqrt(fan_in)
    embedding = enn.Embedding(500, 40, padding_idx=3).weight.numpy()
    assert abs(embedding.std() - 1) < 0.03 and np.all(embedding[3] == 0)
    lstm = enn.LSTM(5, 20)
    assert all(np.abs(parameter.numpy()).max() <= 1 / np.sqrt(20) for parameter in lstm.parameters())
    attention = enn.MultiheadAttention(16, 4)
    assert np.all(attention.in_proj_bias.numpy() == 0) and np.all(attention.out_proj.bias.numpy() == 0)
    assert np.abs(attention.in_proj_weight.numpy()).max() <= np.sqrt(6 / (16 + 48))
    norm = enn.LayerNorm(4)
    assert np.all(norm.weight.numpy() == 1) and np.all(norm.bias.numpy() == 0)
    em.manual_seed(3)
    first = enn.Linear(4, 4).weight.numpy()
    em.manual_seed(3)
    assert np.array_equal(first, enn.Linear(4, 4).weight.numpy())  # reproducible from the seed


def test_init_functions() -> None:
    init = enn.init
    for name in ("linear", "conv2d", "sigmoid", "tanh", "relu", "selu"):
        assert init.calculate_gain(name) == pytest.approx(torch_nn.init.calculate_gain(name))
    assert init.calculate_gain("leaky_relu", 0.2) == pytest.approx(torch_nn.init.calculate_gain("leaky_relu", 0.2))
    with pytest.raises(ValueError, match="unsupported nonlinearity"):
        init.calculate_gain("swish")
    tensor = em.zeros(300, 200)
    init.kaiming_normal_(tensor, mode="fan_out", nonlinearity="relu")
    assert abs(tensor.numpy().std() - np.sqrt(2 / 300)) < 0.03 * np.sqrt(2 / 300)
    init.xavier_uniform_(tensor, gain=2.0)
    assert np.abs(tensor.numpy()).max() <= 2.0 * np.sqrt(6 / 500)
    init.xavier_normal_(tensor)
    assert abs(tensor.numpy().std() - np.sqrt(2 / 500)) < 0.03 * np.sqrt(2 / 500)
    init.normal_(tensor, 3.0, 0.5)
    assert abs(tensor.numpy().mean() - 3.0) < 0.01 and abs(tensor.numpy().std() - 0.5) < 0.01
    init.uniform_(tensor, -2.0, -1.0)
    assert tensor.numpy().min() >= -2.0 and tensor.numpy().max() < -1.0
    init.trunc_normal_(tensor, 0.0, 1.0, -0.5, 1.5)
    values = tensor.numpy()
    expected = torch_nn.init.trunc_normal_(torch.empty(300, 200), 0.0, 1.0, -0.5, 1.5)
    assert values.min() >= -0.5 and values.max() <= 1.5
    assert abs(values.mean() - expected.mean().item()) < 0.02 and abs(values.std() - expected.std().item()) < 0.02
    init.constant_(tensor, 0.25)
    assert np.all(tensor.numpy() == 0.25)
    square = em.zeros(6, 4)
    init.orthogonal_(square, gain=2.0)
    np.testing.assert_allclose(square.numpy().T @ square.numpy(), 4 * np.eye(4), atol=1e-4)
    init.eye_(square)
    assert np.array_equal(square.numpy(), np.eye(6, 4, dtype=np.float32))
    kernel = em.zeros(4, 2, 3, 3)
    init.dirac_(kernel, groups=2)
    assert_close(kernel, torch_nn.init.dirac_(torch.empty(4, 2, 3, 3), groups=2))
    sparse = em.zeros(10, 6)
    init.sparse_(sparse, 0.3)
    assert np.all((sparse.numpy() == 0).sum(0) == 3)
    with pytest.raises(em.ShapeError, match="fewer than 2 dims"):
        init.xavier_uniform_(em.zeros(3))


def test_embedding_options(device: str) -> None:
    weights = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32) * 3
    indices = np.array([[0, 2, 2], [5, 1, 0]])
    torch_layer = torch_nn.Embedding.from_pretrained(torch.tensor(weights), freeze=False, max_norm=1.5)
    layer = enn.Embedding.from_pretrained(em.tensor(weights, device=device), freeze=False, max_norm=1.5)
    assert_close(layer(em.tensor(indices, device=device)), torch_layer(torch.tensor(indices)), atol=1e-5)
    assert_close(layer.weight, torch_layer.weight, atol=1e-5)  # the rows looked up were renormalized in place
    frozen = enn.Embedding.from_pretrained(em.tensor(weights, device=device))
    assert not frozen.weight.requires_grad
    torch_scaled = torch_nn.Embedding(6, 3, scale_grad_by_freq=True)
    scaled = enn.Embedding(6, 3, scale_grad_by_freq=True).to(device)
    scaled.load_state_dict(torch_scaled.state_dict())
    torch_scaled(torch.tensor(indices)).sum().backward()
    scaled(em.tensor(indices, device=device)).sum().backward()
    assert_close(scaled.weight.grad, torch_scaled.weight.grad)
    with pytest.raises(em.DTypeError, match="integer"):
        layer(em.ones(2, device=device))
    with pytest.raises(ValueError, match="padding_idx"):
        enn.Embedding(3, 2, padding_idx=5)


def test_layer_argument_errors() -> None:
    with pytest.raises(ValueError, match="divisible by groups"):
        enn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="padding_mode"):
        enn.Conv1d(1, 1, 3, padding_mode="mirror")
    with pytest.raises(ValueError, match="strided"):
        enn.Conv2d(1, 1, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="divisible by num_heads"):
        enn.MultiheadAttention(10, 3)
    with pytest.raises(ValueError, match="num_channels"):
        enn.GroupNorm(3, 4)
    with pytest.raises(ValueError, match="proj_size"):
        enn.LSTM(3, 4, proj_size=4)
    attention = enn.MultiheadAttention(4, 2)
    with pytest.raises(ValueError, match="is_causal"):
        attention(em.ones(3, 1, 4), em.ones(3, 1, 4), em.ones(3, 1, 4), is_causal=True)
    with pytest.raises(em.ShapeError, match=r"attn_mask should be \(3, 3\)"):
        attention(em.ones(3, 1, 4), em.ones(3, 1, 4), em.ones(3, 1, 4), attn_mask=em.zeros(2, 3))
    with pytest.raises(em.ShapeError, match="hidden state of shape"):
        enn.GRU(2, 3)(em.ones(4, 1, 2), em.zeros(2, 1, 3))
