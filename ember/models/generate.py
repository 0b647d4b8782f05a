"""Text generation with a key/value cache on the device: greedy decoding and sampling (temperature, top-k, top-p),
one token at a time as an iterator (streaming), and the text of such a stream piece by piece."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import ember as em
from ember.core.tensor import Tensor, realize
from ember.models.gemma import Gemma3, KVCache
from ember.models.tokenizer import SentencePieceTokenizer

CACHE_GRANULE = 128
PAD_ID = 0  # what fills a prompt up to its padded size (never seen: the mask is causal)


def check_sampling(temperature: float, top_k: int | None, top_p: float | None, caller: str) -> None:
    """Raise a ValueError naming the setting unless temperature >= 0, top_k >= 1 and 0 < top_p <= 1."""
    if temperature < 0 or (top_k is not None and top_k < 1) or (top_p is not None and not 0 < top_p <= 1):
        raise ValueError(f"{caller}: need temperature >= 0, top_k >= 1 and 0 < top_p <= 1, got temperature="
                         f"{temperature}, top_k={top_k}, top_p={top_p}")


def choose_token(logits: Tensor, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None) -> int:
    """The next token from logits (vocab,): the argmax when temperature is 0, else a sample of
    softmax(logits / temperature) restricted to the top_k most likely tokens and to the smallest set whose
    probability reaches top_p. The selection runs on the logits' device; only the chosen index is read back."""
    check_sampling(temperature, top_k, top_p, "choose_token")
    if temperature == 0 or top_k == 1:
        return int(logits.argmax().item())
    scaled = logits.cast(em.float32) / temperature
    if top_k is not None and top_k < scaled.shape[0]:
        threshold = scaled.topk(top_k).values[top_k - 1]
        scaled = em.where(scaled < threshold, -math.inf, scaled)
    probabilities = scaled.softmax(-1)
    order = None
    if top_p is not None and top_p < 1:
        probabilities, order = probabilities.sort(descending=True)
        before = probabilities.cumsum(0) - probabilities  # the mass of the more likely tokens
        probabilities = em.where(before < top_p, probabilities, 0.0)
    cumulative = probabilities.cumsum(0)
    draw = em.rand(1, device=logits.device) * cumulative[-1]
    index = (cumulative <= draw).sum().clamp(max=cumulative.shape[0] - 1)
    if order is not None:
        index = order[index]
    return int(index.item())


def generate(
    model: Gemma3,
    prompt_ids: Sequence[int],
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_ids: Sequence[int] = (),
    device: Any = None,
    cache_length: int | None = None,
) -> Iterator[int]:
    """Yield up to max_new_tokens tokens following prompt_ids, each as soon as it is chosen (stops after a token
    of stop_ids). The prompt runs in one pass (padded to `prompt_size`), then one token per step."""
    if not prompt_ids:
        raise ValueError("generate: the prompt needs at least one token (e.g. the model's beginning-of-text id)")
    if max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    check_sampling(temperature, top_k, top_p, "generate")
    if max_new_tokens == 0:
        return
    device = device or em.get_default_device()
    model.on_device(device)
    # the cache length is part of every step's kernels: rounding it up lets other prompts reuse the compiled step
    length = cache_length or -(-(len(prompt_ids) + max_new_tokens) // CACHE_GRANULE) * CACHE_GRANULE
    if length < len(prompt_ids) + max_new_tokens:
        raise ValueError(f"generate: cache_length {length} is shorter than the prompt ({len(prompt_ids)}) plus "
                         f"max_new_tokens ({max_new_tokens})")
    padded = min(prompt_size(len(prompt_ids)), length)
    cache = KVCache(model.config, length, device)
    with em.no_grad():
        last = em.tensor([len(prompt_ids) - 1], dtype=em.int64, device=device)
        logits = model.prefill([*prompt_ids, *[PAD_ID] * (padded - len(prompt_ids))], last, cache)
        for position in range(len(prompt_ids), len(prompt_ids) + max_new_tokens):
            realize(logits, *cache.keys, *cache.values)
            token = choose_token(logits, temperature, top_k, top_p)
            yield token
            if token in stop_ids or position == len(prompt_ids) + max_new_tokens - 1:
                return
            logits = model.step(token, em.tensor([position], dtype=em.int64, device=device), cache)


def prompt_size(tokens: int) -> int:
    """The length a prompt of `tokens` is padded to: a power of two from 8, then multiples of CACHE_GRANULE, so a
    few compiled prompt passes serve every prompt."""
    if tokens > CACHE_GRANULE:
        return -(-tokens // CACHE_GRANULE) * CACHE_GRANULE
    return max(8, 1 << (tokens - 1).bit_length())


def stream_text(tokens: Iterable[int], tokenizer: SentencePieceTokenizer) -> Iterator[str]:
    """The text of a stream of generated tokens, piece by piece as they come (control tokens left out). A piece
    is held back while it ends inside a character whose UTF-8 bytes are split over several byte tokens."""
    ids: list[int] = []
    shown = 0
    for token in tokens:
        ids.append(token)
        text = tokenizer.decode(ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            continue  # maybe the first bytes of a character: wait for the rest
        if len(text) > shown:
            yield text[shown:]
            shown = len(text)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if len(text) > shown:
        yield text[shown:]
