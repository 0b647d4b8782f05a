"""TransformerDecoderLayer, TransformerDecoder and Transformer against torch: state_dict keys, outputs with masks
(post- and pre-norm, batch_first) and gradients after loading torch's weights, and torch's shape errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from tests.helpers import BatchedChecks, pair

pytestmark = pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")  # torch's note on its fast path


def _compare(ember_module: Any, torch_module: Any, inputs: list[np.ndarray], device: str, label: str,
             **options: Any) -> None:
    torch_state = torch_module.state_dict()
    assert list(ember_module.state_dict()) == list(torch_state), label
    ember_module.load_state_dict(torch_state)
    ember_module.eval(), torch_module.eval()
    pairs = [pair(array, device, requires_grad=True) for array in inputs]
    ember_options = {key: (em.tensor(value.numpy(), device=device) if isinstance(value, torch.Tensor) else value)
                     for key, value in options.items()}
    result = ember_module(*(ours for ours, _ in pairs), **ember_options)
    expected = torch_module(*(theirs for _, theirs in pairs), **options)
    check = BatchedChecks(atol=2e-5, rtol=1e-4)
    check(result, expected, label)
    weights = np.random.default_rng(3).normal(size=tuple(expected.shape)).astype(np.float32)
    (result * em.tensor(weights, device=device)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    for index, (ours, theirs) in enumerate(pairs):
        check(ours.grad, theirs.grad, f"{label} input {index} gradient", atol=1e-4, rtol=1e-3)
    for (name, theirs), ours in zip(torch_module.named_parameters(), ember_module.parameters()):
        check(ours.grad, theirs.grad, f"{label} {name} gradient", atol=1e-4, rtol=1e-3)
    check.verify()


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch(device: str, norm_first: bool) -> None:
    torch.manual_seed(0)
    generator = np.random.default_rng(0)
    target, memory = (generator.normal(size=shape).astype(np.float32) for shape in ((4, 2, 8), (5, 2, 8)))
    causal = torch.nn.Transformer.generate_square_subsequent_mask(4)
    padding = torch.tensor([[False, False, False, True, True], [False, False, False, False, False]])
    options = {"tgt_mask": causal, "memory_key_padding_mask": padding}
    _compare(em.nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, norm_first=norm_first).to(device),
             torch.nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, norm_first=norm_first),
             [target, memory], device, f"decoder layer norm_first={norm_first}", **options)


def test_decoder_and_transformer_match_torch(device: str) -> None:
    torch.manual_seed(0)
    generator = np.random.default_rng(1)
    target, memory = (generator.normal(size=shape).astype(np.float32) for shape in ((2, 3, 8), (2, 4, 8)))
    layer = torch.nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True, activation="gelu")
    _compare(em.nn.TransformerDecoder(em.nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                                                    activation="gelu"), 2,
                                      norm=em.nn.LayerNorm(8)).to(device),
             torch.nn.TransformerDecoder(layer, 2, norm=torch.nn.LayerNorm(8)), [target, memory], device, "decoder")
    source = generator.normal(size=(4, 2, 8)).astype(np.float32)
    goal = generator.normal(size=(3, 2, 8)).astype(np.float32)
    _compare(em.nn.Transformer(8, 2, 2, 1, 16, dropout=0.0).to(device),
             torch.nn.Transformer(8, 2, 2, 1, 16, dropout=0.0), [source, goal], device, "transformer",
             tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(3))
    mask = em.nn.Transformer.generate_square_subsequent_mask(3)
    assert np.array_equal(mask.numpy(), torch.nn.Transformer.generate_square_subsequent_mask(3).numpy())


def test_transformer_initialization_and_errors() -> None:
    model = em.nn.Transformer(16, 2, 1, 1, 32)
    weight = model.encoder.layers[0].linear1.weight.numpy()
    bound = (6 / (16 + 32)) ** 0.5  # xavier uniform
    assert np.abs(weight).max() <= bound and np.abs(weight).max() > 0.8 * bound
    for module in (torch, em):
        transformer = module.nn.Transformer(8, 2, 1, 1, 16)
        with pytest.raises(RuntimeError):
            transformer(module.ones(4, 2, 8), module.ones(3, 3, 8))
        with pytest.raises(RuntimeError):
            transformer(module.ones(4, 2, 8), module.ones(3, 2, 6))
