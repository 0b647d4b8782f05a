"""A 1,000-step training loop keeps memory flat: no buffer or graph survives a step it is not needed in."""

import gc

import numpy as np

import ember as em
from ember import nn, optim
from ember.scheduler.devices import get_device


def test_thousand_training_steps_keep_memory_flat() -> None:
    em.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    inputs = em.randn(32, 8).realize()
    targets = em.randint(0, 3, (32,)).realize()
    pool = get_device(inputs.device).pool

    def step() -> float:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss.item()

    first = [step() for _ in range(10)][0]
    gc.collect()
    bytes_after_warmup, buffers_after_warmup = pool.used_bytes, pool.live_buffers
    samples = []
    for index in range(1000):
        last = step()
        if index % 100 == 99:
            gc.collect()
            samples.append((pool.used_bytes, pool.live_buffers))
    assert all(sample == (bytes_after_warmup, buffers_after_warmup) for sample in samples), samples
    assert np.isfinite(last) and last < first  # it trained
