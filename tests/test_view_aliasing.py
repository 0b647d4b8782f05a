"""Views alias their base, as in torch: writes through a view, a slice, `.data`, `.t()`, ... change the base and
every other view of it; autograd's version counters catch values changed in place after an op saved them; and
gradients through in-place writes into views match torch's. Every case runs the same code on torch and ember."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
import ember.nn.functional as F
from tests.helpers import assert_close, pair, random_array

# each case: (shape of the base, what to do to it) -> the tensors to compare (the base, its views)
Case = Callable[[Any], list[Any]]


def _slice_add(x: Any) -> list[Any]:
    x[1:3].add_(5)
    return [x]


def _row_zero(x: Any) -> list[Any]:
    x[1].zero_()
    return [x]


def _view_setitem(x: Any) -> list[Any]:
    view = x.view(6, 4)
    view[0, 0] = 7
    view[2] = -1
    return [x, view]


def _transpose_mul(x: Any) -> list[Any]:
    x.t().mul_(2)
    return [x]


def _data_row_zero(x: Any) -> list[Any]:
    x.data[0].zero_()
    x.data[:, 1].fill_(3)
    return [x]


def _base_write_seen_by_views(x: Any) -> list[Any]:
    row, column, transposed = x[0], x[:, 2], x.t()
    x.add_(1)
    x[1, 1] = 50
    return [row, column, transposed]


def _chained(x: Any) -> list[Any]:
    chained = x.view(3, 8)[:, 2:].t()[::2]
    chained.add_(100)
    return [x, chained]


def _chained_steps(x: Any) -> list[Any]:
    view = x.unsqueeze(0).transpose(1, 2)[0, 1:, ::2].squeeze()
    view.sub_(10)
    return [x, view]


def _two_views(x: Any) -> list[Any]:
    first, second = x[0:2], x[1:3]
    first.mul_(2)
    second[:, 0] = 9
    return [x, first, second]


def _setitem_through_views(x: Any) -> list[Any]:
    transposed = x.t()
    transposed[1] = 9
    transposed[:, 0] = x[1, :1] * 3  # reads the base while writing through its view
    return [x, transposed]


def _movement_views(x: Any) -> list[Any]:
    x.transpose(0, 1)[0].add_(1)
    x.permute(1, 0)[2:].mul_(-1)
    x.narrow(1, 1, 2).add_(10)
    x.select(0, 3).fill_(4)
    x.unsqueeze(1)[2].sub_(3)
    x[:1].squeeze(0).mul_(5)
    x.reshape(2, 12)[1, ::5].add_(0.5)
    x.flatten()[7:9].zero_()
    return [x]


def _pieces(x: Any) -> list[Any]:
    first, second = x.unbind(1)[:2]
    first.add_(1)
    second.mul_(2)
    for index, piece in enumerate(x.split(2, 0)):
        piece.add_(index * 100)
    x.chunk(2, 1)[1].neg_()
    return [x]


def _steps_none_ellipsis(x: Any) -> list[Any]:
    x[::2, 1::3].fill_(3)
    x[None, ..., 1].sub_(1)
    x[1::2][:, ::2] += 7
    return [x]


def _diagonal(x: Any) -> list[Any]:
    square = x[:4]
    square.diagonal().fill_(0)
    square.diagonal(1).add_(20)
    return [x]


def _base_then_view_then_base(x: Any) -> list[Any]:
    view = x[1:]
    view.mul_(2)
    x.add_(1)
    view[0].zero_()
    return [x, view]


def _copies_do_not_alias(x: Any) -> list[Any]:
    reshaped = x.t().reshape(-1)  # not viewable: a copy in torch
    reshaped.add_(1)
    flipped = x.flip(0)
    flipped.mul_(3)
    cloned = x[0].clone()
    cloned.zero_()
    return [x, reshaped, flipped, cloned]


def _after_ops_with_intermediates(x: Any) -> list[Any]:
    """Ops that make movement intermediates inside (a broadcast, matmul's reshapes and transposes, the reshape
    that ends a reduction) make no views of their operands or results: the user's views made before and after
    still alias x, the results alias nothing but their own views, and the results keep the values of the time."""
    row = x[0]
    product = x * row  # row broadcast inside
    summed = product.sum(1)
    gram = x @ x.t()
    scaled = 2 * x[:, 1]  # a number broadcast inside
    row.add_(1)
    summed.view(2, 3)[0].mul_(-1)
    gram.t()[0].fill_(2)
    x.t()[1].sub_(3)
    scaled[1:].zero_()
    return [x, row, product, summed, gram, scaled]


def _unfold_and_convolutions(x: Any) -> list[Any]:
    """unfold is a view (writes through its windows reach x); a convolution and a max pool, whose window views are
    their own intermediates, make no views: their results alias nothing and keep the values of the time."""
    functional = torch.nn.functional if isinstance(x, torch.Tensor) else F
    windows = x.unfold(1, 2, 1)
    signal = x.view(1, 6, 4)
    convolved = functional.conv1d(signal, x[:, :2].unsqueeze(0), padding=1)
    pooled = functional.max_pool1d(signal, 2)
    windows[0, 1].mul_(10)
    convolved.mul_(-1)
    pooled[0, 0].fill_(5)
    return [x, windows, convolved, pooled]


def _overlapping_unfold(x: Any) -> list[Any]:
    """Overlapping windows (size > step) see the base's writes, and a write into a part of them that holds each
    element once (one window, one position of every window) reaches the base and the other windows."""
    windows = x.unfold(0, 3, 1)  # (4, 4, 3): row r + j of x in window r at position j
    x[2].add_(100)
    windows[1, :, 0] = -1.0  # x[1]
    windows[3, 2].fill_(7)  # x[5, 2]
    windows[:, 0, 2].mul_(3)  # x[2..5, 0]
    return [x, windows]


CASES: dict[str, Case] = {
    "slice_add": _slice_add, "row_zero": _row_zero, "view_setitem": _view_setitem, "transpose_mul": _transpose_mul,
    "data_row_zero": _data_row_zero, "base_write_seen_by_views": _base_write_seen_by_views, "chained": _chained,
    "chained_steps": _chained_steps, "two_views": _two_views, "setitem_through_views": _setitem_through_views,
    "movement_views": _movement_views, "pieces": _pieces, "steps_none_ellipsis": _steps_none_ellipsis,
    "diagonal": _diagonal, "base_then_view_then_base": _base_then_view_then_base,
    "copies_do_not_alias": _copies_do_not_alias, "after_ops_with_intermediates": _after_ops_with_intermediates,
    "unfold_and_convolutions": _unfold_and_convolutions, "overlapping_unfold": _overlapping_unfold,
}


@pytest.mark.parametrize("name", list(CASES))
def test_writes_through_views_change_the_base_and_its_views(name: str, device: str) -> None:
    ours, theirs = pair(random_array((6, 4)), device)
    assert_close(CASES[name](ours), CASES[name](theirs))


def test_one_dimensional_slice_and_view_of_a_reshape(device: str) -> None:
    ours, theirs = pair(random_array((8,)), device)
    for tensor in (ours, theirs):
        tensor[1:3].add_(5)
        tensor.view(2, 4)[1, ::2].mul_(-2)
    assert_close(ours, theirs)


def test_forget_gate_bias_and_embedding_row(device: str) -> None:
    torch.manual_seed(0)
    reference = torch.nn.LSTM(3, 4)
    embedding_reference = torch.nn.Embedding(5, 3)
    lstm = em.nn.LSTM(3, 4).to(device)
    embedding = em.nn.Embedding(5, 3).to(device)
    lstm.load_state_dict({key: value.detach().numpy() for key, value in reference.state_dict().items()})
    embedding.load_state_dict({key: value.detach().numpy() for key, value in embedding_reference.state_dict().items()})
    for module, bias in ((lstm, lstm.bias_ih_l0), (reference, reference.bias_ih_l0)):
        count = bias.shape[0]
        bias.data[count // 4:count // 2].fill_(1.0)
    embedding.weight.data[0].zero_()
    embedding_reference.weight.data[0].zero_()
    assert_close(lstm.bias_ih_l0, reference.bias_ih_l0)
    assert_close(embedding.weight, embedding_reference.weight)
    inputs = random_array((2, 1, 3))
    assert_close(lstm(em.tensor(inputs, device=device))[0], reference(torch.tensor(inputs))[0], atol=1e-5)


def test_layout_queries_match_torch(device: str) -> None:
    ours, theirs = pair(random_array((4, 6)), device)
    views: list[Callable[[Any], Any]] = [
        lambda x: x, lambda x: x.t(), lambda x: x[1:, 2], lambda x: x[:, ::2], lambda x: x[1::2, 1::3],
        lambda x: x.view(2, 12)[1], lambda x: x.unsqueeze(1), lambda x: x.permute(1, 0)[2:], lambda x: x.diagonal(),
        lambda x: x.narrow(1, 2, 3), lambda x: x[None, ..., 1], lambda x: x.expand(2, 4, 6),
    ]
    for make in views:
        mine, torch_view = make(ours), make(theirs)
        assert mine.stride() == torch_view.stride()
        assert mine.storage_offset() == torch_view.storage_offset()
        assert mine.is_contiguous() == torch_view.is_contiguous()
        assert mine._is_view() == torch_view._is_view()


def _raises_in_both(action: Callable[[Any], Any], ours: Any, theirs: Any, match: str) -> None:
    with pytest.raises(RuntimeError):
        action(theirs)
    with pytest.raises(RuntimeError, match=match):
        action(ours)


def test_errors_where_torch_raises(device: str) -> None:
    ours, theirs = pair(random_array((4, 6)), device)
    _raises_in_both(lambda x: x.t()[1:].view(-1), ours, theirs, "view size is not compatible")
    _raises_in_both(lambda x: x[0].expand(3, 6).add_(1), ours, theirs, "more than one element")
    leaf, torch_leaf = pair(random_array((3,)), device, requires_grad=True)
    _raises_in_both(lambda x: x.add_(1), leaf, torch_leaf, "leaf")
    _raises_in_both(lambda x: x[0:2].mul_(2), leaf, torch_leaf, "view of a leaf")


def _saved_then_changed(x: Any) -> None:
    y = x * 2
    z = (y * y).sum()
    y.mul_(10)
    z.backward()


def _changed_under_no_grad(x: Any) -> None:
    z = (x * x).sum()
    with (em.no_grad() if isinstance(x, em.Tensor) else torch.no_grad()):
        x.add_(1)
    z.backward()


def _view_changed(x: Any) -> None:
    y = x * 1
    z = (y.exp() * y).sum()
    y[1:].mul_(2)
    z.backward()


@pytest.mark.parametrize("action", [_saved_then_changed, _changed_under_no_grad, _view_changed])
def test_backward_through_a_value_changed_in_place_raises(action: Callable[[Any], None], device: str) -> None:
    ours, theirs = pair(np.ones(3, np.float32), device, requires_grad=True)
    _raises_in_both(action, ours, theirs, "modified by an inplace operation")


def _scaled_slice(a: Any) -> Any:
    x = a * 1
    x[0:2].mul_(3)
    return x.sum()


def _row_times_row(a: Any) -> Any:
    x = a * 2
    transposed = x.t()
    transposed[0].mul_(transposed[1].clone())  # torch raises without the clone (it saved the view it changes)
    return (x * x).sum()


def _setitem_value_with_history(a: Any) -> Any:
    x = a * 0
    x[1:3] = a[0:2] * a[2:4]
    x[:, ::2] += 1
    return (x * x).sum()


def _used_before_change(a: Any) -> Any:
    y = a * 2
    w = y + 1  # addition saves nothing: changing y later is fine, w's gradient is that of the old y
    y.mul_(3)
    return (w + y).sum()


def _chain_of_views(a: Any) -> Any:
    x = a * 3
    view = x.view(3, 8)[:, 2:].t()
    view.mul_(3)
    view[::2].add_(x[2, :2].sum())  # elements of x outside the view (torch reads overlapping ones mid-write)
    return x.sum() + view.sum()


@pytest.mark.parametrize("function", [_scaled_slice, _row_times_row, _setitem_value_with_history,
                                      _used_before_change, _chain_of_views])
def test_gradients_through_in_place_writes_into_views_match_torch(function: Callable[[Any], Any],
                                                                     device: str) -> None:
    ours, theirs = pair(random_array((6, 4)), device, requires_grad=True)
    loss, torch_loss = function(ours), function(theirs)
    loss.backward()
    torch_loss.backward()
    assert_close(loss, torch_loss.detach(), atol=1e-4)
    assert ours.grad is not None and theirs.grad is not None
    assert_close(ours.grad, theirs.grad, atol=1e-4)


def test_jit_replays_writes_through_views(device: str) -> None:
    def update(state: Any) -> Any:
        state[1:3].add_(1)
        state.t()[0].mul_(2)
        return state.sum()

    jitted = em.jit(update)
    ours, theirs = pair(random_array((4, 3)), device)
    for _ in range(4):
        total = jitted(ours)
        expected = update(theirs)
        assert_close(total, expected, atol=1e-4)
        assert_close(ours, theirs, atol=1e-4)
    assert jitted.replays >= 2


def test_optimizer_updates_reach_views_of_parameters(device: str) -> None:
    torch.manual_seed(0)
    reference = torch.nn.Linear(3, 2)
    layer = em.nn.Linear(3, 2).to(device)
    layer.load_state_dict({key: value.detach().numpy() for key, value in reference.state_dict().items()})
    row, torch_row = layer.weight[0], reference.weight[0]
    inputs = random_array((5, 3))
    for model, optimizer, make in ((layer, em.optim.SGD(layer.parameters(), lr=0.1),
                                    lambda a: em.tensor(a, device=device)),
                                   (reference, torch.optim.SGD(reference.parameters(), lr=0.1), torch.tensor)):
        for _ in range(2):
            optimizer.zero_grad()
            model(make(inputs)).square().sum().backward()
            optimizer.step()
    assert_close(layer.weight, reference.weight, atol=1e-5)
    assert_close(row, torch_row.detach(), atol=1e-5)


def test_a_view_op_running_in_another_thread_does_not_stop_this_threads_views(device: str) -> None:
    """Which view op is the outermost is per thread: a view made while another thread is inside a view op still
    aliases its base, as in torch."""
    import threading

    import ember.core.views as views

    inside, done = threading.Event(), threading.Event()

    def hold_a_view_op_open() -> None:
        views._NESTING.depth = 1  # as while a view op runs on this thread
        inside.set()
        done.wait(10)
        views._NESTING.depth = 0

    other = threading.Thread(target=hold_a_view_op_open)
    other.start()
    try:
        assert inside.wait(10)
        x, tx = em.zeros(4, device=device), torch.zeros(4)
        x[1:3].add_(5)
        tx[1:3].add_(5)
    finally:
        done.set()
        other.join()
    np.testing.assert_array_equal(x.numpy(), tx.numpy())


def test_results_of_ops_are_no_views_and_leave_their_operands_alone(device: str) -> None:
    """The intermediates inside an op (its broadcasts, reshapes and transposes) put neither the operands nor the
    result into a storage, as torch makes no view there: only the user's own view ops do."""
    weight = em.tensor(random_array((3, 4)), device=device)
    inputs = em.tensor(random_array((2, 4)), device=device)
    vector = em.tensor(random_array((4,)), device=device)
    results = [F.linear(inputs, weight, em.ones(3, device=device)), inputs.sum(1), inputs * vector,
               em.rand(2, 3, device=device), em.randn(2, 3, device=device), inputs.matmul(vector),
               vector.matmul(weight.sum(0, keepdim=True).t()), em.stack([vector, vector])]
    for tensor in (weight, inputs, vector, *results):
        assert tensor._base is None and tensor._alias is None
    assert weight.t()._base is weight and weight._alias is not None  # a user's view op still links


def test_a_write_through_overlapping_windows_raises(device: str) -> None:
    """Every element of overlapping unfold windows written at once: torch writes them one by one in an order it does
    not promise; ember raises torch's overlap error (naming the windows) and leaves the base unchanged."""
    x = em.arange(6.0, device=device)
    windows = x.unfold(0, 3, 1)
    with pytest.raises(RuntimeError, match="single memory location.*overlapping unfold windows"):
        windows.mul_(2)
    with pytest.raises(RuntimeError, match="single memory location"):
        windows[0:2] = 1.0
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
