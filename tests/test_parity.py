"""Training parity: an MLP and a small CNN built in ember and in PyTorch from identical weights follow the same loss
curve for 20 steps of SGD with momentum and 20 steps of AdamW (within 1e-4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember as em
import ember.nn as enn
import ember.nn.functional as F
import ember.optim as optim
from tests.helpers import assert_close

MODELS = {
    "mlp": (
        lambda nn: nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 5)),
        (16, 20),
    ),
    "cnn": (
        lambda nn: nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 3),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(8 * 2 * 2, 5),
        ),
        (16, 1, 8, 8),
    ),
}
OPTIMIZERS = {
    "sgd_momentum": lambda module, parameters: module.SGD(parameters, lr=0.05, momentum=0.9),
    "adamw": lambda module, parameters: module.AdamW(parameters, lr=0.01),
}
STEPS = 20


@pytest.mark.parametrize("optimizer_name", OPTIMIZERS)
@pytest.mark.parametrize("model_name", MODELS)
def test_loss_curves_match_torch(model_name: str, optimizer_name: str, device: str) -> None:
    make, input_shape = MODELS[model_name]
    torch.manual_seed(0)
    torch_model = make(torch.nn)
    model = make(enn).to(device)
    model.load_state_dict(torch_model.state_dict())
    torch_optimizer = OPTIMIZERS[optimizer_name](torch.optim, torch_model.parameters())
    optimizer = OPTIMIZERS[optimizer_name](optim, model.parameters())
    generator = np.random.default_rng(0)
    batches = [generator.normal(size=input_shape).astype(np.float32) for _ in range(4)]
    teacher = generator.normal(size=(int(np.prod(input_shape[1:])), 5))  # learnable labels: a linear teacher's argmax
    torch_losses, losses = [], []
    for step in range(STEPS):
        inputs = batches[step % len(batches)]
        labels = (inputs.reshape(input_shape[0], -1) @ teacher).argmax(1)
        torch_optimizer.zero_grad()
        torch_loss = torch.nn.functional.cross_entropy(torch_model(torch.tensor(inputs)), torch.tensor(labels))
        torch_loss.backward()
        torch_optimizer.step()
        torch_losses.append(torch_loss.item())
        optimizer.zero_grad()
        loss = F.cross_entropy(model(em.tensor(inputs, device=device)), em.tensor(labels, device=device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    np.testing.assert_allclose(losses, torch_losses, atol=1e-4, rtol=0)
    assert torch_losses[-1] < torch_losses[0]  # the curve is a real training curve
    for parameter, torch_parameter in zip(model.parameters(), torch_model.parameters()):
        assert_close(parameter, torch_parameter.detach(), atol=1e-4)
