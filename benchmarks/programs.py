"""Ordinary PyTorch-tutorial programs, written once against a module namespace (`torch` or `ember`), timed for both.

Each program is a function `program(lib, device, size, deterministic)` that builds a model, its optimizer and its
data with `lib.nn`, `lib.optim` and `lib.nn.functional` only, so the torch and ember versions are the same code with
the import changed. It returns a `Program`: `step(*batch)` runs one training step and returns the loss, `batches`
are the step's inputs (made once, from scikit-learn's digits or this file's own text), `after_step` advances an lr
schedule (outside `step`, so that `ember.jit` can replay the step). `deterministic=True` turns dropout off and takes
the VAE's noise from the data, so that ember and torch started from the same weights must give the same losses.

`python benchmarks/programs.py [--steps N] [--program NAME] [--quick] [--device c] [--empty-cache]` prints, per
program: torch's median step, ember's eager median step, ember's median step under `ember.jit`, the ratio, ember's
cold first step (and whether its kernels came from the disk cache), with --empty-cache the first step in a fresh
process with empty kernel caches (the median of --empty-cache-runs processes, 3 by default), kernels per ember
step, and the largest relative difference of the first losses; and the ratio of the mean eager steps (an epoch's
time: a pause of either runtime, such as Python's collector, counts there and not in the medians). Torch, ember
eager and ember under ember.jit are timed in turns, in blocks of a few steps (`interleaved_steps`), so that a
machine whose speed drifts moves all three alike.
`python -m ember bench --case programs` runs the same.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Program:
    """What a program builds: the model (for copying weights), one training step, its batches, an lr schedule."""

    model: Any
    step: Callable[..., Any]
    batches: list[tuple[Any, ...]]
    after_step: Callable[[], None] = lambda: None


@dataclass
class Size:
    """How large the programs are: the tutorials' usual shapes, or tiny ones for the smoke test."""

    batch: int = 64
    channels: int = 16
    hidden: int = 128
    embed: int = 64
    sequence: int = 32
    block: int = 64
    layers: int = 2
    heads: int = 4
    latent: int = 16
    batches: int = 4
    image: int = 56  # the feature maps' side of resnet_stage (ImageNet's ResNet-18 after its stem: 56 x 56)


QUICK = Size(batch=8, channels=4, hidden=16, embed=16, sequence=8, block=8, layers=2, heads=2, latent=4, batches=2,
             image=8)


# ---- data (numpy, the same arrays for both libraries) ------------------------------------------------------------


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits: images scaled to [0, 1] (float32) and labels (int64)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.images / 16.0).astype(np.float32), data.target.astype(np.int64)


def digit_batches(size: Size, seed: int, upsample: int = 1, flat: bool = False) -> list[tuple[np.ndarray, ...]]:
    """`size.batches` mini-batches of digits: images [B, 1, 8k, 8k] (nearest upsampling by k) or [B, 64]."""
    images, labels = digits()
    generator = np.random.default_rng(seed)
    batches = []
    for _ in range(size.batches):
        chosen = generator.choice(len(images), size.batch, replace=False)
        picked = images[chosen]
        if flat:
            batches.append((picked.reshape(size.batch, 64), labels[chosen]))
        else:
            picked = np.kron(picked, np.ones((upsample, upsample), dtype=np.float32))
            batches.append((picked[:, None].astype(np.float32), labels[chosen]))
    return batches


def text_codes() -> tuple[np.ndarray, int]:
    """This file's own text as character codes, and the vocabulary's size."""
    text = Path(__file__).read_text()
    vocabulary = sorted(set(text))
    index = {character: position for position, character in enumerate(vocabulary)}
    return np.array([index[character] for character in text], dtype=np.int64), len(vocabulary)


def text_batches(size: Size, window: int, seed: int, sequence_first: bool) -> list[tuple[np.ndarray, ...]]:
    """Random windows of the text: inputs and next-character targets, [T, B] (sequence first) or [B, T]."""
    codes, _ = text_codes()
    generator = np.random.default_rng(seed)
    batches = []
    for _ in range(size.batches):
        starts = generator.integers(0, len(codes) - window - 1, size.batch)
        inputs = np.stack([codes[start:start + window] for start in starts])
        targets = np.stack([codes[start + 1:start + window + 1] for start in starts])
        batches.append((inputs.T.copy(), targets.T.copy()) if sequence_first else (inputs, targets))
    return batches


def on_device(lib: Any, device: str, batches: list[tuple[np.ndarray, ...]]) -> list[tuple[Any, ...]]:
    """The numpy batches as `lib` tensors on `device`."""
    return [tuple(lib.tensor(array, device=device) for array in batch) for batch in batches]


# ---- the programs (the same code for torch and ember) ------------------------------------------------------------


def classification_step(lib: Any, model: Any, optimizer: Any) -> Callable[[Any, Any], Any]:
    """One training step of a classifier: cross-entropy of the model's logits against the labels, backward, the
    optimizer's step; returns the loss."""

    def step(inputs: Any, labels: Any) -> Any:
        optimizer.zero_grad()
        loss = lib.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        return loss

    return step


def basic_block(lib: Any) -> type:
    """ResNet's BasicBlock for `lib`: two 3x3 convolutions (the first strided) with BatchNorm and ReLU, and the
    identity added, through a 1x1 strided convolution and BatchNorm where the shape changes."""
    nn = lib.nn
    F = nn.functional

    class BasicBlock(nn.Module):
        def __init__(self, inputs: int, outputs: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(outputs)
            self.conv2 = nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(outputs)
            self.downsample = None
            if stride != 1 or inputs != outputs:
                self.downsample = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False),
                                                nn.BatchNorm2d(outputs))

        def forward(self, x: Any) -> Any:
            identity = x if self.downsample is None else self.downsample(x)
            out = F.relu(self.bn1(self.conv1(x)))
            return F.relu(self.bn2(self.conv2(out)) + identity)

    return BasicBlock


def cnn(lib: Any, device: str, size: Size, deterministic: bool) -> Program:
    """CNN on digits (upsampled to 16x16): 2 conv 3x3 + BatchNorm + ReLU + MaxPool, Dropout, Linear; Adam."""
    nn = lib.nn
    width = size.channels
    model = nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.0 if deterministic else 0.25), nn.Linear(2 * width * 16, 10),
    ).to(device)
    optimizer = lib.optim.Adam(model.parameters(), lr=1e-3)

    step = classification_step(lib, model, optimizer)

    return Program(model, step, on_device(lib, device, digit_batches(size, 1, upsample=2)))


def char_rnn(lib: Any, device: str, size: Size, cell: str) -> Program:
    """A char model in the style of word_language_model: embedding, 2-layer LSTM/GRU, linear decoder; BPTT windows
    of `size.sequence`, clip_grad_norm_, plain SGD (the hidden state starts at zero in each window)."""
    nn = lib.nn
    _, vocabulary = text_codes()

    class RNNModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Embedding(vocabulary, size.embed)
            self.rnn = getattr(nn, cell)(size.embed, size.hidden, size.layers)
            self.decoder = nn.Linear(size.hidden, vocabulary)

        def forward(self, codes: Any) -> Any:
            output, _ = self.rnn(self.encoder(codes))
            return self.decoder(output)

    model = RNNModel().to(device)
    optimizer = lib.optim.SGD(model.parameters(), lr=1.0)

    def step(codes: Any, targets: Any) -> Any:
        optimizer.zero_grad()
        logits = model(codes)
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocabulary), targets.reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        return loss

    return Program(model, step, on_device(lib, device, text_batches(size, size.sequence, 2, sequence_first=True)))


def char_lstm(lib: Any, device: str, size: Size, deterministic: bool) -> Program:
    """The char model with a 2-layer LSTM."""
    return char_rnn(lib, device, size, "LSTM")


def char_gru(lib: Any, device: str, size: Size, deterministic: bool) -> Program:
    """The char model with a 2-layer GRU."""
    return char_rnn(lib, device, size, "GRU")


def gpt(lib: Any, device: str, size: Size, deterministic: bool, fused_attention: bool) -> Program:
    """A nanoGPT-style decoder: token + position embeddings, pre-norm blocks of causal self-attention (written by
    hand, or F.scaled_dot_product_attention(is_causal=True)) and an MLP, weight-tied head; AdamW, cosine lr."""
    nn = lib.nn
    F = nn.functional
    _, vocabulary = text_codes()
    width, heads, block = size.embed, size.heads, size.block
    dropout = 0.0 if deterministic else 0.1

    class CausalSelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn = nn.Linear(width, 3 * width)
            self.c_proj = nn.Linear(width, width)
            self.attn_dropout = nn.Dropout(dropout)
            self.resid_dropout = nn.Dropout(dropout)
            self.register_buffer("bias", lib.tril(lib.ones(block, block)).view(1, 1, block, block))

        def forward(self, x: Any) -> Any:
            batch, length, channels = x.shape
            q, k, v = self.c_attn(x).split(width, dim=2)
            q = q.view(batch, length, heads, channels // heads).transpose(1, 2)
            k = k.view(batch, length, heads, channels // heads).transpose(1, 2)
            v = v.view(batch, length, heads, channels // heads).transpose(1, 2)
            if fused_attention:
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout if self.training else 0.0,
                                                   is_causal=True)
            else:
                attention = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                attention = attention.masked_fill(self.bias[:, :, :length, :length] == 0, float("-inf"))
                attention = self.attn_dropout(F.softmax(attention, dim=-1))
                y = attention @ v
            y = y.transpose(1, 2).contiguous().view(batch, length, channels)
            return self.resid_dropout(self.c_proj(y))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1 = nn.LayerNorm(width)
            self.attn = CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width),
                                     nn.Dropout(dropout))

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(vocabulary, width)
            self.wpe = nn.Embedding(block, width)
            self.drop = nn.Dropout(dropout)
            self.blocks = nn.ModuleList([Block() for _ in range(size.layers)])
            self.ln_f = nn.LayerNorm(width)
            self.lm_head = nn.Linear(width, vocabulary, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, codes: Any, positions: Any) -> Any:
            x = self.drop(self.wte(codes) + self.wpe(positions))
            for layer in self.blocks:
                x = layer(x)
            return self.lm_head(self.ln_f(x))

    model = GPT().to(device)
    optimizer = lib.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = lib.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=1000, eta_min=1e-4)
    positions = lib.arange(block, device=device)

    def step(codes: Any, targets: Any) -> Any:
        optimizer.zero_grad()
        logits = model(codes, positions)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss

    batches = on_device(lib, device, text_batches(size, block, 3, sequence_first=False))
    return Program(model, step, batches, schedule.step)


def gpt_manual(lib: Any, device: str, size: Size, deterministic: bool) -> Program:
    """nanoGPT with causal attention written by hand (masked_fill of a tril buffer, softmax, matmuls)."""
    return gpt(lib, device, size, deterministic, fused_attention=False)


def gpt_sdpa(lib: Any, device: str, size: Size, deterministic: bool) -> Program:
    """nanoGPT with F.scaled_dot_product_attention(is_causal=True)."""
    return gpt(lib, device, size, deterministic, fused_attention=True)


def vae(lib: Any, device: str, size: Size, deterministic: bool) -> Program:
    """VAE on digits (64 pixels): MLP encoder to mean and log-variance, reparameterization, MLP decoder with a
    sigmoid; binary cross-entropy (summed) + KL divergence; Adam. Deterministic runs take the noise from the data."""
    nn = lib.nn
    F = nn.functional
    hidden, latent = size.hidden, size.latent

    class VAE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(64, hidden)
            self.fc21 = nn.Linear(hidden, latent)
            self.fc22 = nn.Linear(hidden, latent)
            self.fc3 = nn.Linear(latent, hidden)
            self.fc4 = nn.Linear(hidden, 64)

        def forward(self, x: Any, noise: Any) -> tuple[Any, Any, Any]:
            h1 = F.relu(self.fc1(x))
            mu, logvar = self.fc21(h1), self.fc22(h1)
            eps = noise if deterministic else lib.randn_like(mu)
            z = mu + eps * lib.exp(0.5 * logvar)
            return lib.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar

    model = VAE().to(device)
    optimizer = lib.optim.Adam(model.parameters(), lr=1e-3)

    def step(x: Any, noise: Any) -> Any:
        optimizer.zero_grad()
        reconstruction, mu, logvar = model(x, noise)
        bce = F.binary_cross_entropy(reconstruction, x, reduction="sum")
        kld = -0.5 * lib.sum(1 + logvar - mu.pow(2) - logvar.exp())
        loss = (bce + kld) / x.size(0)
        loss.backward()
        optimizer.step()
        return loss

    generator = np.random.default_rng(4)
    batches = [(images, generator.standard_normal((size.batch, latent)).astype(np.float32))
               for images, _ in digit_batches(size, 4, flat=True)]
    return Program(model, step, on_device(lib, device, batches))


def resnet(lib: Any, device: str, size: Size, deterministic: bool) -> Program:
    """A small ResNet on digits (upsampled to 16x16): stem, BasicBlocks (the second pair strided, with a 1x1
    downsample), BatchNorm, global average pool, Linear; SGD with momentum and weight decay."""
    nn = lib.nn
    width = size.channels
    BasicBlock = basic_block(lib)
    model = nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
        BasicBlock(width, width, 1), BasicBlock(width, 2 * width, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, 10),
    ).to(device)
    optimizer = lib.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)

    step = classification_step(lib, model, optimizer)

    return Program(model, step, on_device(lib, device, digit_batches(size, 5, upsample=2)))


def tabular_mlp(lib: Any, device: str, size: Size, deterministic: bool) -> Program:
    """A tabular MLP on the digits' 64 features (standardized): Linear-ReLU-Dropout twice, Linear; mini-batches,
    SGD with momentum, StepLR."""
    nn = lib.nn
    model = nn.Sequential(
        nn.Linear(64, size.hidden), nn.ReLU(), nn.Dropout(0.0 if deterministic else 0.2),
        nn.Linear(size.hidden, size.hidden // 2), nn.ReLU(), nn.Dropout(0.0 if deterministic else 0.2),
        nn.Linear(size.hidden // 2, 10),
    ).to(device)
    optimizer = lib.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    schedule = lib.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)

    step = classification_step(lib, model, optimizer)

    images, _ = digits()
    flat = images.reshape(len(images), 64)
    mean, deviation = flat.mean(axis=0), flat.std(axis=0) + 1e-6
    batches = [((features - mean) / deviation, labels) for features, labels in digit_batches(size, 6, flat=True)]
    return Program(model, step, on_device(lib, device, [(f.astype(np.float32), y) for f, y in batches]),
                   schedule.step)


def resnet_stage(lib: Any, device: str, size: Size, deterministic: bool) -> Program:
    """ResNet-18 at ImageNet's sizes after its stem: 4 x channels (64) feature maps of 56 x 56 at batch / 8 (8)
    through its second stage's BasicBlock and the third's first (3x3 convolutions of 64 and 128 filters, one of
    stride 2, a 1x1 downsample), global average pool, Linear; SGD with momentum. Random feature maps and labels."""
    nn = lib.nn
    width, batch = 4 * size.channels, max(1, size.batch // 8)
    BasicBlock = basic_block(lib)
    model = nn.Sequential(
        BasicBlock(width, width, 1), BasicBlock(width, 2 * width, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, 10),
    ).to(device)
    optimizer = lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = np.random.default_rng(6)
    batches = [(generator.standard_normal((batch, width, size.image, size.image), dtype=np.float32),
                generator.integers(0, 10, batch).astype(np.int64)) for _ in range(size.batches)]

    step = classification_step(lib, model, optimizer)

    return Program(model, step, on_device(lib, device, batches))


PROGRAMS: dict[str, Callable[[Any, str, Size, bool], Program]] = {
    "cnn": cnn, "char_lstm": char_lstm, "char_gru": char_gru, "gpt_manual": gpt_manual, "gpt_sdpa": gpt_sdpa,
    "vae": vae, "resnet": resnet, "tabular_mlp": tabular_mlp, "resnet_stage": resnet_stage,
}


# ---- running and timing ------------------------------------------------------------------------------------------


# steps each side runs before the timed ones (ember's after its cold step): ember's second step meets the structure
# an optimizer's first step leaves (its state made), its third records the optimizer's replay and binds launch plans
WARM_UP_STEPS = 3


@dataclass
class Report:
    """One program's numbers (seconds; None where that part could not run, with the reason in `notes`)."""

    name: str
    torch_step: float | None = None
    ember_step: float | None = None
    torch_mean: float | None = None  # the mean steps: what an epoch costs, pauses of either library's runtime included
    ember_mean: float | None = None
    ember_jit_step: float | None = None
    ember_cold: float | None = None
    cold_compiles: int = 0  # kernels the cold step compiled (or loaded from ember's disk cache: both count)
    cold_compile_seconds: float = 0.0
    # the first step in a fresh process with an empty kernel cache (--empty-cache): the median of the processes run
    empty_cache_cold: float | None = None
    kernels_per_step: int | None = None
    kernels_per_jit_step: int | None = None
    loss_difference: float | None = None
    notes: list[str] = field(default_factory=list)


EMPTY_CACHE_RUNS = 3  # fresh processes timed per program for --empty-cache (their median is reported)
TORCH_DEVICE = ["cpu"]  # torch's device (--torch-device; cuda beside ember's cuda where torch has it)


def copy_weights(torch_model: Any, ember_model: Any) -> None:
    """torch's state (parameters and buffers) into the ember model, through numpy."""
    ember_model.load_state_dict({key: value.detach().cpu().numpy() for key, value in torch_model.state_dict().items()})


def build_pair(name: str, device: str, size: Size, deterministic: bool, seed: int = 0) -> tuple[Program, Program]:
    """The torch and ember versions of one program, the ember model holding torch's initial weights."""
    import ember
    import torch

    torch.manual_seed(seed)
    ember.manual_seed(seed)
    torch_program = PROGRAMS[name](torch, TORCH_DEVICE[0], size, deterministic)
    ember_program = PROGRAMS[name](ember, device, size, deterministic)
    copy_weights(torch_program.model, ember_program.model)
    return torch_program, ember_program


def run_steps(program: Program, count: int, step: Callable[..., Any] | None = None) -> list[tuple[float, float]]:
    """`count` training steps (cycling through the batches): each step's (seconds, loss); the loss is read back
    inside the timed region, so asynchronous work is finished."""
    step = step or program.step
    results = []
    for index in range(count):
        batch = program.batches[index % len(program.batches)]
        start = time.perf_counter()
        loss = float(step(*batch).item())
        results.append((time.perf_counter() - start, loss))
        program.after_step()
    return results


def loss_agreement(name: str, device: str, size: Size, steps: int) -> float:
    """The largest relative difference of the first `steps` losses of ember and torch from the same weights."""
    torch_program, ember_program = build_pair(name, device, size, deterministic=True)
    torch_losses = [loss for _, loss in run_steps(torch_program, steps)]
    ember_losses = [loss for _, loss in run_steps(ember_program, steps)]
    return max(abs(e - t) / max(abs(t), 1e-12) for e, t in zip(ember_losses, torch_losses))


# steps one side runs back to back before the next side's turn: torch, ember eager and ember under ember.jit take
# turns in blocks, so that a machine whose speed drifts (a shared VM's does, by 20-40% within minutes) slows all
# three alike; the medians and means are over every block's steps
BLOCK_STEPS = 5


def jit_program(name: str, device: str, size: Size) -> tuple[Program | None, Any, list[str]]:
    """ember's program under ember.jit with its eager call, its capture and WARM_UP_STEPS replays done, the jitted
    step, and notes; (None, None, notes) where the step cannot be jitted (the notes say why). Dropout on first;
    with dropout off (the VAE's noise from the data) where ember.jit refuses the random ops."""
    import ember

    errors: list[str] = []
    for deterministic in (False, True):
        try:
            _, program = build_pair(name, device, size, deterministic)
            jitted = ember.jit(program.step)
            run_steps(program, 2 + WARM_UP_STEPS, jitted)  # the eager call, the capture, replays
            assert jitted.capture is not None and jitted.replays > 0, "ember.jit never replayed the step"
        except Exception as error:  # noqa: BLE001 - the table says why the step could not be jitted
            errors.append(f"{type(error).__name__}: {str(error).splitlines()[0][:110]}")
            continue
        refused = (f"jit timed with dropout off / the VAE's noise from the data (*): with its random ops on, "
                   f"ember.jit refused the step (their seeds are Python values): {errors[0]}" if errors else None)
        return program, jitted, [refused] if refused else []
    return None, None, [f"jit: {errors[-1]}"]


def interleaved_steps(sides: list[tuple[Program, Callable[..., Any] | None]], steps: int) -> list[list[float]]:
    """`steps` timed steps of each (program, step) side, in blocks of BLOCK_STEPS taking turns; each block starts
    once the process is idle (another library's spinning workers settled) and after one untimed step."""
    from ember.benchmark_files import load_suite

    settle = load_suite().settle
    times: list[list[float]] = [[] for _ in sides]
    while len(times[0]) < steps:
        for timed, (program, step) in zip(times, sides):
            settle()
            run_steps(program, 1, step)
            timed += [seconds for seconds, _ in run_steps(program, min(BLOCK_STEPS, steps - len(timed)), step)]
    return times


def measure(name: str, device: str, size: Size, steps: int, agreement_steps: int = 3) -> Report:
    """Time one program: ember's cold first step, then torch, ember eager and ember under ember.jit in turns
    (interleaved_steps)."""
    import ember

    report = Report(name)
    torch_program, ember_program = build_pair(name, device, size, deterministic=False)
    run_steps(torch_program, WARM_UP_STEPS)
    with ember.profile() as cold:
        report.ember_cold = run_steps(ember_program, 1)[0][0]
    report.cold_compiles = len(cold.compiles)
    report.cold_compile_seconds = sum(record.seconds for record in cold.compiles)
    run_steps(ember_program, WARM_UP_STEPS)
    with ember.profile() as warm:
        run_steps(ember_program, 1)
    report.kernels_per_step = len(warm.kernels)
    jitted_program, jitted, report.notes = jit_program(name, device, size)
    sides: list[tuple[Program, Callable[..., Any] | None]] = [(torch_program, None), (ember_program, None)]
    if jitted_program is not None:
        sides.append((jitted_program, jitted))
    try:
        times = interleaved_steps(sides, steps)
    except Exception as error:  # a replay failing while timed: the jit column says why, eager stays
        if jitted is None:
            raise
        report.notes.append(f"jit: {type(error).__name__}: {str(error).splitlines()[0][:110]}")
        sides, jitted = sides[:2], None
        times = interleaved_steps(sides, steps)
    report.torch_step, report.torch_mean = statistics.median(times[0]), statistics.mean(times[0])
    report.ember_step, report.ember_mean = statistics.median(times[1]), statistics.mean(times[1])
    if jitted is not None:
        report.ember_jit_step = statistics.median(times[2])
        report.kernels_per_jit_step = jitted.capture.kernels
    report.loss_difference = loss_agreement(name, device, size, agreement_steps)
    return report


def empty_cache_cold_step(name: str, device: str, threads: int | None) -> float:
    """ember's first step of a program in a fresh process whose kernel caches (ember's, PoCL's, Mesa's) are new empty
    folders: every kernel is lowered and compiled in the step, as on a new machine (issue 27's cold first step).
    The child runs this file with --cold-step and prints the seconds."""
    import os
    import subprocess
    import tempfile

    import ember

    # (the child imports the ember this process runs, installed or not)
    search_path = os.pathsep.join(filter(None, [str(Path(ember.__file__).resolve().parent.parent),
                                                os.environ.get("PYTHONPATH", "")]))
    with tempfile.TemporaryDirectory(prefix="ember-cold-step-") as folder:
        environment = dict(os.environ, EMBER_CACHE_DIR=os.path.join(folder, "ember"), PYTHONPATH=search_path,
                           POCL_CACHE_DIR=os.path.join(folder, "pocl"), MESA_SHADER_CACHE_DIR=os.path.join(folder, "mesa"))
        command = [sys.executable, str(Path(__file__).resolve()), "--cold-step", name, "--device", device]
        if threads:
            command += ["--threads", str(threads)]
        result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=900, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"the cold step of {name} failed: {(result.stderr or result.stdout).strip()[-300:]}")
    return float(lines[-1])


def cold_step(name: str, device: str) -> float:
    """The seconds of ember's first step of a program in this process (--cold-step: empty_cache_cold_step's child)."""
    _, ember_program = build_pair(name, device, Size(), deterministic=False)
    return run_steps(ember_program, 1)[0][0]


def format_reports(reports: list[Report]) -> str:
    """The table: milliseconds per step, ratios, the cold step, kernels per step, loss agreement."""
    def ms(value: float | None) -> str:
        return f"{value * 1e3:9.2f}" if value is not None else f"{'-':>9}"

    def ratio(value: float | None, base: float | None) -> str:
        return f"{value / base:6.2f}x" if value is not None and base else f"{'-':>7}"

    header = (f"| {'program':<12} | {'torch ms':>9} | {'ember ms':>9} | {'jit ms':>9} | {'eager/t':>7} | "
              f"{'jit/t':>7} | {'mean e/t':>8} | {'cold ms':>9} | {'cold: compiles, seconds':<23} | {'empty ms':>9} | "
              f"{'kernels':>7} | "
              f"{'jit kern':>8} | {'loss rel diff':>13} |")
    lines = [header, "|" + "|".join("-" * (len(cell)) for cell in header.split("|")[1:-1]) + "|"]
    for report in reports:
        cached = f"{report.cold_compiles} in {report.cold_compile_seconds:.2f} s"
        kernels = lambda count: f"{count:>7}" if count is not None else f"{'-':>7}"  # noqa: E731
        difference = f"{report.loss_difference:13.2e}" if report.loss_difference is not None else f"{'-':>13}"
        star = "*" if any(note.startswith("jit timed with dropout off") for note in report.notes) else " "
        lines.append(f"| {report.name:<12} | {ms(report.torch_step)} | {ms(report.ember_step)} | "
                     f"{ms(report.ember_jit_step)[1:]}{star} | {ratio(report.ember_step, report.torch_step)} | "
                     f"{ratio(report.ember_jit_step, report.torch_step)} | "
                     f"{ratio(report.ember_mean, report.torch_mean):>8} | {ms(report.ember_cold)} | {cached:<23} | "
                     f"{ms(report.empty_cache_cold)} | "
                     f"{kernels(report.kernels_per_step)} | {kernels(report.kernels_per_jit_step)[-8:]:>8} | "
                     f"{difference} |")
    notes = [f"  {report.name}: {note}" for report in reports for note in report.notes]
    return "\n".join(lines + (["notes:"] + notes if notes else []))


def run_programs(names: list[str] | None = None, steps: int = 10, quick: bool = False, device: str = "c",
                 log: Callable[[str], None] = print, empty_cache: bool = False,
                 threads: int | None = None, empty_cache_runs: int = EMPTY_CACHE_RUNS) -> list[Report]:
    """Measure the named programs (all by default); a program that fails is reported, not fatal. With
    `empty_cache`, also each program's first step in a fresh process with empty kernel caches (at the real size):
    the median of `empty_cache_runs` processes, each run listed in the report's notes."""
    size = QUICK if quick else Size()
    reports = []
    for name in names or list(PROGRAMS):
        log(f"{name} ...")
        try:
            reports.append(measure(name, device, size, steps))
        except Exception as error:
            traceback.print_exc()
            reports.append(Report(name, notes=[f"failed: {type(error).__name__}: {str(error).splitlines()[0][:120]}"]))
            continue
        if empty_cache:
            try:
                seconds = [empty_cache_cold_step(name, device, threads) for _ in range(max(1, empty_cache_runs))]
                reports[-1].empty_cache_cold = statistics.median(seconds)
                if len(seconds) > 1:
                    runs = ", ".join(f"{value:.2f}" for value in seconds)
                    reports[-1].notes.append(f"empty-cache first steps: {runs} s")
            except (RuntimeError, OSError, ValueError) as error:
                reports[-1].notes.append(f"empty-cache cold step: {str(error).splitlines()[0][:120]}")
    return reports


def set_threads(count: int) -> None:
    """`count` threads for torch and for ember's OpenMP kernels (OMP_NUM_THREADS, read when kernels first run)."""
    import os

    import torch

    os.environ["OMP_NUM_THREADS"] = str(count)
    torch.set_num_threads(count)


def main(argv: list[str] | None = None) -> int:
    """`python benchmarks/programs.py`: measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per implementation (default 10)")
    parser.add_argument("--program", action="append", choices=list(PROGRAMS), help="a program (repeatable)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, not a measurement)")
    parser.add_argument("--device", default="c", help="ember's device (default c)")
    parser.add_argument("--torch-device", help="torch's device (default: cuda when ember's is cuda and torch has "
                        "a GPU, else cpu)")
    parser.add_argument("--threads", type=int, help="threads for both torch and ember's OpenMP kernels (default: "
                        "each library's own; on a loaded machine 1 avoids threads waiting on each other)")
    parser.add_argument("--empty-cache", action="store_true", help="also time each program's first step in a fresh "
                        "process with empty kernel caches (the 'empty ms' column)")
    parser.add_argument("--empty-cache-runs", type=int, default=EMPTY_CACHE_RUNS, help="fresh processes per "
                        f"program for --empty-cache, their median shown (default {EMPTY_CACHE_RUNS}: one run on a "
                        "shared machine can be a third slower than the next)")
    parser.add_argument("--cold-step", choices=list(PROGRAMS), help=argparse.SUPPRESS)  # (--empty-cache's child)
    arguments = parser.parse_args(argv)
    if arguments.threads:
        set_threads(arguments.threads)
    if arguments.cold_step:
        print(cold_step(arguments.cold_step, arguments.device))
        return 0
    if arguments.torch_device:
        TORCH_DEVICE[0] = arguments.torch_device
    elif arguments.device.startswith("cuda"):
        import torch

        TORCH_DEVICE[0] = "cuda" if torch.cuda.is_available() else "cpu"
    reports = run_programs(arguments.program, arguments.steps, arguments.quick, arguments.device,
                           empty_cache=arguments.empty_cache, threads=arguments.threads,
                           empty_cache_runs=arguments.empty_cache_runs)
    print(f"\nmedian step times over {arguments.steps} steps (noisy: a shared machine); cold = ember's first step "
          "in this process, with its kernel compiles (a warm disk cache loads them in milliseconds); empty = the "
          "first step in a fresh process with empty kernel caches (--empty-cache: the median of --empty-cache-runs); "
          "kernels = "
          "launches per ember step (eager; jit: per replay); mean e/t = ember's mean eager step over torch's; * = jit "
          "timed with dropout off")
    print(format_reports(reports))
    return 1 if any(report.notes and report.notes[0].startswith("failed") for report in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
