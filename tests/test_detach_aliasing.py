"""detach() shares storage with its source, as in torch: an in-place change of a detached tensor changes the tensor
it came from and that tensor's views (and the other way round), a detach joins the storage of a tensor with views,
and the version counter is shared, so backward through a value saved before an in-place change of a detached alias
raises torch's error. The detached tensor's autograd stays its own. Every case runs the same code on torch and
ember."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import ember as em
from tests.helpers import assert_close, pair, random_array


def _detached_zero(x: Any) -> list[Any]:
    detached = x.detach()
    detached.zero_()
    return [x, detached]


def _source_write_seen_by_detached(x: Any) -> list[Any]:
    detached = x.detach()
    x.add_(1)
    x[0, 1] = 40
    return [x, detached]


def _detach_joins_views(x: Any) -> list[Any]:
    row, transposed = x[1], x.t()
    detached = x.detach()
    detached[0].fill_(5)
    detached[:, 2].mul_(-1)
    row.add_(100)
    return [x, row, transposed, detached]


def _detach_of_a_view(x: Any) -> list[Any]:
    view = x[1:3, ::2]
    detached = view.detach()
    detached.mul_(3)
    detached[0, 0] = -7
    return [x, view, detached]


def _views_of_a_detached(x: Any) -> list[Any]:
    detached = x.detach()
    column = detached.t()[2]
    column.sub_(10)
    detached.view(24)[5:9].zero_()
    return [x, detached, column]


def _detach_of_a_detach(x: Any) -> list[Any]:
    first = x.detach()
    second = first.detach()
    second.add_(2)
    first[3].zero_()
    return [x, first, second]


def _detached_of_a_dead_source(x: Any) -> list[Any]:
    detached = (x * 2).detach()  # the source is gone: the detached tensor alone holds the storage
    detached.add_(1)
    detached.add_(detached.flip(0))
    return [x, detached]


def _clone_does_not_alias(x: Any) -> list[Any]:
    copied = x.detach().clone()
    copied.zero_()
    return [x, copied]


CASES: dict[str, Callable[[Any], list[Any]]] = {
    "detached_zero": _detached_zero, "source_write_seen_by_detached": _source_write_seen_by_detached,
    "detach_joins_views": _detach_joins_views, "detach_of_a_view": _detach_of_a_view,
    "views_of_a_detached": _views_of_a_detached, "detach_of_a_detach": _detach_of_a_detach,
    "detached_of_a_dead_source": _detached_of_a_dead_source, "clone_does_not_alias": _clone_does_not_alias,
}


@pytest.mark.parametrize("name", list(CASES))
def test_writes_through_a_detached_tensor_reach_its_storage(name: str, device: str) -> None:
    ours, theirs = pair(random_array((6, 4)), device)
    assert_close(CASES[name](ours), CASES[name](theirs))


def test_detach_of_a_leaf_that_requires_grad(device: str) -> None:
    ours, theirs = pair(random_array((5,)), device, requires_grad=True)
    for leaf in (ours, theirs):
        detached = leaf.detach()
        assert not detached.requires_grad and detached.grad_fn is None
        detached.zero_()  # allowed on the detached alias; the leaf changes with it
        assert leaf.requires_grad
        assert leaf._version == detached._version == 1
    assert_close(ours, theirs.detach())
    for leaf in (ours, theirs):
        (leaf * leaf).sum().backward()
    assert ours.grad is not None and theirs.grad is not None
    assert_close(ours.grad, theirs.grad)


def test_layout_and_base_of_detached_tensors(device: str) -> None:
    ours, theirs = pair(random_array((4, 6)), device)
    makers: list[Callable[[Any], Any]] = [
        lambda x: x.detach(), lambda x: x[1:, 2:].detach(), lambda x: x.t().detach(), lambda x: x.detach().t(),
        lambda x: x.detach()[1:3], lambda x: x[::2].detach()[:, 1],
    ]
    for make in makers:
        mine, torch_result = make(ours), make(theirs)
        assert mine.stride() == torch_result.stride()
        assert mine.storage_offset() == torch_result.storage_offset()
        assert mine.is_contiguous() == torch_result.is_contiguous()
    for x in (ours, theirs):  # (ember's views hold their base weakly: the bases here are kept)
        detached = x.detach()
        assert detached._base is None and not detached._is_view()
        view = detached[1:]
        assert view._base is detached and view._is_view()  # a view of the detached tensor is its view, not x's
        row = x[1:]
        assert row.detach()._base is None and not row.detach()._is_view()


def _saved_then_detached_changed(x: Any) -> None:
    y = x * 2
    z = (y * y).sum()
    y.detach().mul_(10)
    z.backward()


def _leaf_saved_then_detached_changed(x: Any) -> None:
    z = (x.exp() * x).sum()
    x.detach()[1:].add_(1)
    z.backward()


def _view_saved_then_detached_changed(x: Any) -> None:
    y = x * 1
    row = y[1:]
    z = (row * row).sum()
    y.detach().zero_()
    z.backward()


@pytest.mark.parametrize("action", [_saved_then_detached_changed, _leaf_saved_then_detached_changed,
                                    _view_saved_then_detached_changed])
def test_version_counter_is_shared_with_the_detached_tensor(action: Callable[[Any], None], device: str) -> None:
    ours, theirs = pair(np.ones(3, np.float32), device, requires_grad=True)
    with pytest.raises(RuntimeError):
        action(theirs)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        action(ours)


def test_data_does_not_share_the_version_but_detach_does(device: str) -> None:
    ours, theirs = pair(random_array((4,)), device)
    versions = []
    for x in (ours, theirs):
        data, detached = x.data, x.detach()
        data.add_(1)
        after_data = (x._version, data._version, detached._version)
        detached.add_(1)
        versions.append((after_data, (x._version, detached._version)))
    assert versions[0] == versions[1]
    assert_close(ours, theirs)


def _detached_history(a: Any) -> tuple[Any, Any]:
    x = a * 2
    detached = x.detach()
    detached.mul_(3)  # x's history does not read x's values: backward still works
    other = a[:2] * 1
    other_detached = other.detach()
    other_detached.copy_(a[2:] * 5)  # a detached tensor given a value with history gets its own
    return x.sum() + (other_detached * other_detached).sum(), x


def test_gradients_with_writes_through_detached_tensors_match_torch(device: str) -> None:
    ours, theirs = pair(random_array((4,)), device, requires_grad=True)
    (loss, x), (torch_loss, torch_x) = _detached_history(ours), _detached_history(theirs)
    assert_close(x, torch_x.detach())
    loss.backward()
    torch_loss.backward()
    assert_close(loss, torch_loss.detach(), atol=1e-4)
    assert ours.grad is not None and theirs.grad is not None
    assert_close(ours.grad, theirs.grad, atol=1e-4)


def test_state_dict_values_alias_the_parameters(device: str) -> None:
    torch.manual_seed(0)
    reference = torch.nn.Linear(3, 2)
    layer = em.nn.Linear(3, 2).to(device)
    layer.load_state_dict({key: value.detach().numpy() for key, value in reference.state_dict().items()})
    for module, optimizer in ((layer, em.optim.SGD(layer.parameters(), lr=0.5)),
                              (reference, torch.optim.SGD(reference.parameters(), lr=0.5))):
        saved = module.state_dict()  # detached aliases of the parameters, as torch's
        module.weight.grad = module.weight.detach() * 0 + 1
        module.bias.grad = module.bias.detach() * 0 + 1
        optimizer.step()
        if module is layer:
            ours = saved
        else:
            theirs = saved
    assert_close(ours["weight"], theirs["weight"])
    assert_close(ours["bias"], theirs["bias"])
    assert_close(layer.weight, reference.weight.detach())
