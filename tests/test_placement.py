"""Placement across devices: ops on tensors from several devices run where most input bytes live, and the
inputs living elsewhere arrive by scheduled copies (visible in em.profile())."""

import numpy as np
import pytest
import torch

import ember as em
from tests.conftest import TEST_DEVICES
from tests.helpers import assert_close, random_array

needs_two = pytest.mark.skipif(len(TEST_DEVICES) < 2, reason="needs two test devices")


@needs_two
def test_mixed_device_matmul_and_elementwise_match_torch() -> None:
    first, second = TEST_DEVICES[:2]
    a_data, b_data = random_array((8, 16)), random_array((16, 4), seed=1)
    a = em.tensor(a_data, device=first)
    b = em.tensor(b_data, device=second)
    with em.profile() as record:
        result = ((a @ b) + 1).relu()
        result.realize()
    assert result.device == first  # a holds more bytes than b
    assert [(source, target) for source, target, _ in record.copies] == [(second, first)]
    assert_close(result, ((torch.tensor(a_data) @ torch.tensor(b_data)) + 1).relu(), atol=1e-4)


@needs_two
def test_results_stay_where_computed_and_move_when_asked() -> None:
    first, second = TEST_DEVICES[:2]
    x = em.tensor(random_array((5,)), device=second)
    y = (x * 2).realize()
    assert y.device == second
    moved = y.to(first)
    assert moved.device == first
    np.testing.assert_allclose(moved.numpy(), y.numpy())


@needs_two
def test_gradients_live_on_their_tensors_devices() -> None:
    first, second = TEST_DEVICES[:2]
    a_data, b_data = random_array((3,)), random_array((3,), seed=1)
    a = em.tensor(a_data, device=first, requires_grad=True)
    b = em.tensor(b_data, device=second, requires_grad=True)
    (a * b).sum().backward()
    assert a.grad.device == first and b.grad.device == second
    np.testing.assert_allclose(a.grad.numpy(), b_data, rtol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), a_data, rtol=1e-6)


def test_constants_are_recreated_not_copied(device: str) -> None:
    x = em.tensor([1.0, 2.0], device=device)
    constant = em.full((2,), 3.0, device="c")
    with em.profile() as record:
        result = (x + constant).realize()
    assert result.device == device
    assert record.copies == []
    np.testing.assert_allclose(result.numpy(), [4.0, 5.0])


def test_inputs_from_three_backends_meet_in_one_graph() -> None:
    """c, opencl and wgpu (whichever of them are available here) each hold one input of one computation."""
    from ember.backends.registry import REGISTRY
    from ember.core.errors import BackendUnavailable

    devices = []
    for backend in ("c", "opencl", "wgpu"):
        try:
            devices.append(REGISTRY.probe(backend)[0].name)
        except BackendUnavailable:
            continue
    if len(devices) < 2:
        pytest.skip("needs at least two of c, opencl, wgpu")
    arrays = [random_array((4, 5), seed=index) for index in range(len(devices))]
    tensors = [em.tensor(array, device=device) for array, device in zip(arrays, devices)]
    result = tensors[0]
    expected = torch.tensor(arrays[0])
    for tensor, array in zip(tensors[1:], arrays[1:]):
        result = (result * tensor).relu() + tensor.sum(0)
        expected = (expected * torch.tensor(array)).relu() + torch.tensor(array).sum(0)
    assert_close(result, expected, atol=1e-4)
