"""ember.cuda and ember.device: torch.cuda's and torch.device's everyday forms, checked against what the registry finds
(so the tests hold with and without a GPU) and against torch's device objects."""

import pytest
import torch

import ember as em
from ember.backends.registry import REGISTRY
from ember.core.errors import BackendUnavailable, DeviceError


def _cuda_devices() -> list[str]:
    try:
        return [device.name for device in REGISTRY.probe("cuda")]
    except (BackendUnavailable, DeviceError):
        return []


def test_cuda_module_answers_what_the_registry_finds() -> None:
    found = _cuda_devices()
    assert em.cuda.is_available() == bool(found)
    assert em.cuda.device_count() == len(found)
    if found:
        assert em.cuda.current_device() == 0 and isinstance(em.cuda.get_device_name(), str)
        em.cuda.synchronize()
    else:
        for call in (em.cuda.current_device, em.cuda.get_device_name, em.cuda.synchronize):
            with pytest.raises(RuntimeError, match="no cuda device"):
                call()


def test_the_usual_device_choice_runs_where_torch_code_would() -> None:
    chosen = em.device("cuda" if em.cuda.is_available() else "cpu")
    x = em.ones(3, device=chosen) + 1
    assert x.device == (_cuda_devices()[0] if em.cuda.is_available() else "c:0")
    assert x.tolist() == [2.0, 2.0, 2.0]
    em.cuda.manual_seed(5)
    first = em.rand(4).tolist()
    em.manual_seed(5)
    assert em.rand(4).tolist() == first
    assert em.zeros(1, device=em.device("cpu", 0)).device == "c:0"


@pytest.mark.parametrize("arguments", [("cuda",), ("cuda:1",), ("cuda", 1), ("cpu",), ("cpu", 0), ("opencl:0",)])
def test_device_objects_read_like_torch(arguments: tuple) -> None:
    ours = em.device(*arguments)
    if arguments[0] != "opencl:0":
        theirs = torch.device(*arguments)
        assert (ours.type, ours.index, repr(ours)) == (theirs.type, theirs.index, repr(theirs))
        assert str(ours) == str(theirs)
    else:
        assert (ours.type, ours.index) == ("opencl", 0)


@pytest.mark.parametrize("arguments", [("gpu:x",), ("cuda:0", 1), ("cuda", -1), ("",)])
def test_bad_device_strings_raise_runtime_errors_like_torch(arguments: tuple) -> None:
    with pytest.raises(RuntimeError):
        torch.device(*arguments)
    with pytest.raises(RuntimeError, match="device"):
        em.device(*arguments)
