"""ember's one decoder (models/decoder.py) on GGUF files of each architecture it reads (Llama, Qwen2, Qwen3,
Gemma-3) against transformers + PyTorch loading the same file: the file is written by the test with the gguf
package's writer (tiny random weights, float32 or Q8_0 matrices), and the logits of a prompt's pass and of each
decode step after it must match transformers' logits of the whole sequence at those positions."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ember as em
from tests.conftest import TEST_DEVICES
from tests.helpers import unbound_launches

gguf = pytest.importorskip("gguf", reason="the test writes GGUF files with the gguf package (ember[models])")
transformers = pytest.importorskip("transformers", reason="needs transformers (the reference; ember[test])")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.xdist_group("models")

VOCAB, HIDDEN, LAYERS, FEED_FORWARD, HEADS, KV_HEADS, HEAD_DIM = 96, 32, 2, 64, 4, 2, 8  # Q8_0: rows of 32k
TOKENS = [1, 17, 5, 60, 33, 8, 91, 2, 44, 12]  # the first PROMPT run in one pass, the rest one step at a time
PROMPT = 4


# a SentencePiece vocabulary that spells lower-case words: unknown, begin, end, the word mark, letters, fillers
LETTERS = ["<unk>", "<s>", "</s>", "\u2581", *"abcdefghijklmnopqrstuvwxyz"]
VOCABULARY = LETTERS + [f"t{index}" for index in range(VOCAB - len(LETTERS))]


def write_gguf(path: Path, architecture: str, quantized: bool, seed: int = 0) -> Path:
    """A tiny `architecture` model with random weights; with `quantized` its matrices are Q8_0 blocks."""
    generator = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FEED_FORWARD)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    if architecture == "gemma3":
        writer.add_sliding_window(3)  # shorter than the sequence: the sliding layers' window is exercised
    writer.add_tokenizer_model("llama" if architecture in ("llama", "gemma3") else "gpt2")
    writer.add_token_list(VOCABULARY)
    writer.add_token_scores([0.0] * VOCAB)
    writer.add_token_types([2, 3, 3] + [1] * (VOCAB - 3))  # unknown, control, control, then normal pieces
    if architecture not in ("llama", "gemma3"):
        writer.add_token_merges([])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def add(name: str, *shape: int, scale: float = 0.2, offset: float = 0.0) -> None:
        values = (generator.standard_normal(shape) * scale + offset).astype(np.float32)
        if quantized and len(shape) == 2:
            blocks = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, values)

    add("token_embd.weight", VOCAB, HIDDEN)
    add("output_norm.weight", HIDDEN, offset=1.0)
    if architecture != "gemma3":  # Gemma's output is the embedding table
        add("output.weight", VOCAB, HIDDEN)
    for layer in range(LAYERS):
        prefix = f"blk.{layer}."
        add(prefix + "attn_norm.weight", HIDDEN, offset=1.0)
        add(prefix + "attn_q.weight", HEADS * HEAD_DIM, HIDDEN)
        add(prefix + "attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        add(prefix + "attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        add(prefix + "attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
        add(prefix + "ffn_norm.weight", HIDDEN, offset=1.0)
        add(prefix + "ffn_gate.weight", FEED_FORWARD, HIDDEN)
        add(prefix + "ffn_up.weight", FEED_FORWARD, HIDDEN)
        add(prefix + "ffn_down.weight", HIDDEN, FEED_FORWARD)
        if architecture == "qwen2":
            for name, rows in (("attn_q", HEADS * HEAD_DIM), ("attn_k", KV_HEADS * HEAD_DIM),
                               ("attn_v", KV_HEADS * HEAD_DIM)):
                add(prefix + f"{name}.bias", rows)
        if architecture in ("qwen3", "gemma3"):
            add(prefix + "attn_q_norm.weight", HEAD_DIM, offset=1.0)
            add(prefix + "attn_k_norm.weight", HEAD_DIM, offset=1.0)
        if architecture == "gemma3":
            add(prefix + "post_attention_norm.weight", HIDDEN, offset=1.0)
            add(prefix + "post_ffw_norm.weight", HIDDEN, offset=1.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def reference_model(path: Path, architecture: str) -> Any:
    """transformers' float32 model of the same file."""
    config = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    config.head_dim = HEAD_DIM  # transformers reads no key_length for some architectures
    if architecture == "gemma3":
        config.sliding_window, config.query_pre_attn_scalar = 3, HEAD_DIM
    return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, config=config,
                                                             dtype=torch.float32)


def reference_logits(path: Path, architecture: str, tokens: list[int] = TOKENS) -> np.ndarray:
    """transformers' float32 logits (tokens, vocab) of `tokens` from the same file."""
    with torch.no_grad():
        return reference_model(path, architecture)(torch.tensor([tokens])).logits[0].numpy()


def ember_logits(path: Path, device: str, jit: bool = False) -> np.ndarray:
    """ember's logits: the prompt's pass (its last position), then one decode step per further token."""
    from ember.models.decoder import Decoder, KVCache

    model = Decoder.from_gguf(path)
    model.on_device(device)
    cache = KVCache(model.config, 16, device)
    rows = []
    with em.no_grad():
        last = em.tensor([PROMPT - 1], dtype=em.int64, device=device)
        rows.append(model.prefill(TOKENS[:PROMPT], last, cache).numpy())
        for position in range(PROMPT, len(TOKENS)):
            rows.append(model.step(TOKENS[position], position, cache, jit=jit).numpy())
        if jit:
            with pytest.raises(IndexError, match=rf"ids \[{VOCAB}\] are outside the table of {VOCAB} rows"):
                model.step(VOCAB, len(TOKENS), cache, jit=True)
    return np.stack(rows)


@pytest.mark.parametrize("quantized", [False, True], ids=["float32", "q8_0"])
@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3", "gemma3"])
def test_decoder_matches_transformers_on_the_same_gguf_file(architecture: str, quantized: bool,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The products in floats match transformers' closely; with a quantized file, the decode steps' products in
    integers (the c backend's default on a CPU with byte dot products: the input rounded to int8 per block) match
    within that rounding."""
    from ember.io import quantized_dot

    path = write_gguf(tmp_path / f"{architecture}.gguf", architecture, quantized)
    expected = reference_logits(path, architecture)[PROMPT - 1:]
    if quantized:
        integer = ember_logits(path, "c")
        np.testing.assert_allclose(integer, expected, atol=0.05 * np.abs(expected).max())
        # jitted steps unpack the token's row of the quantized table inside their replays: the eager steps' logits
        np.testing.assert_allclose(ember_logits(path, "c", jit=True), integer, atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(quantized_dot, "INTEGER_FORMATS", frozenset())
    actual = ember_logits(path, "c")
    np.testing.assert_allclose(actual, expected, atol=2e-4, rtol=1e-3)
    assert (actual.argmax(-1) == expected.argmax(-1)).all()


@pytest.mark.parametrize("device", TEST_DEVICES)
def test_greedy_token_replays_the_argmax_of_new_logits(device: str, tmp_path: Path) -> None:
    """A model's greedy choice is a jitted argmax it holds: its replays give torch's argmax of each call's logits,
    whether they come in new tensors or overwrite one in place (as a decode step's do), with ties and NaN, and
    another size of logits has a capture of its own."""
    from ember.models.decoder import Decoder

    model = Decoder.from_gguf(write_gguf(tmp_path / "llama.gguf", "llama", quantized=False))
    generator = np.random.default_rng(11)
    overwritten = em.zeros(1000, device=device).contiguous().realize()
    for call in range(8):
        values = generator.normal(size=1000).astype(np.float32)
        if call == 3:
            values[[10, 700]] = values.max() + 1  # a tie: the first index
        if call == 5:
            values[400] = np.nan
        expected = int(torch.from_numpy(values).argmax())
        assert model.greedy_token(em.tensor(values, device=device)) == expected, call
        em.realize(overwritten.assign(em.tensor(values, device=device)))
        assert model.greedy_token(overwritten) == expected, call
    small = generator.normal(size=7).astype(np.float32)
    assert model.greedy_token(em.tensor(small, device=device)) == int(small.argmax())
    jitted = [model._jitted_argmax[(1000,), em.float32, device], model._jitted_argmax[(7,), em.float32, device]]
    assert [(function.captures, function.replays) for function in jitted] == [(1, 14), (0, 0)]


# a prompt that ends just before the first edge of the steps' attended slots (ATTENDED_GRANULE), steps after it
LONG_PROMPT = 124
LONG_TOKENS = [int(token) for token in np.random.default_rng(7).integers(3, VOCAB, size=LONG_PROMPT + 10)]
LONG_CACHE = 1024


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3", "gemma3"])
def test_steps_over_a_long_cache_match_transformers_across_attended_buckets(architecture: str, jit: bool,
                                                                          tmp_path: Path) -> None:
    """Decode steps in a cache of LONG_CACHE slots attend over the filled slots rounded up to ATTENDED_GRANULE: the
    logits of steps on both sides of a bucket's edge (positions 124..133, buckets of 128 and 256 slots) are
    transformers' logits of the whole sequence; under ember.jit the model keeps one capture per bucket."""
    from ember.models.decoder import ATTENDED_GRANULE, Decoder, KVCache

    assert LONG_PROMPT < ATTENDED_GRANULE < len(LONG_TOKENS) - 1
    path = write_gguf(tmp_path / f"{architecture}.gguf", architecture, quantized=False)
    expected = reference_logits(path, architecture, LONG_TOKENS)[LONG_PROMPT - 1:]
    model = Decoder.from_gguf(path)
    model.on_device("c")
    cache = KVCache(model.config, LONG_CACHE, "c")
    with em.no_grad():
        last = em.tensor([LONG_PROMPT - 1], dtype=em.int64, device="c")
        rows = [model.prefill(LONG_TOKENS[:LONG_PROMPT], last, cache).numpy()]
        for position in range(LONG_PROMPT, len(LONG_TOKENS)):
            rows.append(model.step(LONG_TOKENS[position], position, cache, jit=jit).numpy())
    np.testing.assert_allclose(np.stack(rows), expected, atol=2e-4, rtol=1e-3)
    if jit:
        assert sorted(model._jitted_steps) == [(LONG_CACHE, 128, cache.device), (LONG_CACHE, 256, cache.device)]
        # 4 steps in the first bucket (a capture after two eager calls), 6 in the second (likewise)
        assert [(decode.captures, decode.replays) for decode in model._jitted_steps.values()] == [(1, 2), (1, 4)]
        # the token's embedding and position are staged into the same buffers at every step: with the caches, the
        # replays after the first of a bucket run every launch bound (one joined call on c)
        capture = model._jitted_steps[LONG_CACHE, 256, cache.device].capture
        # (on c the launches touching the inputs are pointed at them in place: Capture.rebinding)
        bound = capture.rebinding[0] if capture.rebinding is not None else capture.bound_with_inputs
        assert bound is not None and not unbound_launches(capture, bound)
        # a dropped model's captures go at once (no cycle through its steps: their jit memory is freed now)
        gone = weakref.ref(capture)
        enabled = gc.isenabled()
        gc.disable()
        try:
            del model, capture, cache
            assert gone() is None
        finally:
            if enabled:
                gc.enable()
    else:
        assert not model._jitted_steps


@pytest.mark.parametrize("cache_length", [2048, 200])
def test_generate_with_a_long_cache_chooses_transformers_greedy_tokens(cache_length: int, tmp_path: Path) -> None:
    """generate() with a long cache (jitted steps crossing from 128 attended slots to 256, or to all 200 of a cache
    whose length is no multiple of 128) continues a prompt with transformers' greedy tokens, on Gemma-3's
    architecture."""
    from ember.models.decoder import Decoder
    from ember.models.generate import generate

    path = write_gguf(tmp_path / "gemma3.gguf", "gemma3", quantized=False, seed=3)
    prompt = LONG_TOKENS[:LONG_PROMPT]
    reference = reference_model(path, "gemma3")
    with torch.no_grad():
        output = reference.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=12)
    expected = output[0, LONG_PROMPT:].tolist()
    model = Decoder.from_gguf(path)
    assert list(generate(model, prompt, max_new_tokens=12, device="c", cache_length=cache_length)) == expected
    assert sorted(attended for _, attended, _ in model._jitted_steps) == [128, min(256, cache_length)]


def step_flops(model: Any, cache: Any, token: int, position: int) -> int:
    """The arithmetic of one eager decode step's kernels but the writes into the cache (a select over the slots of
    the step's write window, by design): what each layer's realize of its query computes (the layer before it:
    attention, MLP) and what the logits' graph computes (the last layer's attention and MLP, the output
    projection). The cache is realized first (the prefill's pass is not the step's)."""
    em.realize(*cache.keys, *cache.values)
    from ember.models import decoder
    from ember.scheduler.kernelize import kernelize
    from ember.scheduler.program import Launch

    def flops(tensor: Any) -> int:
        return sum(item.kernel.flops for item in kernelize([tensor.node]) if isinstance(item, Launch))

    counted: list[int] = []

    def counting_realize(*tensors: Any) -> None:
        counted.append(flops(tensors[0]))  # a layer's query (its own products of the normed stream and before)
        realize(*tensors)

    realize = decoder.realize
    with pytest.MonkeyPatch.context() as patch, em.no_grad():
        patch.setattr(decoder, "realize", counting_realize)
        logits = model.step(token, position, cache)
        counted.append(flops(logits))
    logits.realize()
    assert len(counted) == model.config.layers + 1
    return sum(counted)


@pytest.mark.parametrize("architecture", ["llama", "gemma3"])
def test_a_step_in_a_long_cache_does_the_attention_work_of_its_bucket(architecture: str, tmp_path: Path) -> None:
    """A decode step at position 10 of a 2048-slot cache computes exactly what it computes in a 128-slot cache (its
    attention reads 128 slots, not 2048), and less than a step at position 130 (256 slots). The tiny Gemma-3's
    layers all slide (window 3): a step at position 1000 reads slots 894..1023 of the 1024 filled ones' bucket,
    as many as one at 130 reads (126..255), so it computes exactly as much; Llama's global layers read 1024."""
    from ember.models.decoder import Decoder, KVCache

    path = write_gguf(tmp_path / f"{architecture}.gguf", architecture, quantized=False)
    model = Decoder.from_gguf(path)
    model.on_device("c")
    tokens = [int(token) for token in np.random.default_rng(8).integers(3, VOCAB, size=1001)]
    work = {}
    for length, position in ((128, 10), (2048, 10), (2048, 130), (2048, 1000)):
        cache = KVCache(model.config, length, "c")
        with em.no_grad():
            model.prefill(tokens[:position], em.tensor([position - 1], dtype=em.int64, device="c"), cache)
        work[length, position] = step_flops(model, cache, tokens[position], position)
    assert work[2048, 10] == work[128, 10] < work[2048, 130]
    if architecture == "gemma3":
        assert all(model.config.is_sliding(layer) for layer in range(LAYERS))
        assert work[2048, 1000] == work[2048, 130]
    else:
        assert work[2048, 1000] > work[2048, 130]


@pytest.mark.parametrize("views", [True, False], ids=["window views", "no views"])
def test_a_step_writes_its_slot_through_a_window_of_the_cache(views: bool, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode step in a 2048-slot cache writes its key and value by kernels over its write window (the bucket's
    last 128 slots, views of the cache's memory: KVCache.windows), not over the 2048 slots; where the device makes
    no views (view_alignment 0), by a select over the whole cache. Either way every step's logits (eager and
    jitted, across the 128-slot bucket's edge) are transformers' and the slots outside the window keep their
    values."""
    from ember.models.decoder import ATTENDED_GRANULE, Decoder, KVCache
    from ember.scheduler.devices import get_device

    if not views:
        monkeypatch.setattr(get_device("c").pool, "view_alignment", 0)
    length, kv_heads = 2048, 2
    path = write_gguf(tmp_path / "llama.gguf", "llama", quantized=False)
    expected = reference_logits(path, "llama", LONG_TOKENS)[LONG_PROMPT - 1:]
    model = Decoder.from_gguf(path)
    model.on_device("c")
    assert model.config.kv_heads == kv_heads
    cache = KVCache(model.config, length, "c")
    rows, sizes = [], []
    with em.no_grad():
        last = em.tensor([LONG_PROMPT - 1], dtype=em.int64, device="c")
        rows.append(model.prefill(LONG_TOKENS[:LONG_PROMPT], last, cache).numpy())
        em.realize(*cache.keys, *cache.values)  # (the prompt's pass: not a step's)
        prompt_keys = cache.keys[0].numpy()[:LONG_PROMPT].copy()
        for position in range(LONG_PROMPT, len(LONG_TOKENS)):
            with em.profile() as record:
                rows.append(model.step(LONG_TOKENS[position], position, cache, jit=position % 2 == 0).numpy())
            sizes += [kernel.global_size for kernel in record.kernels]
    np.testing.assert_allclose(np.stack(rows), expected, atol=2e-4, rtol=1e-3)
    assert (cache.keys[0].numpy()[:LONG_PROMPT] == prompt_keys).all()
    assert not cache.keys[0].numpy()[len(LONG_TOKENS):].any()  # the slots after the filled ones: still padding
    windows = cache.windows(0, ATTENDED_GRANULE), cache.windows(ATTENDED_GRANULE, 2 * ATTENDED_GRANULE)
    # a select over the whole cache has at least this many work items (16 lanes, the widest vectors, an item)
    whole_cache = length * kv_heads * model.config.head_dim // 16
    if views:
        assert all(pair is not None for pair in windows) and max(sizes) < whole_cache
    else:
        assert windows == (None, None) and max(sizes) >= whole_cache


def test_region_views_write_a_run_of_a_tensors_memory() -> None:
    """region_view: elements [start, start + size) of a realized tensor's buffer as a tensor of their own; an
    in-place assign of it writes them (region_written says so) and nothing else; None where the pool makes no view
    at that offset, or the tensor is not realized."""
    from ember.io.in_place import region_view, region_written

    values = np.arange(4 * 6 * 8, dtype=np.float32).reshape(4 * 6, 8)
    whole = em.tensor(values, device="c").realize()
    region = region_view(whole, 8 * 8, (2, 2, 8))  # rows 8..11 (16-byte aligned: 256 bytes in)
    assert region is not None and region.shape == (2, 2, 8)
    np.testing.assert_array_equal(region.numpy(), values[8:12].reshape(2, 2, 8))
    region.assign(region * -1 + 0.5)
    em.realize(region)
    assert region_written(whole, region)
    expected = values.copy()
    expected[8:12] = expected[8:12] * -1 + 0.5
    np.testing.assert_array_equal(whole.numpy(), expected)
    assert region_view(whole, 3, (4,)) is None  # 12 bytes in: no view there (c's views start at 16-byte multiples)
    assert region_view(whole, 0, (4 * 6 * 8 + 1,)) is None  # past the buffer
    assert region_view(em.ones(64, device="c") * 2, 0, (8,)) is None  # not realized


def test_decoder_on_every_device(device: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.io import quantized_dot

    monkeypatch.setattr(quantized_dot, "INTEGER_FORMATS", frozenset())  # the float products on every device
    path = write_gguf(tmp_path / "llama.gguf", "llama", quantized=True, seed=1)
    np.testing.assert_allclose(ember_logits(path, device), reference_logits(path, "llama")[PROMPT - 1:], atol=2e-4,
                               rtol=1e-3)


def test_an_architecture_the_decoder_does_not_read_is_named(tmp_path: Path) -> None:
    from ember.models.decoder import Decoder

    path = write_gguf(tmp_path / "phi3.gguf", "phi3", quantized=False)
    with pytest.raises(ValueError, match=r"'phi3'.*llama, qwen2, qwen3, gemma3"):
        Decoder.from_gguf(path)


def test_gemma3_class_refuses_another_architecture(tmp_path: Path) -> None:
    from ember.models.gemma import Gemma3

    path = write_gguf(tmp_path / "qwen3.gguf", "qwen3", quantized=False)
    with pytest.raises(ValueError, match=r"'qwen3', not 'gemma3'.*Decoder.from_gguf"):
        Gemma3.from_gguf(path)


def test_generate_command_runs_a_llama_file_and_names_what_it_cannot_read(tmp_path: Path) -> None:
    """`python -m ember generate --model` continues a prompt with any architecture the decoder reads (greedy tokens
    as transformers' greedy generate), and a vocabulary ember has no tokenizer for is an error naming it."""
    import os
    import subprocess
    import sys

    path = write_gguf(tmp_path / "llama.gguf", "llama", quantized=True, seed=2)
    # float products: a random model's logits are too close for the greedy tokens to survive the input's rounding
    # to int8 of the integer products (tests/test_quantized_dot.py; Gemma's greedy tokens do: tests/test_gemma.py)
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "EMBER_C_INTEGER_DOT": "0"}
    command = [sys.executable, "-m", "ember", "generate", "--model", str(path), "--max-new-tokens", "4", "--device",
               "c"]
    finished = subprocess.run([*command, "abc"], capture_output=True, text=True, env=environment, timeout=600)
    assert finished.returncode == 0, finished.stderr
    config = transformers.AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name)
    config.head_dim = HEAD_DIM
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, config=config,
                                                                  dtype=torch.float32)
    from ember.models.tokenizer import SentencePieceTokenizer

    tokenizer = SentencePieceTokenizer.from_gguf(path)
    prompt = tokenizer.encode("abc")
    assert prompt == [1, *(LETTERS.index(letter) for letter in "abc")]
    greedy = reference.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False)[0, len(prompt):].tolist()
    assert finished.stdout.rstrip("\n") == "abc" + tokenizer.decode(greedy, skip_special_tokens=True)

    qwen = write_gguf(tmp_path / "qwen2.gguf", "qwen2", quantized=False)
    refused = subprocess.run([*command[:5], str(qwen), *command[6:], "abc"], capture_output=True, text=True,
                             env=environment, timeout=600)
    assert refused.returncode == 2
    assert "tokenizer.ggml.model is 'gpt2'" in refused.stderr and "Traceback" not in refused.stderr
