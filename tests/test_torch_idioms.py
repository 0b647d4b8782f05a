"""torch idioms a ported program uses, against torch: f-string formats, where(condition), the legacy Tensor(3, 4)
constructor, device objects, Size, and safetensors files through ember.io's safetensors.torch names."""

import pickle

import numpy as np
import pytest
import safetensors.torch
import torch

import ember as em
from tests.helpers import assert_close


def test_format_specs_match_torch(device: str) -> None:
    values = [(1.23456789, torch.float32), (-7, torch.int64), (True, torch.bool), (2.5, torch.float64)]
    for value, dtype in values:
        ours, theirs = em.tensor(value, device=device), torch.tensor(value, dtype=dtype)
        specs = ["", ".4f", "e", ">12.3f"] if dtype.is_floating_point else ["", "d", ">5", "+d"]
        for spec in specs:
            assert format(ours, spec) == format(theirs, spec), (value, spec)
    loss = em.tensor([0.5, 1.25], device=device).mean()
    assert f"{loss:.4f}" == f"{torch.tensor([0.5, 1.25]).mean():.4f}" == "0.8750"
    # a tensor that is not 0-d formats as str() with an empty spec; a spec is a TypeError, as in torch
    for shape in [(1,), (2, 3), (0,)]:
        ours = em.ones(*shape, device=device)
        assert f"{ours}" == str(ours)
        with pytest.raises(TypeError):
            f"{torch.ones(*shape):.2f}"
        with pytest.raises(TypeError, match="0-d tensors only"):
            f"{ours:.2f}"


@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 4)])
def test_where_with_a_condition_alone_is_nonzero_as_tuple(device: str, shape: tuple[int, ...]) -> None:
    values = np.random.default_rng(1).integers(-2, 3, size=shape)
    for condition in (values > 0, values):  # a bool condition, and any tensor (its nonzero elements)
        ours = em.where(em.tensor(condition, device=device))
        theirs = torch.where(torch.tensor(condition))
        assert isinstance(ours, tuple) and len(ours) == len(theirs) == len(shape)
        for mine, expected in zip(ours, theirs):
            assert_close(mine, expected, atol=0, rtol=0)
    none = em.where(em.zeros(*shape, dtype=em.bool, device=device))
    assert all(index.shape == (0,) for index in none)
    assert_close(em.where(em.tensor(True, device=device))[0], torch.where(torch.tensor(True))[0])
    with pytest.raises(TypeError, match="condition alone"):
        em.where(em.tensor(condition > 0, device=device), em.ones(*shape, device=device))


def test_legacy_constructor_forms_match_torch(device: str) -> None:
    for sizes in [(3, 4), (5,), (2, 0, 3), ()]:
        ours, theirs = em.Tensor(*sizes, device=device), torch.Tensor(*sizes)
        assert ours.shape == theirs.shape and ours.dtype == em.float32 and theirs.dtype == torch.float32
        assert ours.device == device
    assert em.Tensor(em.Size([2, 3])).shape == torch.Tensor(torch.Size([2, 3])).shape == (2, 3)
    for data in ([1, 2], (2, 3), [[1.5, 2], [3, 4]], np.arange(6).reshape(2, 3), []):
        assert_close(em.Tensor(data, device=device), torch.Tensor(data), atol=0, rtol=0)  # float32, as torch
    assert_close(em.Tensor(torch.tensor([1, 2]), device=device), torch.Tensor(torch.tensor([1, 2])))  # keeps int64
    with pytest.raises(TypeError):
        torch.Tensor(2.5)
    with pytest.raises(TypeError, match="must be a sequence"):
        em.Tensor(2.5)
    with pytest.raises(TypeError, match="no form takes"):
        em.Tensor([1], [2])
    # ember's own form, a dtype after the data, keeps the data's meaning (ember.tensor)
    assert_close(em.Tensor([1, 2], em.int32, device), torch.tensor([1, 2], dtype=torch.int32))
    assert_close(em.Tensor(7, dtype=em.int64, device=device), torch.tensor(7))
    # the custom-layer idiom: a Parameter made by the legacy constructor, then initialized in place
    weight = em.nn.Parameter(em.Tensor(8, 5, device=device))
    em.nn.init.uniform_(weight, -0.5, 0.5)
    values = weight.numpy()
    assert weight.shape == (8, 5) and weight.requires_grad and (np.abs(values) <= 0.5).all() and values.std() > 0


def test_device_objects(device: str) -> None:
    x = em.ones(2, device=device)
    place = x.device
    kind, _, number = device.partition(":")
    assert isinstance(place, em.device) and isinstance(place, str)
    assert place == device and str(place) == device and f"{place}" == device and hash(place) == hash(device)
    assert (place.type, place.index) == (kind, int(number))
    assert repr(place) == f"device(type='{kind}', index={number})"
    assert {place: 1}[device] == 1 and {device: 1}[place] == 1
    assert em.zeros(2, device=place).device == device and x.to(place) is x
    assert em.device(kind, int(number)) == place == em.device(device)
    restored = pickle.loads(pickle.dumps(place))
    assert type(restored) is em.device and restored == place and restored.index == place.index
    # torch's forms of the objects themselves
    assert repr(em.device("cuda", 1)) == repr(torch.device("cuda", 1))
    assert repr(em.device("cpu")) == repr(torch.device("cpu")) and em.device("cpu").index is None
    assert em.ones(1, device=em.device("cpu")).device.type == "c"  # 'cpu' is ember's c device


def test_size_behaves_like_torch_size() -> None:
    ours, theirs = em.ones(2, 3, 4).shape, torch.ones(2, 3, 4).shape
    assert isinstance(ours, em.Size) and isinstance(ours, tuple)
    assert repr(ours) == repr(theirs).replace("torch", "ember") == "ember.Size([2, 3, 4])"
    assert str(ours) == f"{ours}" == "(2, 3, 4)"  # the tuple's text, as ember's error messages name shapes
    assert ours == theirs == (2, 3, 4) and hash(ours) == hash(theirs) == hash((2, 3, 4))
    assert ours != [2, 3, 4] and (theirs != [2, 3, 4])  # a tuple, not a list, as torch.Size
    assert ours.numel() == theirs.numel() == 24 and em.Size([]).numel() == torch.Size([]).numel() == 1
    for part in (slice(1, None), slice(None, -1), slice(None, None, 2)):
        assert isinstance(ours[part], em.Size) and ours[part] == theirs[part]
    assert ours[-1] == theirs[-1] == 4 and type(ours[0]) is int
    assert isinstance(ours + (5,), em.Size) and ours + (5,) == theirs + (5,)
    assert isinstance((1,) + ours, em.Size) and (1,) + ours == (1,) + theirs
    assert em.ones(2, 3).size() == torch.ones(2, 3).size() and isinstance(em.ones(2, 3).size(), em.Size)
    assert em.ones(2, 3).size(-1) == 3 and type(em.ones(2, 3).size(1)) is int
    assert em.zeros(ours).shape == ours and em.ones(2, 3).reshape(theirs[::-1][1:]).shape == (3, 2)
    assert em.Size((np.int64(2), 3)) == (2, 3) and pickle.loads(pickle.dumps(ours)) == ours
    with pytest.raises(TypeError):
        torch.Size([2.5])
    with pytest.raises(TypeError, match="iterable of 'int'"):
        em.Size([2.5])


def test_safetensors_round_trip_through_ember_io(device: str, tmp_path) -> None:
    model = em.nn.Sequential(em.nn.Linear(4, 3), em.nn.BatchNorm1d(3)).to(device)
    path = tmp_path / "model.safetensors"
    with pytest.raises(ValueError, match="expected torch.Tensor"):  # torch's package refuses ember tensors
        safetensors.torch.save_file(model.state_dict(), path)
    em.io.save_file(model.state_dict(), path, metadata={"epoch": "3"})
    read_by_torch = safetensors.torch.load_file(path)  # the file safetensors itself reads back
    state = model.state_dict()
    assert set(read_by_torch) == set(state)
    for name, value in state.items():
        assert_close(value, read_by_torch[name], atol=0, rtol=0)
    # and a file torch's safetensors wrote loads into ember (on 'cpu', ember's c device, as its default)
    torch_state = {"weight": torch.randn(3, 4), "steps": torch.tensor([1, 2], dtype=torch.int32)}
    safetensors.torch.save_file(torch_state, tmp_path / "torch.safetensors")
    loaded = em.io.load_file(tmp_path / "torch.safetensors")
    assert loaded["weight"].device == "c:0"
    for name in torch_state:
        assert_close(loaded[name], torch_state[name], atol=0, rtol=0)
    copy = em.nn.Sequential(em.nn.Linear(4, 3), em.nn.BatchNorm1d(3)).to(device)
    assert em.io.load_model(copy, path, device=device) == ([], [])
    assert_close(copy[0].weight, read_by_torch["0.weight"], atol=0, rtol=0)
    em.io.save_model(copy, tmp_path / "again.safetensors")
    assert torch.equal(safetensors.torch.load_file(tmp_path / "again.safetensors")["0.bias"], read_by_torch["0.bias"])
