"""Realizing pauses Python's cyclic garbage collector and gives it back as it found it (ember/collection_pause.py)."""

import gc

import numpy as np
import pytest

import ember as em
from ember.collection_pause import collection_paused


def _realize_and_watch(monkeypatch) -> list[bool]:
    """Realize a small graph, recording whether the collector was on while its kernels were chosen (lowered here,
    not read from the disk cache of lowered kernels)."""
    from ember.ir import lowered_cache, opt
    from ember.scheduler import compile_cache

    seen: list[bool] = []
    callbacks = gc.callbacks
    original = opt.choose_plan

    def watching(*arguments):
        seen.append(gc.isenabled())
        return original(*arguments)

    monkeypatch.setattr(opt, "choose_plan", watching)
    monkeypatch.setattr(lowered_cache, "load", lambda *arguments: None)
    monkeypatch.setattr(compile_cache, "COMPILED", type(compile_cache.COMPILED)())
    x = em.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    value = ((x * 3.5 + 1).exp().sum(1) + 0.123456).numpy()
    np.testing.assert_allclose(value, (np.exp(np.arange(12, dtype=np.float32).reshape(3, 4) * 3.5 + 1)).sum(1)
                               + 0.123456, rtol=1e-5)
    assert gc.callbacks is callbacks
    return seen


def test_realize_pauses_the_collector_and_turns_it_back_on(monkeypatch):
    assert gc.isenabled()
    seen = _realize_and_watch(monkeypatch)
    assert seen and not any(seen), "kernels were lowered with the collector on"
    assert gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off(monkeypatch):
    gc.disable()
    try:
        _realize_and_watch(monkeypatch)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_nested_pauses_and_errors_give_the_collector_back():
    with pytest.raises(RuntimeError, match="inside"):
        with collection_paused():
            with collection_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
            raise RuntimeError("inside")
    assert gc.isenabled()
