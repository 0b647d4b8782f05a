"""Train a small CNN on scikit-learn's 8x8 digits with ember: the README's first command (`make demo`).

Prints the test accuracy, the wall time and the kernels per training step. Run `python examples/train_digits.py
--help` for options; `EMBER_DEVICE=opencl` (or --device) picks another device.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import dataclass

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tqdm import tqdm

import ember as em
import ember.nn as nn
import ember.nn.functional as F
import ember.optim as optim


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions with ReLU and max pooling, then a linear classifier: 8x8 -> 4x4 -> 2x2 -> 10 classes."""

    def __init__(self, channels: tuple[int, int] = (16, 32), batch_norm: bool = False) -> None:
        super().__init__()
        first, second = channels
        norm = nn.BatchNorm2d if batch_norm else (lambda size: nn.Identity())
        self.features = nn.Sequential(
            nn.Conv2d(1, first, 3, padding=1),
            norm(first),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(first, second, 3, padding=1),
            norm(second),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(second * 2 * 2, 10)

    def forward(self, images: em.Tensor) -> em.Tensor:
        return self.classifier(self.features(images).flatten(1))


@dataclass
class Result:
    accuracy: float
    seconds: float
    kernels_per_step: int
    steps: int
    device: str


def digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The 1797 digits as standardized (N, 1, 8, 8) float32 images, split 80/20 with every class in both parts."""
    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)[:, None]
    train_images, test_images, train_labels, test_labels = train_test_split(
        images, data.target.astype(np.int64), test_size=0.2, random_state=seed, stratify=data.target
    )
    mean, std = train_images.mean(), train_images.std()  # standardize with the training set's statistics
    return (train_images - mean) / std, (test_images - mean) / std, train_labels, test_labels


def train(
    epochs: int = 10,
    batch_size: int = 64,
    lr: float = 0.01,
    seed: int = 0,
    device: str | None = None,
    progress: bool = True,
    channels: tuple[int, int] = (16, 32),
    batch_norm: bool = False,
) -> Result:
    """Train DigitsCNN with AdamW and return its test accuracy, the wall time and the kernels per training step."""
    start = time.perf_counter()
    device = device or em.get_default_device()
    em.manual_seed(seed)
    train_images, test_images, train_labels, test_labels = digits(seed)
    model = DigitsCNN(channels, batch_norm).to(device)
    device = next(model.parameters()).device  # the resolved name, e.g. opencl:0
    optimizer = optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    steps_per_epoch = len(train_images) // batch_size  # full batches only: every step has the same kernels
    scheduler = optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * steps_per_epoch)
    shuffler = np.random.default_rng(seed)
    kernels_per_step = 0
    bar = tqdm(
        total=epochs * steps_per_epoch * batch_size,
        unit="img",
        unit_scale=True,
        disable=not progress,
        desc=f"training on {device}",
    )
    for epoch in range(epochs):
        order = shuffler.permutation(len(train_images))
        for step in range(steps_per_epoch):
            batch = order[step * batch_size : (step + 1) * batch_size]
            images = em.tensor(train_images[batch], device=device)
            labels = em.tensor(train_labels[batch], device=device)

            measured = epoch == epochs - 1 and step == 0  # a warm step: every kernel is compiled by now
            with em.profile() if measured else contextlib.nullcontext() as record:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(images), labels)
                loss.backward()  # computes the gradients and the loss in one schedule
                optimizer.step()  # every new parameter and moment in one more
            if measured:
                kernels_per_step = len(record.kernels)
            scheduler.step()
            bar.update(batch_size)
            bar.set_postfix(epoch=epoch + 1, loss=f"{loss.item():.4f}")
    bar.close()
    model.eval()
    with em.no_grad():
        logits = model(em.tensor(test_images, device=device))
        accuracy = float((logits.argmax(1) == em.tensor(test_labels, device=device)).float().mean().item())
    return Result(accuracy, time.perf_counter() - start, kernels_per_step, epochs * steps_per_epoch, device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="an ember device such as c or opencl (default: ember's default)")
    arguments = parser.parse_args()
    result = train(arguments.epochs, arguments.batch_size, arguments.lr, arguments.seed, arguments.device)
    print(f"test accuracy: {result.accuracy * 100:.2f}% on {result.device}")
    print(f"wall time: {result.seconds:.1f} s for {result.steps} training steps (compiling included)")
    print(
        f"kernels per training step: {result.kernels_per_step} "
        "(forward and backward in one schedule, the AdamW update in a second)"
    )


if __name__ == "__main__":
    main()
