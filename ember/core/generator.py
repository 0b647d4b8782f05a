"""ember.Generator: a host-side Mersenne Twister with torch.Generator's seeding, for index shuffles (data loading).

It is the engine of torch's CPU generator (MT19937, seeded like torch's `mt19937(seed)`), so the permutations it
draws (`randperm`, by torch's Fisher-Yates) equal torch's for the same seed: a DataLoader, RandomSampler,
random_split or DistributedSampler given `ember.Generator().manual_seed(s)` orders samples exactly as torch's do
with `torch.Generator().manual_seed(s)`. Tensor random numbers (ember.rand, ...) do not use it: they come from the
counter-based generator of creation.py, computed in kernels.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

STATE_SIZE = 624  # MT19937's words of state
DEFAULT_SEED = 67280421310721  # torch.Generator()'s seed before manual_seed
SIXTY_FOUR_BIT_SWITCH = (2**32 - 1) // 20  # torch's randperm draws 64-bit numbers from this many elements on


def _initial_state(seed: int) -> np.ndarray:
    """MT19937's init_genrand(seed & 0xFFFFFFFF): the 624 words torch's mt19937(seed) starts from."""
    key = np.empty(STATE_SIZE, dtype=np.uint32)
    word = seed & 0xFFFFFFFF
    key[0] = word
    for position in range(1, STATE_SIZE):
        word = (1812433253 * (word ^ (word >> 30)) + position) & 0xFFFFFFFF
        key[position] = word
    return key


class Generator:
    """A seeded source of random 32-bit words on the host (torch.Generator's API for the CPU device)."""

    def __init__(self, device: Any = "cpu") -> None:
        self.device = device
        self._engine = np.random.MT19937()
        self.manual_seed(DEFAULT_SEED)

    def manual_seed(self, seed: int) -> Generator:
        """Seed the generator (any int in [-2**63, 2**64), as torch) and return it."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"Generator.manual_seed: the seed must be an int, got {type(seed).__name__}")
        seed = int(seed)
        if not -(2**63) <= seed < 2**64:
            raise ValueError(f"Generator.manual_seed: the seed must be in [-2**63, 2**64), got {seed}")
        self._seed = seed & 0xFFFFFFFFFFFFFFFF
        self._engine.state = {"bit_generator": "MT19937", "state": {"key": _initial_state(self._seed),
                                                                     "pos": STATE_SIZE}}
        return self

    def seed(self) -> int:
        """Seed from the operating system's entropy and return the seed (torch.Generator.seed)."""
        value = int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)
        self.manual_seed(value)
        return value

    def initial_seed(self) -> int:
        """The seed last given to manual_seed (or seed)."""
        return self._seed

    def get_state(self) -> dict[str, Any]:
        """The engine's state, for set_state (a dict, not torch's byte tensor)."""
        return {"seed": self._seed, "engine": self._engine.state}

    def set_state(self, new_state: dict[str, Any]) -> Generator:
        """Restore a state from get_state: the words drawn next repeat those drawn after it was taken."""
        if not isinstance(new_state, dict) or set(new_state) != {"seed", "engine"}:
            raise TypeError("Generator.set_state: expected the dict Generator.get_state returns")
        self._seed = new_state["seed"]
        self._engine.state = new_state["engine"]
        return self

    def random_words(self, count: int) -> np.ndarray:
        """The next `count` 32-bit words (uint64 array), torch's generator->random() each."""
        return self._engine.random_raw(count)

    def random64(self, count: int) -> np.ndarray:
        """The next `count` 64-bit numbers, each two words (the first the high half), as torch's random64()."""
        words = self.random_words(2 * count).reshape(count, 2)
        return (words[:, 0] << np.uint64(32)) | words[:, 1]

    def randperm(self, count: int) -> list[int]:
        """A permutation of range(count), the same as torch.randperm(count, generator=g) for the same state."""
        if count < 0:
            raise ValueError(f"randperm: count must be non-negative, got {count}")
        permutation = list(range(count))
        if count < SIXTY_FOUR_BIT_SWITCH:  # torch: swap each position with a later one, 32-bit draws
            draws = self.random_words(max(count - 1, 0)).tolist()
            for position, word in enumerate(draws):
                other = position + word % (count - position)
                permutation[position], permutation[other] = permutation[other], permutation[position]
            return permutation
        for position, word in enumerate(self.random64(count).tolist()):  # torch: the inside-out variant
            other = word % (position + 1)
            permutation[position], permutation[other] = permutation[other], permutation[position]
        return permutation

    def __repr__(self) -> str:
        return f"<ember.Generator seed={self._seed}>"
