"""The generators of the data utilities: a given ember.Generator, or one seeded from ember's global random numbers."""

from __future__ import annotations

from typing import Any

from ember.core.generator import Generator


def checked_generator(generator: Any, owner: str) -> Generator | None:
    """generator if it is an ember.Generator or None; otherwise a TypeError saying what is valid."""
    if generator is None or isinstance(generator, Generator):
        return generator
    raise TypeError(f"{owner}: generator must be an ember.Generator (ember.Generator().manual_seed(seed)) or None, "
                    f"got {type(generator).__module__}.{type(generator).__name__}")


def draw_seed(generator: Generator | None) -> int:
    """A seed in [0, 2**63): from generator as torch's int64 random_(generator=...) draws it (one 64-bit number),
    or, without one, from ember's global random numbers (so ember.manual_seed makes it reproducible)."""
    if generator is not None:
        return int(generator.random64(1)[0]) % (1 << 63)
    from ember.core.creation import randint

    return int(randint(0, (1 << 63) - 1, (1,)).item())


def fresh_generator(generator: Generator | None) -> Generator:
    """generator itself, or a new one seeded by draw_seed (torch's samplers without a generator do this)."""
    return generator if generator is not None else Generator().manual_seed(draw_seed(None))
