"""Jitted functions share the memory of their intermediates (ember.JitMemoryPool): three functions of different sizes
(an encoder, a larger "transformer", a decoder that keeps state) need, together, no more than 1.1x the memory of the
largest alone (as memory_plan reports it), and each one's results and state stay right after the others ran, in
every order, against torch."""

from __future__ import annotations

import gc
import itertools
from collections.abc import Callable

import numpy as np
import pytest
import torch

import ember as em
from ember.capture.arena import ArenaView
from ember.capture.shared_arena import DEFAULT_POOL
from ember.scheduler.buffers import release_finished
from ember.scheduler.devices import get_device
from tests.helpers import assert_close, compiled_sizes, compiled_sizes_change, isolated_compile_cache
from tests.test_jit_arena import queued  # noqa: F401 - the deferred-command device with views, as a fixture

ROWS = 6


def _weights(seed: int, shapes: list[tuple[int, int]]) -> list[np.ndarray]:
    generator = np.random.default_rng(seed)
    return [(generator.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32) for shape in shapes]


ENCODER = _weights(1, [(12, 24), (24, 12)])
TRANSFORMER = _weights(2, [(12, 96), (96, 96), (96, 12)])
DECODER = _weights(3, [(12, 48), (48, 12)])


def encode(module: object, x: object, weights: list[object]) -> object:
    hidden = (x @ weights[0]).tanh()  # type: ignore[operator]
    return (hidden @ weights[1]) + hidden.mean(-1, keepdim=True)  # type: ignore[attr-defined]


def transform(module: object, x: object, weights: list[object]) -> object:
    wide = (x @ weights[0]).relu()  # type: ignore[operator]
    mixed = module.softmax(wide @ weights[1], -1) * wide  # type: ignore[attr-defined]
    scores = module.softmax(mixed @ mixed.transpose(0, 1), -1)  # type: ignore[attr-defined]
    return (scores @ mixed) @ weights[2] + x


def decode(module: object, x: object, weights: list[object]) -> object:
    hidden = (x @ weights[0]).sigmoid()  # type: ignore[operator]
    return hidden @ weights[1] - hidden.square().mean()  # type: ignore[attr-defined]


def _truth(function: Callable[..., object], x: np.ndarray, weights: list[np.ndarray]) -> np.ndarray:
    """The function in torch, in float64."""
    values = [torch.tensor(array, dtype=torch.float64) for array in (x, *weights)]
    return function(torch, values[0], values[1:]).numpy()  # type: ignore[attr-defined]


FUNCTIONS = [(encode, ENCODER), (transform, TRANSFORMER), (decode, DECODER)]  # captured smallest first


def _jitted(device: str, pool: em.JitMemoryPool | None) -> tuple[list[object], em.Tensor]:
    """The three jitted functions (the decoder also adds its output's column sums to a state tensor in place)."""
    state = em.zeros(12, device=device)
    tensors = [[em.tensor(array, device=device) for array in weights] for _, weights in FUNCTIONS]

    def run_encoder(x: em.Tensor) -> em.Tensor:
        return encode(em.Tensor, x, tensors[0])  # type: ignore[return-value]

    def run_transformer(x: em.Tensor) -> em.Tensor:
        return transform(em.Tensor, x, tensors[1])  # type: ignore[return-value]

    def run_decoder(x: em.Tensor) -> em.Tensor:
        result = decode(em.Tensor, x, tensors[2])
        state.add_(result.sum(0))  # type: ignore[attr-defined]
        return result  # type: ignore[return-value]

    return [em.jit(function, memory_pool=pool) for function in (run_encoder, run_transformer, run_decoder)], state


def _inputs(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(ROWS, 12)).astype(np.float32)


def test_three_functions_need_the_memory_of_the_largest(device: str) -> None:
    alone = []
    for index in range(3):  # each function alone, in a pool of its own
        pool = em.JitMemoryPool()
        functions, _ = _jitted(device, pool)
        for seed in range(3):
            functions[index](em.tensor(_inputs(seed), device=device))
        plan = functions[index].memory_plan[device]  # type: ignore[attr-defined]
        assert plan.shared_by == 1 and plan.shared_bytes == plan.planned_bytes == pool.bytes_on(device)
        alone.append(plan.planned_bytes)
    pool = em.JitMemoryPool()
    functions, _ = _jitted(device, pool)
    for function in functions:  # captured smallest first: the memory grows, the earlier captures move into it
        for seed in range(3):
            function(em.tensor(_inputs(seed), device=device))
    shared = pool.bytes_on(device)
    plans = [function.memory_plan[device] for function in functions]  # type: ignore[attr-defined]
    for function, plan in zip(functions, plans):
        print(f"{function.__name__}: {plan}")  # type: ignore[attr-defined]
        assert str(plan).endswith(f"in the pool's shared memory of {shared} bytes used by 3 jitted function(s)")
    print(f"alone {alone} bytes, sum {sum(alone)}; shared {shared} bytes")
    assert [plan.planned_bytes for plan in plans] == alone  # (the same captures)
    assert all(plan.shared_bytes == shared and plan.shared_by == 3 for plan in plans)
    assert max(alone) <= shared <= 1.1 * max(alone) and sum(alone) > 1.3 * shared
    pieces = {id(buffer.arena): buffer.arena for function in functions for buffer in function.capture.buffers
              if isinstance(buffer, ArenaView)}  # type: ignore[attr-defined]
    assert sum(piece.nbytes for piece in pieces.values()) == shared  # no capture still holds memory of its own
    if get_device(device).pool.view_alignment:
        assert len(pieces) == 1 and plans[1].arena  # one arena, as large as the transformer's


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_interleaved_calls_keep_every_result_and_state(device: str, order: tuple[int, ...]) -> None:
    pool = em.JitMemoryPool()
    functions, state = _jitted(device, pool)
    expected_state = np.zeros(12)
    seed = 0
    for _ in range(2):  # the first two calls of each (eager, then captured), in this order
        for index in order:
            seed += 1
            functions[index](em.tensor(_inputs(seed), device=device))
            if index == 2:
                expected_state += _truth(decode, _inputs(seed), DECODER).sum(0)
    for _ in range(2):  # replays, each function's result kept while the others run on the same memory
        kept: list[tuple[em.Tensor, np.ndarray]] = []
        for index in order:
            seed += 1
            result = functions[index](em.tensor(_inputs(seed), device=device))
            truth = _truth(FUNCTIONS[index][0], _inputs(seed), FUNCTIONS[index][1])
            if index == 2:
                expected_state += truth.sum(0)
            kept.append((result, truth))
        for result, truth in kept:
            assert_close(result, truth, atol=1e-5, rtol=1e-4)
        assert_close(state, expected_state, atol=1e-4, rtol=1e-4)
    assert all(function.replays == 2 for function in functions)  # type: ignore[attr-defined]
    assert pool.bytes_on(device) > 0


def test_jitted_functions_share_by_default_and_memory_goes_with_them(device: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    isolated_compile_cache(monkeypatch)  # (the shape-class members it compiles are its own, and kept)
    gc.collect()
    release_finished(wait=True)
    before, sizes_before = get_device(device).pool.used_bytes, compiled_sizes()
    functions, state = _jitted(device, None)
    for function in functions:
        for seed in range(3):
            function(em.tensor(_inputs(seed), device=device))
        assert function.capture.memory_pool is DEFAULT_POOL  # type: ignore[attr-defined]
    assert all(function.memory_plan[device].shared_by >= 3 for function in functions)  # type: ignore[attr-defined]
    pieces = {id(buffer.arena) for function in functions for buffer in function.capture.buffers
              if isinstance(buffer, ArenaView)}  # type: ignore[attr-defined]
    largest = max(function.memory_plan[device].buffers for function in functions)  # type: ignore[attr-defined]
    assert len(pieces) <= largest  # (1 with an arena; else at most the largest capture's buffer count)
    del functions, function, state
    gc.collect()
    release_finished(wait=True)
    # the captures and their shared memory are gone (kernels compiled as shape classes' members keep their sizes)
    assert get_device(device).pool.used_bytes <= before + compiled_sizes_change(sizes_before)


def test_memory_pool_must_be_a_pool() -> None:
    with pytest.raises(TypeError, match="memory_pool must be an ember.JitMemoryPool, got str"):
        em.jit(lambda x: x, memory_pool="shared")  # type: ignore[arg-type]


def test_a_replay_waits_for_the_previous_users_pending_commands(queued: object) -> None:
    """On a device whose commands run only when waited for (a stand-in for several queues), a replay of another
    function first waits for the commands still pending on the shared memory, and both results stay right."""
    device = queued.name  # type: ignore[attr-defined]
    pool = em.JitMemoryPool()
    functions, _ = _jitted(device, pool)
    encoder, transformer = functions[0], functions[1]
    for seed in range(2):
        encoder(em.tensor(_inputs(seed), device=device))
        transformer(em.tensor(_inputs(seed), device=device))
    release_finished(wait=True)
    first = encoder(em.tensor(_inputs(10), device=device))  # a replay: its kernels wait in the queue
    waiting = [event for event in queued.log.pending if not event.finished]  # type: ignore[attr-defined]
    assert any(not event.label.startswith("copy") for event in waiting)
    second = transformer(em.tensor(_inputs(11), device=device))
    assert all(event.finished for event in waiting)  # the encoder's commands ran before the transformer's
    assert encoder.replays == 1 and transformer.replays == 1  # type: ignore[attr-defined]
    assert_close(first, _truth(encode, _inputs(10), ENCODER), atol=1e-5, rtol=1e-4)
    assert_close(second, _truth(transform, _inputs(11), TRANSFORMER), atol=1e-5, rtol=1e-4)
    assert queued.log.unsafe_frees == []  # type: ignore[attr-defined]
