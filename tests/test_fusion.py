"""Fusion is tested by counting kernels (DESIGN.md principle 4) and by values against torch."""

import gc
from collections.abc import Callable

import numpy as np
import pytest
import torch

import ember as em
from tests.helpers import assert_close, pair, random_array, scheduled_launches


def count_kernels(*tensors: em.Tensor) -> int:
    with em.profile() as record:
        em.realize(*tensors)
    return len(record.kernels)


def test_elementwise_chain_of_ten_ops_is_one_kernel(device: str) -> None:
    x, tx = pair(random_array((3, 17)), device)
    y = x
    ty = tx
    for step in range(5):
        y = (y * 0.9 + step).sigmoid() if step % 2 else (y - 0.1).abs()
        ty = (ty * 0.9 + step).sigmoid() if step % 2 else (ty - 0.1).abs()
    assert count_kernels(y) == 1
    assert_close(y, ty)


def test_add_then_sum_is_one_kernel(device: str) -> None:
    a, ta = pair(random_array((17, 33)), device)
    b, tb = pair(random_array((17, 33), seed=1), device)
    result = (a + b).sum(1)
    assert count_kernels(result) == 1
    assert_close(result, (ta + tb).sum(1), atol=1e-4)


def test_matmul_bias_relu_is_one_kernel(device: str) -> None:
    a, ta = pair(random_array((16, 32)), device)
    w, tw = pair(random_array((32, 24), seed=1), device)
    bias, tbias = pair(random_array((24,), seed=2), device)
    result = (a @ w + bias).relu()
    assert count_kernels(result) == 1
    assert_close(result, (ta @ tw + tbias).relu(), atol=1e-4)


def test_movement_between_elementwise_ops_adds_no_kernel(device: str) -> None:
    x, tx = pair(random_array((4, 6)), device)
    y = (x + 1).reshape(2, 12).permute(1, 0).pad((1, 2, 0, 3)).shrink(((1, 13), (0, 4))).flip(0) * 2
    ty = torch.nn.functional.pad((tx + 1).reshape(2, 12).permute(1, 0), (1, 2, 0, 3))[1:13, 0:4].flip(0) * 2
    assert count_kernels(y) == 1
    assert_close(y, ty)


def test_softmax_over_last_axis_is_one_kernel(device: str) -> None:
    # the max and the sum are reduces of the last axis read back along it: fused by rows, each computed once per
    # row by the work item that writes the row
    x, tx = pair(random_array((5, 37)) * 10, device)
    result = x.softmax(-1)
    assert count_kernels(result) == 1
    assert_close(result, tx.softmax(-1))


@pytest.mark.parametrize("name", ["log_softmax", "layer_norm", "logsumexp", "softmax then sum", "rms_norm"])
def test_row_reductions_read_back_along_their_rows_fuse_into_one_kernel(device: str, name: str) -> None:
    array = random_array((6, 40)) * 4
    weight, bias = random_array((40,)), random_array((40,))
    x, tx = pair(array, device)
    w, tw = pair(weight, device)
    b, tb = pair(bias, device)
    functions = {
        "log_softmax": (lambda: x.log_softmax(-1), lambda: tx.log_softmax(-1)),
        "layer_norm": (lambda: em.nn.functional.layer_norm(x, (40,), w, b),
                       lambda: torch.nn.functional.layer_norm(tx, (40,), tw, tb)),
        "logsumexp": (lambda: x.logsumexp(-1), lambda: tx.logsumexp(-1)),
        "softmax then sum": (lambda: (x.softmax(-1) * w).sum(-1), lambda: (tx.softmax(-1) * tw).sum(-1)),
        "rms_norm": (lambda: em.nn.functional.rms_norm(x, (40,), w, 1e-6),
                     lambda: torch.nn.functional.rms_norm(tx, (40,), tw, 1e-6)),
    }
    ember_function, torch_function = functions[name]
    result = ember_function()
    assert count_kernels(result) == 1
    assert_close(result, torch_function())


def test_a_reduce_read_back_along_another_axis_is_stored(device: str) -> None:
    # softmax over the first axis: each output element would need the whole column, which its work item does not
    # walk: the max and the sum are stored by kernels of their own
    x, tx = pair(random_array((7, 12)) * 10, device)
    result = x.softmax(0)
    assert count_kernels(result) == 3
    assert_close(result, tx.softmax(0))


def test_realize_loop_keeps_memory_and_buffers_flat() -> None:
    x = em.zeros(64)
    x.realize()
    pool = em.get_default_device()
    from ember.scheduler.devices import get_device

    memory = get_device(pool).pool
    for _ in range(50):
        x = (x * 0.5 + 1).realize()
    gc.collect()
    live_before, bytes_before = memory.live_buffers, memory.used_bytes
    for _ in range(10_000):
        x = (x * 0.5 + 1).realize()
    gc.collect()
    assert memory.live_buffers <= live_before
    assert memory.used_bytes <= bytes_before
    np.testing.assert_allclose(x.numpy(), np.full(64, 2.0, dtype=np.float32))


def test_unreachable_nodes_are_dropped() -> None:
    import weakref

    x = em.ones(8)
    y = (x + 1) * 3
    reference = weakref.ref(y.node)
    del y
    gc.collect()
    assert reference() is None


def test_intermediate_buffers_are_released_during_realize() -> None:
    """softmax over the first axis stores two intermediates (the max and sum of each column); the peak holds only
    what is live at each launch."""
    from ember.scheduler.devices import get_device

    x = em.rand(256, 1024).realize()
    pool = get_device(x.device).pool
    gc.collect()
    before = pool.used_bytes
    with em.profile() as record:
        y = x.softmax(0).sum(-1)
        y.realize()
    growth = record.peak_bytes[pool.name] - before
    assert growth <= (2 * 1024 + 256) * 4, (growth, str(record))  # two column intermediates and the output
    assert len(record.kernels) == 3


def _recurrence(inputs: "em.Tensor | torch.Tensor", steps: int) -> list:
    """A cell-state recurrence like an LSTM's: each step's state is read by its own output and by the next step."""
    state, outputs = inputs[0] * 0, []
    for step in range(steps):
        state = state * inputs[step].sigmoid() + inputs[step].tanh()
        outputs.append(state.exp())
    return outputs


def test_an_expensive_recurrence_is_stored_not_recomputed_by_every_step() -> None:
    from ember.scheduler.kernelize import kernelize
    from ember.scheduler.program import Launch

    def kernel_steps(steps: int) -> list[int]:
        outputs = _recurrence(em.tensor(random_array((steps, 8)), device="dummy:0"), steps)
        items = kernelize([output.node for output in outputs])
        return [len(item.kernel.steps) for item in items if isinstance(item, Launch)]

    short, long = kernel_steps(12), kernel_steps(48)
    # recomputing the state in every output's kernel would make the largest kernel (and the total) grow with steps
    assert max(long) <= max(short) and sum(long) < 5 * sum(short), (short, long)


def test_a_stored_recurrence_matches_torch(device: str) -> None:
    inputs, tinputs = pair(random_array((16, 5)), device)
    outputs, toutputs = _recurrence(inputs, 16), _recurrence(tinputs, 16)
    em.realize(*outputs)
    for output, toutput in zip(outputs, toutputs):
        assert_close(output, toutput, atol=1e-4, rtol=1e-4)


def test_mlp_training_step_kernel_count_and_values(device: str) -> None:
    # forward + cross-entropy + backward + SGD-momentum update of a 2-layer MLP: 15 kernels for the loss and its
    # gradients, 2 per parameter tensor for the update (momentum buffer and parameter); more is a fusion regression
    from ember import nn, optim

    em.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
    reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    reference.load_state_dict({name: torch.tensor(value.numpy()) for name, value in model.state_dict().items()})
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    inputs, tinputs = pair(random_array((32, 8)), device)
    targets = np.arange(32) % 3
    for _ in range(3):
        with em.profile() as record:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(inputs), em.tensor(targets, device=device))
            loss.backward()
            optimizer.step()
            loss.item()
        reference_optimizer.zero_grad()
        tloss = torch.nn.functional.cross_entropy(reference(tinputs), torch.tensor(targets))
        tloss.backward()
        reference_optimizer.step()
        assert abs(loss.item() - tloss.item()) < 1e-4
    assert len(record.kernels) <= 15 + 2 * 4, str(record)
    assert_close(model[2].weight, reference[2].weight.detach(), atol=1e-5)


def test_a_kernel_never_reads_more_buffers_than_its_device_binds(device: str, monkeypatch) -> None:
    from ember.scheduler import schedule
    from ember.scheduler.kernelize import kernelize
    from ember.scheduler.program import Launch

    limit = 6  # WebGPU adapters bind 8 to a few dozen storage buffers per kernel
    arrays = [random_array((4, 3), seed=seed) for seed in range(40)]
    tensors = [em.tensor(array, device=device).realize() for array in arrays]
    total = tensors[0]
    for tensor in tensors[1:]:
        total = total * 0.5 + tensor.exp()
    total = total.sum(1) * tensors[-1][:, 0]  # a fused reduction, then a broadcast read
    expected = torch.tensor(arrays[0])
    for array in arrays[1:]:
        expected = expected * 0.5 + torch.tensor(array).exp()
    expected = expected.sum(1) * torch.tensor(arrays[-1])[:, 0]
    items = kernelize([total.node], lambda name: limit)
    reads = [len(item.inputs) for item in items if isinstance(item, Launch)]
    assert max(reads) <= limit - 1 and len(reads) > 1, reads
    assert max(len(item.inputs) for item in kernelize([total.node]) if isinstance(item, Launch)) >= limit
    monkeypatch.setattr(schedule, "kernel_buffer_limit", lambda name: limit)
    schedule.SCHEDULES.entries.clear()
    assert_close(total, expected, rtol=1e-4)


def _largest_domain_evaluating(realize: Callable[[], object], ops: set, monkeypatch) -> int:
    """The largest iteration domain (elements of the widest step) among the kernels that `realize` schedules and
    that evaluate any of `ops` (0 when none does)."""
    return max((max(int(np.prod(step.shape)) for step in launch.kernel.steps)
                for launch in scheduled_launches(realize, monkeypatch)
                if any(step.op in ops for step in launch.kernel.steps)), default=0)


def test_a_softmax_read_by_a_gradient_matmul_is_stored_not_recomputed_per_product(monkeypatch) -> None:
    # cross-entropy's gradient (softmax - one_hot) / n is read by the weight gradient's matmul once per hidden unit:
    # recomputing its exp there costs 48x the exps (the old schedule did: 25x slower on that kernel, MLP b256)
    from ember.core.ops import Op
    from ember.nn import functional as F

    x = em.tensor(random_array((64, 32)), device="dummy:0")
    first = em.tensor(random_array((48, 32), seed=1), device="dummy:0", requires_grad=True)
    second = em.tensor(random_array((10, 48), seed=2), device="dummy:0", requires_grad=True)
    loss = F.cross_entropy((x @ first.T).relu() @ second.T, em.tensor(np.arange(64) % 10, device="dummy:0"))
    domain = _largest_domain_evaluating(loss.backward, {Op.EXP2}, monkeypatch)
    assert 0 < domain <= 64 * 10


def test_a_normalized_activation_feeding_a_matmul_is_stored_not_recomputed_per_product(monkeypatch) -> None:
    from ember.core.ops import Op

    x = em.tensor(random_array((64, 128)), device="dummy:0")
    weight = em.tensor(random_array((96, 128), seed=1), device="dummy:0")
    result = (x * ((x * x).mean(-1, keepdim=True) + 1e-6).rsqrt()) @ weight.T
    domain = _largest_domain_evaluating(result.realize, {Op.SQRT, Op.RECIPROCAL}, monkeypatch)
    assert 0 < domain <= 64 * 128


def _reduces_reading_joins(launches: list) -> int:
    """How many of `launches` reduce a value read through two or more PADs (a concatenation fused into them)."""
    from ember.core.ops import REDUCE_OPS, Op

    return sum(any(step.op in REDUCE_OPS for step in launch.kernel.steps)
               and sum(step.op is Op.PAD for step in launch.kernel.steps) >= 2 for launch in launches)


def test_a_concatenation_read_by_a_matmul_is_stored_not_masked_per_product(device: str, monkeypatch) -> None:
    """A matmul whose operand is a concatenation, and the matmuls of a linear layer whose output is split (attention's
    q, k and v: their gradients are joined into the layer's), read the joined value stored once, not through a
    masked load of every part in each product (nanoGPT's three such kernels were register tiles of 18 masked loads,
    6.7 ms of its 60 ms step). Values and gradients are torch's."""
    parts = [pair(random_array((64, 32), seed=seed), device) for seed in range(3)]
    weight, tweight = pair(random_array((96, 48), seed=3), device)
    joined = em.cat([part for part, _ in parts], -1) @ weight
    launches = scheduled_launches(joined.realize, monkeypatch)
    assert len(launches) == 2 and _reduces_reading_joins(launches) == 0  # the join, then a plain matmul
    assert_close(joined, torch.cat([part for _, part in parts], -1) @ tweight, atol=1e-4)

    def step(library, x, projection_weight, projection_bias, head):  # type: ignore[no-untyped-def]
        q, k, v = (x @ projection_weight.T + projection_bias).chunk(3, -1)
        return ((q @ head) * (k @ head) + v @ head).sum()  # (q, k and v's gradients: matmuls' outputs, stored)

    arrays = [random_array((64, 32), seed=4), random_array((96, 32), seed=5), random_array((96,), seed=6),
              random_array((32, 16), seed=7) * 0.1]
    tensors = [em.tensor(array, device=device, requires_grad=True) for array in arrays]
    references = [torch.tensor(array, requires_grad=True) for array in arrays]
    loss = step(em, *tensors)

    def backward() -> None:
        loss.backward()
        em.realize(*(tensor.grad for tensor in tensors))

    launches = scheduled_launches(backward, monkeypatch)
    assert launches and _reduces_reading_joins(launches) == 0  # (3 before: the weight's, the input's, the bias's)
    step(torch, *references).backward()
    for tensor, reference in zip(tensors, references):  # (gradients up to ~3,000: float32 sums of products)
        assert_close(tensor.grad, reference.grad, atol=1e-3)


def test_a_padded_matmul_is_stored_by_its_own_kernel_and_a_small_padded_sum_stays_fused(device: str) -> None:
    """A matmul whose result is padded (an RNN's state gradients joined with the initial state's zeros, a
    concatenation of matmul results) is computed by a kernel of its own and padded by a second, not with the pad's
    mask on every load of its loop (char_lstm's 2048 x 512 @ 512 x 128 padded to 2112 rows ran 2.3 ms so); a
    padded sum of few elements stays one kernel. Values are torch's, the padded rows zeros."""
    a, ta = pair(random_array((256, 128)), device)
    b, tb = pair(random_array((128, 64), seed=1), device)
    padded = em.nn.functional.pad((a @ b).relu(), (0, 0, 8, 56))
    joined = em.cat([a @ b, a[:, :64] * 2], 0)
    assert count_kernels(padded) == 2 and count_kernels(joined) == 2  # (the join reads a slice of a: no kernel)
    assert_close(padded, torch.nn.functional.pad((ta @ tb).relu(), (0, 0, 8, 56)), atol=1e-4)
    assert_close(joined, torch.cat([ta @ tb, ta[:, :64] * 2], 0), atol=1e-4)
    small, tsmall = pair(random_array((64, 4)), device)
    assert count_kernels(em.nn.functional.pad(small.sum(1), (2, 3))) == 1
    assert_close(em.nn.functional.pad(small.sum(1), (2, 3)), torch.nn.functional.pad(tsmall.sum(1), (2, 3)))


def test_a_cheap_activation_stays_fused_into_the_matmul_that_reads_it(device: str) -> None:
    a, ta = pair(random_array((16, 32)), device)
    w, tw = pair(random_array((32, 24), seed=1), device)
    result = (a * 0.5 + 1).relu() @ w
    assert count_kernels(result) == 1
    assert_close(result, (ta * 0.5 + 1).relu() @ tw, atol=1e-4)


def test_a_gelu_between_two_linears_is_computed_once_per_pass_not_stored_in_pieces(device: str) -> None:
    # the exact GELU (erfc: a Horner polynomial of t = 1 / (1 + z/2) and an exp) is shared by the forward kernel and
    # the backward's; counted as a tree its reused t made it look thousands of ops long, and it was stored in three
    # pieces, each recomputing most of it (5 elementwise kernels over the hidden layer instead of 2)
    from ember import nn

    em.manual_seed(0)
    first, second = nn.Linear(8, 40).to(device), nn.Linear(40, 3).to(device)
    tfirst, tsecond = torch.nn.Linear(8, 40), torch.nn.Linear(40, 3)
    for module, reference in ((first, tfirst), (second, tsecond)):
        reference.load_state_dict({name: torch.tensor(value.numpy()) for name, value in module.state_dict().items()})
    array = random_array((21, 8), low=-6.0, high=6.0)
    x, tx = pair(array, device)
    with em.profile() as record:
        loss = (second(nn.functional.gelu(first(x))) ** 2).sum()
        loss.backward()
        em.realize(first.weight.grad, first.bias.grad, second.weight.grad)
    hidden = [kernel for kernel in record.kernels if kernel.name.startswith("e_") and kernel.global_size > 0]
    tloss = (tsecond(torch.nn.functional.gelu(tfirst(tx))) ** 2).sum()
    tloss.backward()
    assert_close(loss, tloss.detach(), atol=1e-3)
    assert_close(first.weight.grad, tfirst.weight.grad, atol=1e-3)
    assert_close(first.bias.grad, tfirst.bias.grad, atol=1e-3)
    assert_close(second.weight.grad, tsecond.weight.grad, atol=1e-3)
    assert len(hidden) <= 2, str(record)


def _kernels_evaluating(realize: Callable[[], object], ops: set, monkeypatch) -> int:
    """How many of the kernels that `realize` schedules evaluate any of `ops`."""
    return sum(any(step.op in ops for step in launch.kernel.steps)
               for launch in scheduled_launches(realize, monkeypatch))


def test_attention_weights_under_dropout_are_stored_for_the_backward(monkeypatch) -> None:
    # scaled_dot_product_attention's backward sums grad * weights over each row; with dropout applied above the
    # weights nothing stored them, and that row sum recomputed them (an exp per element in a scalar loop: 5x the
    # kernel's time in gpt_sdpa). The exps belong to the forward's softmax kernels only.
    from ember.core.ops import Op
    from ember.nn import functional as F

    em.manual_seed(0)
    query, key, value = (em.tensor(random_array((2, 3, 16, 8), seed=seed), device="dummy:0", requires_grad=True)
                         for seed in range(3))

    def forward_and_backward() -> None:
        output = F.scaled_dot_product_attention(query, key, value, dropout_p=0.1, is_causal=True)
        (output * output).sum().backward()
        em.realize(query.grad, key.grad, value.grad)

    assert _kernels_evaluating(forward_and_backward, {Op.EXP2}, monkeypatch) <= 2


def test_attention_with_stored_weights_matches_torch(device: str) -> None:
    from ember.nn import functional as F

    arrays = [random_array((2, 3, 11, 8), seed=seed) for seed in range(3)]
    tensors = [pair(array, device, requires_grad=True) for array in arrays]
    output = F.scaled_dot_product_attention(*(tensor for tensor, _ in tensors), is_causal=True)
    toutput = torch.nn.functional.scaled_dot_product_attention(*(tensor for _, tensor in tensors), is_causal=True)
    (output * output).sum().backward()
    (toutput * toutput).sum().backward()
    assert_close(output, toutput.detach(), atol=1e-5)
    for (tensor, reference) in tensors:
        assert_close(tensor.grad, reference.grad, atol=1e-4)


def test_a_value_reading_many_buffers_read_by_several_kernels_is_stored(device: str) -> None:
    # a residual stream with dropout (x + dropout(f(x)) several times) reads each branch's output and its random
    # bits; every layer norm reduce and gradient kernel reading x recomputed it from all of them (19 buffers a
    # kernel in nanoGPT's backward): stored once, each of those kernels reads one buffer
    from ember.core.ops import Op
    from ember.scheduler.kernelize import SHARED_READ_LIMIT, kernelize
    from ember.scheduler.program import Launch

    arrays = [random_array((16, 8), seed=seed) for seed in range(SHARED_READ_LIMIT + 1)]
    pairs = [pair(array, device) for array in arrays]
    residual, treference = pairs[0]
    for tensor, reference in pairs[1:]:
        residual, treference = residual + tensor * 0.5, treference + reference * 0.5
    outputs = [residual.sum(-1), (residual * residual).sum(0), residual.exp()]
    items = kernelize([output.node for output in outputs])
    launches = [item for item in items if isinstance(item, Launch)]
    assert max(sum(step.op is Op.BUFFER for step in item.kernel.steps) for item in launches) <= SHARED_READ_LIMIT
    references = [treference.sum(-1), (treference * treference).sum(0), treference.exp()]
    em.realize(*outputs)
    for output, reference in zip(outputs, references):
        assert_close(output, reference, atol=1e-4)
