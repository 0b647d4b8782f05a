"""Incremental recomputation (ember/incremental: restrict, IncrementalGraph): after edits of input regions, the
kept values hold what a full recompute gives (the numpy reference tensor and torch are the truth), on random graphs
and edits and on every device; a causal transformer block decodes token by token like torch (also through a flash
attention, on the workgroup devices)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember as em
import ember.nn.functional as F
from ember.core.errors import ArgumentError
from ember.core.ops import REDUCE_OPS
from ember.core.tensor import Tensor
from ember.core.walk import post_order
from ember.incremental import affine, write
from ember.incremental import runner as runner_module
from ember.incremental.position_replay import PositionReplay, fit, within
from ember.incremental.region import Region
from ember.incremental.restrict import restrict
from ember.incremental.runner import IncrementalGraph
from ember.ir.flash_attention import attention_parts
from ember.ir.kernel import Kernel
from ember.scheduler import compile_cache, shape_classes
from ember.scheduler.devices import get_device
from ember.testing.reference import ReferenceTensor
from tests.conftest import TEST_DEVICES
from tests.test_incremental_regions import Program, draw_step, edit, programs, regions
from tests.workgroups import kernels_of

SMALL_BUFFER = write.SMALL_BUFFER


def assert_close(actual: np.ndarray, expected: np.ndarray, tolerance: float = 1e-4) -> None:
    np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance, equal_nan=True)


@settings(max_examples=4, deadline=None, derandomize=True, database=None)
@given(programs(), st.data())
def test_incremental_result_equals_a_full_recompute(program: Program, data: st.DataObject) -> None:
    edits = [edit(data, program.input)]
    edits.append(edit(data, edits[0][1]))  # a second edit on top of the first
    shape = program.run(ReferenceTensor(program.input), ReferenceTensor).shape
    needed = [data.draw(regions(shape, nonempty=True), label="needed first"), None]  # then all: stale parts too
    for device, small_buffer in itertools.product(TEST_DEVICES, (write.SMALL_BUFFER, 0)):
        write.SMALL_BUFFER = small_buffer  # 0: every box written through views where the pool makes them
        source = em.tensor(program.input, device=device)
        output = program.run(source, lambda array, device=device: em.tensor(array, device=device))
        graph = IncrementalGraph([output], [source])
        for (region, changed), wanted in zip(edits, needed):
            source[region.slices()] = em.tensor(changed[region.slices()], device=device)
            result = graph.update({source: region}, [wanted])[0].numpy()
            expected = program.run(ReferenceTensor(changed), ReferenceTensor).numpy()
            inside = Region.whole(shape) if wanted is None else wanted
            assert_close(result[inside.slices()], expected[inside.slices()])
    write.SMALL_BUFFER = SMALL_BUFFER


@pytest.mark.parametrize("name", ["matmul", "softmax", "layer_norm"])
def test_appending_a_row_recomputes_only_that_row(device: str, name: str) -> None:
    random = np.random.default_rng(0)
    rows, features = 64, 16
    values = np.zeros((rows, features), np.float32)
    values[:6] = random.standard_normal((6, features))
    weight = random.standard_normal((features, 24)).astype(np.float32)
    functions = {
        "matmul": lambda x, w: x @ w,
        "softmax": lambda x, w: (x @ w).softmax(-1),
        "layer_norm": lambda x, w: F.layer_norm(x @ w, (24,)),
    }
    torch_functions = {
        "matmul": lambda x, w: x @ w,
        "softmax": lambda x, w: (x @ w).softmax(-1),
        "layer_norm": lambda x, w: torch.nn.functional.layer_norm(x @ w, (24,)),
    }
    tokens = em.tensor(values, device=device)
    graph = IncrementalGraph([functions[name](tokens, em.tensor(weight, device=device))], [tokens], count_flops=True)
    for row in (6, 7):
        values[row] = random.standard_normal(features)
        tokens[row] = em.tensor(values[row], device=device)
        output = graph.update({tokens: Region.from_index(values.shape, row)})[0]
        assert_close(output.numpy(), torch_functions[name](torch.tensor(values), torch.tensor(weight)).numpy())
        # a row, grown to where the pool's views may start (a few rows on opencl): a small part of the work
        assert graph.last_flops * 8 <= graph.full_flops, (graph.last_flops, graph.full_flops)


class NormalizedProjection:
    """softmax(layer_norm(tokens @ weight)) over random tokens, incrementally (its graph) and in torch (`expected`)."""

    def __init__(self, device: str, rows: int, features: int, seed: int) -> None:
        self.random = np.random.default_rng(seed)
        self.values = self.random.standard_normal((rows, features)).astype(np.float32)
        self.weight = self.random.standard_normal((features, 24)).astype(np.float32)
        self.tokens = em.tensor(self.values, device=device)
        output = F.layer_norm(self.tokens @ em.tensor(self.weight, device=device), (24,)).softmax(-1)
        self.graph = IncrementalGraph([output], [self.tokens])

    def new_row(self, row: int) -> np.ndarray:
        self.values[row] = self.random.standard_normal(self.values.shape[1])
        return self.values[row]

    def expected(self) -> np.ndarray:
        product = torch.tensor(self.values) @ torch.tensor(self.weight)
        return torch.nn.functional.layer_norm(product, (24,)).softmax(-1).numpy()


@pytest.mark.parametrize("small_buffer", [SMALL_BUFFER, 0], ids=["select", "views"])
def test_editing_one_region_again_replays_the_recorded_launches(device: str, small_buffer: int,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write, "SMALL_BUFFER", small_buffer)  # 0: kernels write into views of the kept buffers
    case = NormalizedProjection(device, 32, 16, seed=1)
    tokens, graph = case.tokens, case.graph
    region = Region.from_index(case.values.shape, 9)
    for step in range(5):
        row = case.new_row(9)
        # at step 3 a tensor still holds the old value: the edit cannot be in place, the input moves to a new
        # buffer, which the replay must read
        old_tokens = tokens.detach() if step == 3 else None
        tokens[9] = em.tensor(row, device=device)
        assert_close(graph.update({tokens: region})[0].numpy(), case.expected())
        del old_tokens
    assert graph.replayed >= (3 if device.split(":")[0] in ("c", "opencl") else 0), graph.replayed
    # an edit elsewhere is another plan, recorded in its turn; the first region's replay still holds
    tokens[20] = em.tensor(case.new_row(20), device=device)
    assert_close(graph.update({tokens: Region.from_index(case.values.shape, 20)})[0].numpy(), case.expected())
    tokens[9] = em.tensor(case.new_row(9), device=device)
    assert_close(graph.update({tokens: region})[0].numpy(), case.expected())


def test_an_update_captured_by_jit_replays_into_the_kept_values(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the boxes are written into views of the kept values' buffers: a capture must replay those writes there, not
    # move them into its arena of intermediates
    monkeypatch.setattr(write, "SMALL_BUFFER", 0)
    case = NormalizedProjection(device, 64, 32, seed=2)
    region = Region.from_index(case.values.shape, 9)

    @em.jit
    def step(row: Tensor) -> Tensor:
        case.tokens[9] = row
        return case.graph.update({case.tokens: region})[0]

    for _ in range(5):
        result = step(em.tensor(case.new_row(9), device=device)).numpy()
        assert_close(result, case.expected())
    assert step.replays == 3


def test_restrict_computes_the_box_of_every_op_family(device: str) -> None:
    random = np.random.default_rng(1)
    values = random.standard_normal((6, 5)).astype(np.float32)
    weight = random.standard_normal((5, 7)).astype(np.float32)
    x, w = em.tensor(values, device=device), em.tensor(weight, device=device)
    output = (x @ w).softmax(-1).reshape(6, 7, 1).permute(1, 0, 2).pad((0, 0, 0, 2, 1, 1)).flip(0).cumsum(1)
    expected = (torch.tensor(values) @ torch.tensor(weight)).softmax(-1).reshape(6, 7, 1).permute(1, 0, 2)
    expected = torch.nn.functional.pad(expected, (0, 0, 0, 2, 1, 1)).flip(0).cumsum(1).numpy()
    for ranges in ([(0, 9), (2, 3), (0, 1)], [(3, 5), (4, 8), (0, 1)], [(0, 1), (0, 8), (0, 1)]):
        box = Region(output.shape, ranges)
        assert_close(Tensor._from_node(restrict(output.node, box)).numpy(), expected[box.slices()])
    merged = (x.reshape(30) + 1).reshape(5, 6)  # a box of the merged axis that is no box of the source
    box = Region(merged.shape, [(1, 3), (2, 4)])
    assert_close(Tensor._from_node(restrict(merged.node, box)).numpy(), (values.reshape(5, 6) + 1)[1:3, 2:4])


def test_a_masked_reduce_restricted_to_a_row_reads_only_where_its_mask_may_pick(device: str) -> None:
    """A sum (max) of a select between values and 0 (-inf) on a causal mask, restricted to a row, reads the row's
    first columns only (the rest add exactly the identity), with torch's values."""
    values = np.random.default_rng(4).standard_normal((6, 8)).astype(np.float32)
    x = em.tensor(values, device=device)
    causal = em.arange(8, device=device).reshape(1, 8) <= em.arange(6, device=device).reshape(6, 1)
    mask = torch.arange(8).reshape(1, 8) <= torch.arange(6).reshape(6, 1)
    reduces = {"sum": (em.where(causal, x, 0.0).sum(-1), torch.where(mask, torch.tensor(values), 0.0).sum(-1)),
               "max": (em.where(causal, x, -np.inf).amax(-1), torch.where(mask, torch.tensor(values), -np.inf).amax(-1))}
    for output, expected in reduces.values():
        for row in range(6):
            restricted = restrict(output.node, Region.from_index(output.shape, row))
            reduce, = [node for node in post_order([restricted], lambda node: node.srcs) if node.op in REDUCE_OPS]
            assert reduce.srcs[0].shape == (1, row + 1), reduce.srcs[0].shape
            assert_close(Tensor._from_node(restricted).numpy(), expected.numpy()[row:row + 1])


@pytest.mark.usefixtures("optimizations_on")
def test_a_row_of_a_flash_attention_is_computed_from_its_causal_keys(group_device: str) -> None:
    """A box of core's fused attention graph (one flash kernel over all its rows) is computed by the primitive ops
    the graph is made of: a query row, below the flash kernel's rows, reads only the keys up to it (each of its
    four reduces), with torch's values."""
    random = np.random.default_rng(5)
    arrays = [random.standard_normal((2, 20, 8)).astype(np.float32) for _ in range(3)]
    output = F.scaled_dot_product_attention(*(em.tensor(array, device=group_device) for array in arrays),
                                            is_causal=True)
    assert sum(attention_parts(kernel) is not None for kernel in kernels_of(output)) == 1
    expected = torch.nn.functional.scaled_dot_product_attention(*map(torch.tensor, arrays), is_causal=True).numpy()
    for row in (5, 12):
        box = Region(output.shape, [(0, 2), (row, row + 1), (0, 8)])
        restricted = restrict(output.node, box)
        reduces = [node for node in post_order([restricted], lambda node: node.srcs) if node.op in REDUCE_OPS]
        assert len(reduces) == 4 and all(20 not in node.srcs[0].shape for node in reduces), reduces
        assert_close(Tensor._from_node(restricted).numpy(), expected[box.slices()])


# ---- decoding a causal transformer block -------------------------------------------------------------------------

VOCABULARY, CAPACITY, WIDTH, HEADS, HIDDEN = 11, 16, 16, 2, 32


def transformer_parameters(capacity: int = CAPACITY) -> dict[str, np.ndarray]:
    random = np.random.default_rng(2)
    shapes = {"embedding": (VOCABULARY, WIDTH), "position": (capacity, WIDTH), "query": (WIDTH, WIDTH),
              "key": (WIDTH, WIDTH), "value": (WIDTH, WIDTH), "out": (WIDTH, WIDTH), "up": (HIDDEN, WIDTH),
              "down": (WIDTH, HIDDEN), "head": (VOCABULARY, WIDTH)}
    return {name: (random.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
            for name, shape in shapes.items()}


def transformer_block(tokens: Any, parameters: dict[str, Any], functional: Any) -> Any:
    """Logits of every position: embedding + position, causal self-attention and a GELU MLP with pre-norms."""
    length = tokens.shape[0]
    x = functional.embedding(tokens, parameters["embedding"]) + parameters["position"][:length]
    normed = functional.layer_norm(x, (WIDTH,))
    heads = [functional.linear(normed, parameters[name]).reshape(length, HEADS, WIDTH // HEADS).permute(1, 0, 2)
             for name in ("query", "key", "value")]
    attended = functional.scaled_dot_product_attention(*heads, is_causal=True).permute(1, 0, 2).reshape(length, WIDTH)
    x = x + functional.linear(attended, parameters["out"])
    hidden = functional.gelu(functional.linear(functional.layer_norm(x, (WIDTH,)), parameters["up"]))
    x = x + functional.linear(hidden, parameters["down"])
    return functional.linear(x, parameters["head"])


def decode_like_torch(device: str) -> list[Kernel]:
    """Decode tokens one at a time after a prompt through the block, each update needing the prefix's logits:
    torch's logits, for under a quarter of a full recompute's FLOPs. The kernels of the full graph (its first run)."""
    parameters = transformer_parameters()
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    prompt = 6
    buffer = np.zeros(CAPACITY, np.int64)
    buffer[:prompt] = ids[:prompt]
    tokens = em.tensor(buffer, device=device)
    weights = {name: em.tensor(value, device=device) for name, value in parameters.items()}
    torch_weights = {name: torch.tensor(value) for name, value in parameters.items()}
    output = transformer_block(tokens, weights, F)
    kernels = kernels_of(output)
    graph = IncrementalGraph([output], [tokens], count_flops=True)
    for position in range(prompt, len(ids)):  # (from the third position on, no kernel compiles)
        tokens[position] = ids[position]
        logits = graph.update({tokens: Region.from_index((CAPACITY,), position)},
                              needed=[Region.from_index((CAPACITY, VOCABULARY), slice(0, position + 1))])[0]
        expected = transformer_block(torch.tensor(ids[:position + 1]), torch_weights, torch.nn.functional)
        assert_close(logits.numpy()[:position + 1], expected.numpy())
        assert graph.last_flops * 4 < graph.full_flops, (graph.last_flops, graph.full_flops)
    return kernels


@pytest.mark.parametrize("small_buffer", [SMALL_BUFFER, 0], ids=["select", "views"])
def test_decoding_a_transformer_block_matches_torch(device: str, small_buffer: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write, "SMALL_BUFFER", small_buffer)  # 0: kernels write into views of the kept buffers
    decode_like_torch(device)


@pytest.mark.usefixtures("optimizations_on")
@pytest.mark.parametrize("small_buffer", [SMALL_BUFFER, 0], ids=["select", "views"])
def test_decoding_through_a_flash_attention_recomputes_only_the_new_rows(group_device: str, small_buffer: int,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Where workgroups run (warps and local memory: core writes the attention as its fused graph, one flash kernel
    in the full run), a decode step still recomputes the new row only: the fused graph selects each product by the
    causal mask, as the composite does, so a new key's value dirties only the rows that may read it, and the box of
    a row is computed by the primitive ops the fused graph is made of. With views aligned as a GPU's (cuda's 256
    bytes: a box grows back to where a view may start), the kept q, k and v are the projections' rows, as the
    composite's, not a block of rows of every head."""
    monkeypatch.setattr(write, "SMALL_BUFFER", small_buffer)  # 0: kernels write into views of the kept buffers
    pool = em.tensor([0.0], device=group_device).realize().node.buffer.pool
    if not small_buffer and pool.view_alignment:
        monkeypatch.setattr(pool, "view_alignment", 256)
    kernels = decode_like_torch(group_device)
    assert sum(attention_parts(kernel) is not None for kernel in kernels) == 1, kernels


def decoding_setup(device: str, capacity: int, prompt: int,
                   seed: int) -> tuple[np.ndarray, Tensor, IncrementalGraph, np.ndarray]:
    """Random ids (from 1: writing a token 0 is a kernel of its own, the graph rewrites fold a 0 padded with 0), a
    token buffer holding the prompt, the incremental graph of a transformer block over it, and torch's logits of
    the whole sequence (causal: a prefix's rows are the whole sequence's)."""
    parameters = transformer_parameters(capacity)
    ids = np.random.default_rng(seed).integers(1, VOCABULARY, size=capacity)
    buffer = np.zeros(capacity, np.int64)
    buffer[:prompt] = ids[:prompt]
    tokens = em.tensor(buffer, device=device)
    weights = {name: em.tensor(value, device=device) for name, value in parameters.items()}
    torch_weights = {name: torch.tensor(value) for name, value in parameters.items()}
    graph = IncrementalGraph([transformer_block(tokens, weights, F)], [tokens])
    expected = transformer_block(torch.tensor(ids), torch_weights, torch.nn.functional).numpy()
    return ids, tokens, graph, expected


@pytest.mark.parametrize("small_buffer", [SMALL_BUFFER, 0], ids=["select", "views"])
def test_decoding_compiles_nothing_after_the_first_two_positions(device: str, small_buffer: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Box offsets and causal prefix lengths are read at launch (shape classes): each position from the third on
    launches the kernels compiled for the first two, with the logits of torch's full block (boxes written by a
    select over the kept buffer, or by kernels storing into views of it where the pool makes them)."""
    monkeypatch.setattr(write, "SMALL_BUFFER", small_buffer)
    # compile caches and class structures of this test's own: its kernels are counted whatever ran before
    monkeypatch.setattr(compile_cache, "COMPILED", compile_cache.CompileCache())
    monkeypatch.setattr(shape_classes, "STRUCTURES", type(shape_classes.STRUCTURES)())
    capacity, prompt, steps = 40, 2, 30  # (the last positions of the buffer, boxes touching its end, are left out)
    ids, tokens, graph, expected = decoding_setup(device, capacity, prompt, seed=7)
    compiles = []
    for position in range(prompt, prompt + steps):
        with em.profile() as record:
            tokens[position] = int(ids[position])
            logits = graph.update({tokens: Region.from_index((capacity,), position)},
                                  needed=[Region.from_index((capacity, VOCABULARY), position)])[0]
            row = logits.numpy()[position]
        compiles.append(len(record.compiles))
        assert_close(row, expected[position])  # (causal: the full sequence's row is the prefix's)
    # with views a box grows back to where the pool may view (aligned_box): rows of 11 logits start at 4 residues
    # modulo c's 4-float alignment, boxes of 1 to 4 rows, whose classes the first positions of each residue make
    # (each kept value's kernels classes of their own, and its rows stored apart from the products reading them)
    # (the positions are a CPU's: a GPU's pool aligns views and its kernels classes otherwise; its values still match)
    settled = 2 if small_buffer else 12
    if get_device(device).info.warp_width == 1:
        assert compiles[0] > 0 and compiles[settled:] == [0] * (steps - settled), compiles


# ---- plans for a range of positions (families) ------------------------------------------------------------------


@st.composite
def row_programs(draw: st.DrawFn) -> Program:
    """A random program over an input of 6 to 12 rows (its rows edited one after another)."""
    data = draw(st.data())
    random = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = (draw(st.integers(6, 12)), *draw(st.lists(st.integers(1, 4), min_size=0, max_size=2)))
    tensor = ReferenceTensor(np.zeros(shape, np.float32))
    steps = []
    for _ in range(draw(st.integers(1, 5))):
        step = draw_step(data, tensor.shape, random)
        steps.append(step)
        tensor = step.apply(tensor, ReferenceTensor)
    return Program(random.uniform(-2, 2, size=shape).astype(np.float32), steps)


@settings(max_examples=6, deadline=None, derandomize=True, database=None)
@given(row_programs(), st.integers(1, 2), st.booleans())
def test_rows_edited_one_after_another_equal_a_full_recompute(program: Program, width: int, row_needed: bool) -> None:
    """Edits of `width` rows at successive positions, each plan a family's once two positions set its slopes:
    every update's needed elements equal the reference tensor's (all, or the edited row where the output has
    the input's rows)."""
    rows = program.input.shape[0]
    output_shape = program.run(ReferenceTensor(program.input), ReferenceTensor).shape
    by_row = row_needed and len(output_shape) >= 1 and output_shape[0] == rows
    random = np.random.default_rng(3)
    for device in TEST_DEVICES:
        values = program.input.copy()
        source = em.tensor(values, device=device)
        output = program.run(source, lambda array, device=device: em.tensor(array, device=device))
        graph = IncrementalGraph([output], [source])
        for position in range(rows - width + 1):
            region = Region.from_index(values.shape, slice(position, position + width))
            values[region.slices()] += random.uniform(1, 2, values[region.slices()].shape).astype(np.float32)
            source[region.slices()] = em.tensor(values[region.slices()], device=device)
            wanted = Region.from_index(output_shape, position) if by_row else None
            result = graph.update({source: region}, [wanted])[0].numpy()
            expected = program.run(ReferenceTensor(values), ReferenceTensor).numpy()
            inside = Region.whole(output_shape) if wanted is None else wanted
            assert_close(result[inside.slices()], expected[inside.slices()])


def test_affine_integers_record_where_their_decisions_hold() -> None:
    with affine.tracing() as interval:
        position = affine.affine(5, 1)  # 5 + t
        assert position + 3 < 10  # t < 2
        assert (position * 8) // 4 == affine.affine(10, 2)  # exact: the slope divides
        assert (position + 64) // 64 == 1  # a constant quotient while 0 <= t + 69 - 64 < 64
    assert (interval.low, interval.high) == (-5, 1)
    for t in range(-5, 2):  # each decision comes out the same over the interval
        assert 5 + t + 3 < 10 and (5 + t + 64) // 64 == 1
    assert not 5 + 2 + 3 < 10 and (5 - 6 + 64) // 64 == 0
    with affine.tracing() as interval:
        assert int(affine.affine(5, 1)) == 5  # a conversion to a plain int holds at t = 0 only
    assert interval.is_point
    with pytest.raises(RuntimeError, match="outside"):
        _ = affine.affine(5, 1) < 3


def test_decoding_plans_and_restricts_only_the_first_positions(device: str) -> None:
    """A decode step at a new position takes its plan and restricted graphs from a family (planned once over a
    range of positions) after the first positions: no planning nor restricting after them, and the logits of
    torch's full block at every position."""
    capacity, prompt, steps = 24, 2, 18
    ids, tokens, graph, expected = decoding_setup(device, capacity, prompt, seed=5)
    planned, restricts = [], []
    for position in range(prompt, prompt + steps):
        tokens[position] = int(ids[position])
        logits = graph.update({tokens: Region.from_index((capacity,), position)},
                              needed=[Region.from_index((capacity, VOCABULARY), position)])[0]
        assert_close(logits.numpy()[position], expected[position])
        planned.append(graph.planned)
        restricts.append(graph.restricts)
    settled = 4
    assert planned[settled:] == [planned[settled]] * (steps - settled), planned
    assert restricts[settled:] == [restricts[settled]] * (steps - settled), restricts
    assert graph.from_family >= steps - settled


# ---- replaying a family's recompute at new positions ---------------------------------------------------------


def decode_rows(device: str, capacity: int, prompt: int, steps: int, seed: int, write_rows: bool) -> IncrementalGraph:
    """Decode `steps` tokens after the prompt, each row checked against torch's full block; the tokens written by
    setitem or by `IncrementalGraph.write` (alternately where `write_rows`)."""
    ids, tokens, graph, expected = decoding_setup(device, capacity, prompt, seed)
    for step, position in enumerate(range(prompt, prompt + steps)):
        if write_rows and step % 2:
            changed = graph.write(tokens, position, int(ids[position]))
        else:
            tokens[position] = int(ids[position])
            changed = Region.from_index((capacity,), position)
        logits = graph.update({tokens: changed}, needed=[Region.from_index((capacity, VOCABULARY), position)])[0]
        assert_close(logits.numpy()[position], expected[position])
    return graph


def test_decoding_replays_its_family_at_new_positions(device: str) -> None:
    """After a family's first positions (recorded), each decode step at a position not seen before runs the
    family's replay (position_replay.py: sizes, view offsets and temporaries affine in the position): no graph,
    schedule or compile-cache work, and torch's logits at every position."""
    steps = 26
    graph = decode_rows(device, capacity=40, prompt=2, steps=steps, seed=11, write_rows=True)
    assert graph.position_replayed >= steps - 8, (graph.position_replayed, graph.planned, graph.from_family)
    replay = next(state for _, state in graph.position_replays.values() if isinstance(state, PositionReplay))
    assert replay.low <= replay.high and not replay.run(replay.high + 1, lambda leaf: None)  # (outside its range)


def test_a_family_whose_range_is_not_certified_is_recomputed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the scheduler's decisions on a family's graphs do not hold over a range of positions (here: as if a
    pass pinned its affine values), no replay is made: every step recomputes through the ordinary path."""
    monkeypatch.setattr(runner_module, "certified_interval", lambda *arguments: None)
    graph = decode_rows("c", capacity=24, prompt=2, steps=12, seed=3, write_rows=False)
    assert graph.position_replayed == 0 and graph.from_family >= 6


def test_write_stores_the_indexed_box_like_setitem(device: str) -> None:
    """IncrementalGraph.write gives what setitem gives (numpy is the truth: ints, slices, a broadcast value), in
    place, and the box it returns is the one update takes; an input it does not have is refused."""
    values = np.arange(30, dtype=np.float32).reshape(6, 5)
    x = em.tensor(values, device=device)
    graph = IncrementalGraph([(x * 2).sum(1)], [x])
    expected = values.copy()
    for index, value in ((2, np.full(5, -1.0, np.float32)), ((slice(1, 3), slice(0, 2)), 7.0),
                         ((4, slice(3, 5)), np.array([8.0, 9.0], np.float32))):
        box = graph.write(x, index, value if np.ndim(value) == 0 else em.tensor(value, device=device))
        expected[index] = value
        assert box == Region.from_index(x.shape, index)
        assert_close(graph.update({x: box})[0].numpy(), (expected * 2).sum(1))
        assert_close(x.numpy(), expected)
    with pytest.raises(ArgumentError, match="not one of the inputs"):
        graph.write(em.tensor(values, device=device), 0, 1.0)


def test_lines_through_positions_and_their_ranges() -> None:
    assert fit([10, 12, 14], [1, 2, 3]) == (8, 2) and fit([5, 5, 5], [0, 4, 9]) == (5, 0)
    assert fit([1, 2, 4], [0, 1, 2]) is None  # (not on a line: a quadratic size)
    assert fit([1, 2, 3], [0, 2, 4]) is None  # (a slope of 1/2)
    assert within((3, 1), 0, 10, -100, 100) == (-3, 7)
    assert within((10, -2), 0, 4, 0, 100) == (3, 5)
    low, high = within((3, 0), 4, 10, 0, 5)
    assert low > high


def test_decoding_at_a_real_width_replays_through_views_of_the_kept_buffers(device: str) -> None:
    """The benchmark's block at a size where the kept values are written through views (512 tokens x 256 wide:
    buffers past write.SMALL_BUFFER on devices whose pools make views): from the sixth new position on the family's
    replay runs, with its views at each position's offsets and its sizes table, and every decoded row equals torch's
    full block (the attention is causal: the final buffer's rows are each step's)."""
    tokens, width, heads, steps, start = 512, 256, 4, 10, 300
    random = np.random.default_rng(4)
    shapes = {"query": (width, width), "key": (width, width), "value": (width, width), "out": (width, width),
              "up": (4 * width, width), "down": (width, 4 * width)}
    arrays = {name: (random.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
              for name, shape in shapes.items()}
    embeddings = np.zeros((tokens, width), np.float32)
    embeddings[:start] = random.standard_normal((start, width))

    def block(x: Any, weights: dict[str, Any], functional: Any) -> Any:
        normed = functional.layer_norm(x, (width,))
        query, key, value = (functional.linear(normed, weights[name]).reshape(tokens, heads, width // heads)
                             .permute(1, 0, 2) for name in ("query", "key", "value"))
        attended = functional.scaled_dot_product_attention(query, key, value, is_causal=True).permute(1, 0, 2)
        x = x + functional.linear(attended.reshape(tokens, width), weights["out"])
        return x + functional.linear(functional.gelu(functional.linear(functional.layer_norm(x, (width,)),
                                                                       weights["up"])), weights["down"])

    x = em.tensor(embeddings, device=device)
    graph = IncrementalGraph([block(x, {name: em.tensor(value, device=device) for name, value in arrays.items()}, F)],
                             [x])
    rows = {}
    for position in range(start, start + steps):
        embeddings[position] = random.standard_normal(width)
        box = graph.write(x, position, em.tensor(embeddings[position], device=device))
        rows[position] = graph.update({x: box}, [box])[0].numpy()[position]
    expected = block(torch.tensor(embeddings), {name: torch.tensor(value) for name, value in arrays.items()},
                     torch.nn.functional).numpy()
    for position, row in rows.items():
        assert_close(row, expected[position], 1e-3)
    assert graph.position_replayed >= steps - 5, (graph.position_replayed, graph.planned, graph.from_family)
    if x.node.buffer.pool.view_alignment:  # (wgpu makes no views: its boxes are written by a select)
        replay = next(state for _, state in graph.position_replays.values() if isinstance(state, PositionReplay))
        assert any(view.offset[1] for view in replay.views), replay.views  # (offsets moving with the position)
