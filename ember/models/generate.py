"""Text generation with a key/value cache on the device: greedy decoding and sampling (temperature, top-k, top-p),
one token at a time as an iterator (streaming), and the text of such a stream piece by piece."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import ember as em
from ember.core.tensor import Tensor, realize
from ember.models.decoder import Decoder, KVCache
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
    softmax(logits / temperature) restricted to the top_k most likely tokens (ties at the k-th value kept) and to
    the smallest set of the most likely tokens whose probability reaches top_p (ties at its edge kept).

    Everything runs on the logits' device and nothing is sorted (a sort of a 262k vocabulary is hundreds of
    kernels): the k-th largest value and the nucleus' smallest probability are found by bisection over the
    values' bit patterns (32 small reductions each, only a count or a mass read back), and the sample is the
    argmax of the logits plus Gumbel noise, which is distributed as softmax(logits)."""
    check_sampling(temperature, top_k, top_p, "choose_token")
    if temperature == 0 or top_k == 1:
        return int(logits.argmax().item())
    scaled = logits.cast(em.float32) / temperature
    if top_k is not None and top_k < scaled.shape[0]:
        keys = _ordered_keys(scaled).realize()
        kth = _largest_threshold(keys, lambda kept: kept.sum(), top_k)
        scaled = em.where(keys >= kth, scaled, -math.inf)
    if top_p is not None and top_p < 1:
        probabilities = scaled.softmax(-1).realize()
        keys = _ordered_keys(probabilities).realize()
        smallest = _largest_threshold(keys, lambda kept: em.where(kept, probabilities, 0.0).sum(), top_p)
        scaled = em.where(keys >= smallest, scaled, -math.inf)
    uniform = em.rand(*scaled.shape, device=scaled.device)
    return int((scaled - (-uniform.log()).log()).argmax().item())


def _ordered_keys(values: Tensor) -> Tensor:
    """int32 keys of float32 values in the same order (the bit pattern, with the negatives' magnitude bits flipped)."""
    bits = values.bitcast(em.int32)
    return em.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def _largest_threshold(keys: Tensor, measure: Callable[[Tensor], Tensor], target: float) -> Tensor:
    """The largest key t whose set {keys >= t} measures at least target (measure grows as t falls), as a device
    tensor; by bisection over the int32 range, one reduction and one number read back per halving."""
    low, high = int(keys.min().item()), int(keys.max().item()) + 1  # measure(low) >= target > measure(high)
    while high - low > 1:
        middle = (low + high) // 2
        threshold = em.tensor([middle], dtype=em.int32, device=keys.device)
        if float(measure(keys >= threshold).item()) >= target:
            low = middle
        else:
            high = middle
    return em.tensor([low], dtype=em.int32, device=keys.device)


def generate(
    model: Decoder,
    prompt_ids: Sequence[int],
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_ids: Sequence[int] = (),
    device: Any = None,
    cache_length: int | None = None,
    jit: bool = True,
) -> Iterator[int]:
    """Yield up to max_new_tokens tokens following prompt_ids, each as soon as it is chosen (stops after a token
    of stop_ids). The prompt runs in one pass (padded to `prompt_size`), then one token per step, the cache written
    in place; with jit (the default) the steps replay the kernels the model captured (`Decoder.step`) instead of
    building each step's graph."""
    if not prompt_ids:
        raise ValueError("generate: the prompt needs at least one token (e.g. the model's beginning-of-text id)")
    if max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    check_sampling(temperature, top_k, top_p, "generate")
    if max_new_tokens == 0:
        return
    device = device or em.get_default_device()
    model.on_device(device)
    length = cache_length or default_cache_length(len(prompt_ids) + max_new_tokens)
    if length < len(prompt_ids) + max_new_tokens:
        raise ValueError(f"generate: cache_length {length} is shorter than the prompt ({len(prompt_ids)}) plus "
                         f"max_new_tokens ({max_new_tokens})")
    padded = min(prompt_size(len(prompt_ids)), length)
    cache = KVCache(model.config, length, device)
    greedy = temperature == 0 or top_k == 1
    with em.no_grad():
        last = em.tensor([len(prompt_ids) - 1], dtype=em.int64, device=device)
        logits = model.prefill([*prompt_ids, *[PAD_ID] * (padded - len(prompt_ids))], last, cache)
        for position in range(len(prompt_ids), len(prompt_ids) + max_new_tokens):
            realize(logits, *cache.keys, *cache.values)
            token = model.greedy_token(logits) if greedy else choose_token(logits, temperature, top_k, top_p)
            yield token
            if token in stop_ids or position == len(prompt_ids) + max_new_tokens - 1:
                return
            logits = model.step(token, position, cache, jit=jit)


def default_cache_length(tokens: int) -> int:
    """The cache length `generate` gives a prompt and its new tokens (`tokens` in all): rounded up to a multiple of
    CACHE_GRANULE. The length is part of every step's kernels: rounding it up lets other prompts reuse them."""
    return -(-tokens // CACHE_GRANULE) * CACHE_GRANULE


def prompt_size(tokens: int) -> int:
    """The length a prompt of `tokens` is padded to: a power of two from 8, then multiples of CACHE_GRANULE, so a
    few compiled prompt passes serve every prompt."""
    if tokens > CACHE_GRANULE:
        return default_cache_length(tokens)
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
