"""Transposed convolution, F.unfold / F.fold, Tensor.unfold and their layers against PyTorch, forward and backward,
on every test device."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import ember as em
import ember.nn as enn
import ember.nn.functional as F
from tests.helpers import assert_close

TRANSPOSED_CASES = [  # (spatial dims, stride, padding, output_padding, groups, dilation)
    (1, 1, 0, 0, 1, 1),
    (1, 3, 2, 2, 2, 2),
    (2, 2, 1, 1, 1, 1),
    (2, (2, 1), (0, 1), (1, 0), 2, (1, 2)),
    (2, 1, 3, 0, 1, 2),  # padding larger than dilation * (kernel - 1): the inserted input is cropped
    (3, 2, 1, 1, 2, 1),
    (1, 1, 1, 1, 1, 2),  # output_padding 1 with stride 1: allowed as it is smaller than the dilation
    (1, 2, 0, 1, 1, 3),  # stride and dilation both: the spread input read at every third position
    (1, 3, 4, 0, 2, 1),  # padding past the kernel's reach along a strided axis: the output crops the spread input
    (2, (1, 3), (2, 1), (0, 2), 1, (2, 1)),  # a stride along the last axis only, output_padding 2
    (2, 2, 0, 0, 1, 1),
]


def _random(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _compare(device: str, arrays: list[np.ndarray], call_ember: object, call_torch: object, atol: float = 1e-4
             ) -> None:
    """Forward and the gradients of every input for a random weighting of the output."""
    mine = [em.tensor(array, device=device, requires_grad=True) for array in arrays]
    theirs = [torch.tensor(array, requires_grad=True) for array in arrays]
    mine_out, theirs_out = call_ember(*mine), call_torch(*theirs)
    assert_close(mine_out, theirs_out, atol=atol, rtol=1e-4)
    weight = _random(tuple(theirs_out.shape), 99)
    (mine_out * em.tensor(weight, device=device)).sum().backward()
    (theirs_out * torch.tensor(weight)).sum().backward()
    for one_mine, one_theirs in zip(mine, theirs):
        assert_close(one_mine.grad, one_theirs.grad, atol=atol, rtol=1e-4)


@pytest.mark.parametrize("case", TRANSPOSED_CASES, ids=[str(case) for case in TRANSPOSED_CASES])
def test_conv_transpose_matches_torch(device: str, case: tuple) -> None:
    spatial, stride, padding, output_padding, groups, dilation = case
    name = f"conv_transpose{spatial}d"
    inputs = _random((2, 4) + (5, 4, 3)[:spatial], 0)
    weight = _random((4, 6 // groups) + (3, 2, 2)[:spatial], 1)
    bias = _random((6,), 2)
    options = (stride, padding, output_padding, groups, dilation)
    _compare(device, [inputs, weight, bias], lambda x, w, b: getattr(F, name)(x, w, b, *options),
             lambda x, w, b: getattr(TF, name)(x, w, b, *options))


def test_conv_transpose_sizes_off_the_tiles(device: str) -> None:
    """Spatial sizes no vector tile divides, strides per axis, output_padding on both axes."""
    inputs, weight, bias = _random((2, 3, 13, 19), 5), _random((3, 5, 4, 3), 6), _random((5,), 7)
    options = {"stride": (2, 3), "padding": (1, 1), "output_padding": (1, 2)}
    _compare(device, [inputs, weight, bias], lambda x, w, b: F.conv_transpose2d(x, w, b, **options),
             lambda x, w, b: TF.conv_transpose2d(x, w, b, **options), atol=2e-4)


def test_conv_transpose_second_order() -> None:
    """create_graph: the input's gradient is a convolution recorded in turn, so it differentiates again."""
    arrays = [_random((1, 2, 4, 5), 8), _random((2, 3, 3, 2), 9)]
    mine = [em.tensor(array, device="c", requires_grad=True) for array in arrays]
    theirs = [torch.tensor(array, requires_grad=True) for array in arrays]
    options = {"stride": 2, "padding": 1, "output_padding": 1}
    (mine_grad,) = em.autograd.grad(F.conv_transpose2d(*mine, **options).square().sum(), [mine[0]],
                                    create_graph=True)
    (their_grad,) = torch.autograd.grad(TF.conv_transpose2d(*theirs, **options).square().sum(), [theirs[0]],
                                        create_graph=True)
    mine_grad.square().sum().backward()
    their_grad.square().sum().backward()
    for one_mine, one_theirs in zip(mine, theirs):
        assert_close(one_mine.grad, one_theirs.grad, atol=1e-3, rtol=1e-3)


def test_conv_transpose_unbatched_without_bias(device: str) -> None:
    inputs, weight = _random((3, 6, 5), 3), _random((3, 2, 3, 3), 4)
    _compare(device, [inputs, weight], lambda x, w: F.conv_transpose2d(x, w, stride=2),
             lambda x, w: TF.conv_transpose2d(x, w, stride=2))


@pytest.mark.parametrize("spatial", [1, 2, 3])
def test_conv_transpose_layers_state_dict_init_and_output_size(device: str, spatial: int) -> None:
    torch.manual_seed(0)
    torch_class, ember_class = (getattr(torch.nn, f"ConvTranspose{spatial}d"), getattr(enn, f"ConvTranspose{spatial}d"))
    arguments = dict(stride=2, padding=1, output_padding=1, groups=2, dilation=1)
    theirs = torch_class(4, 6, 3, **arguments)
    mine = ember_class(4, 6, 3, **arguments).to(device)
    assert repr(mine) == repr(theirs)
    assert {key: tuple(value.shape) for key, value in mine.state_dict().items()} == \
        {key: tuple(value.shape) for key, value in theirs.state_dict().items()}
    bound = 1 / math.sqrt(3 * 3**spatial)  # torch's default: fan_in = out_channels / groups * kernel
    assert np.abs(mine.weight.numpy()).max() <= bound and np.abs(mine.bias.numpy()).max() <= bound
    mine.load_state_dict(theirs.state_dict())  # torch -> ember
    theirs.load_state_dict({key: torch.tensor(value.numpy()) for key, value in mine.state_dict().items()})  # back
    inputs = _random((2, 4) + (4, 3, 3)[:spatial], 5)
    assert_close(mine(em.tensor(inputs, device=device)), theirs(torch.tensor(inputs)), atol=1e-4)
    sizes = tuple((size - 1) * 2 - 2 + 3 for size in (4, 3, 3)[:spatial])  # the smallest output; +1 is allowed
    wanted = tuple(size + 1 for size in sizes)
    assert_close(mine(em.tensor(inputs, device=device), output_size=wanted),
                 theirs(torch.tensor(inputs), output_size=wanted), atol=1e-4)
    with pytest.raises(ValueError, match="valid sizes range"):
        mine(em.tensor(inputs, device=device), output_size=tuple(size + 5 for size in sizes))


def test_conv3d_layer(device: str) -> None:
    torch.manual_seed(0)
    theirs = torch.nn.Conv3d(2, 4, (2, 3, 2), stride=(1, 2, 1), padding=1, groups=2)
    mine = enn.Conv3d(2, 4, (2, 3, 2), stride=(1, 2, 1), padding=1, groups=2).to(device)
    mine.load_state_dict(theirs.state_dict())
    inputs = _random((1, 2, 4, 5, 3), 6)
    assert_close(mine(em.tensor(inputs, device=device)), theirs(torch.tensor(inputs)), atol=1e-4)


FOLD_CASES = [  # (kernel_size, dilation, padding, stride)
    (3, 1, 0, 1),
    (2, 1, 1, 2),
    ((3, 2), (2, 1), (1, 0), (2, 3)),
    (2, 1, 0, 3),  # blocks that skip input elements
]


@pytest.mark.parametrize("case", FOLD_CASES, ids=[str(case) for case in FOLD_CASES])
def test_unfold_and_fold_match_torch(device: str, case: tuple) -> None:
    kernel, dilation, padding, stride = case
    inputs = _random((2, 3, 7, 6), 7)
    _compare(device, [inputs], lambda x: F.unfold(x, kernel, dilation, padding, stride),
             lambda x: TF.unfold(x, kernel, dilation, padding, stride))
    columns = TF.unfold(torch.tensor(inputs), kernel, dilation, padding, stride)
    _compare(device, [_random(tuple(columns.shape), 8)], lambda c: F.fold(c, (7, 6), kernel, dilation, padding, stride),
             lambda c: TF.fold(c, (7, 6), kernel, dilation, padding, stride))


def test_fold_unfold_layers_and_unbatched(device: str) -> None:
    inputs = _random((3, 5, 4), 9)  # unbatched (C, H, W)
    mine_unfold, theirs_unfold = enn.Unfold((2, 3), padding=1), torch.nn.Unfold((2, 3), padding=1)
    assert repr(mine_unfold) == repr(theirs_unfold)
    columns = theirs_unfold(torch.tensor(inputs))
    assert_close(mine_unfold(em.tensor(inputs, device=device)), columns)
    mine_fold, theirs_fold = enn.Fold((5, 4), (2, 3), padding=1), torch.nn.Fold((5, 4), (2, 3), padding=1)
    assert repr(mine_fold) == repr(theirs_fold)
    assert_close(mine_fold(em.tensor(columns.numpy(), device=device)), theirs_fold(columns), atol=1e-5)


def test_tensor_unfold_is_torchs_strided_view(device: str) -> None:
    data = _random((3, 10, 2), 10)
    for dimension, size, step in ((1, 2, 2), (1, 3, 1), (1, 4, 3), (0, 1, 5), (1, 10, 1), (-1, 2, 1), (1, 0, 2)):
        _compare(device, [data], lambda x: x.unfold(dimension, size, step) * 1.0,
                 lambda x: x.unfold(dimension, size, step) * 1.0)
    assert_close(em.tensor(7.0, device=device).unfold(0, 1, 1), torch.tensor(7.0).unfold(0, 1, 1))


def test_bad_arguments_raise_at_the_call(device: str) -> None:
    source = em.ones(2, 4, 5, 5, device=device)
    with pytest.raises(em.ShapeError, match="4 channels"):
        F.conv_transpose2d(source, em.ones(3, 2, 3, 3, device=device))
    with pytest.raises(ValueError, match="output_padding"):
        F.conv_transpose2d(source, em.ones(4, 2, 3, 3, device=device), stride=2, output_padding=2)
    with pytest.raises(em.ShapeError, match="4-d weight"):
        F.conv_transpose2d(source, em.ones(4, 2, 3, device=device))
    with pytest.raises(ValueError, match="zeros"):
        enn.ConvTranspose2d(2, 2, 3, padding_mode="reflect")
    with pytest.raises(em.ShapeError, match="divisible"):
        F.fold(em.ones(1, 5, 9, device=device), (4, 4), 2)
    with pytest.raises(em.ShapeError, match="dim 2"):
        F.fold(em.ones(1, 4, 8, device=device), (4, 4), 2)
    with pytest.raises(em.ShapeError, match="sliding blocks"):
        F.unfold(em.ones(1, 1, 2, 2, device=device), 3)
    with pytest.raises(em.ShapeError, match="4-d input"):
        F.unfold(em.ones(2, 2, device=device), 1)
    with pytest.raises(em.ShapeError, match="size 4"):
        em.ones(3, device=device).unfold(0, 4, 1)
    with pytest.raises(ValueError, match="step"):
        em.ones(3, device=device).unfold(0, 2, 0)
