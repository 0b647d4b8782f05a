"""ember.save / ember.load: what torch users save (a tensor, a state dict, a checkpoint with an optimizer state dict
and plain values) round-trips through one safetensors file without pickle; the files exchange with the safetensors
package and torch; training resumed from a checkpoint continues exactly as it would have, and like torch's."""

from __future__ import annotations

import json
import math
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import ember as em
import ember.nn as enn
import ember.optim as eoptim
from ember.io import SafetensorsError
from tests.helpers import EMBER_DTYPES, TORCH_DTYPES, assert_close

TORCH_VALUES = {
    "float32": torch.randn(3, 4, generator=torch.Generator().manual_seed(0)),
    "float64": torch.tensor([[1.0, -2.5], [math.inf, -0.0]], dtype=torch.float64),
    "float16": torch.tensor([1.5, -2.25, 65504.0], dtype=torch.float16),
    "bfloat16": torch.tensor([1.5, -3.0e38, 0.1], dtype=torch.bfloat16),
    "int64": torch.tensor([-(2**62), 7], dtype=torch.int64),
    "int8": torch.tensor([-128, 127], dtype=torch.int8),
    "uint8": torch.tensor([[0, 255]], dtype=torch.uint8),
    "int32": torch.tensor(5, dtype=torch.int32),  # 0-d
    "bool": torch.tensor([True, False, True]),
    "empty": torch.zeros(0, 3),
}


def _ember(value: torch.Tensor, device: str) -> em.Tensor:
    if value.dtype == torch.bfloat16:
        return em.tensor(value.float().numpy(), device=device).bfloat16()
    return em.tensor(value.numpy(), dtype=EMBER_DTYPES[value.dtype], device=device)


def test_tensors_of_every_dtype_round_trip_and_read_in_torch(tmp_path: Path, device: str) -> None:
    path = tmp_path / "values.safetensors"
    em.save({name: _ember(value, device) for name, value in TORCH_VALUES.items()}, path)
    read_by_torch = load_file(str(path))  # the safetensors package, without ember
    loaded = em.load(path, map_location=device)
    assert list(loaded) == list(TORCH_VALUES)
    for name, value in TORCH_VALUES.items():
        assert read_by_torch[name].dtype == value.dtype and torch.equal(read_by_torch[name], value), name
        assert loaded[name].device == device and TORCH_DTYPES[loaded[name].dtype] == value.dtype
        assert_close(loaded[name], value, atol=0, rtol=0)


def test_a_single_tensor_and_a_file_written_by_torch(tmp_path: Path, device: str) -> None:
    value = TORCH_VALUES["float32"]
    em.save(_ember(value, device), tmp_path / "one.safetensors")
    loaded = em.load(tmp_path / "one.safetensors", map_location=device)
    assert isinstance(loaded, em.Tensor)
    assert_close(loaded, value, atol=0, rtol=0)
    save_file({"weight": value, "bias": TORCH_VALUES["float16"]}, str(tmp_path / "torch.safetensors"))
    from_torch = em.load(str(tmp_path / "torch.safetensors"), map_location=device)
    assert set(from_torch) == {"weight", "bias"}
    assert_close(from_torch["weight"], value, atol=0, rtol=0)
    assert_close(from_torch["bias"], TORCH_VALUES["float16"], atol=0, rtol=0)


def test_checkpoint_structure_round_trips(tmp_path: Path, device: str) -> None:
    """Nested containers, scalar keys of several types, plain values, dtypes; a tensor referenced twice is stored
    once and loads as one object; Parameters and requires_grad survive."""
    shared = em.tensor([1.0, 2.0], device=device)
    parameter = enn.Parameter(em.tensor([[0.5]], device=device))
    checkpoint = {
        "model": OrderedDict([("fc.weight", shared), ("fc.bias", em.zeros(2, device=device))]),
        "tied": shared,
        "parameter": parameter,
        "trainable": em.ones(3, device=device).requires_grad_(),
        "epoch": 3,
        "big": 2**70,
        "losses": [1.5, math.nan, math.inf, -math.inf, -0.0],
        "name": "run \"1\" ü",
        "flags": (True, False, None),
        "nested": {0: {"x": em.arange(3, device=device)}, 1.5: [], None: (), True: "yes", "": {}},
        "dtype": em.float16,
        "numpy scalar": np.float32(0.25),
    }
    path = tmp_path / "checkpoint.safetensors"
    em.save(checkpoint, path)
    loaded = em.load(path, map_location=device)
    assert list(loaded) == list(checkpoint)
    assert type(loaded["model"]) is OrderedDict and list(loaded["model"]) == ["fc.weight", "fc.bias"]
    assert loaded["tied"] is loaded["model"]["fc.weight"]
    assert isinstance(loaded["parameter"], enn.Parameter) and loaded["parameter"].requires_grad
    assert loaded["trainable"].requires_grad and loaded["trainable"].is_leaf
    assert not loaded["tied"].requires_grad
    assert loaded["epoch"] == 3 and type(loaded["epoch"]) is int and loaded["big"] == 2**70
    assert loaded["losses"][0] == 1.5 and math.isnan(loaded["losses"][1])
    assert loaded["losses"][2:4] == [math.inf, -math.inf] and math.copysign(1.0, loaded["losses"][4]) == -1.0
    assert loaded["name"] == checkpoint["name"] and loaded["flags"] == (True, False, None)
    assert list(loaded["nested"]) == [0, 1.5, None, True, ""]
    assert loaded["nested"][1.5] == [] and loaded["nested"][None] == () and loaded["nested"][""] == {}
    assert loaded["dtype"] is em.float16 and loaded["numpy scalar"] == 0.25
    np.testing.assert_array_equal(loaded["nested"][0]["x"].numpy(), [0, 1, 2])
    np.testing.assert_array_equal(loaded["tied"].numpy(), [1.0, 2.0])
    # the tensors are named by their place in the object, so other tools read the file as a plain state dict
    assert set(load_file(str(path))) == {"model.fc.weight", "model.fc.bias", "parameter", "trainable", "nested.0.x"}


def _models(device: str) -> tuple[Any, Any]:
    torch.manual_seed(0)
    torch_model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model = enn.Sequential(enn.Linear(6, 8), enn.Tanh(), enn.Linear(8, 3)).to(device)
    model.load_state_dict(torch_model.state_dict())
    return model, torch_model


BATCHES = [(np.random.default_rng(seed).normal(size=(5, 6)).astype(np.float32),
            np.random.default_rng(seed + 100).integers(0, 3, size=5)) for seed in range(8)]


def _ember_step(model: Any, optimizer: Any, step: int, device: str) -> float:
    inputs, labels = BATCHES[step]
    optimizer.zero_grad()
    loss = enn.functional.cross_entropy(model(em.tensor(inputs, device=device)), em.tensor(labels, device=device))
    loss.backward()
    optimizer.step()
    return loss.item()


def _torch_step(model: Any, optimizer: Any, step: int) -> float:
    inputs, labels = BATCHES[step]
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(torch.tensor(inputs)), torch.tensor(labels))
    loss.backward()
    optimizer.step()
    return loss.item()


@pytest.mark.parametrize("optimizer_name", ["AdamW", "SGD"])
def test_training_resumed_from_a_checkpoint_continues_identically(tmp_path: Path, device: str,
                                                                  optimizer_name: str) -> None:
    """Train 4 steps, save {'model', 'optimizer', 'epoch'}, resume in fresh objects for 4 more: the same parameters
    as training on without the checkpoint (exactly), and the same losses as torch resuming with torch.save."""
    settings = {"AdamW": {"lr": 0.01}, "SGD": {"lr": 0.1, "momentum": 0.9, "nesterov": True}}[optimizer_name]
    model, torch_model = _models(device)
    optimizer = getattr(eoptim, optimizer_name)(model.parameters(), **settings)
    torch_optimizer = getattr(torch.optim, optimizer_name)(torch_model.parameters(), **settings)
    losses = [_ember_step(model, optimizer, step, device) for step in range(4)]
    torch_losses = [_torch_step(torch_model, torch_optimizer, step) for step in range(4)]
    em.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 4}, tmp_path / "ember.st")
    torch.save({"model": torch_model.state_dict(), "optimizer": torch_optimizer.state_dict(), "epoch": 4},
               tmp_path / "torch.pt")

    checkpoint = em.load(tmp_path / "ember.st", map_location=device)
    assert checkpoint["epoch"] == 4
    assert checkpoint["optimizer"]["param_groups"] == optimizer.state_dict()["param_groups"]
    resumed, _ = _models(device)
    resumed.load_state_dict(checkpoint["model"])
    resumed_optimizer = getattr(eoptim, optimizer_name)(resumed.parameters(), **settings)
    resumed_optimizer.load_state_dict(checkpoint["optimizer"])
    torch_checkpoint = torch.load(tmp_path / "torch.pt")
    torch_resumed = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    torch_resumed.load_state_dict(torch_checkpoint["model"])
    torch_resumed_optimizer = getattr(torch.optim, optimizer_name)(torch_resumed.parameters(), **settings)
    torch_resumed_optimizer.load_state_dict(torch_checkpoint["optimizer"])

    for step in range(4, 8):
        losses.append(_ember_step(model, optimizer, step, device))
        resumed_loss = _ember_step(resumed, resumed_optimizer, step, device)
        assert resumed_loss == losses[-1], f"step {step}: resumed {resumed_loss} != uninterrupted {losses[-1]}"
        torch_losses.append(_torch_step(torch_resumed, torch_resumed_optimizer, step))
    for parameter, resumed_parameter, torch_parameter in zip(model.parameters(), resumed.parameters(),
                                                             torch_resumed.parameters()):
        np.testing.assert_array_equal(resumed_parameter.numpy(), parameter.numpy())
        assert_close(resumed_parameter, torch_parameter.detach(), atol=1e-4)
    np.testing.assert_allclose(losses, torch_losses, atol=1e-4)
    assert losses[-1] < losses[0]


def test_unsupported_objects_name_the_type_and_the_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    with pytest.raises(TypeError, match=r"builtins\.object at obj\['optimizer'\]\['state'\]\[0\]\['foo'\]"):
        em.save({"optimizer": {"state": {0: {"foo": object()}}}}, path)
    with pytest.raises(TypeError, match=r"numpy\.ndarray at obj\[1\].*ember\.tensor"):
        em.save([1, np.zeros(2)], path)
    with pytest.raises(TypeError, match=r"builtins\.set at obj\['s'\]"):
        em.save({"s": {1, 2}}, path)
    with pytest.raises(TypeError, match=r"the dict at obj\['a'\] has a key of type tuple"):
        em.save({"a": {(1, 2): 3}}, path)
    with pytest.raises(TypeError, match="must be a file path"):
        em.save({}, object())
    assert not path.exists()


def test_corrupt_files_raise_errors_naming_the_file(tmp_path: Path) -> None:
    good = tmp_path / "good.safetensors"
    em.save({"a": em.ones(4), "b": [em.zeros(2)]}, good)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[:-5])
    with pytest.raises(SafetensorsError, match="truncated") as raised:
        em.load(truncated)
    assert isinstance(raised.value, RuntimeError)  # what torch.load raises for a corrupt file
    header_length = struct.unpack("<Q", good.read_bytes()[:8])[0]
    header = json.loads(good.read_bytes()[8:8 + header_length])
    data = good.read_bytes()[8 + header_length:]
    for name, structure in (("not-json", "{not json"), ("missing", '{"tensor": "nope"}'), ("bad-node", '{"?": 1}')):
        header["__metadata__"]["ember_structure"] = structure
        encoded = json.dumps(header).encode()
        broken = tmp_path / f"{name}.safetensors"
        broken.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
        with pytest.raises(SafetensorsError, match=f"{name}.safetensors.*corrupt"):
            em.load(broken)
    with pytest.raises(FileNotFoundError, match="no such safetensors file"):
        em.load(tmp_path / "absent.safetensors")


def test_map_location_cpu_is_the_c_device(tmp_path: Path) -> None:
    em.save({"w": em.ones(2)}, tmp_path / "w.safetensors")
    assert em.load(tmp_path / "w.safetensors", map_location="cpu")["w"].device == "c:0"
    assert em.load(tmp_path / "w.safetensors", weights_only=True)["w"].device == em.get_default_device()
